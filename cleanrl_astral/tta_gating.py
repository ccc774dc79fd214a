"""Test-time adaptation of the ASTRAL gate, and interventions on it, with controls (the ASTRAL plan's phases 5 and 6;
the plan and where this file departs from it: docs/plans.md#astral).

Reads an agent trained by ppo_gru_astral.py (its `.cleanrl_model`, never modified) and asks of its AbstractionBank:
- `adapt`: on a fixed target mode, does updating only the gate with REINFORCE raise the return? Controls on the same
  episodes: `none`, `gate` (the method), `context` (a gate-logit bias), `all` (every parameter), `tent` (reward-free);
  a gain also reads as a fraction of the headroom up to the ceiling, the best fixed gate. `adapt-plan` is the same with
  the plan's setting (the gate only, Adam lr 1e-4, 20 episodes per mode).
- `clamp`: the gate forced to each one-hot (z = A_k) in every mode; slots matched to modes give the clamp specificity.
- `swap`: the gate fixed to the mean learned gate of each force sign's training modes, and of each training mode, in
  every mode; whether the own group's gate beats the other's says whether a constant gate carries the behaviour.

Usage: python cleanrl_astral/tta_gating.py adapt --checkpoint runs/<run_name>/ppo_gru_astral.cleanrl_model
"""

import copy
import dataclasses
import functools
import glob
import itertools
import json
import math
import os
import sys
import time
import types
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

SCRIPT = os.path.basename(__file__)[: -len(".py")]
ASTRAL_SCRIPT = "ppo_gru_astral"
ASTRAL_FORMAT = 2
# the Args fields ppo_gru_astral.py writes into its checkpoint: a checkpoint of this format holding other fields is
# another commit's (the ASTRAL study's bottleneck, hard_gate, gumbel_tau and lambda_supervised), read at commit 31fadaa
ASTRAL_ARGS = (
    "exp_name seed torch_deterministic cuda track wandb_project_name wandb_entity capture_video save_model runs_dir "
    "eval_episodes env_id modes_preset mode_share hide_velocity fixed_mode switch_prob memory oracle prev_reward design "
    "total_timesteps learning_rate adam_eps num_envs num_steps anneal_lr gamma gae_lambda num_minibatches update_epochs "
    "norm_adv clip_coef clip_vloss ent_coef vf_coef max_grad_norm target_kl norm_reward hidden_size num_abstractions "
    "slot_dim slot_init tau lambda_w_ent sharpen_gate lambda_lb lambda_orth lambda_consistency diagnostics_every "
    "batch_size minibatch_size num_iterations"
).split()
# the two ways an evaluation acts: greedy, or sampled from the policy
KINDS = ("deterministic", "sampled")
Control = Literal["none", "gate", "context", "all", "tent"]
CONTROLS = ("none", "gate", "context", "all", "tent")


@dataclass(kw_only=True)
class Args:
    seed: int = 1
    """seed of the experiment (adaptation seed i is seed + i); also replaces `{seed}` in --checkpoint"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl_astral"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    runs_dir: str = "runs"
    """directory under which `{run_name}/` is written"""
    checkpoint: str
    """`.cleanrl_model` written by ppo_gru_astral.py --save-model (read only); `{seed}` and globs must match one file"""
    mode_indices: list[int] | None = None
    """indices of the checkpoint's modes to target, a preset's held-out mode included (default: all of them)"""
    modes: str | None = None
    """custom target physics instead of training modes: "g,l[,sign] g,l[,sign] ..." (unseen physics welcome)"""
    eval_episodes: int = 10
    """episodes per evaluation, each for deterministic and for sampled actions"""


@dataclass(kw_only=True)
class AdaptArgs(Args):
    """Adapt the gate (and the controls) on each target mode, a workload of minutes; results are written per target."""

    subcommand: ClassVar[str] = "adapt"
    exp_name: str = f"{SCRIPT}_adapt"
    """the name of this experiment"""
    eval_episodes: int = 5
    """episodes per evaluation, each for deterministic and for sampled actions"""
    resume: str | None = None
    """run directory of a stopped `adapt` run to continue (same flags): its finished targets are kept, the others run"""
    save_model: bool = False
    """save every adapted agent (target × seed × control) to `runs/{run_name}/{exp_name}.cleanrl_model`"""
    controls: list[Control] = dataclasses.field(default_factory=lambda: ["none", "gate"])
    """which of none, gate, context, all, tent to run, all with the same episodes and seeds"""
    episodes: int = 10
    """adaptation episodes per target mode, seed and control"""
    num_seeds: int = 2
    """adaptation seeds per target mode, the 95% CI is over these"""
    adapt_lr: float = 3e-3
    """Adam learning rate of the adaptation"""
    gamma: float = 0.99
    """discount of the REINFORCE / actor-critic returns"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    online: bool = False
    """update every --online-every steps inside episodes (n-step actor-critic on the value head), not once per episode"""
    online_every: int = 16
    """steps between online updates"""
    reward_scale: float | None = None
    """--online: the std the critic's rewards were divided by in training (default: read from the checkpoint)"""
    tent_kl_coef: float = 1.0
    """weight of KL(π_adapted || π_unadapted) in the `tent` loss; 0 lets entropy minimisation collapse the policy"""
    ceiling_resolution: int = 1
    """the ceiling's fixed gates: every mixture in multiples of 1/N, plus uniform (1: one-hots; 0: none)"""


@dataclass(kw_only=True)
class AdaptPlanArgs(AdaptArgs):
    """`adapt` at the ASTRAL plan's setting: REINFORCE on the gate only, Adam lr 1e-4, 20 episodes per mode, 3 seeds."""

    adapt_lr: float = 1e-4
    """Adam learning rate of the adaptation"""
    episodes: int = 20
    """adaptation episodes per target mode, seed and control"""
    num_seeds: int = 3
    """adaptation seeds per target mode, the 95% CI is over these"""
    eval_episodes: int = 10
    """episodes per evaluation, each for deterministic and for sampled actions"""


@dataclass(kw_only=True)
class ClampArgs(Args):
    """Clamp the gate to each slot, uniform and learned, in every target mode; report the clamp specificity."""

    subcommand: ClassVar[str] = "clamp"
    exp_name: str = f"{SCRIPT}_clamp"
    """the name of this experiment"""


@dataclass(kw_only=True)
class SwapArgs(Args):
    """Fix the gate to the mean learned gate of each force sign's and each training mode's episodes, in every mode."""

    subcommand: ClassVar[str] = "swap"
    exp_name: str = f"{SCRIPT}_swap"
    """the name of this experiment"""


SUBCOMMANDS = {
    "adapt": AdaptArgs,
    "adapt-plan": AdaptPlanArgs,
    "clamp": ClampArgs,
    "swap": SwapArgs,
}


# ENVIRONMENT: ppo_gru_astral.py's, each target played as its only mode
HELD_OUT_MODES = {"seed3": [], "inverted4": [], "mirror4": [4]}  # evaluated (and adapted to) only, never trained on


class NonStationaryCartPole:
    """`num_envs` CartPole-v1s stepped together in numpy, with gymnasium's equations, constants and 500-step limit.
    Each env has a hidden physics mode (gravity, pole half-length, force sign), drawn at every episode start and, with
    probability `switch_prob`, after any step, among the modes not `held_out`; `pinned[i] >= 0` fixes env i's mode
    (`fixed_mode` pins all; `mode_share="balanced"` pins env i to the (i mod M)-th of the M training modes, so every
    mode gets the same share of steps whatever its episode length). Autoreset is same-step: where an episode ends,
    the returned observation is already the next episode's first, and info["final_obs"] holds the ended one's last.
    info["mode"] and info["mode_name"] (for analysis only) are the mode that governs each env's next step and its name
    from `mode_names` (default: its gravity, half-length and force sign)."""

    def __init__(
        self,
        num_envs,
        modes,
        hide_velocity=False,
        fixed_mode=None,
        switch_prob=0.0,
        max_episode_steps=500,
        held_out=(),
        mode_share="uniform",
        mode_names=None,
    ):
        self.num_envs = num_envs
        if mode_names is None:
            mode_names = [f"g {gravity:g}, l {length:g}, force {sign:+g}" for gravity, length, sign in modes]
        self.mode_names = np.array(mode_names)
        self.switch_prob = switch_prob
        self.max_episode_steps = max_episode_steps
        self.gravity, self.half_length, self.force_sign = np.array(modes, dtype=np.float64).T
        self.train_modes = np.array([k for k in range(len(modes)) if k not in held_out])
        self.pinned = np.full(num_envs, -1)
        if fixed_mode is not None:
            self.pinned = np.full(num_envs, fixed_mode)
        if mode_share == "balanced":
            self.pinned = self.train_modes[np.arange(num_envs) % len(self.train_modes)]
        self.rng = np.random.default_rng()
        self.observed = [0, 1, 2, 3]
        if hide_velocity:  # cart position and pole angle only
            self.observed = [0, 2]

    def draw_modes(self, envs):
        """New modes for the envs of the boolean mask `envs` (pinned envs keep theirs)."""
        drawn = self.train_modes[self.rng.integers(len(self.train_modes), size=self.num_envs)]
        drawn = np.where(self.pinned >= 0, self.pinned, drawn)
        self.mode = np.where(envs, drawn, self.mode)

    def restart(self, envs):
        self.state[envs] = self.rng.uniform(-0.05, 0.05, (int(envs.sum()), 4))
        self.elapsed[envs] = 0
        self.draw_modes(envs)

    def reset(self, seed=None):
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros((self.num_envs, 4))
        self.elapsed = np.zeros(self.num_envs, dtype=int)
        self.mode = np.zeros(self.num_envs, dtype=int)
        self.restart(np.ones(self.num_envs, dtype=bool))
        info = {"mode": self.mode.copy(), "mode_name": self.mode_names[self.mode]}
        return self.state[:, self.observed].astype(np.float32), info

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state.T
        gravity = self.gravity[self.mode]
        length = self.half_length[self.mode]
        masspole = 0.1
        total_mass = 0.1 + 1.0
        force = self.force_sign[self.mode] * 10.0 * np.where(action == 1, 1.0, -1.0)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + masspole * length * np.square(theta_dot) * sintheta) / total_mass
        thetaacc = (gravity * sintheta - costheta * temp) / (
            length * (4.0 / 3.0 - masspole * np.square(costheta) / total_mass)
        )
        xacc = temp - masspole * length * thetaacc * costheta / total_mass
        self.state = np.stack(
            [x + 0.02 * x_dot, x_dot + 0.02 * xacc, theta + 0.02 * theta_dot, theta_dot + 0.02 * thetaacc], 1
        )
        self.last_state = self.state.copy()  # what a renderer draws
        self.elapsed = self.elapsed + 1
        terminated = (np.abs(self.state[:, 0]) > 2.4) | (np.abs(self.state[:, 2]) > 12 * 2 * math.pi / 360)
        truncated = self.elapsed >= self.max_episode_steps
        if self.switch_prob > 0:
            self.draw_modes(self.rng.random(self.num_envs) < self.switch_prob)
        info = {"final_obs": self.state[:, self.observed].astype(np.float32), "final_mode": self.mode.copy()}
        self.restart(terminated | truncated)
        info["mode"] = self.mode.copy()
        info["mode_name"] = self.mode_names[self.mode]
        return self.state[:, self.observed].astype(np.float32), np.ones(self.num_envs), terminated, truncated, info


# AGENT: ppo_gru_astral.py's (weights from the checkpoint)
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class AbstractionBank(nn.Module):
    """K learnable slots A and a gate p = softmax(g(h) / τ): z = wᵀA with w = p."""

    def __init__(self, hidden_size, num_abstractions, slot_dim, tau, orthonormal=False, design="script"):
        super().__init__()
        self.slots = nn.Parameter(torch.randn(num_abstractions, slot_dim) * 0.02)
        self.tau = tau
        if orthonormal:  # unit-norm, mutually orthogonal rows: no two slots start alike (needs K <= d)
            nn.init.orthogonal_(self.slots)
        if design == "plan":  # g = Linear(d, d) - ReLU - Linear(d, K), PyTorch's default initialisation
            self.gate = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_abstractions))
        else:  # small final layer: the gate starts near uniform, so no slot wins by initialisation
            self.gate = nn.Sequential(
                layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, num_abstractions), std=0.01)
            )

    def forward(self, h, weights=None):
        """(z, w, p); `weights` overrides w (a one-hot clamps a slot)."""
        logits = self.gate(h) / self.tau
        probs = torch.softmax(logits, dim=-1)
        if weights is None:
            weights = probs
        return weights @ self.slots, weights, probs


class FiLM(nn.Module):
    """h' = γ ⊙ h + β with (γ - 1, β) = Linear(z): a zero z leaves h unchanged."""

    def __init__(self, slot_dim, hidden_size):
        super().__init__()
        self.net = layer_init(nn.Linear(slot_dim, 2 * hidden_size), std=1.0)

    def forward(self, h, z):
        gamma, beta = self.net(z).chunk(2, dim=-1)
        return (1.0 + gamma) * h + beta


class PlanFiLM(nn.Module):
    """The plan's FiLM: h' = γ ⊙ h + β with (γ, β) = Linear(d, d) - ReLU - Linear(d, 2H) of z, PyTorch's default
    initialisation; a zero z gives γ and β of the layers' biases."""

    def __init__(self, slot_dim, hidden_size):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(slot_dim, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, h, z):
        gamma, beta = self.net(z).chunk(2, dim=-1)
        return gamma * h + beta


class Modulated(NamedTuple):
    """Agent.forward: the FiLM-modulated state the heads read, the GRU state after the last step, and the gate."""

    hidden: torch.Tensor
    state: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor


class ActionAndValue(NamedTuple):
    action: torch.Tensor
    logprob: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor
    state: torch.Tensor
    weights: torch.Tensor
    """the gate weights w that made z"""
    probs: torch.Tensor
    """the gate probabilities p"""


class Agent(nn.Module):
    """ASTRAL's agent as `args` sets it (the Args fields hidden_size, memory, oracle, prev_reward, num_abstractions,
    slot_dim, tau, slot_init and design), for observations of obs_dim, num_actions
    actions and num_modes modes (the oracle's one-hot)."""

    def __init__(self, args, obs_dim, num_actions, num_modes):
        super().__init__()
        hidden_size = args.hidden_size
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.num_modes = num_modes
        self.memory = args.memory
        self.oracle = args.oracle
        self.prev_reward = args.prev_reward
        self.input_dim = obs_dim + num_actions + int(args.prev_reward)
        if args.oracle:
            self.input_dim += num_modes
        self.hidden_size = hidden_size
        orthonormal = args.slot_init == "orthonormal"
        if args.design == "plan":  # the plan's network: ReLU layers of width d, PyTorch's default initialisation
            self.encoder = nn.Sequential(nn.Linear(self.input_dim, hidden_size), nn.ReLU())
            self.gru = nn.GRUCell(hidden_size, hidden_size)
            self.bank = AbstractionBank(hidden_size, args.num_abstractions, args.slot_dim, args.tau, orthonormal, "plan")
            self.film = PlanFiLM(args.slot_dim, hidden_size)
            self.actor = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_actions))
            self.critic = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 1))
        else:  # the script's network: tanh layers, heads 64 wide, CleanRL's layer_init, an orthogonal GRU with zero biases
            self.encoder = nn.Sequential(layer_init(nn.Linear(self.input_dim, hidden_size)), nn.Tanh())
            self.gru = nn.GRUCell(hidden_size, hidden_size)
            for name, param in self.gru.named_parameters():
                if "bias" in name:
                    nn.init.constant_(param, 0)
                else:
                    nn.init.orthogonal_(param, 1.0)
            self.bank = AbstractionBank(hidden_size, args.num_abstractions, args.slot_dim, args.tau, orthonormal)
            self.film = FiLM(args.slot_dim, hidden_size)
            self.actor = nn.Sequential(
                layer_init(nn.Linear(hidden_size, 64)),
                nn.Tanh(),
                layer_init(nn.Linear(64, num_actions), std=0.01),
            )
            self.critic = nn.Sequential(
                layer_init(nn.Linear(hidden_size, 64)),
                nn.Tanh(),
                layer_init(nn.Linear(64, 1), std=1.0),
            )

    def build_input(self, obs, prev_action, prev_reward, mode):
        """obs (..., obs_dim), prev_action (...) with -1 for "none", prev_reward (...), mode (...) -> input."""
        prev_onehot = torch.nn.functional.one_hot((prev_action + 1).long(), self.num_actions + 1)[..., 1:].float()
        parts = [obs.float(), prev_onehot]
        if self.prev_reward:
            parts.append(prev_reward.float().unsqueeze(-1))
        if self.oracle:
            parts.append(torch.nn.functional.one_hot(mode.long(), self.num_modes).float())
        return torch.cat(parts, dim=-1)

    def unroll(self, x, state, starts):
        """x (T, B, input_dim), state (B, H) before x[0], starts (T, B) = 1 where x[t] opens an episode.
        Returns the GRU states h (T, B, H) and the state after x[T-1]."""
        features = self.encoder(x)
        keep = 1.0 - starts
        if self.memory == "none":
            keep = torch.zeros_like(starts)
        hidden = []
        # the GRUCell's own op without the module-call overhead (same numbers, ~4% off a training run)
        gru_weights = (self.gru.weight_ih, self.gru.weight_hh, self.gru.bias_ih, self.gru.bias_hh)
        # unbind, not features[t]: indexing makes backward zero-fill a full (T, B, H) gradient at every step
        for feature_t, keep_t in zip(features.unbind(0), keep.unbind(0)):
            # zero the state where the episode restarted: x[t] is a first step
            state = torch.gru_cell(feature_t, state * keep_t.unsqueeze(-1), *gru_weights)
            hidden.append(state)
        return torch.stack(hidden), state

    def forward(self, x, state, starts, weights=None):
        """The gate reads h; h' = FiLM(h; z)."""
        hidden, state = self.unroll(x, state, starts)
        z, weights, probs = self.bank(hidden, weights)
        return Modulated(self.film(hidden, z), state, weights, probs)

    def get_value(self, x, state, starts):
        return self.critic(self(x, state, starts).hidden).squeeze(-1)

    def get_action_and_value(self, x, state, starts, action=None, deterministic=False, weights=None):
        out = self(x, state, starts, weights)
        logits = self.actor(out.hidden)
        probs = Categorical(logits=logits)
        if action is None and deterministic:
            action = logits.argmax(-1)
        elif action is None:
            action = probs.sample()
        value = self.critic(out.hidden).squeeze(-1)
        return ActionAndValue(action, probs.log_prob(action), probs.entropy(), value, out.state, out.weights, out.probs)


def agent_from_args(args, num_modes, spaces=None):
    """The agent of `args`; `spaces`, another --env-id's EnvSpaces (NonStationaryCartPole's when None)."""
    obs_dim = 4
    if args.hide_velocity:
        obs_dim = 2
    num_actions = 2
    if spaces is not None:
        obs_dim = spaces.obs_dim
        num_actions = spaces.num_actions
    return Agent(args, obs_dim, num_actions, num_modes)


# THE CONTEXT CONTROL: a learnable bias c on the gate's logits, p = softmax((g(h) + c) / τ), zero as loaded
def add_context_bias(context, gate, inputs, logits):
    return logits + context


def attach_context(bank):
    """Gives an AbstractionBank a zero gate-logit bias `context` (K,), added to its gate's output by a forward hook."""
    bank.register_parameter("context", nn.Parameter(torch.zeros(len(bank.slots))))
    bank.gate.register_forward_hook(functools.partial(add_context_bias, bank.context))


# ACTING
class Step(NamedTuple):
    dist: Categorical
    value: torch.Tensor
    state: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor


def policy_step(agent, obs, prev_action, prev_reward, mode, state, start, weights=None):
    """One step of B envs, the input built as in ppo_gru_astral.py's rollout (start = 1 zeroes the state); `weights` (K,)
    clamps the gate. Returns a Step, with graph."""
    inputs = [torch.as_tensor(np.asarray(v)) for v in (obs, prev_action, prev_reward, mode)]
    x = agent.build_input(*inputs)[None]
    if weights is not None:
        weights = weights.expand(*x.shape[:-1], -1)
    starts = torch.as_tensor(np.asarray(start), dtype=torch.float32)[None]
    out = agent(x, state, starts, weights)
    dist = Categorical(logits=agent.actor(out.hidden[0]))
    value = agent.critic(out.hidden[0]).squeeze(-1)
    return Step(dist, value, out.state, out.weights[0], out.probs[0])


def target_env(num_envs, target, hide_velocity):
    """`num_envs` envs all in the target's physics."""
    return NonStationaryCartPole(num_envs, [target["physics"]], hide_velocity, fixed_mode=0)


class Evaluation(NamedTuple):
    returns: np.ndarray
    """(episodes,) return of each env's first episode"""
    slot_weights: np.ndarray
    """(K,) mean gate weights over every step of those episodes"""
    episode_slot_weights: np.ndarray
    """(episodes, K) mean gate weights of each episode"""


def evaluate_target(agent, target, hide_velocity, episodes, deterministic, seed, weights=None):
    """The first episode of `episodes` envs of the target (env and torch seed `seed`, as ppo_gru_astral.evaluate's mode k
    for seed - 1000 k), the gate optionally clamped to `weights` (K,). Returns an Evaluation."""
    torch.manual_seed(seed)
    envs = target_env(episodes, target, hide_velocity)
    obs, _ = envs.reset(seed=seed)
    mode = np.full(episodes, target["index"])
    state = torch.zeros(episodes, agent.hidden_size)
    prev_action = np.full(episodes, -1)
    prev_reward = np.zeros(episodes)
    start = np.ones(episodes)
    returns = np.zeros(episodes)
    finished = np.zeros(episodes, dtype=bool)
    weight_sum = 0.0
    steps = 0
    episode_weight_sum = np.zeros((episodes, len(agent.bank.slots)))
    episode_steps = np.zeros(episodes)
    while not finished.all():
        with torch.no_grad():
            step = policy_step(agent, obs, prev_action, prev_reward, mode, state, start, weights)
        state = step.state
        if deterministic:
            action = step.dist.logits.argmax(-1).numpy()
        else:
            action = step.dist.sample().numpy()
        weight_sum = weight_sum + step.weights[torch.as_tensor(~finished)].sum(0).numpy()
        steps = steps + int((~finished).sum())
        episode_weight_sum += step.weights.numpy() * ~finished[:, None]
        episode_steps += ~finished
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns = returns + reward * ~finished
        done = terminated | truncated
        finished |= done
        prev_action = np.where(done, -1, action)
        prev_reward = np.where(done, 0.0, reward)
        start = done
    return Evaluation(returns, weight_sum / steps, episode_weight_sum / episode_steps[:, None])


# FIXED GATES: the learned gate, or a gate held fixed (the ceiling's and the interventions')
class GateReturns(NamedTuple):
    means: dict
    """{setting: {kind: [mean return per seed]}}"""
    runs: dict
    """{setting: {kind: [Evaluation per seed]}}"""


def gate_returns(agent, target, hide_velocity, settings, seeds, episodes, kinds=KINDS):
    """Evaluations of named gate settings (None: the learned gate) on the target, every seed and kind."""
    runs = {}
    for name, weights in settings.items():
        runs[name] = {}
        for kind in kinds:
            deterministic = kind == "deterministic"
            runs[name][kind] = [
                evaluate_target(agent, target, hide_velocity, episodes, deterministic, s, weights) for s in seeds
            ]
    means = {
        name: {kind: [float(run.returns.mean()) for run in per_seed] for kind, per_seed in by_kind.items()}
        for name, by_kind in runs.items()
    }
    return GateReturns(means, runs)


def gate_settings(num_slots, resolution):
    """Named fixed gates: the one-hots `slot{k}`, mixtures with weights in multiples of 1/resolution, `uniform` (1/K)."""
    settings = {f"slot{k}": torch.eye(num_slots)[k] for k in range(num_slots)}
    for parts in itertools.product(range(resolution), repeat=num_slots):
        if sum(parts) == resolution and len(set(parts)) > 1:
            weights = torch.tensor(parts, dtype=torch.float32) / resolution
            settings["mix[" + " ".join(f"{w:.2g}" for w in weights.tolist()) + "]"] = weights
    settings["uniform"] = torch.full((num_slots,), 1.0 / num_slots)
    return settings


def ceiling(agent, target, hide_velocity, settings, seeds, episodes):
    """The best of the fixed gates `settings` by mean sampled return on the evaluation episodes: ({"best", "per_setting"
    (sampled returns per seed)}); its statistics are added by the report."""
    means = gate_returns(agent, target, hide_velocity, settings, seeds, episodes, ("sampled",)).means
    per_setting = {name: by_kind["sampled"] for name, by_kind in means.items()}
    best = max(per_setting, key=lambda name: np.mean(per_setting[name]))
    return {"best": best, "per_setting": per_setting}


# ADAPTATION LOSSES
def discounted_returns(rewards, gamma, bootstrap=0.0):
    out = np.zeros(len(rewards))
    running = bootstrap
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def reinforce_loss(logprobs, rewards, gamma):
    """-mean_t log π(a_t) Ĝ_t on one episode, Ĝ the discounted returns normalised over it; `logprobs` carry the graph."""
    returns = torch.as_tensor(discounted_returns(rewards, gamma), dtype=torch.float32)
    if len(returns) > 1:
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
    else:
        returns = torch.zeros_like(returns)
    return -(logprobs * returns).mean()


def actor_critic_loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale):
    """n-step actor-critic on one segment; the value head (trained on rewards / reward_scale) is baseline and bootstrap."""
    targets = discounted_returns(np.asarray(rewards) / reward_scale, gamma, bootstrap_value)
    return -(logprobs * (torch.as_tensor(targets, dtype=torch.float32) - values.detach())).mean()


def tent_loss(logits, anchor_logits, gate_probs, kl_coef):
    """Reward-free: H(p) + H(π) + kl_coef · KL(π || π_unadapted), averaged over steps (p the gate's probabilities).
    Without the anchor, entropy minimisation collapses the policy onto its preferred action."""
    gate_entropy = -(gate_probs * torch.log(gate_probs + 1e-8)).sum(-1).mean()
    log_p = torch.log_softmax(logits, -1)
    log_q = torch.log_softmax(anchor_logits, -1)
    policy_entropy = -(log_p.exp() * log_p).sum(-1).mean()
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return gate_entropy + policy_entropy + kl_coef * kl


def adapted_parameters(agent, control):
    """The parameters a control updates, the others frozen; `all` means the checkpoint's (its clipped norm without c)."""
    for name, param in agent.named_parameters():
        gate = name.startswith("bank.gate.")
        context = name == "bank.context"
        updated = {"gate": gate, "tent": gate, "context": context, "all": not context}
        param.requires_grad_(updated.get(control, False))
    return [p for p in agent.parameters() if p.requires_grad]


# ADAPTATION
class Adaptation(NamedTuple):
    agent: Agent
    """the adapted copy of the checkpoint's agent"""
    returns: list
    """the return of each adaptation episode"""
    updates: int
    """how many optimizer steps were taken"""


def adaptation(ckpt, target, control, seed, args, reward_scale):
    """A fresh copy of the checkpoint's agent adapted on `target` with `control`: --episodes sampled episodes of one env,
    each updated at its end (or every --online-every steps with --online); `none` acts identically but never updates.
    The env and torch seeds depend only on (target, seed): every control plays the same episodes until its parameters
    differ."""
    agent = agent_from_checkpoint(ckpt)
    anchor = copy.deepcopy(agent).requires_grad_(False)
    params = adapted_parameters(agent, control)
    optimizer = None
    if params:
        optimizer = torch.optim.Adam(params, lr=args.adapt_lr)
    env = target_env(1, target, ckpt["args"]["hide_velocity"])
    mode = np.full(1, target["index"])
    torch.manual_seed(seed)
    returns = []
    updates = 0
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=10_000 * seed + episode)
        state = torch.zeros(1, agent.hidden_size)
        anchor_state = torch.zeros(1, agent.hidden_size)
        prev_action = np.full(1, -1)
        prev_reward = np.zeros(1)
        start = np.ones(1)
        segment = []
        episode_return = 0.0
        done = False
        while not done:
            # ROLLOUT
            with torch.set_grad_enabled(optimizer is not None):
                step = policy_step(agent, obs, prev_action, prev_reward, mode, state, start)
            state = step.state
            anchor_logits = None
            if control == "tent":  # the anchor on the same inputs
                with torch.no_grad():
                    anchor_step = policy_step(anchor, obs, prev_action, prev_reward, mode, anchor_state, start)
                anchor_state = anchor_step.state
                anchor_logits = anchor_step.dist.logits
            action = step.dist.sample()
            obs, prev_reward, terminated, truncated, info = env.step(action.numpy())
            prev_action = action.numpy()
            start = np.zeros(1)
            done = bool(terminated[0] or truncated[0])
            reward = float(prev_reward[0])
            segment.append((step.dist.log_prob(action), step.value, step.dist.logits, step.probs, anchor_logits, reward))
            episode_return += reward
            if optimizer is None:
                continue
            if not done and not (args.online and len(segment) == args.online_every):
                continue

            # UPDATE
            logprobs, values, logits, gate_probs, anchor_logits, rewards = zip(*segment)
            if control == "tent":
                loss = tent_loss(torch.cat(logits), torch.cat(anchor_logits), torch.cat(gate_probs), args.tent_kl_coef)
            elif args.online:
                # a fallen pole has no future; a cut segment or a time-limit truncation continues: bootstrap from the value
                # of the next observation (the ended episode's last one where the env already restarted)
                bootstrap = 0.0
                if not terminated[0]:
                    with torch.no_grad():
                        bootstrap = float(
                            policy_step(agent, info["final_obs"], prev_action, prev_reward, mode, state, start).value
                        )
                loss = actor_critic_loss(torch.cat(logprobs), torch.cat(values), rewards, bootstrap, args.gamma, reward_scale)
            else:
                loss = reinforce_loss(torch.cat(logprobs), rewards, args.gamma)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], args.max_grad_norm)
            optimizer.step()
            updates += 1
            # truncated backpropagation: the next segment starts from a constant state
            state = state.detach()
            anchor_state = anchor_state.detach()
            segment = []
        returns.append(episode_return)
    return Adaptation(agent, returns, updates)


# THE ADAPT SUBCOMMAND
class Outcome(NamedTuple):
    results_path: str
    figure: str
    headline: dict
    """eval.json's numbers, averaged over the targets"""


def adapt(args, run, writer):
    """The adapt subcommand: per target, the evaluation before, the ceiling, then every control and seed adapted on the
    same episodes and evaluated after; tta.json is written after every target. With the helper package, each target's
    statistics, their TensorBoard scalars, the adaptation curves and eval.json's headline numbers (else Outcome's None)."""
    reports = have_helper_package()
    if reports:
        from cleanrl_astral_utils import tta  # statistics, the workload's estimate, plots, resuming

    report = run.report
    hide_velocity = run.ckpt["args"]["hide_velocity"]
    settings = {}
    if args.ceiling_resolution:
        settings = gate_settings(run.ckpt["args"]["num_abstractions"], args.ceiling_resolution)
    seeds = [args.seed + i for i in range(args.num_seeds)]
    report.update(controls=args.controls, seeds=seeds, episodes=args.episodes, online=args.online)
    report.update(reward_scale=run.reward_scale)
    report.setdefault("results", {})
    results_path = os.path.join(run.run_dir, "tta.json")
    model_file = os.path.join(run.run_dir, f"{args.exp_name}.cleanrl_model")
    saved = []
    if args.resume is not None:
        saved = tta.saved_adapted(model_file, args.save_model)
    if reports:
        workload = tta.adapt_workload(args, len(run.targets) - len(report["results"]), len(settings))
        print(tta.describe_workload(workload, run.agent, policy_step, hide_velocity, results_path, run.run_dir), flush=True)
    for position, target in enumerate(run.targets):
        if target["name"] in report["results"]:
            continue  # finished by the stopped run this one resumes
        # the same evaluation episodes (env and torch seeds) before, after and for the ceiling: every comparison is paired
        eval_seeds = [100_000 + 10_000 * seed + 1000 * position for seed in seeds]
        before = gate_returns(run.agent, target, hide_velocity, {"learned": None}, eval_seeds, args.eval_episodes)
        result = {"before": before.means["learned"], "ceiling": None, "controls": {}}
        if settings:
            result["ceiling"] = ceiling(run.agent, target, hide_velocity, settings, eval_seeds, args.eval_episodes)
        for control in args.controls:
            entry = new_control_entry()
            for i, (seed, eval_seed) in enumerate(zip(seeds, eval_seeds)):
                # ROLLOUT and UPDATE, every episode
                adapted = adaptation(run.ckpt, target, control, seed, args, run.reward_scale)
                after = gate_returns(
                    adapted.agent.eval(), target, hide_velocity, {"learned": None}, [eval_seed], args.eval_episodes
                )
                add_seed(entry, after.means["learned"], after.runs["learned"], adapted.returns, adapted.updates)
                if args.save_model:
                    saved.append(
                        {"target": target["name"], "seed": seed, "control": control, "state_dict": adapted.agent.state_dict()}
                    )
                print(
                    f"{target['name']} seed {seed} {control:>7}: before {before.means['learned']['sampled'][i]:6.1f} "
                    f"during {np.mean(adapted.returns):6.1f} after {entry['after_per_seed']['sampled'][-1]:6.1f} "
                    f"(sampled; {adapted.updates} updates)",
                    flush=True,
                )
            result["controls"][control] = entry
        if reports:
            result = tta.summarise_target(result)

            # LOGGING
            tta.log_adapt_target(writer, target["name"], result, args.episodes)
        report["results"][target["name"]] = result
        if args.save_model:  # before the results: a target found in tta.json has its agents saved
            save_adapted(saved, report, run.ckpt, model_file)
        write_json(report, results_path)  # per finished target: a stopped run keeps it
    report["finished"] = True
    write_json(report, results_path)
    if not reports:
        return Outcome(results_path, None, None)
    figure = os.path.join(run.run_dir, "adaptation_curves.png")
    mode_of_update = "per-episode"
    if args.online:
        mode_of_update = "online"
    tta.plot_adaptation_curves(
        report["results"],
        run.targets,
        args.controls,
        figure,
        f"{run.run_name}\nadaptation on {run.ckpt['run_name']} ({args.num_seeds} seeds, {mode_of_update} updates)",
    )
    return Outcome(results_path, figure, tta.adapt_headline(report))


# INTERVENTIONS: the clamp and the gate swap, subcommands of their own
def clamp(args, run, writer):
    """The clamp subcommand: every target with the gate clamped to each slot, to uniform and learned; clamp.json. With the
    helper package, the return matrix, the clamp specificity, the heatmap and eval.json's headline numbers."""
    settings = gate_settings(run.ckpt["args"]["num_abstractions"], 1)
    settings["learned"] = None
    runs = {}
    for position, target in enumerate(run.targets):
        eval_seed = 100_000 + args.seed + 1000 * position
        runs[target["name"]] = gate_returns(
            run.agent, target, run.ckpt["args"]["hide_velocity"], settings, [eval_seed], args.eval_episodes
        ).runs
    report = run.report
    report.update(columns=list(settings), results={})
    for target in run.targets:
        report["results"][target["name"]] = cells(runs[target["name"]])
        learned = runs[target["name"]]["learned"]["deterministic"][0]
        report["results"][target["name"]]["learned_slot_weights"] = learned.slot_weights.tolist()

    # LOGGING
    log_cells(writer, "clamp", report, run.targets)
    results_path = os.path.join(run.run_dir, "clamp.json")
    if not have_helper_package():
        write_json(report, results_path)
        return Outcome(results_path, None, None)
    from cleanrl_astral_utils import tta  # the analysis and the plot

    tta.add_clamp_analysis(report, run.targets, run.ckpt["args"]["num_abstractions"])
    tta.log_clamp_specificity(writer, report)
    figure = os.path.join(run.run_dir, "clamp_heatmap.png")
    tta.plot_heatmap(
        tta.return_matrix(report["results"], run.targets, list(settings)),
        [t["label"] for t in run.targets],
        list(settings),
        figure,
        f"{run.run_name}\nreturn with the gate clamped, {args.eval_episodes} episodes per cell ({run.ckpt['run_name']})",
    )
    write_json(report, results_path)
    return Outcome(results_path, figure, tta.clamp_headline(report))


def swap_gates(mean_gates, targets):
    """The swap's fixed gates: `sign+1` / `sign-1`, the mean of the mean learned gates of that force sign's training
    modes (each mode weighs the same), then `mode{k}`, each training mode's own mean learned gate."""
    training = [t for t in targets if not t["held_out"]]
    gates = {}
    for sign in sorted({t["physics"][2] for t in training}, reverse=True):
        gates[f"sign{sign:+g}"] = np.mean([mean_gates[t["name"]] for t in training if t["physics"][2] == sign], 0)
    for t in training:
        gates[t["name"]] = np.asarray(mean_gates[t["name"]])
    return {name: torch.as_tensor(w, dtype=torch.float32) for name, w in gates.items()}


class Swap(NamedTuple):
    gates: dict
    """{name: (K,) fixed gate}: `sign+1`, `sign-1`, then `mode{k}` for each training mode"""
    mean_gates: dict
    """{target: (K,) mean gate of the learned gate's deterministic episodes}"""
    episode_gates: dict
    """{target: (episodes, K) each of those episodes' mean gate}"""
    runs: dict
    """{target: {column: {kind: [Evaluation]}}}, the columns the gates and `learned`"""


def gate_swap(agent, targets, hide_velocity, episodes, seed):
    """The swap intervention: the learned gate's episodes in every target (env and torch seed 100000 + seed + 1000 ·
    position, as clamp's), their mean gates grouped by force sign and by mode, then every target with the gate fixed to
    each group's mean gate, on the same episodes."""
    eval_seeds = [100_000 + seed + 1000 * position for position in range(len(targets))]
    learned = {}
    for target, eval_seed in zip(targets, eval_seeds):
        learned[target["name"]] = gate_returns(agent, target, hide_velocity, {"learned": None}, [eval_seed], episodes).runs
    mean_gates = {name: runs["learned"]["deterministic"][0].slot_weights for name, runs in learned.items()}
    episode_gates = {name: runs["learned"]["deterministic"][0].episode_slot_weights for name, runs in learned.items()}
    gates = swap_gates(mean_gates, targets)
    runs = {}
    for target, eval_seed in zip(targets, eval_seeds):
        runs[target["name"]] = gate_returns(agent, target, hide_velocity, gates, [eval_seed], episodes).runs
        runs[target["name"]]["learned"] = learned[target["name"]]["learned"]
    return Swap(gates, mean_gates, episode_gates, runs)


def swap(args, run, writer):
    """The swap subcommand: every target with the gate fixed to each group's mean learned gate; swap.json. With the
    helper package, the learned gate's routing, the return matrix, the swap effects, the heatmap and eval.json's headline
    numbers."""
    reports = have_helper_package()
    if reports:
        from cleanrl_astral_utils import tta  # the analysis and the plot

    swapped = gate_swap(run.agent, run.targets, run.ckpt["args"]["hide_velocity"], args.eval_episodes, args.seed)
    columns = [*swapped.gates, "learned"]
    report = run.report
    report.update(columns=columns, mean_gates={name: w.tolist() for name, w in swapped.gates.items()})
    if reports:
        report["routing"] = tta.gate_routing(swapped.episode_gates, swapped.mean_gates, run.targets)
    report["results"] = {target["name"]: cells(swapped.runs[target["name"]]) for target in run.targets}

    # LOGGING
    log_cells(writer, "swap", report, run.targets)
    results_path = os.path.join(run.run_dir, "swap.json")
    if not reports:
        write_json(report, results_path)
        return Outcome(results_path, None, None)
    tta.add_swap_analysis(report, run.targets)
    tta.log_swap(writer, report)
    print(tta.describe_swap(report))
    figure = os.path.join(run.run_dir, "swap_heatmap.png")
    tta.plot_heatmap(
        tta.return_matrix(report["results"], run.targets, columns),
        [t["label"] for t in run.targets],
        columns,
        figure,
        f"{run.run_name}\nreturn with the gate fixed to a group's mean learned gate, {args.eval_episodes} episodes per "
        f"cell ({run.ckpt['run_name']})",
    )
    write_json(report, results_path)
    return Outcome(results_path, figure, tta.swap_headline(report))


# RESULTS FILES: the measurements; the helper package adds their statistics where it is installed
def new_report(args, model_path, ckpt, targets):
    """The fields every results file (tta.json, clamp.json, swap.json) starts with."""
    return {
        "script": SCRIPT,
        "subcommand": args.subcommand,
        "checkpoint": os.path.abspath(model_path),
        "checkpoint_run": ckpt["run_name"],
        "checkpoint_args": ckpt["args"],
        "eval_episodes": args.eval_episodes,
        "args": vars(args),
        "targets": [
            {
                "name": t["name"],
                "gravity": t["physics"][0],
                "half_length": t["physics"][1],
                "force_sign": t["physics"][2],
                "held_out": t["held_out"],
            }
            for t in targets
        ],
    }


def new_control_entry():
    """An adapt control's per-seed measurements, filled seed by seed (add_seed)."""
    return {
        "during_per_seed": [],
        "after_per_seed": {kind: [] for kind in KINDS},
        "slot_weights_after_per_seed": [],
        "updates": 0,
    }


def add_seed(entry, after_means, after_runs, returns, updates):
    """Adds one adaptation seed to a control's entry: its mean return after ({kind: [mean]}), the mean gate of its
    deterministic evaluation after ({kind: [Evaluation]}), the return of each adaptation episode and its update count."""
    for kind, (value,) in after_means.items():
        entry["after_per_seed"][kind].append(value)
    entry["slot_weights_after_per_seed"].append(after_runs["deterministic"][0].slot_weights.tolist())
    entry["during_per_seed"].append(returns)
    entry["updates"] += updates


def cells(runs):
    """{column: {kind: [Evaluation]}} of one evaluation seed -> {column: {kind: {"mean", "std", "returns"}}}."""
    out = {}
    for column, by_kind in runs.items():
        out[column] = {}
        for kind, (evaluation,) in by_kind.items():
            r = evaluation.returns
            out[column][kind] = {"mean": float(r.mean()), "std": float(r.std()), "returns": r.tolist()}
    return out


def log_cells(writer, subcommand, report, targets):
    """TensorBoard scalars tta/{subcommand}_return_{target}_{column}_{kind} of a clamp or swap report's cells, and one
    line per target of its deterministic returns."""
    for target in targets:
        cells = report["results"][target["name"]]
        for column in report["columns"]:
            for kind in KINDS:
                writer.add_scalar(f"tta/{subcommand}_return_{target['name']}_{column}_{kind}", cells[column][kind]["mean"], 0)
        returns = " ".join(f"{c} {cells[c]['deterministic']['mean']:.0f}" for c in report["columns"])
        print(f"{target['label']}: {returns}", flush=True)


def write_json(obj, path):
    """A results file, atomically (a temporary file beside it, then os.replace): a killed run leaves the previous
    version, never a half-written one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def save_adapted(saved, report, ckpt, path):
    """Every adapted state dict so far, with what it was adapted from, atomically."""
    adapted = {
        "script": SCRIPT,
        "format": 1,
        "source_checkpoint": report["checkpoint"],
        "source_args": ckpt["args"],
        "modes": ckpt["modes"],
        "adapted": saved,
    }
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(adapted, tmp)
    os.replace(tmp, path)


def have_helper_package():
    """Whether cleanrl_astral_utils (reports, plots, video, resume) can be imported: a script copied alone runs without it."""
    try:
        import cleanrl_astral_utils  # noqa: F401
    except ImportError:
        return False
    return True


# CHECKPOINT AND TARGETS
def agent_from_checkpoint(ckpt):
    """A fresh agent holding the checkpoint's weights and a zero context (attach_context)."""
    trained = types.SimpleNamespace(**ckpt["args"])
    agent = agent_from_args(trained, len(ckpt["modes"]))
    attach_context(agent.bank)
    agent.load_state_dict({"bank.context": agent.bank.context.detach().clone(), **ckpt["state_dict"]})
    return agent


def find_checkpoint(args):
    """The one file --checkpoint names: `{seed}` replaced by --seed, a glob matching exactly one file."""
    path = args.checkpoint.replace("{seed}", str(args.seed))  # one sweep command, each seed's checkpoint
    matches = [path]
    if glob.has_magic(path):
        matches = sorted(glob.glob(path))
    if len(matches) != 1:
        raise ValueError(f"--checkpoint {path!r} matches {len(matches)} files; it must match exactly one")
    return matches[0]


def load_astral_checkpoint(path):
    """(checkpoint dict, agent) of a ppo_gru_astral.py `.cleanrl_model` (read only), or ValueError saying why not."""
    if not os.path.isfile(path):
        raise ValueError(
            f"checkpoint {path!r} does not exist; pass the .cleanrl_model of a ppo_gru_astral.py --save-model run"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"checkpoint {path!r} is not a readable torch file ({type(e).__name__})") from e
    found = None
    if isinstance(ckpt, dict):
        found = ckpt.get("script")
    if found != ASTRAL_SCRIPT:
        raise ValueError(
            f"checkpoint {path!r} was written by {found or 'another program'}, not {ASTRAL_SCRIPT}.py; test-time gating "
            "needs an ASTRAL agent (it has the gate)"
        )
    if ckpt.get("format") != ASTRAL_FORMAT:
        raise ValueError(
            f"checkpoint {path!r} holds another format of {ASTRAL_SCRIPT}.py's checkpoint; commit 95652a5 reads it"
        )
    if set(ckpt["args"]) != set(ASTRAL_ARGS):
        raise ValueError(
            f"checkpoint {path!r} holds another format of {ASTRAL_SCRIPT}.py's checkpoint; commit 31fadaa reads it"
        )
    if ckpt["args"]["env_id"] != "NonStationaryCartPole":
        raise ValueError(
            f"checkpoint {path!r} was trained on --env-id {ckpt['args']['env_id']}; {SCRIPT}.py gates NonStationaryCartPole's "
            "modes"
        )
    agent = agent_from_checkpoint(ckpt).eval()
    return ckpt, agent


def parse_mode(item):
    """One --modes item, g,l[,sign], as (gravity, half_length, force_sign); the force sign is 1 unless given."""
    message = (
        f"malformed mode {item!r} in --modes; write gravity,half_length[,force_sign] with a positive gravity "
        "and half-length and a force sign of 1 or -1, e.g. '9.8,0.5 7.5,0.7,-1'"
    )
    parts = item.split(",")
    if len(parts) not in (2, 3):
        raise ValueError(message)
    try:
        values = [float(v) for v in parts] + [1.0]
    except ValueError:
        raise ValueError(message) from None
    g = values[0]
    length = values[1]
    sign = values[2]
    if not (0 < g < math.inf and 0 < length < math.inf and sign in (1.0, -1.0)):
        raise ValueError(message)
    return (g, length, sign)


def parse_modes(spec):
    """Parse "g,l[,sign] g,l[,sign] ..." into a list of (gravity, half_length, force_sign)."""
    modes = [parse_mode(item) for item in spec.split()]
    if not modes:
        raise ValueError("--modes is empty; give at least one mode such as '9.8,0.5'")
    return modes


def resolve_targets(mode_indices, modes, ckpt):
    """The target modes: [{"name", "index" (the mode index an --oracle agent reads), "physics", "held_out", "label"}]."""
    if modes is not None and ckpt["args"]["oracle"]:
        raise ValueError(
            "an --oracle agent reads the true mode index, so it cannot be run on custom --modes; use --mode-indices"
        )
    train_modes = [tuple(float(v) for v in m) for m in ckpt["modes"]]
    indices = mode_indices
    if mode_indices is None:
        indices = list(range(len(train_modes)))
    if not indices or len(set(indices)) != len(indices):
        raise ValueError("--mode-indices needs distinct mode indices (a repeated one would be counted twice)")
    for k in indices:
        if not 0 <= k < len(train_modes):
            raise ValueError(
                f"--mode-indices {k} is out of range; the checkpoint has {len(train_modes)} modes (0..{len(train_modes) - 1})"
            )
    held_out = HELD_OUT_MODES[ckpt["args"]["modes_preset"]]
    if modes is None:
        found = [(f"mode{k}", k, train_modes[k], k in held_out) for k in indices]
    else:
        found = [(f"custom{j}", j, m, False) for j, m in enumerate(parse_modes(modes))]
    targets = []
    for name, k, (g, length, sign), out in found:
        label = f"{name} (g {g:g}, l {length:g}"
        if sign < 0:
            label += ", inverted"
        if out:
            label += ", held out"
        targets.append({"name": name, "index": k, "physics": (g, length, sign), "held_out": out, "label": label + ")"})
    return targets


# RUN BOOKKEEPING
def validate(args):
    """Every check of the flags alone, before the checkpoint is read."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes any <, >
            raise ValueError(f"--{field.name.replace('_', '-')} {value} must be a finite number")
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed} must be at least 0")
    if args.eval_episodes < 1:
        raise ValueError(f"--eval-episodes {args.eval_episodes} must be at least 1")
    if not args.exp_name.strip() or "/" in args.exp_name:  # a '/' fails the save at the end
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    if args.modes is not None and args.mode_indices is not None:
        raise ValueError("give either --mode-indices (the checkpoint's modes) or --modes (custom physics), not both")
    if args.subcommand == "swap" and args.modes is not None:
        raise ValueError("swap fixes the gate to the mean gates of the checkpoint's training modes; use --mode-indices")
    if args.subcommand != "adapt":
        return
    if args.episodes < 1:
        raise ValueError(f"--episodes {args.episodes} must be at least 1")
    if args.num_seeds < 1:
        raise ValueError(f"--num-seeds {args.num_seeds} must be at least 1")
    if args.online_every < 1:
        raise ValueError(f"--online-every {args.online_every} must be at least 1")
    if args.ceiling_resolution < 0:
        raise ValueError(f"--ceiling-resolution {args.ceiling_resolution} must be at least 0")
    if not args.controls or len(set(args.controls)) != len(args.controls):
        raise ValueError(f"--controls {' '.join(args.controls)} is invalid; choose distinct names among {', '.join(CONTROLS)}")
    if not args.adapt_lr > 0 or not args.max_grad_norm > 0 or not 0 <= args.gamma <= 1 or args.tent_kl_coef < 0:
        raise ValueError("--adapt-lr and --max-grad-norm must be positive, --gamma in [0, 1], --tent-kl-coef non-negative")
    if args.reward_scale is not None and not args.reward_scale > 0:
        raise ValueError(f"--reward-scale {args.reward_scale} must be positive")
    if args.resume is not None and not have_helper_package():
        raise ValueError("--resume needs the cleanrl_astral_utils package: pip install -e . in the repository")
    if args.resume is not None and not os.path.isfile(os.path.join(args.resume, "tta.json")):
        raise ValueError(f"--resume {args.resume!r} holds no tta.json; pass the run directory of a stopped adapt run")


def validate_against_checkpoint(args, ckpt, targets):
    """The checks that need the checkpoint: --online's critic (discount and reward scale), swap's training modes."""
    if args.subcommand == "swap" and all(t["held_out"] for t in targets):
        raise ValueError("swap needs at least one training mode among --mode-indices (its mean gate is what is swapped)")
    if args.subcommand != "adapt" or not args.online or not {"gate", "context", "all"} & set(args.controls):
        return  # only these controls bootstrap with the critic
    trained = ckpt["args"]
    if args.gamma != trained["gamma"]:  # the critic estimates returns at its training discount
        raise ValueError(
            f"--gamma {args.gamma} differs from the {trained['gamma']} the critic was trained with, and --online "
            f"bootstraps its returns with that critic; pass --gamma {trained['gamma']}"
        )


def critic_reward_scale(args, ckpt):
    """σ the critic's rewards were divided by in training, for --online's bootstrap (None where no control bootstraps)."""
    if args.subcommand != "adapt" or not args.online or not {"gate", "context", "all"} & set(args.controls):
        return None
    if args.reward_scale is not None:
        return args.reward_scale
    # the critic learnt rewards / σ, σ the final std of the reward normaliser (1 without --norm-reward), which the model holds
    if not ckpt["args"]["norm_reward"]:
        return 1.0
    return float(np.sqrt(ckpt["reward_scaler"]["var"] + 1e-8))


def claim_run_dir(runs_dir, run_name):
    """Creates runs_dir/run_name, or run_name__2, __3, ... when another run holds the name (mkdir is atomic): (name, dir)."""
    name = run_name
    for n in itertools.count(2):
        try:
            os.makedirs(os.path.join(runs_dir, name))
            return name, os.path.join(runs_dir, name)
        except FileExistsError:
            name = f"{run_name}__{n}"
        except OSError as e:
            reason = e.strerror.lower()
            message = f"cannot create a run directory in --runs-dir {runs_dir!r} ({reason}); pass a writable directory"
            raise ValueError(message) from e


class Run(NamedTuple):
    """What every subcommand starts from."""

    ckpt: dict
    agent: Agent
    """the checkpoint's agent (never updated)"""
    targets: list
    reward_scale: float | None
    """--online's critic reward scale (critic_reward_scale)"""
    report: dict
    """the results file's fields so far (new_report, or the stopped run's with --resume)"""
    run_name: str
    run_dir: str


def prepare(args):
    """Checks the flags and the checkpoint, and claims the run directory (or takes the stopped run's): a Run."""
    validate(args)
    model_path = find_checkpoint(args)
    ckpt, agent = load_astral_checkpoint(model_path)
    targets = resolve_targets(args.mode_indices, args.modes, ckpt)
    validate_against_checkpoint(args, ckpt, targets)
    reward_scale = critic_reward_scale(args, ckpt)
    report = new_report(args, model_path, ckpt, targets)
    if args.subcommand == "adapt" and args.resume is not None:
        from cleanrl_astral_utils import tta  # resuming

        report = tta.resumed_report(args.resume, report)
        run_dir = args.resume
        run_name = os.path.basename(os.path.normpath(run_dir))
    else:
        run_name, run_dir = claim_run_dir(
            args.runs_dir, f"NonStationaryCartPole__{args.exp_name}__{args.seed}__{int(time.time())}"
        )
    return Run(ckpt, agent, targets, reward_scale, report, run_name, run_dir)


if __name__ == "__main__":
    args = tyro.extras.subcommand_cli_from_dict(SUBCOMMANDS)
    try:
        run = prepare(args)
    except ValueError as e:
        print(f"{SCRIPT}.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run.run_name,
            dir=run.run_dir,
            save_code=True,
        )
    writer = SummaryWriter(run.run_dir)
    writer.add_text(
        "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    )
    torch.set_num_threads(1)  # fastest for this small network; every evaluation and adaptation seeds torch and its envs
    if args.subcommand == "adapt":  # adapt-plan too: its Args are AdaptArgs with other defaults
        outcome = adapt(args, run, writer)
    elif args.subcommand == "clamp":
        outcome = clamp(args, run, writer)
    else:
        outcome = swap(args, run, writer)
    if outcome.headline is None:
        print(
            f"results in {outcome.results_path}; statistics, eval.json and figures skipped: they need the "
            "cleanrl_astral_utils package (pip install -e . in the repository)"
        )
    else:
        # eval.json: headline numbers averaged over the targets, for benchmark/report.py's tables (per target: results_path)
        headline = {"script": SCRIPT, "subcommand": args.subcommand, "targets": [t["name"] for t in run.targets]}
        write_json({**headline, **outcome.headline}, os.path.join(run.run_dir, "eval.json"))
        print(f"results in {outcome.results_path} and {outcome.figure}")
    writer.close()
