#!/usr/bin/env bash
# Experiment ppo_gru_baseline: the GRU agent on NonStationaryCartPole (seed3, seed3 --hide-velocity,
# inverted4 --hide-velocity), its memoryless (--memory none) and --oracle controls, and the stable-baselines3
# peers (PPO MLP, sb3-contrib RecurrentPPO LSTM) on the same env, budget and machine.
#   benchmark/ppo_gru_baseline.sh            full sweep -> report in docs/results/ppo_gru_baseline
#   benchmark/ppo_gru_baseline.sh --quick    smoke flavour (minutes) -> benchmark/out/ppo_gru_baseline_quick/report
#   benchmark/ppo_gru_baseline.sh --speed    wall time in one invocation, one run after another, one torch thread each:
#       CleanRL's own ppo.py on CartPole-v1 (cleanrl==1.2.0 from PyPI, unpacked with its pinned gym==0.23.1 into a
#       throwaway venv under benchmark/out; no CleanRL code enters the repository), SB3 PPO (MLP), sb3-contrib
#       RecurrentPPO (at 100k steps, LSTM_SPEED_STEPS: the slowest by far), ppo_gru_baseline.py and ppo_gru_astral.py with
#       their default flags, and ppo_gru_astral.py with the baseline's rollout shape (128 envs x 32 steps); all but ppo.py
#       on seed3 --hide-velocity -> benchmark/out/ppo_gru_baseline_speed/speed.md
# Other arguments go to benchmark.py (e.g. --backend ray --ray-address auto, --workers 4). Re-running continues a
# killed sweep; the GRU runs share benchmark/out/cartpole_main with ppo_gru_astral.sh, so they are made once.
# Cost on an idle 2-core machine, one run at a time: a GRU run ~1 min (ASTRAL with its defaults ~2.5 min), SB3 PPO
# ~2.5 min, RecurrentPPO ~500-600 steps/s; the --speed flavour takes ~12 min.
set -uo pipefail
cd "$(dirname "$0")/.."

steps=500000 seeds=5 defaults_seeds=10 control_seeds=5 peer_seeds=5 lstm_seeds=2 lstm_steps=500000
out=benchmark/out report=docs/results/ppo_gru_baseline
extra=() speed_only=0
for arg in "$@"; do
    if [ "$arg" = --speed ]; then
        speed_only=1
    elif [ "$arg" = --quick ]; then
        steps=8192 seeds=1 defaults_seeds=1 control_seeds=1 peer_seeds=1 lstm_seeds=1 lstm_steps=2048
        out=benchmark/out/ppo_gru_baseline_quick report=benchmark/out/ppo_gru_baseline_quick/report
    else
        extra+=("$arg")
    fi
done

if [ "$speed_only" = 1 ]; then
    speed=benchmark/out/ppo_gru_baseline_speed cleanrl=benchmark/out/ppo_gru_baseline_speed/cleanrl
    speed_steps=${SPEED_STEPS:-500000} lstm_speed_steps=${LSTM_SPEED_STEPS:-100000}
    mkdir -p "$speed"
    if [ ! -x "$cleanrl/venv/bin/python" ]; then
        pip download --no-deps --ignore-requires-python cleanrl==1.2.0 -d "$cleanrl" \
            && python -m zipfile -e "$cleanrl"/cleanrl-1.2.0-py3-none-any.whl "$cleanrl/src" \
            && python -m venv "$cleanrl/venv" \
            && "$cleanrl/venv/bin/python" -m pip install -q torch==2.13.0 gym==0.23.1 pygame "numpy<2" tensorboard || exit 1
    fi
    : > "$speed/times.tsv"
    timed() {  # name steps command...: one run, its wall time and SPS appended to times.tsv
        local name=$1 n=$2 start end
        shift 2
        start=$(date +%s.%N)
        OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 "$@" > "$speed/$name.log" 2>&1 || { echo "$name failed: $speed/$name.log"; exit 1; }
        end=$(date +%s.%N)
        printf '%s\t%s\t%s\t%s\n' "$name" "$n" "$(python -c "print($end - $start)")" "$*" >> "$speed/times.tsv"
    }
    hv="--modes-preset seed3 --hide-velocity --runs-dir $speed/runs"
    timed cleanrl_ppo "$speed_steps" bash -c "cd $speed && $PWD/$cleanrl/venv/bin/python $PWD/$cleanrl/src/cleanrl/ppo.py --total-timesteps $speed_steps"
    timed sb3_ppo_mlp "$speed_steps" python benchmark/sb3_peers.py --algo ppo --total-timesteps "$speed_steps" $hv
    timed sb3_recurrent_ppo "$lstm_speed_steps" python benchmark/sb3_peers.py --algo recurrent_ppo --total-timesteps "$lstm_speed_steps" $hv
    timed ppo_gru_baseline "$speed_steps" python cleanrl_astral/ppo_gru_baseline.py --total-timesteps "$speed_steps" $hv
    timed ppo_gru_astral "$speed_steps" python cleanrl_astral/ppo_gru_astral.py --sharpen-gate --total-timesteps "$speed_steps" $hv
    timed ppo_gru_astral_128x32 "$speed_steps" python cleanrl_astral/ppo_gru_astral.py --sharpen-gate --total-timesteps "$speed_steps" $hv \
        --num-envs 128 --num-steps 32
    python - "$speed" <<'PY'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(f"{sys.argv[1]}/times.tsv")]
per_step = {name: float(wall) / int(steps) for name, steps, wall, _ in rows}
lines = ["| run | steps | wall time (s) | SPS | time per step / CleanRL ppo.py's |", "|---|---|---|---|---|"]
for name, steps, wall, _ in rows:
    lines.append(f"| {name} | {int(steps)} | {float(wall):.1f} | {int(steps) / float(wall):.0f} | "
                 f"{per_step[name] / per_step[rows[0][0]]:.2f} |")
lines.append("\ntime per step / ppo_gru_baseline's: " + ", ".join(
    f"{name} {per_step[name] / per_step['ppo_gru_baseline']:.2f}" for name in per_step if name.startswith("ppo_gru_astral")))
open(f"{sys.argv[1]}/speed.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
    exit 0
fi
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
# the learning check of the default flags: every setting, ten seeds
sweep --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps $steps --save-model" \
    --grid "$grid" --num-seeds "$defaults_seeds" --output "$out/cartpole_defaults"
case " ${extra[*]} " in *" --dry-run "*) exit "$status" ;; esac

# methods are named by their command text; ppo_gru_astral.sh may have added ASTRAL runs to cartpole_main
python benchmark/report.py --sweep "$out/cartpole_defaults" --output "$report/defaults" \
    --title "ppo_gru_baseline: default flags, ten seeds" --labels "ppo_gru_baseline.py=ppo_gru" || status=1
python benchmark/report.py --sweep "$out/cartpole_main" "$out/cartpole_controls" "$out/cartpole_sb3_ppo" "$out/cartpole_sb3_lstm" \
    --output "$report" --title "ppo_gru_baseline: GRU PPO, controls and SB3 peers" \
    --labels "memory none=ppo_gru_memory_none" "oracle=ppo_gru_oracle" "ppo_gru_baseline.py=ppo_gru" \
             "ppo_gru_astral.py=ppo_gru_astral" "algo ppo=sb3_ppo_mlp" "algo recurrent_ppo=sb3_recurrent_ppo_lstm" || status=1
exit "$status"
