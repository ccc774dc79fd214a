#!/usr/bin/env bash
# Experiment recurrentppo_side_by_side, pre-registered in
# docs/results/ppo_gru_baseline/recurrentppo_side_by_side/PREREGISTRATION.md: sb3-contrib's RecurrentPPO with
# rl-baselines3-zoo's CartPoleNoVel-v1 hyperparameters (benchmark/sb3_peers.py) against ppo_gru_baseline.py with its
# default flags and with the one small-budget setting fixed there (--num-envs 32), on the zoo's task
# (--modes-preset seed3 --fixed-mode 0 --hide-velocity), seeds 1-3, at 100k and at 500k steps.
#   benchmark/recurrentppo_side_by_side.sh           one run at a time (wall times comparable) -> benchmark/out/recurrentppo_side_by_side,
#                                                    then the report -> docs/results/ppo_gru_baseline/recurrentppo_side_by_side
#   benchmark/recurrentppo_side_by_side.sh --quick   smoke flavour: 4,096 and 8,192 steps, seed 1 -> benchmark/out/recurrentppo_side_by_side_quick
# Other arguments go to benchmark.py (e.g. --dry-run). Re-running continues a killed sweep (--resume); the script exits
# non-zero if any run failed. Cost (PREREGISTRATION.md): ~1 CPU-hour, ~1 h of wall time.
set -uo pipefail
cd "$(dirname "$0")/.."

out=benchmark/out/recurrentppo_side_by_side report=docs/results/ppo_gru_baseline/recurrentppo_side_by_side
budgets="100000 500000" seeds=3
extra=()
for arg in "$@"; do
    if [ "$arg" = --quick ]; then
        out=benchmark/out/recurrentppo_side_by_side_quick report=benchmark/out/recurrentppo_side_by_side_quick/report
        budgets="4096 8192" seeds=1
    else
        extra+=("$arg")
    fi
done
task="--modes-preset seed3 --fixed-mode 0 --hide-velocity --save-model"
status=0
python benchmark/benchmark.py --workers 1 --resume --retries 1 \
    --command "python benchmark/sb3_peers.py --algo recurrent_ppo $task" \
              "python cleanrl_astral/ppo_gru_baseline.py $task" \
              "python cleanrl_astral/ppo_gru_baseline.py $task --num-envs 32" \
    --grid "--total-timesteps $budgets" --num-seeds "$seeds" --output "$out" "${extra[@]}" || status=1
case " ${extra[*]} " in *" --dry-run "*) exit "$status" ;; esac

python benchmark/recurrentppo_side_by_side_report.py --sweep "$out" --output "$report" || status=1
exit "$status"
