"""Tests of maml_ssm.py's pipeline commands: `train --ckpt-dir` and `--resume`, `eval`/`adapt` with `--episodes` and
`--config`, and the pipeline plan's whole workflow run with the plan's flags."""

import glob
import os
import shutil

import numpy as np
import pytest
import torch
from helpers import assert_one_line_error, load_json, logged_scalars, only_run_dir, sha256
from maml_fixtures import TINY, parsed_train_args, run_copied_alone, run_maml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import cleanrl_astral.maml_ssm as maml_ssm

# a tiny adam run (adam has optimizer state to restore; TRPO has none) with a buffer that wraps around
SMALL = [
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
    "1",
    "--outer-optimizer",
    "adam",
    "--buffer-size",
    "50",
]
WALL_CLOCK_TAGS = {"charts/SPS", "meta/iteration_time", "meta/train_wall_time", "meta/train_cpu_time"}


def event_scalars(path):
    """{tag: {step: value}} of one TensorBoard event file, wall-clock tags left out."""
    acc = EventAccumulator(path, size_guidance={"scalars": 0})
    acc.Reload()
    tags = [t for t in acc.Tags()["scalars"] if t not in WALL_CLOCK_TAGS]
    return {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}


def load(path):
    return torch.load(path, weights_only=False)


def assert_same_tree(a, b, where):
    """Equal nested dicts/lists of tensors, arrays and numbers, bit for bit."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


def test_ckpt_dir_writes_step_and_latest_checkpoints_atomically(tmp_path):
    """--ckpt-dir writes step_N every --ckpt-every outer steps and at the last one, and latest (= the newest step);
    no temporary file stays behind; the run directory holds no checkpoint of its own without --save-model."""
    ck = tmp_path / "ck"
    run_maml(["train", *SMALL, "--outer-steps", "5", "--ckpt-every", "2", "--ckpt-dir", ck, "--runs-dir", tmp_path / "runs"])
    assert sorted(os.listdir(ck)) == [
        "latest.cleanrl_model",
        "step_2.cleanrl_model",
        "step_4.cleanrl_model",
        "step_5.cleanrl_model",
    ]
    latest = load(ck / "latest.cleanrl_model")
    assert_same_tree(latest["state_dict"], load(ck / "step_5.cleanrl_model")["state_dict"], "state_dict")
    assert latest["outer_steps_done"] == 5 and load(ck / "step_2.cleanrl_model")["outer_steps_done"] == 2
    assert not glob.glob(str(tmp_path / "runs" / "*" / "*.cleanrl_model"))


def test_resume_continues_the_run_bit_for_bit(tmp_path):
    """A run resumed from its step-2 checkpoint ends where the uninterrupted run ended: same weights, optimizer states,
    buffer, feature statistics, RNG states and task split; it logs into the same run directory, continuing its
    TensorBoard steps with the same values (wall-clock tags aside)."""
    ck = tmp_path / "ck"
    runs = tmp_path / "runs"
    run_maml(["train", *SMALL, "--outer-steps", "4", "--ckpt-every", "2", "--ckpt-dir", ck, "--runs-dir", runs])
    shutil.copy(ck / "step_2.cleanrl_model", tmp_path / "at_2.cleanrl_model")
    shutil.copy(ck / "latest.cleanrl_model", tmp_path / "whole.cleanrl_model")
    (run_dir,) = glob.glob(str(runs / "*"))
    (first_events,) = glob.glob(os.path.join(run_dir, "events.out.tfevents*"))

    out = run_maml(["train", "--resume", tmp_path / "at_2.cleanrl_model"])
    assert "resumed" in out.stdout and "after 2 outer steps" in out.stdout
    whole = load(tmp_path / "whole.cleanrl_model")
    resumed = load(ck / "latest.cleanrl_model")
    for key in ("state_dict", "buffer", "feature_stats", "training", "task_split", "outer_steps_done"):
        assert_same_tree(whole[key], resumed[key], key)
    assert resumed["args"] == {**whole["args"], "resume": str(tmp_path / "at_2.cleanrl_model")}

    assert glob.glob(str(runs / "*")) == [run_dir]  # the same run directory
    (second_events,) = set(glob.glob(os.path.join(run_dir, "events.out.tfevents*"))) - {first_events}
    first = event_scalars(first_events)
    second = event_scalars(second_events)
    step_2 = load(tmp_path / "at_2.cleanrl_model")["training"]["global_step"]
    assert set(second) == set(first)
    for tag, values in second.items():
        assert min(values) > step_2, tag  # TensorBoard steps continue after the checkpoint's
        assert values == {s: v for s, v in first[tag].items() if s > step_2}, tag


def test_resume_cpu_budget_counts_the_time_already_spent(tmp_path):
    """--cpu-budget counts the CPU time the checkpoint had spent: a checkpoint that spent more than the budget runs one
    more outer step (the budget is checked after each) and stops, writing its checkpoint."""
    ck = tmp_path / "ck"
    run_maml(["train", *SMALL, "--outer-steps", "4", "--ckpt-every", "2", "--ckpt-dir", ck, "--runs-dir", tmp_path / "r"])
    ckpt = load(ck / "step_2.cleanrl_model")
    ckpt["train_cpu_time"] = 1e6
    torch.save(ckpt, tmp_path / "spent.cleanrl_model")
    out = run_maml(["train", "--resume", tmp_path / "spent.cleanrl_model", "--cpu-budget", "1000"])
    assert "--cpu-budget 1000s reached after 3 of 4 outer steps" in out.stdout
    assert load(ck / "latest.cleanrl_model")["outer_steps_done"] == 3
    assert load(ck / "latest.cleanrl_model")["train_cpu_time"] > 1e6


def test_resume_refuses_other_settings_and_checkpoints_without_training_state(tmp_path):
    ck = tmp_path / "ck"
    runs = tmp_path / "runs"
    run_maml(["train", *SMALL, "--outer-steps", "2", "--ckpt-dir", ck, "--runs-dir", runs, "--save-model"])
    changed = run_maml(["train", "--resume", ck / "latest.cleanrl_model", "--hidden-size", "16"], check=False)
    assert changed.returncode == 2
    assert changed.stderr.strip() == (
        "maml_ssm.py: error: --resume keeps the run's settings: --hidden-size 16 differs from its 8"
    )
    (final,) = glob.glob(str(runs / "*" / "maml_ssm.cleanrl_model"))
    no_state = run_maml(["train", "--resume", final], check=False)
    assert no_state.returncode == 2 and "holds no training state" in no_state.stderr
    missing = run_maml(["train", "--resume", tmp_path / "nope.cleanrl_model"], check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    before = sha256(ck / "latest.cleanrl_model")
    longer = run_maml(["train", "--resume", ck / "latest.cleanrl_model", "--outer-steps", "3"])
    assert "after 2 outer steps" in longer.stdout
    assert before != sha256(ck / "latest.cleanrl_model") and load(ck / "step_3.cleanrl_model")["outer_steps_done"] == 3


def test_eval_and_adapt_take_the_checkpoints_config_and_refuse_another(tmp_path):
    ck = tmp_path / "ck"
    flags = ["--config", "basic", "--outer-steps", "1", "--hidden-size", "8", "--state-size", "4", "--tasks-per-batch", "2"]
    flags += ["--fast-batch-size", "2", "--max-episode-steps", "6", "--eval-tasks", "2", "--eval-steps", "1"]
    flags += ["--outer-optimizer", "adam", "--buffer-size", "10"]
    run_maml(["train", *flags, "--ckpt-dir", ck, "--runs-dir", tmp_path / "runs"])
    latest = ck / "latest.cleanrl_model"
    for command in (["eval"], ["adapt", "--num-tasks", "2", "--adapt-steps", "1"]):
        ok = run_maml([*command, "--checkpoint", latest, "--config", "basic", "--episodes", "1"])
        assert ok.returncode == 0
        refused = run_maml([*command, "--checkpoint", latest, "--config", "paper"], check=False)
        assert refused.returncode == 2
        assert refused.stderr.strip() == (
            "maml_ssm.py: error: --config paper contradicts the checkpoint's own --config basic; drop it"
        )


def test_episodes_help_says_what_it_counts():
    for cls in (maml_ssm.EvalArgs, maml_ssm.AdaptArgs):
        (field,) = [f for f in cls.__dataclass_fields__.values() if f.name == "episodes"]
        assert field.default is None
    help_text = run_maml(["eval", "--help"]).stdout
    assert "episodes each test task runs at each of the" in " ".join(help_text.split())


def test_the_pipeline_plans_workflow_runs_as_written(tmp_path):
    """The pipeline plan's commands, with `python main.py` -> this script, checkpoints/*.npz -> DIR/*.cleanrl_model
    and --ckpt-dir where the workflow expects checkpoints; the size flags after them make it tiny (a one-step Adam
    outer update, 6-step episodes, so --online adapts every 2 steps)."""
    ck = str(tmp_path / "checkpoints")
    tiny = ["--hidden-size", "4", "--state-size", "2", "--fast-batch-size", "1", "--max-episode-steps", "6"]
    tiny += ["--outer-optimizer", "adam", "--eval-tasks", "2", "--buffer-size", "100", "--runs-dir", str(tmp_path / "runs")]
    few = ["--num-tasks", "2"]
    plan = [
        ["train", "--config", "basic", "--outer-steps", "100", "--tasks-per-batch", "8", "--ckpt-dir", ck, *tiny],
        ["eval", "--checkpoint", f"{ck}/latest.cleanrl_model", "--episodes", "50"],
        ["eval", "--checkpoint", f"{ck}/latest.cleanrl_model", "--config", "basic", "--episodes", "20"],
        ["adapt", "--checkpoint", f"{ck}/latest.cleanrl_model", "--adapt-steps", "5", "--episodes", "50", *few],
        [
            "adapt",
            "--checkpoint",
            f"{ck}/step_100.cleanrl_model",
            "--adapt-steps",
            "20",
            "--online",
            *few,
            "--online-every",
            "2",
        ],
    ]
    for command in plan:
        run_maml(command)
    latest = load(f"{ck}/latest.cleanrl_model")
    assert latest["outer_steps_done"] == 100 and latest["args"]["tasks_per_batch"] == 8 and latest["args"]["seed"] == 42
    assert load_json(f"{ck}/adapt_online.json")["adapt_steps"] == 20 and load_json(f"{ck}/adapt.json")["adapt_steps"] == 5
    assert load_json(f"{ck}/eval.json")["num_tasks"] == 2
    # the plan's "custom hyperparameters" training command, parsed (running it is the same code at another size)
    custom = parsed_train_args(["train", "--outer-steps", "200", "--tasks-per-batch", "16"])
    assert (custom.outer_steps, custom.tasks_per_batch) == (200, 16)


def test_hybrid_plans_settings_are_the_defaults_and_the_buffer_size_is_logged(tmp_path):
    """The hybrid plan's buffer 10,000, experience batch 32 and weight 0.1 are the defaults; meta/buffer_size logs the
    ExperienceBuffer's size after each outer step: growing by the step's valid transitions, capped at --buffer-size,
    ending at the size the checkpoint saves."""
    assert maml_ssm.Args().buffer_size == 10_000
    aargs = maml_ssm.AdaptArgs("")
    assert (aargs.experience_batch_size, aargs.experience_weight) == (32, 0.1)
    runs = tmp_path / "runs"
    run_maml(["train", *SMALL, "--outer-steps", "4", "--buffer-size", "100", "--runs-dir", runs, "--save-model"])
    (run_dir,) = glob.glob(str(runs / "*"))
    sizes = [v for _, v in sorted(logged_scalars(run_dir)["meta/buffer_size"])]
    ckpt = load(os.path.join(run_dir, "maml_ssm.cleanrl_model"))
    # one outer step adds at most 2 tasks x 3 episodes x 12 steps = 72 transitions
    assert len(sizes) == 4 and 0 < sizes[0] <= 72 and sizes == sorted(sizes)
    assert sizes[-1] == 100 == ckpt["buffer"]["size"]
    off = tmp_path / "off"
    run_maml(["train", *SMALL, "--outer-steps", "1", "--buffer-size", "0", "--runs-dir", off])
    assert logged_scalars(only_run_dir(off))["meta/buffer_size"][0][1] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_flag_without_a_device_trains_on_cpu_as_without_it(tmp_path):
    """--cuda where no CUDA device exists trains on CPU, to the same weights as a run without it."""
    weights = []
    for flag in ([], ["--cuda"]):
        ck = tmp_path / f"ck{len(flag)}"
        out = run_maml(["train", *SMALL, "--outer-steps", "2", "--ckpt-dir", ck, "--runs-dir", tmp_path / "runs", *flag])
        assert "device cpu" in out.stdout
        weights.append(load(ck / "latest.cleanrl_model")["state_dict"])
    assert_same_tree(weights[0], weights[1], "state_dict")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_trains_the_policy_on_the_device(tmp_path):
    """--cuda puts the policy and its batches on the CUDA device; the checkpoint evaluates on CPU."""
    ck = tmp_path / "ck"
    out = run_maml(["train", *SMALL, "--outer-steps", "2", "--cuda", "--ckpt-dir", ck, "--runs-dir", tmp_path / "runs"])
    assert "device cuda" in out.stdout
    assert load(ck / "latest.cleanrl_model")["state_dict"]["encoder.weight"].is_cuda
    run_maml(["eval", "--checkpoint", ck / "latest.cleanrl_model"])


def test_adapt_episodes_sets_the_episodes_per_task_and_step(tmp_path, monkeypatch):
    """adapt --episodes N runs N episodes per test task at every step; without it, the checkpoint's fast_batch_size."""
    ck = tmp_path / "ck"
    run_maml(["train", *SMALL, "--outer-steps", "1", "--ckpt-dir", ck, "--runs-dir", tmp_path / "runs"])
    seen = []
    real = maml_ssm.make_env

    def spy(args, task_params, episodes_per_task, gen):
        seen.append(episodes_per_task)
        return real(args, task_params, episodes_per_task, gen)

    monkeypatch.setattr(maml_ssm, "make_env", spy)
    for episodes in (None, 2):
        aargs = maml_ssm.AdaptArgs(str(ck / "latest.cleanrl_model"), num_tasks=2, adapt_steps=1, episodes=episodes)
        res = maml_ssm.run_adaptation(aargs.checkpoint, aargs)
        assert res["num_tasks"] == 2
    assert seen == [3, 3, 2, 2]  # the no-adaptation rollout and the one adapter/objective pair, per call


def test_resume_without_the_helper_package_is_one_line_before_training(tmp_path):
    """--resume goes through cleanrl_astral_utils, so without it the flag is refused before any work."""
    r = run_copied_alone("maml_ssm", tmp_path, "train", "--resume", "ck/latest.cleanrl_model", "--runs-dir", "runs")
    assert_one_line_error(r, "--resume needs the cleanrl_astral_utils package: pip install -e . in the repository")
    assert not (tmp_path / "runs").exists()


def test_copied_alone_the_script_runs_the_plans_workflow(tmp_path):
    """maml_ssm.py alone in a folder, without the helper package: train with --ckpt-dir and --save-model (checkpoints
    and eval.json), eval of a --ckpt-dir checkpoint, adapt standard and hybrid, and adapt --online, each writing its
    results file; each plot the package would draw is skipped in one line."""
    r = run_copied_alone("maml_ssm", tmp_path, "train", "--save-model", "--ckpt-dir", "ck", "--runs-dir", "runs", *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "eval.png skipped: plots need the cleanrl_astral_utils package" in r.stdout
    run_dir = only_run_dir(str(tmp_path / "runs"))
    assert sorted(os.listdir(tmp_path / "ck")) == ["latest.cleanrl_model", "step_2.cleanrl_model"]
    assert load_json(os.path.join(run_dir, "eval.json"))["num_tasks"] == 3
    assert not os.path.exists(os.path.join(run_dir, "eval.png"))
    r = run_copied_alone("maml_ssm", tmp_path, "eval", "--checkpoint", "ck/latest.cleanrl_model", "--num-tasks", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_json(str(tmp_path / "ck" / "eval.json"))["num_tasks"] == 2
    ckpt = os.path.join(run_dir, "maml_ssm.cleanrl_model")
    adapt = ["adapt", "--checkpoint", ckpt, "--num-tasks", "2", "--adapt-steps", "1", "--episodes", "2"]
    r = run_copied_alone("maml_ssm", tmp_path, *adapt, "--adaptation-mode", "standard", "hybrid")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(load_json(os.path.join(run_dir, "adapt.json"))["results"]) == ["hybrid/pg", "standard/pg"]
    r = run_copied_alone("maml_ssm", tmp_path, *adapt, "--online", "--online-every", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_json(os.path.join(run_dir, "adapt_online.json"))["online"]
    assert "adapt_online.png skipped" in r.stdout and not os.path.exists(os.path.join(run_dir, "adapt_online.png"))
