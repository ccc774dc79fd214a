"""ASTRAL: the recurrent PPO agent of ppo_gru_baseline.py, its GRU state modulated by learnable abstraction slots.

An `AbstractionBank` of K slots A ∈ R^{K×d} and a gate w_t = softmax(g(h_t)/τ) give z_t = w_tᵀA; `FiLM` makes
h'_t = γ(z_t) ⊙ h_t + β(z_t), all the heads read. Slot regularisers join the PPO loss through the gate replayed in the
update. A bottleneck, orthonormal slots, a hard gate and an episode-consistency bonus give slots a reason and a way to
specialise; a gate supervised by the true mode is the diagnostic ceiling. Environment, flags and logs: the baseline's.

Usage: python cleanrl_astral/ppo_gru_astral.py --modes-preset mirror4 --mode-share balanced --hide-velocity --save-model
"""

import contextlib
import dataclasses
import itertools
import json
import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from gymnasium.utils.save_video import save_video
from gymnasium.wrappers.utils import RunningMeanStd
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

SCRIPT = os.path.basename(__file__)[: -len(".py")]
CHECKPOINT_FORMAT = 1


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, cuda will be used when available (the tiny GRU is faster on CPU)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl_astral"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record one evaluation video per mode into `runs/{run_name}/videos` (needs --save-model)"""
    save_model: bool = False
    """save the model to `runs/{run_name}/{exp_name}.cleanrl_model`, then evaluate it"""
    runs_dir: str = "runs"
    """directory under which `{run_name}/` is written"""
    eval_episodes: int = 10
    """evaluation episodes per mode, each for deterministic and for sampled actions"""

    # Environment
    env_id: str = "NonStationaryCartPole"
    """name used in the run name"""
    modes_preset: Literal["seed3", "inverted4", "mirror4"] = "seed3"
    """physics modes: `seed3` (three gravity/length settings), `inverted4` (seed3 plus inverted force) or `mirror4`
    (two physics x force sign ±1, plus a held-out mode 4 that is only evaluated)"""
    mode_share: Literal["uniform", "balanced"] = "uniform"
    """`uniform`: a training mode drawn per episode; `balanced`: env i always in training mode i mod M (equal step shares)"""
    hide_velocity: bool = False
    """observe only cart position and pole angle, so velocities must be inferred from memory"""
    fixed_mode: int | None = None
    """always use this mode index instead of resampling it"""
    switch_prob: float = 0.0
    """per-step probability of resampling the mode in the middle of an episode"""
    memory: Literal["gru", "none"] = "gru"
    """`gru`: recurrent agent; `none`: GRU state zeroed every step (memoryless control, same parameters)"""
    oracle: bool = False
    """append the true mode one-hot to the agent's input (the upper-bound control)"""

    # Algorithm
    total_timesteps: int = 500000
    """total timesteps of the experiment"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 32
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each holds whole environments' sequences)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""
    norm_reward: bool = True
    """divide rewards by a running std of the discounted return, so the value loss cannot swamp the gradient clip"""
    hidden_size: int = 128
    """width of the encoder and of the GRU state"""

    # ASTRAL
    num_abstractions: int = 3
    """K, the number of abstraction slots"""
    slot_dim: int = 32
    """d, the dimension of each slot"""
    slot_init: Literal["random", "orthonormal"] = "random"
    """`random`: N(0, 0.02²) slots; `orthonormal`: unit-norm, mutually orthogonal slots (needs K <= --slot-dim)"""
    tau: float = 1.0
    """temperature of the gate softmax"""
    lambda_w_ent: float = 0.001
    """weight of the per-sample gate entropy penalty (sharp gates)"""
    lambda_lb: float = 0.001
    """weight of the load-balancing bonus: entropy of the batch-mean gate weights (all slots used)"""
    lambda_orth: float = 0.0001
    """weight of the slot orthogonality penalty ||ÂÂᵀ - I||²_F on row-normalised slots"""
    bottleneck: bool = False
    """FiLM the current input's features (not h) by z, so memory reaches the heads only through the gate"""
    hard_gate: bool = False
    """straight-through Gumbel-softmax gate: one slot per step in the forward pass, and only it gets gradient"""
    gumbel_tau: float = 1.0
    """temperature of the hard gate's Gumbel-softmax (its backward pass)"""
    lambda_consistency: float = 0.0
    """weight of the episode-consistency bonus I(episode; slot) of the episode-mean gates past their first 10 steps"""
    lambda_supervised: float = 0.0
    """diagnostic ceiling, not the method: weight of a cross-entropy from the gate to the true mode (K >= training modes)"""

    batch_size: int = 0
    """the batch size (computed at runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed at runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed at runtime)"""


# ENVIRONMENT
MODE_PRESETS = {  # a mode is (gravity, pole half-length, force sign)
    "seed3": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0)],
    "inverted4": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0), (9.8, 0.5, -1.0)],
    # two physics x force sign ±1, so the right action flips with the hidden mode; mode 4 (between the two physics,
    # inverted force) is held out of training
    "mirror4": [(9.8, 0.5, 1.0), (9.8, 0.5, -1.0), (7.5, 0.7, 1.0), (7.5, 0.7, -1.0), (8.65, 0.6, -1.0)],
}
HELD_OUT_MODES = {"seed3": [], "inverted4": [], "mirror4": [4]}  # evaluated (and adapted to) only, never trained on


class NonStationaryCartPole:
    """`num_envs` CartPole-v1s stepped together in numpy, with gymnasium's equations, constants and 500-step limit.
    Each env has a hidden physics mode (gravity, pole half-length, force sign), drawn at every episode start and, with
    probability `switch_prob`, after any step, among the modes not `held_out`; `pinned[i] >= 0` fixes env i's mode
    (`fixed_mode` pins all; `mode_share="balanced"` pins env i to the (i mod M)-th of the M training modes, so every
    mode gets the same share of steps whatever its episode length). Autoreset is same-step: where an episode ends,
    the returned observation is already the next episode's first, and info["final_obs"] holds the ended one's last.
    info["mode"] (for analysis only) is the mode that governs each env's next step."""

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
    ):
        self.num_envs, self.switch_prob, self.max_episode_steps = num_envs, switch_prob, max_episode_steps
        self.gravity, self.half_length, self.force_sign = np.array(modes, dtype=np.float64).T
        self.train_modes = np.array([k for k in range(len(modes)) if k not in held_out])
        self.pinned, self.rng = np.full(num_envs, -1 if fixed_mode is None else fixed_mode), np.random.default_rng()
        if mode_share == "balanced":
            self.pinned = self.train_modes[np.arange(num_envs) % len(self.train_modes)]
        self.observed = [0, 2] if hide_velocity else [0, 1, 2, 3]  # hidden velocity: cart position and pole angle only

    def draw_modes(self, envs):
        """New modes for the envs of the boolean mask `envs` (pinned envs keep theirs)."""
        drawn = self.train_modes[self.rng.integers(len(self.train_modes), size=self.num_envs)]
        drawn = np.where(self.pinned >= 0, self.pinned, drawn)
        self.mode = np.where(envs, drawn, self.mode)

    def restart(self, envs):
        self.state[envs], self.elapsed[envs] = self.rng.uniform(-0.05, 0.05, (int(envs.sum()), 4)), 0
        self.draw_modes(envs)

    def reset(self, seed=None):
        self.rng = np.random.default_rng(seed)
        self.state, self.elapsed, self.mode = (
            np.zeros((self.num_envs, 4)),
            np.zeros(self.num_envs, dtype=int),
            np.zeros(self.num_envs, dtype=int),
        )
        self.restart(np.ones(self.num_envs, dtype=bool))
        return self.state[:, self.observed].astype(np.float32), {"mode": self.mode.copy()}

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state.T
        gravity, length, masspole, total_mass = self.gravity[self.mode], self.half_length[self.mode], 0.1, 0.1 + 1.0
        force = self.force_sign[self.mode] * 10.0 * np.where(action == 1, 1.0, -1.0)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + masspole * length * np.square(theta_dot) * sintheta) / total_mass
        thetaacc = (gravity * sintheta - costheta * temp) / (
            length * (4.0 / 3.0 - masspole * np.square(costheta) / total_mass)
        )
        xacc = temp - masspole * length * thetaacc * costheta / total_mass
        self.state = np.stack(
            [x + 0.02 * x_dot, x_dot + 0.02 * xacc, theta + 0.02 * theta_dot, theta_dot + 0.02 * thetaacc], 1
        )
        self.last_state, self.elapsed = self.state.copy(), self.elapsed + 1  # last_state: what a renderer draws
        terminated = (np.abs(self.state[:, 0]) > 2.4) | (np.abs(self.state[:, 2]) > 12 * 2 * math.pi / 360)
        truncated = self.elapsed >= self.max_episode_steps
        if self.switch_prob > 0:
            self.draw_modes(self.rng.random(self.num_envs) < self.switch_prob)
        info = {"final_obs": self.state[:, self.observed].astype(np.float32), "final_mode": self.mode.copy()}
        self.restart(terminated | truncated)
        info["mode"] = self.mode.copy()
        return self.state[:, self.observed].astype(np.float32), np.ones(self.num_envs), terminated, truncated, info


# MODEL
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class AbstractionBank(nn.Module):
    """K learnable slots A and a gate p = softmax(g(h) / τ): z = wᵀA with w = p or, given `gumbel_tau`, the hard gate's
    straight-through Gumbel-softmax one-hot of argmax(g(h)/τ + noise), so only the chosen slot's row gets gradient."""

    def __init__(self, hidden_size, num_abstractions, slot_dim, tau, orthonormal=False, gumbel_tau=None):
        super().__init__()
        self.slots, self.tau, self.gumbel_tau = nn.Parameter(torch.randn(num_abstractions, slot_dim) * 0.02), tau, gumbel_tau
        if orthonormal:  # unit-norm, mutually orthogonal rows: no two slots start alike (needs K <= d)
            nn.init.orthogonal_(self.slots)
        # small final layer: the gate starts near uniform, so no slot wins by initialisation
        self.gate = nn.Sequential(
            layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, num_abstractions), std=0.01)
        )

    def forward(self, h, weights=None, noise=None):
        """(z, w, p, noise); `weights` overrides w (a one-hot clamps a slot), `noise` the hard gate's draw (the replay's)."""
        logits = self.gate(h) / self.tau
        probs = torch.softmax(logits, dim=-1)
        if weights is None and self.gumbel_tau is not None:
            noise = -torch.empty_like(logits).exponential_().log() if noise is None else noise  # as F.gumbel_softmax
            soft = torch.softmax((logits + noise) / self.gumbel_tau, dim=-1)
            weights = torch.zeros_like(soft).scatter_(-1, soft.argmax(-1, keepdim=True), 1.0) - soft.detach() + soft
        weights = probs if weights is None else weights
        return weights @ self.slots, weights, probs, noise


class FiLM(nn.Module):
    """h' = γ ⊙ h + β with (γ - 1, β) = Linear(z): a zero z leaves h unchanged."""

    def __init__(self, slot_dim, hidden_size):
        super().__init__()
        self.net = layer_init(nn.Linear(slot_dim, 2 * hidden_size), std=1.0)

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
        orthonormal=False,
        gumbel_tau=None,
    ):
        super().__init__()
        self.obs_dim, self.num_actions, self.num_modes, self.memory, self.oracle = (
            obs_dim,
            num_actions,
            num_modes,
            memory,
            oracle,
        )
        self.input_dim, self.bottleneck = obs_dim + num_actions + 1 + (num_modes if oracle else 0), bottleneck
        self.encoder = nn.Sequential(layer_init(nn.Linear(self.input_dim, hidden_size)), nn.Tanh())
        self.hidden_size, self.gru = hidden_size, nn.GRUCell(hidden_size, hidden_size)
        for name, param in self.gru.named_parameters():
            nn.init.constant_(param, 0) if "bias" in name else nn.init.orthogonal_(param, 1.0)
        self.bank = AbstractionBank(hidden_size, num_abstractions, slot_dim, tau, orthonormal, gumbel_tau)
        self.film = FiLM(slot_dim, hidden_size)
        self.actor = nn.Sequential(
            layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, num_actions), std=0.01)
        )
        self.critic = nn.Sequential(layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0))

    def build_input(self, obs, prev_action, prev_reward, mode):
        """obs (..., obs_dim), prev_action (...) with -1 for "none", prev_reward (...), mode (...) -> input."""
        prev_onehot = torch.nn.functional.one_hot((prev_action + 1).long(), self.num_actions + 1)[..., 1:].float()
        parts = [obs.float(), prev_onehot, prev_reward.float().unsqueeze(-1)]
        if self.oracle:
            parts.append(torch.nn.functional.one_hot(mode.long(), self.num_modes).float())
        return torch.cat(parts, dim=-1)

    def unroll(self, x, state, starts):
        """x (T, B, input_dim), state (B, H) before x[0], starts (T, B) = 1 where x[t] opens an episode.
        Returns the input features (T, B, H), the GRU states h (T, B, H) and the state after x[T-1]."""
        features = self.encoder(x)
        keep = torch.zeros_like(starts) if self.memory == "none" else 1.0 - starts
        hidden = []
        # the GRUCell's own op without the module-call overhead (same numbers, ~4% off a training run)
        gru_weights = (self.gru.weight_ih, self.gru.weight_hh, self.gru.bias_ih, self.gru.bias_hh)
        # unbind, not features[t]: indexing makes backward zero-fill a full (T, B, H) gradient at every step
        for feature_t, keep_t in zip(features.unbind(0), keep.unbind(0)):
            # zero the state where the episode restarted: x[t] is a first step
            state = torch.gru_cell(feature_t, state * keep_t.unsqueeze(-1), *gru_weights)
            hidden.append(state)
        return features, torch.stack(hidden), state

    def forward(self, x, state, starts, weights=None, noise=None):
        """(h', final state, w, p, noise): the gate reads h; h' = FiLM(h; z), or FiLM(x_t's features; z) with bottleneck."""
        features, hidden, state = self.unroll(x, state, starts)
        z, weights, probs, noise = self.bank(hidden, weights, noise)
        return self.film(features if self.bottleneck else hidden, z), state, weights, probs, noise

    def get_value(self, x, state, starts):
        return self.critic(self(x, state, starts)[0]).squeeze(-1)

    def get_action_and_value(self, x, state, starts, action=None, deterministic=False, weights=None, noise=None):
        """action, log-prob, entropy, value, final state and the gate's w, p and hard-gate noise (zero when deterministic)."""
        if deterministic and noise is None and self.bank.gumbel_tau is not None:
            noise = torch.zeros(*x.shape[:-1], len(self.bank.slots), device=x.device)
        modulated, state, weights, probs, noise = self(x, state, starts, weights, noise)
        logits = self.actor(modulated)
        probs_a = Categorical(logits=logits)
        if action is None:
            action = logits.argmax(-1) if deterministic else probs_a.sample()
        return (
            action,
            probs_a.log_prob(action),
            probs_a.entropy(),
            self.critic(modulated).squeeze(-1),
            state,
            weights,
            probs,
            noise,
        )


# SLOT REGULARISERS
BURN_IN = 10  # the steps an episode's gate may take to infer the mode: the episode-level terms and metrics skip them


def weight_entropy(probs):
    """Mean entropy of the distributions in probs (..., K): of the per-step gate, penalised so each step picks a slot."""
    return -(probs * torch.log(probs + 1e-8)).sum(-1).mean()


def load_balance_entropy(probs):
    """Entropy of the batch-mean gate probabilities; rewarded so that every slot is used somewhere."""
    return weight_entropy(probs.reshape(-1, probs.shape[-1]).mean(0))


def orthogonality_penalty(slots):
    """||ÂÂᵀ - I||²_F with Â the row-normalised slots: 0 for orthonormal directions."""
    normed = slots / (slots.norm(dim=-1, keepdim=True) + 1e-8)
    return ((normed @ normed.T - torch.eye(len(slots), device=slots.device)) ** 2).sum()


def episode_means(values, starts, ages):
    """(episodes, C) means of values (T, B, C) over steps of age >= BURN_IN, each kept step's episode index and the mask of
    kept steps; episodes end at the starts the agent sees and at the batch's edges, never at a hidden mode switch."""
    T, B = starts.shape
    ids = (starts.cumsum(0) + torch.arange(B, device=starts.device) * (T + 1)).long().flatten()
    keep = ages.flatten() >= BURN_IN
    _, episode = torch.unique(ids[keep], return_inverse=True)
    sums = torch.zeros(int(episode.max()) + 1 if keep.any() else 0, values.shape[-1], device=values.device)
    sums = sums.index_add(0, episode, values.reshape(T * B, -1)[keep])
    return sums / torch.bincount(episode, minlength=len(sums)).unsqueeze(-1), episode, keep


def episode_consistency(probs, starts, ages):
    """I(episode; slot) = H(mean of the episode-mean gates) - mean H(episode-mean gate), rewarded: log K when every
    episode keeps one slot and episodes spread evenly over the slots, 0 when all have the same mean gate."""
    means = episode_means(probs, starts, ages)[0]
    return weight_entropy(means.mean(0)) - weight_entropy(means) if len(means) else probs.sum() * 0.0


def supervised_gate_loss(probs, modes, ages):
    """The diagnostic ceiling, not the method: cross-entropy from the gate to slot k in true mode k, past burn-in."""
    keep = ages.flatten() >= BURN_IN
    if not keep.any():  # a mean over no step would be NaN
        return probs.sum() * 0.0
    return nn.functional.nll_loss(torch.log(probs.reshape(-1, probs.shape[-1])[keep] + 1e-8), modes.flatten()[keep].long())


# each slot term's weight flag and its sign in the minimised loss: sharp steps, all slots used, orthogonal slots,
# episodes that keep one slot and differ from each other, and (ceiling only) a gate that names the true mode
SLOT_TERMS = {
    "weight_entropy": ("lambda_w_ent", 1),
    "load_balance_entropy": ("lambda_lb", -1),
    "orthogonality": ("lambda_orth", 1),
    "episode_consistency": ("lambda_consistency", -1),
    "supervised_ce": ("lambda_supervised", 1),
}


def slot_terms(probs, slots, batch, mb, args):
    """The slot terms of minibatch `mb` from its replayed gate probabilities: (values, {name: sign · λ · value})."""
    starts, ages = batch["starts"][:, mb], batch["ages"][:, mb]
    values = {
        "weight_entropy": weight_entropy(probs),
        "load_balance_entropy": load_balance_entropy(probs),
        "orthogonality": orthogonality_penalty(slots),
        "episode_consistency": episode_consistency(probs, starts, ages),
    }
    if args.lambda_supervised > 0:
        values["supervised_ce"] = supervised_gate_loss(probs, batch["modes"][:, mb], ages)
    return values, {
        name: sign * getattr(args, flag) * values[name] for name, (flag, sign) in SLOT_TERMS.items() if name in values
    }


# SLOT METRICS: the acted gate against the true mode, which the agent never sees
def mutual_information(counts):
    """I(mode; slot) in nats from a joint count matrix, and the same divided by H(mode) (0 if H(mode) = 0)."""
    joint = counts / counts.sum()
    p_mode, p_slot = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    mi = float((joint[nz] * np.log(joint[nz] / (p_mode @ p_slot)[nz])).sum())
    h_mode = float(-(p_mode[p_mode > 0] * np.log(p_mode[p_mode > 0])).sum())
    return mi, (mi / h_mode if h_mode > 0 else 0.0)


def episode_slot_metrics(weights, modes, starts, ages, num_modes):
    """Episode-level NMI (one sample per episode: its majority true mode against the argmax of its mean gate past
    burn-in) and gate stability (the share of those steps whose argmax slot is the episode's)."""
    means, episode, keep = episode_means(weights, starts, ages)
    if not len(means):
        return {"episode_nmi": float("nan"), "gate_stability": float("nan")}
    episode_mode = episode_means(nn.functional.one_hot(modes.long(), num_modes).float(), starts, ages)[0].argmax(-1)
    slot, num_slots = means.argmax(-1), weights.shape[-1]
    stable = (weights.reshape(-1, num_slots)[keep].argmax(-1) == slot[episode]).float()
    counts = np.histogram2d(
        episode_mode.cpu().numpy(), slot.cpu().numpy(), (num_modes, num_slots), ((0, num_modes), (0, num_slots))
    )[0]
    return {"episode_nmi": mutual_information(counts)[1], "gate_stability": (stable.sum() / keep.sum()).item()}


def linear_probe_accuracy(features, labels, episode):
    """Held-out accuracy of a logistic regression predicting the mode from per-step features: fitted on the steps of
    even-numbered episodes, scored on the odd ones' (at most ~10k steps each; nan without two modes to tell apart)."""
    from sklearn.linear_model import LogisticRegression  # only the evaluation probes

    fit = episode % 2 == 0
    if len(np.unique(labels[fit])) < 2 or fit.all():
        return float("nan")
    stride = max(1, len(labels) // 20000)
    train, test = np.flatnonzero(fit)[::stride], np.flatnonzero(~fit)[::stride]
    return float(LogisticRegression(max_iter=1000).fit(features[train], labels[train]).score(features[test], labels[test]))


class RewardScaler:
    """Divides rewards by the running std of each environment's discounted return (as gymnasium's NormalizeReward),
    keeping the value targets O(1) for the shared trunk."""

    def __init__(self, num_envs, gamma):
        self.gamma, self.returns, self.return_rms = gamma, np.zeros(num_envs), RunningMeanStd(shape=())

    def __call__(self, rewards, dones):
        self.returns = self.returns * self.gamma + rewards
        self.return_rms.update(self.returns)
        self.returns[dones] = 0.0
        return rewards / np.sqrt(self.return_rms.var + 1e-8)


# ROLLOUT / GAE / UPDATE
def new_carry(envs, agent, seed, device):
    """What one step hands to the next: the agent's next input, its GRU state and the running episode totals."""
    obs, info = envs.reset(seed=seed)
    n = envs.num_envs
    return {
        "obs": obs,
        "start": np.ones(n, dtype=bool),
        "state": torch.zeros(n, agent.hidden_size, device=device),
        "prev_action": np.full(n, -1),
        "prev_reward": np.zeros(n),
        "mode": info["mode"],
        "episode_mode": info["mode"].copy(),
        "episode_return": np.zeros(n),
        "episode_length": np.zeros(n, dtype=int),
    }


def carry_input(agent, carry):
    """The agent's input for the carried observation, previous action/reward and mode."""
    return agent.build_input(
        *(torch.as_tensor(carry[key], device=carry["state"].device) for key in ("obs", "prev_action", "prev_reward", "mode"))
    )


def env_step(agent, envs, carry, deterministic=False):
    """One step of every environment, shared by the rollout, the evaluation and the video. Returns what the batch keeps
    of it (and the slot metrics read), what the environments returned, and the ended episodes' (return, length, mode)."""
    x = carry_input(agent, carry)
    start = torch.as_tensor(carry["start"], dtype=torch.float32, device=x.device)
    with torch.no_grad():
        action, logprob, _, value, carry["state"], weights, _, noise = agent.get_action_and_value(
            x[None], carry["state"], start[None], deterministic=deterministic
        )
    step = {
        "inputs": x,
        "starts": start,
        "actions": action[0],
        "logprobs": logprob[0],
        "values": value[0],
        "modes": torch.as_tensor(carry["mode"], device=x.device),
        "ages": torch.as_tensor(carry["episode_length"], device=x.device),
        "weights": weights[0],
        "hidden": carry["state"],
    }
    if noise is not None:
        step["gate_noise"] = noise[0]
    obs, reward, terminated, truncated, info = outcome = envs.step(action[0].cpu().numpy())
    done = terminated | truncated
    carry["episode_return"], carry["episode_length"] = carry["episode_return"] + reward, carry["episode_length"] + 1
    episodes = [
        (float(carry["episode_return"][i]), int(carry["episode_length"][i]), int(carry["episode_mode"][i]))
        for i in np.flatnonzero(done)
    ]
    carry["episode_return"][done], carry["episode_length"][done], carry["episode_mode"][done] = 0.0, 0, info["mode"][done]
    # same-step autoreset: where done, obs opens the next episode: no previous action / reward, and a zeroed GRU state
    carry.update(
        obs=obs,
        start=done,
        mode=info["mode"],
        prev_action=np.where(done, -1, step["actions"].cpu().numpy()),
        prev_reward=np.where(done, 0.0, reward),
    )
    return step, outcome, episodes


def collect_rollout(agent, envs, carry, num_steps, gamma, reward_scaler):
    """Runs `num_steps` steps in every env. Returns the batch (tensors shaped (T, N, ...)), the GRU state it started
    from, and the finished episodes as (return, length, mode, index of the rollout step it ended in)."""
    initial_state, columns, episodes, device = carry["state"].clone(), {}, [], carry["state"].device
    for t in range(num_steps):
        step, (_, reward, terminated, truncated, info), ended = env_step(agent, envs, carry)
        episodes += [(*episode, t) for episode in ended]
        scaled = reward_scaler(reward, terminated | truncated) if reward_scaler is not None else reward.copy()
        # a time-limit truncation is not a failure: bootstrap from the value of the true final observation
        cut = np.flatnonzero(truncated & ~terminated)
        if len(cut):
            final_x = agent.build_input(
                *(
                    torch.as_tensor(a, device=device)
                    for a in (info["final_obs"][cut], step["actions"].cpu().numpy()[cut], reward[cut], info["final_mode"][cut])
                )
            )
            with torch.no_grad():
                final_value = agent.get_value(final_x[None], carry["state"][cut], torch.zeros(1, len(cut), device=device))[0]
            scaled[cut] += gamma * final_value.cpu().numpy()
        step["rewards"], step["raw_rewards"] = (
            torch.as_tensor(r, dtype=torch.float32, device=device) for r in (scaled, reward)
        )
        for key, value in step.items():
            columns.setdefault(key, []).append(value)
    return {key: torch.stack(column) for key, column in columns.items()}, initial_state, episodes


def compute_gae(rewards, values, starts, next_value, next_start, gamma, gae_lambda):
    """GAE over (T, N) tensors. starts[t] = 1 where step t opens an episode, so step t-1 ended one and must
    not bootstrap from step t (truncations were already bootstrapped into their reward)."""
    nextnonterminal = 1.0 - torch.cat([starts[1:], next_start[None]])
    deltas = rewards + gamma * torch.cat([values[1:], next_value[None]]) * nextnonterminal - values
    advantages, lastgaelam = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        advantages[t] = lastgaelam = deltas[t] + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
    return advantages, advantages + values


def ppo_update(agent, optimizer, batch, initial_state, advantages, returns, args):
    """PPO epochs over minibatches of whole environments, replayed from the state saved at the start of the rollout (the
    hard gate with its acted noise): log-probs and gate are as acted, and the slot terms get the gate's gradient."""
    num_envs = batch["inputs"].shape[1]
    envs_per_minibatch, env_indices = num_envs // args.num_minibatches, np.arange(num_envs)
    clipfracs, stats = [], {}
    for epoch in range(args.update_epochs):
        np.random.shuffle(env_indices)
        for start in range(0, num_envs, envs_per_minibatch):
            mb = env_indices[start : start + envs_per_minibatch]
            noise = batch["gate_noise"][:, mb] if "gate_noise" in batch else None
            _, newlogprob, entropy, newvalue, _, weights, probs, _ = agent.get_action_and_value(
                batch["inputs"][:, mb], initial_state[mb], batch["starts"][:, mb], batch["actions"][:, mb], noise=noise
            )
            logratio = newlogprob - batch["logprobs"][:, mb]
            ratio = logratio.exp()
            if epoch == 0 and start == 0:
                # exactly 1 (and the acted gate weights) unless the recurrent replay differs from what was acted
                stats["first_minibatch_ratio_error"] = (ratio - 1).abs().max().item()
                stats["first_minibatch_gate_error"] = (weights - batch["weights"][:, mb]).abs().max().item()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())

            mb_advantages = advantages[:, mb]
            if args.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()

            if args.clip_vloss:
                v_loss_unclipped = (newvalue - returns[:, mb]) ** 2
                v_clipped = batch["values"][:, mb] + torch.clamp(
                    newvalue - batch["values"][:, mb], -args.clip_coef, args.clip_coef
                )
                v_loss = 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns[:, mb]) ** 2).mean()
            else:
                v_loss = 0.5 * ((newvalue - returns[:, mb]) ** 2).mean()

            entropy_loss = entropy.mean()
            ppo_loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
            values, terms = slot_terms(probs, agent.bank.slots, batch, mb, args)
            slot_loss = sum(terms.values())
            loss = ppo_loss + slot_loss
            if epoch == 0 and start == 0:  # what each term adds to the gradient, beside the PPO loss's, before the clip
                for name, term in {"ppo": ppo_loss, **terms}.items():
                    grads = (
                        [
                            g
                            for g in torch.autograd.grad(term, list(agent.parameters()), retain_graph=True, allow_unused=True)
                            if g is not None
                        ]
                        if term.requires_grad and (name == "ppo" or getattr(args, SLOT_TERMS[name][0]))
                        else []
                    )
                    stats[f"grad_norm_{name}"] = float(torch.sqrt(sum((g**2).sum() for g in grads))) if grads else 0.0
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()

        if args.target_kl is not None and approx_kl > args.target_kl:
            break

    y_pred, y_true = batch["values"].flatten().cpu().numpy(), returns.flatten().cpu().numpy()
    var_y = np.var(y_true)
    stats.update(
        value_loss=v_loss.item(),
        policy_loss=pg_loss.item(),
        entropy=entropy_loss.item(),
        old_approx_kl=old_approx_kl.item(),
        approx_kl=approx_kl.item(),
        clipfrac=float(np.mean(clipfracs)),
        explained_variance=float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y),
        slot_loss=slot_loss.item(),
        **{name: value.item() for name, value in values.items()},
    )
    return stats


# EVALUATION
def agent_from_args(args, num_modes):
    return Agent(
        2 if args.hide_velocity else 4,
        2,
        num_modes,
        args.hidden_size,
        args.memory,
        args.oracle,
        args.num_abstractions,
        args.slot_dim,
        args.tau,
        args.bottleneck,
        args.slot_init == "orthonormal",
        args.gumbel_tau if args.hard_gate else None,
    )


def evaluate(model_path, episodes_per_mode=10, modes=None, deterministic=True, seed=0, video_dir=None, device="cpu"):
    """Plays `episodes_per_mode` episodes in each mode of `modes` (default: the checkpoint's, held-out ones included; any
    physics works): {"returns": {mode: returns}, "slot_weights", "slot_counts": mode × slot mean gate and argmax counts,
    "slots": episode-level metrics and probe accuracies over the trained modes (all of `modes` when given)}."""
    ckpt = torch.load(model_path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{model_path!r} was not written by {SCRIPT}.py (format {CHECKPOINT_FORMAT})")
    train_args, train_modes = Args(**ckpt["args"]), [tuple(m) for m in ckpt["modes"]]
    held_out = HELD_OUT_MODES[train_args.modes_preset] if modes is None else []
    modes = train_modes if modes is None else [tuple(float(v) for v in m) for m in modes]
    agent = agent_from_args(train_args, len(train_modes)).to(device)
    agent.load_state_dict(ckpt["state_dict"])
    returns, steps = {}, []
    for k in range(len(modes)):
        envs = NonStationaryCartPole(episodes_per_mode, modes, train_args.hide_velocity, fixed_mode=k)
        episodes, columns = first_episodes(agent, envs, seed + 1000 * k, deterministic)
        returns[k] = np.array([ret for ret, _, _ in episodes])
        steps.append(columns)
        if video_dir is not None:
            record_video(
                agent, NonStationaryCartPole(1, modes, train_args.hide_velocity, fixed_mode=k), seed, video_dir, f"mode{k}"
            )
    weights = [c["weights"][c["ages"] >= 0].cpu().numpy() for c in steps]
    slot_counts = np.stack([np.bincount(w.argmax(-1), minlength=train_args.num_abstractions) for w in weights])
    # the trained modes' episodes side by side in one (T, N) batch, padded at the end with uncounted steps (age -1)
    batch = {
        key: nn.utils.rnn.pad_sequence(
            [c[key] for k, c in enumerate(steps) if k not in held_out], padding_value=-1 if key == "ages" else 0
        ).flatten(1, 2)
        for key in steps[0]
    }
    metrics = episode_slot_metrics(batch["weights"], batch["modes"], batch["starts"], batch["ages"], len(modes))
    _, episode, keep = episode_means(batch["weights"], batch["starts"], batch["ages"])
    for name, key in (("w", "weights"), ("h", "hidden")):
        metrics[f"probe_acc_{name}"] = linear_probe_accuracy(
            batch[key].flatten(0, 1)[keep].cpu().numpy(), batch["modes"].flatten()[keep].cpu().numpy(), episode.cpu().numpy()
        )
    return {
        "returns": returns,
        "slot_weights": np.stack([w.mean(0) for w in weights]),
        "slot_counts": slot_counts,
        "slots": metrics,
    }


def first_episodes(agent, envs, seed, deterministic):
    """Each env's first episode as (return, length, mode), and the slot metrics' columns (T, N, ...), age -1 after it."""
    carry = new_carry(envs, agent, seed, next(agent.parameters()).device)
    first, columns = [None] * envs.num_envs, {}
    while any(episode is None for episode in first):
        running = torch.tensor([episode is None for episode in first])
        step, (_, _, terminated, truncated, _), ended = env_step(agent, envs, carry, deterministic)
        step["ages"] = torch.where(running, step["ages"], -1)
        for key in ("weights", "hidden", "modes", "starts", "ages"):
            columns.setdefault(key, []).append(step[key])
        for i, episode in zip(np.flatnonzero(terminated | truncated), ended):
            first[i] = first[i] or episode
    return first, {key: torch.stack(column) for key, column in columns.items()}


def record_video(agent, env, seed, video_dir, name):
    """One deterministic episode of the single env `env`, drawn by gymnasium's renderer: video_dir/{name}-episode-0.mp4."""
    renderer = gym.make("CartPole-v1", render_mode="rgb_array").unwrapped
    carry, frames, ended = new_carry(env, agent, seed, next(agent.parameters()).device), [], []
    renderer.length, renderer.state = env.half_length[env.mode[0]], env.state[0]
    while not ended:
        frames.append(renderer.render())
        *_, ended = env_step(agent, env, carry, deterministic=True)
        renderer.state = env.last_state[0]
    save_video(frames + [renderer.render()], video_dir, fps=50, name_prefix=name)


def plot_slot_heatmap(slot_weights, path, title):
    """Annotated mode × slot heatmap of mean gate weights, saved as PNG."""
    import matplotlib.pyplot as plt  # only a --save-model run draws

    num_modes, num_slots = slot_weights.shape
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + 0.9 * num_slots), 1.4 + 0.6 * num_modes), layout="tight")
    fig.colorbar(ax.imshow(slot_weights, cmap="viridis", vmin=0.0, vmax=1.0), ax=ax, fraction=0.046, pad=0.04)
    for (i, j), v in np.ndenumerate(slot_weights):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=9)
    ax.set(xlabel="slot", ylabel="mode", xticks=range(num_slots), yticks=range(num_modes))
    ax.set_title(title, fontsize=7)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# RUN DIRECTORY / VALIDATION
def claim_run_dir(runs_dir, run_name):
    """Creates runs_dir/run_name (run_name__2, __3, ... if a run started in the same second took it): (name, dir)."""
    if os.path.exists(runs_dir) and not os.path.isdir(runs_dir):
        raise ValueError(f"cannot create a run directory in --runs-dir {runs_dir!r} (not a directory); pass a directory")
    for name in (run_name if n == 1 else f"{run_name}__{n}" for n in itertools.count(1)):
        with contextlib.suppress(FileExistsError):
            os.makedirs(os.path.join(runs_dir, name))
            return name, os.path.join(runs_dir, name)


def validate(args):
    """Refuses, in one line (ValueError), the settings that would crash late or train wrong in silence."""
    value, flag = lambda name: getattr(args, name), lambda name: "--" + name.replace("_", "-")
    problems = [
        f"{flag(f.name)} {value(f.name)} must be a finite number"
        for f in dataclasses.fields(args)  # NaN passes any <, >
        if isinstance(value(f.name), float) and not math.isfinite(value(f.name))
    ]
    problems += [
        f"{flag(n)} {value(n)} must be positive"
        for n in ("learning_rate", "clip_coef", "max_grad_norm", "target_kl", "tau", "gumbel_tau")
        if value(n) is not None and value(n) <= 0
    ]
    problems += [
        f"{flag(n)} {value(n)} must be non-negative"
        for n in ("ent_coef", "vf_coef", *(flag for flag, _ in SLOT_TERMS.values()))
        if value(n) < 0
    ]
    problems += [
        f"{flag(n)} must be at least 1"
        for n in (
            "num_envs",
            "num_steps",
            "num_minibatches",
            "update_epochs",
            "hidden_size",
            "eval_episodes",
            "num_abstractions",
            "slot_dim",
        )
        if value(n) < 1
    ]

    num_modes, envs_per_minibatch = len(MODE_PRESETS[args.modes_preset]), args.num_envs // max(1, args.num_minibatches)
    held_out, num_train = HELD_OUT_MODES[args.modes_preset], num_modes - len(HELD_OUT_MODES[args.modes_preset])
    problems += [
        message
        for wrong, message in (
            (
                not 0 <= args.seed < 2**32,
                f"--seed {args.seed} must be in [0, 2**32 - 1] (the range numpy and gymnasium accept)",
            ),
            # the name becomes part of a directory name and of the model file's name: a '/' would fail the save after training
            (
                not args.exp_name.strip() or "/" in args.exp_name,
                f"--exp-name {args.exp_name!r} must be a non-empty name without '/'",
            ),
            (
                not (0.0 < args.gamma <= 1.0 and 0.0 <= args.gae_lambda <= 1.0),
                f"--gamma {args.gamma} must be in (0, 1] and --gae-lambda {args.gae_lambda} in [0, 1]",
            ),
            (not 0.0 <= args.switch_prob <= 1.0, f"--switch-prob {args.switch_prob} must be in [0, 1]"),
            (
                args.fixed_mode is not None and not 0 <= args.fixed_mode < num_modes,
                f"--fixed-mode {args.fixed_mode} is out of range; there are {num_modes} modes (0..{num_modes - 1})",
            ),
            (
                args.fixed_mode in held_out,
                f"--fixed-mode {args.fixed_mode} is held out of training in {args.modes_preset} (evaluation only)",
            ),
            (
                args.mode_share == "balanced" and args.num_envs % num_train != 0,
                f"--mode-share balanced needs --num-envs "
                f"{args.num_envs} to be a multiple of the {num_train} training modes, so each gets the same share",
            ),
            (
                args.mode_share == "balanced" and (args.fixed_mode is not None or args.switch_prob > 0),
                "--mode-share balanced pins every env's mode; it cannot be combined with --fixed-mode or --switch-prob",
            ),
            (
                args.num_minibatches >= 1 and args.num_envs % args.num_minibatches != 0,
                f"--num-envs {args.num_envs} is not divisible by --num-minibatches {args.num_minibatches}; "
                "minibatches hold whole environments' sequences",
            ),
            (
                args.norm_adv and envs_per_minibatch * args.num_steps < 2,
                "a minibatch of one step cannot normalise its advantages "
                "(their std is undefined); raise --num-steps or --num-envs, or lower --num-minibatches",
            ),
            (
                args.total_timesteps < args.num_envs * args.num_steps,
                f"--total-timesteps {args.total_timesteps} is less than one "
                f"rollout (--num-envs x --num-steps = {args.num_envs * args.num_steps})",
            ),
            (args.capture_video and not args.save_model, "--capture-video records evaluation episodes; add --save-model"),
            (
                args.slot_init == "orthonormal" and args.num_abstractions > args.slot_dim,
                f"--slot-init orthonormal needs "
                f"--num-abstractions {args.num_abstractions} <= --slot-dim {args.slot_dim} (at most d orthogonal directions)",
            ),
            (
                args.lambda_supervised > 0 and args.num_abstractions < num_train,
                f"--lambda-supervised needs --num-abstractions "
                f"{args.num_abstractions} >= the {num_train} training modes (slot k is trained to mean mode k)",
            ),
        )
        if wrong
    ]
    if problems:
        raise ValueError(problems[0])


if __name__ == "__main__":
    args = tyro.cli(Args)
    try:
        validate(args)
        run_name, run_dir = claim_run_dir(args.runs_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    except ValueError as e:
        print(f"{SCRIPT}.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    modes, held_out = MODE_PRESETS[args.modes_preset], HELD_OUT_MODES[args.modes_preset]
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
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
        "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])
    )

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(1)  # fastest for this small network
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = NonStationaryCartPole(
        args.num_envs,
        modes,
        args.hide_velocity,
        args.fixed_mode,
        args.switch_prob,
        held_out=held_out,
        mode_share=args.mode_share,
    )
    agent = agent_from_args(args, len(modes)).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    reward_scaler = RewardScaler(args.num_envs, args.gamma) if args.norm_reward else None
    carry = new_carry(envs, agent, args.seed, device)
    recent, recent_by_mode = deque(maxlen=100), {k: deque(maxlen=100) for k in envs.train_modes.tolist()}
    global_step, start_time = 0, time.time()
    for iteration in range(1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # ROLLOUT
        batch, initial_state, episodes = collect_rollout(agent, envs, carry, args.num_steps, args.gamma, reward_scaler)
        for ep_return, ep_length, ep_mode, ep_end in episodes:
            recent.append(ep_return)
            recent_by_mode[ep_mode].append(ep_return)
            end_step = global_step + (ep_end + 1) * args.num_envs  # the global step where the episode ended
            writer.add_scalar("charts/episodic_return", ep_return, end_step)
            writer.add_scalar("charts/episodic_length", ep_length, end_step)
            writer.add_scalar(f"charts/episodic_return_mode{ep_mode}", ep_return, end_step)
        global_step += args.batch_size

        # ADVANTAGES (GAE)
        with torch.no_grad():
            next_start = torch.as_tensor(carry["start"], dtype=torch.float32, device=device)
            next_value = agent.get_value(carry_input(agent, carry)[None], carry["state"], next_start[None])[0]
            advantages, returns = compute_gae(
                batch["rewards"], batch["values"], batch["starts"], next_value, next_start, args.gamma, args.gae_lambda
            )

        # UPDATE
        stats = ppo_update(agent, optimizer, batch, initial_state, advantages, returns, args)

        # LOGGING
        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        # slot usage as the agent acted, overall and per (hidden) true mode
        weights, step_modes = batch["weights"].flatten(0, 1), batch["modes"].flatten()
        slots = episode_slot_metrics(batch["weights"], batch["modes"], batch["starts"], batch["ages"], len(modes))
        slots.update({f"usage_w{k}": w for k, w in enumerate(weights.mean(0).tolist())})
        for mode in step_modes.unique().tolist():
            slots.update({f"mode{mode}_w{k}": w for k, w in enumerate(weights[step_modes == mode].mean(0).tolist())})
        slots["mode_slot_mi"], slots["mode_slot_nmi"] = mutual_information(
            np.histogram2d(  # (true mode, argmax slot) counts
                step_modes.cpu().numpy(),
                weights.argmax(-1).cpu().numpy(),
                (len(modes), args.num_abstractions),
                ((0, len(modes)), (0, args.num_abstractions)),
            )[0]
        )
        losses = (
            "value_loss",
            "policy_loss",
            "entropy",
            "old_approx_kl",
            "approx_kl",
            "clipfrac",
            "explained_variance",
            "grad_norm_ppo",
        )
        for key, value in {
            **stats,
            **slots,
        }.items():  # the replay checks under debug/, the slot terms and metrics under slots/
            group = "losses" if key in losses else "debug" if key.startswith("first_minibatch") else "slots"
            writer.add_scalar(f"{group}/{key}", value, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        if iteration % max(1, args.num_iterations // 50) == 0 or iteration == args.num_iterations:
            by_mode = " ".join(f"m{k} {np.mean(v):.0f}" if v else f"m{k} -" for k, v in recent_by_mode.items())
            print(
                f"iter {iteration}/{args.num_iterations} step {global_step} SPS {sps} "
                f"return {np.mean(recent or [np.nan]):.1f} | {by_mode} | "
                f"slot NMI {slots['mode_slot_nmi']:.2f}, episode NMI {slots['episode_nmi']:.2f}",
                flush=True,
            )

    if args.save_model:
        model_path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        # with the reward normaliser's state: the value head is in its units (tta_gating --online bootstraps with it)
        torch.save(
            {
                "script": SCRIPT,
                "format": CHECKPOINT_FORMAT,
                "args": dataclasses.asdict(args),
                "modes": modes,
                "run_name": run_name,
                "state_dict": agent.state_dict(),
                "reward_scaler": None
                if reward_scaler is None
                else {key: float(getattr(reward_scaler.return_rms, key)) for key in ("mean", "var", "count")},
            },
            model_path + ".tmp",
        )
        os.replace(model_path + ".tmp", model_path)  # written atomically: a killed run leaves no half-written model
        print(f"model saved to {model_path}")
        report = {
            "script": SCRIPT,
            "checkpoint": model_path,
            "episodes_per_mode": args.eval_episodes,
            "held_out_modes": held_out,
            "modes": [{"gravity": g, "half_length": length, "force_sign": s} for g, length, s in modes],
            "per_mode": {},
        }
        for kind, det in (("deterministic", True), ("sampled", False)):
            evaluation = evaluate(
                model_path,
                args.eval_episodes,
                deterministic=det,
                seed=args.seed + 100_000,
                video_dir=os.path.join(run_dir, "videos") if det and args.capture_video else None,
                device=device,
            )
            results = evaluation["returns"]
            for k, rets in results.items():
                report["per_mode"].setdefault(str(k), {})[kind] = {
                    "mean": float(np.mean(rets)),
                    "std": float(np.std(rets)),
                    "returns": rets.tolist(),
                }
                writer.add_scalar(f"eval/episodic_return_mode{k}_{kind}", np.mean(rets), global_step)
            for name, subset in (("mean", [k for k in results if k not in held_out]), ("held_out_mean", held_out)):
                if subset:  # training modes and held-out modes are reported apart
                    report[f"{kind}_{name}"] = float(np.mean([np.mean(results[k]) for k in subset]))
            report[f"slot_weights_{kind}"] = evaluation["slot_weights"].tolist()
            report[f"mode_slot_mi_{kind}"], report[f"mode_slot_nmi_{kind}"] = mutual_information(
                np.delete(evaluation["slot_counts"], held_out, 0)
            )
            report[f"slots_{kind}"] = evaluation["slots"]
            for key, value in evaluation["slots"].items():
                writer.add_scalar(f"slots/eval_{key}_{kind}", value, global_step)
        for k, per_kind in report["per_mode"].items():
            print(
                f"eval mode {k} ({args.eval_episodes} episodes): "
                + ", ".join(f"{kind} {r['mean']:.1f} ± {r['std']:.1f}" for kind, r in per_kind.items())
            )
        report["slot_heatmap"] = os.path.join(run_dir, "slot_heatmap.png")
        plot_slot_heatmap(
            np.array(report["slot_weights_deterministic"]),
            report["slot_heatmap"],
            f"{run_name}\nmean gate weight per mode (deterministic evaluation)",
        )
        print(
            "deterministic evaluation: mean gate weights per mode "
            f"{np.round(report['slot_weights_deterministic'], 2).tolist()}, "
            f"step NMI {report['mode_slot_nmi_deterministic']:.3f}, "
            + ", ".join(f"{key} {value:.3f}" for key, value in report["slots_deterministic"].items())
        )

        with open(os.path.join(run_dir, "eval.json.tmp"), "w") as f:
            json.dump(report, f, indent=1)
        os.replace(os.path.join(run_dir, "eval.json.tmp"), os.path.join(run_dir, "eval.json"))

    writer.close()
