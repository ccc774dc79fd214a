"""reinforce_baby's checkpoints and resume (--checkpoint-every, --resume): the whole training state, random generators
included, written atomically and restored before the first update, so that a resumed run with the rule parent makes the
same updates, bit for bit, as one never stopped. What the script's run objects hold is read through their attributes;
the script's Args class and name are passed in (the package does not import the script)."""

import collections
import dataclasses
import os
import random

import numpy as np
import torch

from cleanrl_astral_utils.files import atomic_torch_save


class Checkpoints:
    """--checkpoint-every: the whole training state at `path`, atomically, every `every` steps and after the last update;
    `resumed` (--resume): such a state, restored before the first update. The random generators are part of it, so a
    resumed run with the rule parent makes the same updates, bit for bit, as one never stopped."""

    def __init__(self, path: str, every: int, script: str, resumed: dict | None = None):
        self.path = path
        self.every = every
        self.script = script
        self.resumed = resumed

    def due(self, iteration: int, args) -> bool:
        """After the last update, and after each update that crosses a multiple of `every` steps."""
        step = iteration * args.batch_size
        return iteration == args.num_iterations or step // self.every > (step - args.batch_size) // self.every

    def save(self, args, iteration, agent, optimizer, baseline, curriculum, env, log, parent):
        log.writer.flush()  # the scalars up to this update are on disk before the state that follows them
        state = {
            "script": self.script,
            "args": dataclasses.asdict(args),
            "iteration": iteration,
            "global_step": iteration * args.batch_size,
            "agent": agent.state_dict(),
            "optimizer": optimizer.state_dict(),
            "baseline": baseline,
            "levels": dict(curriculum.levels),
            "history": {t: list(h) for t, h in curriculum.history.items()},
            "recent_success": list(log.recent_success),
            "recent_level": {key: list(d) for key, d in log.recent_level.items()},
            "env_rng": env.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
        }
        if hasattr(parent, "state_dict"):  # an LLM parent: its running totals (its answers are in the sqlite cache)
            state["parent"] = parent.state_dict()
        atomic_torch_save(state, self.path)
        print(f"checkpoint written to {self.path} at global_step={state['global_step']}", flush=True)

    def restore(self, agent, optimizer, curriculum, env, log, parent) -> tuple[int, torch.Tensor]:
        """Loads the resumed state into the run's objects; (the next iteration, REINFORCE's baseline)."""
        state = self.resumed
        agent.load_state_dict(state["agent"])
        optimizer.load_state_dict(state["optimizer"])
        curriculum.levels.update(state["levels"])
        for t, h in state["history"].items():
            curriculum.history[t].extend(h)
        log.recent_success.extend(state["recent_success"])
        for key, values in state["recent_level"].items():
            log.recent_level[key] = collections.deque(values, maxlen=100)
        env.rng.bit_generator.state = state["env_rng"]
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        if "parent" in state:
            parent.load_state_dict(state["parent"])
        return state["iteration"] + 1, state["baseline"]


def resumed_args(args, args_type: type, script: str) -> tuple:
    """--resume: (the Args, of `args_type`, of the run the checkpoint continues, the checkpoint). --llm-base-url may
    name a restarted server; every other flag is the run's own."""
    if not os.path.isfile(args.resume):
        raise ValueError(f"--resume {args.resume!r} is not a file: pass the checkpoint.pt of a run with --checkpoint-every")
    try:
        state = torch.load(args.resume, map_location="cpu", weights_only=False)
    except Exception as e:  # whatever the file holds, it is no checkpoint
        raise ValueError(f"--resume {args.resume!r} cannot be read as a checkpoint ({type(e).__name__})") from e
    if not isinstance(state, dict) or state.get("script") != script or "agent" not in state:
        raise ValueError(f"--resume {args.resume!r} is not a checkpoint of {script}.py")
    saved = args_type(**state["args"])
    saved.resume = args.resume
    # the run's directory is the checkpoint's; the default LLM cache beside it is found again
    saved.runs_dir = os.path.dirname(os.path.dirname(os.path.abspath(args.resume)))
    if args.llm_base_url is not None:
        saved.llm_base_url = args.llm_base_url
    return saved, state
