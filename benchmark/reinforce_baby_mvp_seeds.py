"""Per-seed table of reinforce_baby MVP sweeps side by side (one benchmark.py output directory per setting): the greedy
evaluation success over the 8 cues (below 1: the policy answers some cue with a wrong symbol), the success by step
5,000, the first step above 90% and the plan's four MVP criteria, from benchmark/reinforce_baby_report.py's MVP rows.

Usage: python benchmark/reinforce_baby_mvp_seeds.py --title "the entropy bonus" \
    --sweep "--ent-coef 0.01=benchmark/out/reinforce_baby_entropy/ent0.01" \
    --sweep "--ent-coef 0.03=benchmark/out/reinforce_baby_entropy/ent0.03" --report docs/results/reinforce_baby/entropy_mvp
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reinforce_baby_report import mvp_rows  # noqa: E402

CRITERIA = ["c1_gt_12.5%", "c2_gt_50%@5k", "c3_entropy_down", "c4_wm_mse_down"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--title", required=True, help="what the settings differ in (the page's title)")
    p.add_argument("--command", required=True, help="the command the sweeps share (quoted on the page)")
    p.add_argument("--sweep", action="append", required=True, help="LABEL=DIR: a setting's benchmark.py output directory")
    p.add_argument("--report", required=True, help="path without extension: writes REPORT.md and REPORT.json")
    args = p.parse_args(argv)
    lines = [
        f"# reinforce_baby MVP: {args.title}",
        "",
        f"`{args.command}` plus each row's flags, written by `benchmark/reinforce_baby_mvp_seeds.py`. Eval: the greedy",
        "success on 200 episodes over the 8 cues; below 1.000 the policy answers some cue with a wrong symbol. The four",
        "MVP criteria: > 12.5%, > 50% by step 5,000, entropy and world-model MSE falling (first against last 10%).",
        "",
        "| setting | seeds | eval success < 1 (seeds) | all four MVP criteria (seeds) | > 90% by step 5,000 (seeds) | "
        "eval success per seed | success@5k per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for spec in args.sweep:
        label, sweep = spec.split("=", 1)
        rows = sorted(mvp_rows(sweep)[0], key=lambda x: x["seed"])
        seeds = [x["seed"] for x in rows]
        below = [x["seed"] for x in rows if x["eval_success"] < 1.0]
        all4 = [x["seed"] for x in rows if all(x[c] for c in CRITERIA)]
        target = [x["seed"] for x in rows if x["target_gt_90%@5k"]]
        summary[label] = {"seeds": seeds, "eval_below_1": below, "all_four_criteria": all4, "gt_90%@5k": target, "rows": rows}
        evals = " ".join(format(x["eval_success"], ".3f") for x in rows)
        at5k = " ".join(format(x["success@5k"], ".2f") for x in rows)
        lines.append(
            f"| `{label}` | {seeds[0]}–{seeds[-1]} | {len(below)} of {len(rows)} ({', '.join(map(str, below)) or 'none'}) | "
            f"{len(all4)} of {len(rows)} | {len(target)} of {len(rows)} | {evals} | {at5k} |"
        )
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(f"{args.report}.md", "w") as f:
        f.write(text)
    with open(f"{args.report}.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(text)


if __name__ == "__main__":
    main()
