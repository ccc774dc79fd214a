#!/usr/bin/env bash
# reinforce_baby's entropy bonus on the locked MVP: --ent-coef 0.01 (the plan's) against 0.03 (the script's), seeds
# 1..10, 10k steps, one run at a time (about 3 CPU-minutes), then the per-seed table:
#   bash benchmark/reinforce_baby_entropy.sh -> docs/results/reinforce_baby/entropy_mvp.{md,json}
set -uo pipefail
cd "$(dirname "$0")/.."
out=benchmark/out/reinforce_baby_entropy
MVP="python cleanrl_astral/reinforce_baby.py --task pattern-echo --num-actions 8 --hidden-dim 64 --num-layers 2 --algorithm reinforce --parent deterministic --total-timesteps 10000"
status=0
for ent in 0.01 0.03; do
    python benchmark/benchmark.py --command "$MVP --ent-coef $ent" --num-seeds 10 --start-seed 1 --workers 1 --resume \
        --output "$out/ent$ent" || status=$?
done
python benchmark/reinforce_baby_mvp_seeds.py --title "the entropy bonus, the plan's 0.01 against the script's 0.03" \
    --command "$MVP" --sweep "--ent-coef 0.01=$out/ent0.01" --sweep "--ent-coef 0.03=$out/ent0.03" \
    --report docs/results/reinforce_baby/entropy_mvp || status=$?
exit "$status"
