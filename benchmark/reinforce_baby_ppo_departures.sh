#!/usr/bin/env bash
# reinforce_baby's PPO against the plan's, one departure at a time (registered in
# docs/results/reinforce_baby/ppo_departures/PREREGISTRATION.md): sequence-next at level 2, 16 actions, 20k steps,
# seeds 1..5, one run at a time; the script's defaults beside the plan's setting of each departure:
# --bootstrap-time-limit (the value after the time limit bootstrapped), --no-norm-adv (raw advantages) and
# --vf-coef 1.0 (value loss 0.5 x MSE). About 10 CPU-minutes.
#   bash benchmark/reinforce_baby_ppo_departures.sh -> docs/results/reinforce_baby/ppo_departures/report.md
# Re-running continues a killed sweep (benchmark.py --resume).
set -uo pipefail
cd "$(dirname "$0")/.."
out=benchmark/out/reinforce_baby_ppo_departures
status=0
python benchmark/benchmark.py \
    --command "python cleanrl_astral/reinforce_baby.py --task sequence-next --algorithm ppo --no-analysis --total-timesteps 20000" \
    --grid " | --bootstrap-time-limit | --no-norm-adv | --vf-coef 1.0" --num-seeds 5 --start-seed 1 --workers 1 --resume \
    --retries 1 --output "$out" || status=$?
python benchmark/report.py --sweep "$out" --output docs/results/reinforce_baby/ppo_departures \
    --title "reinforce_baby PPO on sequence-next: the script's settings against the plan's, one at a time" || status=$?
exit "$status"
