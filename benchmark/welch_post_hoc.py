"""Post hoc comparisons of runs that no registration scores: one metric of a report.py runs.csv, each grid point against
the first, as the difference of means over seeds with its 95% Welch t-interval and Welch's t-test p-value
(cleanrl_astral_utils.stats). The output is a reading after the data, labelled so; it is no registered verdict.

Usage: python benchmark/welch_post_hoc.py --column eval_success_rate \
    --csv "MVP=docs/results/reinforce_baby/features/task_source_mvp/runs.csv" \
    --csv "curriculum=docs/results/reinforce_baby/features/task_source_curriculum/runs.csv" \
    --output docs/results/reinforce_baby/features/post_hoc.md
"""

import argparse
import csv
import os
import sys
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import welch_diff_ci95, welch_t_test_p  # noqa: E402


class Comparison(NamedTuple):
    name: str
    reference: str
    other: str
    reference_values: list
    other_values: list
    difference: float
    ci95: float
    p: float


def grid_values(path, column):
    """{grid point: [the column's value per seed]}, grid points in the order of the file's rows."""
    groups = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get(column, "") == "":
                continue
            groups.setdefault(row["grid"].strip(), []).append(float(row[column]))
    return groups


def compare(name, path, column):
    """Each grid point of the file against its first one."""
    groups = grid_values(path, column)
    if len(groups) < 2:
        raise ValueError(f"{path}: fewer than two grid points with a {column} value")
    reference, *others = groups
    out = []
    for other in others:
        a = groups[other]
        b = groups[reference]
        diff, half = welch_diff_ci95(a, b)
        out.append(Comparison(name, reference, other, b, a, diff, half, welch_t_test_p(a, b)))
    return out


def report(comparisons, column):
    lines = [
        f"Post hoc, not registered: `{column}` per seed from each committed runs.csv; each grid point minus the first, "
        "the difference of the means over seeds with its 95% Welch t-interval (Welch–Satterthwaite degrees of freedom) "
        "and the two-sided p-value of Welch's t-test. No rule fixed before the runs reads these numbers.",
        "",
        "| runs | first grid point: values (mean) | other grid point: values (mean) | other − first, 95% Welch CI | Welch p |",
        "|---|---|---|---|---|",
    ]
    for c in comparisons:
        ref = ", ".join(f"{v:.3f}" for v in c.reference_values)
        other = ", ".join(f"{v:.3f}" for v in c.other_values)
        lines.append(
            f"| {c.name} | `{c.reference}`: {ref} ({np.mean(c.reference_values):.3f}) | "
            f"`{c.other}`: {other} ({np.mean(c.other_values):.3f}) | {c.difference:+.3f} ± {c.ci95:.3f} | {c.p:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", action="append", required=True, help="NAME=PATH of a report.py runs.csv")
    p.add_argument("--column", required=True, help="the metric compared, a column of runs.csv")
    p.add_argument("--output", help="write the markdown here (default: print it)")
    args = p.parse_args(argv)
    comparisons = []
    for item in args.csv:
        name, sep, path = item.partition("=")
        if not sep or not os.path.isfile(path):
            sys.exit(f"welch_post_hoc.py: error: --csv {item!r} must be NAME=PATH of a runs.csv")
        try:
            comparisons += compare(name, path, args.column)
        except ValueError as e:
            sys.exit(f"welch_post_hoc.py: error: {e}")
    text = report(comparisons, args.column)
    if args.output is None:
        print(text, end="")
        return 0
    with open(args.output, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
