"""Tests of benchmark.py's Ray backend (--backend ray, --cpus-per-run, --ray-num-cpus, --ray-address).

One test runs a sweep on a real local Ray instance, which keeps the fake below honest about Ray's API. The others run
benchmark.py as a subprocess with a fake `ray` package first on PYTHONPATH: it records what the runner asks of Ray
(ray.init's and ray.remote's arguments, every task's attempt number, the shutdown) and runs each task synchronously
in the runner's process.
"""

import json
import os

import pytest
from benchmark_helpers import manifest, run_benchmark, write_script
from helpers import SCRIPT_ENV, assert_one_line_error


def test_ray_backend_runs_commands_and_reports_failures(tmp_path):
    ok = write_script(tmp_path / "ok.py", "print('ran seed', a.seed, 'in', os.getcwd())\n")
    bad = write_script(tmp_path / "bad.py", "sys.exit(4)\n")
    out = tmp_path / "sweep"
    r = run_benchmark(
        "--backend",
        "ray",
        "--ray-num-cpus",
        "2",
        "--command",
        f"python {ok}",
        f"python {bad}",
        "--num-seeds",
        "1",
        "--output",
        str(out),
        "--cwd",
        str(tmp_path),
    )
    if r.returncode == 3 and "could not start a local Ray instance" in r.stderr:
        pytest.skip(f"Ray cannot start on this machine: {r.stderr.strip()[-300:]}")
    assert r.returncode == 1, r.stderr
    records = {rec["command_index"]: rec for rec in manifest(out)}
    assert records[0]["exit_code"] == 0 and records[1]["exit_code"] == 4
    with open(records[0]["log_path"]) as f:
        assert f"ran seed 1 in {tmp_path}" in f.read()
    assert f"FAILED {records[1]['run_key']}" in r.stderr


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
        env = dict(SCRIPT_ENV, FAKE_RAY_LOG=str(log), **extra_env)
        python_path = [str(pkg.parent)]
        if os.environ.get("PYTHONPATH"):
            python_path.append(os.environ["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(python_path)
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
    r, calls = fake_ray(
        "--cpus-per-run",
        "0.5",
        "--ray-num-cpus",
        "3",
        "--workers",
        "7",
        "--command",
        f"python {ok}",
        "--num-seeds",
        "2",
        "--output",
        str(out),
        "--cwd",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    assert [c["event"] for c in calls] == ["init", "remote", "task", "task", "shutdown"]
    assert calls[0]["kwargs"] == {"num_cpus": 3, "include_dashboard": False, "log_to_driver": False}
    assert calls[1]["options"] == {"num_cpus": 0.5, "max_retries": 0}
    assert sorted((c["run_key"], c["attempt"]) for c in calls if c["event"] == "task") == [
        ("c0__g0_base__s1", 1),
        ("c0__g0_base__s2", 1),
    ]
    assert sorted((rec["seed"], rec["exit_code"], rec["attempt"]) for rec in manifest(out)) == [(1, 0, 1), (2, 0, 1)]


def test_ray_address_connects_to_that_cluster_instead_of_starting_one(fake_ray, tmp_path):
    ok = write_script(tmp_path / "ok.py", "")
    r, calls = fake_ray(
        "--ray-address",
        "10.1.2.3:6379",
        "--cpus-per-run",
        "2",
        "--command",
        f"python {ok}",
        "--num-seeds",
        "1",
        "--output",
        str(tmp_path / "sweep"),
        "--cwd",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    (init,) = [c for c in calls if c["event"] == "init"]
    # no num_cpus: a cluster's size is not ours to set
    assert init["kwargs"] == {"address": "10.1.2.3:6379", "include_dashboard": False, "log_to_driver": False}
    assert [c["options"] for c in calls if c["event"] == "remote"] == [{"num_cpus": 2.0, "max_retries": 0}]


def test_a_dead_ray_worker_is_a_numbered_failed_attempt_and_the_retry_gets_the_next_number(fake_ray, tmp_path):
    """Attempt 1 exits 1, attempt 2's Ray task raises (a dead worker: no log, no exit code), attempt 3 succeeds.
    Each Ray task must be told its own attempt number (its log name) and the manifest must record 1, 2, 3."""
    flaky = write_script(
        tmp_path / "flaky.py",
        "m = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tried')\n"
        "if not os.path.exists(m):\n    open(m, 'w').close(); sys.exit(1)\n"
        "os.makedirs(os.path.join(a.runs_dir, 'run'))\n",
    )
    out = tmp_path / "sweep"
    r, calls = fake_ray(
        "--command",
        f"python {flaky}",
        "--num-seeds",
        "1",
        "--retries",
        "2",
        "--output",
        str(out),
        "--cwd",
        str(tmp_path),
        FAKE_RAY_TASK_RAISES="2",
    )
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


@pytest.mark.parametrize(
    "address,needle",
    [
        (None, "could not start a local Ray instance: ConnectionError: fake: nothing listens there"),
        ("10.1.2.3:6379", "could not connect to the Ray cluster at 10.1.2.3:6379: ConnectionError"),
        ("broken import", "ray is not installed (fake: ray is broken here)"),
    ],
)
def test_ray_that_cannot_start_is_exit_3_with_one_line_and_nothing_run(fake_ray, tmp_path, address, needle):
    ok = write_script(tmp_path / "ok.py", "open(os.path.join(os.path.dirname(__file__), 'ran'), 'w').close()\n")
    out = tmp_path / "sweep"
    flags = ["--ray-address", address] if address and address != "broken import" else []
    r, calls = fake_ray(
        *flags,
        "--command",
        f"python {ok}",
        "--num-seeds",
        "1",
        "--output",
        str(out),
        "--cwd",
        str(tmp_path),
        broken_import=address == "broken import",
        FAKE_RAY_INIT_FAILS="1",
    )
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("benchmark.py: error: ") and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "ran").exists() and not (out / "manifest.jsonl").exists()
    assert not [c for c in calls if c["event"] in ("remote", "task")]


def test_ray_address_needs_the_ray_backend(tmp_path):
    r = run_benchmark("--command", "python x.py", "--ray-address", "auto", "--output", str(tmp_path / "sweep"), "--dry-run")
    assert_one_line_error(r, "--ray-address needs --backend ray")
    assert r.stderr.strip() == "benchmark.py: error: --ray-address needs --backend ray"
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("flags", [["--ray-num-cpus", "0"], ["--ray-num-cpus", "1", "--cpus-per-run", "2"]])
def test_an_unschedulable_cpu_reservation_is_refused_instead_of_hanging(fake_ray, tmp_path, flags):
    """With --ray-num-cpus 0, or --cpus-per-run above --ray-num-cpus (or above the machine's CPUs when it is unset),
    real Ray keeps every task pending forever without a word (ray 2.60). The runner refuses with a one-line error
    before anything runs; the fake exits 99 where Ray would hang, so a defect here does not hang the test."""
    ok = write_script(tmp_path / "ok.py", "")
    r, calls = fake_ray(
        *flags, "--command", f"python {ok}", "--num-seeds", "1", "--output", str(tmp_path / "sweep"), "--cwd", str(tmp_path)
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith("benchmark.py: error: ") and len(r.stderr.strip().splitlines()) == 1
    assert not [c for c in calls if c["event"] == "task"]
    # a reservation the instance can hold is accepted
    r, calls = fake_ray(
        "--ray-num-cpus",
        "2",
        "--cpus-per-run",
        "1.5",
        "--command",
        f"python {ok}",
        "--num-seeds",
        "1",
        "--output",
        str(tmp_path / "sweep_ok"),
        "--cwd",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr


def test_an_attempt_whose_ray_task_died_keeps_its_number_across_invocations(fake_ray, tmp_path):
    """A Ray task that raised (a dead worker) never writes its log, so numbering must count the manifest's attempts
    too: counting logs alone would number the next invocation's attempt 1 again, and two manifest records of one
    run would share attempt 1 and one log path."""
    ok = write_script(tmp_path / "ok.py", "")
    out = tmp_path / "sweep"
    args = ["--command", f"python {ok}", "--num-seeds", "1", "--output", str(out), "--cwd", str(tmp_path), "--resume"]
    r, _ = fake_ray(*args, FAKE_RAY_TASK_RAISES="1")
    assert r.returncode == 1, r.stderr
    r, _ = fake_ray(*args)
    assert r.returncode == 0, r.stderr
    assert [(rec["attempt"], rec["exit_code"]) for rec in manifest(out)] == [(1, -1), (2, 0)]
