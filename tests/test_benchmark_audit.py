"""Tests from a mutation audit of benchmark/ (the parts earlier audits left out): the Ray backend's plumbing
(--backend ray, --cpus-per-run, --ray-num-cpus, --ray-address), attempt numbering and retry bookkeeping across
invocations, and the data report.py hands to matplotlib for the learning-curve PNGs.

The Ray tests run benchmark.py as a subprocess with a fake `ray` package first on PYTHONPATH: it records what the
runner asks of Ray (ray.init's and ray.remote's arguments, every task's attempt number, the shutdown) and runs each
task synchronously in the runner's process. tests/test_benchmark.py has the one test against a real local Ray
instance, which is what keeps this fake honest about Ray's API.
"""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(REPO, "benchmark", "benchmark.py")
REPORT = os.path.join(REPO, "benchmark", "report.py")


def load(path):
    """benchmark/ is a folder of scripts, not a package: import one by path (same module names as test_benchmark)."""
    name = "_benchmark_" + os.path.splitext(os.path.basename(path))[0]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def write_script(path, body):
    path.write_text("import argparse, os, sys\n"
                    "p = argparse.ArgumentParser(); p.add_argument('--seed', type=int); p.add_argument('--runs-dir')\n"
                    "p.add_argument('--tag', default='')\n"
                    "a = p.parse_args()\n" + body)
    return path


def run_benchmark(*args, env=None, cwd=REPO):
    return subprocess.run([sys.executable, BENCHMARK, "--no-progress", *args], cwd=cwd, capture_output=True,
                          text=True, env=env)


def manifest(out):
    with open(os.path.join(out, "manifest.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


# FAKE RAY
FAKE_RAY = '''
"""A stand-in for ray: records every call in $FAKE_RAY_LOG (one JSON line each) and runs tasks synchronously.

$FAKE_RAY_TASK_RAISES: comma-separated task numbers (1 = first task submitted) whose future raises, as when a
Ray worker or node dies. $FAKE_RAY_INIT_FAILS: ray.init raises. $FAKE_RAY_INITIALIZED=1: Ray is already up.
A task reserving more CPUs than the instance has can never be scheduled; real Ray then waits forever, which the
fake turns into exit code 99 (so a test sees the hang without waiting for it).
"""
import concurrent.futures
import json
import os

_LOG = os.environ["FAKE_RAY_LOG"]
_RAISES = {int(n) for n in os.environ.get("FAKE_RAY_TASK_RAISES", "").split(",") if n}
_initialized = os.environ.get("FAKE_RAY_INITIALIZED") == "1"
_cpus = None
_tasks = 0


def _log(event, **data):
    with open(_LOG, "a") as f:
        f.write(json.dumps({"event": event, **data}) + "\\n")


def is_initialized():
    return _initialized


def init(**kwargs):
    global _initialized, _cpus
    _log("init", kwargs=kwargs)
    if os.environ.get("FAKE_RAY_INIT_FAILS"):
        raise ConnectionError("fake: nothing listens there")
    _initialized = True
    if "address" in kwargs:
        _cpus = 64  # a cluster
    else:
        _cpus = kwargs["num_cpus"] if kwargs.get("num_cpus") is not None else os.cpu_count()


def cluster_resources():
    return {"CPU": float(_cpus if _cpus is not None else os.cpu_count())}


available_resources = cluster_resources


def shutdown():
    _log("shutdown")


class _ObjectRef:
    def __init__(self, fn, options, args):
        self.fn, self.options, self.args = fn, options, args

    def future(self):
        global _tasks
        _tasks += 1
        spec, attempt = self.args
        _log("task", number=_tasks, run_key=spec.run_key, attempt=attempt)
        if self.options.get("num_cpus", 1) > cluster_resources()["CPU"]:
            _log("infeasible", num_cpus=self.options.get("num_cpus"))
            os._exit(99)
        future = concurrent.futures.Future()
        if _tasks in _RAISES:
            future.set_exception(RuntimeError("fake worker died"))
        else:
            future.set_result(self.fn(*self.args))
        return future


class _RemoteFunction:
    def __init__(self, fn, options):
        self.fn, self.options = fn, options

    def remote(self, *args):
        return _ObjectRef(self.fn, self.options, args)


def remote(*args, **options):
    _log("remote", options=options)
    if args and callable(args[0]):
        return _RemoteFunction(args[0], options)
    return lambda fn: _RemoteFunction(fn, options)
'''


@pytest.fixture
def fake_ray(tmp_path):
    """`fake_ray(*args, broken_import=False, **env)` runs benchmark.py against the fake ray package; returns
    (CompletedProcess, [logged calls])."""
    pkg = tmp_path / "fake_ray_site" / "ray"
    pkg.mkdir(parents=True)
    log = tmp_path / "fake_ray_calls.jsonl"

    def run(*args, broken_import=False, **extra_env):
        (pkg / "__init__.py").write_text("raise ImportError('fake: ray is broken here')\n" if broken_import else FAKE_RAY)
        if log.exists():
            log.unlink()
        env = dict(os.environ, FAKE_RAY_LOG=str(log), **extra_env)
        env["PYTHONPATH"] = os.pathsep.join([str(pkg.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        r = run_benchmark("--backend", "ray", *args, env=env)
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return r, calls
    return run


# RAY BACKEND
def test_ray_tasks_reserve_cpus_per_run_the_local_instance_has_ray_num_cpus_and_ray_never_retries(fake_ray, tmp_path):
    """--cpus-per-run is each task's CPU reservation, --ray-num-cpus the local instance's CPUs (--workers plays no
    part), max_retries=0 keeps Ray from re-running a task behind the runner's back, and the runner shuts Ray down
    once, after the last task."""
    ok = write_script(tmp_path / "ok.py", "os.makedirs(os.path.join(a.runs_dir, 'run'))\n")
    out = tmp_path / "sweep"
    r, calls = fake_ray("--cpus-per-run", "0.5", "--ray-num-cpus", "3", "--workers", "7", "--command", f"python {ok}",
                        "--num-seeds", "2", "--output", str(out), "--cwd", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert [c["event"] for c in calls] == ["init", "remote", "task", "task", "shutdown"]
    assert calls[0]["kwargs"] == {"num_cpus": 3, "include_dashboard": False, "log_to_driver": False}
    assert calls[1]["options"] == {"num_cpus": 0.5, "max_retries": 0}
    assert sorted((c["run_key"], c["attempt"]) for c in calls if c["event"] == "task") == [
        ("c0__g0_base__s1", 1), ("c0__g0_base__s2", 1)]
    assert sorted((rec["seed"], rec["exit_code"], rec["attempt"]) for rec in manifest(out)) == [(1, 0, 1), (2, 0, 1)]


def test_ray_address_connects_to_that_cluster_instead_of_starting_one(fake_ray, tmp_path):
    ok = write_script(tmp_path / "ok.py", "")
    r, calls = fake_ray("--ray-address", "10.1.2.3:6379", "--cpus-per-run", "2", "--command", f"python {ok}",
                        "--num-seeds", "1", "--output", str(tmp_path / "sweep"), "--cwd", str(tmp_path))
    assert r.returncode == 0, r.stderr
    (init,) = [c for c in calls if c["event"] == "init"]
    # no num_cpus: a cluster's size is not ours to set
    assert init["kwargs"] == {"address": "10.1.2.3:6379", "include_dashboard": False, "log_to_driver": False}
    assert [c["options"] for c in calls if c["event"] == "remote"] == [{"num_cpus": 2.0, "max_retries": 0}]


def test_a_dead_ray_worker_is_a_numbered_failed_attempt_and_the_retry_gets_the_next_number(fake_ray, tmp_path):
    """Attempt 1 exits 1, attempt 2's Ray task raises (a dead worker: no log, no exit code), attempt 3 succeeds.
    Each Ray task must be told its own attempt number (its log name) and the manifest must record 1, 2, 3."""
    flaky = write_script(tmp_path / "flaky.py",
                         "m = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tried')\n"
                         "if not os.path.exists(m):\n    open(m, 'w').close(); sys.exit(1)\n"
                         "os.makedirs(os.path.join(a.runs_dir, 'run'))\n")
    out = tmp_path / "sweep"
    r, calls = fake_ray("--command", f"python {flaky}", "--num-seeds", "1", "--retries", "2", "--output", str(out),
                        "--cwd", str(tmp_path), FAKE_RAY_TASK_RAISES="2")
    assert r.returncode == 0, r.stderr
    assert [c["attempt"] for c in calls if c["event"] == "task"] == [1, 2, 3]
    records = manifest(out)
    assert [(rec["attempt"], rec["exit_code"]) for rec in records] == [(1, 1), (2, -1), (3, 0)]
    key = records[0]["run_key"]
    died = records[1]
    assert died["error"] == "RuntimeError: fake worker died" and died["run_dirs"] == [] and died["wall_time_s"] is None
    assert [os.path.basename(rec["log_path"]) for rec in records] == [f"{key}.attempt{k}.log" for k in (1, 2, 3)]
    # the dead attempt never wrote a log; the others each kept their own
    assert sorted(os.listdir(out / "logs")) == [f"{key}.attempt1.log", f"{key}.attempt3.log"]
    assert records[2]["run_dirs"] == [os.path.join(records[2]["runs_dir"], "run")]
    assert json.loads((out / "markers" / f"{key}.json").read_text())["attempt"] == 3


@pytest.mark.parametrize("address,needle", [
    (None, "could not start a local Ray instance: ConnectionError: fake: nothing listens there"),
    ("10.1.2.3:6379", "could not connect to the Ray cluster at 10.1.2.3:6379: ConnectionError"),
    ("broken import", "ray is not installed (fake: ray is broken here)"),
])
def test_ray_that_cannot_start_is_exit_3_with_one_line_and_nothing_run(fake_ray, tmp_path, address, needle):
    ok = write_script(tmp_path / "ok.py", "open(os.path.join(os.path.dirname(__file__), 'ran'), 'w').close()\n")
    out = tmp_path / "sweep"
    flags = ["--ray-address", address] if address and address != "broken import" else []
    r, calls = fake_ray(*flags, "--command", f"python {ok}", "--num-seeds", "1", "--output", str(out),
                        "--cwd", str(tmp_path), broken_import=address == "broken import", FAKE_RAY_INIT_FAILS="1")
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("benchmark.py: error: ") and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "ran").exists() and not (out / "manifest.jsonl").exists()
    assert not [c for c in calls if c["event"] in ("remote", "task")]


def test_ray_address_needs_the_ray_backend(tmp_path):
    r = run_benchmark("--command", "python x.py", "--ray-address", "auto", "--output", str(tmp_path / "sweep"),
                      "--dry-run")
    assert r.returncode == 2 and r.stderr.strip() == "benchmark.py: error: --ray-address needs --backend ray"
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("flags", [["--ray-num-cpus", "0"], ["--ray-num-cpus", "1", "--cpus-per-run", "2"]])
def test_an_unschedulable_cpu_reservation_is_refused_instead_of_hanging(fake_ray, tmp_path, flags):
    """Found by the session-17 audit: with --ray-num-cpus 0, or --cpus-per-run above --ray-num-cpus (or above the
    machine's CPUs when it is unset), real Ray keeps every task pending forever: benchmark.py printed nothing and never
    exited (ray 2.60: `--backend ray --ray-num-cpus 1 --cpus-per-run 1.5` still ran after 90 s). Now a one-line error
    before anything runs; the fake exits 99 where Ray would hang, so a regression does not hang this test."""
    ok = write_script(tmp_path / "ok.py", "")
    r, calls = fake_ray(*flags, "--command", f"python {ok}", "--num-seeds", "1", "--output", str(tmp_path / "sweep"),
                        "--cwd", str(tmp_path))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith("benchmark.py: error: ") and len(r.stderr.strip().splitlines()) == 1
    assert not [c for c in calls if c["event"] == "task"]
    # a reservation the instance can hold is accepted
    r, calls = fake_ray("--ray-num-cpus", "2", "--cpus-per-run", "1.5", "--command", f"python {ok}", "--num-seeds",
                        "1", "--output", str(tmp_path / "sweep_ok"), "--cwd", str(tmp_path))
    assert r.returncode == 0, r.stderr


def test_an_attempt_whose_ray_task_died_keeps_its_number_across_invocations(fake_ray, tmp_path):
    """Found by the session-17 audit: a Ray task that raised (a dead worker) never wrote its log, and numbering
    counted logs only, so the next invocation (--resume) numbered its attempt 1 again: two manifest records of one
    run with attempt 1, the first one's log_path pointing at the second one's log. The manifest counts too now."""
    ok = write_script(tmp_path / "ok.py", "")
    out = tmp_path / "sweep"
    args = ["--command", f"python {ok}", "--num-seeds", "1", "--output", str(out), "--cwd", str(tmp_path), "--resume"]
    r, _ = fake_ray(*args, FAKE_RAY_TASK_RAISES="1")
    assert r.returncode == 1, r.stderr
    r, _ = fake_ray(*args)
    assert r.returncode == 0, r.stderr
    assert [(rec["attempt"], rec["exit_code"]) for rec in manifest(out)] == [(1, -1), (2, 0)]


# ATTEMPT NUMBERING
def test_the_next_attempt_follows_the_highest_earlier_attempt_of_that_run_only(tmp_path):
    """Numbering continues after the highest attempt log of the same run key, even if an earlier log was deleted
    (counting logs would reuse attempt 3 and overwrite its log), and ignores other runs' logs: c11's keys begin
    with c1's text, and a renamed log (.bak) is not an attempt."""
    ok = write_script(tmp_path / "ok.py", "print('new attempt of', a.tag)\n")
    out = tmp_path / "sweep"
    logs = out / "logs"
    logs.mkdir(parents=True)
    earlier = {"c0__g0_base__s1.attempt2.log": "c0 attempt 2",
               "c1__g0_base__s1.attempt1.log": "c1 attempt 1", "c1__g0_base__s1.attempt3.log": "c1 attempt 3",
               "c11__g0_base__s1.attempt7.log": "another sweep's c11", "c1__g0_base__s1.attempt9.log.bak": "renamed",
               "xc1__g0_base__s1.attempt8.log": "not a run of this sweep"}
    for name, text in earlier.items():
        (logs / name).write_text(text)
    r = run_benchmark("--command", f"python {ok} --tag zero", f"python {ok} --tag one", "--num-seeds", "1",
                      "--output", str(out))
    assert r.returncode == 0, r.stderr
    attempts = {rec["run_key"]: rec["attempt"] for rec in manifest(out)}
    assert attempts == {"c0__g0_base__s1": 3, "c1__g0_base__s1": 4}
    for name, text in earlier.items():
        assert (logs / name).read_text() == text, f"{name} was overwritten"
    assert "new attempt of one" in (logs / "c1__g0_base__s1.attempt4.log").read_text()
    assert "new attempt of zero" in (logs / "c0__g0_base__s1.attempt3.log").read_text()


def test_resume_continues_the_numbering_and_gives_each_invocation_its_own_retries(tmp_path):
    """--retries N is N more attempts per invocation: a run that failed attempts 1 and 2 in a first invocation and
    is resumed with --retries 1 gets attempt 3 and, when that fails, attempt 4 (which succeeds here). A budget
    read from the attempt number would give the resumed run no retry at all."""
    script = write_script(tmp_path / "fails_thrice.py",
                          "c = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'count')\n"
                          "n = int(open(c).read()) + 1 if os.path.exists(c) else 1\n"
                          "open(c, 'w').write(str(n))\n"
                          "sys.exit(1 if n <= 3 else 0)\n")
    out = tmp_path / "sweep"
    args = ["--command", f"python {script}", "--num-seeds", "1", "--retries", "1", "--output", str(out)]
    r = run_benchmark(*args)
    assert r.returncode == 1 and "(exit code 1, attempt 2)" in r.stderr, r.stderr
    r = run_benchmark(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert [(rec["attempt"], rec["exit_code"]) for rec in manifest(out)] == [(1, 1), (2, 1), (3, 1), (4, 0)]
    key = manifest(out)[0]["run_key"]
    assert sorted(os.listdir(out / "logs")) == [f"{key}.attempt{k}.log" for k in (1, 2, 3, 4)]
    assert (tmp_path / "count").read_text() == "4"


# LEARNING-CURVE PLOTS
SMOOTH = 3
SERIES = {  # (command index, grid index) -> method label, grid
    (0, 0): ("m0", "--lr 1"), (0, 1): ("m0", "--lr 2"), (1, 0): ("m1", "--lr 1")}
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
    return np.array([np.mean(values[max(0, k - window + 1): k + 1]) for k in range(len(values))])


@pytest.fixture(scope="module")
def curve_sweep(tmp_path_factory):
    """Two methods, m0 at two grid points and m1 at one, two seeds each; seed 1 logs episodes at steps 10..209,
    seed 2 at 0..250, so the common grid is 10..209 (200 points: exactly the integers). Mode 1 is logged only by
    m0 --lr 1 seed 1."""
    from torch.utils.tensorboard import SummaryWriter

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
            records.append({"run_key": key, "command_index": ci, "num_commands": 2, "command": f"python m{ci}.py",
                            "grid_index": gi, "grid": grid, "seed": seed, "exit_code": 0, "attempt": 1,
                            "wall_time_s": 1.0, "runs_dir": str(run_dir.parent), "run_dirs": [str(run_dir)]})
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
            out[f"{method} {grid_flags} (n={len(curves)})"] = (grid, curves.mean(0), np.sqrt(((curves - curves.mean(0)) ** 2).mean(0)))
    return out


def test_learning_curves_plot_each_method_and_grid_point_smoothed_against_the_global_step(curve_sweep, tmp_path,
                                                                                         monkeypatch):
    """The data in every learning-curve figure: one line per method x grid point (named with the runs that logged the
    tag), x = the common step grid from the latest first step to the earliest last step, y = the mean over seeds of
    each seed's running mean of --smooth episodes, every point to the last, a band of mean +- 1 population std, the
    mode-k figure drawn from the mode-k tag, and axis labels that say what is drawn."""
    import matplotlib.axes
    import matplotlib.figure

    report = load(REPORT)
    saved, bands = {}, {}
    real_savefig, real_fill_between = matplotlib.figure.Figure.savefig, matplotlib.axes.Axes.fill_between

    def savefig(self, path, *args, **kwargs):
        saved[os.path.basename(path)] = self
        return real_savefig(self, path, *args, **kwargs)

    def fill_between(self, x, y1, y2=0, **kwargs):
        bands.setdefault(id(self), []).append((np.asarray(x), np.asarray(y1), np.asarray(y2)))
        return real_fill_between(self, x, y1, y2, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", fill_between)
    result = report.build_report([str(curve_sweep)], str(tmp_path / "report"), {0: "m0", 1: "m1"}, last_n=5,
                                 smooth=SMOOTH, title="T")
    files = {"learning_curve.png": "charts/episodic_return", "learning_curve_mode0.png": "charts/episodic_return_mode0",
             "learning_curve_mode1.png": "charts/episodic_return_mode1"}
    assert result["plots"] == list(files) and sorted(saved) == sorted(files)
    for name, tag in files.items():
        ax, = saved[name].axes
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
                [(line.get_label(), expected[line.get_label()]) for line in ax.get_lines()], drawn_bands):
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
