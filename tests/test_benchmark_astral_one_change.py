"""Tests of the one-change study's tools: benchmark/astral_one_change_entropy.py (per-mode gate weights, their entropy and
the last per-step gate entropy of each run) and benchmark/astral_one_change.sh (its commands and refusals)."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
from benchmark_helpers import load_benchmark_script
from helpers import REPO, SCRIPT_ENV
from torch.utils.tensorboard import SummaryWriter

import cleanrl_astral.ppo_gru_astral as ppo_gru_astral

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


def run_study(*args, **env):
    return subprocess.run(
        ["bash", os.path.join(REPO, "benchmark", "astral_one_change.sh"), *args],
        cwd=REPO,
        env={**SCRIPT_ENV, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_current_defaults_are_trained_with_the_plans_sign_beside_phase_c():
    """`current` trains the script's defaults on seed3 and Phase C's frozen configuration, neither with --sharpen-gate."""
    r = run_study("current", "--dry-run")
    assert r.returncode == 0, r.stderr
    commands = [line for line in r.stdout.splitlines() if line.startswith("python cleanrl_astral/ppo_gru_astral.py")]
    assert len(commands) == 10 and not any("--sharpen-gate" in c for c in commands)
    seed3 = [c for c in commands if "--exp-name script_plan_sign" in c]
    phase_c = [c for c in commands if "--exp-name frozen_plan_sign" in c]
    assert [f"--seed {s} " in c for s, c in zip(range(1, 6), seed3)] == [True] * 5
    assert [f"--seed {s} " in c for s, c in zip(range(6, 11), phase_c)] == [True] * 5
    assert all("--total-timesteps 500000" in c and "--modes-preset seed3" in c for c in seed3)
    frozen = (
        "--modes-preset mirror4 --mode-share balanced --save-model --eval-episodes 20 --hide-velocity --num-abstractions 4"
    )
    assert all("--total-timesteps 2000000" in c and frozen in c and "--slot-init orthonormal" in c for c in phase_c)


def test_arms_without_their_flag_or_pair_are_refused_before_any_run():
    r = run_study("single", "--dry-run", ASTRAL_FILM_IDENTITY="--no-such-flag x")
    assert r.returncode == 2 and "ppo_gru_astral.py has no --no-such-flag" in r.stderr and "python " not in r.stdout
    r = run_study("pair", "--dry-run")
    assert r.returncode == 2 and "set ASTRAL_PAIR" in r.stderr


def test_each_single_arm_is_the_plans_design_with_exactly_its_part_switched(monkeypatch):
    """`single` runs six arms x seeds 1-5; parsed as ppo_gru_astral.py parses them, each arm's Args differ from the plan
    arm's in its own fields only (and in the run's name and seed)."""
    r = run_study("single", "--dry-run")
    assert r.returncode == 0, r.stderr
    commands = [line.split("  # ")[0].split() for line in r.stdout.splitlines() if line.startswith("python ")]
    assert len(commands) == 30
    parsed = {}
    for command in commands:
        monkeypatch.setattr(sys, "argv", ["prog", *command[2:]])
        args = ppo_gru_astral.parse_args()
        parsed.setdefault(args.exp_name, []).append(args)
    assert {name: [a.seed for a in runs] for name, runs in parsed.items()} == {
        name: [1, 2, 3, 4, 5]
        for name in ("plan", "film_identity", "tanh_gate", "slots_32", "orthogonal_init", "script_config")
    }
    plan = parsed["plan"][0]
    assert (plan.design, plan.total_timesteps, plan.modes_preset, plan.save_model) == ("plan", 500000, "seed3", True)
    expected = {
        "film_identity": {"film_design": "script"},
        "tanh_gate": {"gate_design": "script"},
        "slots_32": {"slot_dim": 32},
        "orthogonal_init": {"init": "orthogonal"},
        "script_config": {
            "hidden_size": 128,
            "num_envs": 32,
            "learning_rate": 1e-3,
            "adam_eps": 1e-5,
            "anneal_lr": True,
            "norm_reward": True,
            "clip_vloss": True,
        },
    }
    for name, fields in expected.items():
        arm = parsed[name][0]
        changed = {
            f.name: getattr(arm, f.name)
            for f in dataclasses.fields(arm)
            if getattr(arm, f.name) != getattr(plan, f.name) and f.name not in ("exp_name", "runs_dir")
        }
        assert changed == fields, name


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
