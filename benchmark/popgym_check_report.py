"""The POPGym check's report (benchmark/popgym_check.sh; protocol: docs/results/ppo_gru_baseline/popgym/PREREGISTRATION.md).

Reads every finished run of the sweeps (benchmark.py's completion markers), each run's last `charts/mmer` (its MMER) and
wall time, and the paper's values (--paper, a CSV: env_id, paper_gru_mmer, paper_best_mmer, paper_best_model, source);
writes into --output: report.md (one row per environment: the paper's GRU and best model, the GRU baseline with a 95%
CI over seeds and its evaluation from eval.json, the memoryless control, ASTRAL, steps and wall time, the registered
criterion's verdict, and the two registered side questions: does the task need memory, and what does ASTRAL's bank
cost), runs.csv (one row per run), summary.json and mmer_curves.png (charts/mmer against steps, every run).

Usage: python benchmark/popgym_check_report.py --sweeps benchmark/out/popgym_check/gru benchmark/out/popgym_check/memory_none \
           benchmark/out/popgym_check/astral --paper docs/results/ppo_gru_baseline/popgym/paper_mmer.csv \
           --output docs/results/ppo_gru_baseline/popgym
"""

import argparse
import csv
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import aggregate, markdown_table, read_scalars  # noqa: E402

AGENTS = {  # exp_name -> the report's name for the agent
    "ppo_gru_baseline": "GRU",
    "ppo_gru_baseline_memory_none": "memoryless",
    "ppo_gru_astral": "ASTRAL",
}
SOLVED = 0.95  # criterion 1: an MMER of at least this counts as solved where the paper's GRU reached 1.0
SOLVED_SEEDS = 2  # ... in at least this many seeds
MARGIN = 0.05  # criterion 2: elsewhere, the mean over seeds at least the paper's GRU MMER minus this
MEMORY_MARGIN = 0.1  # side question: the task needs memory where the memoryless MMER is this far below the GRU's
BANK_MMER = 0.05  # side question: the bank costs MMER where ASTRAL's mean is this far below the GRU's mean
BANK_WALL = 1.25  # ... or wall time where an ASTRAL run takes more than this many times a GRU run


def read_runs(sweeps):
    """One dict per finished run (a completion marker): env_id, agent, seed, steps, mmer, wall_time_s, the MMER curve."""
    runs = []
    for sweep in sweeps:
        for marker in sorted(glob.glob(os.path.join(sweep, "markers", "*.json"))):
            with open(marker) as f:
                record = json.load(f)
            (run_dir,) = record["run_dirs"]
            env_id, exp_name = os.path.basename(run_dir).split("__")[:2]
            curve = read_scalars(run_dir)["charts/mmer"]
            evaluation = {"deterministic": None, "sampled": None}
            eval_path = os.path.join(run_dir, "eval.json")
            if os.path.exists(eval_path):
                with open(eval_path) as f:
                    record_eval = json.load(f)
                evaluation = {policy: record_eval[policy]["mean"] for policy in evaluation}
            runs.append(
                {
                    "env_id": env_id,
                    "agent": AGENTS[exp_name],
                    "seed": record["seed"],
                    "steps": int(curve[0][-1]),
                    "mmer": float(curve[1][-1]),
                    "wall_time_s": record["wall_time_s"],
                    "curve": curve,
                    "eval_deterministic": evaluation["deterministic"],
                    "eval_sampled": evaluation["sampled"],
                }
            )
    return runs


def read_paper(path):
    """env_id -> the paper's row; a missing value is None."""
    paper = {}
    with open(path) as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            for key in ("paper_gru_mmer", "paper_best_mmer"):
                value = None
                if row[key].strip():
                    value = float(row[key])
                row[key] = value
            paper[row["env_id"]] = row
    return paper


def verdict(mmers, paper_gru):
    """The registered criterion for one environment's GRU seeds: (criterion, pass/fail text)."""
    if paper_gru is None:
        return "no paper value", "no verdict"
    if paper_gru >= 0.995:  # the paper's table prints 1.00
        solved = sum(m >= SOLVED for m in mmers)
        result = "fail"
        if solved >= SOLVED_SEEDS:
            result = "pass"
        return f"MMER ≥ {SOLVED} in ≥ {SOLVED_SEEDS}/3 seeds", f"{result} ({solved}/{len(mmers)})"
    mean = float(np.mean(mmers))
    result = "fail"
    if mean >= paper_gru - MARGIN:
        result = "pass"
    return f"mean ≥ {paper_gru - MARGIN:.2f}", f"{result} (mean {mean:.3f}, {mean - paper_gru:+.3f} from the paper)"


def needs_memory(memoryless, gru_same_step):
    """The registered side question: is the memoryless MMER below the GRU's mean MMER at the same step by more than 0.1?"""
    gap = round(gru_same_step - memoryless, 9)  # no float noise at the registered limit
    answer = "no"
    if gap > MEMORY_MARGIN:
        answer = "yes"
    return f"{answer} (GRU {gap:+.3f})"


def bank_cost(astral, gru):
    """The registered side question on ASTRAL's runs against the GRU's: its cost in MMER and in wall time, or "none"."""
    mmer_gap = round(float(np.mean([r["mmer"] for r in astral]) - np.mean([r["mmer"] for r in gru])), 9)
    wall_ratio = round(float(np.mean([r["wall_time_s"] for r in astral]) / np.mean([r["wall_time_s"] for r in gru])), 9)
    costs = []
    if mmer_gap < -BANK_MMER:
        costs.append(f"MMER {mmer_gap:+.3f}")
    if wall_ratio > BANK_WALL:
        costs.append(f"wall time {wall_ratio:.2f}×")
    if not costs:
        return f"none (MMER {mmer_gap:+.3f}, wall time {wall_ratio:.2f}×)"
    return ", ".join(costs)


def cell(values):
    agg = aggregate(values)
    if agg["n"] == 0:
        return "–"
    if agg["n"] == 1:
        return f"{agg['mean']:.3f} (1 seed)"
    return f"{agg['mean']:.3f} [{agg['ci95_low']:.3f}, {agg['ci95_high']:.3f}] ({agg['n']} seeds)"


def mmer_at(run, step):
    """The run's MMER at its last sample at or below `step`."""
    steps, values = run["curve"]
    return float(values[steps <= step][-1])


def eval_cell(runs):
    """The mean over seeds of the evaluation's mean return, deterministic / sampled (it decides nothing)."""
    values = [(r["eval_deterministic"], r["eval_sampled"]) for r in runs if r["eval_deterministic"] is not None]
    if not values:
        return "–"
    deterministic, sampled = np.mean(values, axis=0)
    return f"{deterministic:.3f} / {sampled:.3f}"


def wall_cell(runs):
    if not runs:
        return "–"
    return f"{np.mean([r['wall_time_s'] for r in runs]):.0f} s"


def paper_cell(value):
    if value is None:
        return "–"
    return f"{value:.2f}"


def build(runs, paper):
    """The report's rows, one per environment in the paper file's order, and the summary behind them."""
    rows = []
    summary = {}
    for env_id, entry in paper.items():
        by_agent = {name: [r for r in runs if r["env_id"] == env_id and r["agent"] == name] for name in AGENTS.values()}
        gru = by_agent["GRU"]
        criterion = "–"
        result = "not run"
        if gru:
            criterion, result = verdict([r["mmer"] for r in gru], entry["paper_gru_mmer"])
        steps = sorted({r["steps"] for r in gru})
        memoryless = cell([r["mmer"] for r in by_agent["memoryless"]])
        memory = "–"
        if by_agent["memoryless"] and gru:
            same_step = float(np.mean([mmer_at(r, by_agent["memoryless"][0]["steps"]) for r in gru]))
            memoryless += f"; GRU at its steps {same_step:.3f}"
            memory = needs_memory(float(np.mean([r["mmer"] for r in by_agent["memoryless"]])), same_step)
        cost = "–"
        if by_agent["ASTRAL"] and gru:
            cost = bank_cost(by_agent["ASTRAL"], gru)
        best = f"{paper_cell(entry['paper_best_mmer'])} ({entry['paper_best_model'] or '–'})"
        rows.append(
            [
                env_id,
                paper_cell(entry["paper_gru_mmer"]),
                best,
                cell([r["mmer"] for r in gru]),
                eval_cell(gru),
                memoryless,
                cell([r["mmer"] for r in by_agent["ASTRAL"]]),
                ", ".join(f"{s:,}" for s in steps) or "–",
                wall_cell(gru),
                wall_cell(by_agent["ASTRAL"]),
                criterion,
                result,
                memory,
                cost,
            ]
        )
        summary[env_id] = {name: [r["mmer"] for r in agent_runs] for name, agent_runs in by_agent.items()}
        summary[env_id]["verdict"] = result
        summary[env_id]["needs_memory"] = memory
        summary[env_id]["astral_cost"] = cost
    return rows, summary


def plot(runs, paper, path):
    from matplotlib.figure import Figure  # no pyplot: no GUI backend and no global figure state

    envs = list(paper)
    fig = Figure(figsize=(4 * len(envs), 3.4))
    colours = {"GRU": "tab:blue", "memoryless": "tab:grey", "ASTRAL": "tab:orange"}
    for i, env_id in enumerate(envs):
        ax = fig.add_subplot(1, len(envs), i + 1)
        for name, colour in colours.items():
            for n, run in enumerate(r for r in runs if r["env_id"] == env_id and r["agent"] == name):
                label = None
                if n == 0:
                    label = name
                ax.step(run["curve"][0], run["curve"][1], where="post", color=colour, alpha=0.8, label=label)
        if paper[env_id]["paper_gru_mmer"] is not None:
            ax.axhline(paper[env_id]["paper_gru_mmer"], color="k", ls="--", lw=1, label="paper GRU (15M steps)")
        ax.set_title(env_id.replace("popgym-", "").replace("-v0", ""), fontsize=9)
        ax.set_xlabel("steps")
        ax.set_ylim(-1.05, 1.05)
        if i == 0:
            ax.set_ylabel("MMER (sampled every 65,536 steps)")
    legend = {}  # one entry per agent over every panel: an agent may run on some environments only
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.axes[0].legend(list(legend.values()), list(legend), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweeps", nargs="+", required=True, help="benchmark.py --output directories")
    p.add_argument("--paper", required=True, help="CSV of the paper's values (env_id, paper_gru_mmer, ...)")
    p.add_argument("--output", required=True, help="directory for report.md, runs.csv, summary.json, mmer_curves.png")
    args = p.parse_args(argv)
    runs = read_runs(args.sweeps)
    paper = read_paper(args.paper)
    rows, summary = build(runs, paper)
    os.makedirs(args.output, exist_ok=True)
    header = ["environment", "paper GRU", "paper best (model)", "GRU baseline MMER [95% Student-t CI]"]
    header += ["GRU eval, deterministic / sampled", "memoryless", "ASTRAL"]
    header += ["steps", "wall time per GRU run", "per ASTRAL run", "criterion", "verdict", "needs memory", "ASTRAL's cost"]
    table = markdown_table(header, rows)
    legend = (
        "A row without the paper's values has no verdict (PREREGISTRATION.md, \"The paper's numbers\"). Needs memory:"
        f" the memoryless MMER is more than {MEMORY_MARGIN} below the GRU's mean MMER at the same step (the gap in"
        f" brackets). ASTRAL's cost: its mean MMER more than {BANK_MMER} below the GRU's, or its wall time per run more"
        f" than {BANK_WALL}× the GRU's. The evaluation (10 episodes after training, mean over seeds) decides nothing."
    )
    with open(os.path.join(args.output, "report.md"), "w") as f:
        f.write("# POPGym check: MMER against the POPGym paper's GRU\n\n" + table + "\n\n" + legend + "\n")
    with open(os.path.join(args.output, "runs.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        columns = ["env_id", "agent", "seed", "steps", "mmer", "wall_time_s", "eval_deterministic", "eval_sampled"]
        writer.writerow(columns)
        for r in sorted(runs, key=lambda r: (r["env_id"], r["agent"], r["seed"])):
            writer.writerow([r[column] for column in columns])
    with open(os.path.join(args.output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(runs, paper, os.path.join(args.output, "mmer_curves.png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
