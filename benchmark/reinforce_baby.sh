#!/usr/bin/env bash
# Experiment reinforce_baby:
#   1. the plan's locked MVP command over seeds 1..5, with its four success criteria checked per seed
#      (> 12.5%, > 50% by step 5,000, entropy decreases, world-model MSE decreases) and the target
#      (> 90% by step 5,000 on >= 4/5 seeds, under a minute);
#   2. curriculum on all three tasks: REINFORCE vs PPO vs RL-only vs KL-distill, 3 seeds.
#   benchmark/reinforce_baby.sh            full -> tables and PNGs in docs/results/reinforce_baby
#   benchmark/reinforce_baby.sh --quick    smoke flavour (a minute or two) -> benchmark/out/reinforce_baby_quick/report
# Any other argument goes to benchmark.py (e.g. --backend ray --ray-address auto). Re-running continues a killed
# sweep (--resume); the script exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0 dry_run=0
extra=()
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --dry-run) dry_run=1; extra+=("$arg") ;;
        *) extra+=("$arg") ;;
    esac
done

# the locked MVP command, exactly as the plan states it (benchmark.py appends --seed and --runs-dir)
MVP="python cleanrl_astral/reinforce_baby.py --task pattern-echo --num-actions 8 --hidden-dim 64 --num-layers 2 --algorithm reinforce --parent deterministic --total-timesteps 10000"
if [ "$quick" = 1 ]; then
    out=benchmark/out/reinforce_baby_quick report=benchmark/out/reinforce_baby_quick/report
    mvp_seeds=2 cur_steps=4000 cur_seeds=1
else
    out=benchmark/out/reinforce_baby report=docs/results/reinforce_baby
    mvp_seeds=5 cur_steps=80000 cur_seeds=3
fi

# one run at a time: the MVP's wall time is part of its target
python benchmark/benchmark.py --command "$MVP" --num-seeds "$mvp_seeds" --start-seed 1 --workers 1 --resume \
    --output "$out/mvp" "${extra[@]}"
status=$?

python benchmark/benchmark.py \
    --command "python cleanrl_astral/reinforce_baby.py --task all --curriculum --num-actions 8 --total-timesteps $cur_steps --no-analysis" \
    --grid "--algorithm reinforce | --algorithm ppo | --world-model-coef 0 --pred-reward-weight 0 | --kl-coef 1.0" \
    --num-seeds "$cur_seeds" --start-seed 1 --workers 2 --resume --output "$out/curriculum" "${extra[@]}" || status=$?
if [ "$dry_run" = 1 ]; then exit "$status"; fi

mkdir -p "$report"
python benchmark/report.py --sweep "$out/curriculum" --output "$report/curriculum_report" --title "reinforce_baby curriculum" \
    --labels 0=curriculum || status=$?

# the MVP criteria (from the runs' success curves and eval.json) and the curriculum comparison
python benchmark/reinforce_baby_report.py --out "$out" --report "$report" || status=$?
exit "$status"
