#!/usr/bin/env bash
# The pre-registered curriculum comparison of reinforce_baby
# (docs/results/reinforce_baby/curriculum_comparison/PREREGISTRATION.md): the rule and SmolLM2-135M as parents x the
# plan's curriculum and the mastery curriculum x seeds 1..3, 80k steps, one run at a time, then the report and verdict.
#   bash benchmark/reinforce_baby_curriculum_comparison.sh          -> docs/results/reinforce_baby/curriculum_comparison
#   bash benchmark/reinforce_baby_curriculum_comparison.sh --tiny   -> 320 steps, seed 1 -> benchmark/out/..._tiny/report
#   --llm-base-url URL uses a running OpenAI-compatible server (its model named --llm-model) instead of starting
#   llama.cpp's server with SmolLM2 on a free loopback port (one thread, stopped on exit). Re-running continues a
#   killed sweep (benchmark.py --resume); --out DIR puts the runs and the report under DIR. Expected: 1-3 hours of
#   wall time. Needs requirements-llm.txt. The answers are free text (--llm-answer-format free), as registered.
set -uo pipefail
cd "$(dirname "$0")/.."

tiny=0
out_arg=
url=
model=smollm2-135m
while [ $# -gt 0 ]; do
    case "$1" in
        --tiny) tiny=1 ;;
        --llm-base-url) url=$2; shift ;;
        --llm-model) model=$2; shift ;;
        --out) out_arg=$2; shift ;;
        *) echo "reinforce_baby_curriculum_comparison.sh: unknown argument $1 (--tiny, --llm-base-url URL, --llm-model NAME, --out DIR)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$tiny" = 1 ]; then
    out=benchmark/out/reinforce_baby_curriculum_comparison_tiny report=benchmark/out/reinforce_baby_curriculum_comparison_tiny/report
    steps=320 seeds=1
else
    out=benchmark/out/reinforce_baby_curriculum_comparison report=docs/results/reinforce_baby/curriculum_comparison
    steps=80000 seeds=3
fi
if [ -n "$out_arg" ]; then out=$out_arg report=$out_arg/report; fi
mkdir -p "$out" "$report" || exit 1

given_url=$url
source benchmark/llm_server.sh
trap stop_server EXIT
url=$given_url
if [ -z "$url" ]; then
    require_smollm2
    start_server "$smollm2" "$model" "$out/server.log"
fi

status=0
OMP_NUM_THREADS=1 python benchmark/benchmark.py \
    --command "python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --no-analysis --total-timesteps $steps --llm-answer-format free --llm-model $model --llm-base-url $url --llm-cache $out/llm_cache.sqlite" \
    --grid "--parent deterministic --curriculum-rule mastery | --parent deterministic --curriculum-rule plan | --parent llm --curriculum-rule mastery | --parent llm --curriculum-rule plan" \
    --num-seeds "$seeds" --start-seed 1 --workers 1 --resume --output "$out/runs" || status=$?
stop_server

python benchmark/reinforce_baby_curriculum_comparison.py --sweep "$out/runs" --report "$report" || status=$?
exit "$status"
