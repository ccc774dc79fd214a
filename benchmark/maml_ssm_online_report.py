"""Report of the pre-registered online-adaptation study (docs/results/maml_ssm/online_adapt/PREREGISTRATION.md).

Usage: python benchmark/maml_ssm_online_report.py --out benchmark/out/maml_ssm_online --report DIR
Per task: the returns after 0..K adaptation steps of between-batch adaptation (adapt.json), of the plan's online
adaptation (adapt_online.json: K steps between batches, then online updates during the rollout after them) and of
online-only adaptation (adapt_online_during_only.json), mean over seeds with 95% Student-t CIs; the paired differences
after K steps with their verdicts; online_table.md and online.json in DIR.
"""

import argparse
import glob
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import t_ci95_half_width  # noqa: E402

TASKS = {"online_point_nav": "point-nav-2d", "online_cartpole": "cartpole-physics"}
ARMS = {"between": "adapt.json", "online": "adapt_online.json", "during_only": "adapt_online_during_only.json"}
LABELS = {"between": "between batches", "online": "online (plan)", "during_only": "online only (during-only)"}
KEY = "standard/pg"


def verdict(mean, half):
    """The pre-registered reading of a paired 95% CI of (arm - between-batch)."""
    if np.isnan(half):
        return "undetermined (fewer than two seeds)"
    if mean - half > 0:
        return "higher"
    if mean + half < 0:
        return "lower"
    return "no difference detected"


def seed_runs(out, sweep):
    """[{seed, K, no_adaptation, between, online, during_only}] of the checkpoints that have all three reports."""
    runs = []
    for ckpt in sorted(glob.glob(os.path.join(out, sweep, "runs", "*", "*", "maml_ssm.cleanrl_model"))):
        reports = {}
        for arm, name in ARMS.items():
            path = os.path.join(os.path.dirname(ckpt), name)
            if os.path.isfile(path):
                with open(path) as f:
                    reports[arm] = json.load(f)
        if len(reports) < len(ARMS):
            continue
        steps = reports["between"]["adapt_steps"]
        run = {
            "seed": torch.load(ckpt, map_location="cpu", weights_only=False)["args"]["seed"],
            "adapt_steps": steps,
            "no_adaptation": reports["between"]["no_adaptation"]["return"],
        }
        for arm, res in reports.items():
            run[arm] = [res["results"][KEY]["returns_after_steps"][str(k)] for k in range(steps + 1)]
        runs.append(run)
    return sorted(runs, key=lambda r: r["seed"])


def task_section(task, runs):
    K = runs[0]["adapt_steps"]
    summary = {"runs": runs}
    lines = [
        f"### {task}: SSM, {len(runs)} seeds ({', '.join(str(r['seed']) for r in runs)}), K = {K}",
        "",
        "| adaptation | " + " | ".join(str(k) for k in range(K + 1)) + " |",
        "|---" * (K + 2) + "|",
    ]
    none = np.array([r["no_adaptation"] for r in runs])
    lines.append(f"| no adaptation (θ₀) | {none.mean():.2f} ± {t_ci95_half_width(none):.2f} |" + " |" * K)
    for arm, label in LABELS.items():
        R = np.array([r[arm] for r in runs])
        lines.append(
            f"| {label} | "
            + " | ".join(f"{R[:, k].mean():.2f} ± {t_ci95_half_width(R[:, k]):.2f}" for k in range(K + 1))
            + " |"
        )
    lines.append("")
    between = np.array([r["between"][K] for r in runs])
    for arm in ("online", "during_only"):
        diff = np.array([r[arm][K] for r in runs]) - between
        half = t_ci95_half_width(diff)
        summary[f"{arm}_minus_between"] = {"mean": float(diff.mean()), "ci95": half, "verdict": verdict(diff.mean(), half)}
        lines.append(
            f"{LABELS[arm]} − between batches after {K} steps (paired over seeds): {diff.mean():.2f} ± {half:.2f}: "
            f"**{verdict(diff.mean(), half)}**."
        )
    lines.append("")
    return summary, lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the study's output directory (benchmark/out/maml_ssm_online)")
    p.add_argument("--report", required=True, help="where online_table.md and online.json go")
    args = p.parse_args(argv)
    summary = {}
    lines = []
    for sweep, task in TASKS.items():
        runs = seed_runs(args.out, sweep)
        if runs:
            summary[task], section = task_section(task, runs)
            lines += section
    if not summary:
        print(f"maml_ssm_online_report: no checkpoint with all three adapt reports under {args.out}", file=sys.stderr)
        return 2
    lines.append("± is the 95% Student-t CI over seeds of the per-seed mean over the test tasks.")
    os.makedirs(args.report, exist_ok=True)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.report, "online_table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.report, "online.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
