"""Report of a pre-registered curriculum comparison of reinforce_baby: one row per run (final levels, the steps at
which each task reached each level, evaluation success, the LLM parent's accuracy and fallbacks), the measures T and W
and the verdict, as the pre-registration defines them. Writes REPORT.md, report.json and levels.png (each run's final
levels per cell, and W's success-against-accuracy pairs) into --report.
--registration names the pre-registration whose stopping rule applies: free-text answers
(docs/results/reinforce_baby/curriculum_comparison/PREREGISTRATION.md: a run with more than 5% fallbacks is left out)
or constrained ones (.../curriculum_comparison_constrained/PREREGISTRATION.md: unparsed answers and server faults
each have a limit of their own).

Usage: python benchmark/reinforce_baby_curriculum_comparison.py \
    --sweep benchmark/out/reinforce_baby_curriculum_comparison/runs --report docs/results/reinforce_baby/curriculum_comparison
"""

import argparse
import json
import os
import sys
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reinforce_baby_report import TASKS, logged_runs  # noqa: E402

CELLS = [("rule", "mastery"), ("rule", "plan"), ("LLM", "mastery"), ("LLM", "plan")]
MAX_FALLBACK_SHARE = 0.05  # free answers: a run whose parent fell back more often is left out of T and W
ACCURACY_BELOW = 0.95  # W looks at the levels where the parent is wrong often enough to matter
W_MARGIN = 0.05
T_MIN_LEVELS = 1.0


class Limits(NamedTuple):
    """The largest share of a run's queries that may fall back for the run to count; None: no limit of that kind."""

    fallbacks: float | None  # every fallback together
    unparsed: float | None  # replies that came back but held no action
    failed: float | None  # requests without a reply (server faults)


REGISTRATIONS = {
    "free": Limits(MAX_FALLBACK_SHARE, None, None),
    "constrained": Limits(None, 0.01, 0.005),
}


def cell_of(key: str) -> tuple[str, str]:
    parent = "rule"
    if "parent_llm" in key:
        parent = "LLM"
    rule = "mastery"
    if "curriculum-rule_plan" in key:
        rule = "plan"
    return parent, rule


def level_steps(series: dict, task: str) -> list:
    """The first step at which the task's level was 1 and 2 (None where it never was)."""
    steps, levels = series[f"curriculum/level_{task}"]
    out = []
    for k in (1, 2):
        reached = steps[levels >= k]
        out.append(int(reached[0]) if len(reached) else None)
    return out


def run_rows(sweep: str, limits: Limits = REGISTRATIONS["free"]) -> list[dict]:
    """One row per finished run of the sweep; `counted` by the registration's limits."""
    rows = []
    for key, series, ev, wall in logged_runs(sweep):
        if ev is None:
            continue
        parent, rule = cell_of(key)
        row = {"key": key, "parent": parent, "rule": rule, "seed": int(key.rsplit("__s", 1)[1]), "wall_s": wall}
        row["levels"] = {t: ev["eval_levels"][t] for t in TASKS}
        row["level_steps"] = {t: level_steps(series, t) for t in TASKS}
        row["success"] = ev["per_difficulty_success"]
        row["eval_success"] = ev["success_rate"]
        row["accuracy"] = None
        shares = {"fallbacks": 0.0, "unparsed": 0.0, "failed": 0.0}
        if "parent" in ev:
            queries = max(1, ev["parent"]["queries"])
            row["accuracy"] = {w: v.get("accuracy") for w, v in ev["parent"]["per_level"].items()}
            shares["fallbacks"] = ev["parent"]["fallbacks"] / queries
            shares["unparsed"] = ev["parent"].get("fallbacks_unparsed", 0) / queries
            shares["failed"] = ev["parent"].get("fallbacks_failed", 0) / queries
        row["fallback_share"] = shares["fallbacks"]
        row["unparsed_share"] = shares["unparsed"]
        row["failed_share"] = shares["failed"]
        row["counted"] = all(limit is None or shares[k] <= limit for k, limit in limits._asdict().items())
        rows.append(row)
    return rows


def played_pairs(rows: list[dict]) -> list[tuple[float, float]]:
    """(baby's success, parent's accuracy) at every (task, level) an LLM-parent run played (level <= its final level)
    where the parent's accuracy is below ACCURACY_BELOW: the pairs criterion W averages."""
    pairs = []
    for r in rows:
        for t in TASKS:
            for k in range(r["levels"][t] + 1):
                w = f"{t}/level{k}"
                a = r["accuracy"].get(w)
                if a is not None and a < ACCURACY_BELOW:
                    pairs.append((r["success"][w], a))
    return pairs


def plot(rows: list[dict], path: str) -> None:
    """levels.png: the final levels summed over the tasks per run in each cell (T's measure), and the baby's success
    against the parent's accuracy at every played (task, level) of the counted LLM runs (W's pairs)."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend and no global figure state

    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_subplot(1, 2, 1)
    for i, cell in enumerate(CELLS):
        runs = [r for r in rows if (r["parent"], r["rule"]) == cell]
        sums = [sum(r["levels"].values()) for r in runs]
        counted = [sum(r["levels"].values()) for r in runs if r["counted"]]
        if counted:
            ax.bar(i, np.mean(counted), color="tab:blue", alpha=0.3)
        offsets = np.linspace(-0.15, 0.15, max(1, len(runs)))
        colours = ["tab:blue" if r["counted"] else "tab:red" for r in runs]
        ax.scatter(i + offsets[: len(runs)], sums, color=colours, zorder=3)
    ax.set_xticks(range(len(CELLS)), [f"{p}\n{r}" for p, r in CELLS])
    ax.set_ylabel("final levels, summed over the 3 tasks")
    ax.set_title("per run (red: left out); bar: mean of the counted", fontsize=9)
    ax = fig.add_subplot(1, 2, 2)
    for rule, marker in (("mastery", "o"), ("plan", "s")):
        pairs = played_pairs([r for r in rows if r["counted"] and r["parent"] == "LLM" and r["rule"] == rule])
        if pairs:
            ax.scatter([a for _, a in pairs], [s for s, _ in pairs], marker=marker, alpha=0.7, label=f"LLM parent, {rule}")
    ax.plot([0, 1], [0, 1], color="k", lw=1, label="success = accuracy")
    ax.plot([0, 1], [W_MARGIN, 1 + W_MARGIN], color="k", lw=1, ls="--", label=f"accuracy + {W_MARGIN} (W's bound)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("parent's accuracy at the (task, level)")
    ax.set_ylabel("baby's rule-judged greedy success")
    ax.set_title(f"played levels where the parent is right < {ACCURACY_BELOW}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def verdict(rows: list[dict]) -> dict:
    """T, W and the verdict from the counted runs, as the pre-registration states them."""
    counted = [r for r in rows if r["counted"]]
    seeds = {cell: [r for r in counted if (r["parent"], r["rule"]) == cell] for cell in CELLS}
    out = {"seeds_per_cell": {f"{p}/{r}": len(v) for (p, r), v in seeds.items()}}
    if min(len(v) for v in seeds.values()) < 2:
        out["verdict"] = "undecided"
        return out
    mean_levels = {cell: float(np.mean([sum(r["levels"].values()) for r in v])) for cell, v in seeds.items()}
    g_llm = mean_levels[("LLM", "plan")] - mean_levels[("LLM", "mastery")]
    g_rule = mean_levels[("rule", "plan")] - mean_levels[("rule", "mastery")]
    out["mean_level_sum"] = {f"{p}/{r}": v for (p, r), v in mean_levels.items()}
    out["G_LLM"] = g_llm
    out["G_rule"] = g_rule
    out["T"] = bool(g_llm - g_rule >= T_MIN_LEVELS)
    pairs = played_pairs(seeds[("LLM", "mastery")] + seeds[("LLM", "plan")])
    s_played = [s for s, _ in pairs]
    a_played = [a for _, a in pairs]
    out["W_levels"] = len(s_played)
    out["W"] = False
    if s_played:
        out["mean_S"] = float(np.mean(s_played))
        out["mean_A"] = float(np.mean(a_played))
        out["W"] = bool(out["mean_S"] <= out["mean_A"] + W_MARGIN)
    names = {(True, True): "both", (True, False): "the threshold", (False, True): "the teaching", (False, False): "neither"}
    out["verdict"] = names[(out["T"], out["W"])]
    return out


def fmt(v, spec=".2f"):
    if v is None:
        return "–"
    return format(v, spec)


def report_md(rows: list[dict], v: dict, limits: Limits = REGISTRATIONS["free"]) -> str:
    lines = [
        "# reinforce_baby curriculum comparison: the threshold or the teaching?",
        "",
        "Criteria, runs and stopping rule: [PREREGISTRATION.md](PREREGISTRATION.md). Written by "
        "`benchmark/reinforce_baby_curriculum_comparison.py`.",
        "",
        f"**Verdict: {v['verdict']}.**",
        "",
    ]
    if "T" in v:
        lines += [
            f"- T: G_LLM {v['G_LLM']:+.2f} levels, G_rule {v['G_rule']:+.2f}: T is {v['T']} (needs G_LLM − G_rule ≥ 1).",
            f"- W: over {v['W_levels']} played (task, level) pairs where the parent's accuracy is below 0.95, mean baby "
            f"success {fmt(v.get('mean_S'))} against mean parent accuracy {fmt(v.get('mean_A'))}: W is {v['W']}.",
            "",
        ]
    lines += [f"Counted runs per cell: {', '.join(f'{k} {n}' for k, n in v['seeds_per_cell'].items())}.", ""]
    fallbacks_header = "fallbacks"
    if limits.fallbacks is None:
        fallbacks_header = "fallbacks (unparsed / server faults)"
    lines += [
        "| parent | curriculum | seed | final levels (PE/SN/C) | steps to level 1 / 2 (PE; SN; C) | eval success | "
        f"{fallbacks_header} | counted | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (CELLS.index((r["parent"], r["rule"])), r["seed"])):
        levels = "/".join(str(r["levels"][t]) for t in TASKS)
        steps = "; ".join(" / ".join(fmt(s, "d") for s in r["level_steps"][t]) for t in TASKS)
        fallbacks = f"{r['fallback_share']:.1%}"
        if limits.fallbacks is None:
            fallbacks += f" ({r['unparsed_share']:.1%} / {r['failed_share']:.1%})"
        lines.append(
            f"| {r['parent']} | {r['rule']} | {r['seed']} | {levels} | {steps} | {r['eval_success']:.3f} | "
            f"{fallbacks} | {'yes' if r['counted'] else 'no'} | {fmt(r['wall_s'], '.0f')} |"
        )
    lines += ["", "Per (task, level): baby's rule-judged success / the LLM parent's accuracy (LLM runs).", ""]
    levels = [f"{t}/level{k}" for t in TASKS for k in range(3)]
    lines += ["| run | " + " | ".join(levels) + " |", "|---|" + "---|" * len(levels)]
    for r in rows:
        if r["accuracy"] is None:
            continue
        cells = [f"{fmt(r['success'][w])} / {fmt(r['accuracy'].get(w))}" for w in levels]
        lines.append(f"| {r['rule']} s{r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", required=True, help="benchmark.py's output directory of the comparison's runs")
    p.add_argument("--report", required=True, help="where REPORT.md and report.json go")
    p.add_argument("--registration", choices=sorted(REGISTRATIONS), default="free", help="whose stopping rule applies")
    args = p.parse_args(argv)
    limits = REGISTRATIONS[args.registration]
    rows = run_rows(args.sweep, limits)
    if not rows:
        sys.exit(f"reinforce_baby_curriculum_comparison: no finished run under {args.sweep!r}")
    v = verdict(rows)
    os.makedirs(args.report, exist_ok=True)
    with open(os.path.join(args.report, "REPORT.md"), "w") as f:
        f.write(report_md(rows, v, limits))
    with open(os.path.join(args.report, "report.json"), "w") as f:
        json.dump({"runs": rows, "verdict": v}, f, indent=2)
    plot(rows, os.path.join(args.report, "levels.png"))
    print(f"verdict: {v['verdict']} ({args.report}/REPORT.md)")


if __name__ == "__main__":
    main()
