"""How TRPO's outer steps went in maml_ssm runs (docs/maml_ssm.md, "TRPO's step scaling"): for each run directory
(`<sweep>/runs/<key>/<run_name>/`, holding maml_ssm.cleanrl_model, eval.json and the TensorBoard events) it prints
the TRPO iterations done in the CPU budget, CPU-s per iteration, the mean number of line-search trials, the share of
iterations whose step was accepted, the mean KL of the accepted steps, and eval.json's returns after 0..K steps.

Usage: python benchmark/probes/maml_trpo_step_stats.py RUN_DIR [RUN_DIR ...]
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from report import read_scalars  # noqa: E402  (benchmark/report.py: TensorBoard's own reader)


def stats(run_dir):
    ckpt = torch.load(os.path.join(run_dir, "maml_ssm.cleanrl_model"), map_location="cpu", weights_only=False)
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)
    s = read_scalars(run_dir)
    trials = s["meta/line_search_steps"][1]
    accepted = s["meta/step_accepted"][1] > 0.5
    kl = s["losses/approx_kl"][1][accepted]
    iters = ckpt["outer_steps_done"]
    return {"policy": ckpt["args"]["policy"], "seed": ckpt["args"]["seed"], "iterations": iters,
            "cpu_s_per_iteration": ckpt["train_cpu_time"] / iters, "mean_trials": float(trials.mean()),
            "accepted": float(accepted.mean()), "mean_accepted_kl": float(kl.mean()) if len(kl) else float("nan"),
            "returns": [ev["returns_after_steps"][k] for k in sorted(ev["returns_after_steps"], key=int)]}


def main(argv):
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    print("| policy | seed | iterations | CPU-s / iteration | line-search trials | accepted | KL of accepted steps "
          "| returns after 0 / 1 / 2 / 3 steps |")
    print("|---|---|---|---|---|---|---|---|")
    for run_dir in argv:
        if not os.path.isfile(os.path.join(run_dir, "eval.json")):
            print(f"(skipped {run_dir}: no eval.json yet)", file=sys.stderr)
            continue
        r = stats(run_dir)
        print(f"| {r['policy']} | {r['seed']} | {r['iterations']} | {r['cpu_s_per_iteration']:.2f} | "
              f"{r['mean_trials']:.2f} | {r['accepted']:.2f} | {r['mean_accepted_kl']:.4f} | "
              + " / ".join(f"{x:.2f}" for x in r["returns"]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
