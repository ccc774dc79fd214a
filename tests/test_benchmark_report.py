"""Tests of benchmark/report.py: aggregation and confidence intervals, eval.json flattening, labels, manifest errors,
how runs are read (resumed runs, sub-runs, failed and retried runs), the learning-curve figures, and the report on a
real tiny sweep of SB3 peers."""

import glob
import json
import os

import numpy as np
import pandas as pd
import pytest
from benchmark_helpers import benchmark_path, load_benchmark_script, manifest, run_benchmark, run_benchmark_script
from helpers import assert_one_line_error, load_json
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from torch.utils.tensorboard import SummaryWriter

report = load_benchmark_script("report")


def test_report_tables_ci_and_eval_flattening():
    agg = report.aggregate([1.0, 2.0, 3.0])
    assert agg["mean"] == pytest.approx(2.0) and agg["std"] == pytest.approx(1.0)
    # t(0.975, 2 degrees of freedom) = 4.302652729911275
    assert agg["ci95_high"] - agg["mean"] == pytest.approx(4.302652729911275 / np.sqrt(3))
    assert report.aggregate([5.0])["n"] == 1 and np.isnan(report.aggregate([5.0])["std"])
    flat = report.flatten_eval(
        {"task": "sine", "returns_after_steps": {"0": 1.5, "1": 2.5}, "ci95": {"0": 0.1}, "num_tasks": 8, "success": True}
    )
    assert flat == {
        "eval_returns_after_steps.0": 1.5,
        "eval_returns_after_steps.1": 2.5,
        "eval_ci95.0": 0.1,
        "eval_num_tasks": 8.0,
        "eval_success": 1.0,
    }
    cartpole = {
        "per_mode": {
            "1": {"deterministic": {"mean": 3.0}, "sampled": {"mean": 1.0}},
            "0": {"deterministic": {"mean": 2.0}, "sampled": {"mean": 4.0}},
        },
        "deterministic_mean": 2.5,
        "sampled_mean": 2.5,
        "episodes_per_mode": 10,
        "mode_slot_nmi_deterministic": 0.25,
    }
    assert report.flatten_eval(cartpole) == {
        "eval_deterministic_mode0": 2.0,
        "eval_sampled_mode0": 4.0,
        "eval_deterministic_mode1": 3.0,
        "eval_sampled_mode1": 1.0,
        "eval_deterministic_mean": 2.5,
        "eval_sampled_mean": 2.5,
        "eval_deterministic_worst_mode": 2.0,
        "eval_sampled_worst_mode": 1.0,
        "eval_mode_slot_nmi_deterministic": 0.25,
    }


def test_labels_by_index_or_command_text():
    labels = report.parse_labels(["0=first", "--memory none=memoryless", "ppo_gru_baseline.py=gru"])
    assert report.label_for(labels, 0, "python x.py") == "first"
    assert report.label_for(labels, 3, "python ppo_gru_baseline.py --memory none") == "memoryless"
    assert report.label_for(labels, 4, "python ppo_gru_baseline.py --oracle") == "gru"
    assert report.label_for(labels, 5, "python other.py --x 1") == "other.py --x 1"
    with pytest.raises(ValueError):
        report.parse_labels(["=nothing"])


def test_labels_follow_the_command_index_and_a_missing_eval_json_is_a_warning(tmp_path):
    """--labels 1=... names command 1 even while command 0 has no finished run; a run without eval.json is listed
    under the warnings, and the eval cells, which average fewer seeds than the Seeds column, say how many."""
    sweep = tmp_path / "sweep"
    records = []
    for seed in (1, 2, 3):
        run_dir = sweep / "runs" / f"c1__g0_base__s{seed}" / "run"
        w = SummaryWriter(str(run_dir))
        w.add_scalar("charts/episodic_return", 10.0 * seed, 1)
        w.close()
        if seed != 2:
            (run_dir / "eval.json").write_text(json.dumps({"deterministic_mean": 4.0 + seed}))
        records.append(
            {
                "run_key": f"c1__g0_base__s{seed}",
                "command_index": 1,
                "num_commands": 2,
                "command": "python fast.py",
                "grid_index": 0,
                "grid": "",
                "seed": seed,
                "exit_code": 0,
                "wall_time_s": 1.0,
                "runs_dir": str(run_dir.parent),
                "run_dirs": [str(run_dir)],
            }
        )
    (sweep / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = report.build_report([str(sweep)], str(tmp_path / "report"), {0: "slow_method", 1: "fast_method"})
    text = (tmp_path / "report" / "report.md").read_text()
    tables = text.split("## Warnings")[0]
    assert "fast_method" in tables and "slow_method" not in tables
    assert any("c1__g0_base__s2: no eval.json" in p for p in result["problems"])
    # a label that names nothing is most likely a typo: said, not silently ignored
    assert any(p.startswith("label 0=slow_method matches no command") for p in result["problems"])
    result = report.build_report([str(sweep)], str(tmp_path / "report2"), {"fats.py": "fast_method"})
    assert any(p.startswith("label fats.py=fast_method matches no command") for p in result["problems"])
    assert not any(
        p.startswith("label")
        for p in report.build_report([str(sweep)], str(tmp_path / "report3"), {"fast.py": "f"})["problems"]
    )
    # the same sweep given twice (here once through a trailing slash) would double its seeds: refused
    assert report.main(["--sweep", str(sweep), str(sweep) + "/", "--output", str(tmp_path / "twice")]) == 2
    assert not (tmp_path / "twice").exists()
    # final return over seeds 1-3 (10, 20, 30); deterministic eval over seeds 1 and 3 only (5, 7)
    assert "| fast_method | – | 3 | 20.0 ± 10.0 [-4.84, 44.8] | 6 ± 1.41 [-6.71, 18.7] (2 seeds) |" in text


def test_a_corrupt_or_empty_manifest_is_a_one_line_error_before_the_report_is_written(tmp_path, capsys):
    """Each would otherwise be a traceback (JSONDecodeError, KeyError, IsADirectoryError) or, for an empty manifest, an
    empty report with exit 0. The first case runs report.py as a process, the others call its main()."""
    good = {
        "run_key": "c0__g0_base__s1",
        "command_index": 0,
        "command": "python x.py",
        "grid_index": 0,
        "grid": "",
        "seed": 1,
        "exit_code": 0,
        "runs_dir": "r",
        "wall_time_s": 1.0,
    }
    cases = {
        json.dumps(good) + "\n{truncated": "line 2 is not a JSON object",
        json.dumps({k: v for k, v in good.items() if k != "seed"}): "line 1 lacks seed",
        "[1, 2]": "line 1 is not a JSON object",
        "\n": "no runs recorded",
        None: "is not a file",
    }
    for i, (text, message) in enumerate(cases.items()):
        sweep = tmp_path / f"sweep{i}"
        if text is None:
            (sweep / "manifest.jsonl").mkdir(parents=True)
        else:
            sweep.mkdir()
            (sweep / "manifest.jsonl").write_text(text)
        if i == 0:
            r = run_benchmark_script("report", "--sweep", sweep, "--output", tmp_path / "rep")
            assert_one_line_error(r, message)
        else:
            assert report.main(["--sweep", str(sweep), "--output", str(tmp_path / "rep")]) == 2
            lines = capsys.readouterr().err.strip().splitlines()
            assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "rep").exists()


def test_report_reads_a_resumed_run_as_tensorboard_shows_it(tmp_path):
    """A killed run resumed from its checkpoint reopens its writer with purge_step; TensorBoard then drops what the
    killed run logged from that step on, for every tag. A sub-run's events in a sub-directory (reinforce_baby's
    baseline_{name}) belong to another curve. The report must read the run the same way: no step drawn twice, no
    purged tag left behind, no sub-run mixed in."""
    run_dir = tmp_path / "sweep" / "runs" / "c0__g0_base__s1" / "run"
    killed = SummaryWriter(str(run_dir))
    for step in range(1, 11):
        killed.add_scalar("charts/episodic_return", step, step)
        killed.add_scalar("charts/SPS", 1000 + step, step)
    killed.close()
    resumed = SummaryWriter(str(run_dir), purge_step=6)  # checkpoint at step 5
    for step in range(6, 13):
        resumed.add_scalar("charts/episodic_return", 100 + step, step)
    resumed.close()
    sub = SummaryWriter(str(run_dir / "baseline_rl-only"))
    for step in range(1, 13):
        sub.add_scalar("charts/episodic_return", -1000.0, step)
    sub.close()

    scalars = report.read_scalars(str(run_dir))
    steps, values = scalars["charts/episodic_return"]
    assert steps.tolist() == list(range(1, 13))
    assert values.tolist() == [1, 2, 3, 4, 5, 106, 107, 108, 109, 110, 111, 112]
    # the resumed run never logged SPS: its purged steps are gone all the same
    assert scalars["charts/SPS"][0].tolist() == [1, 2, 3, 4, 5]
    assert report.read_scalars(str(tmp_path / "no_such_run")) == {}

    record = {
        "run_key": "c0__g0_base__s1",
        "command_index": 0,
        "command": "python x.py",
        "grid_index": 0,
        "grid": [],
        "seed": 1,
        "exit_code": 0,
        "wall_time_s": 1.0,
        "runs_dir": str(run_dir.parent),
        "run_dirs": [str(run_dir)],
    }
    (tmp_path / "sweep" / "manifest.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "report"
    report.build_report([str(tmp_path / "sweep")], str(out), {0: "m"}, last_n=100)
    row = pd.read_csv(out / "runs.csv").iloc[0]
    assert row["final_return"] == pytest.approx(np.mean(values))
    assert row["sps"] == 1005


def test_report_groups_seeds_per_method_and_grid_point_and_keeps_each_runs_last_attempt(tmp_path):
    """Seeds are pooled only within one method and one grid point; a failed run stays out of the tables even though
    its directory holds events; a retried run counts by its last attempt; the final return is the mean of the last
    N logged episodes. Pooled grid points or methods, a failed run in the tables, the first attempt kept, or all
    (or the first N) episodes averaged would each change a number checked here."""
    sweep = tmp_path / "sweep"
    records = []

    def run(ci, gi, seed, final, exit_code=0, attempt=1):
        key = f"c{ci}__g{gi}_lr_{gi + 1}__s{seed}"
        run_dir = sweep / "runs" / key / f"run_a{attempt}"
        w = SummaryWriter(str(run_dir))
        for step, value in enumerate([-500.0] * 5 + [final - 1, final, final + 1], 1):  # last 3 average to `final`
            w.add_scalar("charts/episodic_return", value, step)
        w.close()
        records.append(
            {
                "run_key": key,
                "command_index": ci,
                "num_commands": 2,
                "command": f"python m{ci}.py",
                "grid_index": gi,
                "grid": f"--lr {gi + 1}",
                "seed": seed,
                "exit_code": exit_code,
                "attempt": attempt,
                "wall_time_s": 1.0,
                "runs_dir": str(run_dir.parent),
                "run_dirs": [str(run_dir)],
            }
        )

    for ci in (0, 1):
        for gi in (0, 1):
            for seed in (1, 2):
                if (ci, gi, seed) == (1, 1, 2):
                    run(ci, gi, seed, 7000.0, exit_code=1, attempt=1)  # failed first attempt, then retried
                    run(ci, gi, seed, 100 * ci + 10 * gi + seed, attempt=2)
                else:
                    run(ci, gi, seed, 100 * ci + 10 * gi + seed)
    run(0, 0, 3, 9000.0, exit_code=2)  # a failed run whose directory holds events all the same
    (sweep / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = report.build_report([str(sweep)], str(tmp_path / "report"), {0: "m0", 1: "m1"}, last_n=3)
    assert [r["run_key"] for r in result["failed"]] == ["c0__g0_lr_1__s3"]
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    got = {(row.method, row.grid): (row.n_seeds, str(row.seeds), row.final_return__mean) for row in summary.itertuples()}
    assert got == {
        (f"m{ci}", f"--lr {gi + 1}"): (2, "1 2", pytest.approx(100 * ci + 10 * gi + 1.5)) for ci in (0, 1) for gi in (0, 1)
    }
    assert summary["final_return__std"].tolist() == pytest.approx([np.sqrt(0.5)] * 4)


def test_report_copies_the_runs_own_figures(tmp_path):
    """Heatmaps and adaptation curves the runs drew are linked from the report through copies beside it, so a
    report committed under docs/ never points into an (ignored) sweep directory."""
    run_dir = tmp_path / "sweep" / "runs" / "c0__g0_base__s1" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "slot_heatmap.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (run_dir / "eval.json").write_text(json.dumps({"per_mode": {"0": {"deterministic": {"mean": 9.0}}}}))
    record = {
        "run_key": "c0__g0_base__s1",
        "command_index": 0,
        "command": "python x.py",
        "grid_index": 0,
        "grid": [],
        "seed": 1,
        "exit_code": 0,
        "wall_time_s": 1.0,
        "runs_dir": str(run_dir.parent),
        "run_dirs": [str(run_dir)],
    }
    (tmp_path / "sweep" / "manifest.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "report"
    report.build_report([str(tmp_path / "sweep")], str(out), {0: "m"})
    copy = out / "figures" / "c0__g0_base__s1__slot_heatmap.png"
    assert copy.read_bytes() == b"\x89PNG\r\n\x1a\nfake"
    assert "(figures/c0__g0_base__s1__slot_heatmap.png)" in (out / "report.md").read_text()


def test_learning_curves_are_smoothed_over_the_given_window_and_stop_at_the_shortest_run():
    """The plotted curve of a seed is the running mean of `smooth` episodes; an unsmoothed (or wrongly smoothed)
    curve of returns alternating 0, 10 would not be flat at 5. The common grid must end at the shortest run's last
    step so that no seed is extrapolated."""
    steps = np.arange(10, dtype=float)
    alternating = np.array([0.0, 10.0] * 5)
    grid, mean, std = report.mean_std_curve([(steps, alternating), (steps[:7], alternating[:7] + 2.0)], smooth=2, points=7)
    assert grid.tolist() == [0, 1, 2, 3, 4, 5, 6]
    # seed 1 smoothed: 0, 5, 5, ...; seed 2 (shifted by 2): 2, 7, 7, ...
    assert mean.tolist() == pytest.approx([1.0] + [6.0] * 6)
    assert std.tolist() == pytest.approx([1.0] * 7)


# LEARNING-CURVE FIGURES
SMOOTH = 3


SERIES = {  # (command index, grid index) -> method label, grid
    (0, 0): ("m0", "--lr 1"),
    (0, 1): ("m0", "--lr 2"),
    (1, 0): ("m1", "--lr 1"),
}


STEPS = {1: np.arange(10, 210, dtype=float), 2: np.arange(0, 251, dtype=float)}  # seed -> steps of its episodes


def episode_values(tag, ci, gi, seed):
    """Integer returns (exact in float32) that differ per tag, method, grid point and seed, and jump around, so
    any other smoothing window gives another curve."""
    i = np.arange(len(STEPS[seed]))
    if tag == "charts/episodic_return":
        return 100 * ci + 30 * gi + 7 * seed + np.array([0, 12, 3, 9])[i % 4] + i // 4
    if tag == "charts/episodic_return_mode0":
        return 1000 + 100 * ci + 30 * gi + 7 * seed + np.array([5, 0, 9])[i % 3]
    return 2000 + np.array([4, 0])[i % 2] + i  # mode 1: logged by one run only


def running_mean(values, window):
    """Mean of the episode and the window - 1 before it (fewer at the start), by its definition."""
    return np.array([np.mean(values[max(0, k - window + 1) : k + 1]) for k in range(len(values))])


@pytest.fixture(scope="module")
def curve_sweep(tmp_path_factory):
    """Two methods, m0 at two grid points and m1 at one, two seeds each; seed 1 logs episodes at steps 10..209,
    seed 2 at 0..250, so the common grid is 10..209 (200 points: exactly the integers). Mode 1 is logged only by
    m0 --lr 1 seed 1."""
    sweep = tmp_path_factory.mktemp("curves") / "sweep"
    records = []
    for (ci, gi), (_, grid) in SERIES.items():
        for seed in (1, 2):
            key = f"c{ci}__g{gi}_lr_{gi + 1}__s{seed}"
            run_dir = sweep / "runs" / key / "run"
            w = SummaryWriter(str(run_dir))
            tags = ["charts/episodic_return", "charts/episodic_return_mode0"]
            if (ci, gi, seed) == (0, 0, 1):
                tags.append("charts/episodic_return_mode1")
            for tag in tags:
                for step, value in zip(STEPS[seed], episode_values(tag, ci, gi, seed)):
                    w.add_scalar(tag, float(value), int(step))
            w.close()
            records.append(
                {
                    "run_key": key,
                    "command_index": ci,
                    "num_commands": 2,
                    "command": f"python m{ci}.py",
                    "grid_index": gi,
                    "grid": grid,
                    "seed": seed,
                    "exit_code": 0,
                    "attempt": 1,
                    "wall_time_s": 1.0,
                    "runs_dir": str(run_dir.parent),
                    "run_dirs": [str(run_dir)],
                }
            )
    (sweep / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return sweep


def expected_series(tag):
    """label -> (x, mean, std) of every line the plot of `tag` should hold, computed from the logged episodes."""
    grid = np.arange(10, 210, dtype=float)
    out = {}
    for (ci, gi), (method, grid_flags) in SERIES.items():
        curves = []
        for seed in (1, 2):
            if tag == "charts/episodic_return_mode1" and (ci, gi, seed) != (0, 0, 1):
                continue
            smoothed = running_mean(episode_values(tag, ci, gi, seed), SMOOTH)
            index = {step: k for k, step in enumerate(STEPS[seed])}
            curves.append([smoothed[index[x]] for x in grid])
        if curves:
            curves = np.array(curves)
            out[f"{method} {grid_flags} (n={len(curves)})"] = (
                grid,
                curves.mean(0),
                np.sqrt(((curves - curves.mean(0)) ** 2).mean(0)),
            )
    return out


def test_learning_curves_plot_each_method_and_grid_point_smoothed_against_the_global_step(curve_sweep, tmp_path, monkeypatch):
    """The data in every learning-curve figure: one line per method x grid point (named with the runs that logged the
    tag), x = the common step grid from the latest first step to the earliest last step, y = the mean over seeds of
    each seed's running mean of --smooth episodes, every point to the last, a band of mean +- 1 population std, the
    mode-k figure drawn from the mode-k tag, and axis labels that say what is drawn."""
    import matplotlib.axes
    import matplotlib.figure

    saved = {}  # file name -> the figure saved there
    bands = {}  # id of an axes -> the (x, low, high) of every band drawn on it
    real_savefig = matplotlib.figure.Figure.savefig
    real_fill_between = matplotlib.axes.Axes.fill_between

    def savefig(self, path, *args, **kwargs):
        saved[os.path.basename(path)] = self
        return real_savefig(self, path, *args, **kwargs)

    def fill_between(self, x, y1, y2=0, **kwargs):
        bands.setdefault(id(self), []).append((np.asarray(x), np.asarray(y1), np.asarray(y2)))
        return real_fill_between(self, x, y1, y2, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", fill_between)
    result = report.build_report(
        [str(curve_sweep)], str(tmp_path / "report"), {0: "m0", 1: "m1"}, last_n=5, smooth=SMOOTH, title="T"
    )
    files = {
        "learning_curve.png": "charts/episodic_return",
        "learning_curve_mode0.png": "charts/episodic_return_mode0",
        "learning_curve_mode1.png": "charts/episodic_return_mode1",
    }
    assert result["plots"] == list(files) and sorted(saved) == sorted(files)
    for name, tag in files.items():
        (ax,) = saved[name].axes
        assert ax.get_title() == f"T: {tag}"
        assert ax.get_xlabel() == "global step"
        assert ax.get_ylabel() == f"episodic return (running mean of {SMOOTH} ep.)"
        expected = expected_series(tag)
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert sorted(lines) == sorted(expected), name
        assert [label for label in ax.get_legend_handles_labels()[1]] == list(lines)
        drawn_bands = bands[id(ax)]
        assert len(drawn_bands) == len(expected)
        for (label, (x, mean, std)), (bx, low, high) in zip(
            [(line.get_label(), expected[line.get_label()]) for line in ax.get_lines()], drawn_bands
        ):
            line = lines[label]
            np.testing.assert_allclose(line.get_xdata(), x, err_msg=f"{name} {label}: x")
            np.testing.assert_allclose(line.get_ydata(), mean, rtol=1e-9, err_msg=f"{name} {label}: y")
            np.testing.assert_allclose(bx, x, err_msg=f"{name} {label}: band x")
            np.testing.assert_allclose(low, mean - std, rtol=1e-9, atol=1e-9, err_msg=f"{name} {label}: band low")
            np.testing.assert_allclose(high, mean + std, rtol=1e-9, atol=1e-9, err_msg=f"{name} {label}: band high")
    # the seeds of a series do differ, so the band is not trivially the line
    assert np.all(expected_series("charts/episodic_return")["m0 --lr 1 (n=2)"][2] > 0)
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"Mean ± std over seeds of the running mean of {SMOOTH} episodes." in text
    assert all(f"![{name}]({name})" in text for name in files)


# A REAL SWEEP
def raw_scalars(run_dir):
    """tag -> values of every scalar record in the run's own event files, in file order, decoded record by record:
    an independent check of the report's reader (for a run that was never resumed, where no purge applies)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in LegacyEventFileLoader(path).Load():
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(value.simple_value)
    return out


def test_report_on_real_sb3_runs(tmp_path):
    out = tmp_path / "sweep"
    command = f"python {benchmark_path('sb3_peers')} --total-timesteps 1024 --save-model --eval-episodes 2"
    r = run_benchmark("--command", command, "--num-seeds", "2", "--workers", "2", "--output", str(out))
    assert r.returncode == 0, r.stderr + "".join(open(rec["log_path"]).read() for rec in manifest(out))
    rep = tmp_path / "report"
    r = run_benchmark_script("report", "--sweep", out, "--output", rep, "--labels", "0=sb3_ppo", "--title", "tiny")
    assert r.returncode == 0, r.stderr
    text = (rep / "report.md").read_text()
    assert "| sb3_ppo | – | 2 |" in text and "## Per mode" in text and "![learning_curve.png](learning_curve.png)" in text
    with open(rep / "learning_curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert (rep / "learning_curve_mode0.png").exists()

    runs = pd.read_csv(rep / "runs.csv")
    summary = pd.read_csv(rep / "summary.csv")
    assert len(runs) == 2 and len(summary) == 1
    finals = []
    for rec in manifest(out):
        (run_dir,) = rec["run_dirs"]
        # the report's numbers, recomputed from the raw event records and from eval.json
        raw = raw_scalars(run_dir)
        returns = raw["charts/episodic_return"]
        by_mode = sum(len(v) for t, v in raw.items() if t.startswith("charts/episodic_return_mode"))
        assert by_mode == len(returns) > 0
        row = runs[runs.run_key == rec["run_key"]].iloc[0]
        assert row["final_return"] == pytest.approx(np.mean(returns[-100:]), rel=1e-5)
        assert row["sps"] == pytest.approx(raw["charts/SPS"][-1])
        assert row["wall_time_s"] == pytest.approx(rec["wall_time_s"])
        evaluation = load_json(os.path.join(run_dir, "eval.json"))
        assert row["eval_deterministic_mean"] == pytest.approx(evaluation["deterministic_mean"])
        finals.append(row["final_return"])
    assert summary["final_return__mean"][0] == pytest.approx(np.mean(finals))
    assert summary["final_return__std"][0] == pytest.approx(np.std(finals, ddof=1))
