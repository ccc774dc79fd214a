"""What maml_ssm.py and maml_ssm_promp.py need besides the method: writing and refusing checkpoints, the state `train
--resume` restores, the evaluation and adaptation reports (eval.json, adapt.json, their 95% CIs and plots). The scripts
import it only where a run saves, resumes or evaluates a model."""

import dataclasses
import json
import os
import random

import numpy as np
import torch

from cleanrl_astral_utils.files import atomic_torch_save, atomic_write_json
from cleanrl_astral_utils.stats import normal_ci95_half_width


# ------------------------------------------------------------------------------------------------ CHECKPOINTS
def save_checkpoint(path, model, args, task_split, task_version, extra=None, script="maml_ssm"):
    """The model's weights, its full config, the task split and version, and `extra`, written atomically; `script`
    names the script that wrote it."""
    ckpt = {
        "state_dict": model.state_dict(),
        "args": dataclasses.asdict(args),
        "script": script,
        "task_split": task_split,
        "param_count": sum(p.numel() for p in model.parameters()),
        "task_version": task_version,
    }
    if extra:
        ckpt.update(extra)
    atomic_torch_save(ckpt, path)


# per script, config fields that its older checkpoints carry and its Args do not: `adapt`'s settings live in its own
# Args, video capture does not exist for batched tensor tasks, and ProMP with its LVC inner estimator is maml_ssm_promp.py
RETIRED_FIELDS = {
    "maml_ssm": ("adapt_steps", "adapt_lr", "capture_video", "inner_estimator", "promp_steps", "clip_coef", "inner_kl_coef"),
    "maml_ssm_promp": (),
}


def read_checkpoint(path, script, args_cls, also=()):
    """The checkpoint dict written by `script` or a script of `also` (its config without the fields `args_cls` lacks
    that RETIRED_FIELDS[script] lists), or a ValueError with a one-line reason."""
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path!r} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # corrupted or not a torch file
        raise ValueError(f"cannot read checkpoint {path!r}: {type(e).__name__}") from e
    if not isinstance(ckpt, dict):
        raise ValueError(f"{path!r} is not a {script} checkpoint")
    config = ckpt.get("args", {})
    # ProMP and its LVC inner estimator are cleanrl_astral/maml_ssm_promp.py's, whose checkpoints carry its own config
    if ckpt.get("script") == "maml_ssm" and config.get("outer_optimizer") == "promp":
        raise ValueError(f"{path!r} was trained with ProMP by maml_ssm.py: retrain it with cleanrl_astral/maml_ssm_promp.py")
    if ckpt.get("script") == "maml_ssm" and config.get("inner_estimator", "reinforce") != "reinforce":
        raise ValueError(
            f"{path!r} was trained with the LVC inner estimator: retrain it with cleanrl_astral/maml_ssm_promp.py"
        )
    if ckpt.get("script") in RETIRED_FIELDS and ckpt.get("script") not in (script, *also):
        raise ValueError(f"{path!r} is a {ckpt['script']} checkpoint: run cleanrl_astral/{ckpt['script']}.py on it")
    if ckpt.get("script") not in (script, *also):
        raise ValueError(f"{path!r} is not a {script} checkpoint")
    missing = [k for k in ("state_dict", "args", "task_split") if k not in ckpt]
    fields = {f.name for f in dataclasses.fields(args_cls)}
    config = {k: v for k, v in config.items() if k in fields or k not in RETIRED_FIELDS[script]}
    unknown = set(config) - fields
    if missing or unknown:
        raise ValueError(f"checkpoint {path!r} lacks {missing} or has unknown config fields {sorted(unknown)}")
    ckpt["args"] = config
    return ckpt


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
    "num_threads",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "eval_tasks",
    "eval_steps",
    "eval_later_lr_scale",
    "eval_episodes",
)


def resumed_args(path, args_cls, script):
    """The Args of the run a --ckpt-dir checkpoint holds, with `resume` set to it: the defaults `train --resume` parses
    its flags over."""
    ckpt = read_checkpoint(path, script, args_cls)
    return args_cls(**{**ckpt["args"], "resume": path})


def read_resume_state(path, args, script):
    """The checkpoint `train --resume` continues, or a ValueError with a one-line reason: it holds no training state,
    or a flag outside RESUMABLE_FIELDS differs from the run's own."""
    ckpt = read_checkpoint(path, script, type(args))
    if "training" not in ckpt:
        raise ValueError(f"--resume {path!r} holds no training state: resume from a checkpoint of train --ckpt-dir")
    for field in dataclasses.fields(args):
        saved = ckpt["args"].get(field.name, field.default)
        if field.name not in RESUMABLE_FIELDS and getattr(args, field.name) != saved:
            flag = "--" + field.name.replace("_", "-")
            raise ValueError(f"--resume keeps the run's settings: {flag} {getattr(args, field.name)} differs from its {saved}")
    return ckpt


def training_state(aux_opt, outer_opt, gen, train_rng, global_step, run_dir):
    """What --resume restores besides the model, buffer and feature statistics: optimizers, every RNG, the step."""
    outer = None
    if outer_opt is not None:
        outer = outer_opt.state_dict()
    return {
        "aux_opt": aux_opt.state_dict(),
        "outer_opt": outer,
        "gen": gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
        "train_rng": train_rng.bit_generator.state,
        "global_step": global_step,
        "run_dir": run_dir,
    }


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


# ------------------------------------------------------------------------------------------------ TASK SPLIT
def check_task_split(ckpt, task, task_version, check_ranges, ranges):
    """A ValueError with a one-line reason when the checkpoint's tasks are not the ones this script runs: another task
    in its split than in its config, other train/test ranges (`ranges`: {split key: ranges}), another task version."""
    split = ckpt["task_split"]
    version = ckpt.get("task_version", 1)
    if split.get("task") != task:
        raise ValueError(f"checkpoint task split is for {split.get('task')!r} but its config says {task!r}")
    if check_ranges:
        for key, expected in ranges.items():
            if json.dumps(split.get(key)) != json.dumps(expected):
                raise ValueError(
                    f"the checkpoint's cartpole {key.replace('_', ' ')} {split.get(key)} are not this script's "
                    f"{[list(r) for r in expected]} (gravity, pole length); retrain it with this script"
                )
    if version != task_version:
        raise ValueError(
            f"checkpoint was trained on version {version} of {task}, this script runs version {task_version} "
            "(see TASK_VERSIONS); retrain it"
        )


# ------------------------------------------------------------------------------------------------ REPORTS
mean_ci95_half_width = normal_ci95_half_width  # 1.96 sample sd / sqrt(n) over tasks (cleanrl_astral_utils.stats)


def summarise(per_step):
    """{"returns_after_steps": mean over tasks, "ci95": its 95% CI half-width}, keyed by the step as a string."""
    return {
        "returns_after_steps": {str(k): float(r.mean()) for k, r in enumerate(per_step)},
        "ci95": {str(k): mean_ci95_half_width(r) for k, r in enumerate(per_step)},
    }


def write_eval_report(result, checkpoint, policy):
    """eval.json and eval.png beside the checkpoint."""
    out_dir = os.path.dirname(os.path.abspath(checkpoint))
    atomic_write_json(result, os.path.join(out_dir, "eval.json"))
    plot_returns({policy: result}, os.path.join(out_dir, "eval.png"), f"{result['task']} / {policy}", "inner gradient steps")


def write_adapt_report(result, stem):
    """{stem}.json and {stem}.png: returns after 0..K adaptation steps per adapter/objective, with the no-adaptation
    level."""
    atomic_write_json(result, stem + ".json")
    title = f"{result['task']}: test-time adaptation"
    if result["online"]:
        title += " (online)"
    plot_returns(result["results"], stem + ".png", title, "adaptation steps", level=result["no_adaptation"]["return"])


def log_adaptation(writer, tag, step_logs, per_step, mon):
    """`adapt`'s TensorBoard scalars of one adapter x objective: each adaptation step's statistics (x axis: the step
    of any task), then the return and monitor statistics after k steps (x axis: k)."""
    for i, row in enumerate(step_logs):
        for key in ("loss_before", "loss_after", "grad_norm", "drift", "guard_fired"):
            writer.add_scalar(tag + key, float(row[key]), i)
    for k, (r, row) in enumerate(zip(per_step, mon)):
        for key, v in {"return_after_steps": r.mean(), **row}.items():
            writer.add_scalar(tag + key, float(v), k)


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
