"""The RecurrentPPO side-by-side's report (benchmark/recurrentppo_side_by_side.sh; protocol:
docs/results/ppo_gru_baseline/recurrentppo_side_by_side/PREREGISTRATION.md).

Reads every finished run of the sweep (benchmark.py's completion markers): the evaluation's mode-0 return (eval.json,
deterministic and sampled), the run's wall time (manifest), and its training curve, `charts/episodic_return` against
steps and against the seconds since the run's first logged episode. Per agent and budget it reports the mean and 95% CI
over seeds of the evaluation return, the seeds that reach 475, the wall time, and the steps and seconds at which the mean
of the last 100 training returns first reaches 475; then the registered verdict per budget. Writes report.md,
summary.json and curves.png (return against steps and against wall time) into --output.

Usage: python benchmark/recurrentppo_side_by_side_report.py --sweep benchmark/out/recurrentppo_side_by_side \
           --output docs/results/ppo_gru_baseline/recurrentppo_side_by_side
"""

import argparse
import glob
import json
import os
import re
import sys
from collections import deque

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import aggregate, markdown_table  # noqa: E402

SOLVED = 475.0  # a seed solves the task when its deterministic mode-0 evaluation reaches this
MARGIN = 25.0  # an agent wins a budget when its mean evaluation return beats the other's by at least this ...
# ... and it solves at least as many seeds; otherwise the budget is a tie


def agent_of(command):
    """The report's name for a sweep command."""
    if "sb3_peers.py" in command:
        return "RecurrentPPO (zoo)"
    if "--num-envs 32" in command:
        return "baseline, 32 envs"
    return "baseline, defaults"


def curve(run_dir):
    """(steps, seconds since the first episode, return) of every charts/episodic_return point of the run."""
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("charts/episodic_return")
    steps = np.array([e.step for e in events], dtype=float)
    seconds = np.array([e.wall_time for e in events]) - events[0].wall_time
    returns = np.array([e.value for e in events])
    return steps, seconds, returns


def first_solved(steps, seconds, returns, window=100):
    """(steps, seconds) at which the mean of the last `window` training returns first reaches SOLVED, or (None, None)."""
    recent = deque(maxlen=window)
    for step, second, value in zip(steps, seconds, returns):
        recent.append(value)
        if len(recent) == window and np.mean(recent) >= SOLVED:
            return float(step), float(second)
    return None, None


def read_runs(sweep):
    runs = []
    for marker in sorted(glob.glob(os.path.join(sweep, "markers", "*.json"))):
        with open(marker) as f:
            record = json.load(f)
        (run_dir,) = record["run_dirs"]
        with open(os.path.join(run_dir, "eval.json")) as f:
            mode0 = json.load(f)["per_mode"]["0"]
        steps, seconds, returns = curve(run_dir)
        solved_step, solved_second = first_solved(steps, seconds, returns)
        runs.append(
            {
                "agent": agent_of(record["command"]),
                "budget": int(re.search(r"--total-timesteps (\d+)", record["full_command"]).group(1)),
                "seed": record["seed"],
                "deterministic": mode0["deterministic"]["mean"],
                "sampled": mode0["sampled"]["mean"],
                "wall_time_s": record["wall_time_s"],
                "solved_step": solved_step,
                "solved_second": solved_second,
                "curve": (steps, seconds, returns),
            }
        )
    return runs


def mean_ci(values):
    agg = aggregate(values)
    if agg["n"] < 2:
        return f"{agg['mean']:.1f} ({agg['n']} seed)"
    return f"{agg['mean']:.1f} [{agg['ci95_low']:.1f}, {agg['ci95_high']:.1f}]"


def reached(values, unit):
    """'median (k/n reached)' of the first-solved steps or seconds, None counted as not reached."""
    hits = [v for v in values if v is not None]
    if not hits:
        return f"not reached (0/{len(values)})"
    return f"{np.median(hits):,.0f} {unit} ({len(hits)}/{len(values)} reached)"


def pair_verdict(a, a_runs, b, b_runs):
    """The registered verdict of one pair at one budget: an agent wins when its mean deterministic mode-0 return beats the
    other's by at least MARGIN and it solves at least as many seeds; otherwise a tie."""
    a_mean = np.mean([r["deterministic"] for r in a_runs])
    b_mean = np.mean([r["deterministic"] for r in b_runs])
    a_solved = sum(r["deterministic"] >= SOLVED for r in a_runs)
    b_solved = sum(r["deterministic"] >= SOLVED for r in b_runs)
    if a_mean - b_mean >= MARGIN and a_solved >= b_solved:
        return f"{a} wins"
    if b_mean - a_mean >= MARGIN and b_solved >= a_solved:
        return f"{b} wins"
    return "tie"


PAIRS = (
    ("RecurrentPPO (zoo)", "baseline, defaults"),
    ("RecurrentPPO (zoo)", "baseline, 32 envs"),
    ("baseline, 32 envs", "baseline, defaults"),
)


def verdicts(groups):
    """{budget: {"a vs b": verdict}} for every registered pair that has runs at that budget."""
    out = {}
    for budget in sorted({b for _, b in groups}):
        out[budget] = {}
        for a, b in PAIRS:
            if (a, budget) in groups and (b, budget) in groups:
                out[budget][f"{a} vs {b}"] = pair_verdict(a, groups[(a, budget)], b, groups[(b, budget)])
    return out


def plot(groups, path):
    from matplotlib.figure import Figure  # no pyplot: no GUI backend and no global figure state

    budgets = sorted({b for _, b in groups})
    fig = Figure(figsize=(11, 3.6 * len(budgets)))
    colours = {"RecurrentPPO (zoo)": "tab:green", "baseline, defaults": "tab:blue", "baseline, 32 envs": "tab:orange"}
    for row, budget in enumerate(budgets):
        for col, (axis, label) in enumerate(((0, "steps"), (1, "seconds since the first episode"))):
            ax = fig.add_subplot(len(budgets), 2, 2 * row + col + 1)
            for agent, colour in colours.items():
                for n, run in enumerate(groups.get((agent, budget), [])):
                    x = run["curve"][axis]
                    returns = run["curve"][2]
                    smoothed = np.convolve(returns, np.ones(20) / 20, mode="valid")
                    name = None
                    if n == 0:
                        name = agent
                    ax.plot(x[len(x) - len(smoothed) :], smoothed, color=colour, alpha=0.8, label=name)
            ax.set_xlabel(label)
            ax.set_ylabel("training return (mean of 20)")
            ax.set_title(f"{budget:,}-step runs", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", required=True, help="the benchmark.py --output directory")
    p.add_argument("--output", required=True, help="directory for report.md, summary.json and curves.png")
    args = p.parse_args(argv)
    groups = {}
    for run in read_runs(args.sweep):
        groups.setdefault((run["agent"], run["budget"]), []).append(run)
    rows = []
    summary = {}
    for (agent, budget), runs in sorted(groups.items(), key=lambda item: (item[0][1], item[0][0])):
        deterministic = [r["deterministic"] for r in runs]
        rows.append(
            [
                f"{budget:,}",
                agent,
                mean_ci(deterministic),
                mean_ci([r["sampled"] for r in runs]),
                f"{sum(v >= SOLVED for v in deterministic)}/{len(runs)}",
                f"{np.mean([r['wall_time_s'] for r in runs]):.0f} s",
                reached([r["solved_step"] for r in runs], "steps"),
                reached([r["solved_second"] for r in runs], "s"),
            ]
        )
        summary[f"{agent} @ {budget}"] = {key: [r[key] for r in runs] for key in ("deterministic", "sampled", "wall_time_s")}
    header = ["budget", "agent", "mode 0, deterministic [95% Student-t CI]", "sampled", "seeds ≥ 475", "wall time"]
    header += ["steps to a mean-100 of 475", "seconds to it"]
    by_budget = verdicts(groups)
    summary["verdicts"] = {str(budget): pairs for budget, pairs in by_budget.items()}
    lines = []
    for budget, pairs in by_budget.items():
        for pair, result in pairs.items():
            lines.append(f"- {budget:,} steps, {pair}: {result}")
    text = markdown_table(header, rows) + "\n\n" + "\n".join(lines) + "\n"
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "report.md"), "w") as f:
        f.write("# RecurrentPPO side by side: `seed3 --fixed-mode 0 --hide-velocity`\n\n" + text)
    with open(os.path.join(args.output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(groups, os.path.join(args.output, "curves.png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
