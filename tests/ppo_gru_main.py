"""Running the training loop of ppo_gru_baseline.py or ppo_gru_astral.py in this process, to read what it computed: the
batch each update received, the agent that acted it, and the scalars it logged. The loop is the script's own main
block; only the names passed in (an environment built for the test, a patched agent) replace the module's."""

import ast
import copy
import inspect
import sys
import tempfile
from typing import NamedTuple


class Rollout(NamedTuple):
    agent: object
    """a copy of the agent that acted the rollout (taken before its update)"""
    batch: dict
    """a copy of the batch the update received, (T, N, ...) tensors"""
    initial_state: object
    """the GRU state the rollout started from"""
    episodes: list
    """the episodes that ended in the rollout, as logged: (return, length, mode or None, index of the step it ended in)"""


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


def run_main(module, *argv, **names):
    """Runs `module`'s main block with the command line `argv` (its run directory in a temporary directory), the
    module-level names in `names` replaced; returns a Run with one Rollout per update."""
    main = ast.parse(inspect.getsource(module)).body[-1]
    assert isinstance(main, ast.If) and ast.unparse(main.test) == "__name__ == '__main__'"
    code = compile(ast.Module(body=main.body, type_ignores=[]), module.__file__, "exec")
    updates = []
    writer = Writer()

    def ppo_update(agent, optimizer, batch, initial_state, *rest):
        updates.append((copy.deepcopy(agent), copy.deepcopy(batch), initial_state.clone()))
        return module.ppo_update(agent, optimizer, batch, initial_state, *rest)

    def summary_writer(*args, **kwargs):
        return writer

    namespace = {**vars(module), "ppo_update": ppo_update, "SummaryWriter": summary_writer, **names}
    saved_argv = sys.argv
    with tempfile.TemporaryDirectory() as runs_dir:
        sys.argv = [module.__file__, *map(str, argv), "--runs-dir", runs_dir]
        try:
            exec(code, namespace)
        finally:
            sys.argv = saved_argv
    args = namespace["args"]
    rollouts = []
    for i, (agent, batch, initial_state) in enumerate(updates):
        first_step = i * args.batch_size
        episodes = logged_episodes(writer.scalars, first_step, first_step + args.batch_size, args.num_envs)
        rollouts.append(Rollout(agent, batch, initial_state, episodes))
    return Run(rollouts, writer.scalars, namespace)
