"""The registered verdicts of reinforce_baby's PPO departures (docs/results/reinforce_baby/ppo_departures/PREREGISTRATION.md)
from the runs.csv that benchmark/report.py wrote: per setting, the greedy evaluation success of each seed, its mean and
95% Student-t CI over seeds (cleanrl_astral_utils.stats); per departure, the registered reading against the defaults.

Usage: python benchmark/reinforce_baby_ppo_departures_report.py docs/results/reinforce_baby/ppo_departures/runs.csv
"""

import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import t_ci95_half_width  # noqa: E402

COLUMN = "eval_success_rate"
DEFAULTS = "–"  # report.py's grid label of the run without grid flags
MARGIN = 0.05  # a setting is supported where its mean exceeds the other's by this much and the two CIs are disjoint


def settings(path):
    """{grid point: [success per seed]}, in the order of runs.csv."""
    groups = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            groups.setdefault(row["grid"].strip(), []).append(float(row[COLUMN]))
    return groups


def interval(values):
    mean = float(np.mean(values))
    half = t_ci95_half_width(values)
    return mean, mean - half, mean + half


def verdict(script, plan):
    """The registered reading of one departure: the script's setting (the defaults) against the plan's."""
    s_mean, s_low, s_high = interval(script)
    p_mean, p_low, p_high = interval(plan)
    if s_mean - p_mean >= MARGIN and s_low > p_high:
        return "the script's setting is supported"
    if p_mean - s_mean >= MARGIN and p_low > s_high:
        return "the plan's setting is better"
    return "no difference measured"


def report(groups):
    lines = [
        f"| setting | {COLUMN} per seed | mean [95% Student-t CI] | registered verdict for the departure |",
        "|---|---|---|---|",
    ]
    for name, values in groups.items():
        mean, low, high = interval(values)
        reading = "–"
        if name != DEFAULTS:
            reading = verdict(groups[DEFAULTS], values)
        label = "the script's defaults" if name == DEFAULTS else f"`{name}`"
        per_seed = ", ".join(f"{v:.3f}" for v in values)
        lines.append(f"| {label} | {per_seed} | {mean:.3f} [{low:.3f}, {high:.3f}] | {reading} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isfile(argv[0]):
        print("usage: reinforce_baby_ppo_departures_report.py RUNS_CSV", file=sys.stderr)
        return 2
    groups = settings(argv[0])
    if DEFAULTS not in groups:
        print(f"reinforce_baby_ppo_departures_report.py: error: no run with the defaults in {argv[0]}", file=sys.stderr)
        return 2
    print(report(groups), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
