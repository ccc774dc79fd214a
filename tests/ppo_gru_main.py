"""Running the training loop of ppo_gru_baseline.py or ppo_gru_astral.py in this process, to read what it computed: the
batch each update received, the agent that acted it, the advantages and returns, and the scalars it logged; or one
section of the loop (`# ADVANTAGES (GAE)`, `# UPDATE`) alone, on tensors a test builds. The code run is the script's own
main block; only the names passed in (an environment built for the test, a patched agent) replace the module's."""

import ast
import copy
import inspect
import sys
import tempfile
from typing import NamedTuple

import numpy as np
import torch


class Rollout(NamedTuple):
    agent: object
    """a copy of the agent that acted the rollout (taken before its update)"""
    batch: dict
    """a copy of the batch the update received, (T, N, ...) tensors"""
    initial_state: object
    """the GRU state the rollout started from"""
    episodes: list
    """the episodes that ended in the rollout, as logged: (return, length, mode or None, index of the step it ended in)"""
    advantages: object
    """the advantages the update received, (T, N)"""
    returns: object
    """the returns the update received, (T, N)"""
    next_value: object
    """the value of the step after the rollout, (N,), which the last step bootstraps from"""


class Run(NamedTuple):
    rollouts: list
    scalars: list
    """every scalar logged, (tag, value, step), in the order written"""
    namespace: dict
    """the main block's variables at its end"""


class Writer:
    """A SummaryWriter that keeps its scalars."""

    def __init__(self, *args, **kwargs):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, float(value), step))

    def add_text(self, *args, **kwargs):
        pass

    def close(self):
        pass


def logged_episodes(scalars, first_step, last_step, num_envs):
    """The episodes logged at steps in (first_step, last_step]: (return, length, mode or None, rollout step index)."""
    episodes = []
    for tag, value, step in scalars:
        if not first_step < step <= last_step:
            continue
        if tag == "charts/episodic_return":
            episodes.append([value, None, None, (step - first_step) // num_envs - 1])
        elif tag == "charts/episodic_length":
            episodes[-1][1] = int(value)
        elif tag.startswith("charts/episodic_return_mode"):
            episodes[-1][2] = int(tag[len("charts/episodic_return_mode") :])
    return [tuple(episode) for episode in episodes]


def given(envs):
    """A stand-in for the env class that returns `envs`, built by the test."""

    def make(*args, **kwargs):
        return envs

    return make


# the loop's storage of one rollout as a batch: {batch key: the main block's name}
STORAGE = {
    "inputs": "inputs",
    "starts": "starts",
    "actions": "actions",
    "logprobs": "logprobs",
    "rewards": "rewards",
    "values": "values",
    "weights": "gate_weights",
    "modes": "step_modes",
    "ages": "ages",
}
SECTIONS = ("# ROLLOUT", "# ADVANTAGES (GAE)", "# UPDATE", "# LOGGING")


def main_block(module):
    main = ast.parse(inspect.getsource(module)).body[-1]
    assert isinstance(main, ast.If) and ast.unparse(main.test) == "__name__ == '__main__'"
    return main


def training_loop(module):
    """The main block, its `for iteration in ...` loop, and the line of each of the loop's section comments."""
    main = main_block(module)
    loop = next(node for node in main.body if isinstance(node, ast.For) and ast.unparse(node.target) == "iteration")
    lines = inspect.getsource(module).splitlines()
    marks = {}
    for number in range(loop.lineno, loop.end_lineno + 1):
        if lines[number - 1].strip() in SECTIONS:
            marks[lines[number - 1].strip()] = number
    assert list(marks) == list(SECTIONS), marks
    return main, loop, marks


def section(module, name):
    """The statements of the loop's section `name` (from its comment to the next section's), compiled."""
    _, loop, marks = training_loop(module)
    first = marks[name]
    last = loop.end_lineno + 1
    later = [line for line in marks.values() if line > first]
    if later:
        last = min(later)
    body = [node for node in loop.body if first < node.lineno < last]
    return compile(ast.Module(body=body, type_ignores=[]), module.__file__, "exec")


def run_section(module, name, **names):
    """Runs the loop's section `name` with the module's names and `names`; returns the names it left."""
    namespace = {**vars(module), **names}
    exec(section(module, name), namespace)
    return namespace


class Critic:
    """Stands in for the agent in the GAE section: the value of the step after the rollout is `next_value`."""

    def __init__(self, next_value):
        self.next_value = next_value

    def get_value(self, x, state, starts):
        return self.next_value[None]


def gae(module, rewards, values, starts, next_value, next_start, gamma, gae_lambda):
    """(advantages, returns) of the loop's `# ADVANTAGES (GAE)` section on (T, N) tensors."""
    args = module.Args(gamma=gamma, gae_lambda=gae_lambda, num_steps=len(rewards), num_envs=rewards.shape[1])
    names = {
        "agent": Critic(next_value),
        "next_x": torch.zeros(rewards.shape[1]),
        "next_state": None,
        "next_start": next_start,
    }
    done = run_section(module, "# ADVANTAGES (GAE)", args=args, rewards=rewards, values=values, starts=starts, **names)
    return done["advantages"], done["returns"]


def update(module, agent, optimizer, batch, initial_state, advantages, returns, args, iteration=1):
    """Runs the loop's `# UPDATE` section on `batch` (a dict keyed as STORAGE, (T, N) tensors) and returns what the loop
    logs of it, keyed by tag without its group: value_loss, policy_loss, entropy, old_approx_kl, approx_kl, clipfrac,
    explained_variance, first_minibatch_ratio_error; ASTRAL's also first_minibatch_gate_error, slot_loss, each slot
    term computed and, on an update with the diagnostics, their gradient norms (grad_norm_*)."""
    args = copy.copy(args)
    args.num_envs = batch["inputs"].shape[1]
    args.num_steps = batch["inputs"].shape[0]
    names = {STORAGE[key]: value for key, value in batch.items()}
    done = run_section(
        module,
        "# UPDATE",
        agent=agent,
        optimizer=optimizer,
        initial_state=initial_state,
        advantages=advantages,
        returns=returns,
        args=args,
        iteration=iteration,
        **names,
    )
    stats = {
        "value_loss": done["v_loss"].item(),
        "policy_loss": done["pg_loss"].item(),
        "entropy": done["entropy_loss"].item(),
        "old_approx_kl": done["old_approx_kl"].item(),
        "approx_kl": done["approx_kl"].item(),
        "clipfrac": float(np.mean(done["clipfracs"])),
        "explained_variance": done["explained_var"],
        "first_minibatch_ratio_error": done["first_minibatch_ratio_error"],
    }
    if "slot_loss" in done:
        stats["first_minibatch_gate_error"] = done["first_minibatch_gate_error"]
        stats["slot_loss"] = done["slot_loss"].item()
        for name, value in done["terms"]._asdict().items():
            if value is not None:
                stats[name] = value.item()
        for tag, value in done["grad_norms"].items():
            stats[tag.split("/")[1]] = value
    return stats


def run_main(module, *argv, **names):
    """Runs `module`'s main block with the command line `argv` (its run directory in a temporary directory), the
    module-level names in `names` replaced; returns a Run with one Rollout per update, recorded where the loop's
    `# UPDATE` section begins."""
    main, loop, marks = training_loop(module)
    at = next(i for i, node in enumerate(loop.body) if node.lineno > marks["# UPDATE"])
    record = ast.Expr(ast.Call(ast.Name("__record_update__", ast.Load()), [], []))
    loop.body.insert(at, ast.fix_missing_locations(ast.copy_location(record, loop.body[at])))
    code = compile(ast.Module(body=main.body, type_ignores=[]), module.__file__, "exec")
    updates = []
    writer = Writer()

    def record_update():
        batch = {key: namespace[name].clone() for key, name in STORAGE.items() if name in namespace}
        seen = [namespace[name].clone() for name in ("initial_state", "advantages", "returns", "next_value")]
        updates.append((copy.deepcopy(namespace["agent"]), batch, *seen))

    def summary_writer(*args, **kwargs):
        return writer

    namespace = {**vars(module), "__record_update__": record_update, "SummaryWriter": summary_writer, **names}
    saved_argv = sys.argv
    with tempfile.TemporaryDirectory() as runs_dir:
        sys.argv = [module.__file__, *map(str, argv), "--runs-dir", runs_dir]
        try:
            exec(code, namespace)
        finally:
            sys.argv = saved_argv
    args = namespace["args"]
    rollouts = []
    for i, (agent, batch, initial_state, advantages, returns, next_value) in enumerate(updates):
        first_step = i * args.batch_size
        episodes = logged_episodes(writer.scalars, first_step, first_step + args.batch_size, args.num_envs)
        rollouts.append(Rollout(agent, batch, initial_state, episodes, advantages, returns, next_value))
    return Run(rollouts, writer.scalars, namespace)
