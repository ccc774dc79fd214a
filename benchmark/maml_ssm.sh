#!/usr/bin/env bash
# Experiment maml_ssm: MAML on point-nav-2d (the MAML paper's 2D navigation) with SSM vs GRU vs MLP policies
# (matched parameter counts), plus a "pretrained multi-task + fine-tune" baseline (--num-inner-steps 0) and a
# "random init + fine-tune" baseline (--outer-steps 0). Every run evaluates itself at the end (eval.json:
# returns on fresh test tasks after 0/1/2/3 inner steps, alpha then alpha/2); the summary puts them next to
# the paper's Table 4 (-40.41, -11.68, -3.33, -3.23) with meta-training wall and CPU time. Also MAML-SSM on
# cartpole-physics (held-out gravity/length ranges at test time) and halfcheetah-vel (gymnasium MuJoCo), and
# `adapt` (standard vs hybrid x pg/dynamics/entropy) on every MAML-SSM point-nav and cartpole checkpoint,
# summarised over seeds with the no-adaptation level.
#   benchmark/maml_ssm.sh              full -> benchmark/out/maml_ssm_full, docs/results/maml_ssm:
#                                      point-nav every arm 5 seeds x 150 outer steps, cartpole 5 seeds x 50,
#                                      halfcheetah 1 seed x 450, adapt on 10 checkpoints, and first the
#                                      15-CPU-minute check (the paper's TRPO on 20 x 20 episodes stopped by
#                                      --cpu-budget 900, MLP and SSM, 5 seeds, with the paper code's goal square
#                                      and again with the Euclidean goal disc); 2 runs at a time
#   benchmark/maml_ssm.sh --budget     a smaller sweep (the docs report the full flavour):
#                                      SSM seeds 1-2, GRU/MLP/baselines seed 1, cartpole seed 1, no halfcheetah
#   benchmark/maml_ssm.sh --protocol   the policy comparison the script exists for, one fixed protocol: point-nav-2d
#                                      and cartpole-physics, --config paper (TRPO, 20 x 20, second order), SSM, MLP
#                                      and GRU, seeds 1-5, each stopped by --cpu-budget 900 (15 CPU-minutes) ->
#                                      benchmark/out/maml_ssm_protocol, docs/results/maml_ssm/protocol (protocol_table.md:
#                                      returns after 0-3 steps with 95% CIs over seeds and iterations done; protocol.png);
#                                      30 runs, ~8 CPU-hours plus evaluation, ~4.5 h wall with 2 workers on an idle box
#   benchmark/maml_ssm.sh --quick      smoke flavour of every code path (a few minutes) -> benchmark/out/maml_ssm_quick
#   benchmark/maml_ssm.sh --speed      cost of a meta-iteration: --config paper point-nav-2d, seed 1, MLP and SSM, each
#                                      with TRPO and with ProMP (maml_ssm_promp.py --config paper --tasks-per-batch 20, the
#                                      same 20 x 20 meta-batch), $SPEED_ROUNDS rounds (3) of $SPEED_STEPS iterations (3), the
#                                      TRPO/ProMP pair of a policy run back to back (order alternating by round), one
#                                      run at a time -> benchmark/out/maml_ssm_speed, docs/results/maml_ssm/speed
#                                      (speed_table.md); ~12 min on an idle machine (12 runs, ~220 CPU-s per round)
#   benchmark/maml_ssm.sh --promp-study  the pre-registered ProMP comparison (docs/maml_ssm_promp.md): maml_ssm_promp.py
#                                      --config paper on
#                                      point-nav-2d, MLP and SSM, seeds 1-3, each stopped by --cpu-budget 900, then
#                                      evaluated on 40 test tasks -> benchmark/out/maml_ssm_promp_study,
#                                      docs/results/maml_ssm/promp_study (promp_study_table.md with the verdicts);
#                                      6 runs, 90 CPU-minutes plus evaluation, ~50 min wall with 2 workers on an idle box
#   benchmark/maml_ssm.sh --hybrid-benchmark  the pre-registered standard-vs-hybrid adaptation study
#                                      (docs/results/maml_ssm/hybrid_benchmark/PREREGISTRATION.md): SSM on halfcheetah-vel
#                                      (buffer 20,000, weight 0.1, 540 CPU-s) and cartpole-physics (buffer 5,000, weight
#                                      0.15, 240 CPU-s), seeds 1-3, both adapters on each checkpoint -> benchmark/out/
#                                      maml_ssm_hybrid (HYBRID_OUT), docs/results/maml_ssm/hybrid_benchmark (HYBRID_REPORT);
#                                      ~55-62 CPU-minutes, ~40 min wall on an idle box; add --tiny for a ~1 CPU-minute
#                                      run of the same pipeline
#   benchmark/maml_ssm.sh --equal-cpu-study  the pre-registered SSM-against-MLP comparison at equal CPU
#                                      (docs/results/maml_ssm/equal_cpu_study/PROTOCOL.md): point-nav-2d, --config paper,
#                                      MLP and SSM, seeds 1-3, each stopped by --cpu-budget 900 and evaluated on 40 test
#                                      tasks, first under TRPO (maml_ssm.py), then under ProMP (maml_ssm_promp.py) ->
#                                      benchmark/out/maml_ssm_equal_cpu, docs/results/maml_ssm/equal_cpu_study
#                                      (equal_cpu_study_table.md with the verdicts); 12 runs, 180 CPU-minutes plus
#                                      evaluation, ~100 min wall with 2 workers on an idle box
#   add --report-only to rebuild the tables/PNGs from finished runs without running anything (the report is
#   benchmark/maml_ssm_report.py); other flags (e.g. --dry-run) go to benchmark/benchmark.py, and --dry-run also
#   skips adapt and the report
# Expected cost of the full flavour, from CPU-time probes (one thread, nice 15, 2-core box with 2 other jobs):
#   point-nav, 10 tasks x 10 episodes per iteration: SSM 1.3 CPU-s/iteration, GRU 1.3, MLP 0.43, SSM without
#   inner step 0.4; eval on 40 tasks ~7 CPU-s; adapt on 20 tasks (6 adapter/objective pairs) ~33 CPU-s.
#   cartpole, 5 x 5 episodes, horizon 200: 0.4-0.8 CPU-s/iteration in the first 6, growing with episode length
#   (up to ~4 at 200 steps); adapt ~50 CPU-s on an untrained checkpoint (~50-step episodes), up to ~4x that.
#   halfcheetah, 5 x 5 episodes, horizon 100: ~1.15 CPU-s/iteration, so 450 iterations ~9 min per run.
#   TRPO, 20 x 20 episodes: MLP ~7 CPU-s/iteration, SSM ~21; each run stops at 900 CPU-s, then a ~30 CPU-s eval.
#   Total ~22,000-24,000 CPU-s (the 20 TRPO runs ~18,600, point-nav Adam ~3,000, cartpole ~400-2,200, halfcheetah
#   ~525 for its one seed), i.e. ~185-200 min wall
#   with 2 workers on an otherwise idle machine; proportionally longer if other jobs share the cores.
# Runs are niced (nice -n 15, one thread each); re-running continues a killed sweep (--resume).
set -uo pipefail
cd "$(dirname "$0")/.."

mode=full report_only=0 dry=0 tiny=0
extra=()
for arg in "$@"; do
    case "$arg" in
        --quick) mode=quick ;;
        --budget) mode=budget ;;
        --protocol) mode=protocol ;;
        --speed) mode=speed ;;
        --promp-study) mode=promp_study ;;
        --hybrid-benchmark) mode=hybrid ;;
        --equal-cpu-study) mode=equal_cpu ;;
        --tiny) tiny=1 ;;
        --report-only) report_only=1 ;;
        --dry-run) dry=1; extra+=("$arg") ;;
        *) extra+=("$arg") ;;
    esac
done

# full has its own output dir: the report pools every checkpoint under $out, and the budget runs (60 steps)
# must not be averaged with the full ones (150 steps)
case "$mode" in
    full)   out=benchmark/out/maml_ssm_full report=docs/results/maml_ssm steps=150 ssm_seeds=5 other_seeds=5
            cp_seeds=5 cp_steps=50 hc_seeds=1 hc_steps=450 trpo_seeds=5 trpo_budget=900 workers=2 ;;
    budget) out=benchmark/out/maml_ssm report=docs/results/maml_ssm steps=60 ssm_seeds=2 other_seeds=1
            cp_seeds=1 cp_steps=20 hc_seeds=0 hc_steps=0 trpo_seeds=0 trpo_budget=0 workers=1 ;;
    protocol) out=benchmark/out/maml_ssm_protocol report=docs/results/maml_ssm/protocol steps=0 ssm_seeds=0 other_seeds=0
            cp_seeds=0 cp_steps=0 hc_seeds=0 hc_steps=0 trpo_seeds=5 trpo_budget=900 workers=2 ;;
    speed)  out=benchmark/out/maml_ssm_speed report=docs/results/maml_ssm/speed steps=0 ssm_seeds=0 other_seeds=0
            cp_seeds=0 cp_steps=0 hc_seeds=0 hc_steps=0 trpo_seeds=0 trpo_budget=0 workers=1 ;;
    promp_study) out=benchmark/out/maml_ssm_promp_study report=docs/results/maml_ssm/promp_study steps=0 ssm_seeds=0
            other_seeds=0 cp_seeds=0 cp_steps=0 hc_seeds=0 hc_steps=0 trpo_seeds=3 trpo_budget=900 workers=2 ;;
    equal_cpu) out=benchmark/out/maml_ssm_equal_cpu report=docs/results/maml_ssm/equal_cpu_study steps=0 ssm_seeds=0
            other_seeds=0 cp_seeds=0 cp_steps=0 hc_seeds=0 hc_steps=0 trpo_seeds=3 trpo_budget=900 workers=2 ;;
    hybrid) out=${HYBRID_OUT:-benchmark/out/maml_ssm_hybrid} report=${HYBRID_REPORT:-docs/results/maml_ssm/hybrid_benchmark}
            steps=0 ssm_seeds=0 other_seeds=0 cp_seeds=0 cp_steps=0 hc_seeds=0 hc_steps=0 trpo_seeds=0 trpo_budget=0
            workers=2 ;;
    quick)  out=benchmark/out/maml_ssm_quick report=benchmark/out/maml_ssm_quick/report steps=2 ssm_seeds=1 other_seeds=1
            cp_seeds=1 cp_steps=2 hc_seeds=1 hc_steps=1 trpo_seeds=1 trpo_budget=1 workers=1 ;;
esac

# second-order MAML, Adam outer step (TRPO's 11 Fisher-vector products through the inner step cost ~10x more
# per iteration on CPU, see docs/maml_ssm.md), 10 tasks x 10 episodes per meta-batch, horizon 100, alpha 0.1
BASE="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --task point-nav-2d --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch 10 --fast-batch-size 10 --inner-lr 0.1 --max-episode-steps 100 --eval-tasks 40 \
--eval-steps 3 --outer-steps $steps"
# cartpole-physics: held-out gravity/length ranges at test time; 5 x 5 episodes, horizon 200
CP="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --task cartpole-physics --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch 5 --fast-batch-size 5 --inner-lr 0.1 --max-episode-steps 200 --eval-tasks 20 \
--eval-steps 3 --outer-steps $cp_steps"
# halfcheetah-vel: MuJoCo steps dominate, so a small meta-batch (5 x 5 episodes, horizon 100) and ~9 min per run
HC="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --task halfcheetah-vel --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch 5 --fast-batch-size 5 --inner-lr 0.1 --max-episode-steps 100 --eval-tasks 20 \
--eval-steps 3 --outer-steps $hc_steps"
# the paper's outer step: TRPO (KL 0.01), 20 tasks x 20 episodes, second order, stopped by --cpu-budget; evaluated
# with 40 episodes per task and step (the preset's --eval-episodes, the paper's test batch)
TRPO="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --task point-nav-2d --save-model --config paper --eval-tasks 40 \
--eval-steps 3 --outer-steps 1000 --cpu-budget $trpo_budget"
# the protocol: --config paper on both tasks (cartpole without the point-nav goal square), every policy
PROTO="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --save-model --config paper --eval-tasks 40 --eval-steps 3 \
--outer-steps 100000 --cpu-budget $trpo_budget"
# ProMP's reference configuration on the paper preset's task rules and evaluation, stopped by --cpu-budget
PROMP="nice -n 15 python cleanrl_astral/maml_ssm_promp.py train --buffer-size 50000 --task point-nav-2d --save-model --config paper --eval-tasks 40 \
--eval-steps 3 --outer-steps 100000 --cpu-budget $trpo_budget"
# the equal-CPU study's TRPO arm: PROMP's flags on the TRPO script
STUDY_TRPO="nice -n 15 python cleanrl_astral/maml_ssm.py train --buffer-size 50000 --task point-nav-2d --save-model --config paper \
--eval-tasks 40 --eval-steps 3 --outer-steps 100000 --cpu-budget $trpo_budget"
ADAPT_EXTRA=""
if [ "$mode" = quick ]; then
    TRPO="$TRPO --tasks-per-batch 2 --fast-batch-size 2 --eval-tasks 3 --eval-episodes 2"
    BASE="$BASE --tasks-per-batch 2 --fast-batch-size 2 --eval-tasks 3"
    CP="$CP --tasks-per-batch 2 --fast-batch-size 2 --eval-tasks 3 --max-episode-steps 50"
    HC="$HC --tasks-per-batch 2 --fast-batch-size 2 --eval-tasks 2 --max-episode-steps 20"
    ADAPT_EXTRA="--num-tasks 4"
fi

status=0
sweep() {  # name, seeds, grid, command
    python benchmark/benchmark.py --command "${4:-$BASE}" --grid "$3" --num-seeds "$2" --start-seed 1 \
        --workers "$workers" --resume --no-progress --output "$out/$1" "${extra[@]}" || status=$?
}
# adapt every checkpoint of a sweep that has no adapt.json yet, $workers at a time
adapt_sweep() {
    local pids=() ckpt p
    for ckpt in "$1"/runs/*/*/maml_ssm.cleanrl_model; do
        [ -f "$ckpt" ] || continue
        [ -f "$(dirname "$ckpt")/adapt.json" ] && continue
        nice -n 15 env OMP_NUM_THREADS=1 python cleanrl_astral/maml_ssm.py adapt --checkpoint "$ckpt" --num-tasks 20 \
            --adapt-steps 3 --adapt-lr 0.1 --experience-weight 1.0 --experience-batch-size 256 --adaptation-mode standard hybrid --adapt-objective pg dynamics entropy \
            $ADAPT_EXTRA > "$(dirname "$ckpt")/adapt.log" 2>&1 &
        pids+=($!)
        if [ "${#pids[@]}" -ge "$workers" ]; then
            for p in "${pids[@]}"; do wait "$p" || status=$?; done
            pids=()
        fi
    done
    for p in "${pids[@]}"; do wait "$p" || status=$?; done
}
# one cost run: policy, optimizer, round
speed_run() {
    local script=maml_ssm.py flags="" dir="$out/${1}_${2}/r$3"
    [ "$2" = promp ] && script=maml_ssm_promp.py flags="--tasks-per-batch 20"
    local cmd="nice -n 15 env OMP_NUM_THREADS=1 python cleanrl_astral/$script train --buffer-size 50000 --task point-nav-2d --config paper \
--policy $1 $flags --seed 1 --outer-steps ${SPEED_STEPS:-3} --log-every 1 --runs-dir $dir"
    if [ "$dry" = 1 ]; then
        echo "$cmd"
        return
    fi
    [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ] && return  # a finished round is kept (rerun after a kill continues)
    mkdir -p "$dir"
    $cmd > "$dir.log" 2>&1 || status=$?
}
if [ "$mode" = speed ]; then
    if [ "$report_only" = 0 ]; then
        for round in $(seq 1 "${SPEED_ROUNDS:-3}"); do
            for policy in mlp ssm; do
                if [ $((round % 2)) = 1 ]; then
                    speed_run "$policy" trpo "$round"
                    speed_run "$policy" promp "$round"
                else
                    speed_run "$policy" promp "$round"
                    speed_run "$policy" trpo "$round"
                fi
            done
        done
    fi
    [ "$dry" = 1 ] && exit "$status"
    python benchmark/maml_ssm_report.py --speed --out "$out" --report "$report" || status=$?
    exit "$status"
fi
if [ "$mode" = promp_study ]; then
    [ "$report_only" = 0 ] && sweep promp_study 3 "--policy mlp | --policy ssm" "$PROMP"
    [ "$dry" = 1 ] && exit "$status"
    python benchmark/maml_ssm_report.py --promp-study --out "$out" --report "$report" || status=$?
    exit "$status"
fi
if [ "$mode" = equal_cpu ]; then
    if [ "$report_only" = 0 ]; then
        sweep equal_cpu_trpo 3 "--policy mlp | --policy ssm" "$STUDY_TRPO"
        sweep equal_cpu_promp 3 "--policy mlp | --policy ssm" "$PROMP"
    fi
    [ "$dry" = 1 ] && exit "$status"
    python benchmark/maml_ssm_report.py --equal-cpu-study --out "$out" --report "$report" || status=$?
    exit "$status"
fi
# the pre-registered standard-vs-hybrid study (docs/results/maml_ssm/hybrid_benchmark/PREREGISTRATION.md): SSM on
# halfcheetah-vel (buffer 20,000, experience weight 0.1, 540 CPU-s per run) and cartpole-physics (buffer 5,000, weight
# 0.15, 240 CPU-s per run), seeds 1-3; both adapters on each checkpoint. --tiny: the same pipeline in ~1 CPU-minute
if [ "$mode" = hybrid ]; then
    hc_budget=540 cp_budget=240 hc_horizon=100 cp_horizon=200 batch=5 tasks=20 eval_tasks=20
    outer_steps=100000  # the CPU budget stops each run
    [ "$tiny" = 1 ] && hc_budget=1 cp_budget=1 hc_horizon=10 cp_horizon=20 batch=2 tasks=2 eval_tasks=2 outer_steps=3
    HYB="nice -n 15 python cleanrl_astral/maml_ssm.py train --policy ssm --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch $batch --fast-batch-size $batch --inner-lr 0.1 --eval-tasks $eval_tasks --eval-steps 3 \
--outer-steps $outer_steps"
    if [ "$report_only" = 0 ]; then
        sweep hybrid_halfcheetah 3 "--buffer-size 20000" "$HYB --task halfcheetah-vel --max-episode-steps $hc_horizon \
--cpu-budget $hc_budget"
        sweep hybrid_cartpole 3 "--buffer-size 5000" "$HYB --task cartpole-physics --max-episode-steps $cp_horizon \
--cpu-budget $cp_budget"
        for pair in "hybrid_halfcheetah 0.1" "hybrid_cartpole 0.15"; do
            set -- $pair
            adapt="python cleanrl_astral/maml_ssm.py adapt --num-tasks $tasks --adapt-steps 5 --adapt-lr 0.01 \
--adaptation-mode standard hybrid --adapt-objective pg --experience-batch-size 32 --experience-weight $2"
            if [ "$dry" = 1 ]; then
                echo "then on each checkpoint of $out/$1: $adapt --checkpoint CHECKPOINT"
                continue
            fi
            for ckpt in "$out/$1"/runs/*/*/maml_ssm.cleanrl_model; do
                [ -f "$(dirname "$ckpt")/adapt.json" ] && continue  # a rerun after a kill continues
                nice -n 15 env OMP_NUM_THREADS=1 $adapt --checkpoint "$ckpt" > "$(dirname "$ckpt")/adapt.log" 2>&1 || status=$?
            done
        done
    fi
    [ "$dry" = 1 ] && exit "$status"
    python benchmark/maml_ssm_report.py --hybrid-benchmark --out "$out" --report "$report" || status=$?
    exit "$status"
fi
if [ "$report_only" = 0 ] && [ "$mode" = protocol ]; then
    sweep protocol_point_nav 5 "--policy ssm | --policy mlp | --policy gru" "$PROTO --task point-nav-2d"
    sweep protocol_cartpole 5 "--policy ssm | --policy mlp | --policy gru" "$PROTO --task cartpole-physics --no-goal-box"
elif [ "$report_only" = 0 ]; then
# first the comparison with the paper's Table 4: post-adaptation returns after 15 CPU-minutes of meta-training, with the
# paper's own outer step (TRPO, KL 0.01) on 20 tasks x 20 episodes, second order, stopped by --cpu-budget
[ "$trpo_seeds" -gt 0 ] && sweep trpo "$trpo_seeds" "--policy mlp | --policy ssm" "$TRPO"
# the same with the Euclidean goal disc instead of the paper code's goal square: an ablation of the termination rule
[ "$trpo_seeds" -gt 0 ] && sweep trpo_euclidean "$trpo_seeds" "--policy mlp | --policy ssm" "$TRPO --no-goal-box --no-fill-steps"
sweep ssm "$ssm_seeds" "--policy ssm"
sweep baselines "$other_seeds" "--policy mlp | --policy ssm --outer-steps 0 | --policy gru | --policy ssm --num-inner-steps 0"
sweep cartpole "$cp_seeds" "--policy ssm" "$CP"
[ "$hc_seeds" -gt 0 ] && sweep halfcheetah "$hc_seeds" "--policy ssm" "$HC"

# test-time adaptation (adapt subcommand) on every MAML-SSM point-nav and cartpole checkpoint: standard vs
# hybrid x pg/dynamics/entropy, K = 3 steps at the meta-training inner lr, 20 fresh test tasks (cartpole: from
# the held-out physics ranges); writes adapt.json beside each checkpoint
if [ "$dry" = 1 ]; then
    echo "dry run: then adapt on every checkpoint under $out/ssm and $out/cartpole, and the report in $report"
else
    adapt_sweep "$out/ssm"
    adapt_sweep "$out/cartpole"
fi
fi
[ "$dry" = 1 ] && exit "$status"

python benchmark/maml_ssm_report.py --out "$out" --report "$report" || status=$?
exit "$status"
