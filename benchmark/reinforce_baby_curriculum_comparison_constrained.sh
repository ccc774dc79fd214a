#!/usr/bin/env bash
# The pre-registered curriculum comparison of reinforce_baby with constrained answers
# (docs/results/reinforce_baby/curriculum_comparison_constrained/PREREGISTRATION.md): the rule and SmolLM2-135M as
# parents x the mastery and the plan's curriculum x seeds 1..3, 80k steps, the answer role's grammar (the default),
# a checkpoint every 8,000 steps, one run at a time, then the report and verdict.
#   bash benchmark/reinforce_baby_curriculum_comparison_constrained.sh
#       -> runs in benchmark/out/reinforce_baby_curriculum_comparison_constrained, the report in
#          docs/results/reinforce_baby/curriculum_comparison_constrained
#   --tiny: 320 steps, seed 1, checkpoints every 160 steps -> benchmark/out/..._tiny/report
#   --llm-base-url URL uses a running OpenAI-compatible server (its model named --llm-model) instead of starting
#   llama.cpp's server with SmolLM2 (benchmark/llm_server.sh); --out DIR puts the runs and the report under DIR.
# Re-running continues: a finished run (eval.json) is kept, a stopped one continues from its checkpoint.pt (--resume),
# the others start. Before each LLM run a server that stopped answering is restarted (when this script started it).
# After an LLM run whose server faults (requests without a reply) exceed 0.5% of its queries, the run is moved to
# faulted/ and made once more from its start on a restarted server with the same cache; the registration's report
# leaves out a run still above the limit. Expected: 1-3 hours of wall time. Needs requirements-llm.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

tiny=0
out_arg=
given_url=
model=smollm2-135m
while [ $# -gt 0 ]; do
    case "$1" in
        --tiny) tiny=1 ;;
        --llm-base-url) given_url=$2; shift ;;
        --llm-model) model=$2; shift ;;
        --out) out_arg=$2; shift ;;
        *) echo "reinforce_baby_curriculum_comparison_constrained.sh: unknown argument $1 (--tiny, --llm-base-url URL, --llm-model NAME, --out DIR)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$tiny" = 1 ]; then
    out=benchmark/out/reinforce_baby_curriculum_comparison_constrained_tiny
    report=$out/report steps=320 every=160 seeds=1
else
    out=benchmark/out/reinforce_baby_curriculum_comparison_constrained
    report=docs/results/reinforce_baby/curriculum_comparison_constrained steps=80000 every=8000 seeds="1 2 3"
fi
if [ -n "$out_arg" ]; then out=$out_arg report=$out_arg/report; fi
sweep=$out/runs
mkdir -p "$sweep/runs" "$out/logs" "$out/faulted" "$report" || exit 1

source benchmark/llm_server.sh
trap stop_server EXIT
url=$given_url
serve() {  # a server that answers: the given one, or ours (started, or restarted when it stopped answering)
    if [ -n "$given_url" ]; then return 0; fi
    if [ -n "$server" ] && python -c "import urllib.request; urllib.request.urlopen('$url/models', timeout=5)" 2>/dev/null; then
        return 0
    fi
    stop_server
    require_smollm2
    start_server "$smollm2" "$model" "$out/server.log.$(date +%s)"
}

COMMAND="python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --no-analysis --total-timesteps $steps --checkpoint-every $every --llm-model $model --llm-cache $out/llm_cache.sqlite"
FAILED_LIMIT=0.005  # server faults: the registration's limit (requests without a reply / queries)

run() {  # run KEY FLAGS...: one run of the grid in $sweep/runs/KEY, continued from its checkpoint if it has one
    local key=$1 dir=$sweep/runs/$1 start rc ckpt
    shift
    if ls "$dir"/*/eval.json > /dev/null 2>&1; then return 0; fi
    ckpt=$(ls "$dir"/*/checkpoint.pt 2> /dev/null | head -1)
    start=$(date +%s.%N)
    if [ -n "$ckpt" ]; then
        echo "# $key: resumed from $ckpt" >> "$out/logs/$key.log"
        OMP_NUM_THREADS=1 python cleanrl_astral/reinforce_baby.py --resume "$ckpt" --llm-base-url "$url" >> "$out/logs/$key.log" 2>&1
    else
        rm -rf "$dir"
        echo "# $key: $COMMAND --llm-base-url $url $*" >> "$out/logs/$key.log"
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=1 $COMMAND --llm-base-url "$url" "$@" --runs-dir "$dir" >> "$out/logs/$key.log" 2>&1
    fi
    rc=$?
    echo "{\"runs_dir\": \"$dir\", \"exit_code\": $rc, \"wall_time_s\": $(python -c "import time; print(round(time.time() - $start, 1))")}" >> "$sweep/manifest.jsonl"
    return "$rc"
}

faulted() {  # faulted KEY: whether the finished run's server faults exceed the limit
    python - "$sweep/runs/$1" "$FAILED_LIMIT" << 'PY'
import glob, json, sys
ev = json.load(open(glob.glob(sys.argv[1] + "/*/eval.json")[0]))
p = ev.get("parent", {})
sys.exit(0 if p.get("fallbacks_failed", 0) > float(sys.argv[2]) * max(1, p.get("queries", 0)) else 1)
PY
}

status=0
for parent in deterministic llm; do
    for rule in mastery plan; do
        for seed in $seeds; do
            key=parent_${parent}__curriculum-rule_${rule}__s$seed
            if [ "$parent" = llm ]; then serve; fi
            run "$key" --parent "$parent" --curriculum-rule "$rule" --seed "$seed" || status=$?
            if [ "$parent" = llm ] && [ ! -e "$out/faulted/$key" ] && faulted "$key"; then
                echo "$key: server faults above $FAILED_LIMIT of its queries: made once more on a restarted server" >&2
                mv "$sweep/runs/$key" "$out/faulted/$key"
                if [ -z "$given_url" ]; then stop_server; fi
                serve
                run "$key" --parent "$parent" --curriculum-rule "$rule" --seed "$seed" || status=$?
            fi
        done
    done
done
stop_server

python benchmark/reinforce_baby_curriculum_comparison.py --sweep "$sweep" --report "$report" --registration constrained || status=$?
exit "$status"
