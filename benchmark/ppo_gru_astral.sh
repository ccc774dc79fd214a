#!/usr/bin/env bash
# Experiment ppo_gru_astral: ASTRAL vs the GRU baseline on NonStationaryCartPole, 5 seeds x 500k steps, on
# seed3, seed3 --hide-velocity and inverted4 --hide-velocity.
#   benchmark/ppo_gru_astral.sh            full sweep -> report in docs/results/ppo_gru_astral
#   benchmark/ppo_gru_astral.sh --quick    smoke flavour (a few minutes) -> benchmark/out/ppo_gru_astral_quick/report
# Other arguments go to benchmark.py (e.g. --backend ray --ray-address auto, --workers 4). Re-running continues a
# killed sweep; the sweep directory is shared with ppo_gru_baseline.sh, so the baseline runs are made once.
set -uo pipefail
cd "$(dirname "$0")/.."

steps=500000 seeds=5 out=benchmark/out/cartpole_main report=docs/results/ppo_gru_astral
extra=()
for arg in "$@"; do
    if [ "$arg" = --quick ]; then
        steps=16384 seeds=2 out=benchmark/out/ppo_gru_astral_quick report=benchmark/out/ppo_gru_astral_quick/report
    else
        extra+=("$arg")
    fi
done

python benchmark/benchmark.py \
    --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model" \
              "python cleanrl_astral/ppo_gru_astral.py --sharpen-gate --total-timesteps $steps --save-model" \
    --grid "--modes-preset seed3 | --modes-preset seed3 --hide-velocity | --modes-preset inverted4 --hide-velocity" \
    --num-seeds "$seeds" --workers 2 --resume --output "$out" "${extra[@]}"
status=$?
case " ${extra[*]} " in *" --dry-run "*) exit "$status" ;; esac

python benchmark/report.py --sweep "$out" --output "$report" --title "ppo_gru_astral: ASTRAL vs GRU baseline" \
    --labels 0=ppo_gru_baseline 1=ppo_gru_astral || status=$?
exit "$status"
