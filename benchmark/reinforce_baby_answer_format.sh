#!/usr/bin/env bash
# SmolLM2-135M's answers on reinforce_baby's agreement states, free against constrained (--llm-answer-format free |
# grammar), behind llama.cpp's OpenAI-compatible server (one thread, a free loopback port, stopped on exit):
#   bash benchmark/reinforce_baby_answer_format.sh -> docs/results/reinforce_baby/answer_format.{json,md} and the
#   real-server test's states, tests/data/reinforce_baby_llm_unparsed_states.json. About 5 CPU-minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=benchmark/out/reinforce_baby_answer_format
mkdir -p "$out" || exit 1
source benchmark/llm_server.sh
trap stop_server EXIT
require_smollm2
start_server "$smollm2" smollm2-135m "$out/server.log"
OMP_NUM_THREADS=1 python benchmark/reinforce_baby_answer_format.py --llm-base-url "$url" --llm-model smollm2-135m \
    --out docs/results/reinforce_baby/answer_format --test-states tests/data/reinforce_baby_llm_unparsed_states.json
