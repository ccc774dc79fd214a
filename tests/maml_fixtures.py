"""What the maml_ssm test files share: the tiny configuration, a tiny sampled problem, trained checkpoints, and the
command line run as a user would."""

import glob
import os
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import REPO, SCRIPT_ENV, run_script, script_path

import cleanrl_astral.maml_ssm as maml_ssm

# a few seconds per run: 2 iterations of 2 tasks x 3 episodes of 12 steps, a tiny SSM; the budget of maml_ssm_promp.py
TINY_PROMP = [
    "--outer-steps",
    "2",
    "--tasks-per-batch",
    "2",
    "--fast-batch-size",
    "3",
    "--max-episode-steps",
    "12",
    "--hidden-size",
    "8",
    "--state-size",
    "4",
    "--eval-tasks",
    "3",
    "--eval-steps",
    "2",
]

# the same budget with a short TRPO: the budget of maml_ssm.py
TINY = [*TINY_PROMP, "--cg-iters", "3", "--ls-max-steps", "3"]

TINY_ARGS = dict(
    outer_steps=1,
    tasks_per_batch=2,
    fast_batch_size=3,
    max_episode_steps=12,
    hidden_size=8,
    state_size=4,
    cg_iters=3,
    ls_max_steps=3,
    eval_tasks=3,
    eval_steps=2,
)


def run_maml(args, check=True, cwd=REPO, env=None):
    """maml_ssm.py with the command line `args` in a subprocess; fails the test on a non-zero exit if `check`."""
    return run_script("maml_ssm", *args, check=check, cwd=cwd, env=env)


def run_promp(args, check=True, cwd=REPO, env=None):
    """maml_ssm_promp.py with the command line `args` in a subprocess, as run_maml."""
    return run_script("maml_ssm_promp", *args, check=check, cwd=cwd, env=env)


def train_tiny(runs, *extra):
    """The checkpoint of a tiny `train --save-model` run in `runs`."""
    run_maml(["train", "--runs-dir", str(runs), "--save-model", *TINY, *extra])
    (path,) = glob.glob(str(runs / "*" / "maml_ssm.cleanrl_model"))
    return path


@pytest.fixture(scope="module")
def trained_ckpt(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("runs"), "--task", "point-nav-2d")


@pytest.fixture(scope="module")
def cartpole_ckpt(tmp_path_factory):
    """cartpole-physics draws random start states from the env's generator (point-nav starts at the origin)."""
    return train_tiny(tmp_path_factory.mktemp("runs"), "--task=cartpole-physics", "--max-episode-steps=30")


def tiny_setup(
    policy="ssm",
    T=10,
    n_tasks=2,
    per=3,
    num_steps=1,
    inner_lr=0.5,
    dtype=torch.float64,
    seed=0,
    task="point-nav-2d",
    script=maml_ssm,
):
    """A tiny problem (point-nav unless told): model (in `dtype`), args and per-task batches ({"train": [num_steps],
    "val"}) sampled by the sampler of `script` (maml_ssm unless told) with `inner_lr` at every step, as meta-training
    does."""
    torch.manual_seed(seed)
    args = script.Args(
        task=task,
        policy=policy,
        hidden_size=6,
        state_size=3,
        max_episode_steps=T,
        fast_batch_size=per,
        tasks_per_batch=n_tasks,
        inner_lr=inner_lr,
        num_inner_steps=num_steps,
    )
    model = script.build_agent(args, script.ENV_CLASSES[task])
    rng, _ = script.task_streams(seed)
    tasks = script.sample_tasks(args.task, rng, n_tasks, "train")
    theta = {k: v.detach() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(seed)
    data, _ = script.sample_task_batches(model, theta, tasks, args, gen, num_steps, [inner_lr] * num_steps)
    model = model.to(dtype)
    for td in data:
        for b in td["train"] + [td["val"]]:
            for k, v in b.items():
                if v.is_floating_point():
                    b[k] = v.to(dtype)
    return model, args, data


def validation_error(validate, args):
    """The message of the ValueError `validate(args)` raises, or None."""
    try:
        validate(args)
    except ValueError as e:
        return str(e)
    return None


def parsed_train_args(argv, script=maml_ssm):
    """The Args `maml_ssm.py train ...` (argv; or the `script` module's) would train with: the command line through
    tyro and the presets."""
    seen = []

    def capture(args):
        seen.append(args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(script, "train", capture)
        script.main(argv)
    return seen[0]


def run_copied_alone(script, folder, *argv):
    """Runs cleanrl_astral/{script}.py copied alone into folder, with the helper package unimportable; the process."""
    path = os.path.join(folder, f"{script}.py")
    if not os.path.exists(path):
        shutil.copy(script_path(script), path)
    # a stub in front of the editable install: the package is found, but importing it fails, as a broken install would
    stub = os.path.join(folder, "blocked", "cleanrl_astral_utils")
    os.makedirs(stub, exist_ok=True)
    with open(os.path.join(stub, "__init__.py"), "w") as f:
        f.write('raise ImportError("cleanrl_astral_utils is not installed here")\n')
    env = {**SCRIPT_ENV, "PYTHONPATH": os.path.dirname(stub)}
    return subprocess.run(
        [sys.executable, path, *map(str, argv)], capture_output=True, text=True, env=env, cwd=folder, timeout=600
    )
