#!/usr/bin/env bash
# The hybrid plan's loss at the plan's settings: the `dynamics` arm added to the pre-registered standard-vs-hybrid study
# (docs/results/maml_ssm/hybrid_benchmark/PREREGISTRATION.md, "Added arm"), run once, alone on an idle machine.
#   benchmark/maml_ssm_hybrid_dynamics.sh     SSM checkpoints retrained with the registered benchmark's command (its
#                                             checkpoints are gone): halfcheetah-vel, buffer 20,000, 540 CPU-s, and
#                                             cartpole-physics with the plan's buffer 10,000, 240 CPU-s, seeds 1-3;
#                                             then on each: adapt standard and hybrid with the plan's settings (alpha
#                                             0.1, experience batch 32) and both objectives (`dynamics`, the plan's loss,
#                                             and `pg` on the same episodes) -> benchmark/out/maml_ssm_hybrid_dynamics,
#                                             docs/results/maml_ssm/hybrid_benchmark/dynamics_arm (one table per objective)
#   add --tiny for the same pipeline in ~1 CPU-minute (output under benchmark/out/maml_ssm_hybrid_dynamics_tiny),
#   --report-only to rebuild the tables from finished runs; other flags (e.g. --dry-run) go to benchmark/benchmark.py,
#   and --dry-run also prints the adapt command and skips it and the report.
# Runs are niced (nice -n 15, one thread each); re-running continues a killed study (--resume, finished adapt.json kept).
set -uo pipefail
cd "$(dirname "$0")/.."

out=${DYNAMICS_OUT:-benchmark/out/maml_ssm_hybrid_dynamics}
report=${DYNAMICS_REPORT:-docs/results/maml_ssm/hybrid_benchmark/dynamics_arm}
hc_budget=540 cp_budget=240 hc_horizon=100 cp_horizon=200 batch=5 tasks=20 eval_tasks=20 outer_steps=100000
report_only=0 dry=0
extra=()
for arg in "$@"; do
    case "$arg" in
        --tiny) out=${DYNAMICS_OUT:-benchmark/out/maml_ssm_hybrid_dynamics_tiny} report=${DYNAMICS_REPORT:-$out/report}
                hc_budget=1 cp_budget=1 hc_horizon=10 cp_horizon=20 batch=2 tasks=2 eval_tasks=2 outer_steps=3 ;;
        --report-only) report_only=1 ;;
        --dry-run) dry=1; extra+=("$arg") ;;
        *) extra+=("$arg") ;;
    esac
done

# the registered benchmark's training command (benchmark/maml_ssm.sh --hybrid-benchmark)
HYB="nice -n 15 python cleanrl_astral/maml_ssm.py train --policy ssm --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch $batch --fast-batch-size $batch --inner-lr 0.1 --eval-tasks $eval_tasks --eval-steps 3 \
--outer-steps $outer_steps"
# the registered adaptation (5 steps at 0.01, 20 tasks) at the plan's alpha 0.1 and batch 32, with the plan's loss
ADAPT="python cleanrl_astral/maml_ssm.py adapt --num-tasks $tasks --adapt-steps 5 --adapt-lr 0.01 \
--adaptation-mode standard hybrid --adapt-objective dynamics pg --experience-batch-size 32 --experience-weight 0.1"

status=0
sweep() {  # name, grid, command
    python benchmark/benchmark.py --command "$3" --grid "$2" --num-seeds 3 --start-seed 1 --workers 2 --resume --no-progress \
        --output "$out/$1" "${extra[@]}" || status=$?
}
if [ "$report_only" = 0 ]; then
    sweep hybrid_halfcheetah "--buffer-size 20000" "$HYB --task halfcheetah-vel --max-episode-steps $hc_horizon --cpu-budget $hc_budget"
    sweep hybrid_cartpole "--buffer-size 10000" "$HYB --task cartpole-physics --max-episode-steps $cp_horizon --cpu-budget $cp_budget"
    if [ "$dry" = 1 ]; then
        echo "then on each checkpoint of $out/hybrid_halfcheetah and $out/hybrid_cartpole: $ADAPT --checkpoint CHECKPOINT"
        exit "$status"
    fi
    for ckpt in "$out"/hybrid_halfcheetah/runs/*/*/maml_ssm.cleanrl_model "$out"/hybrid_cartpole/runs/*/*/maml_ssm.cleanrl_model; do
        [ -f "$ckpt" ] || continue
        [ -f "$(dirname "$ckpt")/adapt.json" ] && continue  # a rerun after a kill continues
        nice -n 15 env OMP_NUM_THREADS=1 $ADAPT --checkpoint "$ckpt" > "$(dirname "$ckpt")/adapt.log" 2>&1 || status=$?
    done
fi
[ "$dry" = 1 ] && exit "$status"
for objective in dynamics pg; do
    python benchmark/maml_ssm_report.py --hybrid-benchmark --objective "$objective" --out "$out" --report "$report/$objective" \
        || status=$?
done
exit "$status"
