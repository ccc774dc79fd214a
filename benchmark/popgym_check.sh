#!/usr/bin/env bash
# Experiment popgym_check, pre-registered in docs/results/ppo_gru_baseline/popgym/PREREGISTRATION.md: the GRU baseline
# (default flags, --num-steps per environment), its memoryless control and ASTRAL (default flags) on five POPGym
# environments, measured as POPGym's MMER (charts/mmer) against the POPGym paper's GRU.
#   benchmark/popgym_check.sh            the registered grid, two runs at a time -> benchmark/out/popgym_check, then the
#                                        report (benchmark/popgym_check_report.py) -> docs/results/ppo_gru_baseline/popgym
#   benchmark/popgym_check.sh --quick    smoke flavour: every run at 8,192 steps, seed 1 -> benchmark/out/popgym_check_quick
# Other arguments go to benchmark.py (e.g. --dry-run). Re-running continues a killed sweep (--resume); the script exits
# non-zero if any run failed. Cost (PREREGISTRATION.md): ~2.2 CPU-hours, ~1.2 h of wall time on an idle 2-core machine.
set -uo pipefail
cd "$(dirname "$0")/.."

out=benchmark/out/popgym_check report=docs/results/ppo_gru_baseline/popgym seeds=3 quick=0
extra=()
for arg in "$@"; do
    if [ "$arg" = --quick ]; then
        out=benchmark/out/popgym_check_quick report=benchmark/out/popgym_check_quick/report seeds=1 quick=1
    else
        extra+=("$arg")
    fi
done
steps() {  # the registered budget, or the smoke flavour's 8,192 steps
    if [ "$quick" = 1 ]; then echo 8192; else echo "$1"; fi
}
baseline="python cleanrl_astral/ppo_gru_baseline.py --save-model"
astral="python cleanrl_astral/ppo_gru_astral.py --save-model"
# environment, budget, the only flag that differs from the defaults (--num-steps: see PREREGISTRATION.md)
rp="--env-id popgym-RepeatPreviousEasy-v0 --num-steps 51 --total-timesteps $(steps 2000000)"
rf="--env-id popgym-RepeatFirstEasy-v0 --num-steps 51 --total-timesteps $(steps 2000000)"
pc="--env-id popgym-PositionOnlyCartPoleMedium-v0 --total-timesteps $(steps 1000000)"
npc="--env-id popgym-NoisyPositionOnlyCartPoleMedium-v0 --total-timesteps $(steps 1000000)"
mab="--env-id popgym-MultiarmedBanditEasy-v0 --num-steps 64 --total-timesteps $(steps 1000000)"
# the memoryless control: one seed, 1M steps on every environment
none="--memory none --exp-name ppo_gru_baseline_memory_none"
rp1="--env-id popgym-RepeatPreviousEasy-v0 --num-steps 51 --total-timesteps $(steps 1000000)"
rf1="--env-id popgym-RepeatFirstEasy-v0 --num-steps 51 --total-timesteps $(steps 1000000)"

status=0
sweep() { python benchmark/benchmark.py --workers 2 --resume --retries 1 "$@" "${extra[@]}" || status=1; }
sweep --command "$baseline $rp" "$baseline $rf" "$baseline $pc" "$baseline $npc" "$baseline $mab" \
    --num-seeds "$seeds" --output "$out/gru"
sweep --command "$baseline $none $rp1" "$baseline $none $rf1" "$baseline $none $pc" "$baseline $none $npc" "$baseline $none $mab" \
    --num-seeds 1 --output "$out/memory_none"
sweep --command "$astral $pc" "$astral $npc" --num-seeds "$seeds" --output "$out/astral"
case " ${extra[*]} " in *" --dry-run "*) exit "$status" ;; esac

python benchmark/popgym_check_report.py --sweeps "$out/gru" "$out/memory_none" "$out/astral" \
    --paper docs/results/ppo_gru_baseline/popgym/paper_mmer.csv --output "$report" || status=1
exit "$status"
