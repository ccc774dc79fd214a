"""Tests for resuming cleanrl_astral/reinforce_baby.py (--checkpoint-every, --resume): a run killed after a checkpoint and
resumed ends exactly where the same run never stopped ends; bad --resume input is a one-line error."""

import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import SCRIPT_ENV, logged_scalars, only_run_dir, run_script, script_path
from test_reinforce_baby import TINY, RecordingWriter, assert_refused

import cleanrl_astral.reinforce_baby as reinforce_baby
from cleanrl_astral_utils.baby import Checkpoints

# a curriculum whose levels and mastery windows change during the run, so that restoring them matters: with a low
# threshold a task levels up as soon as its window fills, so a window restored empty would level it up later
CURRICULUM = ["--task", "all", "--curriculum", "--mastery-window", "16", "--mastery-threshold", "0.1", "--save-model"]
LONG = [f if f != "64" else "4800" for f in TINY]  # 300 updates: the kill lands long before the end


def kill_after_first_checkpoint(flags, runs_dir):
    """Starts a run and SIGKILLs it once it has written its first checkpoint; the checkpoint's path."""
    env = {**SCRIPT_ENV, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, script_path("reinforce_baby"), *flags, "--runs-dir", str(runs_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("checkpoint written to "):
            proc.send_signal(signal.SIGKILL)
            break
    proc.stdout.close()
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    checkpoint = os.path.join(only_run_dir(runs_dir), "checkpoint.pt")
    assert os.path.isfile(checkpoint) and not [f for f in os.listdir(only_run_dir(runs_dir)) if ".tmp." in f]
    return checkpoint


def finished_run(run_dir):
    """What a run leaves that does not depend on the clock: its scalars but SPS, eval.json but the training time, the
    saved weights."""
    scalars = logged_scalars(run_dir)
    scalars.pop("charts/SPS")
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)
    ev.pop("train_time_s")
    weights = torch.load(os.path.join(run_dir, "reinforce_baby.cleanrl_model"), weights_only=False)["state_dict"]
    return scalars, ev, weights


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo"])
def test_a_killed_run_resumed_from_its_checkpoint_ends_as_the_run_never_stopped(tmp_path, algorithm):
    """SIGKILL after the first checkpoint, then --resume: the same run directory, TensorBoard steps continuing (each
    step logged once), and every scalar but SPS, eval.json and the weights equal, bit for bit, to those of the same
    command run without a stop: the curriculum's levels and windows, the optimizer, the running baseline and every
    random generator are restored."""
    flags = [*CURRICULUM, *LONG, "--algorithm", algorithm, "--max-episode-steps", "2", "--checkpoint-every", "64"]
    checkpoint = kill_after_first_checkpoint(flags, tmp_path / "killed")
    state = torch.load(checkpoint, weights_only=False)
    assert state["global_step"] < 4800
    run_script("reinforce_baby", "--resume", checkpoint, check=True)
    assert os.listdir(tmp_path / "killed") == [os.path.basename(os.path.dirname(checkpoint))]
    run_script("reinforce_baby", *flags, "--runs-dir", str(tmp_path / "whole"), check=True)
    resumed = finished_run(os.path.dirname(checkpoint))
    whole = finished_run(only_run_dir(tmp_path / "whole"))
    steps = [step for step, _ in resumed[0]["charts/success_rate"]]
    assert steps == list(range(32, 4800 + 1, 32))
    assert resumed[0] == whole[0]
    assert resumed[1] == whole[1]
    assert resumed[2].keys() == whole[2].keys()
    assert all(torch.equal(resumed[2][k], whole[2][k]) for k in whole[2])
    # the first checkpoint holds mastery windows under way, below the top level: restoring them is not trivial
    assert any(state["history"][t] and state["levels"][t] < 2 for t in state["levels"]), state["history"]
    assert max(state["levels"].values()) < max(torch.load(checkpoint, weights_only=False)["levels"].values())


def test_a_default_run_writes_no_checkpoint(tmp_path):
    run_script("reinforce_baby", "--task", "pattern-echo", *TINY, "--runs-dir", str(tmp_path), check=True)
    assert "checkpoint.pt" not in os.listdir(only_run_dir(tmp_path))


def test_checkpoints_come_every_n_steps_and_after_the_last_update(tmp_path):
    result = run_script(
        "reinforce_baby", "--task", "pattern-echo", *TINY, "--total-timesteps", "160", "--checkpoint-every", "40",
        "--runs-dir", str(tmp_path), check=True,
    )  # fmt: skip
    written = [line.rsplit("=", 1)[1] for line in result.stdout.splitlines() if line.startswith("checkpoint written")]
    assert written == ["48", "80", "128", "160"]  # batches of 16: the updates that cross 40, 80, 120, and the last


def test_a_resumed_final_checkpoint_only_evaluates(tmp_path):
    """A run killed after its last update resumes into its evaluation: no update runs again."""
    run_script("reinforce_baby", "--task", "pattern-echo", *TINY, "--checkpoint-every", "32", "--runs-dir", str(tmp_path))
    run_dir = only_run_dir(tmp_path)
    os.remove(os.path.join(run_dir, "eval.json"))
    result = run_script("reinforce_baby", "--resume", os.path.join(run_dir, "checkpoint.pt"), check=True)
    assert "global_step=" not in result.stdout and os.path.isfile(os.path.join(run_dir, "eval.json"))


@pytest.mark.parametrize("kind", ["missing", "not_a_checkpoint", "other_object"])
def test_a_bad_resume_path_is_a_one_line_error(tmp_path, kind):
    path = tmp_path / "checkpoint.pt"
    if kind == "not_a_checkpoint":
        path.write_text("hello")
    if kind == "other_object":
        torch.save({"state_dict": {}}, path)
    result = run_script("reinforce_baby", "--resume", str(path))
    assert_refused(result, "--resume")
    assert not [p for p in os.listdir(tmp_path) if p != "checkpoint.pt"]


def test_a_negative_checkpoint_interval_is_refused(tmp_path):
    assert_refused(run_script("reinforce_baby", *TINY, "--checkpoint-every", "-1", "--runs-dir", str(tmp_path)), "-1")


class FlushingWriter(RecordingWriter):
    def flush(self):
        pass


def test_a_checkpoint_restores_every_random_generator(tmp_path):
    """The environment's generator and the global ones of torch, numpy and Python are in the checkpoint and are restored:
    what each draws after the restore repeats what it drew after the save. If one were left out, a resumed run would
    draw other episodes or other minibatch orders than the run never stopped."""
    args = reinforce_baby.Args(task="pattern-echo", num_actions=8, hidden_dim=32, num_layers=1, num_envs=16)
    args.batch_size = args.num_envs * args.max_episode_steps
    args.num_iterations = 2

    def run_objects():
        agent = reinforce_baby.build_agent(args)
        optimizer = reinforce_baby.make_optimizer(agent, args)
        curriculum = reinforce_baby.make_curriculum(args, ["pattern-echo"])
        parent = reinforce_baby.DeterministicParent(8)
        env = reinforce_baby.BabyEnv(parent, args.num_envs, args.max_episode_steps, args.seed)
        log = reinforce_baby.TrainingLog(FlushingWriter(), ["pattern-echo"], args)
        return agent, optimizer, curriculum, env, log, parent

    def draws(env):
        return [env.rng.random(), torch.rand(1).item(), np.random.random(), random.random()]

    reinforce_baby.seed_everything(3)
    agent, optimizer, curriculum, env, log, parent = run_objects()
    path = str(tmp_path / "checkpoint.pt")
    Checkpoints(path, 16, "reinforce_baby").save(args, 1, agent, optimizer, torch.zeros(1), curriculum, env, log, parent)
    after_save = draws(env)
    reinforce_baby.seed_everything(4)
    agent, optimizer, curriculum, env, log, parent = run_objects()
    resumed = torch.load(path, weights_only=False)
    Checkpoints(path, 16, "reinforce_baby", resumed).restore(agent, optimizer, curriculum, env, log, parent)
    assert draws(env) == after_save
