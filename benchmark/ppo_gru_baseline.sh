#!/usr/bin/env bash
# Experiment ppo_gru_baseline: the GRU agent on NonStationaryCartPole (seed3, seed3 --hide-velocity,
# inverted4 --hide-velocity), its memoryless (--memory none) and --oracle controls, and the stable-baselines3
# peers (PPO MLP, sb3-contrib RecurrentPPO LSTM) on the same env, budget and machine.
#   benchmark/ppo_gru_baseline.sh            full sweep -> report in docs/results/ppo_gru_baseline
#   benchmark/ppo_gru_baseline.sh --quick    smoke flavour (minutes) -> benchmark/out/ppo_gru_baseline_quick/report
# Other arguments go to benchmark.py (e.g. --backend ray --ray-address auto, --workers 4). Re-running continues a
# killed sweep; the GRU runs share benchmark/out/cartpole_main with ppo_gru_astral.sh, so they are made once.
# Cost on a 2-core machine: the GRU runs take minutes each, SB3 PPO ~7 min, RecurrentPPO ~80 steps/s (hours at 500k).
set -uo pipefail
cd "$(dirname "$0")/.."

steps=500000 seeds=5 control_seeds=5 peer_seeds=5 lstm_seeds=2 lstm_steps=500000
out=benchmark/out report=docs/results/ppo_gru_baseline
extra=()
for arg in "$@"; do
    if [ "$arg" = --quick ]; then
        steps=8192 seeds=1 control_seeds=1 peer_seeds=1 lstm_seeds=1 lstm_steps=2048
        out=benchmark/out/ppo_gru_baseline_quick report=benchmark/out/ppo_gru_baseline_quick/report
    else
        extra+=("$arg")
    fi
done
grid="--modes-preset seed3 | --modes-preset seed3 --hide-velocity | --modes-preset inverted4 --hide-velocity"
status=0
# RecurrentPPO takes ~35 min a run here: its grid puts the settings where memory matters first, so a sweep cut
# short still has the informative runs
lstm_grid="--modes-preset seed3 --hide-velocity | --modes-preset inverted4 --hide-velocity | --modes-preset seed3"
sweep() { python benchmark/benchmark.py --workers 2 --resume "$@" "${extra[@]}" || status=1; }

sweep --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model" \
    --grid "$grid" --num-seeds "$seeds" --output "$out/cartpole_main"
sweep --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model --memory none" \
                "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model --oracle" \
    --grid "$grid" --num-seeds "$control_seeds" --output "$out/cartpole_controls"
sweep --command "python benchmark/sb3_peers.py --algo ppo --total-timesteps $steps --save-model" \
    --grid "$grid" --num-seeds "$peer_seeds" --output "$out/cartpole_sb3_ppo"
sweep --command "python benchmark/sb3_peers.py --algo recurrent_ppo --total-timesteps $lstm_steps --save-model" \
    --grid "$lstm_grid" --num-seeds "$lstm_seeds" --output "$out/cartpole_sb3_lstm"
# a faster configuration for the 10x-RecurrentPPO target. The update's cost is the GRU's sequential replay, which at
# hidden 128 is mostly matrix arithmetic, so the search keeps the 4096-sample batch and tries a smaller GRU and/or
# shorter sequences on the memory setting (seeds 1-5); the first configuration is the one that met the return target
# there, so it is then run on every setting and, against selection on those seeds, on fresh seeds 6-10
hv="--modes-preset seed3 --hide-velocity"
fast="--num-envs 64 --num-steps 64 --hidden-size 64"
sweep --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model $hv" \
    --grid "$fast | --num-envs 128 --num-steps 32 | --num-envs 128 --num-steps 32 --hidden-size 64" \
    --num-seeds "$seeds" --output "$out/cartpole_fast_probe"
sweep --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model $fast" \
    --grid "$grid" --num-seeds "$seeds" --output "$out/cartpole_fast"
sweep --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model $fast $hv" \
    --num-seeds "$seeds" --start-seed $((seeds + 1)) --output "$out/cartpole_fast_fresh_seeds"
# speed, side by side under one condition: two runs at a time on an otherwise idle machine (as the RecurrentPPO pairs
# ran), hidden velocity; the GRU at its defaults and with the same 4096-step batch as 64 envs x 64 steps (half the
# sequential replay length), and SB3 PPO (MLP) as the feed-forward reference
sweep --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model $hv" \
                "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model --num-envs 64 --num-steps 64 $hv" \
                "python benchmark/sb3_peers.py --algo ppo --total-timesteps $steps --save-model $hv" \
                "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model $fast $hv" \
                "python benchmark/sb3_peers.py --algo recurrent_ppo --total-timesteps $lstm_steps --save-model $hv" \
    --num-seeds 2 --output "$out/cartpole_speed"
case " ${extra[*]} " in *" --dry-run "*) exit "$status" ;; esac

# methods are named by their command text; ppo_gru_astral.sh may have added ASTRAL runs to cartpole_main
python benchmark/report.py --sweep "$out/cartpole_main" "$out/cartpole_controls" "$out/cartpole_fast" "$out/cartpole_sb3_ppo" "$out/cartpole_sb3_lstm" \
    --output "$report" --title "ppo_gru_baseline: GRU PPO, controls and SB3 peers" \
    --labels "hidden-size 64=ppo_gru_fast" "memory none=ppo_gru_memory_none" "oracle=ppo_gru_oracle" "ppo_gru_baseline.py=ppo_gru" \
             "ppo_gru_astral.py=ppo_gru_astral" "algo ppo=sb3_ppo_mlp" "algo recurrent_ppo=sb3_recurrent_ppo_lstm" || status=1
python benchmark/report.py --sweep "$out/cartpole_speed" --output "$report/speed" \
    --title "ppo_gru_baseline speed: two runs at a time, seed3 --hide-velocity" \
    --labels "0=ppo_gru" "1=ppo_gru_64envs_x_64steps" "2=sb3_ppo_mlp" "3=ppo_gru_fast" "4=sb3_recurrent_ppo_lstm" || status=1
exit "$status"
