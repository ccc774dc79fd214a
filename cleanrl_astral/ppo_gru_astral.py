"""ASTRAL: recurrent PPO whose GRU state is modulated by a bank of learnable abstraction slots.

The agent of ppo_gru_baseline.py (same NonStationaryCartPole, inputs, controls, flags, evaluation, resume
and logging) plus the ASTRAL plan's module: an `AbstractionBank` of K slots A ∈ R^{K×d}, a softmax gate
w_t = softmax(g(h_t)/τ) over them, z_t = w_tᵀA, and `FiLM` modulation h'_t = γ(z_t) ⊙ h_t + β(z_t). The
policy and value heads read only h'_t. Slot regularisers (per-sample weight entropy, load balancing,
orthogonality) are added to the PPO loss, with the gate weights recomputed from replayed sequences.

Usage: python cleanrl_astral/ppo_gru_astral.py --modes-preset seed3 --hide-velocity --save-model
"""
import dataclasses
import json
import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
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
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record one evaluation video per mode into `runs/{run_name}/videos` (needs --save-model)"""
    save_model: bool = False
    """save the model to `runs/{run_name}/{exp_name}.cleanrl_model`, then evaluate it"""
    runs_dir: str = "runs"
    """directory under which `{run_name}/` is written"""
    resume: Optional[str] = None
    """path of a `checkpoint.pt` to continue from (all other settings are the checkpoint's; a flag that disagrees is
    refused)"""
    checkpoint_every: int = 10
    """write `runs/{run_name}/checkpoint.pt` every this many updates (0 disables)"""
    eval_episodes: int = 10
    """evaluation episodes per mode, each for deterministic and for sampled actions"""
    torch_threads: int = 1
    """torch CPU threads (one is fastest for this small network)"""

    # Environment
    env_id: str = "NonStationaryCartPole"
    """name used in the run name"""
    modes_preset: str = "seed3"
    """physics modes: `seed3` (three gravity/length settings) or `inverted4` (seed3 plus inverted force)"""
    modes: Optional[str] = None
    """custom modes, overriding the preset: "g,l[,sign] g,l[,sign] ..." (gravity, pole half-length, force sign)"""
    hide_velocity: bool = False
    """observe only cart position and pole angle, so velocities must be inferred from memory"""
    fixed_mode: Optional[int] = None
    """always use this mode index instead of resampling it"""
    switch_prob: float = 0.0
    """per-step probability of resampling the mode in the middle of an episode"""
    memory: str = "gru"
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
    target_kl: Optional[float] = None
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
    tau: float = 1.0
    """temperature of the gate softmax"""
    lambda_w_ent: float = 0.001
    """weight of the per-sample gate entropy penalty (sharp gates)"""
    lambda_lb: float = 0.001
    """weight of the load-balancing bonus: entropy of the batch-mean gate weights (all slots used)"""
    lambda_orth: float = 0.0001
    """weight of the slot orthogonality penalty ||ÂÂᵀ - I||²_F on row-normalised slots"""

    batch_size: int = 0
    """the batch size (computed at runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed at runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed at runtime)"""


# ENVIRONMENT
# A mode is (gravity, pole half-length, force sign).
MODE_PRESETS = {
    "seed3": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0)],
    "inverted4": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0), (9.8, 0.5, -1.0)],
}


def parse_modes(spec: str) -> list:
    """Parse "g,l[,sign] g,l[,sign] ..." into a list of (gravity, half_length, force_sign)."""
    modes = []
    for item in spec.split():
        parts = item.split(",")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) not in (2, 3):
            raise ValueError(f"malformed mode {item!r} in --modes; write gravity,half_length[,force_sign] e.g. '9.8,0.5 7.5,0.7,-1'")
        gravity, half_length, sign = values[0], values[1], (values[2] if len(values) == 3 else 1.0)
        if not np.isfinite(gravity) or gravity <= 0 or not np.isfinite(half_length) or half_length <= 0:
            raise ValueError(f"mode {item!r} in --modes needs a positive gravity and a positive half-length")
        if sign not in (1.0, -1.0):
            raise ValueError(f"mode {item!r} in --modes has force sign {sign:g}; use 1 or -1")
        modes.append((gravity, half_length, sign))
    if not modes:
        raise ValueError("--modes is empty; give at least one mode such as '9.8,0.5'")
    return modes


def resolve_modes(modes_preset: str, modes: Optional[str]) -> list:
    if modes is not None:
        return parse_modes(modes)
    if modes_preset not in MODE_PRESETS:
        raise ValueError(f"unknown --modes-preset {modes_preset!r}; choose one of {', '.join(MODE_PRESETS)} or give --modes")
    return list(MODE_PRESETS[modes_preset])


class NonStationaryCartPole(gym.Wrapper):
    """CartPole-v1 whose hidden physics mode (gravity, pole half-length, force sign) is resampled at every
    episode start, and with probability `switch_prob` after any step. `info["mode"]` is for analysis only:
    it is the mode that governs the next step."""

    def __init__(self, env, modes, hide_velocity=False, fixed_mode=None, switch_prob=0.0):
        super().__init__(env)
        self.modes = [tuple(float(v) for v in m) for m in modes]
        self.hide_velocity = hide_velocity
        self.fixed_mode = fixed_mode
        self.switch_prob = switch_prob
        self.base_force_mag = abs(env.unwrapped.force_mag)
        self.mode_rng = np.random.default_rng()
        self.mode = 0
        if hide_velocity:
            high = env.observation_space.high[[0, 2]]
            self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def set_mode(self, k):
        self.mode = int(k)
        gravity, half_length, force_sign = self.modes[self.mode]
        cartpole = self.env.unwrapped
        cartpole.gravity = gravity
        cartpole.length = half_length
        # CartPole caches this product; it must follow the length or the dynamics mix two poles
        cartpole.polemass_length = cartpole.masspole * half_length
        cartpole.force_mag = force_sign * self.base_force_mag

    def sample_mode(self):
        if self.fixed_mode is not None:
            return self.fixed_mode
        return int(self.mode_rng.integers(len(self.modes)))

    def observe(self, obs):
        return obs[[0, 2]] if self.hide_velocity else obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            # a stream of its own, so the mode sequence does not shift CartPole's initial states
            self.mode_rng = np.random.default_rng([seed, 1])
        obs, info = self.env.reset(seed=seed, options=options)
        self.set_mode(self.sample_mode())
        info["mode"] = self.mode
        return self.observe(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.switch_prob > 0 and self.mode_rng.random() < self.switch_prob:
            self.set_mode(self.sample_mode())
        info["mode"] = self.mode
        return self.observe(obs), reward, terminated, truncated, info


def make_env(modes, hide_velocity=False, fixed_mode=None, switch_prob=0.0, render_mode=None):
    def thunk():
        env = gym.make("CartPole-v1", render_mode=render_mode)
        return NonStationaryCartPole(env, modes, hide_velocity, fixed_mode, switch_prob)

    return thunk


def make_vector_env(num_envs, modes, hide_velocity=False, fixed_mode=None, switch_prob=0.0):
    # SAME_STEP autoreset: the obs returned at a done step is already the next episode's first obs and the
    # ended episode lives in infos["final_obs"/"final_info"], so no fake reset transition enters the batch
    return gym.vector.SyncVectorEnv(
        [make_env(modes, hide_velocity, fixed_mode, switch_prob) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


# MODEL
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class AbstractionBank(nn.Module):
    """K learnable slots and a gate over them: w = softmax(g(h) / τ), z = wᵀA."""

    def __init__(self, hidden_size, num_abstractions, slot_dim, tau):
        super().__init__()
        self.slots = nn.Parameter(torch.randn(num_abstractions, slot_dim) * 0.02)
        # small final layer: the gate starts near uniform, so no slot wins by initialisation
        self.gate = nn.Sequential(
            layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, num_abstractions), std=0.01)
        )
        self.tau = tau

    def forward(self, h, weights=None):
        """Returns (z, w). `weights` overrides the gate (e.g. a one-hot to clamp one slot)."""
        if weights is None:
            weights = torch.softmax(self.gate(h) / self.tau, dim=-1)
        return weights @ self.slots, weights


class FiLM(nn.Module):
    """h' = γ ⊙ h + β with (γ, β) = f(z); γ = 1 + f_γ(z), so a zero z leaves h unchanged."""

    def __init__(self, slot_dim, hidden_size):
        super().__init__()
        self.net = layer_init(nn.Linear(slot_dim, 2 * hidden_size), std=1.0)

    def forward(self, h, z):
        gamma_delta, beta = self.net(z).chunk(2, dim=-1)
        return (1.0 + gamma_delta) * h + beta


class Agent(nn.Module):
    def __init__(self, obs_dim, num_actions, num_modes, hidden_size=128, memory="gru", oracle=False,
                 num_abstractions=3, slot_dim=32, tau=1.0):
        super().__init__()
        self.obs_dim, self.num_actions, self.num_modes = obs_dim, num_actions, num_modes
        self.memory, self.oracle = memory, oracle
        self.input_dim = obs_dim + num_actions + 1 + (num_modes if oracle else 0)
        self.encoder = nn.Sequential(layer_init(nn.Linear(self.input_dim, hidden_size)), nn.Tanh())
        self.gru = nn.GRUCell(hidden_size, hidden_size)
        for name, param in self.gru.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.bank = AbstractionBank(hidden_size, num_abstractions, slot_dim, tau)
        self.film = FiLM(slot_dim, hidden_size)
        self.actor = nn.Sequential(
            layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, num_actions), std=0.01)
        )
        self.critic = nn.Sequential(layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0))
        self.hidden_size = hidden_size

    def initial_state(self, batch_size, device="cpu"):
        return torch.zeros(batch_size, self.hidden_size, device=device)

    def build_input(self, obs, prev_action, prev_reward, mode):
        """obs (..., obs_dim), prev_action (...) with -1 for "none", prev_reward (...), mode (...) -> input."""
        prev_onehot = torch.nn.functional.one_hot((prev_action + 1).long(), self.num_actions + 1)[..., 1:].float()
        parts = [obs.float(), prev_onehot, prev_reward.float().unsqueeze(-1)]
        if self.oracle:
            parts.append(torch.nn.functional.one_hot(mode.long(), self.num_modes).float())
        return torch.cat(parts, dim=-1)

    def unroll(self, x, state, starts):
        """x (T, B, input_dim), state (B, H) before x[0], starts (T, B) = 1 where x[t] opens an episode.
        Returns the GRU states h (T, B, H) and the state after x[T-1]."""
        features = self.encoder(x)
        if self.memory == "none":
            keep = torch.zeros_like(starts)
        else:
            keep = 1.0 - starts
        hidden = []
        # the GRUCell's own op without the module-call overhead (same numbers, ~4% off a training run)
        gru_weights = (self.gru.weight_ih, self.gru.weight_hh, self.gru.bias_ih, self.gru.bias_hh)
        # unbind, not features[t]: indexing makes backward zero-fill a full (T, B, H) gradient at every step
        for feature_t, keep_t in zip(features.unbind(0), keep.unbind(0)):
            # zero the state where the episode restarted: x[t] is a first step
            state = torch.gru_cell(feature_t, state * keep_t.unsqueeze(-1), *gru_weights)
            hidden.append(state)
        return torch.stack(hidden), state

    def modulate(self, hidden, weights=None):
        """h -> (h', w): the heads' only input is the FiLM-modulated state, there is no bypass from h."""
        z, weights = self.bank(hidden, weights)
        return self.film(hidden, z), weights

    def get_value(self, x, state, starts):
        hidden, _ = self.unroll(x, state, starts)
        return self.critic(self.modulate(hidden)[0]).squeeze(-1)

    def get_action_and_value(self, x, state, starts, action=None, deterministic=False, weights=None):
        """Returns action, log-prob, entropy, value, final state and the gate weights (T, B, K)."""
        hidden, state = self.unroll(x, state, starts)
        modulated, weights = self.modulate(hidden, weights)
        logits = self.actor(modulated)
        probs = Categorical(logits=logits)
        if action is None:
            action = logits.argmax(-1) if deterministic else probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(modulated).squeeze(-1), state, weights


# SLOT REGULARISERS AND METRICS
def weight_entropy(weights):
    """Mean per-sample entropy of the gate weights (..., K); penalised so each step commits to a slot."""
    return -(weights * torch.log(weights + 1e-8)).sum(-1).mean()


def load_balance_entropy(weights):
    """Entropy of the batch-mean gate weights; rewarded so that every slot is used somewhere."""
    usage = weights.reshape(-1, weights.shape[-1]).mean(0)
    return -(usage * torch.log(usage + 1e-8)).sum()


def orthogonality_penalty(slots):
    """||ÂÂᵀ - I||²_F with Â the row-normalised slots: 0 for orthonormal directions."""
    normed = slots / (slots.norm(dim=-1, keepdim=True) + 1e-8)
    gram = normed @ normed.T
    return ((gram - torch.eye(len(slots), device=slots.device)) ** 2).sum()


def mode_slot_counts(modes, slots, num_modes, num_slots):
    """Joint count matrix of (true mode, argmax slot) over paired samples."""
    counts = np.zeros((num_modes, num_slots))
    np.add.at(counts, (np.asarray(modes, dtype=int), np.asarray(slots, dtype=int)), 1.0)
    return counts


def mutual_information(counts):
    """I(mode; slot) in nats from a joint count matrix, and the same divided by H(mode) (0 if H(mode) = 0)."""
    joint = counts / counts.sum()
    p_mode, p_slot = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    mi = float((joint[nz] * np.log(joint[nz] / (p_mode @ p_slot)[nz])).sum())
    h_mode = float(-(p_mode[p_mode > 0] * np.log(p_mode[p_mode > 0])).sum())
    return mi, (mi / h_mode if h_mode > 0 else 0.0)


class RewardScaler:
    """Divides rewards by the running std of each environment's discounted return (as gymnasium's
    NormalizeReward), keeping the value targets O(1) for the shared trunk."""

    def __init__(self, num_envs, gamma, epsilon=1e-8):
        self.gamma, self.epsilon = gamma, epsilon
        self.returns = np.zeros(num_envs)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, rewards, dones):
        self.returns = self.returns * self.gamma + rewards
        batch_mean, batch_var, n = self.returns.mean(), self.returns.var(), len(self.returns)
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total
        self.returns[dones] = 0.0
        return rewards / np.sqrt(self.var + self.epsilon)

    def state_dict(self):
        return {"mean": float(self.mean), "var": float(self.var), "count": float(self.count)}

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


# ROLLOUT / GAE / UPDATE
def new_carry(envs, agent, seed, device):
    """The state the rollout carries from one iteration to the next."""
    obs, infos = envs.reset(seed=seed)
    n = envs.num_envs
    return {
        "obs": obs,
        "start": np.ones(n, dtype=bool),
        "state": agent.initial_state(n, device),
        "prev_action": np.full(n, -1),
        "prev_reward": np.zeros(n),
        "mode": np.asarray(infos["mode"]),
        "episode_mode": np.asarray(infos["mode"]).copy(),
        "episode_return": np.zeros(n),
        "episode_length": np.zeros(n, dtype=int),
    }


def carry_input(agent, carry, device):
    """The agent's input for the carried observation, previous action/reward and mode."""
    return agent.build_input(
        torch.as_tensor(carry["obs"], device=device), torch.as_tensor(carry["prev_action"], device=device),
        torch.as_tensor(carry["prev_reward"], device=device), torch.as_tensor(carry["mode"], device=device),
    )


def collect_rollout(agent, envs, carry, num_steps, gamma, reward_scaler, device):
    """Runs `num_steps` steps in every env. Returns the batch (tensors shaped (T, N, ...)), the GRU state
    it started from, and the finished episodes as (return, length, mode, index of the rollout step it ended in).
    The batch also keeps the gate weights acted with and the true mode of each step, for the slot metrics only."""
    n = envs.num_envs
    batch = {
        "inputs": torch.zeros(num_steps, n, agent.input_dim, device=device),
        "starts": torch.zeros(num_steps, n, device=device),
        "actions": torch.zeros(num_steps, n, dtype=torch.long, device=device),
        "logprobs": torch.zeros(num_steps, n, device=device),
        "values": torch.zeros(num_steps, n, device=device),
        "rewards": torch.zeros(num_steps, n, device=device),
        "raw_rewards": torch.zeros(num_steps, n, device=device),
        "weights": torch.zeros(num_steps, n, agent.bank.slots.shape[0], device=device),
        "modes": torch.zeros(num_steps, n, dtype=torch.long, device=device),
    }
    initial_state = carry["state"].clone()
    episodes = []
    state = carry["state"]
    for step in range(num_steps):
        x = carry_input(agent, carry, device)
        start = torch.as_tensor(carry["start"], dtype=torch.float32, device=device)
        with torch.no_grad():
            action, logprob, _, value, state, weights = agent.get_action_and_value(x[None], state, start[None])
        action_np = action[0].cpu().numpy()
        batch["weights"][step], batch["modes"][step] = weights[0], torch.as_tensor(carry["mode"], device=device)
        obs, reward, terminated, truncated, infos = envs.step(action_np)
        done = terminated | truncated
        scaled = reward_scaler(reward, done) if reward_scaler is not None else reward.astype(np.float64)
        batch["inputs"][step], batch["starts"][step] = x, start
        batch["actions"][step], batch["logprobs"][step], batch["values"][step] = action[0], logprob[0], value[0]
        batch["raw_rewards"][step] = torch.as_tensor(reward, device=device)

        # a time-limit truncation is not a failure: bootstrap from the value of the true final observation
        cut = np.flatnonzero(truncated & ~terminated)
        if len(cut):
            final_obs = torch.as_tensor(np.stack(infos["final_obs"][cut]), device=device)
            final_mode = torch.as_tensor(infos["final_info"]["mode"][cut], device=device)
            xf = agent.build_input(
                final_obs, action[0][cut], torch.as_tensor(reward[cut], device=device), final_mode
            )
            with torch.no_grad():
                vf = agent.get_value(xf[None], state[cut], torch.zeros(1, len(cut), device=device))[0]
            scaled = scaled.copy()
            scaled[cut] += gamma * vf.cpu().numpy()
        batch["rewards"][step] = torch.as_tensor(scaled, dtype=torch.float32, device=device)

        carry["episode_return"] += reward
        carry["episode_length"] += 1
        for i in np.flatnonzero(done):
            episodes.append((float(carry["episode_return"][i]), int(carry["episode_length"][i]), int(carry["episode_mode"][i]), step))
        carry["episode_return"][done] = 0.0
        carry["episode_length"][done] = 0
        mode = np.asarray(infos["mode"])
        carry["episode_mode"][done] = mode[done]
        # previous action / reward are "none" at an episode's first step
        carry["prev_action"] = np.where(done, -1, action_np)
        carry["prev_reward"] = np.where(done, 0.0, reward)
        carry["obs"], carry["start"], carry["mode"] = obs, done, mode
    carry["state"] = state
    return batch, initial_state, episodes


def compute_gae(rewards, values, starts, next_value, next_start, gamma, gae_lambda):
    """GAE over (T, N) tensors. starts[t] = 1 where step t opens an episode, so step t-1 ended one and must
    not bootstrap from step t (truncations were already bootstrapped into their reward)."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal, nextvalues = 1.0 - next_start, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - starts[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values


def ppo_update(agent, optimizer, batch, initial_state, advantages, returns, args):
    """PPO epochs over minibatches of whole environments. Each minibatch replays its sequences from the
    state saved at the start of the rollout, so log-probs and gate weights are re-computed exactly as they
    were acted; the slot regularisers use those replayed gate weights."""
    num_envs = batch["inputs"].shape[1]
    envs_per_minibatch = num_envs // args.num_minibatches
    env_indices = np.arange(num_envs)
    clipfracs, stats = [], {}
    for epoch in range(args.update_epochs):
        np.random.shuffle(env_indices)
        for start in range(0, num_envs, envs_per_minibatch):
            mb = env_indices[start : start + envs_per_minibatch]
            _, newlogprob, entropy, newvalue, _, weights = agent.get_action_and_value(
                batch["inputs"][:, mb], initial_state[mb], batch["starts"][:, mb], batch["actions"][:, mb]
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
            w_ent, lb_ent, orth = weight_entropy(weights), load_balance_entropy(weights), orthogonality_penalty(agent.bank.slots)
            slot_loss = args.lambda_w_ent * w_ent - args.lambda_lb * lb_ent + args.lambda_orth * orth
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef + slot_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()

        if args.target_kl is not None and approx_kl > args.target_kl:
            break

    y_pred, y_true = batch["values"].flatten().cpu().numpy(), returns.flatten().cpu().numpy()
    var_y = np.var(y_true)
    stats.update(
        value_loss=v_loss.item(), policy_loss=pg_loss.item(), entropy=entropy_loss.item(),
        old_approx_kl=old_approx_kl.item(), approx_kl=approx_kl.item(), clipfrac=float(np.mean(clipfracs)),
        explained_variance=float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y),
        weight_entropy=w_ent.item(), load_balance_entropy=lb_ent.item(), orthogonality=orth.item(),
        slot_loss=slot_loss.item(),
    )
    return stats


# CHECKPOINTS / EVALUATION
def atomic_save(obj, path):
    """torch.save to a temporary file, then rename: a killed run never leaves a half-written file."""
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    """Loads a file written by this script, or raises ValueError saying why it cannot be used."""
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path!r} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"checkpoint {path!r} is not a readable torch file ({type(e).__name__})")
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT:
        found = ckpt.get("script") if isinstance(ckpt, dict) else None
        raise ValueError(f"checkpoint {path!r} was written by {found or 'another program'}, not {SCRIPT}.py")
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path!r} has format {ckpt.get('format')}, this script reads format {CHECKPOINT_FORMAT}")
    return ckpt


def agent_from_args(args, num_modes):
    obs_dim = 2 if args.hide_velocity else 4
    return Agent(obs_dim, 2, num_modes, args.hidden_size, args.memory, args.oracle,
                 args.num_abstractions, args.slot_dim, args.tau)


def evaluate(model_path, episodes_per_mode=10, modes=None, deterministic=True, seed=0, video_dir=None, device="cpu"):
    """Runs `episodes_per_mode` episodes in each mode of `modes` (default: the training modes; any physics
    works, unseen ones included) with the saved agent. Returns {"returns": {mode index: array of returns},
    "slot_weights": mode × slot mean gate weights over every step of those episodes, "slot_counts": mode × slot
    counts of the argmax slot}."""
    ckpt = load_checkpoint(model_path)
    train_args = Args(**ckpt["args"])
    train_modes = [tuple(m) for m in ckpt["modes"]]
    modes = train_modes if modes is None else [tuple(float(v) for v in m) for m in modes]
    if train_args.oracle and len(modes) != len(train_modes):
        raise ValueError(f"an --oracle agent knows {len(train_modes)} mode indices; it cannot be evaluated on {len(modes)} modes")
    agent = agent_from_args(train_args, len(train_modes)).to(device)
    agent.load_state_dict(ckpt["state_dict"])
    agent.eval()
    num_slots = train_args.num_abstractions
    results, slot_weights, slot_counts = {}, np.zeros((len(modes), num_slots)), np.zeros((len(modes), num_slots))
    for k in range(len(modes)):
        weight_sum = np.zeros(num_slots)
        envs = make_vector_env(episodes_per_mode, modes, train_args.hide_velocity, fixed_mode=k)
        carry = new_carry(envs, agent, seed + 1000 * k, device)
        returns, finished = np.zeros(episodes_per_mode), np.zeros(episodes_per_mode, dtype=bool)
        state = carry["state"]
        while not finished.all():
            x = carry_input(agent, carry, device)
            start = torch.as_tensor(carry["start"], dtype=torch.float32, device=device)
            with torch.no_grad():
                action, _, _, _, state, weights = agent.get_action_and_value(x[None], state, start[None], deterministic=deterministic)
            action_np = action[0].cpu().numpy()
            active = weights[0][torch.as_tensor(~finished)].cpu().numpy()
            weight_sum += active.sum(0)
            slot_counts[k] += np.bincount(active.argmax(-1), minlength=num_slots)
            obs, reward, terminated, truncated, infos = envs.step(action_np)
            returns += reward * ~finished
            done = terminated | truncated
            finished |= done
            carry["prev_action"], carry["prev_reward"] = np.where(done, -1, action_np), np.where(done, 0.0, reward)
            carry["obs"], carry["start"], carry["mode"] = obs, done, np.asarray(infos["mode"])
        envs.close()
        results[k], slot_weights[k] = returns, weight_sum / slot_counts[k].sum()
        if video_dir is not None:
            record_episode(agent, modes, train_args.hide_velocity, k, video_dir, seed, device)
    return {"returns": results, "slot_weights": slot_weights, "slot_counts": slot_counts}


def plot_slot_heatmap(slot_weights, path, title):
    """Annotated mode × slot heatmap of mean gate weights, saved as PNG."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + 0.9 * slot_weights.shape[1]), 1.4 + 0.6 * slot_weights.shape[0]))
    im = ax.imshow(slot_weights, cmap="viridis", vmin=0.0, vmax=1.0)
    for (i, j), v in np.ndenumerate(slot_weights):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=9)
    ax.set_xticks(range(slot_weights.shape[1]), [f"slot {j}" for j in range(slot_weights.shape[1])])
    ax.set_yticks(range(slot_weights.shape[0]), [f"mode {i}" for i in range(slot_weights.shape[0])])
    ax.set_title(title, fontsize=7)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def record_episode(agent, modes, hide_velocity, k, video_dir, seed, device):
    """One deterministic episode of mode k, saved as video_dir/mode{k}-episode-0.mp4."""
    env = make_env(modes, hide_velocity, fixed_mode=k, render_mode="rgb_array")()
    env = gym.wrappers.RecordVideo(env, video_dir, name_prefix=f"mode{k}", episode_trigger=lambda e: True)
    obs, info = env.reset(seed=seed)
    state, prev_action, prev_reward, start, done = agent.initial_state(1, device), -1, 0.0, 1.0, False
    while not done:
        x = agent.build_input(
            torch.as_tensor(obs[None], device=device), torch.tensor([prev_action]), torch.tensor([prev_reward]),
            torch.tensor([info["mode"]]),
        )
        with torch.no_grad():
            action, _, _, _, state, _ = agent.get_action_and_value(x[None], state, torch.tensor([[start]]), deterministic=True)
        prev_action = int(action[0, 0])
        obs, prev_reward, terminated, truncated, info = env.step(prev_action)
        start, done = 0.0, terminated or truncated
    env.close()


def claim_run_dir(runs_dir: str, run_name: str) -> tuple[str, str]:
    """Create a new run directory and return (run_name, run_dir).

    Runs with the same name started in the same second (a shell loop over flags with one seed) would otherwise share
    one directory, mixing their TensorBoard events and overwriting each other's checkpoints and eval.json. os.mkdir is
    atomic, so each run gets a directory of its own: a name already taken gets the suffix __2, __3, ... An unusable
    --runs-dir (a file, not writable) is a one-line error.
    """
    try:
        os.makedirs(runs_dir, exist_ok=True)
        suffix = 1
        while True:
            name = run_name if suffix == 1 else f"{run_name}__{suffix}"
            try:
                os.mkdir(os.path.join(runs_dir, name))
                return name, os.path.join(runs_dir, name)
            except FileExistsError:
                suffix += 1
    except OSError as e:  # --runs-dir itself is unusable: a file, not writable, ...
        reason = "not a directory" if os.path.exists(runs_dir) and not os.path.isdir(runs_dir) else e.strerror
        fail(f"cannot create a run directory in --runs-dir {runs_dir!r} ({reason}); pass a writable directory")


def flags_given(argv):
    """Args field names of the flags on a command line: --name, --name=value, and --no-name for a boolean."""
    fields = {f.name for f in dataclasses.fields(Args)}
    names = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            names.add(name[3:] if name.startswith("no_") and name[3:] in fields else name)
    return names


def fail(message):
    print(f"{SCRIPT}.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args):
    """Every check that can fail before training starts; returns the resolved modes."""
    # NaN and inf pass every `x <= 0` check below and reach the optimizer or the loss: refused first
    for field in dataclasses.fields(Args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{field.name.replace('_', '-')} {value} must be a finite number")
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed {args.seed} must be in [0, 2**32 - 1] (the range numpy and gymnasium accept)")
    # the name becomes part of a directory name and of the model file's name: a '/' makes the save fail after training
    if not args.exp_name.strip() or "/" in args.exp_name:
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    if not 0.0 < args.gamma <= 1.0 or not 0.0 <= args.gae_lambda <= 1.0:
        raise ValueError(f"--gamma {args.gamma} must be in (0, 1] and --gae-lambda {args.gae_lambda} in [0, 1]")
    for name in ("clip_coef", "max_grad_norm"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be positive")
    for name in ("ent_coef", "vf_coef"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be non-negative")
    if args.target_kl is not None and args.target_kl <= 0:
        raise ValueError(f"--target-kl {args.target_kl} must be positive (leave it out to disable early stopping)")
    modes = resolve_modes(args.modes_preset, args.modes)
    if args.fixed_mode is not None and not 0 <= args.fixed_mode < len(modes):
        raise ValueError(f"--fixed-mode {args.fixed_mode} is out of range; there are {len(modes)} modes (0..{len(modes) - 1})")
    if args.memory not in ("gru", "none"):
        raise ValueError(f"unknown --memory {args.memory!r}; choose gru or none")
    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "hidden_size", "eval_episodes", "torch_threads",
                 "num_abstractions", "slot_dim"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.num_envs % args.num_minibatches != 0:
        raise ValueError(
            f"--num-envs {args.num_envs} is not divisible by --num-minibatches {args.num_minibatches}; "
            "minibatches hold whole environments' sequences"
        )
    if args.norm_adv and args.num_envs // args.num_minibatches * args.num_steps < 2:
        raise ValueError("a minibatch of one step cannot normalise its advantages (their std is undefined); "
                         "raise --num-steps or --num-envs, or lower --num-minibatches")
    if not 0.0 <= args.switch_prob <= 1.0:
        raise ValueError(f"--switch-prob {args.switch_prob} must be in [0, 1]")
    if args.checkpoint_every < 0:
        raise ValueError("--checkpoint-every must be 0 (off) or positive")
    if args.learning_rate <= 0:
        raise ValueError("--learning-rate must be positive")
    if args.total_timesteps < args.num_envs * args.num_steps:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one rollout "
            f"(--num-envs x --num-steps = {args.num_envs * args.num_steps})"
        )
    if args.capture_video and not args.save_model:
        raise ValueError("--capture-video records evaluation episodes; add --save-model")
    if not args.tau > 0:
        raise ValueError(f"--tau {args.tau} must be positive (it divides the gate logits)")
    for name in ("lambda_w_ent", "lambda_lb", "lambda_orth"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be non-negative")
    # sizes that cannot fit fail here, not as a MemoryError once the run directory exists. Both figures are lower
    # bounds: weights, gradients and Adam's two moments (16 bytes a parameter), and the rollout's inputs
    with torch.device("meta"):  # shapes only, no memory
        agent = agent_from_args(args, len(modes))
    params = sum(p.numel() for p in agent.parameters())
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if 16 * params > ram:
        raise ValueError(f"the agent would have {params:,} parameters, {16 * params / 2**30:,.0f} GiB with gradients "
                         f"and Adam state, more than this machine's {ram / 2**30:.0f} GiB:"
                         " reduce --hidden-size, --num-abstractions or --slot-dim")
    if 4 * args.num_steps * args.num_envs * agent.input_dim > ram:
        raise ValueError(f"a rollout of --num-steps {args.num_steps} x --num-envs {args.num_envs} needs more than this "
                         f"machine's {ram / 2**30:.0f} GiB: reduce them")
    # the update replays a minibatch's sequences with autograd, which keeps at least the recurrent state of every step
    envs_per_minibatch = args.num_envs // args.num_minibatches
    if 4 * args.num_steps * envs_per_minibatch * args.hidden_size > ram:
        raise ValueError(f"replaying a minibatch of --num-steps {args.num_steps} x {envs_per_minibatch} envs x "
                         f"--hidden-size {args.hidden_size} needs more than this machine's {ram / 2**30:.0f} GiB: "
                         "raise --num-minibatches or reduce them")
    return modes


if __name__ == "__main__":
    args = tyro.cli(Args)
    ckpt = None
    if args.resume is not None:
        try:
            ckpt = load_checkpoint(args.resume)
        except ValueError as e:
            fail(f"cannot resume: {e}")
        if "optimizer" not in ckpt:
            fail(f"cannot resume: {args.resume!r} is a saved model, not a training checkpoint; resume from the run's "
                 "checkpoint.pt (written every --checkpoint-every updates)")
        # the checkpoint's settings define the resumed run; a flag given beside --resume that disagrees with them
        # would otherwise be dropped without a word
        for name in sorted(flags_given(sys.argv[1:]) - {"resume"}):
            if name in ckpt["args"] and getattr(args, name) != ckpt["args"][name]:
                fail(f"a resumed run keeps its checkpoint's settings: --{name.replace('_', '-')} "
                     f"{getattr(args, name)!r} differs from the checkpoint's {ckpt['args'][name]!r}; drop the flag")
        args = Args(**{**ckpt["args"], "resume": args.resume})
    try:
        modes = validate(args)
    except ValueError as e:
        fail(str(e))
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    if ckpt is not None:
        run_name = ckpt["run_name"]
        run_dir = os.path.dirname(os.path.abspath(args.resume))
    else:
        run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        run_name, run_dir = claim_run_dir(args.runs_dir, run_name)
    if ckpt is not None and ckpt["iteration"] >= args.num_iterations and (
            not args.save_model or os.path.isfile(os.path.join(run_dir, "eval.json"))):
        # resuming a finished run would only evaluate it again and log every eval scalar a second time
        fail(f"nothing to resume: {args.resume!r} is the final checkpoint of a run that finished "
             f"(all {args.num_iterations} updates{' and its eval.json' if args.save_model else ''}); start a new run")

    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=vars(args),
            name=run_name, id=run_name, resume="allow", dir=run_dir, save_code=True,
        )
    # a resumed run appends to the killed run's directory; purge_step makes TensorBoard drop what the killed run
    # logged after its last checkpoint (an update it never finished), so every update is logged exactly once
    writer = SummaryWriter(run_dir, purge_step=None if ckpt is None else ckpt["global_step"] + 1)
    writer.add_text(
        "hyperparameters", "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
    )

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = make_vector_env(args.num_envs, modes, args.hide_velocity, args.fixed_mode, args.switch_prob)
    agent = agent_from_args(args, len(modes)).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    reward_scaler = RewardScaler(args.num_envs, args.gamma) if args.norm_reward else None
    global_step, first_iteration, env_seed = 0, 1, args.seed
    if ckpt is not None:
        agent.load_state_dict(ckpt["state_dict"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if reward_scaler is not None:
            reward_scaler.load_state_dict(ckpt["reward_scaler"])
        global_step, first_iteration = ckpt["global_step"], ckpt["iteration"] + 1
        random.setstate((ckpt["rng"]["python"][0], tuple(ckpt["rng"]["python"][1]), ckpt["rng"]["python"][2]))
        np_state = ckpt["rng"]["numpy"]
        np.random.set_state((np_state[0], np_state[1].numpy().astype(np.uint32), *np_state[2:]))
        torch.set_rng_state(ckpt["rng"]["torch"])
        # the episodes in flight when the run was killed are lost; finished updates are not
        env_seed = args.seed + 7919 * ckpt["iteration"]
        print(f"resumed {run_name} at iteration {ckpt['iteration']} (global step {global_step})")
    carry = new_carry(envs, agent, env_seed, device)

    recent = deque(maxlen=100)
    recent_by_mode = {k: deque(maxlen=100) for k in range(len(modes))}
    print_every = max(1, args.num_iterations // 50)
    start_time, start_step = time.time(), global_step
    for iteration in range(first_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # ROLLOUT
        batch, initial_state, episodes = collect_rollout(agent, envs, carry, args.num_steps, args.gamma, reward_scaler, device)
        for ep_return, ep_length, ep_mode, ep_end in episodes:
            recent.append(ep_return)
            recent_by_mode[ep_mode].append(ep_return)
            # logged at the global step where the episode ended (CleanRL's convention): every log of an update
            # lies in (previous global_step, global_step], which is what a resumed run's purge_step relies on
            end_step = global_step + (ep_end + 1) * args.num_envs
            writer.add_scalar("charts/episodic_return", ep_return, end_step)
            writer.add_scalar("charts/episodic_length", ep_length, end_step)
            writer.add_scalar(f"charts/episodic_return_mode{ep_mode}", ep_return, end_step)
        global_step += args.batch_size

        # ADVANTAGES (GAE)
        with torch.no_grad():
            x = carry_input(agent, carry, device)
            next_start = torch.as_tensor(carry["start"], dtype=torch.float32, device=device)
            next_value = agent.get_value(x[None], carry["state"], next_start[None])[0]
            advantages, returns = compute_gae(
                batch["rewards"], batch["values"], batch["starts"], next_value, next_start, args.gamma, args.gae_lambda
            )

        # UPDATE
        stats = ppo_update(agent, optimizer, batch, initial_state, advantages, returns, args)

        # LOGGING
        sps = int((global_step - start_step) / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "explained_variance"):
            writer.add_scalar(f"losses/{key}", stats[key], global_step)
        writer.add_scalar("debug/first_minibatch_ratio_error", stats["first_minibatch_ratio_error"], global_step)
        writer.add_scalar("debug/first_minibatch_gate_error", stats["first_minibatch_gate_error"], global_step)
        for key in ("weight_entropy", "load_balance_entropy", "orthogonality", "slot_loss"):
            writer.add_scalar(f"slots/{key}", stats[key], global_step)
        # slot usage from the weights the agent acted with, split by the (hidden) true mode
        weights, step_modes = batch["weights"].reshape(-1, args.num_abstractions), batch["modes"].flatten()
        for k, usage in enumerate(weights.mean(0).tolist()):
            writer.add_scalar(f"slots/usage_w{k}", usage, global_step)
        for mode in range(len(modes)):
            in_mode = step_modes == mode
            if in_mode.any():
                for k, w in enumerate(weights[in_mode].mean(0).tolist()):
                    writer.add_scalar(f"slots/mode{mode}_w{k}", w, global_step)
        mi, nmi = mutual_information(
            mode_slot_counts(step_modes.cpu().numpy(), weights.argmax(-1).cpu().numpy(), len(modes), args.num_abstractions)
        )
        writer.add_scalar("slots/mode_slot_mi", mi, global_step)
        writer.add_scalar("slots/mode_slot_nmi", nmi, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        if iteration % print_every == 0 or iteration == args.num_iterations:
            by_mode = " ".join(
                f"m{k} {np.mean(v):.0f}" if v else f"m{k} -" for k, v in recent_by_mode.items()
            )
            mean_recent = f"{np.mean(recent):.1f}" if recent else "-"
            print(f"iter {iteration}/{args.num_iterations} step {global_step} SPS {sps} return {mean_recent} | {by_mode} | slot NMI {nmi:.2f}", flush=True)

        if args.checkpoint_every and (iteration % args.checkpoint_every == 0 or iteration == args.num_iterations):
            writer.flush()  # the logs of every update the checkpoint claims reach disk first: a kill loses none
            py_state = random.getstate()
            np_state = np.random.get_state()
            atomic_save(
                {
                    "script": SCRIPT, "format": CHECKPOINT_FORMAT, "args": dataclasses.asdict(args), "modes": modes,
                    "run_name": run_name, "state_dict": agent.state_dict(), "optimizer": optimizer.state_dict(),
                    "reward_scaler": reward_scaler.state_dict() if reward_scaler is not None else None,
                    "global_step": global_step, "iteration": iteration,
                    "rng": {
                        "python": [py_state[0], list(py_state[1]), py_state[2]],
                        "numpy": [np_state[0], torch.as_tensor(np_state[1].astype(np.int64)), *np_state[2:]],
                        "torch": torch.get_rng_state(),
                    },
                },
                os.path.join(run_dir, "checkpoint.pt"),
            )
    envs.close()

    if args.save_model:
        model_path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        atomic_save(
            # the reward normaliser's state: the value head is in its units (tta_gating --online bootstraps with it)
            {"script": SCRIPT, "format": CHECKPOINT_FORMAT, "args": dataclasses.asdict(args), "modes": modes,
             "run_name": run_name, "state_dict": agent.state_dict(),
             "reward_scaler": reward_scaler.state_dict() if reward_scaler is not None else None},
            model_path,
        )
        print(f"model saved to {model_path}")
        video_dir = os.path.join(run_dir, "videos") if args.capture_video else None
        report = {"script": SCRIPT, "checkpoint": model_path, "episodes_per_mode": args.eval_episodes,
                  "modes": [{"gravity": g, "half_length": l, "force_sign": s} for g, l, s in modes], "per_mode": {}}
        for kind, det in (("deterministic", True), ("sampled", False)):
            evaluation = evaluate(model_path, args.eval_episodes, deterministic=det, seed=args.seed + 100_000,
                                  video_dir=video_dir if det else None, device=device)
            results = evaluation["returns"]
            for k, rets in results.items():
                report["per_mode"].setdefault(str(k), {})[kind] = {"mean": float(np.mean(rets)), "std": float(np.std(rets)), "returns": rets.tolist()}
            report[f"{kind}_mean"] = float(np.mean([np.mean(r) for r in results.values()]))
            report[f"slot_weights_{kind}"] = evaluation["slot_weights"].tolist()
            report[f"mode_slot_mi_{kind}"], report[f"mode_slot_nmi_{kind}"] = mutual_information(evaluation["slot_counts"])
        print(f"evaluation over {args.eval_episodes} episodes per mode (mean ± std):")
        print("mode  gravity  half_len  sign  deterministic    sampled          mean gate weights (deterministic)")
        for k, (g, l, s) in enumerate(modes):
            d, s_ = report["per_mode"][str(k)]["deterministic"], report["per_mode"][str(k)]["sampled"]
            w = " ".join(f"{v:.2f}" for v in report["slot_weights_deterministic"][k])
            print(f"{k:>4}  {g:7.2f}  {l:8.2f}  {s:+4.0f}  {d['mean']:6.1f} ± {d['std']:5.1f}  {s_['mean']:6.1f} ± {s_['std']:5.1f}  {w}")
        heatmap = os.path.join(run_dir, "slot_heatmap.png")
        plot_slot_heatmap(np.array(report["slot_weights_deterministic"]), heatmap,
                          f"{run_name}\nmean gate weight per mode (deterministic evaluation)")
        report["slot_heatmap"] = heatmap
        print(f"I(mode; argmax slot) normalised by H(mode): {report['mode_slot_nmi_deterministic']:.3f} (deterministic evaluation)")
        # logged only now, beside eval.json: a run killed during its evaluation leaves no eval scalars behind, so
        # its resume (which evaluates again) logs each of them once
        for kind in ("deterministic", "sampled"):
            for k, per_kind in report["per_mode"].items():
                writer.add_scalar(f"eval/episodic_return_mode{k}_{kind}", per_kind[kind]["mean"], global_step)
        with open(os.path.join(run_dir, "eval.json.tmp"), "w") as f:
            json.dump(report, f, indent=1)
        os.replace(os.path.join(run_dir, "eval.json.tmp"), os.path.join(run_dir, "eval.json"))

    writer.close()
