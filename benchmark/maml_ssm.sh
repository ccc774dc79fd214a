#!/usr/bin/env bash
# Experiment maml_ssm: MAML on point-nav-2d (the MAML paper's 2D navigation) with SSM vs GRU vs MLP policies
# (matched parameter counts), plus a "pretrained multi-task + fine-tune" baseline (--num-inner-steps 0) and a
# "random init + fine-tune" baseline (--outer-steps 0). Every run evaluates itself at the end (eval.json:
# returns on 40 fresh test tasks after 0/1/2/3 inner steps, alpha then alpha/2); the summary puts them next to
# the paper's Table 4 (-40.41, -11.68, -3.33, -3.23) with meta-training wall time.
#   benchmark/maml_ssm.sh              full: SSM 5 seeds, every other arm 5 seeds -> docs/results/maml_ssm
#   benchmark/maml_ssm.sh --budget     what the docs report (fits ~40 CPU-minutes on a shared 2-core box):
#                                      SSM seeds 1-2, GRU/MLP/baselines seed 1
#   benchmark/maml_ssm.sh --quick      smoke flavour (a minute or two) -> benchmark/out/maml_ssm_quick
#   add --report-only to rebuild the tables/PNGs from finished runs without running anything
# Then `adapt` (standard vs hybrid x pg/dynamics/entropy) on every MAML-SSM checkpoint, and a short
# cartpole-physics run (held-out physics ranges) with its adaptation.
# Runs are niced (nice -n 15, one at a time); re-running continues a killed sweep (--resume).
set -uo pipefail
cd "$(dirname "$0")/.."

mode=full report_only=0
extra=()
for arg in "$@"; do
    case "$arg" in
        --quick) mode=quick ;;
        --budget) mode=budget ;;
        --report-only) report_only=1 ;;
        *) extra+=("$arg") ;;
    esac
done

case "$mode" in
    full)   out=benchmark/out/maml_ssm report=docs/results/maml_ssm steps=150 ssm_seeds=5 other_seeds=5 ;;
    budget) out=benchmark/out/maml_ssm report=docs/results/maml_ssm steps=60 ssm_seeds=2 other_seeds=1 ;;
    quick)  out=benchmark/out/maml_ssm_quick report=benchmark/out/maml_ssm_quick/report steps=2 ssm_seeds=1 other_seeds=1 ;;
esac

# second-order MAML, Adam outer step (TRPO's 11 Fisher-vector products through the inner step cost ~10x more
# per iteration on CPU, see docs/maml_ssm.md), 10 tasks x 10 episodes per meta-batch, horizon 100, alpha 0.1
BASE="nice -n 15 python cleanrl_astral/maml_ssm.py train --task point-nav-2d --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch 10 --fast-batch-size 10 --inner-lr 0.1 --max-episode-steps 100 --eval-tasks 40 \
--eval-steps 3 --outer-steps $steps"
if [ "$mode" = quick ]; then BASE="$BASE --tasks-per-batch 2 --fast-batch-size 2 --eval-tasks 3"; fi

status=0
sweep() {  # name, seeds, grid
    python benchmark/benchmark.py --command "$BASE" --grid "$3" --num-seeds "$2" --start-seed 1 --workers 1 \
        --resume --no-progress --output "$out/$1" "${extra[@]}" || status=$?
}
# adapt every checkpoint of a sweep that has no adapt.json yet
adapt_sweep() {
    for ckpt in "$1"/runs/*/*/maml_ssm.cleanrl_model; do
        [ -f "$ckpt" ] || continue
        [ -f "$(dirname "$ckpt")/adapt.json" ] && continue
        nice -n 15 env OMP_NUM_THREADS=1 python cleanrl_astral/maml_ssm.py adapt --checkpoint "$ckpt" --num-tasks 20 \
            --adapt-steps 3 --adapt-lr 0.1 --adaptation-mode standard hybrid --adapt-objective pg dynamics entropy \
            > "$(dirname "$ckpt")/adapt.log" 2>&1 || status=$?
    done
}
if [ "$report_only" = 0 ]; then
sweep ssm "$ssm_seeds" "--policy ssm"
sweep baselines "$other_seeds" "--policy mlp | --policy ssm --outer-steps 0 | --policy gru | --policy ssm --num-inner-steps 0"

# test-time adaptation (adapt subcommand) on every MAML-SSM checkpoint: standard vs hybrid x pg/dynamics/entropy,
# K = 3 steps at the meta-training inner lr, 20 fresh test tasks; writes adapt.json beside each checkpoint
adapt_sweep "$out/ssm"

# cartpole-physics: a short run (held-out gravity/length ranges at test time), seed 1, plus its adaptation
if [ "$mode" != quick ]; then
    CP="nice -n 15 python cleanrl_astral/maml_ssm.py train --task cartpole-physics --save-model --outer-optimizer adam \
--outer-lr 3e-3 --tasks-per-batch 5 --fast-batch-size 5 --inner-lr 0.1 --max-episode-steps 200 --eval-tasks 20 \
--eval-steps 3 --outer-steps $((steps / 3))"
    python benchmark/benchmark.py --command "$CP" --grid "--policy ssm" --num-seeds 1 --start-seed 1 --workers 1 \
        --resume --no-progress --output "$out/cartpole" "${extra[@]}" || status=$?
    adapt_sweep "$out/cartpole"
fi
fi

mkdir -p "$report"
python - "$out" "$report" <<'EOF' || status=$?
import glob, json, os, sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

out, report = sys.argv[1], sys.argv[2]
PAPER = [-40.41, -11.68, -3.33, -3.23]
arms = {}
for ckpt in sorted(glob.glob(os.path.join(out, "*", "runs", "*", "*", "maml_ssm.cleanrl_model"))):
    c = torch.load(ckpt, map_location="cpu", weights_only=False)
    a = c["args"]
    if a["task"] != "point-nav-2d":
        continue
    if a["outer_steps"] == 0:
        arm = "random init + fine-tune"
    elif a["num_inner_steps"] == 0:
        arm = "pretrained multi-task + fine-tune"
    else:
        arm = f"MAML {a['policy'].upper()}"
    with open(os.path.join(os.path.dirname(ckpt), "eval.json")) as f:
        ev = json.load(f)
    arms.setdefault(arm, []).append({"seed": a["seed"], "ret": [ev["returns_after_steps"][k] for k in "0123"],
                                     "ci": [ev["ci95"][k] for k in "0123"], "wall": c.get("train_wall_time", float("nan")),
                                     "cpu": c.get("train_cpu_time", float("nan")),
                                     "params": c["param_count"], "steps": a["outer_steps"], "tasks": ev["num_tasks"]})
lines = ["| method | params | seeds | outer steps | 0 steps | 1 step | 2 steps | 3 steps | meta-train wall s | meta-train CPU s |",
         "|---|---|---|---|---|---|---|---|---|---|",
         "| MAML paper, Table 4 (MLP, TRPO) | | | | " + " | ".join(f"{v:.2f}" for v in PAPER) + " | | |"]
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(range(4), PAPER, "k--", marker="s", label="MAML paper (Table 4)")
for arm, runs in arms.items():
    R = np.array([r["ret"] for r in runs])
    if len(runs) > 1:  # across seeds: mean ± std of the per-seed means
        cells = [f"{m:.2f} ± {s:.2f}" for m, s in zip(R.mean(0), R.std(0, ddof=1))]
    else:  # one seed: mean ± 95% CI over its test tasks
        cells = [f"{m:.2f} ± {c:.2f}" for m, c in zip(R[0], runs[0]["ci"])]
    walls = [r["wall"] for r in runs]
    lines.append(f"| {arm} | {runs[0]['params']} | {','.join(str(r['seed']) for r in runs)} | {runs[0]['steps']} | "
                 + " | ".join(cells) + f" | {np.mean(walls):.0f} | {np.mean([r['cpu'] for r in runs]):.0f} |")
    ax.errorbar(range(4), R.mean(0), yerr=R.std(0, ddof=1) if len(runs) > 1 else runs[0]["ci"], marker="o", capsize=3, label=arm)
ax.set_xticks(range(4))
ax.set_xlabel("inner policy-gradient steps on the test task")
ax.set_ylabel("return (40 fresh test tasks)")
ax.set_title("point-nav-2d: return after k adaptation steps")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(os.path.join(report, "point_nav_adaptation.png"), dpi=110)
text = "\n".join(lines) + "\n\n± is the std across seeds (several seeds) or the 95% CI over test tasks (one seed).\n"

# meta-training curves (pre- and post-adaptation return of the training meta-batches) from TensorBoard
from tbparse import SummaryReader

fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
for ckpt in sorted(glob.glob(os.path.join(out, "*", "runs", "*", "*", "maml_ssm.cleanrl_model"))):
    a = torch.load(ckpt, map_location="cpu", weights_only=False)["args"]
    if a["task"] != "point-nav-2d" or a["outer_steps"] == 0:
        continue
    df = SummaryReader(os.path.dirname(ckpt)).scalars
    label = f"{a['policy']}{' (no inner step)' if a['num_inner_steps'] == 0 else ''} s{a['seed']}"
    for ax, tag in zip(axes, ["meta/pre_adapt_return", "meta/post_adapt_return"]):
        d = df[df.tag == tag]
        if len(d):
            ax.plot(np.arange(1, len(d) + 1), d["value"].to_numpy(), label=label, lw=1.2)
for ax, t in zip(axes, ["before adaptation (theta)", "after one inner step (theta')"]):
    ax.set_title(f"point-nav-2d training meta-batches: {t}", fontsize=9)
    ax.set_xlabel("outer iteration")
axes[0].set_ylabel("mean return")
axes[1].legend(fontsize=7)
fig.tight_layout()
fig.savefig(os.path.join(report, "point_nav_training.png"), dpi=110)

# test-time adaptation tables: one per adapt.json (returns after 0..K steps, mean ± 95% CI over test tasks)
for path in sorted(glob.glob(os.path.join(out, "*", "runs", "*", "*", "adapt.json"))):
    with open(path) as f:
        res = json.load(f)
    seed = torch.load(os.path.join(os.path.dirname(path), "maml_ssm.cleanrl_model"), map_location="cpu", weights_only=False)["args"]["seed"]
    with open(os.path.join(os.path.dirname(path), "eval.json")) as f:
        ev = json.load(f)
    ks = sorted(next(iter(res["results"].values()))["returns_after_steps"], key=int)
    text += (f"\n### adapt: {res['task']}, seed {seed}, {res['num_tasks']} test tasks, lr {res['adapt_lr']}\n\n"
             f"eval (meta-learned rule, alpha then alpha/2) on {ev['num_tasks']} tasks: "
             + ", ".join(f"{k}: {v:.2f} ± {ev['ci95'][k]:.2f}" for k, v in ev["returns_after_steps"].items()) + "\n\n"
             "| adapter/objective | " + " | ".join(f"{k} steps" for k in ks) + " | guard fired | final drift |\n|---|"
             + "---|" * (len(ks) + 2) + "\n")
    for name, r in res["results"].items():
        text += (f"| {name} | " + " | ".join(f"{r['returns_after_steps'][k]:.2f} ± {r['ci95'][k]:.2f}" for k in ks)
                 + f" | {r['guard_fired_frac']:.2f} | {r['final_drift']:.3f} |\n")
    import shutil
    shutil.copy(os.path.join(os.path.dirname(path), "adapt.png"), os.path.join(report, f"adapt_{res['task']}_seed{seed}.png"))
with open(os.path.join(report, "point_nav_table.md"), "w") as f:
    f.write(text)
with open(os.path.join(report, "point_nav_runs.json"), "w") as f:
    json.dump(arms, f, indent=2)
print(text)
EOF
exit "$status"
