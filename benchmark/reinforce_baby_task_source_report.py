"""Report of reinforce_baby's task-source runs (`benchmark/reinforce_baby_features.sh --only task-source`): the babies
taught on tasks the rule draws (`--task-source rule`) beside tasks the LLM parent draws (`--task-source parent`), and
the parent's pools. Reads every finished run (eval.json) of each sweep and writes --output (markdown) and the same
numbers as JSON beside it: per sweep and task source, the seeds, the final greedy success (mean ± population sd), the
final levels summed over the tasks, the parent's answer accuracy and fallbacks, and the wall time; per sweep, task and
level, each pool's valid share, distinct valid instances and the entropy of the rule's answers over them, per seed;
and a PNG beside it of the training success against steps with each source's evaluation.

Usage: python benchmark/reinforce_baby_task_source_report.py \
    --sweep MVP=benchmark/out/reinforce_baby_features/task-source/mvp \
    --sweep curriculum=benchmark/out/reinforce_baby_features/task-source/curriculum \
    --output docs/results/reinforce_baby/features/task_source.md
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reinforce_baby_report import TASKS, logged_runs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import population_sd  # noqa: E402

SOURCES = ("rule", "parent")


def source_of(key: str) -> str:
    """The task source in a benchmark.py run key (c0__g1_task-source_parent__s2 -> parent)."""
    for source in SOURCES:
        if f"task-source_{source}__" in key:
            return source
    raise ValueError(f"no --task-source in the run key {key!r}")


def runs_of(sweep: str) -> list[dict]:
    """One dict per finished run of the sweep."""
    runs = []
    for key, series, ev, wall in logged_runs(sweep):
        if ev is None:
            continue
        parent = ev.get("parent", {})
        runs.append(
            {
                "key": key,
                "source": source_of(key),
                "seed": int(key.rsplit("__s", 1)[1]),
                "success": ev["success_rate"],
                "level_sum": sum(ev.get("eval_levels", {}).get(t, 0) for t in TASKS),
                "accuracy": parent.get("accuracy"),
                "fallbacks": parent.get("fallbacks", 0) / max(1, parent.get("queries", 0)),
                "pools": parent.get("task_generation", {}),
                "wall_s": wall,
                "curve": [series["charts/success_rate"][0].tolist(), series["charts/success_rate"][1].tolist()],
            }
        )
    return sorted(runs, key=lambda r: (SOURCES.index(r["source"]), r["seed"]))


def mean_sd(values) -> str:
    if not values:
        return "–"
    return f"{np.mean(values):.3f} ± {population_sd(values):.3f}"


def listed(values, spec) -> str:
    return ", ".join(format(v, spec) for v in values)


def report(sweeps: dict[str, list[dict]]) -> str:
    lines = [
        "# reinforce_baby: tasks drawn by the rule against tasks drawn by the SmolLM2 parent",
        "",
        "Written by `benchmark/reinforce_baby_task_source_report.py` from `bash benchmark/reinforce_baby_features.sh --only "
        "task-source`, runs with no registered measure or verdict (post hoc Welch tests: [post_hoc.md](post_hoc.md)). "
        "Success: the rule-judged greedy evaluation at the run's final levels (mean ± population sd, ddof 0, over seeds); "
        "levels: the final levels summed over the tasks a run plays (the MVP plays pattern-echo at level 2); "
        "accuracy: the parent's answers against the rule over the training queries. Evaluation always uses the rule's "
        "instances.",
        "",
        "| sweep | task source | seeds | success | levels | parent's accuracy | fallbacks | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in sweeps.items():
        for source in SOURCES:
            mine = [r for r in runs if r["source"] == source]
            if not mine:
                continue
            accuracy = [r["accuracy"] for r in mine if r["accuracy"] is not None]
            lines.append(
                f"| {name} | {source} | {listed([r['seed'] for r in mine], 'd')} | {mean_sd([r['success'] for r in mine])} | "
                f"{listed([r['level_sum'] for r in mine], 'd')} | {mean_sd(accuracy)} | "
                f"{max(r['fallbacks'] for r in mine):.1%} at most | {np.mean([r['wall_s'] for r in mine]):.0f} |"
            )
    lines += [
        "",
        "The parent's pools (`--task-source parent`; one pool per task and level a run visited, 32 requests): the valid "
        "share, the distinct valid instances and the entropy in bits of the rule's answers over the valid ones, per seed.",
        "",
        "| sweep | task / level | runs | valid | distinct | entropy (bits) |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in sweeps.items():
        mine = [r for r in runs if r["source"] == "parent"]
        levels = sorted({w for r in mine for w in r["pools"]}, key=lambda w: (TASKS.index(w.split("/")[0]), w))
        for w in levels:
            pools = [r["pools"][w] for r in mine if w in r["pools"]]
            lines.append(
                f"| {name} | {w} | {len(pools)} | {listed([p['valid_share'] for p in pools], '.2f')} | "
                f"{listed([p['distinct'] for p in pools], 'd')} | {listed([p['target_entropy_bits'] for p in pools], '.2f')} |"
            )
    return "\n".join(lines) + "\n"


def plot(sweeps: dict[str, list[dict]], path: str) -> None:
    """One panel per sweep: each run's training success rate (on the tasks it was taught) against steps, and each
    source's mean greedy evaluation success on the rule's instances as a dashed line."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend and no global figure state

    fig = Figure(figsize=(5 * len(sweeps), 3.6))
    colours = {"rule": "tab:blue", "parent": "tab:orange"}
    for i, (name, runs) in enumerate(sweeps.items()):
        ax = fig.add_subplot(1, len(sweeps), i + 1)
        for source, colour in colours.items():
            mine = [r for r in runs if r["source"] == source]
            for n, r in enumerate(mine):
                label = None
                if n == 0:
                    label = f"--task-source {source}: training"
                ax.plot(r["curve"][0], r["curve"][1], color=colour, alpha=0.6, lw=1, label=label)
            if mine:
                evaluation = float(np.mean([r["success"] for r in mine]))
                ax.axhline(evaluation, color=colour, ls="--", lw=1.5, label=f"--task-source {source}: eval {evaluation:.2f}")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("steps")
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("success rate")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="append", required=True, help="NAME=DIR, a benchmark.py output directory")
    p.add_argument("--output", required=True, help="the markdown report; the JSON goes beside it")
    args = p.parse_args(argv)
    sweeps = {}
    for item in args.sweep:
        name, sep, path = item.partition("=")
        if not sep or not os.path.isdir(path):
            sys.exit(f"reinforce_baby_task_source_report: --sweep {item!r} must be NAME=DIR with DIR a benchmark.py output")
        try:
            sweeps[name] = runs_of(path)
        except ValueError as e:  # a run key without --task-source: not a task-source sweep
            sys.exit(f"reinforce_baby_task_source_report: {path}: {e}")
    if not any(sweeps.values()):
        sys.exit("reinforce_baby_task_source_report: no finished run in the sweeps")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        f.write(report(sweeps))
    with open(os.path.splitext(args.output)[0] + ".json", "w") as f:
        json.dump(
            {name: [{k: v for k, v in r.items() if k != "curve"} for r in runs] for name, runs in sweeps.items()}, f, indent=1
        )
    plot(sweeps, os.path.splitext(args.output)[0] + ".png")
    print(f"reinforce_baby_task_source_report: {args.output}")


if __name__ == "__main__":
    main()
