"""Tests for benchmark/astral_study.sh (which runs each phase expands to, refused phases) and its criterion report
benchmark/astral_study_report.py (on a hand-made sweep whose verdicts are known)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "benchmark"))
import astral_study_report as report  # noqa: E402


def study(*args, **env):
    return subprocess.run(
        ["bash", "benchmark/astral_study.sh", *args, "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def commands(result):
    return [line for line in result.stdout.splitlines() if line.startswith("python cleanrl_astral/")]


def test_phases_expand_to_the_protocols_runs():
    a = commands(study("A"))
    assert len(a) == 30 and sum("--hide-velocity" in c for c in a) == 15
    assert {re.search(r"--seed (\d+)", c).group(1) for c in a} == {"1", "2", "3", "4", "5"}
    assert all("--modes-preset mirror4 --mode-share balanced" in c and "ppo_gru_baseline.py" in c for c in a)
    assert sum("--oracle" in c for c in a) == 10 and sum("--memory none" in c for c in a) == 10
    b1 = commands(study("B", ASTRAL_OBS="--hide-velocity"))
    assert len(b1) == 21 and {re.search(r"--seed (\d+)", c).group(1) for c in b1} == {"1", "2", "3"}
    assert sum("--lambda-supervised" in c for c in b1) == 3 and all("--hide-velocity" in c for c in b1)
    b2 = commands(study("B", "2", ASTRAL_OBS=""))
    assert "phase_B_round2" in b2[0]  # round 2 must not share round 1's run keys: benchmark.py would rerun over them
    assert len(b2) == 18 and {re.search(r"--num-abstractions (\d)", c).group(1) for c in b2} == {"2", "4", "8"}
    assert {re.findall(r"--lambda-consistency (\S+)", c)[-1] for c in b2} == {"0.01", "0.1"}
    assert all(len(re.findall("--lambda-consistency", c)) == 1 for c in b2)
    c = commands(study("C", ASTRAL_OBS="", ASTRAL_FROZEN="--hard-gate --num-abstractions 8"))
    assert len(c) == 30 and {int(re.search(r"--seed (\d+)", x).group(1)) for x in c} == set(range(6, 16))
    assert sum("--hard-gate --num-abstractions 8 --exp-name frozen" in x for x in c) == 10
    # the ceiling is the frozen configuration with the supervised gate
    assert sum("--hard-gate --num-abstractions 8 --lambda-supervised 1.0 --exp-name ceiling" in x for x in c) == 10
    one = commands(study("--one-seed", "17", ASTRAL_OBS="", ASTRAL_FROZEN="--hard-gate"))
    assert len(one) == 2 and all("--seed 17" in x for x in one) and sum("ppo_gru_baseline.py" in x for x in one) == 1


@pytest.mark.parametrize("args,env", [(["C"], {"ASTRAL_OBS": ""}), (["B"], {}), (["--one-seed", "3"], {"ASTRAL_OBS": ""})])
def test_phases_that_need_an_earlier_phases_choice_are_refused(args, env):
    result = study(*args, **env)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "before this phase" in result.stderr
    assert not commands(result)


def write_run(sweep, key, exp_name, seed, returns, nmi=None, wall=100.0, hide=True):
    """A finished run as benchmark.py leaves it: a marker naming its argv and run dir, and the run's eval.json."""
    run_dir = os.path.join(sweep, "runs", key, "run")
    os.makedirs(run_dir, exist_ok=True)
    per_mode = {str(k): {"deterministic": {"mean": r}} for k, r in enumerate(returns)}
    body = {"per_mode": per_mode} if nmi is None else {"per_mode": per_mode, "slots_deterministic": {"episode_nmi": nmi}}
    json.dump(body, open(os.path.join(run_dir, "eval.json"), "w"))
    argv = ["python", "x.py", "--modes-preset", "mirror4", *(["--hide-velocity"] if hide else []), "--exp-name", exp_name]
    os.makedirs(os.path.join(sweep, "markers"), exist_ok=True)
    json.dump(
        {"argv": argv, "run_dirs": [run_dir], "seed": seed, "wall_time_s": wall, "command": "x"},
        open(os.path.join(sweep, "markers", f"{key}.json"), "w"),
    )


def test_phase_c_criteria(tmp_path):
    sweep = str(tmp_path)
    for seed in range(10):
        write_run(sweep, f"b{seed}", "baseline", seed, [500, 500, 490, 500, 100], wall=100)
        # frozen: mode 1 misses 475 in 3 seeds (7/10 < 8/10); NMI >= 0.5 in 8 seeds
        write_run(
            sweep,
            f"f{seed}",
            "frozen",
            seed,
            [500, 400 if seed < 3 else 480, 480, 500, 300],
            nmi=0.9 if seed < 8 else 0.1,
            wall=120,
        )
        write_run(sweep, f"c{seed}", "ceiling", seed, [500, 500, 500, 500, 450], nmi=1.0, wall=130)
    groups = report.load_runs(sweep)
    assert set(groups) == {"baseline (hidden velocity)", "frozen (hidden velocity)", "ceiling (hidden velocity)"}
    assert (
        groups["frozen (hidden velocity)"][0]["held_out"] == [300] and len(groups["frozen (hidden velocity)"][0]["train"]) == 4
    )
    lines = report.criteria("C", groups)
    verdict = {
        re.search(r"^\w+ (\w+) .*criterion (\d)", line).groups(): line.split()[0] for line in lines if " criterion " in line
    }
    assert verdict == {("frozen", "1"): "FAIL", ("frozen", "2"): "PASS", ("ceiling", "1"): "PASS", ("ceiling", "2"): "PASS"}
    assert any("seeds per training mode >= 475: [10, 7, 10, 10]" in line for line in lines)
    # mean of mode 1 is 456: more than 25 below the baseline's 500
    assert any(line.startswith("FAIL frozen") and "baseline - 25: False" in line for line in lines)
    assert "PASS frozen (hidden velocity) wall time 1.20x" in "\n".join(lines)
    assert "FAIL ceiling (hidden velocity) wall time 1.30x" in "\n".join(lines)
    assert "| frozen (hidden velocity) | 1 | 500 / 400 / 480 / 500 | 300 | 0.90 |" in report.seed_rows(groups)
    table = "\n".join(report.table(groups))
    assert (
        "| frozen (hidden velocity) | 10 | m0 500 (10), m1 456 (7), m2 480 (10), m3 500 (10) | 300 | 0.74 (8) | 120 |" in table
    )


def test_phase_a_and_b_verdicts(tmp_path):
    a = str(tmp_path / "a")
    for seed in range(5):
        write_run(a, f"o{seed}", "oracle", seed, [500, 480, 500, 490, 50])
        write_run(a, f"n{seed}", "memoryless", seed, [300, 100, 400, 120, 20])
        write_run(a, f"f{seed}", "oracle", seed, [500, 300, 500, 500, 50], hide=False)
    lines = report.criteria("A", report.load_runs(a))
    assert lines[0].startswith("FAIL oracle:") and lines[1].startswith("PASS oracle (hidden velocity)")
    assert "below half the oracle's return on training modes [1, 3]" in lines[2]
    # full observation has no memoryless runs: no choice until both observations' controls have run
    assert lines[-1] == "observation for phases B and C: undecided (no oracle or no memoryless runs with full observation)"
    for seed in range(5):
        write_run(a, f"fn{seed}", "memoryless", seed, [50, 50, 50, 50, 50], hide=False)
        write_run(a, f"f{seed}", "oracle", seed, [500, 490, 500, 500, 50], hide=False)
    assert report.criteria("A", report.load_runs(a))[-1] == "observation for phases B and C: full observation"
    for seed in range(5):  # both pass: hidden velocity
        write_run(a, f"n{seed}", "memoryless", seed, [100, 100, 100, 100, 20])
    assert report.criteria("A", report.load_runs(a))[-1] == "observation for phases B and C: hidden velocity"
    for seed in range(5):  # neither passes: the oracle that solves more training modes
        write_run(a, f"n{seed}", "memoryless", seed, [300, 100, 400, 120, 20])
        write_run(a, f"fn{seed}", "memoryless", seed, [300, 300, 300, 300, 50], hide=False)
        write_run(a, f"o{seed}", "oracle", seed, [500, 100, 500, 100, 50])
    assert report.criteria("A", report.load_runs(a))[-1] == "observation for phases B and C: full observation"
    b = str(tmp_path / "b")
    for seed in range(3):
        write_run(b, f"p{seed}", "plan", seed, [500] * 5, nmi=0.05)
        write_run(b, f"h{seed}", "hard_gate", seed, [500] * 5, nmi=0.4 if seed else 0.1)
    for seed in range(3):  # the supervised ceiling's NMI never passes the screen: it is not a candidate
        write_run(b, f"c{seed}", "ceiling", seed, [500] * 5, nmi=1.0)
    line, frozen = report.criteria("B", report.load_runs(b))
    assert line.startswith("PASS") and "['hard_gate (hidden velocity)']" in line
    assert frozen == "configuration to freeze for phase C: hard_gate (hidden velocity)"
    write_run(b, "h1", "hard_gate", 1, [500] * 5, nmi=0.2)
    (line,) = report.criteria("B", report.load_runs(b))
    assert line.startswith("FAIL (stop")
    b2 = str(tmp_path / "b2")  # the second round's sweep is read with the first
    for seed in range(3):
        write_run(b2, f"r{seed}", "round2", seed, [500] * 5, nmi=0.6)
    line, frozen = report.criteria("B", report.load_runs(b, b2))
    assert line.startswith("PASS") and "['round2 (hidden velocity)']" in line
    for seed in range(3):  # two pass the screen: the one solving more (seed, mode) pairs is frozen, whatever its NMI
        write_run(b, f"h{seed}", "hard_gate", seed, [500] * 5, nmi=0.35)
        write_run(b2, f"r{seed}", "round2", seed, [500, 100, 500, 500, 0], nmi=0.9)
    line, frozen = report.criteria("B", report.load_runs(b, b2))
    assert "hard_gate" in line and "round2" in line and frozen.endswith(": hard_gate (hidden velocity)")


def test_an_archive_reads_back_as_its_sweep(tmp_path):
    sweep, dest = str(tmp_path / "sweep"), str(tmp_path / "archive")
    for seed in range(3):
        write_run(sweep, f"p{seed}", "plan", seed, [500, 400, 300, 200, 100 + seed], nmi=0.1 * seed)
    write_run(sweep, "unfinished", "plan", 9, [0] * 5)
    os.remove(os.path.join(sweep, "runs", "unfinished", "run", "eval.json"))  # a marker without eval.json is skipped
    assert report.archive([sweep], dest) == 3
    before = report.load_runs(sweep)
    shutil.rmtree(os.path.join(sweep))  # only the archive is left: no run directory, no model
    assert sorted(os.listdir(os.path.join(dest, "eval"))) == ["p0.json", "p1.json", "p2.json"]
    assert report.load_runs(dest) == before and len(before["plan (hidden velocity)"]) == 3
    other = str(tmp_path / "other")
    write_run(other, "p0", "plan", 0, [1] * 5)
    with pytest.raises(SystemExit, match="two sweeps hold run p0.json"):
        report.archive([dest, other], str(tmp_path / "both"))
    assert not os.path.exists(tmp_path / "both")  # refused before anything is copied
