"""ppo_gru_baseline.py, ppo_gru_astral.py and tta_gating.py copied alone into an empty folder, where importing the helper
package fails: each documented job runs and writes its output (the checkpoints, tta_gating's results files), and each
option that needs the package says so in one line before any work."""

import glob
import json
import os
import shutil

import pytest
import torch
from helpers import SCRIPT_ENV, assert_one_line_error, run_python, script_path

TINY = "--num-envs 4 --num-steps 16 --num-minibatches 2 --update-epochs 1 --hidden-size 16 --total-timesteps 64".split()
TINY_ASTRAL = [*TINY, "--slot-dim", "8", "--modes-preset", "mirror4", "--mode-share", "balanced"]
TINY_TTA = ["--eval-episodes", "1", "--mode-indices", "1", "4"]
# a stub that stands in front of the editable install: `import cleanrl_astral_utils` fails as where it is not installed
BLOCKED = 'raise ImportError("cleanrl_astral_utils is not installed here")\n'


class Alone:
    """A folder holding copies of the three scripts, and the environment in which the helper package cannot be imported."""

    def __init__(self, root):
        self.dir = root / "alone"
        os.makedirs(self.dir)
        for name in ("ppo_gru_baseline", "ppo_gru_astral", "tta_gating"):
            shutil.copy(script_path(name), self.dir)
        stub = root / "blocked" / "cleanrl_astral_utils"
        os.makedirs(stub)
        (stub / "__init__.py").write_text(BLOCKED)
        self.env = {**SCRIPT_ENV, "PYTHONPATH": str(root / "blocked")}

    def run(self, name, *args):
        return run_python([f"{name}.py", *map(str, args)], cwd=self.dir, env=self.env)

    def checkpoint(self, name):
        (path,) = glob.glob(str(self.dir / "runs" / "*" / f"{name}.cleanrl_model"))
        return path


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The folder, after one tiny training run of each training script with --save-model (tta_gating reads ASTRAL's)."""
    alone = Alone(tmp_path_factory.mktemp("copy_alone"))
    probe = run_python(["-c", "import cleanrl_astral_utils"], cwd=alone.dir, env=alone.env)
    assert probe.returncode != 0 and "is not installed here" in probe.stderr, "the helper package leaks into the folder"
    for name, flags in (("ppo_gru_baseline", TINY), ("ppo_gru_astral", TINY_ASTRAL)):
        result = alone.run(name, *flags, "--save-model")
        assert result.returncode == 0, result.stderr[-2000:]
        assert "evaluation report skipped: eval.json needs the cleanrl_astral_utils package" in result.stdout
    return alone


@pytest.mark.parametrize("name", ["ppo_gru_baseline", "ppo_gru_astral"])
def test_a_training_script_alone_saves_its_checkpoint(alone, name):
    checkpoint = torch.load(alone.checkpoint(name), weights_only=True)
    assert checkpoint["script"] == name
    assert checkpoint["args"]["save_model"] is True
    assert checkpoint["state_dict"]["gru.weight_hh"].shape == (48, 16)
    run_dir = os.path.dirname(alone.checkpoint(name))
    assert not os.path.exists(os.path.join(run_dir, "eval.json"))
    assert [f for f in os.listdir(run_dir) if ".tmp." in f] == []


# adapt with every control and saving the adapted agents, clamp and swap, each on two targets (one held out)
@pytest.mark.parametrize(
    "subcommand, flags, results",
    [
        ("adapt", ["--controls", "none", "gate", "context", "all", "tent", "--episodes", "1", "--save-model"], "tta.json"),
        ("clamp", [], "clamp.json"),
        ("swap", [], "swap.json"),
    ],
)
def test_tta_gating_alone_reads_the_checkpoint_and_writes_its_results(alone, tmp_path, subcommand, flags, results):
    checkpoint = alone.checkpoint("ppo_gru_astral")
    result = alone.run("tta_gating", subcommand, "--checkpoint", checkpoint, *TINY_TTA, *flags, "--runs-dir", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "statistics, eval.json and figures skipped: they need the cleanrl_astral_utils package" in result.stdout
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    with open(os.path.join(run_dir, results)) as f:
        report = json.load(f)
    assert report["subcommand"] == subcommand
    assert set(report["results"]) == {t["name"] for t in report["targets"]}
    assert not os.path.exists(os.path.join(run_dir, "eval.json"))
    if "--save-model" in flags:
        saved = torch.load(os.path.join(run_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)
        assert len(saved["adapted"]) == 2 * 5 * 2  # targets x controls x seeds


def test_an_option_that_needs_the_package_says_so_in_one_line(alone, tmp_path):
    for name, flags in (("ppo_gru_baseline", TINY), ("ppo_gru_astral", TINY_ASTRAL)):
        video = alone.run(name, *flags, "--save-model", "--capture-video", "--runs-dir", tmp_path)
        assert_one_line_error(video, "--capture-video needs the cleanrl_astral_utils package")
    checkpoint = alone.checkpoint("ppo_gru_astral")
    resume = alone.run("tta_gating", "adapt", "--checkpoint", checkpoint, "--resume", tmp_path)
    assert_one_line_error(resume, "--resume needs the cleanrl_astral_utils package")
    assert os.listdir(tmp_path) == []
