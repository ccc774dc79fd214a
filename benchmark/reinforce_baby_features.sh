#!/usr/bin/env bash
# reinforce_baby's parent-taught features trained once each (not registered: a grid, seeds and budgets fixed before the
# runs, no measure or verdict rule; one sweep at a time, one run at a time):
#   task-source       the MVP (10k steps) and the curriculum (all tasks, 80k steps) with SmolLM2-135M as the parent
#                     (constrained answers) drawing the tasks (--task-source parent) beside the rule drawing them
#                     (--task-source rule), seeds 1..3; the pools' validity and diversity (each eval.json's
#                     parent.task_generation) and the babies side by side in features/task_source.md. Expected 2-4
#                     hours of wall time before the runs; they took about 15 minutes, the server on its own thread.
#   conditional-plan  the conditional task's curriculum with the rule parent, 16 actions, 80k steps, the plan's rule
#                     (--conditional-rule plan) beside the flag rules, seeds 1..3. About 5 CPU-minutes.
#   plan-reinforce    the locked MVP at the plan's REINFORCE settings (lr 1e-3, entropy 0.01, world model 1.0, raw
#                     advantages, baseline decay 0.99 updated before the advantages, Adam's eps 1e-8, no gradient
#                     clip) beside the script's, seeds 1..5, with the MVP criteria per seed. About 2 CPU-minutes.
#   bash benchmark/reinforce_baby_features.sh --only task-source|conditional-plan|plan-reinforce
#       -> sweeps in benchmark/out/reinforce_baby_features/<part>, tables in docs/results/reinforce_baby/features/
# Re-running continues a killed sweep (benchmark.py --resume). Needs requirements-llm.txt for task-source.
set -uo pipefail
cd "$(dirname "$0")/.."

only=
while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=$2; shift ;;
        *) echo "reinforce_baby_features.sh: unknown argument $1 (--only task-source|conditional-plan|plan-reinforce)" >&2; exit 2 ;;
    esac
    shift
done
case "$only" in task-source|conditional-plan|plan-reinforce) ;; *) echo "reinforce_baby_features.sh: --only task-source, conditional-plan or plan-reinforce" >&2; exit 2 ;; esac
out=benchmark/out/reinforce_baby_features/$only
report=docs/results/reinforce_baby/features
mkdir -p "$out" "$report" || exit 1
MVP="python cleanrl_astral/reinforce_baby.py --task pattern-echo --num-actions 8 --hidden-dim 64 --num-layers 2 --algorithm reinforce --total-timesteps 10000"
PLAN_REINFORCE="--learning-rate 1e-3 --ent-coef 0.01 --world-model-coef 1.0 --no-norm-adv --baseline-decay 0.99 --baseline-update before --adam-eps 1e-8 --max-grad-norm 0"
sweep() {  # sweep NAME SEEDS COMMAND [GRID]: one run at a time
    local grid=()
    if [ $# -gt 3 ]; then grid=(--grid "$4"); fi
    python benchmark/benchmark.py --command "$3" "${grid[@]}" --num-seeds "$2" --start-seed 1 --workers 1 --resume \
        --output "$out/$1"
}

status=0
if [ "$only" = task-source ]; then
    source benchmark/llm_server.sh
    trap stop_server EXIT
    require_smollm2
    start_server "$smollm2" smollm2-135m "$out/server.log"
    LLM="--parent llm --llm-base-url $url --llm-model smollm2-135m --llm-cache $out/llm_cache.sqlite"
    sweep mvp 3 "$MVP $LLM" "--task-source rule | --task-source parent" || status=$?
    sweep curriculum 3 "python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --no-analysis --total-timesteps 80000 $LLM" \
        "--task-source rule | --task-source parent" || status=$?
    stop_server
    python benchmark/report.py --sweep "$out/curriculum" --output "$report/task_source_curriculum" \
        --title "reinforce_baby curriculum, SmolLM2 parent: rule-drawn against parent-drawn tasks" || status=$?
    python benchmark/report.py --sweep "$out/mvp" --output "$report/task_source_mvp" \
        --title "reinforce_baby MVP, SmolLM2 parent: rule-drawn against parent-drawn tasks" || status=$?
    python benchmark/reinforce_baby_task_source_report.py --sweep "MVP=$out/mvp" --sweep "curriculum=$out/curriculum" \
        --output "$report/task_source.md" || status=$?
fi
if [ "$only" = conditional-plan ]; then
    sweep curriculum 3 "python cleanrl_astral/reinforce_baby.py --task conditional --curriculum --num-actions 16 --no-analysis --total-timesteps 80000" \
        "--conditional-rule flags | --conditional-rule plan" || status=$?
    python benchmark/report.py --sweep "$out/curriculum" --output "$report/conditional_plan" \
        --title "reinforce_baby conditional curriculum, rule parent: the flag rules against the plan's rule" || status=$?
fi
if [ "$only" = plan-reinforce ]; then
    sweep script 5 "$MVP --parent deterministic" || status=$?
    sweep plan 5 "$MVP --parent deterministic $PLAN_REINFORCE" || status=$?
    python benchmark/reinforce_baby_mvp_seeds.py --title "the script's REINFORCE settings against the plan's" \
        --command "$MVP --parent deterministic" --sweep "(defaults)=$out/script" --sweep "$PLAN_REINFORCE=$out/plan" \
        --report "$report/plan_reinforce" || status=$?
fi
exit "$status"
