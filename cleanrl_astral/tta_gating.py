"""Test-time adaptation of the ASTRAL gate, and slot interventions, with controls.

Reads an agent trained by ppo_gru_astral.py (its `.cleanrl_model`, never modified) and asks two questions of
its AbstractionBank, following the ASTRAL plan's phases 5 and 6:

- `adapt`: on a fixed target mode (a training mode, or new physics), does updating only the gating network
  g(h) with REINFORCE raise the return? Every control runs the same episodes with the same seeds: `none` (no
  updates: the luck of those episodes), `gate` (the method), `all` (every parameter) and `tent` (reward-free:
  gate + policy entropy minimisation with a KL anchor to the unadapted policy). `--online` updates within
  episodes (n-step actor-critic on the checkpoint's value head) instead of once per episode.
- `clamp`: what does each slot do? The gate is forced to a one-hot (z = A_k) in every mode and the return
  measured, next to a uniform gate and the learned gate.

The environment and model sections are verbatim copies of ppo_gru_astral.py (a test checks that, and that both
files give identical trajectories and agent outputs).

Usage: python cleanrl_astral/tta_gating.py adapt --checkpoint runs/<run_name>/ppo_gru_astral.cleanrl_model
"""
import copy
import dataclasses
import glob
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

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
ASTRAL_SCRIPT, ASTRAL_FORMAT = "ppo_gru_astral", 1
CONTROLS = ("none", "gate", "all", "tent")


@dataclass(kw_only=True)
class CommonArgs:
    exp_name: str = SCRIPT
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (adaptation seed i is seed + i); also replaces `{seed}` in --checkpoint"""
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
    runs_dir: str = "runs"
    """directory under which `{run_name}/` is written"""
    torch_threads: int = 1
    """torch CPU threads (one is fastest for this small network)"""
    checkpoint: str
    """`.cleanrl_model` written by ppo_gru_astral.py --save-model (read only); `{seed}` and glob patterns are resolved to exactly one file"""
    env_id: str = "NonStationaryCartPole"
    """name used in the run name"""
    mode_indices: Optional[List[int]] = None
    """indices of the checkpoint's training modes to target (default: all of them)"""
    modes: Optional[str] = None
    """custom target physics instead of training modes: "g,l[,sign] g,l[,sign] ..." (unseen physics welcome)"""
    eval_episodes: int = 10
    """episodes per evaluation, each for deterministic and for sampled actions"""


@dataclass(kw_only=True)
class AdaptArgs(CommonArgs):
    exp_name: str = f"{SCRIPT}_adapt"
    """the name of this experiment"""
    save_model: bool = False
    """save every adapted agent (target × seed × control) to `runs/{run_name}/{exp_name}.cleanrl_model`"""
    controls: List[str] = field(default_factory=lambda: list(CONTROLS))
    """which of none, gate, all, tent to run (all with the same episodes and seeds)"""
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
    """update every --online-every steps inside episodes (n-step actor-critic, critic = the value head) instead of once per episode"""
    online_every: int = 16
    """steps between online updates"""
    reward_scale: Optional[float] = None
    """--online: the std the critic's rewards were divided by in training (default: read from checkpoint.pt next to the model)"""
    tent_kl_coef: float = 1.0
    """weight of KL(π_adapted || π_unadapted) in the `tent` loss; 0 lets entropy minimisation collapse the policy"""


@dataclass(kw_only=True)
class ClampArgs(CommonArgs):
    exp_name: str = f"{SCRIPT}_clamp"
    """the name of this experiment"""


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


# CHECKPOINT AND TARGETS
def resolve_checkpoint_path(pattern, seed):
    """`{seed}` -> the seed, then a glob that must match exactly one file (lets one sweep command pick each seed's checkpoint)."""
    path = pattern.replace("{seed}", str(seed))
    if glob.has_magic(path):
        matches = sorted(glob.glob(path))
        if len(matches) != 1:
            raise ValueError(f"--checkpoint {path!r} matches {len(matches)} files; it must match exactly one")
        path = matches[0]
    return path


def agent_from_checkpoint(ckpt):
    a = ckpt["args"]
    obs_dim = 2 if a["hide_velocity"] else 4
    return Agent(obs_dim, 2, len(ckpt["modes"]), a["hidden_size"], a["memory"], a["oracle"],
                 a["num_abstractions"], a["slot_dim"], a["tau"])


def load_astral_checkpoint(path):
    """Reads (never writes) a `.cleanrl_model` of ppo_gru_astral.py. Returns (checkpoint dict, agent), or raises
    ValueError saying why the file cannot be used."""
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path!r} does not exist; pass the .cleanrl_model of a ppo_gru_astral.py --save-model run")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"checkpoint {path!r} is not a readable torch file ({type(e).__name__})")
    if not isinstance(ckpt, dict) or ckpt.get("script") != ASTRAL_SCRIPT:
        found = ckpt.get("script") if isinstance(ckpt, dict) else None
        raise ValueError(f"checkpoint {path!r} was written by {found or 'another program'}, not {ASTRAL_SCRIPT}.py; "
                         "test-time gating needs an ASTRAL agent (it has the gate)")
    if ckpt.get("format") != ASTRAL_FORMAT:
        raise ValueError(f"checkpoint {path!r} has format {ckpt.get('format')}; this script reads format {ASTRAL_FORMAT}")
    missing = [key for key in ("args", "modes", "state_dict", "run_name") if key not in ckpt]
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks {', '.join(missing)}")
    a, slots = ckpt["args"], ckpt["state_dict"].get("bank.slots")
    expected = (a.get("num_abstractions"), a.get("slot_dim"))
    if slots is None or tuple(slots.shape) != expected:
        shape = None if slots is None else tuple(slots.shape)
        raise ValueError(f"checkpoint {path!r} is inconsistent: its args say K={expected[0]} slots of dimension d={expected[1]} "
                         f"but its state dict holds slots of shape {shape}")
    try:
        agent = agent_from_checkpoint(ckpt)
        agent.load_state_dict(ckpt["state_dict"])
    except (KeyError, TypeError, RuntimeError) as e:
        raise ValueError(f"checkpoint {path!r}: the state dict does not fit the agent its args describe ({str(e).splitlines()[0]})")
    return ckpt, agent.eval()


def resolve_targets(mode_indices, modes, ckpt):
    """The target modes: [{"name", "modes" (the env's mode list), "index" (fixed mode), "physics"}]."""
    train_modes = [tuple(float(v) for v in m) for m in ckpt["modes"]]
    if modes is not None and mode_indices is not None:
        raise ValueError("give either --mode-indices (training modes) or --modes (custom physics), not both")
    if modes is not None:
        if ckpt["args"]["oracle"]:
            raise ValueError("an --oracle agent reads the true mode index, so it cannot be run on custom --modes; use --mode-indices")
        custom = parse_modes(modes)
        return [{"name": f"custom{j}", "modes": custom, "index": j, "physics": m} for j, m in enumerate(custom)]
    indices = range(len(train_modes)) if mode_indices is None else mode_indices
    for k in indices:
        if not 0 <= k < len(train_modes):
            raise ValueError(f"--mode-indices {k} is out of range; the checkpoint has {len(train_modes)} modes (0..{len(train_modes) - 1})")
    return [{"name": f"mode{k}", "modes": train_modes, "index": k, "physics": train_modes[k]} for k in indices]


def critic_reward_scale(model_path, ckpt):
    """The std the critic's rewards were divided by during training (its value head is in those units): 1 without
    --norm-reward, else the final running std saved with the model (since session 17) or in the run's checkpoint.pt
    beside it; None if neither has it."""
    if not ckpt["args"].get("norm_reward", False):
        return 1.0
    if ckpt.get("reward_scaler"):
        return float(np.sqrt(ckpt["reward_scaler"]["var"] + 1e-8))
    path = os.path.join(os.path.dirname(model_path), "checkpoint.pt")
    if not os.path.isfile(path):
        return None
    try:
        train_ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated or foreign: said here, before any work
        raise ValueError(f"{path} is not a readable ppo_gru_astral checkpoint ({type(e).__name__}); pass --reward-scale S "
                         "(the final std of the run's reward normaliser) instead") from e
    if not isinstance(train_ckpt, dict) or train_ckpt.get("run_name") != ckpt["run_name"] or not train_ckpt.get("reward_scaler"):
        return None
    return float(np.sqrt(train_ckpt["reward_scaler"]["var"] + 1e-8))


def target_label(target):
    g, l, s = target["physics"]
    return f"{target['name']} (g {g:g}, l {l:g}{', inverted' if s < 0 else ''})"


# ACTING
def policy_step(agent, obs, prev_action, prev_reward, mode, state, start, weights=None):
    """One step of one environment, the input built exactly as ppo_gru_astral.py's rollout builds it (previous
    action -1 and reward 0 at an episode's first step, where start = 1 zeroes the GRU state). Returns the action
    distribution, the value, the next GRU state and the gate weights; keeps the graph when grad is enabled."""
    x = agent.build_input(torch.as_tensor(obs[None]), torch.tensor([prev_action]), torch.tensor([prev_reward]), torch.tensor([mode]))
    hidden, state = agent.unroll(x[None], state, torch.tensor([[float(start)]]))
    modulated, weights = agent.modulate(hidden, weights)
    return Categorical(logits=agent.actor(modulated[0])), agent.critic(modulated[0]).squeeze(-1), state, weights[0]


def evaluate_target(agent, target, hide_velocity, episodes, deterministic, seed, weights=None):
    """`episodes` episodes of the target mode run side by side (first episode of each env, env seeds seed..),
    optionally with the gate clamped to `weights` (K,). Returns the returns and the mean gate weights acted with."""
    envs = make_vector_env(episodes, target["modes"], hide_velocity, fixed_mode=target["index"])
    obs, infos = envs.reset(seed=seed)
    state = agent.initial_state(episodes)
    prev_action, prev_reward, start = np.full(episodes, -1), np.zeros(episodes), np.ones(episodes)
    mode = np.asarray(infos["mode"])
    clamp = None if weights is None else weights.expand(1, episodes, -1)
    returns, finished = np.zeros(episodes), np.zeros(episodes, dtype=bool)
    weight_sum, weight_count = 0.0, 0
    while not finished.all():
        x = agent.build_input(torch.as_tensor(obs), torch.as_tensor(prev_action), torch.as_tensor(prev_reward), torch.as_tensor(mode))
        with torch.no_grad():
            action, _, _, _, state, w = agent.get_action_and_value(
                x[None], state, torch.as_tensor(start, dtype=torch.float32)[None], deterministic=deterministic, weights=clamp
            )
        action_np = action[0].numpy()
        active = w[0][torch.as_tensor(~finished)].numpy()
        weight_sum, weight_count = weight_sum + active.sum(0), weight_count + len(active)
        obs, reward, terminated, truncated, infos = envs.step(action_np)
        returns += reward * ~finished
        done = terminated | truncated
        finished |= done
        prev_action, prev_reward = np.where(done, -1, action_np), np.where(done, 0.0, reward)
        start, mode = done.astype(np.float64), np.asarray(infos["mode"])
    envs.close()
    return returns, weight_sum / weight_count


# ADAPTATION LOSSES
def discounted_returns(rewards, gamma, bootstrap=0.0):
    out, running = np.zeros(len(rewards)), bootstrap
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def reinforce_loss(logprobs, rewards, gamma):
    """REINFORCE on one episode: -mean_t log π(a_t) Ĝ_t, Ĝ the discounted returns normalised over the episode.
    `logprobs` must carry the graph: acting under no_grad would leave nothing to differentiate."""
    returns = torch.as_tensor(discounted_returns(rewards, gamma), dtype=torch.float32)
    returns = (returns - returns.mean()) / (returns.std() + 1e-8) if len(returns) > 1 else torch.zeros_like(returns)
    return -(logprobs * returns).mean()


def actor_critic_loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale):
    """n-step advantage actor-critic on one segment. The critic is the checkpoint's value head, which was trained
    on rewards / reward_scale; it serves as a baseline and bootstrap only (not retrained)."""
    targets = discounted_returns(np.asarray(rewards) / reward_scale, gamma, bootstrap_value)
    advantages = torch.as_tensor(targets, dtype=torch.float32) - values.detach()
    return -(logprobs * advantages).mean()


def tent_loss(logits, anchor_logits, gate_weights, kl_coef):
    """Reward-free: gate entropy + policy entropy + kl_coef · KL(π || π_unadapted), averaged over steps. Without
    the anchor, minimising entropy happily collapses the policy onto whatever action it already prefers."""
    gate_entropy = -(gate_weights * torch.log(gate_weights + 1e-8)).sum(-1).mean()
    log_p, log_q = torch.log_softmax(logits, -1), torch.log_softmax(anchor_logits, -1)
    policy_entropy = -(log_p.exp() * log_p).sum(-1).mean()
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return gate_entropy + policy_entropy + kl_coef * kl


def adapted_parameters(agent, control):
    """The parameters a control updates; every other parameter is frozen (requires_grad False)."""
    for name, param in agent.named_parameters():
        param.requires_grad_(control == "all" or (control in ("gate", "tent") and name.startswith("bank.gate.")))
    return [p for p in agent.parameters() if p.requires_grad]


def adaptation_episode(agent, anchor, env, env_seed, control, optimizer, args, reward_scale):
    """One sampled episode on the target mode, updating at its end (or every --online-every steps with --online).
    `none` (optimizer None) acts identically but never updates. Returns the episode's return and update count."""
    obs, info = env.reset(seed=env_seed)
    state, anchor_state = agent.initial_state(1), anchor.initial_state(1)
    prev_action, prev_reward, start = -1, 0.0, 1.0
    segment = {"logprobs": [], "values": [], "rewards": [], "logits": [], "anchor_logits": [], "weights": []}
    episode_return, done, updates = 0.0, False, 0
    while not done:
        with torch.set_grad_enabled(optimizer is not None):
            dist, value, state, weights = policy_step(agent, obs, prev_action, prev_reward, info["mode"], state, start)
        action = dist.sample()
        if control == "tent":
            with torch.no_grad():
                anchor_dist, _, anchor_state, _ = policy_step(anchor, obs, prev_action, prev_reward, info["mode"], anchor_state, start)
            segment["anchor_logits"].append(anchor_dist.logits)
        segment["logprobs"].append(dist.log_prob(action))
        segment["values"].append(value)
        segment["logits"].append(dist.logits)
        segment["weights"].append(weights)
        prev_action = int(action)
        obs, reward, terminated, truncated, info = env.step(prev_action)
        prev_reward, start = float(reward), 0.0
        segment["rewards"].append(prev_reward)
        episode_return += prev_reward
        done = terminated or truncated
        if optimizer is None or not (done or (args.online and len(segment["rewards"]) == args.online_every)):
            continue

        # UPDATE
        if control == "tent":
            loss = tent_loss(torch.cat(segment["logits"]), torch.cat(segment["anchor_logits"]), torch.cat(segment["weights"]), args.tent_kl_coef)
        elif args.online:
            bootstrap = 0.0
            if not terminated:
                # a cut segment or a time-limit truncation continues: bootstrap from the value of the next observation
                with torch.no_grad():
                    bootstrap = float(policy_step(agent, obs, prev_action, prev_reward, info["mode"], state, 0.0)[1])
            loss = actor_critic_loss(torch.cat(segment["logprobs"]), torch.cat(segment["values"]), segment["rewards"],
                                     bootstrap, args.gamma, reward_scale)
        else:
            loss = reinforce_loss(torch.cat(segment["logprobs"]), segment["rewards"], args.gamma)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], args.max_grad_norm)
        optimizer.step()
        updates += 1
        # truncated backpropagation: the next segment starts from a constant state
        state, anchor_state = state.detach(), anchor_state.detach()
        segment = {key: [] for key in segment}
    return episode_return, updates


def adapt(ckpt, target, control, seed, args, reward_scale):
    """A fresh copy of the checkpoint's agent adapted on `target` for --episodes episodes. The env seeds and the
    torch seed depend only on (target, seed), so every control sees the same episodes until its parameters differ."""
    agent = agent_from_checkpoint(ckpt)
    agent.load_state_dict(ckpt["state_dict"])
    anchor = copy.deepcopy(agent).requires_grad_(False)
    params = adapted_parameters(agent, control)
    optimizer = optim.Adam(params, lr=args.adapt_lr) if params else None
    env = make_env(target["modes"], ckpt["args"]["hide_velocity"], fixed_mode=target["index"])()
    torch.manual_seed(seed)
    curve, updates = [], 0
    for episode in range(args.episodes):
        episode_return, n = adaptation_episode(agent, anchor, env, 10_000 * seed + episode, control, optimizer, args, reward_scale)
        curve.append(episode_return)
        updates += n
    env.close()
    return agent, curve, updates


# STATISTICS AND PLOTS
def mean_ci(values):
    """Mean and half-width of the 95% Student-t confidence interval of the mean (None with one value)."""
    v = np.asarray(values, dtype=np.float64)
    half = t_quantile(len(v)) * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else None
    return {"mean": float(v.mean()), "ci95": None if half is None else float(half), "n": int(len(v))}


def t_quantile(n):
    """97.5% quantile of Student's t with n - 1 degrees of freedom."""
    # scipy.stats takes a second to import and only the summaries need it
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def format_stat(stat):
    return f"{stat['mean']:.1f}" + (f" ± {stat['ci95']:.1f}" if stat["ci95"] is not None else "")


def plot_adaptation_curves(results, targets, controls, path, title):
    """One panel per target: the mean return of each adaptation episode over seeds, a line per control with its 95% CI
    band, and the pre-adaptation evaluation (sampled) as a dotted line."""
    ncols = min(3, len(targets))
    nrows = (len(targets) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(6.0, 4.2 * ncols), 3.2 * nrows + 0.6), squeeze=False, layout="constrained")
    colors = {"none": "tab:gray", "gate": "tab:blue", "all": "tab:orange", "tent": "tab:green"}
    for ax, target in zip(axes.flat, targets):
        res = results[target["name"]]
        for control in controls:
            curves = np.asarray(res["controls"][control]["during_per_seed"], dtype=np.float64)
            x = np.arange(1, curves.shape[1] + 1)
            mean = curves.mean(0)
            ax.plot(x, mean, label=control, color=colors.get(control))
            if len(curves) > 1:
                half = t_quantile(len(curves)) * curves.std(0, ddof=1) / np.sqrt(len(curves))
                ax.fill_between(x, mean - half, mean + half, alpha=0.15, color=colors.get(control))
        ax.axhline(res["before"]["sampled"]["mean"], color="black", linestyle=":", linewidth=1, label="before (eval)")
        ax.set_title(target_label(target), fontsize=9)
        ax.set_xlabel("adaptation episode")
        ax.set_ylabel("return")
        ax.set_ylim(bottom=0)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in list(axes.flat)[len(targets):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_clamp_heatmap(matrix, row_labels, col_labels, path, title):
    """Annotated target × gate-setting heatmaps of mean return, one panel per action kind."""
    kinds = list(matrix)
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.0 + 0.9 * len(col_labels) * len(kinds), 1.6 + 0.5 * len(row_labels)),
                             squeeze=False, sharey=True, layout="constrained")
    for ax, kind in zip(axes[0], kinds):
        values = np.asarray(matrix[kind])
        im = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=500.0, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", color="white" if v < 300 else "black", fontsize=8)
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=30, fontsize=8)
        ax.set_title(f"{kind} actions", fontsize=9)
    axes[0][0].set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03, pad=0.02, label="return")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(obj, path):
    with open(f"{path}.tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(f"{path}.tmp", path)


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


def fail(message):
    print(f"{SCRIPT}.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def validate(args):
    """Every check that can fail before any work starts. Returns (checkpoint path, checkpoint, agent, targets, reward scale)."""
    # NaN and inf pass every `x > 0` style check and reach the optimizer; a seed out of numpy's range fails late
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{field.name.replace('_', '-')} {value} must be a finite number")
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed {args.seed} must be in [0, 2**32 - 1]")
    # the name becomes part of a directory name and of the model file's name: a '/' makes the save fail after training
    if not args.exp_name.strip() or "/" in args.exp_name:
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    if args.mode_indices is not None and (not args.mode_indices or len(set(args.mode_indices)) != len(args.mode_indices)):
        raise ValueError("--mode-indices needs distinct training-mode indices (a repeated one would be counted twice in "
                         "eval.json but once in tta.json)")
    path = resolve_checkpoint_path(args.checkpoint, args.seed)
    ckpt, agent = load_astral_checkpoint(path)
    targets = resolve_targets(args.mode_indices, args.modes, ckpt)
    if args.eval_episodes < 1 or args.torch_threads < 1:
        raise ValueError("--eval-episodes and --torch-threads must be at least 1")
    reward_scale = None
    if isinstance(args, AdaptArgs):
        unknown = [c for c in args.controls if c not in CONTROLS]
        if unknown or not args.controls or len(set(args.controls)) != len(args.controls):
            raise ValueError(f"--controls {' '.join(args.controls)} is invalid; choose distinct names among {', '.join(CONTROLS)}")
        for name in ("episodes", "num_seeds", "online_every"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if not args.adapt_lr > 0 or not args.max_grad_norm > 0 or not 0 <= args.gamma <= 1 or args.tent_kl_coef < 0:
            raise ValueError("--adapt-lr and --max-grad-norm must be positive, --gamma in [0, 1], --tent-kl-coef non-negative")
        if args.reward_scale is not None and not args.reward_scale > 0:
            raise ValueError(f"--reward-scale {args.reward_scale} must be positive")
        if args.online and ({"gate", "all"} & set(args.controls)):
            trained_gamma = ckpt["args"].get("gamma", args.gamma)  # the critic estimates returns at this discount
            if args.gamma != trained_gamma:
                raise ValueError(f"--gamma {args.gamma} differs from the {trained_gamma} the critic was trained with, and --online "
                                 f"bootstraps its returns with that critic; pass --gamma {trained_gamma}")
            reward_scale = args.reward_scale if args.reward_scale is not None else critic_reward_scale(path, ckpt)
            if reward_scale is None or not reward_scale > 0:
                raise ValueError("--online needs the reward scale the critic was trained with: it is read from checkpoint.pt next to "
                                 "the model (written by ppo_gru_astral.py --checkpoint-every); pass --reward-scale S if that file is gone")
    return path, ckpt, agent, targets, reward_scale


def summary_key(target, *parts):
    return "_".join([target["name"], *parts])


if __name__ == "__main__":
    args = tyro.extras.subcommand_cli_from_dict({"adapt": AdaptArgs, "clamp": ClampArgs})
    subcommand = "adapt" if isinstance(args, AdaptArgs) else "clamp"
    try:
        model_path, ckpt, base_agent, targets, reward_scale = validate(args)
    except ValueError as e:
        fail(str(e))
    train_args = ckpt["args"]
    hide_velocity, num_slots = train_args["hide_velocity"], train_args["num_abstractions"]
    run_name, run_dir = claim_run_dir(args.runs_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=vars(args),
                   name=run_name, dir=run_dir, save_code=True)
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters", "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
    )
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    kinds = (("deterministic", True), ("sampled", False))
    report = {
        "script": SCRIPT, "subcommand": subcommand, "checkpoint": os.path.abspath(model_path), "checkpoint_run": ckpt["run_name"],
        "checkpoint_args": {k: train_args[k] for k in ("modes_preset", "modes", "hide_velocity", "memory", "oracle", "seed",
                                                         "total_timesteps", "num_abstractions", "slot_dim", "tau", "hidden_size")},
        "targets": [{"name": t["name"], "gravity": t["physics"][0], "half_length": t["physics"][1], "force_sign": t["physics"][2]} for t in targets],
        "eval_episodes": args.eval_episodes, "args": dataclasses.asdict(args),
    }
    summary = {}  # headline metric -> control / column -> one value per target
    start_time = time.time()

    if subcommand == "adapt":
        seeds = [args.seed + i for i in range(args.num_seeds)]
        report.update(controls=args.controls, seeds=seeds, episodes=args.episodes, online=args.online, reward_scale=reward_scale, results={})
        saved = []
        for ti, target in enumerate(targets):
            res = {"before": {}, "controls": {c: {"during_per_seed": [], "after_per_seed": {k: [] for k, _ in kinds}, "updates": 0}
                                              for c in args.controls}}
            before_per_seed = {k: [] for k, _ in kinds}
            for seed in seeds:
                # the same evaluation episodes (env and torch seeds) before and after, so the comparison is paired
                eval_seed = 100_000 + 10_000 * seed + 1000 * ti
                for kind, det in kinds:
                    torch.manual_seed(eval_seed)
                    before_per_seed[kind].append(float(evaluate_target(base_agent, target, hide_velocity, args.eval_episodes, det, eval_seed)[0].mean()))
                for control in args.controls:
                    agent, curve, updates = adapt(ckpt, target, control, seed, args, reward_scale)
                    entry = res["controls"][control]
                    entry["during_per_seed"].append(curve)
                    entry["updates"] += updates
                    agent.eval()
                    for kind, det in kinds:
                        torch.manual_seed(eval_seed)
                        returns, weights = evaluate_target(agent, target, hide_velocity, args.eval_episodes, det, eval_seed)
                        entry["after_per_seed"][kind].append(float(returns.mean()))
                        if kind == "deterministic":
                            entry.setdefault("slot_weights_after_per_seed", []).append(weights.tolist())
                    if args.save_model:
                        saved.append({"target": target["name"], "seed": seed, "control": control, "state_dict": agent.state_dict()})
                    print(f"{target['name']} seed {seed} {control:>4}: before {before_per_seed['sampled'][-1]:6.1f} "
                          f"during {np.mean(curve):6.1f} after {entry['after_per_seed']['sampled'][-1]:6.1f} (sampled; "
                          f"{updates} updates, {time.time() - start_time:.0f}s elapsed)", flush=True)
            res["before"] = {kind: {**mean_ci(v), "per_seed": v} for kind, v in before_per_seed.items()}
            for control, entry in res["controls"].items():
                curves = np.asarray(entry["during_per_seed"])
                entry["during"] = {"mean": curves.mean(0).tolist(), "ci95": [mean_ci(c)["ci95"] for c in curves.T]}
                entry["during_mean"] = mean_ci(curves.mean(1))
                entry["after"] = {kind: mean_ci(v) for kind, v in entry["after_per_seed"].items()}
                for step, value in enumerate(curves.mean(0)):
                    writer.add_scalar(f"tta/episodic_return_{summary_key(target, control)}", value, step + 1)
                for kind, _ in kinds:
                    writer.add_scalar(f"tta/return_after_{summary_key(target, control, kind)}", entry["after"][kind]["mean"], args.episodes)
                    summary.setdefault(f"after_{kind}", {}).setdefault(control, []).append(entry["after"][kind]["mean"])
                summary.setdefault("during_mean", {}).setdefault(control, []).append(entry["during_mean"]["mean"])
                if "none" in res["controls"] and control != "none":
                    # paired by seed: the same episodes with and without updates
                    none = res["controls"]["none"]
                    gain_during = curves.mean(1) - np.asarray(none["during_per_seed"]).mean(1)
                    gain_after = np.asarray(entry["after_per_seed"]["sampled"]) - np.asarray(none["after_per_seed"]["sampled"])
                    entry["gain_over_none"] = {"during_mean": mean_ci(gain_during), "after_sampled": mean_ci(gain_after)}
                    summary.setdefault("gain_over_none_during", {}).setdefault(control, []).append(float(gain_during.mean()))
                    summary.setdefault("gain_over_none_after_sampled", {}).setdefault(control, []).append(float(gain_after.mean()))
                    writer.add_scalar(f"tta/gain_over_none_{summary_key(target, control)}", float(gain_after.mean()), args.episodes)
            for kind, _ in kinds:
                writer.add_scalar(f"tta/return_before_{summary_key(target, kind)}", res["before"][kind]["mean"], 0)
                summary.setdefault(f"before_{kind}", []).append(res["before"][kind]["mean"])
            report["results"][target["name"]] = res
        figure = os.path.join(run_dir, "adaptation_curves.png")
        plot_adaptation_curves(report["results"], targets, args.controls, figure,
                               f"{run_name}\nadaptation on {ckpt['run_name']} ({args.num_seeds} seeds, {'online' if args.online else 'per-episode'} updates)")
        report["adaptation_curves"] = figure
        print(f"\n{'target':<34}{'control':>8}  {'before':>8}  {'during':>16}  {'after (sampled)':>18}  {'gain over none':>16}")
        for target in targets:
            res = report["results"][target["name"]]
            for control, entry in res["controls"].items():
                gain = format_stat(entry["gain_over_none"]["after_sampled"]) if "gain_over_none" in entry else "-"
                print(f"{target_label(target):<34}{control:>8}  {res['before']['sampled']['mean']:8.1f}  "
                      f"{format_stat(entry['during_mean']):>16}  {format_stat(entry['after']['sampled']):>18}  {gain:>16}")
        if args.save_model:
            model_out = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
            tmp = f"{model_out}.tmp{os.getpid()}"
            torch.save({"script": SCRIPT, "format": 1, "source_checkpoint": os.path.abspath(model_path), "source_args": train_args,
                        "modes": ckpt["modes"], "adapted": saved}, tmp)
            os.replace(tmp, model_out)
            print(f"adapted agents saved to {model_out}")
        results_path = os.path.join(run_dir, "tta.json")

    else:
        columns = [f"slot{k}" for k in range(num_slots)] + ["uniform", "learned"]
        settings = [torch.eye(num_slots)[k] for k in range(num_slots)] + [torch.full((num_slots,), 1.0 / num_slots), None]
        matrix = {kind: np.zeros((len(targets), len(columns))) for kind, _ in kinds}
        report.update(columns=columns, results={})
        for ti, target in enumerate(targets):
            eval_seed = 100_000 + args.seed + 1000 * ti
            res = {}
            for column, weights in zip(columns, settings):
                res[column] = {}
                for kind, det in kinds:
                    torch.manual_seed(eval_seed)
                    returns, mean_weights = evaluate_target(base_agent, target, hide_velocity, args.eval_episodes, det, eval_seed, weights)
                    res[column][kind] = {"mean": float(returns.mean()), "std": float(returns.std()), "returns": returns.tolist()}
                    matrix[kind][ti, columns.index(column)] = returns.mean()
                    writer.add_scalar(f"tta/clamp_return_{summary_key(target, column, kind)}", float(returns.mean()), 0)
                    if not column.startswith("slot"):  # slot k of one checkpoint is not slot k of another: no pooling
                        summary.setdefault(f"clamp_{kind}", {}).setdefault(column, []).append(float(returns.mean()))
                    if column == "learned" and kind == "deterministic":
                        res["learned_slot_weights"] = mean_weights.tolist()
            # slots are unlabelled, so compare each mode's own preferred slot (argmax of the learned gate) with the others
            preferred = int(np.argmax(res["learned_slot_weights"]))
            res["preferred_slot"] = preferred
            for kind, _ in kinds:
                others = [res[f"slot{k}"][kind]["mean"] for k in range(num_slots) if k != preferred]
                res[f"preferred_minus_other_slots_{kind}"] = res[f"slot{preferred}"][kind]["mean"] - (float(np.mean(others)) if others else 0.0)
                summary.setdefault("preferred_minus_other_slots", {}).setdefault(kind, []).append(res[f"preferred_minus_other_slots_{kind}"])
                slot_returns = [res[f"slot{k}"][kind]["mean"] for k in range(num_slots)]
                res[f"slot_spread_{kind}"] = max(slot_returns) - min(slot_returns)
                summary.setdefault("slot_spread", {}).setdefault(kind, []).append(res[f"slot_spread_{kind}"])
            report["results"][target["name"]] = res
            print(f"{target_label(target):<34} deterministic: " + " ".join(f"{c} {matrix['deterministic'][ti, j]:.0f}" for j, c in enumerate(columns))
                  + f" | preferred slot {preferred} ({time.time() - start_time:.0f}s elapsed)", flush=True)
        report["matrix"] = {kind: m.tolist() for kind, m in matrix.items()}
        figure = os.path.join(run_dir, "clamp_heatmap.png")
        plot_clamp_heatmap(matrix, [target_label(t) for t in targets], columns, figure,
                           f"{run_name}\nreturn with the gate clamped, {args.eval_episodes} episodes per cell ({ckpt['run_name']})")
        report["clamp_heatmap"] = figure
        results_path = os.path.join(run_dir, "clamp.json")

    write_json(report, results_path)
    # eval.json: headline numbers averaged over the targets, for benchmark/report.py's tables (per target: results_path)
    headline = {key: {k: float(np.mean(v)) for k, v in values.items()} if isinstance(values, dict) else float(np.mean(values))
                for key, values in summary.items()}
    write_json({"script": SCRIPT, "subcommand": subcommand, "targets": [t["name"] for t in targets], **headline},
               os.path.join(run_dir, "eval.json"))
    print(f"results in {results_path} and {figure}")
    writer.close()
