"""Checks every training script makes alike, before any work.

- --exp-name goes into the run directory's and the model file's names: a name with '/' used to fail only at the
  save after training (or nest the run one directory down), and an empty one wrote a hidden '.cleanrl_model'.
- Sizes that cannot fit in memory (--hidden-size 1000000) were a MemoryError after the run directory existed."""
import importlib.util
import os
import subprocess
import sys

import pytest

from cleanrl_astral import maml_ssm, ppo_gru_astral, ppo_gru_baseline, reinforce_baby, tta_gating

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_sb3_peers():
    spec = importlib.util.spec_from_file_location("sb3_peers", os.path.join(REPO, "benchmark", "sb3_peers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def problem(module, args_class, **kwargs):
    """The validation message of a script for these settings, None if accepted."""
    if module is reinforce_baby:
        return module.validate_args(args_class(**kwargs))
    if module is maml_ssm:
        return module.finite_and_seeded(args_class(**kwargs))
    try:
        module.validate(args_class(**kwargs))
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("script", ["ppo_gru_baseline", "ppo_gru_astral", "reinforce_baby", "maml_ssm", "tta_adapt",
                                    "tta_clamp", "sb3_peers"])
def test_exp_names_that_cannot_name_a_file_are_refused(script):
    module, args_class = {
        "ppo_gru_baseline": (ppo_gru_baseline, ppo_gru_baseline.Args),
        "ppo_gru_astral": (ppo_gru_astral, ppo_gru_astral.Args),
        "reinforce_baby": (reinforce_baby, reinforce_baby.Args),
        "maml_ssm": (maml_ssm, maml_ssm.Args),
        "tta_adapt": (tta_gating, lambda **kw: tta_gating.AdaptArgs(checkpoint="missing", **kw)),
        "tta_clamp": (tta_gating, lambda **kw: tta_gating.Args(checkpoint="missing", **kw)),
        "sb3_peers": (None, None),
    }[script]
    if script == "sb3_peers":
        module = load_sb3_peers()
        args_class = module.Args
    for bad in ("", "  ", "a/b"):
        message = problem(module, args_class, exp_name=bad)
        assert message is not None and f"--exp-name {bad!r} must be a non-empty name without '/'" in message, message
    message = problem(module, args_class, exp_name="my_run-2")  # tta_gating then stops at its missing checkpoint
    assert message is None or "--exp-name" not in message, message


def test_the_cli_refuses_a_bad_exp_name_and_an_unusable_runs_dir_before_creating_anything(tmp_path):
    runs = tmp_path / "runs"
    r = subprocess.run([sys.executable, "cleanrl_astral/ppo_gru_baseline.py", "--exp-name", "a/b", "--runs-dir",
                        str(runs)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "ppo_gru_baseline.py: error: --exp-name 'a/b' must be a non-empty name without '/'"], r.stderr
    assert not runs.exists()
    # sb3_peers made its run directory with os.makedirs: a --runs-dir that is a file was a NotADirectoryError
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    r = subprocess.run([sys.executable, "benchmark/sb3_peers.py", "--runs-dir", str(a_file)],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--runs-dir" in r.stderr, r.stderr
    assert a_file.read_text() == ""


def ram_bytes():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_maml_sizes_beyond_this_machines_memory_are_refused():
    too_wide = int((ram_bytes() / 16) ** 0.5) + 1  # the SSM's output MLP alone has H^2 weights
    assert "reduce --hidden-size" in maml_ssm.validate_args(maml_ssm.Args(hidden_size=too_wide))
    assert maml_ssm.validate_args(maml_ssm.Args(hidden_size=too_wide // 4)) is None
    episodes = ram_bytes() // (4 * 20 * 100 * 2) + 1
    error = maml_ssm.validate_args(maml_ssm.Args(tasks_per_batch=20, fast_batch_size=episodes, max_episode_steps=100))
    assert "--fast-batch-size" in error
    # the meta-gradient keeps at least one width-H feature a step of the post-adaptation batch: with observations that
    # fit (2 floats a step and batch), a batch of 1024-wide features does not
    width = maml_ssm.policy_width(maml_ssm.Args(hidden_size=1024), maml_ssm.PointNav2D)
    episodes = ram_bytes() // (4 * 20 * 100 * width) + 1
    assert 4 * 20 * 100 * episodes * 2 * 2 < ram_bytes()
    error = maml_ssm.validate_args(maml_ssm.Args(tasks_per_batch=20, fast_batch_size=episodes, max_episode_steps=100,
                                                 hidden_size=1024))
    assert error is not None and "--fast-batch-size" in error, error
    assert maml_ssm.validate_args(maml_ssm.Args(tasks_per_batch=20, fast_batch_size=episodes // 64, max_episode_steps=100,
                                                hidden_size=1024)) is None
