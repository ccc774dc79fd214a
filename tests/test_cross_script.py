"""Checks every training script makes alike, through its command line, before any work.

--exp-name goes into the run directory's and the model file's names: a name with '/' would fail only at the save
after training (or nest the run one directory down), and an empty one would write a hidden '.cleanrl_model'. A
--runs-dir that is a file would fail when the run directory is made. Each is one line on stderr, exit code 2, and
nothing written."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMANDS = {
    "ppo_gru_baseline": ["cleanrl_astral/ppo_gru_baseline.py"],
    "ppo_gru_astral": ["cleanrl_astral/ppo_gru_astral.py"],
    "reinforce_baby": ["cleanrl_astral/reinforce_baby.py"],
    "maml_ssm": ["cleanrl_astral/maml_ssm.py", "train"],
    "tta_gating_adapt": ["cleanrl_astral/tta_gating.py", "adapt", "--checkpoint", "missing.cleanrl_model"],
    "tta_gating_clamp": ["cleanrl_astral/tta_gating.py", "clamp", "--checkpoint", "missing.cleanrl_model"],
    "sb3_peers": ["benchmark/sb3_peers.py"],
}


def run(command, *flags):
    return subprocess.run([sys.executable, *command, *flags], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_a_bad_exp_name_or_runs_dir_is_one_line_before_anything_is_written(script, tmp_path):
    runs = tmp_path / "runs"
    for bad in ("a/b", ""):
        r = run(COMMANDS[script], "--exp-name", bad, "--runs-dir", str(runs))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (bad, r.returncode, r.stderr[-2000:])
        assert "--exp-name" in lines[0] and repr(bad) in lines[0], lines[0]
        assert not runs.exists()
    if script.startswith("tta_gating"):
        return  # its runs directory is made after the checkpoint is found, which is checked first
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    r = run(COMMANDS[script], "--runs-dir", str(a_file))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--runs-dir" in lines[0], r.stderr[-2000:]
    assert a_file.read_text() == ""
