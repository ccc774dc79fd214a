"""Tests for cleanrl_astral/tta_gating.py: its agent and environment are ppo_gru_astral.py's and act alike on the same
weights (both designs), a checkpoint of another format is refused, each control updates exactly the parameters it promises with
losses of the right sign and bootstrap, the subcommands run end to end with the numbers their names say, and bad input
fails with one line. The reports' arithmetic is tested in test_tta_reports.py."""

import dataclasses
import glob
import inspect
import math
import os
import runpy
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest
import torch
import tyro
from helpers import (
    REPO,
    SCRIPT_ENV,
    assert_one_line_error,
    load_json,
    logged_scalars,
    only_run_dir,
    run_script,
    script_path,
    sha256,
)

import cleanrl_astral.ppo_gru_astral as ppo_gru_astral
import cleanrl_astral.tta_gating as tta_gating
from cleanrl_astral_utils import tta
from cleanrl_astral_utils.cartpole import KINDS

TINY_TRAIN = (
    "--num-envs 4 --num-steps 16 --num-minibatches 2 --update-epochs 1 --hidden-size 16 --slot-dim 8 "
    "--total-timesteps 64 --save-model --eval-episodes 1"
).split()
GATE_KEYS = {"bank.gate.0.weight", "bank.gate.0.bias", "bank.gate.2.weight", "bank.gate.2.bias"}
MIRROR4 = ["--modes-preset", "mirror4", "--mode-share", "balanced"]
# the plan's design at a tiny width: slots of d_model
PLAN = ["--design", "plan", "--hidden-size", "16", "--slot-dim", "16"]
# checkpoints the documented results were made with, of another format
DOCUMENTED_CHECKPOINTS = [
    "benchmark/out/cartpole_main/runs/c1__g0_modes-preset_seed3__s1/*/ppo_gru_astral.cleanrl_model",
    "benchmark/out/astral_study/phase_C/runs/c0__g0_base__s6/*/frozen.cleanrl_model",
]


def train_astral(runs, *flags):
    """The checkpoint of a tiny ppo_gru_astral.py run (the real producer, not a hand-made dict) with `flags`."""
    run_script("ppo_gru_astral", *TINY_TRAIN, *flags, "--runs-dir", str(runs), check=True)
    (path,) = glob.glob(str(runs / "*" / "*.cleanrl_model"))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return train_astral(tmp_path_factory.mktemp("astral_runs"))


@pytest.fixture(scope="module")
def mirror4_checkpoint(tmp_path_factory):
    return train_astral(tmp_path_factory.mktemp("astral_mirror4"), *MIRROR4)


@pytest.fixture(scope="module")
def plan_checkpoint(tmp_path_factory):
    """The plan's design on mirror4, so that swap has both force signs and a held-out mode."""
    return train_astral(tmp_path_factory.mktemp("astral_plan"), *MIRROR4, *PLAN)


class Ran(NamedTuple):
    run_dir: str
    stdout: str


def run_tta(subcommand, checkpoint, runs_dir, *flags):
    """tta_gating.py `subcommand` on `checkpoint` into `runs_dir`, which must succeed: its run directory and stdout."""
    result = run_script("tta_gating", subcommand, "--checkpoint", checkpoint, *flags, "--runs-dir", runs_dir)
    assert result.returncode == 0, result.stderr
    return Ran(only_run_dir(runs_dir), result.stdout)


def edited_checkpoint(path, out, slots=None, actor_scale=1.0, **args):
    """The checkpoint with other slots, a scaled actor output layer or other args, saved to `out`."""
    ckpt = torch.load(path, weights_only=True)
    if slots is not None:
        ckpt["state_dict"]["bank.slots"] = slots
    ckpt["state_dict"]["actor.2.weight"] = ckpt["state_dict"]["actor.2.weight"] * actor_scale
    ckpt["args"].update(args)
    torch.save(ckpt, out)
    return str(out)


def sharpened(path, tmp_path):
    """The tiny checkpoint with large, distinct slots, so the gate has leverage over the policy."""
    shape = torch.load(path, weights_only=True)["state_dict"]["bank.slots"].shape
    slots = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3.0
    return edited_checkpoint(path, tmp_path / "sharp.cleanrl_model", slots)


def adapt_args(path, **overrides):
    defaults = {"checkpoint": path, "episodes": 2, "num_seeds": 1, "eval_episodes": 2, "adapt_lr": 0.05}
    return tta_gating.AdaptArgs(**{**defaults, **overrides})


def prepared(args):
    """The checks tta_gating.prepare runs before any work, in its order; returns (checkpoint path, critic reward scale)."""
    tta_gating.validate(args)
    path = tta_gating.find_checkpoint(args)
    ckpt, _ = tta_gating.load_astral_checkpoint(path)
    targets = tta_gating.resolve_targets(args.mode_indices, args.modes, ckpt)
    tta_gating.validate_against_checkpoint(args, ckpt, targets)
    return path, tta_gating.critic_reward_scale(args, ckpt)


def target_of(ckpt, k=0):
    return tta_gating.resolve_targets([k], None, ckpt)[0]


def new_env(ckpt, k=0):
    return tta_gating.target_env(1, target_of(ckpt, k), ckpt["args"]["hide_velocity"])


def zeros_state(agent):
    return torch.zeros(1, agent.hidden_size)


# --- the same agent in the same environment as ppo_gru_astral.py ----------------------------------------------------


def test_agent_and_environment_are_the_training_scripts_text():
    """Copies between the scripts are the same text, so that a diff shows only what differs in method."""
    copied = [
        "NonStationaryCartPole",
        "layer_init",
        "AbstractionBank",
        "FiLM",
        "PlanFiLM",
        "Modulated",
        "ActionAndValue",
        "Agent",
    ]
    for name in [*copied, "agent_from_args", "claim_run_dir"]:
        assert inspect.getsource(getattr(tta_gating, name)) == inspect.getsource(getattr(ppo_gru_astral, name)), name
    assert tta_gating.HELD_OUT_MODES == ppo_gru_astral.HELD_OUT_MODES


# a run of a few thousand steps per option: the forward-pass options, the plan's design, and the training-only options
# with the mirror4 preset and its held-out mode
OPTIONS = {
    "plain": [],
    "oracle_memoryless": ["--oracle", "--memory", "none"],
    "plan_design": PLAN,
    "mirror4_training_options": [
        *MIRROR4,
        *"--hide-velocity --num-abstractions 4 --slot-init orthonormal --lambda-consistency 0.1".split(),
    ],
}


@pytest.fixture(scope="module", params=list(OPTIONS))
def option_checkpoint(request, tmp_path_factory):
    longer = ["--num-envs", "8", "--num-steps", "32", "--total-timesteps", "2048"]
    return train_astral(tmp_path_factory.mktemp(f"astral_{request.param}"), *longer, *OPTIONS[request.param])


def test_agent_gives_the_training_agents_outputs_for_its_state_dict(option_checkpoint):
    """Same log-probs, values, final state, gate weights and probabilities on the same inputs, sampled with the same
    torch seed and deterministic: the oracle input, the memoryless agent, the plan's design, and a clamped gate; the
    loaded agent's only other parameter is the zero context."""
    ckpt, agent = tta_gating.load_astral_checkpoint(option_checkpoint)
    reference = ppo_gru_astral.agent_from_args(ppo_gru_astral.Args(**ckpt["args"]), len(ckpt["modes"]))
    reference.load_state_dict(ckpt["state_dict"])
    assert set(agent.state_dict()) == set(reference.state_dict()) | {"bank.context"}
    assert torch.equal(agent.bank.context, torch.zeros(ckpt["args"]["num_abstractions"]))
    num_slots = ckpt["args"]["num_abstractions"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, agent.input_dim, generator=gen)
    starts = (torch.rand(12, 5, generator=gen) < 0.2).float()
    state = torch.randn(5, agent.hidden_size, generator=gen)
    actions = torch.randint(0, 2, (12, 5), generator=gen)
    clamped = torch.softmax(torch.randn(12, 5, num_slots, generator=gen), -1)
    for weights, deterministic in ((None, False), (None, True), (clamped, False)):
        torch.manual_seed(1)
        expected = reference.get_action_and_value(x, state, starts, actions, deterministic, weights)
        torch.manual_seed(1)
        out = agent.get_action_and_value(x, state, starts, actions, deterministic, weights)
        for name, value in expected._asdict().items():
            assert torch.equal(getattr(out, name), value), name


def test_evaluation_reproduces_the_training_scripts_evaluate(option_checkpoint, monkeypatch):
    """evaluate_target with seed s + 1000 k plays ppo_gru_astral.evaluate's episodes of mode k (seed s; torch seeded alike
    for the sampled kind): same returns, same mean gate weights, in every mode of the checkpoint, held-out ones included."""
    ckpt, agent = tta_gating.load_astral_checkpoint(option_checkpoint)
    real = ppo_gru_astral.first_episodes

    def seeded(agent_, envs, seed, deterministic):
        torch.manual_seed(seed)
        return real(agent_, envs, seed, deterministic)

    monkeypatch.setattr(ppo_gru_astral, "first_episodes", seeded)
    targets = tta_gating.resolve_targets(None, None, ckpt)
    hide_velocity = ckpt["args"]["hide_velocity"]
    held_out = ppo_gru_astral.HELD_OUT_MODES[ckpt["args"]["modes_preset"]]
    assert [t["held_out"] for t in targets] == [k in held_out for k in range(len(targets))]
    for kind in KINDS:
        deterministic = kind == "deterministic"
        reference = ppo_gru_astral.evaluate(option_checkpoint, 4, deterministic=deterministic, seed=11)
        for k, target in enumerate(targets):
            evaluation = tta_gating.evaluate_target(agent, target, hide_velocity, 4, deterministic, 11 + 1000 * k)
            assert np.array_equal(evaluation.returns, reference["returns"][k]), (target["name"], kind)
            assert np.allclose(evaluation.slot_weights, reference["slot_weights"][k], atol=1e-6)
            # each episode's mean gate, weighted by its length, averages to the mean gate over every step
            lengths = np.asarray(reference["returns"][k])[:, None]  # one reward per step
            per_episode = (evaluation.episode_slot_weights * lengths).sum(0) / lengths.sum()
            assert np.allclose(per_episode, evaluation.slot_weights, atol=1e-6)
    # another seed plays other episodes, so equal returns are not a coincidence of the seed
    other = tta_gating.evaluate_target(agent, target, hide_velocity, 4, deterministic, 12)
    assert not np.array_equal(evaluation.returns, other.returns)


# --- checkpoints of another format ----------------------------------------------------------------------------------


def test_the_checkpoint_args_tta_gating_reads_are_the_ones_ppo_gru_astral_writes():
    """A checkpoint whose Args differ from ASTRAL_ARGS is refused, so the list is exactly ppo_gru_astral.py's Args."""
    fields = [field.name for field in dataclasses.fields(ppo_gru_astral.Args)]
    assert tta_gating.ASTRAL_ARGS == fields


@pytest.mark.parametrize("pattern", DOCUMENTED_CHECKPOINTS)
def test_a_checkpoint_of_another_format_is_refused_naming_the_commit_that_reads_it(pattern, tmp_path):
    """The documented results' checkpoints (format 1) are read at commit 95652a5: refused in one line before any work."""
    (path,) = glob.glob(os.path.join(REPO, pattern))
    assert torch.load(path, weights_only=True)["format"] == 1
    with pytest.raises(ValueError, match="holds another format of ppo_gru_astral.py's checkpoint; commit 95652a5 reads it"):
        tta_gating.load_astral_checkpoint(path)
    result = run_script("tta_gating", "clamp", "--checkpoint", path, "--runs-dir", tmp_path)
    assert_one_line_error(result, "commit 95652a5 reads it")
    assert os.listdir(tmp_path) == []


# --- the gate, the clamp and the context -----------------------------------------------------------------------------


def test_clamping_slot_k_makes_z_equal_slot_k_exactly(checkpoint, tmp_path):
    ckpt, agent = tta_gating.load_astral_checkpoint(sharpened(checkpoint, tmp_path))
    num_slots = agent.bank.slots.shape[0]
    hidden = torch.randn(7, 4, agent.hidden_size)
    x = torch.randn(7, 4, agent.input_dim)
    state = torch.zeros(4, agent.hidden_size)
    starts = torch.zeros(7, 4)
    outputs = []
    for k in range(num_slots):
        onehot = torch.eye(num_slots)[k].expand(7, 4, num_slots)
        z, w, _ = agent.bank(hidden, onehot)
        assert torch.equal(z, agent.bank.slots[k].expand_as(z))
        assert torch.equal(w, onehot)
        outputs.append(agent.actor(agent(x, state, starts, onehot).hidden))
    assert not torch.allclose(outputs[0], outputs[1])  # distinct slots give distinct policies
    clamped = tta_gating.evaluate_target(agent, target_of(ckpt), False, 2, True, 0, torch.eye(num_slots)[1])
    assert np.array_equal(clamped.slot_weights, np.eye(num_slots)[1])


def test_context_is_a_bias_on_the_gate_logits(checkpoint):
    """p = softmax((g(h) + c) / τ). If this failed, the context were added after the softmax or not at all."""
    _, agent = tta_gating.load_astral_checkpoint(checkpoint)
    hidden = torch.randn(5, agent.hidden_size)
    context = torch.tensor([2.0, -1.0, 0.5])
    with torch.no_grad():
        logits = agent.bank.gate(hidden)  # g(h), the context zero as loaded
        agent.bank.context.copy_(context)
        _, _, probs = agent.bank(hidden)
    assert torch.allclose(probs, torch.softmax((logits + context) / agent.bank.tau, -1))
    assert not torch.allclose(probs, torch.softmax(logits / agent.bank.tau, -1))


# --- what each control updates, and with which loss ----------------------------------------------------------------


@pytest.mark.parametrize("online", [False, True])
def test_each_control_updates_only_its_parameters(checkpoint, online):
    """If this failed, `gate` (the method) adapted more than the gate, and its gain were not the gate's."""
    path = checkpoint
    ckpt, _ = tta_gating.load_astral_checkpoint(path)
    args = adapt_args(path, online=online, online_every=4)
    curves = {}
    for control in tta_gating.CONTROLS:
        adapted = tta_gating.adaptation(ckpt, target_of(ckpt, 1), control, 3, args, 1.0)
        curves[control] = adapted.returns
        loaded = {**ckpt["state_dict"], "bank.context": torch.zeros(3)}
        changed = {name for name, value in adapted.agent.state_dict().items() if not torch.equal(value, loaded[name])}
        expected = {
            "none": set(),
            "gate": GATE_KEYS,
            "tent": GATE_KEYS,
            "context": {"bank.context"},
            # every parameter of the checkpoint that the REINFORCE loss reaches: all but the critic
            "all": {n for n, _ in adapted.agent.named_parameters() if not n.startswith("critic.")} - {"bank.context"},
        }
        assert changed == expected[control], control
        assert (adapted.updates == 0) == (control == "none")
        assert control == "none" or adapted.updates >= 2
    if not online:  # identical episodes until the parameters differ: the first episode is the same for every control
        assert len({returns[0] for returns in curves.values()}) == 1


class Episode(NamedTuple):
    inputs: list
    starts: list
    actions: list
    logprobs: list
    rewards: list


def play_episode(agent, env, mode, seed):
    """One sampled episode with the graph kept."""
    obs, _ = env.reset(seed=seed)
    torch.manual_seed(seed)
    state = zeros_state(agent)
    prev_action = -1
    prev_reward = 0.0
    start = 1.0
    episode = Episode([], [], [], [], [])
    done = False
    while not done:
        inputs = [torch.as_tensor(obs), torch.tensor([prev_action]), torch.tensor([prev_reward]), torch.tensor([mode])]
        episode.inputs.append(agent.build_input(*inputs))
        episode.starts.append(start)
        step = tta_gating.policy_step(agent, obs, [prev_action], [prev_reward], [mode], state, [start])
        state = step.state
        action = step.dist.sample()
        episode.logprobs.append(step.dist.log_prob(action))
        prev_action = int(action)
        episode.actions.append(prev_action)
        obs, reward, terminated, truncated, _ = env.step(action.numpy())
        prev_reward = float(reward[0])
        episode.rewards.append(prev_reward)
        start = 0.0
        done = bool(terminated[0] or truncated[0])
    return episode


@pytest.mark.parametrize("control,reached", [("gate", GATE_KEYS), ("context", {"bank.context"})])
def test_reinforce_loss_reaches_only_the_adapted_parameters_and_ascends_the_objective(checkpoint, tmp_path, control, reached):
    """The plan's REINFORCE on the gate, with its log-probabilities carrying a graph through the gate (the plan's sketch
    computes them under no_grad, which leaves nothing to differentiate)."""
    ckpt, agent = tta_gating.load_astral_checkpoint(sharpened(checkpoint, tmp_path))
    params = tta_gating.adapted_parameters(agent, control)
    episode = play_episode(agent, new_env(ckpt), 0, 0)
    assert len(episode.rewards) > 2
    loss = tta_gating.reinforce_loss(torch.cat(episode.logprobs), episode.rewards, 0.99)
    loss.backward()
    for name, param in agent.named_parameters():
        assert (param.grad is not None and param.grad.abs().sum() > 0) == (name in reached), name
    with torch.no_grad():
        detached = tta_gating.policy_step(agent, np.zeros((1, 4), np.float32), [-1], [0.0], [0], zeros_state(agent), [1.0])
    assert not tta_gating.reinforce_loss(detached.dist.log_prob(torch.tensor([0])), [1.0], 0.99).requires_grad

    def objective():  # sum_t G_t log pi(a_t) on the replayed episode
        with torch.no_grad():
            starts = torch.tensor(episode.starts)[:, None]
            logits = agent.actor(agent(torch.stack(episode.inputs), zeros_state(agent), starts).hidden)
            logprobs = torch.distributions.Categorical(logits=logits).log_prob(torch.tensor(episode.actions)[:, None])
        return -tta_gating.reinforce_loss(logprobs[:, 0], episode.rewards, 0.99).item()

    before = objective()
    assert before == pytest.approx(-loss.item(), abs=1e-6)  # the replay reproduces the acted log-probs
    # The gate's gradient is small (|g|^2 ~ 1e-7 to 1e-6), and float32 rounding moves the objective by up to ~5e-8 across
    # kernel paths: a step sized to a first-order gain of 1e-5 stays in the linear regime and rises far above that noise.
    squared_norm = sum(float((p.grad**2).sum()) for p in params)
    predicted_gain = 1e-5
    torch.optim.SGD(params, lr=predicted_gain / squared_norm).step()
    assert objective() - before > 0.5 * predicted_gain


def test_reinforce_loss_is_minus_the_mean_of_log_prob_times_the_normalised_return():
    """gradient w.r.t. log pi(a_t) is -G^_t / T, G^ standardised with ddof=1. With the opposite sign the adaptation
    would descend the return (the ascent test cannot see that: it measures the objective with reinforce_loss itself)."""
    logprobs = torch.zeros(3, requires_grad=True)
    returns = np.array([1.0 + 0.5 * (0.0 + 0.5 * 2.0), 0.0 + 0.5 * 2.0, 2.0])  # [1.5, 1.0, 2.0]
    tta_gating.reinforce_loss(logprobs, [1.0, 0.0, 2.0], 0.5).backward()
    expected = -torch.tensor((returns - returns.mean()) / returns.std(ddof=1), dtype=torch.float32) / 3
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)
    assert logprobs.grad[2] < 0 < logprobs.grad[1]  # the best step's log-probability is pushed up


def test_discounted_returns_and_the_actor_critic_loss():
    assert np.allclose(tta_gating.discounted_returns([1.0, 1.0, 1.0], 0.5), [1.75, 1.5, 1.0])
    assert np.allclose(tta_gating.discounted_returns([1.0, 1.0], 0.5, bootstrap=4.0), [2.5, 3.0])
    # actor-critic advantages are the n-step targets minus the (detached) values, in the critic's reward units
    logprobs = torch.zeros(2, requires_grad=True)
    tta_gating.actor_critic_loss(logprobs, torch.tensor([1.0, 0.5]), [2.0, 2.0], 4.0, 0.5, reward_scale=2.0).backward()
    assert torch.allclose(logprobs.grad, -torch.tensor([2.5 - 1.0, 3.0 - 0.5]) / 2)


def test_tent_loss_minimises_both_entropies_and_the_kl_to_its_anchor():
    """With the anchor equal to the policy the KL term vanishes, leaving H(p) + H(π) (entropies minimised: a flipped sign
    would maximise them); the anchor term is KL(π || π_unadapted), not KL(π_unadapted || π) (0.368 against 0.511)."""
    logits = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    gate_probs = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    p = torch.softmax(logits, -1)
    entropies = (-(p * p.log()).sum(-1)).mean() + np.log(2) / 2
    assert tta_gating.tent_loss(logits, logits, gate_probs, 1.0).item() == pytest.approx(entropies.item(), abs=1e-5)
    logits = torch.log(torch.tensor([[0.9, 0.1]]))
    anchor = torch.log(torch.tensor([[0.5, 0.5]]))
    onehot = torch.tensor([[1.0, 0.0]])
    forward = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert abs(forward - (0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1))) > 0.1
    kl = tta_gating.tent_loss(logits, anchor, onehot, 1.0) - tta_gating.tent_loss(logits, anchor, onehot, 0.0)
    assert kl.item() == pytest.approx(forward, abs=1e-5)
    entropy = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert tta_gating.tent_loss(logits, anchor, onehot, 2.0).item() == pytest.approx(entropy + 2 * forward, abs=1e-5)


class OnlineEpisode(NamedTuple):
    updates: int
    calls: list
    """(rewards, values, bootstrap) of each update"""
    ends: list
    """(terminated, truncated) of each step"""
    steps: list
    """(action, reward, info) of each step"""


def online_episode(checkpoint, monkeypatch, lr, max_episode_steps=500):
    """One --online --online-every 4 `gate` adaptation episode (adaptation seed 0: env seed 0), its env and its
    actor-critic loss recorded."""
    ckpt, _ = tta_gating.load_astral_checkpoint(checkpoint)
    env = new_env(ckpt)
    env.max_episode_steps = max_episode_steps
    recorded = OnlineEpisode(0, [], [], [])
    real_step = env.step
    real_loss = tta_gating.actor_critic_loss

    def step(action):
        out = real_step(action)
        recorded.ends.append((bool(out[2][0]), bool(out[3][0])))
        recorded.steps.append((action.copy(), out[1].copy(), out[4]))
        return out

    def loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale):
        recorded.calls.append((list(rewards), values.detach().clone(), bootstrap_value))
        return real_loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale)

    def target_env(num_envs, target, hide_velocity):
        return env

    monkeypatch.setattr(env, "step", step)
    monkeypatch.setattr(tta_gating, "actor_critic_loss", loss)
    monkeypatch.setattr(tta_gating, "target_env", target_env)
    args = adapt_args(checkpoint, online=True, online_every=4, episodes=1, adapt_lr=lr)
    adapted = tta_gating.adaptation(ckpt, target_of(ckpt), "gate", 0, args, 1.0)
    return recorded._replace(updates=adapted.updates)


def test_online_segments_have_online_every_steps_and_bootstrap_from_the_carried_state(checkpoint, monkeypatch):
    """Every segment but the last is --online-every steps, and its bootstrap is the critic's value of the next observation
    with the GRU state carried on: with lr 0 it equals the next segment's first value. If this failed, the cut were off by
    one, or the bootstrap came from a zeroed state (the value of a memoryless agent)."""
    episode = online_episode(checkpoint, monkeypatch, 0.0)
    assert episode.updates == len(episode.calls) >= 3
    assert all(len(rewards) == 4 for rewards, _, _ in episode.calls[:-1])
    assert 1 <= len(episode.calls[-1][0]) <= 4
    for (_, _, bootstrap), (_, next_values, _) in zip(episode.calls[:-1], episode.calls[1:]):
        assert bootstrap == pytest.approx(float(next_values[0]), abs=1e-6)


def test_online_does_not_bootstrap_past_the_pole_falling(checkpoint, monkeypatch):
    """A cut segment continues and bootstraps; the segment that ends with the pole falling has no future. If this failed,
    the last target added gamma * V(s_terminal), value that is never earned."""
    episode = online_episode(checkpoint, monkeypatch, 0.05)
    assert episode.ends[-1] == (True, False), "the episode must end with the pole falling for this test to mean anything"
    assert episode.updates == len(episode.calls) >= 3
    assert all(bootstrap != 0.0 for _, _, bootstrap in episode.calls[:-1])
    assert episode.calls[-1][2] == 0.0


def test_online_bootstraps_a_time_limit_truncation_from_the_final_observation(checkpoint, monkeypatch):
    """The env restarts in the step that truncates, so the returned observation opens the next episode; the bootstrap must
    be the critic's value of the ended episode's last observation (info["final_obs"]) with the GRU state carried on."""
    episode = online_episode(checkpoint, monkeypatch, 0.0, max_episode_steps=6)
    monkeypatch.undo()  # the replay below plays an env of its own
    assert episode.ends == [(False, False)] * 5 + [(False, True)]
    assert episode.updates == len(episode.calls) == 2
    assert len(episode.calls[-1][0]) == 2
    ckpt, agent = tta_gating.load_astral_checkpoint(checkpoint)
    env = new_env(ckpt)
    env.max_episode_steps = 6
    obs, _ = env.reset(seed=0)
    state = zeros_state(agent)
    prev_action = [-1]
    prev_reward = [0.0]
    start = [1.0]
    with torch.no_grad():
        for action, reward, _ in episode.steps:
            state = tta_gating.policy_step(agent, obs, prev_action, prev_reward, [0], state, start).state
            obs = env.step(action)[0]
            prev_action = action
            prev_reward = reward
            start = [0.0]
        final_obs = episode.steps[-1][2]["final_obs"]
        final = float(tta_gating.policy_step(agent, final_obs, prev_action, prev_reward, [0], state, start).value)
        restarted = float(tta_gating.policy_step(agent, obs, prev_action, prev_reward, [0], state, start).value)
    assert episode.calls[-1][2] == pytest.approx(final, abs=1e-6)
    assert abs(final - restarted) > 1e-4


def recorded_tent_loss(monkeypatch):
    """Replaces tta_gating.tent_loss by itself recording (logits, anchor logits, gate probabilities) of every call."""
    calls = []
    real_loss = tta_gating.tent_loss

    def loss(logits, anchor_logits, gate_probs, kl_coef):
        calls.append((logits.detach().clone(), anchor_logits.detach().clone(), gate_probs.detach().clone()))
        return real_loss(logits, anchor_logits, gate_probs, kl_coef)

    monkeypatch.setattr(tta_gating, "tent_loss", loss)
    return calls


def test_tent_anchor_is_the_unadapted_policy_on_the_same_inputs(checkpoint, tmp_path, monkeypatch):
    """tent's KL anchor must be the unadapted agent fed the episode's observations, actions and rewards, checked in the
    second adaptation episode, once the agent has moved away from it. If it were the adapted agent itself, the KL term
    were 0 and entropy minimisation collapsed the policy unchecked."""
    path = sharpened(checkpoint, tmp_path)
    ckpt, unadapted = tta_gating.load_astral_checkpoint(path)
    env = new_env(ckpt)
    actions = []
    real_step = env.step
    real_reset = env.reset

    def step(action):
        actions.append(int(action[0]))
        return real_step(action)

    def reset(seed=None):
        actions.clear()  # the last episode's actions only
        return real_reset(seed)

    def target_env(num_envs, target, hide_velocity):
        return env

    monkeypatch.setattr(env, "step", step)
    monkeypatch.setattr(env, "reset", reset)
    monkeypatch.setattr(tta_gating, "target_env", target_env)
    calls = recorded_tent_loss(monkeypatch)
    tta_gating.adaptation(ckpt, target_of(ckpt), "tent", 1, adapt_args(path), 1.0)
    (_, (logits, anchor_logits, _)) = calls
    assert len(actions) == len(anchor_logits) > 3
    monkeypatch.undo()  # the replay plays an env of its own
    replay = new_env(ckpt)
    obs, _ = replay.reset(seed=10_000 * 1 + 1)  # adaptation seed 1, episode 1
    state = zeros_state(unadapted)
    prev_action = -1
    prev_reward = 0.0
    start = 1.0
    expected = []
    with torch.no_grad():
        for action in actions:
            step = tta_gating.policy_step(unadapted, obs, [prev_action], [prev_reward], [0], state, [start])
            state = step.state
            expected.append(step.dist.logits)
            obs, reward, _, _, _ = replay.step(np.array([action]))
            prev_action = action
            prev_reward = float(reward[0])
            start = 0.0
    assert torch.allclose(anchor_logits, torch.cat(expected), atol=1e-6)
    assert (logits - anchor_logits).abs().max() > 1e-3  # the adapted policy is not its anchor: 1000 times the tolerance


def test_tent_anchor_stays_the_unadapted_policy_across_episodes(checkpoint, tmp_path, monkeypatch):
    """The adaptation's anchor is a frozen copy: equal to the policy in the first episode, different once the gate moved."""
    ckpt, _ = tta_gating.load_astral_checkpoint(sharpened(checkpoint, tmp_path))
    calls = recorded_tent_loss(monkeypatch)
    adapted = tta_gating.adaptation(ckpt, target_of(ckpt), "tent", 1, adapt_args(checkpoint), 1.0)
    assert adapted.updates == len(calls) == 2
    assert torch.allclose(calls[0][0], calls[0][1], atol=1e-6)
    assert (calls[1][0] - calls[1][1]).abs().max() > 1e-4
    assert not torch.equal(adapted.agent.state_dict()["bank.gate.2.weight"], ckpt["state_dict"]["bank.gate.2.weight"])


def test_adaptation_episodes_have_distinct_env_seeds_shared_by_every_control(checkpoint, monkeypatch):
    """Episode e of every control starts from the same env seed (the paired comparison), and a run's episodes differ.
    If this failed, every episode replayed one initial state, or the controls saw different episodes."""
    ckpt, _ = tta_gating.load_astral_checkpoint(checkpoint)
    played = []
    real_reset = tta_gating.NonStationaryCartPole.reset

    def reset(env, seed=None):
        played.append(seed)
        return real_reset(env, seed)

    monkeypatch.setattr(tta_gating.NonStationaryCartPole, "reset", reset)
    seeds = {}
    for control in tta_gating.CONTROLS:
        first = len(played)
        tta_gating.adaptation(ckpt, target_of(ckpt, 1), control, 2, adapt_args(checkpoint, episodes=3), 1.0)
        seeds[control] = played[first:]
    assert list(seeds) == list(tta_gating.CONTROLS)
    assert all(s == seeds["none"] for s in seeds.values())
    assert len(set(seeds["none"])) == len(seeds["none"]) == 3


# --- fixed gates -----------------------------------------------------------------------------------------------------


def test_gate_settings_are_the_one_hots_the_mixtures_of_a_grid_and_uniform():
    settings = tta_gating.gate_settings(3, 2)
    assert list(settings)[:3] == ["slot0", "slot1", "slot2"]
    assert list(settings)[-1] == "uniform"
    weights = torch.stack(list(settings.values()))
    assert torch.allclose(weights.sum(-1), torch.ones(7))
    assert len({tuple(w.tolist()) for w in weights}) == 7
    assert {tuple(w.tolist()) for w in weights[3:6]} == {(0.5, 0.5, 0.0), (0.5, 0.0, 0.5), (0.0, 0.5, 0.5)}
    assert list(tta_gating.gate_settings(3, 1)) == ["slot0", "slot1", "slot2", "uniform"]
    assert len(tta_gating.gate_settings(3, 3)) == 3 + 6 + 1  # (2,1,0)-type mixtures; (1,1,1) is the uniform gate, listed once


def test_ceiling_is_the_fixed_gate_with_the_best_mean_sampled_return(checkpoint, monkeypatch):
    """With planted sampled returns per seed, slot0 30 / 40 against mix and uniform 12 / 14 and slot1 36 / 20 (a better
    first seed, a worse mean): the ceiling is slot0. If this failed, it were picked on one seed or another kind."""
    ckpt, base = tta_gating.load_astral_checkpoint(checkpoint)
    planted = {"slot0": [30.0, 40.0], "slot1": [36.0, 20.0]}
    kinds_asked = []

    def gate_returns(agent, target, hide_velocity, settings, seeds, episodes, kinds=KINDS):
        kinds_asked.append(list(kinds))
        means = {name: {kind: planted.get(name, [12.0, 14.0]) for kind in kinds} for name in settings}
        return tta_gating.GateReturns(means, {})

    monkeypatch.setattr(tta_gating, "gate_returns", gate_returns)
    result = tta_gating.ceiling(base, target_of(ckpt), False, tta_gating.gate_settings(3, 2), [1, 2], 4)
    assert result["best"] == "slot0"
    assert result["per_setting"]["slot1"] == [36.0, 20.0]
    assert len(result["per_setting"]) == 7
    assert kinds_asked == [["sampled"]]


# --- adapt end to end -----------------------------------------------------------------------------------------------


def test_adapt_runs_every_control_and_the_ceilings_mixtures(checkpoint, tmp_path):
    digest = sha256(checkpoint)
    flags = ["--mode-indices", "0", "2", "--episodes", "2", "--num-seeds", "2", "--eval-episodes", "2", "--save-model"]
    flags += ["--controls", *tta_gating.CONTROLS, "--ceiling-resolution", "2"]
    run_dir = run_tta("adapt", checkpoint, tmp_path, *flags).run_dir
    assert sha256(checkpoint) == digest
    assert os.path.basename(run_dir).startswith("NonStationaryCartPole__tta_gating_adapt__1__")
    report = load_json(os.path.join(run_dir, "tta.json"))
    assert report["subcommand"] == "adapt"
    assert report["controls"] == list(tta_gating.CONTROLS)
    assert report["seeds"] == [1, 2]
    assert list(report["results"]) == ["mode0", "mode2"]
    for res in report["results"].values():
        none = res["controls"]["none"]
        assert none["after_per_seed"]["sampled"] == res["before"]["sampled"]["per_seed"]  # no updates: after = before
        assert list(res["ceiling"]["per_setting"]) == list(tta_gating.gate_settings(3, 2))
        for control, entry in res["controls"].items():
            assert np.asarray(entry["during_per_seed"]).shape == (2, 2)
            assert [c[0] for c in entry["during_per_seed"]] == [c[0] for c in none["during_per_seed"]]
            assert (control == "none") == ("gain_over_none" not in entry)
    for name in ("adaptation_curves.png", "eval.json", "tta_gating_adapt.cleanrl_model"):
        assert os.path.getsize(os.path.join(run_dir, name)) > 0
    headline = load_json(os.path.join(run_dir, "eval.json"))
    assert set(headline["gain_over_none_after_sampled"]) == set(tta_gating.CONTROLS) - {"none"}
    assert set(headline["after_sampled"]) == set(tta_gating.CONTROLS)
    gate_gains = [res["controls"]["gate"]["gain_over_none"]["after_sampled"]["mean"] for res in report["results"].values()]
    assert headline["gain_over_none_after_sampled"]["gate"] == pytest.approx(np.mean(gate_gains))
    saved = torch.load(os.path.join(run_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)
    assert len(saved["adapted"]) == 2 * 2 * 5
    tags = {"tta/episodic_return_mode0_gate", "tta/gain_over_none_after_sampled_mode2_tent", "tta/ceiling_sampled_mode0"}
    assert tags <= set(logged_scalars(run_dir))


def test_adapt_online_on_unseen_physics(checkpoint, tmp_path):
    flags = ["--modes", "5.0,0.9 15.0,0.3", "--online", "--online-every", "4", "--controls", "none", "gate", "tent"]
    flags += ["--episodes", "2", "--num-seeds", "1", "--eval-episodes", "2", "--ceiling-resolution", "0"]
    run_dir = run_tta("adapt", checkpoint, tmp_path, *flags).run_dir
    report = load_json(os.path.join(run_dir, "tta.json"))
    assert report["online"]
    assert report["reward_scale"] > 0  # the reward normaliser saved with the model
    assert [t["gravity"] for t in report["targets"]] == [5.0, 15.0]
    assert report["results"]["custom0"]["ceiling"] is None
    # online updates happen inside episodes: more updates than episodes whenever an episode is longer than 4 steps
    lengths = sum(sum(c) for c in report["results"]["custom0"]["controls"]["none"]["during_per_seed"])
    assert report["results"]["custom0"]["controls"]["gate"]["updates"] >= lengths // 4 > 2


def test_adapt_after_numbers_are_each_controls_adapted_agent_on_the_before_episodes(checkpoint, tmp_path):
    """A control's "after" (returns and gate weights) is its own adapted agent's, on the seeds of "before". If this
    failed, the unadapted agent were evaluated after adaptation and a real gain would read as zero."""
    flags = ["--mode-indices", "1", "--episodes", "2", "--num-seeds", "1", "--eval-episodes", "3", "--adapt-lr", "0.05"]
    run_dir = run_tta("adapt", checkpoint, tmp_path, *flags, "--save-model").run_dir
    controls = load_json(os.path.join(run_dir, "tta.json"))["results"]["mode1"]["controls"]
    saved = torch.load(os.path.join(run_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)["adapted"]
    assert [s["control"] for s in saved] == ["none", "gate"]
    ckpt, agent = tta_gating.load_astral_checkpoint(checkpoint)
    eval_seed = 100_000 + 10_000 * 1  # seed 1, first target
    for entry in saved:
        agent.load_state_dict(entry["state_dict"])
        for kind in KINDS:
            deterministic = kind == "deterministic"
            evaluation = tta_gating.evaluate_target(
                agent, target_of(ckpt, 1), ckpt["args"]["hide_velocity"], 3, deterministic, eval_seed
            )
            assert controls[entry["control"]]["after_per_seed"][kind] == [float(evaluation.returns.mean())]
            if deterministic:
                assert controls[entry["control"]]["slot_weights_after_per_seed"] == [evaluation.slot_weights.tolist()]
    assert controls["gate"]["slot_weights_after_per_seed"] != controls["none"]["slot_weights_after_per_seed"]


def test_gain_over_none_is_paired_and_its_fraction_is_of_the_ceilings_headroom(checkpoint, tmp_path, monkeypatch):
    """gain_over_none.after_sampled is, seed by seed, the control's sampled return after adaptation minus none's (not its
    deterministic one); the ceiling is the best fixed gate's mean sampled return on the same evaluation episodes; the
    fraction is the gain over (ceiling - before)."""
    path = sharpened(checkpoint, tmp_path)
    flags = ["--mode-indices", "1", "--controls", "none", "gate", "context", "--episodes", "1", "--num-seeds", "2"]
    flags += ["--eval-episodes", "4", "--adapt-lr", "0.05", "--ceiling-resolution", "2"]
    argv = [tta_gating.__file__, "adapt", "--checkpoint", path, *flags, "--runs-dir", str(tmp_path / "runs")]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(tta_gating.__file__, run_name="__main__")  # the same __main__ code in this process
    res = load_json(tmp_path / "runs" / "*" / "tta.json")["results"]["mode1"]
    gate = res["controls"]["gate"]
    none = res["controls"]["none"]
    after = np.subtract(gate["after_per_seed"]["sampled"], none["after_per_seed"]["sampled"])
    during = np.mean(gate["during_per_seed"], 1) - np.mean(none["during_per_seed"], 1)
    assert gate["gain_over_none"]["after_sampled"] == tta.mean_ci(after)
    assert gate["gain_over_none"]["during_mean"] == tta.mean_ci(during)
    assert gate["after_per_seed"]["deterministic"] != gate["after_per_seed"]["sampled"]  # the wrong kind cannot match
    ckpt, agent = tta_gating.load_astral_checkpoint(path)
    per_setting = {}
    for name, weights in tta_gating.gate_settings(3, 2).items():
        per_setting[name] = []
        for seed in (1, 2):
            evaluation = tta_gating.evaluate_target(
                agent, target_of(ckpt, 1), False, 4, False, 100_000 + 10_000 * seed, weights
            )
            per_setting[name].append(float(evaluation.returns.mean()))
    assert res["ceiling"]["per_setting"] == per_setting
    assert len({tuple(v) for v in per_setting.values()}) > 1
    best = max(per_setting, key=lambda k: np.mean(per_setting[k]))
    assert res["ceiling"]["best"] == best
    gap = np.mean(per_setting[best]) - res["before"]["sampled"]["mean"]
    for control in ("gate", "context"):
        fraction = res["controls"][control]["gain_fraction_of_ceiling"]
        if gap <= 0:
            assert fraction is None
        else:
            gain = res["controls"][control]["gain_over_none"]["after_sampled"]["mean"]
            assert fraction["mean"] == pytest.approx(gain / gap)


def test_held_out_mode_is_a_target_of_adapt_and_clamp(mirror4_checkpoint, tmp_path):
    """mirror4's mode 4, never trained on, is adapted to on its own, and clamp covers it with the training modes."""
    flags = ["--mode-indices", "4", "--controls", "none", "gate", "context", "--episodes", "2", "--eval-episodes", "2"]
    run_dir = run_tta("adapt", mirror4_checkpoint, tmp_path / "a", *flags).run_dir
    report = load_json(os.path.join(run_dir, "tta.json"))
    assert report["targets"] == [{"name": "mode4", "gravity": 8.65, "half_length": 0.6, "force_sign": -1.0, "held_out": True}]
    assert set(report["results"]["mode4"]["controls"]["gate"]["gain_over_none"]) == {"during_mean", "after_sampled"}
    run_dir = run_tta("clamp", mirror4_checkpoint, tmp_path / "c", "--eval-episodes", "1").run_dir
    report = load_json(os.path.join(run_dir, "clamp.json"))
    assert [t["held_out"] for t in report["targets"]] == [False] * 4 + [True]
    assert len(report["matrix"]["sampled"]) == 5


def test_subcommands_hold_the_documented_workloads():
    """adapt (minutes) and adapt-plan (the plan's setting: REINFORCE on the gate only, Adam lr 1e-4, 20 episodes per
    mode) are both the adapt subcommand with their own defaults; flags given override them. The study's preset
    adapt-full is no subcommand."""
    parsed = {}
    for name in ("adapt", "adapt-plan"):
        parsed[name] = tyro.extras.subcommand_cli_from_dict(tta_gating.SUBCOMMANDS, args=[name, "--checkpoint", "x"])
        assert parsed[name].subcommand == "adapt"
        assert parsed[name].exp_name == "tta_gating_adapt"
    assert parsed["adapt"].controls == ["none", "gate"]
    assert (parsed["adapt"].episodes, parsed["adapt"].num_seeds, parsed["adapt"].eval_episodes) == (10, 2, 5)
    plan = parsed["adapt-plan"]
    assert plan.controls == ["none", "gate"]
    assert (plan.adapt_lr, plan.episodes, plan.num_seeds, plan.online) == (1e-4, 20, 3, False)
    overridden = tyro.extras.subcommand_cli_from_dict(
        tta_gating.SUBCOMMANDS, args=["adapt-plan", "--checkpoint", "x", "--episodes", "4"]
    )
    assert overridden.episodes == 4
    assert overridden.num_seeds == 3
    assert "adapt-full" not in tta_gating.SUBCOMMANDS
    clamp = tyro.extras.subcommand_cli_from_dict(tta_gating.SUBCOMMANDS, args=["clamp", "--checkpoint", "x"])
    assert clamp.eval_episodes == 10
    assert clamp.exp_name == "tta_gating_clamp"


def test_the_plans_design_is_adapted_clamped_and_swapped(plan_checkpoint, tmp_path):
    """A --design plan checkpoint (ReLU gate MLP, FiLM MLP, d-sized slots): adapt-plan updates only its gate, clamp and
    swap run on it, and the clamped columns are its slots."""
    ckpt, agent = tta_gating.load_astral_checkpoint(plan_checkpoint)
    assert ckpt["args"]["design"] == "plan"
    assert isinstance(agent.bank.gate[1], torch.nn.ReLU)
    assert agent.bank.slots.shape == (3, agent.hidden_size)
    flags = ["--mode-indices", "0", "4", "--episodes", "2", "--num-seeds", "1", "--eval-episodes", "2", "--save-model"]
    run_dir = run_tta("adapt-plan", plan_checkpoint, tmp_path / "a", *flags).run_dir
    report = load_json(os.path.join(run_dir, "tta.json"))
    assert report["args"]["adapt_lr"] == 1e-4
    assert report["checkpoint_args"]["design"] == "plan"
    saved = torch.load(os.path.join(run_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)["adapted"]
    gate = [s for s in saved if s["control"] == "gate"]
    assert len(gate) == 2
    for entry in gate:
        changed = {
            k for k, v in entry["state_dict"].items() if k in ckpt["state_dict"] and not torch.equal(v, ckpt["state_dict"][k])
        }
        assert changed == GATE_KEYS
    clamp = load_json(
        os.path.join(run_tta("clamp", plan_checkpoint, tmp_path / "c", "--eval-episodes", "2").run_dir, "clamp.json")
    )
    assert clamp["columns"] == ["slot0", "slot1", "slot2", "uniform", "learned"]
    swap = load_json(
        os.path.join(run_tta("swap", plan_checkpoint, tmp_path / "s", "--eval-episodes", "2").run_dir, "swap.json")
    )
    assert swap["columns"][:2] == ["sign+1", "sign-1"]
    assert np.asarray(swap["matrix"]["sampled"]).shape == (5, 7)


# --- clamp end to end -----------------------------------------------------------------------------------------------


def test_clamp_writes_every_slot_uniform_and_the_learned_gate(checkpoint, tmp_path):
    digest = sha256(checkpoint)
    run_dir = run_tta("clamp", checkpoint, tmp_path, "--eval-episodes", "1").run_dir
    assert sha256(checkpoint) == digest
    assert os.path.basename(run_dir).startswith("NonStationaryCartPole__tta_gating_clamp__1__")
    report = load_json(os.path.join(run_dir, "clamp.json"))
    assert report["columns"] == ["slot0", "slot1", "slot2", "uniform", "learned"]
    assert np.asarray(report["matrix"]["deterministic"]).shape == (3, 5)
    # the "learned" column is the training run's own deterministic evaluation (same seeds, same protocol)
    train_eval = load_json(os.path.join(os.path.dirname(checkpoint), "eval.json"))
    for k in range(3):
        learned = report["results"][f"mode{k}"]["learned"]["deterministic"]["returns"]
        assert learned == train_eval["per_mode"][str(k)]["deterministic"]["returns"]
    assert os.path.getsize(os.path.join(run_dir, "clamp_heatmap.png")) > 0
    headline = load_json(os.path.join(run_dir, "eval.json"))
    uniform = [r["uniform"]["sampled"]["mean"] for r in report["results"].values()]
    assert headline["clamp_sampled"]["uniform"] == pytest.approx(np.mean(uniform))  # eval.json averages over the targets
    assert set(headline["clamp_deterministic"]) == {"uniform", "learned"}
    assert {"tta/clamp_return_mode0_slot1_sampled", "tta/clamp_specificity_sampled"} <= set(logged_scalars(run_dir))


@pytest.fixture(scope="module")
def sharp_clamp(checkpoint, tmp_path_factory):
    """(model path, clamp.json, eval.json) of a clamp run on the tiny checkpoint made into three clearly different
    policies, one per slot: slots 10u, -10u and 0 and a 1000x actor output layer."""
    tmp = tmp_path_factory.mktemp("sharp_clamp")
    u = torch.randn(8, generator=torch.Generator().manual_seed(0))
    slots = torch.stack([10 * u, -10 * u, torch.zeros_like(u)])
    path = edited_checkpoint(checkpoint, tmp / "slot_policies.cleanrl_model", slots, 1000.0)
    run_dir = run_tta("clamp", path, tmp / "runs", "--eval-episodes", "3").run_dir
    return path, load_json(os.path.join(run_dir, "clamp.json")), load_json(os.path.join(run_dir, "eval.json"))


def test_clamp_column_slot_k_is_the_return_with_the_gate_clamped_to_slot_k(sharp_clamp):
    """If this failed, a column showed another slot's returns, and every conclusion about slot k were about another."""
    path, report, _ = sharp_clamp
    ckpt, agent = tta_gating.load_astral_checkpoint(path)
    per_slot = {k: [] for k in range(3)}
    for ti, target in enumerate(tta_gating.resolve_targets(None, None, ckpt)):
        for k in range(3):
            for kind in KINDS:
                deterministic = kind == "deterministic"
                seed = 100_000 + 1 + 1000 * ti
                evaluation = tta_gating.evaluate_target(agent, target, False, 3, deterministic, seed, torch.eye(3)[k])
                assert np.array_equal(evaluation.slot_weights, np.eye(3)[k])
                assert report["results"][target["name"]][f"slot{k}"][kind]["returns"] == evaluation.returns.tolist()
                per_slot[k].append(evaluation.returns.tolist())
    assert all(per_slot[j] != per_slot[k] for j in range(3) for k in range(j + 1, 3))  # another slot's returns cannot match


def test_clamp_specificity_is_reported_for_the_mode_by_slot_matrix(sharp_clamp):
    _, report, headline = sharp_clamp
    for kind in KINDS:
        score, matching = tta.clamp_specificity(np.asarray(report["matrix"][kind])[:, :3])
        assert report["specificity"][kind] == {"score": score, "matching": [[f"mode{r}", f"slot{c}"] for r, c in matching]}
        assert headline["clamp_specificity"][kind] == score
    assert report["specificity"]["deterministic"]["score"] is not None


def test_clamp_uniform_column_is_the_gate_fixed_at_one_over_k(checkpoint, tmp_path):
    """w = 1/K, summing to 1: all ones (z = the sum of the slots) would be K times too far. Slots u, -u, 2v (their sum
    is not K times their mean) and a 10x actor layer (larger saturates the policy so that every gate acts alike)."""
    u, v = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    path = edited_checkpoint(checkpoint, tmp_path / "asym.cleanrl_model", torch.stack([u, -u, 2 * v]), 10.0)
    run_dir = run_tta("clamp", path, tmp_path / "runs", "--mode-indices", "0", "1", "--eval-episodes", "3").run_dir
    report = load_json(os.path.join(run_dir, "clamp.json"))
    ckpt, agent = tta_gating.load_astral_checkpoint(path)
    differs = False
    for ti, target in enumerate(tta_gating.resolve_targets([0, 1], None, ckpt)):
        for kind in KINDS:
            deterministic = kind == "deterministic"
            seed = 100_000 + 1 + 1000 * ti
            mean = tta_gating.evaluate_target(agent, target, False, 3, deterministic, seed, torch.full((3,), 1 / 3))
            total = tta_gating.evaluate_target(agent, target, False, 3, deterministic, seed, torch.ones(3))
            assert report["results"][target["name"]]["uniform"][kind]["returns"] == mean.returns.tolist(), (ti, kind)
            differs |= mean.returns.tolist() != total.returns.tolist()
    assert differs  # the weights' sum shows in the returns on these seeds, so a wrong sum cannot match


def test_runs_started_in_the_same_second_get_directories_of_their_own(checkpoint, tmp_path, occupied_run_names):
    check = occupied_run_names(str(tmp_path), "NonStationaryCartPole__collide__7__")
    flags = ["--checkpoint", checkpoint, "--eval-episodes", "1", "--exp-name", "collide", "--seed", "7"]
    result = run_script("tta_gating", "clamp", *flags, "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert os.path.isfile(os.path.join(check(), "clamp.json"))


# --- bad input ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline_checkpoint(tmp_path_factory):
    runs = tmp_path_factory.mktemp("baseline_runs")
    flags = [a for a in TINY_TRAIN if a not in ("--slot-dim", "8")]
    run_script("ppo_gru_baseline", *flags, "--runs-dir", str(runs), check=True)
    (path,) = glob.glob(str(runs / "*" / "ppo_gru_baseline.cleanrl_model"))
    return path


@pytest.mark.parametrize(
    "case,expected",
    [
        ("missing", "does not exist"),
        ("baseline", "written by ppo_gru_baseline"),
        ("mode_index", "--mode-indices 7 is out of range"),
        ("runs_dir_is_a_file", "--runs-dir"),
        ("format_1", "holds another format of ppo_gru_astral.py's checkpoint; commit 95652a5 reads it"),
        ("study_args", "holds another format of ppo_gru_astral.py's checkpoint; commit 31fadaa reads it"),
    ],
)
def test_bad_input_fails_with_one_line_before_any_work(case, expected, checkpoint, baseline_checkpoint, tmp_path):
    path = {"missing": str(tmp_path / "nope.cleanrl_model"), "baseline": baseline_checkpoint}.get(case, checkpoint)
    if case == "format_1":  # another commit's format: refused, never acted as this file's agent
        ckpt = torch.load(checkpoint, weights_only=True)
        path = str(tmp_path / "format_1.cleanrl_model")
        torch.save({**ckpt, "format": 1}, path)
    if case == "study_args":  # this format with the ASTRAL study's switches among its Args: another commit's
        ckpt = torch.load(checkpoint, weights_only=True)
        path = str(tmp_path / "study_args.cleanrl_model")
        study_args = {"bottleneck": False, "hard_gate": False, "gumbel_tau": 1.0, "lambda_supervised": 0.0}
        torch.save({**ckpt, "args": {**ckpt["args"], **study_args}}, path)
    runs = tmp_path / "runs"
    if case == "runs_dir_is_a_file":
        runs.write_text("")
    extra = []
    if case == "mode_index":
        extra = ["--mode-indices", "0", "7"]
    subcommand = "clamp"
    if case == "baseline":
        subcommand = "adapt"
    result = run_script("tta_gating", subcommand, "--checkpoint", path, *extra, "--runs-dir", str(runs))
    assert_one_line_error(result, expected)
    assert result.stdout == ""
    if case == "runs_dir_is_a_file":
        assert "not a directory" in result.stderr
    else:
        assert not runs.exists()


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ({"controls": ["gate", "gate"]}, "--controls"),
        ({"mode_indices": [0], "modes": "9.8,0.5"}, "not both"),
        ({"episodes": 0}, "--episodes 0 must be at least 1"),
        ({"ceiling_resolution": -1}, "--ceiling-resolution -1 must be at least 0"),
        ({"online": True, "reward_scale": -1.0}, "--reward-scale -1.0 must be positive"),
        ({"online": True, "reward_scale": float("inf")}, "--reward-scale inf must be a finite number"),
        ({"adapt_lr": float("nan")}, "--adapt-lr nan must be a finite number"),
        ({"seed": -1}, "--seed -1 must be at least 0"),
        ({"mode_indices": [0, 0]}, "--mode-indices needs distinct"),
        ({"mode_indices": []}, "--mode-indices needs distinct"),
        ({"exp_name": "a/b"}, "--exp-name"),
        ({"modes": "9.8"}, "malformed mode"),
        ({"modes": "9.8,0.5,2"}, "malformed mode"),
        ({"modes": "a,b"}, "malformed mode"),
        ({"modes": "9.8,-0.5"}, "malformed mode"),
        ({"modes": " "}, "--modes is empty"),
    ],
)
def test_validate_rejects_bad_settings(checkpoint, overrides, expected):
    with pytest.raises(ValueError, match=expected):
        prepared(adapt_args(checkpoint, **overrides))


def test_custom_modes_read_gravity_half_length_and_an_optional_force_sign():
    assert tta_gating.parse_modes("9.8,0.5 7.5,0.7,-1") == [(9.8, 0.5, 1.0), (7.5, 0.7, -1.0)]


def test_checkpoint_pattern_picks_the_seeds_file(checkpoint):
    pattern = os.path.join(os.path.dirname(os.path.dirname(checkpoint)), "*", "ppo_gru_astral.cleanrl_model")
    assert prepared(tta_gating.ClampArgs(checkpoint=pattern))[0] == checkpoint
    assert prepared(tta_gating.ClampArgs(checkpoint=checkpoint.replace("__1__", "__{seed}__"), seed=1))[0] == checkpoint
    with pytest.raises(ValueError, match="matches 0 files"):
        prepared(tta_gating.ClampArgs(checkpoint=checkpoint.replace("__1__", "__{seed}__*"), seed=2))


def test_online_reads_the_critics_reward_scale_from_the_model_or_refuses(checkpoint, tmp_path):
    """--online bootstraps with the critic, in the units of the run's reward normaliser; `gate`, `context` and `all` need
    it, `tent` alone does not; --reward-scale overrides the model's."""
    scaler = torch.load(checkpoint, weights_only=True)["reward_scaler"]
    expected = float(np.sqrt(scaler["var"] + 1e-8))
    assert expected != 1.0
    for controls in (["none", "gate"], ["none", "context"], ["none", "all"]):
        assert prepared(adapt_args(checkpoint, online=True, controls=controls))[1] == expected
    assert prepared(adapt_args(checkpoint, online=True, controls=["none", "tent"]))[1] is None
    assert prepared(adapt_args(checkpoint, online=True, reward_scale=30.0))[1] == 30.0
    unnormalised = edited_checkpoint(checkpoint, tmp_path / "unnormalised.cleanrl_model", norm_reward=False)
    assert prepared(adapt_args(unnormalised, online=True))[1] == 1.0  # raw rewards: σ = 1


def test_online_refuses_a_discount_other_than_the_critics(checkpoint):
    trained = torch.load(checkpoint, weights_only=True)["args"]["gamma"]
    with pytest.raises(ValueError, match=f"--gamma 0.9 differs from the {trained} the critic was trained with"):
        prepared(adapt_args(checkpoint, online=True, gamma=0.9))
    prepared(adapt_args(checkpoint, gamma=0.9))  # offline REINFORCE has no critic: any gamma


def test_oracle_agent_refuses_custom_physics(checkpoint, tmp_path):
    path = edited_checkpoint(checkpoint, tmp_path / "oracle.cleanrl_model", oracle=True)
    with pytest.raises(ValueError, match="--oracle agent"):
        tta_gating.resolve_targets(None, "9.8,0.5", torch.load(path, weights_only=True))


def test_swap_refuses_custom_physics(mirror4_checkpoint):
    result = run_script("tta_gating", "swap", "--checkpoint", mirror4_checkpoint, "--modes", "9.8,0.5")
    assert_one_line_error(result, "swap fixes the gate to the mean gates of the checkpoint's training modes")


# --- swap end to end (the swap's logic on hand-set agents: test_tta_gating_swap.py) -------------------------------


def test_swap_writes_the_swapped_gates_their_returns_and_the_routing(mirror4_checkpoint, tmp_path):
    """swap end to end on a mirror4 checkpoint: the learned column is clamp's (the same episodes), the mean gates are the
    learned gate's per mode, the files, tags and headline are written."""
    ran = run_tta("swap", mirror4_checkpoint, tmp_path / "s", "--eval-episodes", "2")
    assert "episode-level NMI" in ran.stdout
    assert "swap effect" in ran.stdout
    report = load_json(os.path.join(ran.run_dir, "swap.json"))
    assert report["columns"] == ["sign+1", "sign-1", "mode0", "mode1", "mode2", "mode3", "learned"]
    assert np.asarray(report["matrix"]["sampled"]).shape == (5, 7)
    clamp_dir = run_tta("clamp", mirror4_checkpoint, tmp_path / "c", "--eval-episodes", "2").run_dir
    clamp_report = load_json(os.path.join(clamp_dir, "clamp.json"))
    for name in ("mode0", "mode4"):
        assert report["results"][name]["learned"] == clamp_report["results"][name]["learned"]
    sign_gate = np.mean([clamp_report["results"][f"mode{k}"]["learned_slot_weights"] for k in (1, 3)], 0)
    assert np.allclose(report["mean_gates"]["sign-1"], sign_gate, atol=1e-6)
    assert os.path.getsize(os.path.join(ran.run_dir, "swap_heatmap.png")) > 0
    headline = load_json(os.path.join(ran.run_dir, "eval.json"))
    assert headline["swap_effect_sign"]["deterministic"] == report["swap_effect"]["deterministic"]["sign"]["value"]
    tags = {"tta/swap_effect_sign_sampled", "tta/gate_episode_nmi_sign", "tta/swap_return_mode4_sign-1_deterministic"}
    assert tags <= set(logged_scalars(ran.run_dir))


# --- a stopped adapt run resumed -------------------------------------------------------------------------------------

KILL_AFTER_FIRST_TARGET = """
import json, os, runpy, signal, sys
replace = os.replace
def replace_then_die(src, dst):
    replace(src, dst)
    if dst.endswith("tta.json"):
        with open(dst) as f:
            if len(json.load(f)["results"]) == 1:
                os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace_then_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_killed_adapt_run_keeps_its_finished_targets_and_resumes_to_the_uninterrupted_result(checkpoint, tmp_path):
    """SIGKILL right after the first target's results are written: tta.json holds that target; --resume runs only the
    other one, and ends with the same tta.json results, eval.json and saved agents as a run never stopped."""
    flags = ["--checkpoint", checkpoint, "--mode-indices", "0", "1", "--episodes", "2", "--num-seeds", "1"]
    flags += ["--eval-episodes", "2", "--adapt-lr", "0.05", "--save-model"]
    command = [sys.executable, "-c", KILL_AFTER_FIRST_TARGET, script_path("tta_gating"), "adapt", *flags]
    killed = subprocess.run(
        [*command, "--runs-dir", tmp_path / "k"], env=SCRIPT_ENV, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert killed.returncode == -9, killed.stderr
    run_dir = only_run_dir(tmp_path / "k")
    stopped = load_json(os.path.join(run_dir, "tta.json"))
    assert list(stopped["results"]) == ["mode0"]
    assert "finished" not in stopped
    assert not os.path.exists(os.path.join(run_dir, "eval.json"))
    assert "planned: 2 targets, 8 adaptation episodes and 20 evaluations of 2 episodes" in killed.stdout
    assert f"--resume {run_dir}" in killed.stdout
    mismatch = run_script("tta_gating", "adapt", *flags[:-1], "--resume", run_dir)
    assert_one_line_error(mismatch, "was run with --save-model True, not False")
    resumed = run_script("tta_gating", "adapt", *flags, "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert "mode0 seed" not in resumed.stdout
    assert "mode1 seed 1    gate" in resumed.stdout
    assert "planned: 1 targets" in resumed.stdout
    whole_dir = run_tta("adapt", checkpoint, tmp_path / "w", *flags[2:]).run_dir
    finished = load_json(os.path.join(run_dir, "tta.json"))
    assert finished["results"] == load_json(os.path.join(whole_dir, "tta.json"))["results"]
    assert finished["finished"]
    assert finished["results"]["mode0"] == stopped["results"]["mode0"]
    assert load_json(os.path.join(run_dir, "eval.json")) == load_json(os.path.join(whole_dir, "eval.json"))
    saved = torch.load(os.path.join(run_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)["adapted"]
    whole_saved = torch.load(os.path.join(whole_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)["adapted"]
    assert [(s["target"], s["control"]) for s in saved] == [(s["target"], s["control"]) for s in whole_saved]
    assert len(saved) == 4
    for a, b in zip(saved, whole_saved):
        assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


def test_resume_needs_a_stopped_adapt_runs_directory(checkpoint, tmp_path):
    result = run_script("tta_gating", "adapt", "--checkpoint", checkpoint, "--resume", tmp_path)
    assert_one_line_error(result, "holds no tta.json")
