#!/usr/bin/env bash
# Online adaptation beside between-batch adaptation (maml_ssm.py adapt): the pre-registered study of
# docs/results/maml_ssm/online_adapt/PREREGISTRATION.md, run once, alone on an idle machine.
#   benchmark/maml_ssm_online_adapt.sh           MAML-SSM checkpoints of the full flavour of benchmark/maml_ssm.sh
#                                                (point-nav-2d 150 outer steps, cartpole-physics 50), seeds 1-3, then on
#                                                each: adapt between batches, --online (the plan's) and --online
#                                                --online-mode during-only -> benchmark/out/maml_ssm_online,
#                                                docs/results/maml_ssm/online_adapt (online_table.md, online.json)
#   add --tiny for the same pipeline at a tiny size (a few CPU-minutes, output under benchmark/out/maml_ssm_online_tiny),
#   --report-only to rebuild the table from finished runs; other flags (e.g. --dry-run) go to benchmark/benchmark.py,
#   and --dry-run also prints the adapt commands and skips them and the report.
# Runs are niced (nice -n 15, one thread each); re-running continues a killed study (--resume, finished adapt reports kept).
set -uo pipefail
cd "$(dirname "$0")/.."

out=benchmark/out/maml_ssm_online report=docs/results/maml_ssm/online_adapt
pn_steps=150 cp_steps=50 tasks=20 pn_batch=10 cp_batch=5 eval_tasks=40 cp_eval_tasks=20 pn_horizon=100 cp_horizon=200
report_only=0 dry=0
extra=()
for arg in "$@"; do
    case "$arg" in
        --tiny) out=benchmark/out/maml_ssm_online_tiny report=benchmark/out/maml_ssm_online_tiny/report pn_steps=2 cp_steps=2
                tasks=2 pn_batch=2 cp_batch=2 eval_tasks=2 cp_eval_tasks=2 pn_horizon=40 cp_horizon=40 ;;
        --report-only) report_only=1 ;;
        --dry-run) dry=1; extra+=("$arg") ;;
        *) extra+=("$arg") ;;
    esac
done

# the SSM arms of benchmark/maml_ssm.sh's full flavour (BASE --policy ssm and CP --policy ssm)
PN="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --task point-nav-2d --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch $pn_batch --fast-batch-size $pn_batch --inner-lr 0.1 --max-episode-steps $pn_horizon \
--eval-tasks $eval_tasks --eval-steps 3 --outer-steps $pn_steps --policy ssm"
CP="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --task cartpole-physics --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch $cp_batch --fast-batch-size $cp_batch --inner-lr 0.1 --max-episode-steps $cp_horizon \
--eval-tasks $cp_eval_tasks --eval-steps 3 --outer-steps $cp_steps --policy ssm"
# K = 3 steps at the meta-training inner lr on 20 fresh test tasks, the pg objective; online: every 20 env steps
ADAPT="python cleanrl_astral/maml_ssm.py adapt --num-tasks $tasks --adapt-steps 3 --adapt-lr 0.1 --adaptation-mode standard \
--adapt-objective pg --online-every 20"
ARMS=("adapt.json:" "adapt_online.json:--online" "adapt_online_during_only.json:--online --online-mode during-only")

status=0
sweep() {  # name, command
    python benchmark/benchmark.py --command "$2" --num-seeds 3 --start-seed 1 --workers 2 --resume --no-progress \
        --output "$out/$1" "${extra[@]}" || status=$?
}
if [ "$report_only" = 0 ]; then
    sweep online_point_nav "$PN"
    sweep online_cartpole "$CP"
    for arm in "${ARMS[@]}"; do
        if [ "$dry" = 1 ]; then
            echo "then on each checkpoint of $out/online_point_nav and $out/online_cartpole: $ADAPT ${arm#*:} --checkpoint CHECKPOINT"
            continue
        fi
        for ckpt in "$out"/online_point_nav/runs/*/*/maml_ssm.cleanrl_model "$out"/online_cartpole/runs/*/*/maml_ssm.cleanrl_model; do
            [ -f "$ckpt" ] || continue
            [ -f "$(dirname "$ckpt")/${arm%%:*}" ] && continue  # a rerun after a kill continues
            # shellcheck disable=SC2086
            nice -n 15 env OMP_NUM_THREADS=1 $ADAPT ${arm#*:} --checkpoint "$ckpt" >> "$(dirname "$ckpt")/adapt.log" 2>&1 || status=$?
        done
    done
fi
[ "$dry" = 1 ] && exit "$status"
python benchmark/maml_ssm_online_report.py --out "$out" --report "$report" || status=$?
exit "$status"
