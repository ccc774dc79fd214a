"""Tests of the one-change study's tools: benchmark/astral_one_change_entropy.py (per-mode gate weights, their entropy and
the last per-step gate entropy of each run) and benchmark/astral_one_change.sh (its commands and refusals)."""

import json
import math
import os
import subprocess

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
