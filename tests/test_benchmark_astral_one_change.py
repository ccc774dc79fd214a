"""Tests of the one-change study's tools: benchmark/astral_one_change_entropy.py (per-mode gate weights, their entropy and
the last per-step gate entropy of each run) and benchmark/astral_one_change.sh (one line naming the study's commit)."""

import json
import math
import os
import subprocess

import numpy as np
import pytest
from benchmark_helpers import load_benchmark_script
from helpers import REPO, SCRIPT_ENV
from torch.utils.tensorboard import SummaryWriter

entropy_report = load_benchmark_script("astral_one_change_entropy")


def fake_run(sweep, run_key, seed, weights, logged):
    """A finished benchmark.py run: marker, eval.json with `weights`, and `slots/weight_entropy` logged as `logged`."""
    run_dir = os.path.join(sweep, "runs", run_key, f"NonStationaryCartPole__arm__{seed}__1")
    os.makedirs(run_dir)
    writer = SummaryWriter(run_dir)
    for step, value in enumerate(logged):
        writer.add_scalar("slots/weight_entropy", value, step)
    writer.close()
    if weights is not None:
        with open(os.path.join(run_dir, "eval.json"), "w") as f:
            json.dump({"slot_weights_deterministic": weights}, f)
    os.makedirs(os.path.join(sweep, "markers"), exist_ok=True)
    marker = {
        "run_key": run_key,
        "seed": seed,
        "command": "python cleanrl_astral/ppo_gru_astral.py",
        "argv": ["python", "cleanrl_astral/ppo_gru_astral.py", "--exp-name", "tanh_gate", "--seed", str(seed)],
        "run_dirs": [run_dir],
    }
    with open(os.path.join(sweep, "markers", f"{run_key}.json"), "w") as f:
        json.dump(marker, f)


def test_gate_entropy_per_mode_and_the_last_logged_step_entropy(tmp_path):
    sweep = str(tmp_path / "sweep")
    fake_run(sweep, "c0__g0_base__s1", 1, [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]], [1.0, 0.7, 0.2])
    fake_run(sweep, "c0__g0_base__s2", 2, None, [0.9])  # no eval.json: an unfinished run is left out
    dest = str(tmp_path / "archive")
    assert entropy_report.main([sweep, dest]) == 0
    records = json.load(open(os.path.join(dest, "gate_entropy.json")))
    assert list(records) == ["c0__g0_base__s1"]
    record = records["c0__g0_base__s1"]
    assert (record["exp_name"], record["seed"]) == ("tanh_gate", 1)
    expected = [0.0, math.log(2), -(0.5 * math.log(0.25) + 0.5 * math.log(0.5))]
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(record["mean_gate_entropy"], expected))
    assert math.isclose(record["weight_entropy_last"], 0.2, rel_tol=1e-6)  # the last update's, not the first or a mean
    assert record["slot_weights"][1] == [0.5, 0.5, 0.0]
    assert entropy_report.main([str(tmp_path / "empty"), dest]) == 2


def run_study(*args):
    return subprocess.run(
        ["bash", os.path.join(REPO, "benchmark", "astral_one_change.sh"), *args],
        cwd=REPO,
        env=SCRIPT_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("part", [[], ["current"], ["single", "--dry-run"], ["pair", "--quick"], ["report"]])
def test_the_runner_names_the_commit_the_study_ran_at_in_one_line_and_runs_nothing(part):
    """The arms' switches are built at commit 9ecf7db only: every part exits non-zero with one line naming it."""
    r = run_study(*part)
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "git checkout 9ecf7db" in r.stderr


compare = load_benchmark_script("astral_one_change_compare")


def archived_arm(archive, name, returns_by_seed):
    """An archive of `name`'s runs as `astral_one_change.sh report` writes it: marker and eval.json per run key."""
    for seed, returns in returns_by_seed.items():
        key = f"{name}__s{seed}"
        os.makedirs(os.path.join(archive, "markers"), exist_ok=True)
        os.makedirs(os.path.join(archive, "eval"), exist_ok=True)
        argv = ["python", "cleanrl_astral/ppo_gru_astral.py", "--exp-name", name, "--seed", str(seed)]
        with open(os.path.join(archive, "markers", f"{key}.json"), "w") as f:
            json.dump({"run_key": key, "seed": seed, "argv": argv}, f)
        per_mode = {str(k): {"deterministic": {"mean": r}} for k, r in enumerate(returns)}
        with open(os.path.join(archive, "eval", f"{key}.json"), "w") as f:
            json.dump({"held_out_modes": [], "per_mode": per_mode}, f)


def test_compare_scores_criteria_and_picks_the_pair_by_the_registered_rule(tmp_path, capsys):
    """Criterion 1 per mode (>= 475 in >= 4 of 5 seeds); arm - plan with a Welch interval; the pair: the two single
    arms with the highest mean, a tie broken by more cells >= 475, then by the table's order."""
    archive = str(tmp_path / "single_runs")
    seeds = range(1, 6)
    archived_arm(archive, "plan", {s: [100.0 + s, 120.0, 130.0] for s in seeds})
    # mean 400 with 8 solved cells, and mean 400 with 10 solved cells: the second wins the tie
    archived_arm(archive, "film_identity", {s: [500.0, 500.0, 200.0] if s <= 4 else [470.0, 470.0, 260.0] for s in seeds})
    archived_arm(archive, "tanh_gate", {s: [500.0, 500.0, 200.0] for s in seeds})
    # every mode >= 475 in 4 of 5 seeds: passes criterion 1 with a lower mean than the tie above
    archived_arm(archive, "slots_32", {s: [500.0, 480.0, 476.0] if s <= 4 else [0.0, 0.0, 0.0] for s in seeds})
    archived_arm(archive, "script_config", {s: [300.0, 300.0, 300.0] for s in seeds})
    arms = compare.read_archives([archive])
    summaries = {name: compare.arm_summary(runs) for name, runs in arms.items()}
    assert summaries["slots_32"]["criterion_1"] and not summaries["tanh_gate"]["criterion_1"]
    assert summaries["slots_32"]["seeds_solved_per_mode"] == [4, 4, 4] and summaries["slots_32"]["seeds_all_modes"] == 4
    assert summaries["film_identity"]["mean"] == summaries["tanh_gate"]["mean"] == 400.0
    assert compare.pair_choice(summaries) == ["tanh_gate", "film_identity"]
    text, verdict = compare.difference(summaries["script_config"], summaries["plan"])
    plan_means = [(100.0 + s + 120.0 + 130.0) / 3 for s in seeds]
    assert text == f"{300.0 - np.mean(plan_means):+.1f} ± {compare.welch_diff_ci95([300.0] * 5, plan_means)[1]:.1f}"
    assert verdict == "better"
    assert compare.difference(summaries["plan"], summaries["script_config"])[1] == "worse"
    assert compare.difference(summaries["film_identity"], summaries["tanh_gate"])[1] == "no difference detected"
    assert compare.main([archive]) == 0
    out = capsys.readouterr().out
    assert 'Pair rule: tanh_gate and film_identity, ASTRAL_PAIR="--gate-design script --film-design script".' in out
    assert "Verdict: the plan's design fails because of the choices of slots_32; each alone repairs it." in out
    assert compare.main([str(tmp_path / "none")]) == 2
