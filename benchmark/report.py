"""Benchmark report: tables (markdown + CSV) and learning-curve plots from sweeps written by benchmark.py.

Reads each sweep's manifest.jsonl, every run's TensorBoard events (as TensorBoard shows them: see read_scalars) and
eval.json, and aggregates over seeds per method (command) and grid point: mean, std and 95% CI (Student t) of
- the final return: mean of the last 100 logged `charts/episodic_return` values (and per mode,
  `charts/episodic_return_mode{k}`),
- the evaluation results in eval.json (deterministic / sampled per mode for the CartPole scripts, any numbers otherwise),
- the wall time (from the manifest) and SPS (last `charts/SPS` value).

Usage:
    python benchmark/report.py --sweep benchmark/out/ppo_gru_baseline --output docs/results/ppo_gru_baseline \
        --labels 0=ppo_gru 1=sb3_ppo
"""

import argparse
import glob
import json
import logging
import os
import re
import shutil
import sys
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import population_sd, t_ci95_half_width  # noqa: E402

RETURN_TAG = "charts/episodic_return"
MODE_TAG = re.compile(r"^charts/episodic_return_mode(\d+)$")
SPS_TAG = "charts/SPS"

# metric column -> header of the main table, in this order
MAIN_METRICS = {
    "final_return": "Final return (last {n} ep.)",
    "eval_deterministic_mean": "Eval return (deterministic)",
    "eval_sampled_mean": "Eval return (sampled)",
    "eval_deterministic_worst_mode": "Eval return, worst mode (deterministic)",
    "wall_time_s": "Wall time (s)",
    "sps": "SPS",
}


# what build_report reads from every manifest line (benchmark.py writes these and more)
MANIFEST_KEYS = ("run_key", "command_index", "command", "grid_index", "grid", "seed", "exit_code", "runs_dir", "wall_time_s")


def load_manifest(sweep_dir: str) -> list[dict]:
    """The last attempt of every run in the sweep (a retried run has one manifest line per attempt)."""
    path = os.path.join(sweep_dir, "manifest.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: run benchmark/benchmark.py --output {sweep_dir} first")
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a file; give the --output directory of a benchmark.py sweep")
    latest = {}
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict) or any(key not in record for key in MANIFEST_KEYS):
                missing = [key for key in MANIFEST_KEYS if key not in record] if isinstance(record, dict) else []
                why = f"lacks {', '.join(missing)}" if missing else "is not a JSON object"
                raise ValueError(
                    f"{path} line {number} {why}: not a benchmark.py manifest record; re-run the sweep "
                    "with benchmark.py --resume into a fresh --output, or remove that line"
                )
            latest[record["run_key"]] = record
    return list(latest.values())


def default_label(command: str) -> str:
    """'python cleanrl_astral/ppo.py --x 1' -> 'ppo.py --x 1': the script and its own flags, no interpreter."""
    tokens = command.split()
    for i, token in enumerate(tokens):
        if token.endswith(".py"):
            return " ".join([os.path.basename(token)] + tokens[i + 1 :])
    return command


def read_scalars(run_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """tag -> (steps, values) in logging order for every scalar tag of the run, exactly as TensorBoard shows them.

    Read with TensorBoard's own EventAccumulator, which
    - reads only the event files in run_dir itself, so a sub-run's events in a sub-directory (e.g. reinforce_baby's
      baseline_{name}) are not mixed into the run's curves;
    - applies purges: a resumed run opens its writer with purge_step = checkpoint step + 1, and what the killed run
      logged from that step on is dropped rather than drawn twice.
    A missing directory or one without events gives {}.
    """
    if not os.path.isdir(run_dir):
        return {}
    # a purge is logged as a warning ("Detected out of order event.step ..."); for a resumed run it is expected
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # 0: keep every event, no reservoir sampling
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        out[tag] = (np.array([e.step for e in events], dtype=float), np.array([e.value for e in events], dtype=float))
    return out


def flatten_eval(data: dict) -> dict[str, float]:
    """eval.json -> flat numeric columns named eval_*.

    The CartPole format (per_mode with deterministic/sampled) gives eval_deterministic_mean, eval_sampled_mean and
    eval_deterministic_mode{k} / eval_sampled_mode{k}; any other format gives its numeric scalars and one level of
    nested dicts of numbers (eval_<key> and eval_<key>.<subkey>).
    """
    out = {}
    if isinstance(data.get("per_mode"), dict):
        for mode, results in sorted(data["per_mode"].items(), key=lambda kv: int(kv[0])):
            for kind in ("deterministic", "sampled"):
                if isinstance(results.get(kind), dict) and "mean" in results[kind]:
                    out[f"eval_{kind}_mode{int(mode)}"] = float(results[kind]["mean"])
        for kind in ("deterministic", "sampled"):
            if isinstance(data.get(f"{kind}_mean"), (int, float)):
                out[f"eval_{kind}_mean"] = float(data[f"{kind}_mean"])
            per_mode = [v for k, v in out.items() if k.startswith(f"eval_{kind}_mode")]
            if per_mode:
                # the worst mode decides whether a run "solves every mode"
                out[f"eval_{kind}_worst_mode"] = min(per_mode)
        # method-specific numbers beside the per-mode returns (e.g. ASTRAL's mode_slot_nmi_deterministic)
        for key, value in data.items():
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and key not in ("episodes_per_mode", "deterministic_mean", "sampled_mean")
            ):
                out[f"eval_{key}"] = float(value)
        return out
    for key, value in data.items():
        if isinstance(value, bool):
            out[f"eval_{key}"] = float(value)
        elif isinstance(value, (int, float)):
            out[f"eval_{key}"] = float(value)
        elif isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, (int, float)):
                    out[f"eval_{key}.{sub}"] = float(v)
    return out


class RunData(NamedTuple):
    metrics: dict  # column -> value: final returns, SPS, wall time and the flattened eval.json
    curves: dict  # return tag -> (steps, values)
    problems: list  # warnings about the run


def read_run(record: dict, last_n: int) -> RunData:
    """One run's metrics, learning curves and warnings."""
    problems = []
    metrics = {"wall_time_s": float(record["wall_time_s"])}
    run_dirs = record.get("run_dirs") or []
    if not run_dirs:
        return RunData(metrics, {}, [f"{record['run_key']}: no run directory under {record['runs_dir']}"])
    if len(run_dirs) > 1:
        problems.append(f"{record['run_key']}: {len(run_dirs)} run directories, using {run_dirs[-1]}")
    run_dir = run_dirs[-1]
    scalars = read_scalars(run_dir)
    curves = {tag: sv for tag, sv in scalars.items() if tag == RETURN_TAG or MODE_TAG.match(tag)}
    if RETURN_TAG not in scalars:
        problems.append(f"{record['run_key']}: no {RETURN_TAG} events in {run_dir}")
    for tag, (_, values) in curves.items():
        m = MODE_TAG.match(tag)
        if m:
            name = f"final_return_mode{m.group(1)}"
        else:
            name = "final_return"
        metrics[name] = float(np.mean(values[-last_n:]))
    if SPS_TAG in scalars:
        metrics["sps"] = float(scalars[SPS_TAG][1][-1])
    eval_path = os.path.join(run_dir, "eval.json")
    if os.path.exists(eval_path):
        with open(eval_path) as f:
            metrics.update(flatten_eval(json.load(f)))
    else:  # its eval cells then average fewer seeds than the Seeds column says
        problems.append(f"{record['run_key']}: no eval.json in {run_dir}")
    return RunData(metrics, curves, problems)


def mode_key(name: str) -> tuple:
    m = re.search(r"_mode(\d+)$", name)
    return (name[: m.start()], int(m.group(1))) if m else (name, -1)


def aggregate(values: list[float]) -> dict:
    """mean, sample std and 95% Student-t confidence interval of the mean over seeds."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": np.nan, "std": np.nan, "ci95_low": np.nan, "ci95_high": np.nan}
    mean = float(x.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "std": np.nan, "ci95_low": np.nan, "ci95_high": np.nan}
    std = float(x.std(ddof=1))
    half = t_ci95_half_width(x)
    return {"n": n, "mean": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half}


def fmt(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "–"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def cell(agg: dict, seeds: int) -> str:
    """One table cell; `seeds` is the row's seed count, and a cell aggregating fewer (a run without eval.json, say)
    names its own count so that the Seeds column does not overstate it."""
    if agg["n"] == 0:
        return "–"
    if agg["n"] == 1:
        return f"{fmt(agg['mean'])} (1 seed)"
    text = f"{fmt(agg['mean'])} ± {fmt(agg['std'])} [{fmt(agg['ci95_low'])}, {fmt(agg['ci95_high'])}]"
    if agg["n"] != seeds:
        text += f" ({agg['n']} seeds)"
    return text


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


class MeanCurve(NamedTuple):
    grid: np.ndarray  # the common steps
    mean: np.ndarray  # mean over seeds
    std: np.ndarray  # population std over seeds


def mean_std_curve(runs: list[tuple[np.ndarray, np.ndarray]], smooth: int, points: int = 200) -> MeanCurve | None:
    """Smooth each seed's episodes with a running mean, interpolate onto a common step grid, then mean and std.

    The grid stops at the earliest last step over seeds so that no seed's curve is extrapolated.
    """
    runs = [(s, v) for s, v in runs if len(s) > 0]
    if not runs:
        return None
    lo = max(s[0] for s, _ in runs)
    hi = min(s[-1] for s, _ in runs)
    if hi <= lo:
        hi = lo + 1
    grid = np.linspace(lo, hi, points)
    curves = []
    for steps, values in runs:
        smoothed = pd.Series(values).rolling(smooth, min_periods=1).mean().to_numpy()
        curves.append(np.interp(grid, steps, smoothed))
    curves = np.stack(curves)
    return MeanCurve(grid, curves.mean(0), population_sd(curves, axis=0))


def plot_curves(groups: dict, tag: str, path: str, title: str, smooth: int) -> bool:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for name, group in groups.items():
        curve = mean_std_curve([g["curves"][tag] for g in group if tag in g["curves"]], smooth)
        if curve is None:
            continue
        n = sum(tag in g["curves"] for g in group)
        line = ax.plot(curve.grid, curve.mean, label=f"{name} (n={n})")[0]
        ax.fill_between(curve.grid, curve.mean - curve.std, curve.mean + curve.std, color=line.get_color(), alpha=0.2)
        drawn = True
    if drawn:
        ax.set_xlabel("global step")
        ax.set_ylabel(f"episodic return (running mean of {smooth} ep.)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def parse_labels(items: list[str]) -> dict:
    """INDEX=NAME names the INDEX-th command across the sweeps; TEXT=NAME names every command containing TEXT
    (the first such label given wins, so put specific ones such as 'memory none=...' before general ones)."""
    labels = {}
    for item in items:
        key, sep, name = item.rpartition("=")
        if not sep or not key.strip() or not name.strip():
            raise ValueError(
                f"label {item!r} must look like INDEX=NAME or TEXT=NAME, e.g. 0=ppo_gru or 'oracle=ppo_gru_oracle'"
            )
        labels[int(key) if key.strip().isdigit() else key.strip()] = name.strip()
    return labels


def label_for(labels: dict, command_id: int, command: str) -> str:
    if command_id in labels:
        return labels[command_id]
    for key, name in labels.items():
        if isinstance(key, str) and key in command:
            return name
    return default_label(command)


class SweepRecords(NamedTuple):
    records: list  # (sweep, manifest record) of every run's last attempt
    offsets: dict  # sweep -> the number of its command 0 across the sweeps


def read_sweeps(sweeps: list[str]) -> SweepRecords:
    """Every run of the sweeps. Commands are numbered across sweeps in the order given (a sweep's commands take the
    numbers after the previous sweep's) by their index in their own sweep, so a label names the same command whichever
    have records yet."""
    records = []
    offsets = {}
    offset = 0
    for sweep in sweeps:
        offsets[sweep] = offset
        manifest = load_manifest(sweep)
        records += [(sweep, record) for record in manifest]
        offset += max((record.get("num_commands", record["command_index"] + 1) for record in manifest), default=0)
    return SweepRecords(records, offsets)


def unmatched_labels(labels: dict, sweep_records: SweepRecords) -> list[str]:
    """A warning for every label that names no command of the sweeps (most likely a typo)."""
    command_ids = {sweep_records.offsets[sweep] + record["command_index"] for sweep, record in sweep_records.records}
    problems = []
    for key, name in labels.items():
        if isinstance(key, int):
            matched = key in command_ids
        else:
            matched = any(key in record["command"] for _, record in sweep_records.records)
        if not matched:
            problems.append(f"label {key}={name} matches no command of these sweeps (a typo, or its runs are missing)")
    return problems


def grid_text(grid) -> str:
    """The grid point's flags, a list or one string, as one string ('–' for none)."""
    if isinstance(grid, list):
        text = " ".join(grid)
    else:
        text = str(grid)
    return text or "–"


class RunTable(NamedTuple):
    rows: list  # one dict per successful run: method, grid, seed, run_key, run_dir and its metrics
    groups: dict  # (method, grid) -> [{"row", "curves", "run_dir"}] over its seeds
    failed: list  # manifest records of the runs whose last attempt failed
    problems: list  # warnings about the runs read


def read_runs(sweeps: list[str], sweep_records: SweepRecords, labels: dict, last_n: int) -> RunTable:
    """Reads every successful run, in the order sweep, command, grid point, seed, and groups the seeds of each method
    and grid point."""

    def order(sweep_record):
        sweep, record = sweep_record
        return (sweeps.index(sweep), record["command_index"], record["grid_index"], record["seed"])

    rows = []
    groups = {}
    failed = []
    problems = []
    for sweep, record in sorted(sweep_records.records, key=order):
        command_id = sweep_records.offsets[sweep] + record["command_index"]
        method = label_for(labels, command_id, record["command"])
        if record["exit_code"] != 0:
            failed.append(record)
            continue
        run = read_run(record, last_n)
        problems += run.problems
        grid = grid_text(record["grid"])
        run_dirs = record.get("run_dirs") or []
        row = {
            "method": method,
            "grid": grid,
            "seed": record["seed"],
            "run_key": record["run_key"],
            "run_dir": run_dirs[-1] if run_dirs else "",
            **run.metrics,
        }
        rows.append(row)
        groups.setdefault((method, grid), []).append(
            {"row": row, "curves": run.curves, "run_dir": run_dirs[-1] if run_dirs else None}
        )
    return RunTable(rows, groups, failed, problems)


def summarize(groups: dict, metric_cols: list[str]) -> tuple[list[dict], dict]:
    """summary.csv's rows (one per method and grid point) and {(method, grid, metric): aggregate}."""
    summary_rows = []
    aggregates = {}
    for (method, grid), group in groups.items():
        seeds = [g["row"]["seed"] for g in group]
        summary = {"method": method, "grid": grid, "n_seeds": len(seeds), "seeds": " ".join(map(str, seeds))}
        for col in sorted(metric_cols):
            agg = aggregate([g["row"].get(col) for g in group if g["row"].get(col) is not None])
            aggregates[(method, grid, col)] = agg
            for key in ("mean", "std", "ci95_low", "ci95_high"):
                summary[f"{col}__{key}"] = agg[key]
        summary_rows.append(summary)
    return summary_rows, aggregates


def table_sections(groups: dict, aggregates: dict, metric_cols: list[str], last_n: int) -> list[str]:
    """The markdown tables: the main metrics, per mode, and every other eval metric."""

    def agg_cell(method, grid, col):
        agg = aggregates.get((method, grid, col))
        if not agg:
            return "–"
        return cell(agg, len(groups[(method, grid)]))

    main_cols = [c for c in MAIN_METRICS if c in metric_cols]
    header = ["Method", "Grid", "Seeds"] + [MAIN_METRICS[c].format(n=last_n) for c in main_cols]
    main_rows = [[m, g, str(len(grp))] + [agg_cell(m, g, c) for c in main_cols] for (m, g), grp in groups.items()]
    lines = [markdown_table(header, main_rows)]

    mode_cols = sorted({c for c in metric_cols if re.search(r"_mode\d+$", c)}, key=mode_key)
    modes = sorted({mode_key(c)[1] for c in mode_cols})
    if modes:
        kinds = [
            ("final_return", f"Final return (last {last_n} ep. of the mode)"),
            ("eval_deterministic", "Eval return (deterministic)"),
            ("eval_sampled", "Eval return (sampled)"),
        ]
        kinds = [(k, h) for k, h in kinds if any(c.startswith(k + "_mode") for c in mode_cols)]
        table = []
        for m, g in groups:
            for k in modes:
                cells = [agg_cell(m, g, f"{kind}_mode{k}") for kind, _ in kinds]
                if any(c != "–" for c in cells):  # a grid point without mode k (e.g. seed3 has no mode 3)
                    table.append([m, g, str(k)] + cells)
        lines += ["", "## Per mode", "", markdown_table(["Method", "Grid", "Mode"] + [h for _, h in kinds], table)]

    other_cols = [c for c in sorted(metric_cols) if c not in main_cols and c not in mode_cols]
    if other_cols:
        other_rows = [[m, g] + [agg_cell(m, g, c) for c in other_cols] for (m, g) in groups]
        lines += ["", "## Other evaluation metrics", "", markdown_table(["Method", "Grid"] + other_cols, other_rows)]
    return lines


def curve_order(tag: str) -> tuple:
    """The overall return first, then the modes in order."""
    m = MODE_TAG.match(tag)
    if m:
        return (True, int(m.group(1)))
    return (tag != RETURN_TAG, -1)


def draw_learning_curves(groups: dict, output: str, title: str, smooth: int) -> list[str]:
    """One PNG per return tag (overall and per mode), one line per method and grid point; returns the files drawn."""
    curve_tags = sorted({tag for grp in groups.values() for g in grp for tag in g["curves"]}, key=curve_order)
    named = {}
    for (m, g), grp in groups.items():
        if g == "–":
            named[m] = grp
        else:
            named[f"{m} {g}"] = grp
    plots = []
    for tag in curve_tags:
        m = MODE_TAG.match(tag)
        if m:
            name = f"learning_curve_mode{m.group(1)}.png"
        else:
            name = "learning_curve.png"
        if plot_curves(named, tag, os.path.join(output, name), f"{title}: {tag}", smooth):
            plots.append(name)
    return plots


def copy_run_figures(groups: dict, output: str) -> list[str]:
    """Copies the PNGs the runs drew themselves (heatmaps, adaptation curves) to output/figures, so that a report
    committed under docs/ does not point into an ignored sweep directory; returns their markdown links."""
    linked = []
    for (m, g), grp in groups.items():
        for entry in grp:
            if not entry["run_dir"]:
                continue
            for png in sorted(glob.glob(os.path.join(entry["run_dir"], "*.png"))):
                copy = os.path.join("figures", f"{entry['row']['run_key']}__{os.path.basename(png)}")
                os.makedirs(os.path.join(output, "figures"), exist_ok=True)
                shutil.copyfile(png, os.path.join(output, copy))
                linked.append(f"- {m} {g} seed {entry['row']['seed']}: [{os.path.basename(png)}]({copy})")
    return linked


def build_report(
    sweeps: list[str], output: str, labels: dict, last_n: int = 100, smooth: int = 20, title: str = "Benchmark"
) -> dict:
    """Write report.md, summary.csv, runs.csv and learning-curve PNGs to `output`; return what was written."""
    os.makedirs(output, exist_ok=True)
    sweep_records = read_sweeps(sweeps)
    label_problems = unmatched_labels(labels, sweep_records)
    runs = read_runs(sweeps, sweep_records, labels, last_n)
    problems = label_problems + runs.problems
    groups = runs.groups

    runs_df = pd.DataFrame(runs.rows)
    metric_cols = [c for c in runs_df.columns if c not in ("method", "grid", "seed", "run_key", "run_dir")]
    summary_rows, aggregates = summarize(groups, metric_cols)
    runs_path = os.path.join(output, "runs.csv")
    summary_path = os.path.join(output, "summary.csv")
    runs_df.to_csv(runs_path, index=False)
    pd.DataFrame(summary_rows).to_csv(summary_path, index=False)

    lines = [
        f"# {title}",
        "",
        f"Each cell: mean ± std [95% CI of the mean, Student t] over seeds. Final return = mean of the last {last_n} "
        "logged episodic returns of a run; eval returns from its eval.json; wall time from the sweep manifest; "
        "SPS = last logged charts/SPS.",
        "",
    ]
    lines += table_sections(groups, aggregates, metric_cols, last_n)
    plots = draw_learning_curves(groups, output, title, smooth)
    if plots:
        lines += ["", "## Learning curves", "", f"Mean ± std over seeds of the running mean of {smooth} episodes.", ""]
        lines += [f"![{name}]({name})" for name in plots]
    # figures the runs drew themselves are linked, not redrawn
    linked = copy_run_figures(groups, output)
    if linked:
        lines += ["", "## Figures written by the runs", ""] + linked
    if runs.failed:
        lines += ["", "## Failed runs", ""]
        for r in runs.failed:
            lines.append(f"- `{r['run_key']}` exit code {r['exit_code']}: `{r['command']}` (log: {r.get('log_path', '?')})")
    if problems:
        lines += ["", "## Warnings", ""] + [f"- {p}" for p in problems]
    report_path = os.path.join(output, "report.md")
    with open(report_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return {
        "report": report_path,
        "summary": summary_path,
        "runs": runs_path,
        "plots": plots,
        "problems": problems,
        "failed": runs.failed,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="report.py", description="Tables and plots from benchmark.py sweeps.")
    p.add_argument("--sweep", nargs="+", required=True, help="sweep directories (benchmark.py --output)")
    p.add_argument("--output", required=True, help="where report.md, summary.csv, runs.csv and the PNGs go")
    p.add_argument(
        "--labels",
        nargs="+",
        default=[],
        help="INDEX=NAME (commands numbered from 0 across the sweeps in order) "
        "or TEXT=NAME (commands containing TEXT; first match wins)",
    )
    p.add_argument("--last-n", type=int, default=100, help="final return = mean of the last N logged episodes")
    p.add_argument("--smooth", type=int, default=20, help="running-mean window (episodes) of the plotted curves")
    p.add_argument("--title", default=None, help="report title (default: the output directory's name)")
    args = p.parse_args(argv)
    try:
        labels = parse_labels(args.labels)
    except ValueError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    if args.last_n < 1 or args.smooth < 1:
        print("report.py: error: --last-n and --smooth must be >= 1", file=sys.stderr)
        return 2
    missing = [s for s in args.sweep if not os.path.exists(os.path.join(s, "manifest.jsonl"))]
    if missing:
        print(
            f"report.py: error: {missing[0]}/manifest.jsonl does not exist; run benchmark/benchmark.py "
            f"--output {missing[0]} first",
            file=sys.stderr,
        )
        return 2
    real = [os.path.realpath(s) for s in args.sweep]
    twice = next((s for s, r in zip(args.sweep, real) if real.count(r) > 1), None)
    if twice is not None:
        print(
            f"report.py: error: sweep {twice} is given twice; its runs would count as extra seeds and narrow the "
            "confidence intervals; give each sweep once",
            file=sys.stderr,
        )
        return 2
    try:
        manifests = [load_manifest(s) for s in args.sweep]
    except ValueError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    if not any(manifests):
        print(
            f"report.py: error: no runs recorded in {' '.join(args.sweep)}; the sweep has not finished a run yet",
            file=sys.stderr,
        )
        return 2
    title = args.title or os.path.basename(os.path.normpath(args.output))
    result = build_report(args.sweep, args.output, labels, args.last_n, args.smooth, title)
    print(
        f"report.py: wrote {result['report']}, {result['summary']}, {result['runs']} and {len(result['plots'])} plot(s)",
        file=sys.stderr,
    )
    for problem in result["problems"]:
        print(f"report.py: warning: {problem}", file=sys.stderr)
    if result["failed"]:
        print(f"report.py: warning: {len(result['failed'])} failed run(s) left out of the tables", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
