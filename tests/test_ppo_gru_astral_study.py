"""Tests for benchmark/astral_study.sh (refused: the study runs at commit 95652a5) and its criterion report
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


@pytest.mark.parametrize("args", [["A"], ["B", "1"], ["C"], ["report"], ["--one-seed", "3"], ["--quick"]])
def test_the_study_is_refused_naming_the_commit_where_it_runs(args):
    """The study's runs use switches only it used and read checkpoints of another format: every phase is refused in one
    line naming commit 95652a5, with nothing run."""
    result = study(*args)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "runs at commit 95652a5" in result.stderr
    assert not commands(result)


@pytest.mark.parametrize("flag", ["--study", "--swap"])
def test_the_tta_study_sweeps_on_the_phase_c_checkpoints_are_refused_naming_the_commit(flag):
    result = subprocess.run(
        ["bash", "benchmark/tta_gating.sh", flag, "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "commit 95652a5" in result.stderr and result.stdout == ""


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
    sweep = str(tmp_path / "sweep")
    dest = str(tmp_path / "archive")
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


def plan_check(*args):
    return subprocess.run(
        ["bash", "benchmark/astral_plan_check.sh", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_the_plan_check_expands_to_its_preregistered_runs():
    """benchmark/astral_plan_check.sh (docs/results/ppo_gru_astral/plan_design/PREREGISTRATION.md): part a is the plan's
    ASTRAL and the plan's baseline on seed3, seeds 1-5, 500k steps; part b the plan's ASTRAL with K = 4 on mirror4
    balanced with hidden velocity, seeds 6-10, 2M steps; tta the plan's and the study's adaptation settings and the
    clamps on part b's checkpoints. Every training run uses --design plan and none passes --sharpen-gate."""
    a = commands(plan_check("a", "--dry-run"))
    assert len(a) == 10 and {int(re.search(r"--seed (\d+)", c).group(1)) for c in a} == {1, 2, 3, 4, 5}
    assert sum("ppo_gru_baseline.py" in c for c in a) == 5 and sum("--exp-name plan" in c for c in a) == 5
    assert all("--design plan" in c and "--total-timesteps 500000" in c and "--modes-preset" not in c for c in a)
    b = commands(plan_check("b", "--dry-run"))
    assert len(b) == 5 and {int(re.search(r"--seed (\d+)", c).group(1)) for c in b} == {6, 7, 8, 9, 10}
    mirror = "--modes-preset mirror4 --mode-share balanced --hide-velocity --num-abstractions 4"
    assert all("--design plan" in c and "--total-timesteps 2000000" in c and mirror in c for c in b)
    assert not any("--sharpen-gate" in c for c in a + b)
    tta = commands(plan_check("tta", "--dry-run"))
    assert len(tta) == 15 and all("astral_plan_check/b/runs/c0__g0_base__s" in c for c in tta)
    plan_setting = "adapt --episodes 20 --num-seeds 3 --eval-episodes 10 --adapt-lr 1e-4 --controls none gate "
    study_setting = "adapt --episodes 30 --num-seeds 3 --eval-episodes 10 --adapt-lr 0.03 --controls none gate context "
    assert sum(plan_setting in c for c in tta) == 5 and sum(study_setting in c for c in tta) == 5
    assert sum("--ceiling-resolution 1 " in c for c in tta) == 10
    assert sum("clamp --eval-episodes 10 --mode-indices 0 1 2 3" in c for c in tta) == 5
    refused = plan_check("c")
    assert refused.returncode == 2 and "name a part" in refused.stderr


def test_the_plan_checks_quick_part_a_trains_and_scores(tmp_path):
    """The tiny flavour of part a runs end to end (a run of each design per script, then the part's report)."""
    out = os.path.join(REPO, "benchmark", "out", "astral_plan_check_quick")
    shutil.rmtree(out, ignore_errors=True)
    try:
        result = plan_check("a", "--quick")
        assert result.returncode == 0, result.stderr[-2000:]
        report_result = plan_check("report", "--quick")
        assert "plan expected result 1" in report_result.stdout and "baseline expected result 1" in report_result.stdout
        assert "plan expected result 2" in report_result.stdout
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_plan_check_part_a_criteria(tmp_path):
    """Expected result 1 needs both the plan's ASTRAL and its baseline at >= 475 in every mode in >= 4 of 5 seeds;
    expected result 2 the plan's ASTRAL's episode-level NMI >= 0.5 in >= 4 of 5 seeds."""
    sweep = str(tmp_path)
    for seed in range(1, 6):
        write_run(sweep, f"p{seed}", "plan", seed, [500, 480, 500, 490, 20], nmi=0.6 if seed < 5 else 0.1, hide=False)
        write_run(sweep, f"b{seed}", "baseline", seed, [500, 400 if seed < 3 else 500, 500, 500, 20], hide=False)
    lines = report.criteria("P", report.load_runs(sweep))
    assert lines == [
        "PASS plan expected result 1: seeds per mode >= 475: [5, 5, 5, 5] of 5",
        "FAIL baseline expected result 1: seeds per mode >= 475: [5, 3, 5, 5] of 5",
        "PASS plan expected result 2: episode-level NMI >= 0.5 in 4 of 5 seeds",
    ]
    only = report.load_runs(sweep, seeds=[3, 4])
    assert {r["seed"] for runs in only.values() for r in runs} == {3, 4}


def write_adaptation(sweep, seed, gains, gap=40.0):
    """A tta.json of one training seed: per target, `none` after adaptation at 300 on each of 3 adaptation seeds, the
    gate control `gains[target]` above it and the context control 0 above it (plus a little spread), unadapted 300 and
    the best fixed gate 300 + gap."""
    results = {}
    for target, gain in gains.items():
        none = [300.0, 302.0, 298.0]
        gate = [v + gain + 2.0 * (seed % 3) for v in none]
        context = [v + 2.0 * (seed % 3) for v in none]  # a gain far below half the gap: fails every target
        controls = {"none": none, "gate": gate, "context": context}
        results[target] = {
            "before": {"sampled": {"mean": 300.0}},
            "ceiling": {"sampled": {"mean": 300.0 + gap}},
            "controls": {name: {"after_per_seed": {"sampled": after}} for name, after in controls.items()},
        }
    targets = [{"name": t, "gravity": 9.8, "half_length": 0.5, "force_sign": 1.0} for t in gains]
    run_dir = os.path.join(sweep, "runs", f"c0__g0_base__s{seed}", "run")
    os.makedirs(run_dir, exist_ok=True)
    json.dump({"targets": targets, "results": results, "checkpoint": "x"}, open(os.path.join(run_dir, "tta.json"), "w"))


def test_criteria_3_and_4_of_the_plan_check(tmp_path):
    """Phase T scores criterion 3 as the study did (a target passes when the 95% CI of the mean gain over `none` is above
    0 and the mean gain is >= half the mean gap; one control must pass every target), agreeing with tta_summary.py's
    scorer of the study on the same files; and criterion 4 as >= 200 clamp specificity in >= 80% of the seeds."""
    import tta_summary

    root = str(tmp_path)
    for seed in range(6, 16):
        # mode0 gains 30 (>= half of 40), mode1 only 10: the gate control fails mode1, so criterion 3 fails
        write_adaptation(os.path.join(root, "study_adapt_frozen"), seed, {"mode0": 30.0, "mode1": 10.0})
        write_adaptation(os.path.join(root, "study_adapt_ceiling"), seed, {"mode0": 30.0, "mode1": 25.0})
    lines = report.tta_criteria([os.path.join(root, "study_adapt_frozen"), os.path.join(root, "study_adapt_ceiling")])
    assert "FAIL study_adapt_frozen criterion 3: controls passing every target: none" in lines
    assert "PASS study_adapt_ceiling criterion 3: controls passing every target: ['gate']" in lines
    assert any(line.startswith("pass study_adapt_frozen gate target mode0") for line in lines)
    assert any(line.startswith("fail study_adapt_frozen gate target mode1") for line in lines)
    theirs = "\n".join(tta_summary.study_criteria(root))
    assert "criterion 3, frozen: FAIL" in theirs and "criterion 3, ceiling: PASS" in theirs
    clamp = os.path.join(root, "clamp")
    for seed, score in zip(range(6, 11), [250.0, 210.0, 199.0, 300.0, None]):
        run_dir = os.path.join(clamp, "runs", f"c0__g0_base__s{seed}", "run")
        os.makedirs(run_dir)
        json.dump({"specificity": {"deterministic": {"score": score}}}, open(os.path.join(run_dir, "clamp.json"), "w"))
    assert report.tta_criteria([clamp]) == ["FAIL clamp criterion 4: clamp specificity >= 200 in 3 of 5 seeds"]
