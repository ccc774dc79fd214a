"""Tests of benchmark/benchmark.py, the runner: expansion of commands x grid x seeds, dry run, one-line errors, failures,
retries, resume, a killed sweep, and attempt numbering. The commands are tiny fake scripts (write_script)."""

import os
import subprocess
import sys

import pytest
from benchmark_helpers import benchmark_path, load_benchmark_script, manifest, run_benchmark, write_script
from helpers import REPO, assert_one_line_error

benchmark = load_benchmark_script("benchmark")


def test_expand_command_grid_seeds(tmp_path):
    specs = benchmark.expand(["python a.py --x 1", "python b.py"], ["--lr 1 2 3", "--hide | "], [5, 6], str(tmp_path), REPO)
    assert len(specs) == 2 * 3 * 2 * 2
    assert len({s.run_key for s in specs}) == len(specs)
    assert len({s.runs_dir for s in specs}) == len(specs)
    by_key = {(s.command_index, tuple(s.grid), s.seed): s for s in specs}
    s = by_key[(0, ("--lr", "2", "--hide"), 6)]
    assert s.argv == ["python", "a.py", "--x", "1", "--lr", "2", "--hide", "--seed", "6", "--runs-dir", s.runs_dir]
    assert s.runs_dir == os.path.join(str(tmp_path), "runs", s.run_key)
    assert by_key[(1, ("--lr", "3"), 5)].argv[:4] == ["python", "b.py", "--lr", "3"]
    assert benchmark.parse_grid_spec("--modes-preset seed3 inverted4") == [
        ["--modes-preset", "seed3"],
        ["--modes-preset", "inverted4"],
    ]
    with pytest.raises(ValueError):
        benchmark.parse_grid_spec("--hide-velocity")
    # a flag read as a value would silently launch a wrong command ("--modes-preset --hide-velocity")
    with pytest.raises(ValueError, match="puts a flag among the values"):
        benchmark.parse_grid_spec("--modes-preset seed3 --hide-velocity")


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    out = tmp_path / "sweep"
    r = run_benchmark(
        "--command",
        "python x.py --total-timesteps 10",
        "--grid",
        "--modes-preset seed3 inverted4",
        "--num-seeds",
        "2",
        "--start-seed",
        "7",
        "--dry-run",
        "--output",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4
    for preset in ("seed3", "inverted4"):
        for seed in (7, 8):
            assert sum(f"--modes-preset {preset} --seed {seed} --runs-dir" in line for line in lines) == 1
    assert all(line.startswith("python x.py --total-timesteps 10 ") for line in lines)
    assert not out.exists()


def test_env_ids_add_a_grid_dimension_beside_the_grid(tmp_path):
    """--env-ids is one more grid dimension: with --grid it must form the Cartesian product, not replace it."""
    r = run_benchmark(
        "--command",
        "python x.py",
        "--env-ids",
        "EnvA",
        "EnvB",
        "--grid",
        "--lr 1 2",
        "--num-seeds",
        "1",
        "--output",
        str(tmp_path / "sweep"),
        "--dry-run",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4
    for env in ("EnvA", "EnvB"):
        for lr in ("1", "2"):
            assert sum(f"--env-id {env} --lr {lr} --seed 1 " in line for line in lines) == 1


def test_the_same_command_line_twice_is_refused(tmp_path):
    """Two grid values or commands that expand to one command line would be pooled by the report as extra seeds."""
    for flags in (["--command", "python x.py", "--grid", "--lr 1 1"], ["--command", "python x.py", "python x.py"]):
        r = run_benchmark(*flags, "--output", str(tmp_path / "sweep"), "--dry-run")
        assert_one_line_error(r, "duplicate runs")
    assert not (tmp_path / "sweep").exists()


def test_bad_flags_exit_2_with_one_line():
    r = run_benchmark("--command", "python x.py", "--grid=--flag-without-values", "--dry-run")
    assert_one_line_error(r, "grid spec '--flag-without-values' must be")
    assert r.stderr.startswith("benchmark.py: error:")


def test_bad_runner_flags_are_one_line_errors_before_any_run(tmp_path):
    """Each would otherwise be a traceback (an --output that is a file, an unbalanced quote), a sweep of runs that all
    fail (--cwd missing, a negative seed the scripts refuse) or a Ray reservation of NaN CPUs."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = {
        ("--output", str(a_file)): "is a file",
        ("--cwd", str(tmp_path / "missing")): "is not a directory",
        ("--cpus-per-run", "nan"): "--cpus-per-run must be a finite number > 0, got nan",
        ("--start-seed", "-1"): "--start-seed must be >= 0, got -1",
        ("--command", "python x.py --tag 'open"): "check its quotes",
        ("--grid", "--tag 'a | b"): "check its quotes",
    }
    for flags, message in cases.items():
        command = [] if flags[0] == "--command" else ["--command", "python x.py"]
        output = [] if flags[0] == "--output" else ["--output", str(tmp_path / "sweep")]
        r = run_benchmark(*command, *flags, *output, "--num-seeds", "1")
        assert_one_line_error(r, message)
    assert not (tmp_path / "sweep").exists() and a_file.read_text() == ""


def test_failing_command_exits_nonzero_and_is_named(tmp_path):
    ok = write_script(tmp_path / "ok.py", "os.makedirs(os.path.join(a.runs_dir, f'run_{a.seed}'))\n")
    bad = write_script(tmp_path / "bad.py", "print('boom on seed', a.seed); sys.exit(3)\n")
    out = tmp_path / "sweep"
    r = run_benchmark("--command", f"python {ok}", f"python {bad}", "--num-seeds", "2", "--workers", "2", "--output", str(out))
    assert r.returncode == 1
    records = {rec["run_key"]: rec for rec in manifest(out)}
    failed = [rec for rec in records.values() if rec["exit_code"] != 0]
    assert sorted(rec["seed"] for rec in failed) == [1, 2] and all(rec["exit_code"] == 3 for rec in failed)
    for rec in failed:
        assert f"FAILED {rec['run_key']}" in r.stderr and rec["log_path"] in r.stderr
        with open(rec["log_path"]) as f:
            assert f"boom on seed {rec['seed']}" in f.read()
    succeeded = [rec for rec in records.values() if rec["exit_code"] == 0]
    assert len(succeeded) == 2
    for rec in succeeded:
        assert rec["run_dirs"] == [os.path.join(rec["runs_dir"], f"run_{rec['seed']}")]
        assert rec["wall_time_s"] >= 0 and rec["attempt"] == 1
        assert os.path.exists(out / "markers" / f"{rec['run_key']}.json")
    assert not any((out / "markers" / f"{rec['run_key']}.json").exists() for rec in failed)


def test_retries_rerun_a_failed_run(tmp_path):
    # fails on its first attempt, succeeds once the marker from that attempt exists
    flaky = write_script(
        tmp_path / "flaky.py",
        "m = os.path.join(os.path.dirname(os.path.abspath(__file__)), f'tried_{a.tag}')\n"
        "if not os.path.exists(m):\n    open(m, 'w').close(); sys.exit(1)\n",
    )
    r = run_benchmark("--command", f"python {flaky} --tag without", "--num-seeds", "1", "--output", str(tmp_path / "a"))
    assert r.returncode == 1
    r = run_benchmark(
        "--command", f"python {flaky} --tag with", "--num-seeds", "1", "--retries", "2", "--output", str(tmp_path / "b")
    )
    assert r.returncode == 0, r.stderr
    records = manifest(tmp_path / "b")
    assert [(rec["attempt"], rec["exit_code"]) for rec in records] == [(1, 1), (2, 0)]
    assert records[0]["log_path"] != records[1]["log_path"]
    assert all(os.path.exists(rec["log_path"]) for rec in records)


def test_retries_means_that_many_more_attempts_and_no_more(tmp_path):
    """--retries 1 must give a run that fails once exactly one more attempt (which succeeds), and a run that always
    fails exactly two attempts in all; an off-by-one in the retry count gives the flaky run no second chance or the
    broken one a third."""
    flaky = write_script(
        tmp_path / "flaky.py",
        "m = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tried')\n"
        "if not os.path.exists(m):\n    open(m, 'w').close(); sys.exit(1)\n",
    )
    bad = write_script(tmp_path / "bad.py", "sys.exit(5)\n")
    out = tmp_path / "sweep"
    r = run_benchmark(
        "--command", f"python {flaky}", f"python {bad}", "--num-seeds", "1", "--retries", "1", "--output", str(out)
    )
    assert r.returncode == 1, r.stderr
    attempts = {}
    for rec in manifest(out):
        attempts.setdefault(rec["command_index"], []).append((rec["attempt"], rec["exit_code"]))
    assert attempts == {0: [(1, 1), (2, 0)], 1: [(1, 5), (2, 5)]}
    assert "FAILED c1__" in r.stderr and "FAILED c0__" not in r.stderr


def test_resume_skips_completed_runs(tmp_path):
    # appends its seed to a ledger; seed 2 fails until the file `fixed` exists
    script = write_script(
        tmp_path / "ledger.py",
        "d = os.path.dirname(os.path.abspath(__file__))\n"
        "open(os.path.join(d, 'ledger'), 'a').write(f'{a.seed}{a.tag}\\n')\n"
        "sys.exit(1 if a.seed == 2 and not os.path.exists(os.path.join(d, 'fixed')) else 0)\n",
    )
    out = str(tmp_path / "sweep")
    ledger = tmp_path / "ledger"
    assert run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out).returncode == 1
    assert sorted(ledger.read_text().split()) == ["1", "2"]
    # a dry run with --resume tells which runs it would skip (seed 1 succeeded, seed 2 failed) and runs nothing
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out, "--resume", "--dry-run")
    marked = [line for line in r.stdout.splitlines() if "--resume skips it" in line]
    assert len(marked) == 1 and "--seed 1 " in marked[0] and "1 already complete" in r.stderr
    assert sorted(ledger.read_text().split()) == ["1", "2"]
    (tmp_path / "fixed").touch()
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out, "--resume")
    assert r.returncode == 0, r.stderr
    assert sorted(ledger.read_text().split()) == ["1", "2", "2"]
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out, "--resume")
    assert r.returncode == 0 and "every run is complete" in r.stderr
    assert sorted(ledger.read_text().split()) == ["1", "2", "2"]
    # a changed command line is a different run: its old marker must not skip it
    r = run_benchmark("--command", f"python {script} --tag x", "--num-seeds", "2", "--output", out, "--resume")
    assert r.returncode == 0
    assert sorted(ledger.read_text().split()) == ["1", "1x", "2", "2", "2x"]


def test_a_rerun_that_fails_loses_its_old_marker_so_resume_runs_it_again(tmp_path):
    """A run re-made without --resume starts from an emptied directory; if it then fails, the marker of its earlier
    success must not make the next --resume skip it (the report would read the emptied directory)."""
    script = write_script(
        tmp_path / "flip.py",
        "d = os.path.dirname(os.path.abspath(__file__))\n"
        "open(os.path.join(d, 'ledger'), 'a').write(f'{a.seed}\\n')\n"
        "os.makedirs(os.path.join(a.runs_dir, 'run'))\n"
        "sys.exit(3 if os.path.exists(os.path.join(d, 'broken')) else 0)\n",
    )
    out = str(tmp_path / "sweep")
    assert run_benchmark("--command", f"python {script}", "--num-seeds", "1", "--output", out).returncode == 0
    (tmp_path / "broken").touch()
    assert run_benchmark("--command", f"python {script}", "--num-seeds", "1", "--output", out).returncode == 1
    (tmp_path / "broken").unlink()
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "1", "--output", out, "--resume")
    assert r.returncode == 0 and "skipping" not in r.stderr, r.stderr
    assert (tmp_path / "ledger").read_text().split() == ["1", "1", "1"]


@pytest.mark.timeout(120)
def test_killed_sweep_stops_its_runs_and_resume_reruns_them(tmp_path):
    # the run reports its pid through a FIFO (so the test knows it started, without polling), then blocks
    script = write_script(
        tmp_path / "blocking.py",
        "d = os.path.dirname(os.path.abspath(__file__))\n"
        "if not os.path.exists(os.path.join(d, 'release')):\n"
        "    open(os.path.join(d, 'ready'), 'w').write(str(os.getpid()))\n"
        "    open(os.path.join(d, 'hold')).read()\n",
    )
    os.mkfifo(tmp_path / "ready")
    os.mkfifo(tmp_path / "hold")
    out = tmp_path / "sweep"
    flags = ["--command", f"python {script}", "--num-seeds", "1", "--output", str(out)]
    command = [sys.executable, benchmark_path("benchmark"), "--no-progress", *flags]
    runner = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(tmp_path / "ready") as f:
        pid = int(f.read())
    runner.terminate()
    runner.communicate(timeout=60)
    assert runner.returncode != 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not (out / "markers").exists() or not os.listdir(out / "markers")
    (tmp_path / "release").touch()
    r = run_benchmark(*flags, "--resume")
    assert r.returncode == 0, r.stderr
    (record,) = manifest(out)
    assert record["attempt"] == 2 and record["exit_code"] == 0
    assert sorted(os.listdir(out / "logs")) == [f"{record['run_key']}.attempt1.log", f"{record['run_key']}.attempt2.log"]


def test_the_next_attempt_follows_the_highest_earlier_attempt_of_that_run_only(tmp_path):
    """Numbering continues after the highest attempt log of the same run key, even if an earlier log was deleted
    (counting logs would reuse attempt 3 and overwrite its log), and ignores other runs' logs: c11's keys begin
    with c1's text, and a renamed log (.bak) is not an attempt."""
    ok = write_script(tmp_path / "ok.py", "print('new attempt of', a.tag)\n")
    out = tmp_path / "sweep"
    logs = out / "logs"
    logs.mkdir(parents=True)
    earlier = {
        "c0__g0_base__s1.attempt2.log": "c0 attempt 2",
        "c1__g0_base__s1.attempt1.log": "c1 attempt 1",
        "c1__g0_base__s1.attempt3.log": "c1 attempt 3",
        "c11__g0_base__s1.attempt7.log": "another sweep's c11",
        "c1__g0_base__s1.attempt9.log.bak": "renamed",
        "xc1__g0_base__s1.attempt8.log": "not a run of this sweep",
    }
    for name, text in earlier.items():
        (logs / name).write_text(text)
    r = run_benchmark(
        "--command", f"python {ok} --tag zero", f"python {ok} --tag one", "--num-seeds", "1", "--output", str(out)
    )
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
    script = write_script(
        tmp_path / "fails_thrice.py",
        "c = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'count')\n"
        "n = int(open(c).read()) + 1 if os.path.exists(c) else 1\n"
        "open(c, 'w').write(str(n))\n"
        "sys.exit(1 if n <= 3 else 0)\n",
    )
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
