"""Table of reinforce_baby's MVP at --ent-coef 0.01 and 0.03, seeds 1..10 (benchmark/reinforce_baby_entropy.sh): per
seed the greedy evaluation success over the 8 cues (below 1: the policy answers some cue with a wrong symbol), the
success by step 5,000 and the first step above 90%, from benchmark/reinforce_baby_report.py's MVP rows.

Usage: python benchmark/reinforce_baby_entropy.py --out benchmark/out/reinforce_baby_entropy \
    --report docs/results/reinforce_baby/entropy_mvp
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reinforce_baby_report import mvp_rows  # noqa: E402

COEFS = ["0.01", "0.03"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the sweeps' directory (ent<coef>/ per entropy coefficient)")
    p.add_argument("--report", required=True, help="path without extension: writes REPORT.md and REPORT.json")
    args = p.parse_args(argv)
    rows = {c: mvp_rows(os.path.join(args.out, f"ent{c}"))[0] for c in COEFS}
    lines = [
        "# reinforce_baby: the entropy bonus on the locked MVP",
        "",
        "`bash benchmark/reinforce_baby_entropy.sh`: the locked MVP command (pattern-echo, 8 actions, REINFORCE, the rule",
        "parent, 10k steps) with `--ent-coef 0.01` (the plan's) and `0.03` (the script's default), seeds 1–10. Eval: the",
        "greedy success on 200 episodes over the 8 cues; below 1.000 the policy answers some cue with a wrong symbol.",
        "",
        "| ent-coef | seeds with eval success < 1 | eval success per seed (1–10) | success@5k per seed | first step > 90% |",
        "|---|---|---|---|---|",
    ]
    summary = {}
    for c in COEFS:
        r = sorted(rows[c], key=lambda x: x["seed"])
        wrong = [x["seed"] for x in r if x["eval_success"] < 1.0]
        summary[c] = {"seeds": [x["seed"] for x in r], "seeds_below_1": wrong, "rows": r}
        evals = " ".join(format(x["eval_success"], ".3f") for x in r)
        at5k = " ".join(format(x["success@5k"], ".2f") for x in r)
        first90 = " ".join(str(x["first_step_gt_90%"]) for x in r)
        lines.append(
            f"| {c} | {len(wrong)} of {len(r)} ({', '.join(map(str, wrong)) or 'none'}) | {evals} | {at5k} | {first90} |"
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
