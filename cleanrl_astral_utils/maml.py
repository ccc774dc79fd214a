"""What maml_ssm.py and maml_ssm_promp.py leave to the helper package: `train --resume` (checking and restoring the state
a --ckpt-dir checkpoint holds) and the plots beside eval.json and adapt.json. The scripts write and read their own
checkpoints and results files."""

import dataclasses
import random

import numpy as np
import torch

from cleanrl_astral_utils.stats import normal_ci95_half_width

# ------------------------------------------------------------------------------------------------ RESUME
# `train --resume` may change these; any other flag that differs from the checkpoint's is refused
RESUMABLE_FIELDS = (
    "resume",
    "outer_steps",
    "cpu_budget",
    "ckpt_dir",
    "ckpt_every",
    "save_model",
    "runs_dir",
    "log_every",
    "diagnostics",
    "num_threads",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "eval_tasks",
    "eval_steps",
    "eval_later_lr_scale",
    "eval_episodes",
)


def resumed_args(ckpt, args_cls, path):
    """The Args of the run a --ckpt-dir checkpoint (read from path) holds, with `resume` set to it: the defaults
    `train --resume` parses its flags over."""
    return args_cls(**{**ckpt["args"], "resume": path})


def read_resume_state(ckpt, args, path):
    """The checkpoint (read from path) `train --resume` continues, or a ValueError with a one-line reason: it holds no
    training state, or a flag outside RESUMABLE_FIELDS differs from the run's own."""
    if "training" not in ckpt:
        raise ValueError(f"--resume {path!r} holds no training state: resume from a checkpoint of train --ckpt-dir")
    for field in dataclasses.fields(args):
        saved = ckpt["args"].get(field.name, field.default)
        if field.name not in RESUMABLE_FIELDS and getattr(args, field.name) != saved:
            flag = "--" + field.name.replace("_", "-")
            raise ValueError(f"--resume keeps the run's settings: {flag} {getattr(args, field.name)} differs from its {saved}")
    return ckpt


def restore_training(saved, model, aux_opt, outer_opt, buffer, monitor, gen, train_rng):
    """Puts a --ckpt-dir checkpoint's state back in place: (train_tasks, global_step, {"wall", "cpu"} time spent)."""
    t = saved["training"]
    model.load_state_dict(saved["state_dict"])
    aux_opt.load_state_dict(t["aux_opt"])
    if outer_opt is not None:
        outer_opt.load_state_dict(t["outer_opt"])
    if buffer is not None:
        buffer.data = {k: v.clone() for k, v in saved["buffer"]["data"].items()}
        buffer.pos = saved["buffer"]["pos"]
        buffer.size = saved["buffer"]["size"]
    for key, value in saved["feature_stats"].items():
        setattr(monitor, key, value)
    gen.set_state(t["gen"])
    torch.set_rng_state(t["torch_rng"])
    np.random.set_state(t["numpy_rng"])
    random.setstate(t["python_rng"])
    train_rng.bit_generator.state = t["train_rng"]
    seen = np.asarray(saved["task_split"]["train_tasks"])
    train_tasks = list(seen.reshape(saved["outer_steps_done"], -1, seen.shape[1]))
    spent = {"wall": saved["train_wall_time"], "cpu": saved["train_cpu_time"]}
    return train_tasks, t["global_step"], spent


# ------------------------------------------------------------------------------------------------ PLOTS
mean_ci95_half_width = normal_ci95_half_width  # the scripts' mean_ci95_half_width (cleanrl_astral_utils.stats)


def plot_eval(result, path, policy):
    """eval.png: the returns of eval.json after 0..K inner steps."""
    plot_returns({policy: result}, path, f"{result['task']} / {policy}", "inner gradient steps")


def plot_adapt(result, path):
    """adapt.png: returns after 0..K adaptation steps per adapter/objective, with the no-adaptation level."""
    title = f"{result['task']}: test-time adaptation"
    if result["online"]:
        title += " (online)"
    plot_returns(result["results"], path, title, "adaptation steps", level=result["no_adaptation"]["return"])


def plot_returns(curves, path, title, xlabel, level=None):
    """Mean return (95% CI) after 0..K steps, one line per entry of `curves`; `level` draws the no-adaptation line."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend and no global figure state

    fig = Figure(figsize=(5.5, 3.6), layout="tight")
    ax = fig.subplots()
    for name, r in curves.items():
        ks = sorted(r["returns_after_steps"], key=int)
        ax.errorbar(
            [int(k) for k in ks],
            [r["returns_after_steps"][k] for k in ks],
            yerr=[r["ci95"][k] for k in ks],
            marker="o",
            capsize=2,
            label=name,
        )
    if level is not None:
        ax.axhline(level, color="grey", ls=":", lw=1, label="no adaptation (theta_0)")
    ax.set(xlabel=xlabel, ylabel="mean return (95% CI)", title=title)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
