"""Checks every training script makes alike, through its command line, before any work.

--exp-name goes into the run directory's and the model file's names: a name with '/' would fail only at the save
after training (or nest the run one directory down), and an empty one would write a hidden '.cleanrl_model'. A
--runs-dir that is a file would fail when the run directory is made. Each is one line on stderr, exit code 2, and
nothing written."""

import subprocess
import sys

import pytest
from benchmark_helpers import run_benchmark_script
from helpers import SCRIPT_ENV, assert_one_line_error, run_script, script_path

# case -> (script, the arguments before the flags under test); sb3_peers is in benchmark/, the others in cleanrl_astral/
COMMANDS = {
    "ppo_gru_baseline": ("ppo_gru_baseline", []),
    "ppo_gru_astral": ("ppo_gru_astral", []),
    "reinforce_baby": ("reinforce_baby", []),
    "maml_ssm": ("maml_ssm", ["train"]),
    "maml_ssm_promp": ("maml_ssm_promp", ["train"]),
    "tta_gating_adapt": ("tta_gating", ["adapt", "--checkpoint", "missing.cleanrl_model"]),
    "tta_gating_clamp": ("tta_gating", ["clamp", "--checkpoint", "missing.cleanrl_model"]),
    "sb3_peers": ("sb3_peers", []),
}


def run(case, *flags):
    """Runs the script of `case` (a key of COMMANDS) with its arguments, then `flags`."""
    name, args = COMMANDS[case]
    if name == "sb3_peers":
        return run_benchmark_script(name, *args, *flags, timeout=120)
    return run_script(name, *args, *flags, timeout=120)


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_a_bad_exp_name_or_runs_dir_is_one_line_before_anything_is_written(case, tmp_path):
    runs = tmp_path / "runs"
    for bad in ("a/b", ""):
        r = run(case, "--exp-name", bad, "--runs-dir", runs)
        assert_one_line_error(r, "--exp-name")
        assert repr(bad) in r.stderr, r.stderr
        assert not runs.exists()
    if case.startswith("tta_gating"):
        return  # its runs directory is made after the checkpoint is found, which is checked first
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    r = run(case, "--runs-dir", a_file)
    assert_one_line_error(r, "--runs-dir")
    assert a_file.read_text() == ""


# the flags whose work goes through the helper package cleanrl_astral_utils, and the refusal's first words
NEEDS_HELPER_PACKAGE = [
    ("ppo_gru_baseline", ["--save-model", "--capture-video"], "--capture-video needs"),
    ("ppo_gru_astral", ["--save-model", "--capture-video"], "--capture-video needs"),
    ("tta_gating", ["adapt", "--checkpoint", "missing.cleanrl_model", "--resume", "stopped_run"], "--resume needs"),
    ("maml_ssm", ["train", "--resume", "latest.cleanrl_model"], "--resume needs"),
    ("maml_ssm_promp", ["train", "--resume", "latest.cleanrl_model"], "--resume needs"),
    ("reinforce_baby", ["--parent", "llm", "--llm-base-url", "http://127.0.0.1:9/v1"], "--parent llm needs"),
]


@pytest.mark.parametrize("name,flags,needle", NEEDS_HELPER_PACKAGE)
def test_a_flag_that_needs_the_missing_helper_package_is_one_line_before_training(name, flags, needle, tmp_path):
    """A script copied alone runs its documented jobs without the helper package; a flag whose work needs it (a video, a
    report, resuming, the LLM) would fail only after the work: with the package unimportable, the flag is refused before
    any work."""
    blocked = "import runpy, sys; sys.modules['cleanrl_astral_utils'] = None; "
    argv = [script_path(name), *flags, "--runs-dir", str(tmp_path / "runs")]
    code = blocked + f"sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=SCRIPT_ENV, cwd=tmp_path, timeout=120)
    assert_one_line_error(r, f"{needle} the cleanrl_astral_utils package: pip install -e . in the repository")
    assert not (tmp_path / "runs").exists()
