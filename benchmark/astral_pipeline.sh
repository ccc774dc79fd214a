#!/usr/bin/env bash
# The ASTRAL plan's phase 7 end to end, in one command:
#   1. train the GRU baseline and ASTRAL (ppo_gru_baseline.py, ppo_gru_astral.py) on seed3, seed3 --hide-velocity and
#      inverted4 --hide-velocity, with the benchmark runner;
#   2. test-time adaptation of the gate (tta_gating.py adapt: none / gate / all / tent) on every ASTRAL checkpoint,
#      on its training modes and, for the seed3 agents, on two unseen physics;
#   3. interventions (tta_gating.py clamp: every slot forced on, uniform and learned gate);
#   4. reports (benchmark/report.py) for the training sweep and for the TTA / clamp sweep.
#   benchmark/astral_pipeline.sh            full: 5 seeds x 500k steps (hours on 2 cores) -> benchmark/out/astral_pipeline, docs/results/astral_pipeline
#   benchmark/astral_pipeline.sh --quick    smoke: 1 seed x 8192 steps, tiny TTA budget (minutes) -> benchmark/out/astral_pipeline_quick
# Other arguments go to every benchmark.py call (e.g. --backend ray --ray-address auto, --workers 4). Re-running continues
# where a killed pipeline stopped (every stage resumes); the script exits non-zero if any stage had a failed run.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
extra=()
for arg in "$@"; do
    if [ "$arg" = --quick ]; then quick=1; else extra+=("$arg"); fi
done

if [ "$quick" = 1 ]; then
    steps=8192
    seeds=1
    out=benchmark/out/astral_pipeline_quick
    report=benchmark/out/astral_pipeline_quick/report
    tta_flags=(--quick)
else
    steps=500000
    seeds=5
    out=benchmark/out/astral_pipeline
    report=docs/results/astral_pipeline
    tta_flags=()
fi
status=0

echo "== 1/3 training: baseline and ASTRAL, $seeds seed(s) x $steps steps"
python benchmark/benchmark.py \
    --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model" \
              "python cleanrl_astral/ppo_gru_astral.py --sharpen-gate --total-timesteps $steps --save-model" \
    --grid "--modes-preset seed3 | --modes-preset seed3 --hide-velocity | --modes-preset inverted4 --hide-velocity" \
    --num-seeds "$seeds" --workers 2 --resume --output "$out/train" "${extra[@]}" || status=$?
python benchmark/report.py --sweep "$out/train" --output "$report/train" --title "astral_pipeline: training" \
    --labels 0=ppo_gru_baseline 1=ppo_gru_astral || status=$?

echo "== 2/3 and 3/3: test-time adaptation and slot clamping on the ASTRAL checkpoints"
benchmark/tta_gating.sh "${tta_flags[@]}" --train-sweep "$out/train" --output "$out/tta" --report "$report/tta" "${extra[@]}" || status=$?

echo "reports: $report/train/report.md and $report/tta/report.md"
exit "$status"
