"""Test-time adaptation of the ASTRAL gate, and slot interventions, with controls (the ASTRAL plan's phases 5 and 6).

Reads an agent trained by ppo_gru_astral.py (its `.cleanrl_model`, never modified) and asks of its AbstractionBank:
- `adapt`: on a fixed target mode, does updating only the gate with REINFORCE raise the return? Controls on the same
  episodes: `none`, `gate` (the method), `context` (a gate-logit bias), `all` (every parameter), `tent` (reward-free);
  a gain also reads as a fraction of the headroom up to the ceiling, the best fixed gate.
- `clamp`: the gate forced to each one-hot (z = A_k) in every mode; slots matched to modes give the clamp specificity.

Usage: python cleanrl_astral/tta_gating.py adapt --checkpoint runs/<run_name>/ppo_gru_astral.cleanrl_model
"""

import copy
import glob
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

SCRIPT = os.path.basename(__file__)[: -len(".py")]
ASTRAL_SCRIPT, ASTRAL_FORMAT = "ppo_gru_astral", 1
CONTROLS = ("none", "gate", "context", "all", "tent")
KINDS = (("deterministic", True), ("sampled", False))


@dataclass(kw_only=True)
class Args:
    exp_name: str | None = None
    """the name of this experiment (default: tta_gating_adapt or tta_gating_clamp)"""
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
    save_model: bool = False
    """save every adapted agent (target × seed × control) to `runs/{run_name}/{exp_name}.cleanrl_model`"""
    controls: list[str] = field(default_factory=lambda: list(CONTROLS))
    """which of none, gate, context, all, tent to run (all with the same episodes and seeds)"""
    episodes: int = 30
    """adaptation episodes per target mode, seed and control"""
    num_seeds: int = 3
    """adaptation seeds per target mode (the 95% CI is over these)"""
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
    ceiling_resolution: int = 2
    """the ceiling's fixed gates: every mixture in multiples of 1/N, plus uniform (1: the K one-hot clamps; 0: no ceiling)"""


# ENVIRONMENT: ppo_gru_astral.py's CartPole, all envs in one physics mode; the presets' modes that training never draws
HELD_OUT_MODES = {"seed3": [], "inverted4": [], "mirror4": [4]}


def parse_modes(spec: str) -> list:
    """Parse "g,l[,sign] g,l[,sign] ..." into a list of (gravity, half_length, force_sign)."""
    modes = []
    for item in spec.split():
        try:
            g, length, sign = (*map(float, item.split(",")), 1.0)[:3] if item.count(",") in (1, 2) else (0.0, 0.0, 0.0)
        except ValueError:
            g = length = sign = 0.0
        if not (0 < g < math.inf and 0 < length < math.inf and sign in (1.0, -1.0)):
            raise ValueError(
                f"malformed mode {item!r} in --modes; write gravity,half_length[,force_sign] with a positive gravity "
                "and half-length and a force sign of 1 or -1, e.g. '9.8,0.5 7.5,0.7,-1'"
            )
        modes.append((g, length, sign))
    if not modes:
        raise ValueError("--modes is empty; give at least one mode such as '9.8,0.5'")
    return modes


class NonStationaryCartPole:
    """`num_envs` CartPole-v1s (gymnasium's equations and 500-step limit, in numpy) under one physics: ppo_gru_astral.py's
    env as its `evaluate` builds it for one mode. Same-step autoreset; an ended episode's last observation is in info."""

    def __init__(self, num_envs, physics, hide_velocity=False):
        self.num_envs, self.max_episode_steps, (self.gravity, self.half_length, self.force_sign) = num_envs, 500, physics
        self.observed = [0, 2] if hide_velocity else [0, 1, 2, 3]  # hidden velocity: cart position and pole angle only

    def restart(self, envs):
        self.state[envs], self.elapsed[envs] = self.rng.uniform(-0.05, 0.05, (int(envs.sum()), 4)), 0

    def reset(self, seed=None):
        self.rng, self.state, self.elapsed = (
            np.random.default_rng(seed),
            np.zeros((self.num_envs, 4)),
            np.zeros(self.num_envs, dtype=int),
        )
        self.restart(np.ones(self.num_envs, dtype=bool))
        return self.state[:, self.observed].astype(np.float32), {}

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state.T
        gravity, length, masspole, total_mass = self.gravity, self.half_length, 0.1, 0.1 + 1.0
        force = self.force_sign * 10.0 * np.where(action == 1, 1.0, -1.0)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + masspole * length * np.square(theta_dot) * sintheta) / total_mass
        thetaacc = (gravity * sintheta - costheta * temp) / (
            length * (4.0 / 3.0 - masspole * np.square(costheta) / total_mass)
        )
        xacc = temp - masspole * length * thetaacc * costheta / total_mass
        self.state = np.stack(
            [x + 0.02 * x_dot, x_dot + 0.02 * xacc, theta + 0.02 * theta_dot, theta_dot + 0.02 * thetaacc], 1
        )
        self.elapsed += 1
        terminated = (np.abs(self.state[:, 0]) > 2.4) | (np.abs(self.state[:, 2]) > 12 * 2 * math.pi / 360)
        truncated = self.elapsed >= self.max_episode_steps
        info = {"final_obs": self.state[:, self.observed].astype(np.float32)}
        self.restart(terminated | truncated)
        return self.state[:, self.observed].astype(np.float32), np.ones(self.num_envs), terminated, truncated, info


# MODEL: ppo_gru_astral.py's agent (weights from the checkpoint), plus the context: a zero gate-logit bias for `context`
class AbstractionBank(nn.Module):
    """K slots A and a gate: p = softmax((g(h) + c) / τ), the context c zero as loaded; z = wᵀA with w = p (soft gate) or,
    with `gumbel_tau`, the straight-through Gumbel-softmax one-hot of slot k ~ p (hard gate; with zero noise, argmax p)."""

    def __init__(self, hidden_size, num_abstractions, slot_dim, tau, gumbel_tau=None):
        super().__init__()
        self.slots, self.tau, self.gumbel_tau = nn.Parameter(torch.zeros(num_abstractions, slot_dim)), tau, gumbel_tau
        self.gate = nn.Sequential(nn.Linear(hidden_size, 64), nn.Tanh(), nn.Linear(64, num_abstractions))
        self.context = nn.Parameter(torch.zeros(num_abstractions))

    def forward(self, h, weights=None, noise=None):
        """(z, w, p, noise); `weights` overrides w (a one-hot clamps one slot); the hard gate draws its noise unless given."""
        logits = (self.gate(h) + self.context) / self.tau
        probs = torch.softmax(logits, dim=-1)
        if weights is None and self.gumbel_tau is not None:
            noise = -torch.empty_like(logits).exponential_().log() if noise is None else noise  # as F.gumbel_softmax
            soft = torch.softmax((logits + noise) / self.gumbel_tau, dim=-1)
            weights = torch.zeros_like(soft).scatter_(-1, soft.argmax(-1, keepdim=True), 1.0) - soft.detach() + soft
        weights = probs if weights is None else weights
        return weights @ self.slots, weights, probs, noise


class FiLM(nn.Module):
    """h' = γ ⊙ h + β with (γ, β) = f(z); γ = 1 + f_γ(z), so a zero z leaves h unchanged."""

    def __init__(self, slot_dim, hidden_size):
        super().__init__()
        self.net = nn.Linear(slot_dim, 2 * hidden_size)

    def forward(self, h, z):
        gamma_delta, beta = self.net(z).chunk(2, dim=-1)
        return (1.0 + gamma_delta) * h + beta


class Agent(nn.Module):
    def __init__(
        self,
        obs_dim,
        num_actions,
        num_modes,
        hidden_size=128,
        memory="gru",
        oracle=False,
        num_abstractions=3,
        slot_dim=32,
        tau=1.0,
        bottleneck=False,
        gumbel_tau=None,
    ):
        super().__init__()
        self.num_actions, self.num_modes, self.memory, self.oracle, self.hidden_size = (
            num_actions,
            num_modes,
            memory,
            oracle,
            hidden_size,
        )
        self.input_dim, self.bottleneck = obs_dim + num_actions + 1 + (num_modes if oracle else 0), bottleneck
        self.encoder = nn.Sequential(nn.Linear(self.input_dim, hidden_size), nn.Tanh())
        self.gru = nn.GRUCell(hidden_size, hidden_size)
        self.bank = AbstractionBank(hidden_size, num_abstractions, slot_dim, tau, gumbel_tau)
        self.film = FiLM(slot_dim, hidden_size)
        self.actor = nn.Sequential(nn.Linear(hidden_size, 64), nn.Tanh(), nn.Linear(64, num_actions))
        self.critic = nn.Sequential(nn.Linear(hidden_size, 64), nn.Tanh(), nn.Linear(64, 1))

    def build_input(self, obs, prev_action, prev_reward, mode):
        """obs (..., obs_dim), prev_action (...) with -1 for "none", prev_reward (...), mode (...) -> input."""
        prev_onehot = torch.nn.functional.one_hot((prev_action + 1).long(), self.num_actions + 1)[..., 1:].float()
        oracle = [torch.nn.functional.one_hot(mode.long(), self.num_modes).float()] if self.oracle else []
        return torch.cat([obs.float(), prev_onehot, prev_reward.float().unsqueeze(-1), *oracle], dim=-1)

    def forward(self, x, state, starts, weights=None, noise=None):
        """x (T, B, input_dim), state (B, H) before x[0], starts (T, B) = 1 where x[t] opens an episode.
        Returns h' = FiLM(h; z) (with the bottleneck FiLM(features of x_t; z): memory reaches the heads only through z),
        last state, w, p, noise."""
        features = self.encoder(x)
        keep, states = torch.zeros_like(starts) if self.memory == "none" else 1.0 - starts, []
        for feature_t, keep_t in zip(features.unbind(0), keep.unbind(0)):
            # zero the state where the episode restarted: x[t] is a first step
            state = torch.gru_cell(
                feature_t,
                state * keep_t.unsqueeze(-1),
                self.gru.weight_ih,
                self.gru.weight_hh,
                self.gru.bias_ih,
                self.gru.bias_hh,
            )
            states.append(state)
        hidden = torch.stack(states)
        z, weights, probs, noise = self.bank(hidden, weights, noise)
        return self.film(features if self.bottleneck else hidden, z), state, weights, probs, noise


# ACTING
def policy_step(agent, obs, prev_action, prev_reward, mode, state, start, weights=None, deterministic=False, noise=None):
    """One step of B envs, the input built as in ppo_gru_astral.py's rollout (start = 1 zeroes the state); `weights` (K,)
    clamps the gate; `deterministic`: the hard gate's argmax slot. Returns (dist, value, state, w, p, noise), with graph."""
    x = agent.build_input(*(torch.as_tensor(np.asarray(v)) for v in (obs, prev_action, prev_reward, mode)))[None]
    if deterministic and agent.bank.gumbel_tau is not None:
        noise = torch.zeros(*x.shape[:-1], len(agent.bank.slots))
    modulated, state, weights, probs, noise = agent(
        x,
        state,
        torch.as_tensor(np.asarray(start), dtype=torch.float32)[None],
        None if weights is None else weights.expand(*x.shape[:-1], -1),
        noise,
    )
    return (
        Categorical(logits=agent.actor(modulated[0])),
        agent.critic(modulated[0]).squeeze(-1),
        state,
        weights[0],
        probs[0],
        noise,
    )


def evaluate_target(agent, target, hide_velocity, episodes, deterministic, seed, weights=None):
    """Returns and mean gate weights of the first episode of `episodes` envs of the target (env and torch seed `seed`, as
    ppo_gru_astral.evaluate's mode k for seed - 1000 k), the gate optionally clamped to `weights` (K,)."""
    torch.manual_seed(seed)
    envs = NonStationaryCartPole(episodes, target["physics"], hide_velocity)
    obs, _ = envs.reset(seed=seed)
    mode, state = np.full(episodes, target["index"]), torch.zeros(episodes, agent.hidden_size)
    prev_action, prev_reward, start = np.full(episodes, -1), np.zeros(episodes), np.ones(episodes)
    returns, finished, weight_sum, steps = np.zeros(episodes), np.zeros(episodes, dtype=bool), 0.0, 0
    while not finished.all():
        with torch.no_grad():
            dist, _, state, w, *_ = policy_step(
                agent, obs, prev_action, prev_reward, mode, state, start, weights, deterministic
            )
        action = (dist.logits.argmax(-1) if deterministic else dist.sample()).numpy()
        weight_sum, steps = weight_sum + w[torch.as_tensor(~finished)].sum(0).numpy(), steps + int((~finished).sum())
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns, done = returns + reward * ~finished, terminated | truncated
        finished |= done
        prev_action, prev_reward, start = np.where(done, -1, action), np.where(done, 0.0, reward), done
    return returns, weight_sum / steps


# ADAPTATION LOSSES
def discounted_returns(rewards, gamma, bootstrap=0.0):
    out, running = np.zeros(len(rewards)), bootstrap
    for t in reversed(range(len(rewards))):
        running = out[t] = rewards[t] + gamma * running
    return out


def reinforce_loss(logprobs, rewards, gamma):
    """-mean_t log π(a_t) Ĝ_t on one episode, Ĝ the discounted returns normalised over it; `logprobs` carry the graph."""
    returns = torch.as_tensor(discounted_returns(rewards, gamma), dtype=torch.float32)
    returns = (returns - returns.mean()) / (returns.std() + 1e-8) if len(returns) > 1 else torch.zeros_like(returns)
    return -(logprobs * returns).mean()


def actor_critic_loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale):
    """n-step actor-critic on one segment; the value head (trained on rewards / reward_scale) is baseline and bootstrap."""
    targets = discounted_returns(np.asarray(rewards) / reward_scale, gamma, bootstrap_value)
    return -(logprobs * (torch.as_tensor(targets, dtype=torch.float32) - values.detach())).mean()


def tent_loss(logits, anchor_logits, gate_probs, kl_coef):
    """Reward-free: H(p) + H(π) + kl_coef · KL(π || π_unadapted), averaged over steps (p the gate's probabilities: under the
    hard gate w is one-hot). Without the anchor, entropy minimisation collapses the policy onto its preferred action."""
    gate_entropy = -(gate_probs * torch.log(gate_probs + 1e-8)).sum(-1).mean()
    log_p, log_q = torch.log_softmax(logits, -1), torch.log_softmax(anchor_logits, -1)
    policy_entropy = -(log_p.exp() * log_p).sum(-1).mean()
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return gate_entropy + policy_entropy + kl_coef * kl


def adapted_parameters(agent, control):
    """The parameters a control updates, the others frozen; `all` means the checkpoint's (its clipped norm without c)."""
    for name, param in agent.named_parameters():
        gate, context = name.startswith("bank.gate."), name == "bank.context"
        param.requires_grad_({"gate": gate, "tent": gate, "context": context, "all": not context}.get(control, False))
    return [p for p in agent.parameters() if p.requires_grad]


# ADAPTATION
def adaptation_episode(agent, anchor, env, mode, env_seed, control, optimizer, args, reward_scale):
    """One sampled episode of the single env `env`, updating at its end (or every --online-every steps with --online).
    `none` (optimizer None) acts identically but never updates. Returns the episode's return and update count."""
    obs, _ = env.reset(seed=env_seed)
    state, anchor_state = torch.zeros(1, agent.hidden_size), torch.zeros(1, agent.hidden_size)
    prev_action, prev_reward, start, mode = np.full(1, -1), np.zeros(1), np.ones(1), np.full(1, mode)
    segment, episode_return, done, updates = [], 0.0, False, 0
    while not done:
        with torch.set_grad_enabled(optimizer is not None):
            dist, value, state, _, probs, noise = policy_step(agent, obs, prev_action, prev_reward, mode, state, start)
        anchor_logits = None
        if control == "tent":  # the anchor on the same inputs, its hard gate (if any) with the same draw
            with torch.no_grad():
                anchor_dist, _, anchor_state, *_ = policy_step(
                    anchor, obs, prev_action, prev_reward, mode, anchor_state, start, noise=noise
                )
            anchor_logits = anchor_dist.logits
        action = dist.sample()
        obs, prev_reward, terminated, truncated, info = env.step(action.numpy())
        prev_action, start, done = action.numpy(), np.zeros(1), bool(terminated[0] or truncated[0])
        segment.append((dist.log_prob(action), value, dist.logits, probs, anchor_logits, float(prev_reward[0])))
        episode_return += float(prev_reward[0])
        if optimizer is None or not (done or (args.online and len(segment) == args.online_every)):
            continue

        # UPDATE
        logprobs, values, logits, gate_probs, anchor_logits, rewards = zip(*segment)
        if control == "tent":
            loss = tent_loss(torch.cat(logits), torch.cat(anchor_logits), torch.cat(gate_probs), args.tent_kl_coef)
        elif args.online:
            # a fallen pole has no future; a cut segment or a time-limit truncation continues: bootstrap from the value of
            # the next observation (the ended episode's last one where the env already restarted)
            with torch.no_grad():
                bootstrap = (
                    0.0
                    if terminated[0]
                    else float(policy_step(agent, info["final_obs"], prev_action, prev_reward, mode, state, start)[1])
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
        state, anchor_state, segment = state.detach(), anchor_state.detach(), []
    return episode_return, updates


def adapted_copy(ckpt, target, control, seed, args, reward_scale):
    """(agent, return per episode, updates) of a fresh copy of the checkpoint's agent adapted on `target`. The env and torch
    seeds depend only on (target, seed): every control plays the same episodes until its parameters differ."""
    agent = agent_from_checkpoint(ckpt)
    anchor = copy.deepcopy(agent).requires_grad_(False)
    params = adapted_parameters(agent, control)
    optimizer = torch.optim.Adam(params, lr=args.adapt_lr) if params else None
    env = NonStationaryCartPole(1, target["physics"], ckpt["args"]["hide_velocity"])
    torch.manual_seed(seed)
    episodes = [
        adaptation_episode(
            agent, anchor, env, target["index"], 10_000 * seed + episode, control, optimizer, args, reward_scale
        )
        for episode in range(args.episodes)
    ]
    return agent, [episode_return for episode_return, _ in episodes], sum(updates for _, updates in episodes)


# INTERVENTIONS: fixed gates
def gate_settings(num_slots, resolution):
    """Named fixed gates: the one-hots `slot{k}`, mixtures with weights in multiples of 1/resolution, `uniform` (1/K)."""
    settings = {f"slot{k}": torch.eye(num_slots)[k] for k in range(num_slots)}
    for parts in itertools.product(range(resolution), repeat=num_slots):
        if sum(parts) == resolution and len(set(parts)) > 1:
            weights = torch.tensor(parts, dtype=torch.float32) / resolution
            settings["mix[" + " ".join(f"{w:.2g}" for w in weights.tolist()) + "]"] = weights
    return {**settings, "uniform": torch.full((num_slots,), 1.0 / num_slots)}


def clamp_specificity(returns):
    """Mode × slot return matrix -> (mean matched cell − mean other cell of the matched rows and columns, [(row, column)]).
    Slots are unlabelled: each mode is matched to a slot of its own (Hungarian, maximising the matched returns). A mode or
    slot better everywhere cancels out; the maximising match makes the score ≥ 0 even for noise. None below two pairs."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(returns, maximize=True)
    matched = np.asarray(returns)[np.ix_(rows, cols)]
    score = float(np.diag(matched).mean() - matched[~np.eye(len(rows), dtype=bool)].mean()) if len(rows) > 1 else None
    return score, [(int(r), int(c)) for r, c in zip(rows, cols)]


def gate_returns(agent, target, hide_velocity, settings, seeds, episodes, kinds=KINDS):
    """({setting: {kind: [mean return per seed]}}, the evaluations) for named gate settings (None: the learned gate)."""
    runs = {
        name: {
            kind: [evaluate_target(agent, target, hide_velocity, episodes, det, s, w) for s in seeds] for kind, det in kinds
        }
        for name, w in settings.items()
    }
    return {
        name: {kind: [float(r.mean()) for r, _ in v] for kind, v in by_kind.items()} for name, by_kind in runs.items()
    }, runs


def ceiling(agent, target, hide_velocity, settings, seeds, episodes):
    """The best of the fixed gates `settings` by mean sampled return on the evaluation episodes, and every gate's returns."""
    returns = gate_returns(agent, target, hide_velocity, settings, seeds, episodes, KINDS[1:])[0]
    per_setting = {name: v["sampled"] for name, v in returns.items()}
    best = max(per_setting, key=lambda name: np.mean(per_setting[name]))
    return {"best": best, "sampled": {**mean_ci(per_setting[best]), "per_seed": per_setting[best]}, "per_setting": per_setting}


# CHECKPOINT AND TARGETS
# the args Agent honours, then the training-only ones (the last four: older runs'); a checkpoint with any other is refused
KNOWN_ARGS = set(
    """hide_velocity memory oracle hidden_size num_abstractions slot_dim tau bottleneck hard_gate gumbel_tau modes_preset
    exp_name seed torch_deterministic cuda track wandb_project_name wandb_entity capture_video save_model runs_dir
    eval_episodes env_id mode_share fixed_mode switch_prob total_timesteps learning_rate num_envs num_steps anneal_lr gamma
    gae_lambda num_minibatches update_epochs norm_adv clip_coef clip_vloss ent_coef vf_coef max_grad_norm target_kl
    norm_reward lambda_w_ent lambda_lb lambda_orth slot_init lambda_consistency lambda_supervised batch_size minibatch_size
    num_iterations resume checkpoint_every torch_threads modes""".split()
)


def agent_from_checkpoint(ckpt):
    """A fresh agent holding the checkpoint's weights (and a zero context, which the checkpoint does not have)."""
    a = {"bottleneck": False, "hard_gate": False, **ckpt["args"]}
    agent = Agent(
        2 if a["hide_velocity"] else 4,
        2,
        len(ckpt["modes"]),
        a["hidden_size"],
        a["memory"],
        a["oracle"],
        a["num_abstractions"],
        a["slot_dim"],
        a["tau"],
        a["bottleneck"],
        a["gumbel_tau"] if a["hard_gate"] else None,
    )
    agent.load_state_dict({"bank.context": torch.zeros(a["num_abstractions"]), **ckpt["state_dict"]})
    return agent


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
    found = ckpt.get("script") if isinstance(ckpt, dict) else None
    if found != ASTRAL_SCRIPT or ckpt.get("format") != ASTRAL_FORMAT:
        raise ValueError(
            f"checkpoint {path!r} was written by {found or 'another program'} "
            f"(format {ckpt.get('format') if found else '?'}), "
            f"not {ASTRAL_SCRIPT}.py format {ASTRAL_FORMAT}; test-time gating needs an ASTRAL agent (it has the gate)"
        )
    a, allowed = ckpt["args"], {"memory": ("gru", "none"), "modes_preset": tuple(HELD_OUT_MODES)}
    unknown = ", ".join(
        f"--{k.replace('_', '-')} {a.get(k)}"
        for k in sorted(set(a) - KNOWN_ARGS) + [k for k, values in allowed.items() if a.get(k) not in values]
    )
    if unknown:
        raise ValueError(
            f"checkpoint {path!r} was trained with {unknown}, which {SCRIPT}.py's copy of the agent does not implement; "
            "it would act as another agent"
        )
    try:
        return ckpt, agent_from_checkpoint(ckpt).eval()
    except (KeyError, TypeError, RuntimeError) as e:
        raise ValueError(
            f"checkpoint {path!r}: its state dict does not fit the agent its args describe ({str(e).splitlines()[0]})"
        ) from e


def resolve_targets(mode_indices, modes, ckpt):
    """The target modes: [{"name", "index" (the mode index an --oracle agent reads), "physics", "held_out", "label"}]."""
    if modes is not None and mode_indices is not None:
        raise ValueError("give either --mode-indices (the checkpoint's modes) or --modes (custom physics), not both")
    if modes is not None and ckpt["args"]["oracle"]:
        raise ValueError(
            "an --oracle agent reads the true mode index, so it cannot be run on custom --modes; use --mode-indices"
        )
    train_modes = [tuple(float(v) for v in m) for m in ckpt["modes"]]
    indices = range(len(train_modes)) if mode_indices is None else mode_indices
    if not indices or len(set(indices)) != len(indices):
        raise ValueError("--mode-indices needs distinct mode indices (a repeated one would be counted twice)")
    for k in (k for k in indices if not 0 <= k < len(train_modes)):
        raise ValueError(
            f"--mode-indices {k} is out of range; the checkpoint has {len(train_modes)} modes (0..{len(train_modes) - 1})"
        )
    held_out = HELD_OUT_MODES[ckpt["args"]["modes_preset"]]
    found = (
        [(f"mode{k}", k, train_modes[k], k in held_out) for k in indices]
        if modes is None
        else [(f"custom{j}", j, m, False) for j, m in enumerate(parse_modes(modes))]
    )
    return [
        {
            "name": name,
            "index": k,
            "physics": (g, length, sign),
            "held_out": out,
            "label": f"{name} (g {g:g}, l {length:g}{', inverted' if sign < 0 else ''}{', held out' if out else ''})",
        }
        for name, k, (g, length, sign), out in found
    ]


# STATISTICS AND PLOTS
def mean_ci(values):
    """Mean and half-width of the 95% Student-t confidence interval of the mean (None with one value)."""
    from scipy import stats  # a second to import; only the summaries need it

    v = np.asarray(values, dtype=np.float64)
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None
    return {"mean": float(v.mean()), "ci95": half, "n": int(len(v))}


def plot_adaptation_curves(results, targets, controls, path, title):
    """One panel per target: each control's mean return per adaptation episode, its 95% CI; before dotted, ceiling dashed."""
    ncols, nrows = min(3, len(targets)), (len(targets) + 2) // 3
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(6.0, 4.2 * ncols), 3.2 * nrows + 0.6), squeeze=False, layout="constrained"
    )
    colors = {"none": "tab:gray", "gate": "tab:blue", "context": "tab:purple", "all": "tab:orange", "tent": "tab:green"}
    for ax, target in zip(axes.flat, targets):
        res = results[target["name"]]
        for control in controls:
            during = res["controls"][control]["during"]
            x, mean = np.arange(1, len(during["mean"]) + 1), np.asarray(during["mean"])
            ax.plot(x, mean, label=control, color=colors[control])
            if during["ci95"][0] is not None:
                ax.fill_between(x, mean - during["ci95"], mean + during["ci95"], alpha=0.15, color=colors[control])
        ax.axhline(res["before"]["sampled"]["mean"], color="black", linestyle=":", linewidth=1, label="before (eval)")
        if res["ceiling"]:
            ax.axhline(res["ceiling"]["sampled"]["mean"], color="black", linestyle="--", linewidth=1, label="ceiling (eval)")
        ax.set(xlabel="adaptation episode", ylabel="return", ylim=(0, None))
        ax.set_title(target["label"], fontsize=9)
    for ax in list(axes.flat)[len(targets) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_clamp_heatmap(matrix, row_labels, col_labels, path, title):
    """Annotated target × gate-setting heatmaps of mean return, one panel per action kind."""
    fig, axes = plt.subplots(
        1,
        len(matrix),
        figsize=(3.0 + 0.9 * len(col_labels) * len(matrix), 1.6 + 0.5 * len(row_labels)),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax, (kind, values) in zip(axes[0], matrix.items()):
        im = ax.imshow(np.asarray(values), cmap="viridis", vmin=0.0, vmax=500.0, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", color="white" if v < 300 else "black", fontsize=8)
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=30, fontsize=8)
        ax.set_title(f"{kind} actions", fontsize=9)
    axes[0][0].set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03, pad=0.02, label="return")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# RUN BOOKKEEPING
def validate(args):
    """Every check that can fail before any work starts.
    Returns (checkpoint path, checkpoint, agent, targets, reward scale)."""
    for name, value in vars(args).items():  # NaN and inf pass every `x > 0` style check and reach the optimizer
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{name.replace('_', '-')} {value} must be a finite number")
    for name, low in (
        ("seed", 0),
        ("eval_episodes", 1),
        ("episodes", 1),
        ("num_seeds", 1),
        ("online_every", 1),
        ("ceiling_resolution", 0),
    ):
        if getattr(args, name, low) < low:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least {low}")
    if args.exp_name is not None and (not args.exp_name.strip() or "/" in args.exp_name):  # a '/' fails the save at the end
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    path = args.checkpoint.replace("{seed}", str(args.seed))  # `{seed}` and a glob: one sweep command, each seed's checkpoint
    matches = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    if len(matches) != 1:
        raise ValueError(f"--checkpoint {path!r} matches {len(matches)} files; it must match exactly one")
    ckpt, agent = load_astral_checkpoint(matches[0])
    targets, reward_scale = resolve_targets(args.mode_indices, args.modes, ckpt), None
    if isinstance(args, AdaptArgs):
        if not args.controls or len(set(args.controls)) != len(args.controls) or set(args.controls) - set(CONTROLS):
            raise ValueError(
                f"--controls {' '.join(args.controls)} is invalid; choose distinct names among {', '.join(CONTROLS)}"
            )
        if not args.adapt_lr > 0 or not args.max_grad_norm > 0 or not 0 <= args.gamma <= 1 or args.tent_kl_coef < 0:
            raise ValueError("--adapt-lr and --max-grad-norm must be positive, --gamma in [0, 1], --tent-kl-coef non-negative")
        if args.reward_scale is not None and not args.reward_scale > 0:
            raise ValueError(f"--reward-scale {args.reward_scale} must be positive")
        if args.online and {"gate", "context", "all"} & set(args.controls):  # these bootstrap with the critic
            trained, scaler = ckpt["args"], ckpt.get("reward_scaler")
            if args.gamma != trained["gamma"]:  # the critic estimates returns at its training discount
                raise ValueError(
                    f"--gamma {args.gamma} differs from the {trained['gamma']} the critic was trained with, and --online "
                    f"bootstraps its returns with that critic; pass --gamma {trained['gamma']}"
                )
            # the critic learnt rewards / σ, σ the final std of the reward normaliser (1 without --norm-reward),
            # which the model holds
            if args.reward_scale is None and trained.get("norm_reward") and not scaler:
                raise ValueError(
                    "--online needs the reward scale the critic was trained with, and this model does not hold its "
                    "reward normaliser; pass --reward-scale S (the final std of the run's reward normaliser)"
                )
            reward_scale = args.reward_scale or (float(np.sqrt(scaler["var"] + 1e-8)) if trained.get("norm_reward") else 1.0)
    return matches[0], ckpt, agent, targets, reward_scale


def claim_run_dir(runs_dir, run_name):
    """(run_name, run_dir) of a new directory: a name taken in the same second gets __2, __3, ... (mkdir is atomic)."""
    for name in itertools.chain([run_name], (f"{run_name}__{i}" for i in itertools.count(2))):
        try:
            os.makedirs(os.path.join(runs_dir, name))
            return name, os.path.join(runs_dir, name)
        except FileExistsError:
            continue
        except OSError as e:
            raise ValueError(
                f"cannot create a run directory in --runs-dir {runs_dir!r} ({e.strerror.lower()}); pass a writable directory"
            ) from e


def write_json(obj, path):
    with open(f"{path}.tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(f"{path}.tmp", path)  # a killed run leaves no half-written file


def record(writer, summary, key, target, value, step=0, column=None):
    """TensorBoard tta/{key}_{target}[_{column}], and the value for eval.json, which averages it over the targets."""
    writer.add_scalar(f"tta/{key}_{target['name']}" + (f"_{column}" if column else ""), value, step)
    (summary.setdefault(key, {}).setdefault(column, []) if column else summary.setdefault(key, [])).append(value)


# MAIN STEPS
def adapt_target(args, ckpt, base_agent, target, position, reward_scale, settings):
    """Before, ceiling, then every control × seed on one target. Returns its tta.json entry and the adapted state dicts."""
    hide_velocity, seeds = ckpt["args"]["hide_velocity"], [args.seed + i for i in range(args.num_seeds)]
    # the same evaluation episodes (env and torch seeds) before, after and for the ceiling: every comparison is paired
    eval_seeds = [100_000 + 10_000 * seed + 1000 * position for seed in seeds]
    before = gate_returns(base_agent, target, hide_velocity, {"learned": None}, eval_seeds, args.eval_episodes)[0]["learned"]
    res = {
        "before": {kind: {**mean_ci(v), "per_seed": v} for kind, v in before.items()},
        "ceiling": ceiling(base_agent, target, hide_velocity, settings, eval_seeds, args.eval_episodes) if settings else None,
        "controls": {},
    }
    saved = []
    for control in args.controls:
        entry = res["controls"][control] = {
            "during_per_seed": [],
            "after_per_seed": {kind: [] for kind, _ in KINDS},
            "slot_weights_after_per_seed": [],
            "updates": 0,
        }
        for i, (seed, eval_seed) in enumerate(zip(seeds, eval_seeds)):
            agent, curve, updates = adapted_copy(ckpt, target, control, seed, args, reward_scale)
            after, runs = gate_returns(agent.eval(), target, hide_velocity, {"learned": None}, [eval_seed], args.eval_episodes)
            for kind, (value,) in after["learned"].items():
                entry["after_per_seed"][kind].append(value)
            entry["slot_weights_after_per_seed"].append(runs["learned"]["deterministic"][0][1].tolist())
            entry["during_per_seed"].append(curve)
            entry["updates"] += updates
            if args.save_model:
                saved.append({"target": target["name"], "seed": seed, "control": control, "state_dict": agent.state_dict()})
            print(
                f"{target['name']} seed {seed} {control:>7}: before {before['sampled'][i]:6.1f} during {np.mean(curve):6.1f} "
                f"after {entry['after_per_seed']['sampled'][-1]:6.1f} (sampled; {updates} updates)",
                flush=True,
            )
        curves = np.asarray(entry["during_per_seed"])
        entry["during"] = {"mean": curves.mean(0).tolist(), "ci95": [mean_ci(c)["ci95"] for c in curves.T]}
        entry["during_mean"] = mean_ci(curves.mean(1))
        entry["after"] = {kind: mean_ci(v) for kind, v in entry["after_per_seed"].items()}
    none, gap = (
        res["controls"].get("none"),
        res["ceiling"]["sampled"]["mean"] - res["before"]["sampled"]["mean"] if res["ceiling"] else 0.0,
    )
    for entry in [e for c, e in res["controls"].items() if none and c != "none"]:
        # paired by seed: the same episodes with and without updates
        gain_during = np.mean(entry["during_per_seed"], 1) - np.mean(none["during_per_seed"], 1)
        gain = mean_ci(np.subtract(entry["after_per_seed"]["sampled"], none["after_per_seed"]["sampled"]))
        entry["gain_over_none"] = {"during_mean": mean_ci(gain_during), "after_sampled": gain}
        # the gap is taken as fixed, so the fraction's CI is the gain's, scaled; without headroom there is no fraction
        entry["gain_fraction_of_ceiling"] = (
            None
            if gap <= 0
            else {"mean": gain["mean"] / gap, "ci95": None if gain["ci95"] is None else gain["ci95"] / gap, "gap": gap}
        )
    return res, saved


def run_adapt(args, ckpt, base_agent, targets, reward_scale, writer, report, run_dir):
    """Adapts on every target into `report`; logs, plots and saves. Returns eval.json's summary and the figure's path."""
    settings = gate_settings(ckpt["args"]["num_abstractions"], args.ceiling_resolution) if args.ceiling_resolution else {}
    report.update(
        controls=args.controls,
        seeds=[args.seed + i for i in range(args.num_seeds)],
        episodes=args.episodes,
        online=args.online,
        reward_scale=reward_scale,
        results={},
    )
    summary, saved = {}, []
    for position, target in enumerate(targets):
        res, adapted = adapt_target(args, ckpt, base_agent, target, position, reward_scale, settings)
        report["results"][target["name"]], saved = res, saved + adapted
        # LOGGING
        for kind, _ in KINDS:
            record(writer, summary, f"before_{kind}", target, res["before"][kind]["mean"])
        if res["ceiling"]:
            record(writer, summary, "ceiling_sampled", target, res["ceiling"]["sampled"]["mean"])
        for control, entry in res["controls"].items():
            for step, value in enumerate(entry["during"]["mean"]):
                writer.add_scalar(f"tta/episodic_return_{target['name']}_{control}", value, step + 1)
            gains = entry.get("gain_over_none", {})
            stats = {
                "during_mean": entry["during_mean"],
                "after_deterministic": entry["after"]["deterministic"],
                "after_sampled": entry["after"]["sampled"],
                "gain_over_none_during": gains.get("during_mean"),
                "gain_over_none_after_sampled": gains.get("after_sampled"),
                "gain_fraction_of_ceiling": entry.get("gain_fraction_of_ceiling"),
            }
            for key, stat in stats.items():
                if stat:
                    record(writer, summary, key, target, stat["mean"], args.episodes, control)
    figure = os.path.join(run_dir, "adaptation_curves.png")
    plot_adaptation_curves(
        report["results"],
        targets,
        args.controls,
        figure,
        f"{os.path.basename(run_dir)}\nadaptation on "
        f"{ckpt['run_name']} ({args.num_seeds} seeds, {'online' if args.online else 'per-episode'} updates)",
    )
    if args.save_model:
        model_path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        torch.save(
            {
                "script": SCRIPT,
                "format": 1,
                "source_checkpoint": report["checkpoint"],
                "source_args": ckpt["args"],
                "modes": ckpt["modes"],
                "adapted": saved,
            },
            f"{model_path}.tmp",
        )
        os.replace(f"{model_path}.tmp", model_path)
    return summary, figure


def run_clamp(args, ckpt, base_agent, targets, _reward_scale, writer, report, run_dir):
    """Every target with the gate clamped to each slot, uniform and learned, into `report`; the specificity; the heatmap."""
    num_slots, hide_velocity = ckpt["args"]["num_abstractions"], ckpt["args"]["hide_velocity"]
    settings = {**gate_settings(num_slots, 1), "learned": None}
    report.update(columns=list(settings), results={})
    summary = {}
    for ti, target in enumerate(targets):
        _, runs = gate_returns(
            base_agent, target, hide_velocity, settings, [100_000 + args.seed + 1000 * ti], args.eval_episodes
        )
        res = report["results"][target["name"]] = {
            column: {
                kind: {"mean": float(r.mean()), "std": float(r.std()), "returns": r.tolist()}
                for kind, ((r, _),) in by_kind.items()
            }
            for column, by_kind in runs.items()
        }
        for column, (kind, _) in itertools.product(settings, KINDS):
            writer.add_scalar(f"tta/clamp_return_{target['name']}_{column}_{kind}", res[column][kind]["mean"], 0)
            if not column.startswith("slot"):  # slot k of one checkpoint is not slot k of another: no pooling
                summary.setdefault(f"clamp_{kind}", {}).setdefault(column, []).append(res[column][kind]["mean"])
        res["learned_slot_weights"] = runs["learned"]["deterministic"][0][1].tolist()
        print(f"{target['label']}: " + " ".join(f"{c} {res[c]['deterministic']['mean']:.0f}" for c in settings), flush=True)
    matrix = {
        kind: np.array([[report["results"][t["name"]][c][kind]["mean"] for c in settings] for t in targets])
        for kind, _ in KINDS
    }
    report["matrix"], report["specificity"] = {kind: m.tolist() for kind, m in matrix.items()}, {}
    for kind, _ in KINDS:
        score, matching = clamp_specificity(matrix[kind][:, :num_slots])
        report["specificity"][kind] = {"score": score, "matching": [[targets[r]["name"], f"slot{c}"] for r, c in matching]}
        if score is not None:
            writer.add_scalar(f"tta/clamp_specificity_{kind}", score, 0)
            summary.setdefault("clamp_specificity", {})[kind] = [score]
        print(f"clamp specificity, {kind}: {score}, matching {report['specificity'][kind]['matching']}")
    figure = os.path.join(run_dir, "clamp_heatmap.png")
    plot_clamp_heatmap(
        matrix,
        [t["label"] for t in targets],
        list(settings),
        figure,
        f"{os.path.basename(run_dir)}\nreturn with "
        f"the gate clamped, {args.eval_episodes} episodes per cell ({ckpt['run_name']})",
    )
    return summary, figure


if __name__ == "__main__":
    args = tyro.extras.subcommand_cli_from_dict({"adapt": AdaptArgs, "clamp": Args})
    subcommand = "adapt" if isinstance(args, AdaptArgs) else "clamp"
    args.exp_name = f"{SCRIPT}_{subcommand}" if args.exp_name is None else args.exp_name
    try:
        model_path, ckpt, base_agent, targets, reward_scale = validate(args)
        run_name, run_dir = claim_run_dir(
            args.runs_dir, f"NonStationaryCartPole__{args.exp_name}__{args.seed}__{int(time.time())}"
        )
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
            name=run_name,
            dir=run_dir,
            save_code=True,
        )
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    )
    torch.set_num_threads(1)  # fastest for this small network; every evaluation and adaptation seeds torch and its envs
    report = {
        "script": SCRIPT,
        "subcommand": subcommand,
        "checkpoint": os.path.abspath(model_path),
        "checkpoint_run": ckpt["run_name"],
        "checkpoint_args": ckpt["args"],
        "eval_episodes": args.eval_episodes,
        "args": vars(args),
        "targets": [
            dict(zip(("name", "gravity", "half_length", "force_sign", "held_out"), (t["name"], *t["physics"], t["held_out"])))
            for t in targets
        ],
    }
    run = run_adapt if subcommand == "adapt" else run_clamp
    summary, figure = run(args, ckpt, base_agent, targets, reward_scale, writer, report, run_dir)
    results_path = os.path.join(run_dir, "tta.json" if subcommand == "adapt" else "clamp.json")
    write_json(report, results_path)
    # eval.json: headline numbers averaged over the targets, for benchmark/report.py's tables (per target: results_path)
    headline = {
        key: {k: float(np.mean(v)) for k, v in values.items()} if isinstance(values, dict) else float(np.mean(values))
        for key, values in summary.items()
    }
    write_json(
        {"script": SCRIPT, "subcommand": subcommand, "targets": [t["name"] for t in targets], **headline},
        os.path.join(run_dir, "eval.json"),
    )
    print(f"results in {results_path} and {figure}")
    writer.close()
