"""Recurrent PPO (GRU) on NonStationaryCartPole: the reference baseline of cleanrl_astral.

One file holds the environment (CartPole whose hidden physics mode is resampled at every episode start), an
RL²-style GRU agent that sees (observation, previous action, previous reward), and PPO with the recurrent-PPO
details: orthogonal GRU init, zero initial state, state reset exactly where an episode restarts, minibatches of
whole environment sequences, and the state replayed during the update from the one saved at the rollout's start.
It follows CleanRL's ppo_atari_lstm.py; `--design plan` trains the ASTRAL plan's baseline network and Config (the plan
and where this file departs from it: docs/plans.md#astral).

Usage: python cleanrl_astral/ppo_gru_baseline.py --modes-preset seed3 --hide-velocity --save-model
"""

import dataclasses
import functools
import itertools
import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
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
    """the environment: NonStationaryCartPole (this file's, the default) or any gymnasium id with Discrete or MultiDiscrete
    actions (`popgym-*` ids import popgym); --modes-preset, --hide-velocity, --fixed-mode, --mode-share, --switch-prob,
    --oracle and --capture-video apply to NonStationaryCartPole only"""
    modes_preset: Literal["seed3", "inverted4", "mirror4"] = "seed3"
    """physics modes: `seed3` (three gravity/length settings), `inverted4` (seed3 plus inverted force) or `mirror4`
    (two physics x force sign ±1, plus a held-out mode 4 that is only evaluated)"""
    hide_velocity: bool = False
    """observe only cart position and pole angle, so velocities must be inferred from memory"""
    fixed_mode: int | None = None
    """always use this mode index instead of resampling it"""
    mode_share: Literal["uniform", "balanced"] = "uniform"
    """`uniform`: a mode drawn per episode; `balanced`: env i pinned to training mode i mod M, the same share of steps each"""
    switch_prob: float = 0.0
    """per-step probability of resampling the mode in the middle of an episode"""
    memory: Literal["gru", "none"] = "gru"
    """`gru`: recurrent agent; `none`: GRU state zeroed every step (memoryless control, same parameters)"""
    oracle: bool = False
    """append the true mode one-hot to the agent's input (the upper-bound control)"""
    prev_reward: bool = True
    """the agent's input holds the previous reward; `--no-prev-reward` drops that channel (POPGym's agents saw only the
    previous action, and in some of its tasks the reward gives the answer away)"""

    # Algorithm
    design: Literal["script", "plan"] = "script"
    """`script`: this file's network and settings; `plan`: the plan's network (ReLU layers of width --hidden-size,
    PyTorch's default initialisation) and the plan's Config as the defaults (PLAN_CONFIG), each flag still overriding"""
    total_timesteps: int = 500000
    """total timesteps of the experiment"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-5
    """the epsilon of the Adam optimizer"""
    num_envs: int = 128
    """the number of parallel game environments"""
    num_steps: int = 32
    """the number of steps to run in each environment per policy rollout (and the replay's sequence length)"""
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

    batch_size: int = 0
    """the batch size (computed at runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed at runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed at runtime)"""


# the ASTRAL plan's Config (docs/plans.md#astral): the defaults of --design plan; the rest of its Config is this file's
PLAN_CONFIG = {
    "hidden_size": 64,  # d_model
    "num_envs": 8,
    "num_steps": 128,
    "total_timesteps": 500000,
    "learning_rate": 3e-4,
    "adam_eps": 1e-8,  # torch's default: the plan's Adam sets none
    "num_minibatches": 4,  # minibatches of 256 steps: two whole environments' 128-step sequences each
    "update_epochs": 4,
    "anneal_lr": False,
    "norm_reward": False,
    "clip_vloss": False,
}


# ENVIRONMENT
MODE_PRESETS = {  # a mode is (gravity, pole half-length, force sign)
    "seed3": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0)],
    "inverted4": [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0), (9.8, 0.5, -1.0)],
    # two physics x force sign ±1, so the right action flips with the hidden mode; mode 4 (between the two physics,
    # inverted force) is held out of training
    "mirror4": [(9.8, 0.5, 1.0), (9.8, 0.5, -1.0), (7.5, 0.7, 1.0), (7.5, 0.7, -1.0), (8.65, 0.6, -1.0)],
}
# what each mode's physics is, as info["mode_name"] reports it (seed3's names are the plan's)
MODE_NAMES = {
    "seed3": ["default", "easy", "hard"],
    "inverted4": ["default", "easy", "hard", "default inverted"],
    "mirror4": ["default", "default inverted", "easy", "easy inverted", "between inverted"],
}
HELD_OUT_MODES = {"seed3": [], "inverted4": [], "mirror4": [4]}  # evaluated (and adapted to) only, never trained on
# the part of the mode that changes which action is right: only the force sign does (seed3's modes all push alike)
ACTION_LATENT = {"seed3": None, "inverted4": "force_sign", "mirror4": "force_sign"}


def latent_labels(modes, latent):
    """The action latent's label of each mode: for "force_sign", 1 where the force pushes as in CartPole-v1, else 0."""
    if latent != "force_sign":
        raise ValueError(f"unknown action latent {latent!r}")
    return np.array([int(sign > 0) for _, _, sign in modes])


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


class RewardScaler:
    """Divides rewards by the running std of each env's discounted return (gymnasium's NormalizeReward): O(1) value
    targets, so the value loss of the shared trunk cannot swamp the gradient clip."""

    def __init__(self, num_envs, gamma):
        self.gamma = gamma
        self.returns = np.zeros(num_envs)
        self.return_rms = RunningMeanStd(shape=())

    def __call__(self, rewards, dones):
        self.returns = self.returns * self.gamma + rewards
        self.return_rms.update(self.returns)
        self.returns[dones] = 0.0
        return rewards / np.sqrt(self.return_rms.var + 1e-8)


# ANY GYMNASIUM ENVIRONMENT: --env-id other than NonStationaryCartPole
DEFAULT_ENV_ID = "NonStationaryCartPole"
# the flags that only mean something for NonStationaryCartPole: another --env-id refuses them unless left at the default
CARTPOLE_ONLY_FLAGS = ("modes_preset", "hide_velocity", "fixed_mode", "mode_share", "switch_prob", "oracle", "capture_video")
MMER_EVERY = 65536  # POPGym's cadence: MMER is sampled every 65,536 steps and at the end of the run


class EnvSpaces(NamedTuple):
    obs_dim: int  # the flattened observation's size
    num_actions: int  # a Discrete's n, a MultiDiscrete's product of nvec


def make_gym_env(env_id):
    """gymnasium.make(env_id), its observation flattened; importing popgym registers the `popgym-*` ids, so those ids (and
    only those) import it."""
    if env_id.startswith("popgym-"):
        import popgym  # noqa: F401

    return gym.wrappers.FlattenObservation(gym.make(env_id))


def env_spaces(env_id):
    """The EnvSpaces of `env_id`, or a ValueError (one line) for an id gymnasium cannot make or an action space this file
    does not support."""
    try:
        env = make_gym_env(env_id)
    except (gym.error.Error, ModuleNotFoundError) as e:
        raise ValueError(f"--env-id {env_id} cannot be made: {e}") from e
    action_space = env.action_space
    obs_dim = gym.spaces.flatdim(env.observation_space)
    env.close()
    if isinstance(action_space, gym.spaces.Discrete):
        return EnvSpaces(obs_dim, int(action_space.n))
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return EnvSpaces(obs_dim, int(np.prod(action_space.nvec)))
    raise ValueError(
        f"--env-id {env_id} has a {type(action_space).__name__} action space; only Discrete and MultiDiscrete are supported"
    )


def env_action(space, index):
    """The env's action for each action index (N,): a Discrete's start + index; a MultiDiscrete's digits of the index in the
    mixed radix nvec (the first digit the most significant) plus its start, shaped as nvec."""
    if isinstance(space, gym.spaces.Discrete):
        return space.start + index
    digits = np.stack(np.unravel_index(index, space.nvec.flatten()), -1)
    return (digits + space.start.flatten()).reshape(len(index), *space.nvec.shape)


class GymVectorEnv:
    """`num_envs` copies of `env_id` (make_gym_env) in a SyncVectorEnv seeded seed + i, returning what
    NonStationaryCartPole returns: float32 observations (N, obs_dim), rewards, terminated, truncated and info. Actions
    are indices into one Discrete (env_action maps them). Autoreset is same-step: where an episode ends, the returned
    observation is already the next episode's first, and info["final_obs"] holds the ended one's last. The env has no
    hidden mode: info["mode"] is 0 for every env, and nothing is reported per mode."""

    def __init__(self, env_id, num_envs):
        self.num_envs = num_envs
        self.envs = gym.vector.SyncVectorEnv(
            [functools.partial(make_gym_env, env_id) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        self.action_space = self.envs.single_action_space
        self.mode = np.zeros(num_envs, dtype=int)

    def reset(self, seed=None):
        obs, _ = self.envs.reset(seed=seed)
        return obs.astype(np.float32), {"mode": self.mode.copy()}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.envs.step(env_action(self.action_space, action))
        obs = obs.astype(np.float32)
        final_obs = obs.copy()
        for i in np.flatnonzero(info.get("_final_obs", np.zeros(self.num_envs, dtype=bool))):
            final_obs[i] = info["final_obs"][i]
        step_info = {"final_obs": final_obs, "final_mode": self.mode.copy(), "mode": self.mode.copy()}
        return obs, reward.astype(np.float64), terminated, truncated, step_info


# AGENT
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(
        self, obs_dim, num_actions, num_modes, hidden_size=128, memory="gru", oracle=False, design="script", prev_reward=True
    ):
        super().__init__()
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.num_modes = num_modes
        self.memory = memory
        self.oracle = oracle
        self.prev_reward = prev_reward
        self.input_dim = obs_dim + num_actions + int(prev_reward)
        if oracle:
            self.input_dim += num_modes
        self.hidden_size = hidden_size
        if design == "plan":  # the plan's network: ReLU layers of width d, PyTorch's default initialisation
            self.encoder = nn.Sequential(nn.Linear(self.input_dim, hidden_size), nn.ReLU())
            self.gru = nn.GRUCell(hidden_size, hidden_size)
            self.actor = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_actions))
            self.critic = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 1))
        else:
            self.encoder = nn.Sequential(layer_init(nn.Linear(self.input_dim, hidden_size)), nn.Tanh())
            self.gru = nn.GRUCell(hidden_size, hidden_size)
            for name, param in self.gru.named_parameters():
                if "bias" in name:
                    nn.init.constant_(param, 0)
                else:
                    nn.init.orthogonal_(param, 1.0)
            self.actor = nn.Sequential(
                layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, num_actions), std=0.01)
            )
            self.critic = nn.Sequential(
                layer_init(nn.Linear(hidden_size, 64)), nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0)
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
        Returns the hidden states (T, B, H) the heads read and the state after x[T-1]."""
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

    def get_value(self, x, state, starts):
        hidden, _ = self.unroll(x, state, starts)
        return self.critic(hidden).squeeze(-1)

    def get_action_and_value(self, x, state, starts, action=None, deterministic=False):
        hidden, state = self.unroll(x, state, starts)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None and deterministic:
            action = logits.argmax(-1)
        elif action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden).squeeze(-1), state


def agent_from_args(args, num_modes, spaces=None):
    """The agent of `args`; `spaces`, another --env-id's EnvSpaces (NonStationaryCartPole's when None)."""
    obs_dim = 4
    if args.hide_velocity:
        obs_dim = 2
    num_actions = 2
    if spaces is not None:
        obs_dim = spaces.obs_dim
        num_actions = spaces.num_actions
    return Agent(obs_dim, num_actions, num_modes, args.hidden_size, args.memory, args.oracle, args.design, args.prev_reward)


def next_input(agent, obs, action, reward, done, mode, device):
    """The agent's input for the step after `action`. Same-step autoreset: where done, obs opens the next episode, so it
    has no previous action (-1) and no previous reward (0)."""
    prev_action = np.where(done, -1, action)
    prev_reward = np.where(done, 0.0, reward)
    return agent.build_input(
        torch.as_tensor(obs, device=device),
        torch.as_tensor(prev_action, device=device),
        torch.as_tensor(prev_reward, device=device),
        torch.as_tensor(mode, device=device),
    )


# LOGGING
def mmer_due(previous_step, global_step, final):
    """Whether MMER is sampled after the update that took the run from previous_step to global_step: it crossed a multiple
    of MMER_EVERY steps, or it is the run's last."""
    return final or global_step // MMER_EVERY > previous_step // MMER_EVERY


def log_mmer(writer, mmer, recent, global_step):
    """POPGym's MMER: the max of the last one and the mean return of `recent` (the last 100 training episodes), logged as
    charts/mmer; unchanged and not logged before the first episode ends."""
    if not recent:
        return mmer
    mmer = max(mmer, float(np.mean(recent)))
    writer.add_scalar("charts/mmer", mmer, global_step)
    return mmer


def print_progress(iteration, num_iterations, global_step, sps, recent, recent_by_mode):
    by_mode = []
    for k, returns in recent_by_mode.items():
        if returns:
            by_mode.append(f"m{k} {np.mean(returns):.0f}")
        else:
            by_mode.append(f"m{k} -")
    mean_return = np.mean(recent or [np.nan])
    minutes_left = (num_iterations - iteration) * global_step / iteration / max(sps, 1) / 60
    print(
        f"iter {iteration}/{num_iterations} step {global_step} SPS {sps} return {mean_return:.1f} | {' '.join(by_mode)} "
        f"| {minutes_left:.1f} min left",
        flush=True,
    )


# EVALUATION
def evaluate(model_path, episodes_per_mode=10, modes=None, deterministic=True, seed=0, video_dir=None, device="cpu"):
    """Plays `episodes_per_mode` episodes in each mode of `modes` (default: the checkpoint's, held-out ones included; any
    physics works, unseen ones included) with the saved agent. Returns {"returns": {mode index: array of returns},
    "probes": {"probe_acc_h_{latent}": held-out accuracy of a linear probe reading the preset's action latent from h}},
    the probe over the training modes (all of `modes` when given), absent when the preset has no action latent. A
    checkpoint of another --env-id: {"returns": {0: the returns of `episodes_per_mode` episodes}, "probes": {}}."""
    from cleanrl_astral_utils import cartpole  # the evaluation's probes and video

    checkpoint = load_checkpoint(model_path)
    train_args = Args(**checkpoint["args"])
    train_modes = [tuple(mode) for mode in checkpoint["modes"]]
    held_out = []
    mode_names = None
    if modes is None:
        held_out = HELD_OUT_MODES[train_args.modes_preset]
        mode_names = MODE_NAMES[train_args.modes_preset]
        modes = train_modes
    else:
        modes = [tuple(float(v) for v in mode) for mode in modes]
    spaces = None
    if train_args.env_id != DEFAULT_ENV_ID:
        spaces = env_spaces(train_args.env_id)
    agent = agent_from_args(train_args, len(train_modes), spaces).to(device)
    agent.load_state_dict(checkpoint["state_dict"])
    if spaces is not None:  # no mode, no probe
        return {"returns": {0: env_returns(agent, train_args.env_id, episodes_per_mode, seed, deterministic)}, "probes": {}}
    returns = {}
    hidden = {}
    for k in range(len(modes)):
        envs = NonStationaryCartPole(episodes_per_mode, modes, train_args.hide_velocity, fixed_mode=k, mode_names=mode_names)
        episodes, hidden[k] = first_episodes(agent, envs, seed + 1000 * k, deterministic)
        returns[k] = np.array([episode_return for episode_return, _, _ in episodes])
        if video_dir is not None:
            env = NonStationaryCartPole(1, modes, train_args.hide_velocity, fixed_mode=k, mode_names=mode_names)
            play = functools.partial(first_episodes, agent, env, seed, True)
            cartpole.record_video(env, play, video_dir, f"mode{k}")
    probes = {}
    latent = ACTION_LATENT[train_args.modes_preset]
    if latent is not None:
        labels = latent_labels(modes, latent)
        probes[f"probe_acc_h_{latent}"] = cartpole.hidden_state_probe(hidden, labels, held_out, episodes_per_mode)
    return {"returns": returns, "probes": probes}


def first_episodes(agent, envs, seed, deterministic, before_step=None):
    """The first episode of every environment of `envs`, as (return, length, mode), and the GRU state after each of its
    steps with the step's age in its episode ({"hidden": (T, N, H), "ages": (T, N), -1 once the first episode ended}).
    `before_step()`, when given, runs before every step (the video draws a frame)."""
    device = next(agent.parameters()).device
    n = envs.num_envs
    obs, info = envs.reset(seed=seed)
    x = next_input(agent, obs, -1, 0.0, np.ones(n, dtype=bool), info["mode"], device)  # every env starts an episode
    start = torch.ones(n, device=device)
    state = torch.zeros(n, agent.hidden_size, device=device)
    episode_mode = info["mode"].copy()
    episode_return = np.zeros(n)
    episode_length = np.zeros(n, dtype=int)
    first = [None] * n
    hidden = []
    ages = []
    while any(episode is None for episode in first):
        if before_step is not None:
            before_step()
        running = np.array([episode is None for episode in first])
        ages.append(np.where(running, episode_length, -1))
        with torch.no_grad():
            action, _, _, _, state = agent.get_action_and_value(x[None], state, start[None], deterministic=deterministic)
        hidden.append(state.cpu().numpy())
        acted = action[0].cpu().numpy()
        obs, reward, terminated, truncated, info = envs.step(acted)
        done = terminated | truncated
        episode_return = episode_return + reward
        episode_length = episode_length + 1
        for i in np.flatnonzero(done & running):
            first[i] = (float(episode_return[i]), int(episode_length[i]), int(episode_mode[i]))
        x = next_input(agent, obs, acted, reward, done, info["mode"], device)
        start = torch.as_tensor(done, dtype=torch.float32, device=device)
    return first, {"hidden": np.stack(hidden), "ages": np.stack(ages)}


def env_returns(agent, env_id, episodes, seed, deterministic):
    """The returns of the first episodes of `episodes` envs of `env_id` (GymVectorEnv), seeded seed + i."""
    first = first_episodes(agent, GymVectorEnv(env_id, episodes), seed, deterministic)[0]
    return np.array([episode_return for episode_return, _, _ in first])


# PLUMBING: CHECKPOINTS, VALIDATION AND THE RUN DIRECTORY
def save_checkpoint(path, args, modes, run_name, agent, reward_scaler):
    """Writes {"script", "format", "args", "modes", "run_name", "state_dict", "reward_scaler"} to path atomically (a
    temporary file beside it, then os.replace: a killed run leaves no half-written model). The reward normaliser's state
    is kept because the value head is in its units (tta_gating --online bootstraps with it)."""
    scaler = None
    if reward_scaler is not None:
        scaler = {key: float(getattr(reward_scaler.return_rms, key)) for key in ("mean", "var", "count")}
    checkpoint = {
        "script": SCRIPT,
        "format": CHECKPOINT_FORMAT,
        "args": dataclasses.asdict(args),
        "modes": modes,
        "run_name": run_name,
        "state_dict": agent.state_dict(),
        "reward_scaler": scaler,
    }
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    """The checkpoint dict at path, or ValueError (one line) when this file's save_checkpoint did not write it: another
    program's, or another commit's format (its Args differ), which that commit reads."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("script") != SCRIPT:
        raise ValueError(f"{path!r} was not written by {SCRIPT}.py")
    fields = {field.name for field in dataclasses.fields(Args)}
    if checkpoint.get("format") != CHECKPOINT_FORMAT or set(checkpoint["args"]) != fields:
        raise ValueError(f"{path!r} holds another format of {SCRIPT}.py's checkpoint; commit 95652a5 reads it")
    return checkpoint


def have_helper_package():
    """Whether cleanrl_astral_utils (reports, plots, video, resume) can be imported: a script copied alone runs without it."""
    try:
        import cleanrl_astral_utils  # noqa: F401
    except ImportError:
        return False
    return True


def validate(args):
    """Refuses, in one line (ValueError), the settings that would crash late or train wrong in silence."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes any <, >
            raise ValueError(f"--{field.name.replace('_', '-')} {value} must be a finite number")
    for name in ("learning_rate", "adam_eps", "clip_coef", "max_grad_norm", "target_kl"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} {value} must be positive")
    for name in ("ent_coef", "vf_coef"):
        value = getattr(args, name)
        if value < 0:
            raise ValueError(f"--{name.replace('_', '-')} {value} must be non-negative")
    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "hidden_size", "eval_episodes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    for name in CARTPOLE_ONLY_FLAGS:
        if args.env_id != DEFAULT_ENV_ID and getattr(args, name) != getattr(Args(), name):
            raise ValueError(f"--{name.replace('_', '-')} applies to --env-id {DEFAULT_ENV_ID} only, not {args.env_id}")
    if args.env_id != DEFAULT_ENV_ID:
        env_spaces(args.env_id)  # an id gymnasium cannot make, or a Box action space: one line
    num_modes = len(MODE_PRESETS[args.modes_preset])
    held_out = HELD_OUT_MODES[args.modes_preset]
    num_train = num_modes - len(held_out)
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed {args.seed} must be in [0, 2**32 - 1] (the range numpy and gymnasium accept)")
    # the name becomes part of a directory name and of the model file's name: a '/' would fail the save after training
    if not args.exp_name.strip() or "/" in args.exp_name:
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    if not (0.0 < args.gamma <= 1.0 and 0.0 <= args.gae_lambda <= 1.0):
        raise ValueError(f"--gamma {args.gamma} must be in (0, 1] and --gae-lambda {args.gae_lambda} in [0, 1]")
    if not 0.0 <= args.switch_prob <= 1.0:
        raise ValueError(f"--switch-prob {args.switch_prob} must be in [0, 1]")
    if args.fixed_mode is not None and not 0 <= args.fixed_mode < num_modes:
        raise ValueError(f"--fixed-mode {args.fixed_mode} is out of range; there are {num_modes} modes (0..{num_modes - 1})")
    if args.fixed_mode in held_out:
        raise ValueError(f"--fixed-mode {args.fixed_mode} is held out of training in {args.modes_preset} (evaluation only)")
    if args.mode_share == "balanced" and args.num_envs % num_train != 0:
        raise ValueError(
            f"--mode-share balanced needs --num-envs {args.num_envs} to be a multiple of the {num_train} training modes, "
            "so each gets the same share"
        )
    if args.mode_share == "balanced" and (args.fixed_mode is not None or args.switch_prob > 0):
        raise ValueError(
            "--mode-share balanced pins every env's mode; it cannot be combined with --fixed-mode or --switch-prob"
        )
    if args.num_envs % args.num_minibatches != 0:
        raise ValueError(
            f"--num-envs {args.num_envs} is not divisible by --num-minibatches {args.num_minibatches}; "
            "minibatches hold whole environments' sequences"
        )
    if args.norm_adv and args.num_envs // args.num_minibatches * args.num_steps < 2:
        raise ValueError(
            "a minibatch of one step cannot normalise its advantages (their std is undefined); "
            "raise --num-steps or --num-envs, or lower --num-minibatches"
        )
    if args.total_timesteps < args.num_envs * args.num_steps:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one rollout "
            f"(--num-envs x --num-steps = {args.num_envs * args.num_steps})"
        )
    if args.capture_video and not args.save_model:
        raise ValueError("--capture-video records evaluation episodes; add --save-model")
    if args.capture_video and not have_helper_package():
        raise ValueError("--capture-video needs the cleanrl_astral_utils package: pip install -e . in the repository")


def parse_args():
    """The command line's Args; with --design plan, PLAN_CONFIG's values are the defaults that the flags given override."""
    args = tyro.cli(Args)
    if args.design == "plan":
        args = tyro.cli(Args, default=dataclasses.replace(Args(), design="plan", **PLAN_CONFIG))
    return args


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


if __name__ == "__main__":
    args = parse_args()
    try:
        validate(args)
        run_name, run_dir = claim_run_dir(args.runs_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    except ValueError as e:
        print(f"{SCRIPT}.py: error: {e}", file=sys.stderr)
        sys.exit(2)
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

    if args.env_id == DEFAULT_ENV_ID:
        modes = MODE_PRESETS[args.modes_preset]
        held_out = HELD_OUT_MODES[args.modes_preset]
        spaces = None
        envs = NonStationaryCartPole(
            args.num_envs,
            modes,
            args.hide_velocity,
            args.fixed_mode,
            args.switch_prob,
            held_out=held_out,
            mode_share=args.mode_share,
            mode_names=MODE_NAMES[args.modes_preset],
        )
    else:  # any gymnasium id: no hidden mode
        modes = []
        held_out = []
        spaces = env_spaces(args.env_id)
        envs = GymVectorEnv(args.env_id, args.num_envs)
    agent = agent_from_args(args, len(modes), spaces).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    reward_scaler = None
    if args.norm_reward:
        reward_scaler = RewardScaler(args.num_envs, args.gamma)
    recent = deque(maxlen=100)
    recent_by_mode = {k: deque(maxlen=100) for k in range(len(modes))}
    mmer = float("-inf")

    # storage of one rollout, (T, N, ...)
    inputs = torch.zeros((args.num_steps, args.num_envs, agent.input_dim), device=device)
    starts = torch.zeros((args.num_steps, args.num_envs), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    global_step = 0
    start_time = time.time()
    next_obs, info = envs.reset(seed=args.seed)
    # the agent's input: the observation, the previous action and reward (none, -1 and 0, where an episode starts, as
    # every env does here)
    next_x = next_input(agent, next_obs, -1, 0.0, np.ones(args.num_envs, dtype=bool), info["mode"], device)
    next_start = torch.ones(args.num_envs, device=device)
    next_state = torch.zeros(args.num_envs, args.hidden_size, device=device)
    episode_mode = info["mode"].copy()
    episode_return = np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=int)
    for iteration in range(1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # ROLLOUT
        initial_state = next_state.clone()  # the update replays each sequence from it
        for step in range(args.num_steps):
            global_step += args.num_envs
            inputs[step] = next_x
            starts[step] = next_start
            with torch.no_grad():
                action, logprob, _, value, next_state = agent.get_action_and_value(next_x[None], next_state, next_start[None])
            actions[step] = action[0]
            logprobs[step] = logprob[0]
            values[step] = value[0]
            acted = action[0].cpu().numpy()
            next_obs, reward, terminated, truncated, info = envs.step(acted)
            done = terminated | truncated
            if reward_scaler is not None:
                scaled = reward_scaler(reward, done)
            else:
                scaled = reward.copy()
            cut = np.flatnonzero(truncated & ~terminated)  # a time limit is no failure: bootstrap from the final observation
            if len(cut):
                final_x = agent.build_input(
                    torch.as_tensor(info["final_obs"][cut], device=device),
                    torch.as_tensor(acted[cut], device=device),
                    torch.as_tensor(reward[cut], device=device),
                    torch.as_tensor(info["final_mode"][cut], device=device),
                )
                with torch.no_grad():
                    final_value = agent.get_value(final_x[None], next_state[cut], torch.zeros(1, len(cut), device=device))[0]
                scaled[cut] += args.gamma * final_value.cpu().numpy()
            rewards[step] = torch.as_tensor(scaled, dtype=torch.float32, device=device)

            episode_return = episode_return + reward
            episode_length = episode_length + 1
            for i in np.flatnonzero(done):
                ep_return = float(episode_return[i])
                ep_mode = int(episode_mode[i])
                recent.append(ep_return)
                writer.add_scalar("charts/episodic_return", ep_return, global_step)
                writer.add_scalar("charts/episodic_length", int(episode_length[i]), global_step)
                if ep_mode in recent_by_mode:  # none for an env without modes
                    recent_by_mode[ep_mode].append(ep_return)
                    writer.add_scalar(f"charts/episodic_return_mode{ep_mode}", ep_return, global_step)
            episode_return[done] = 0.0
            episode_length[done] = 0
            episode_mode[done] = info["mode"][done]
            # same-step autoreset: where done, next_obs opens the next episode: no previous action / reward, a zeroed state
            next_x = next_input(agent, next_obs, acted, reward, done, info["mode"], device)
            next_start = torch.as_tensor(done, dtype=torch.float32, device=device)

        # ADVANTAGES (GAE)
        # starts[t] = 1 where step t opens an episode: step t-1 ended one and does not bootstrap from step t (a truncation
        # was already bootstrapped into its reward)
        with torch.no_grad():
            next_value = agent.get_value(next_x[None], next_state, next_start[None])[0]
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros_like(next_value)
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_start
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - starts[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        # UPDATE
        # minibatches of whole environments, each replayed from the state saved at the start of the rollout, so the
        # log-probs are re-computed exactly as they were acted
        envs_per_minibatch = args.num_envs // args.num_minibatches
        env_indices = np.arange(args.num_envs)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(env_indices)
            for start in range(0, args.num_envs, envs_per_minibatch):
                mb = env_indices[start : start + envs_per_minibatch]
                _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                    inputs[:, mb], initial_state[mb], starts[:, mb], actions[:, mb]
                )
                logratio = newlogprob - logprobs[:, mb]
                ratio = logratio.exp()
                if epoch == 0 and start == 0:  # exactly 1 unless the recurrent replay differs from what was acted
                    first_minibatch_ratio_error = (ratio - 1).abs().max().item()
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
                    v_clipped = values[:, mb] + torch.clamp(newvalue - values[:, mb], -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (v_clipped - returns[:, mb]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - returns[:, mb]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred = values.flatten().cpu().numpy()
        y_true = returns.flatten().cpu().numpy()
        var_y = np.var(y_true)
        explained_var = float("nan")
        if var_y != 0:
            explained_var = float(1 - np.var(y_true - y_pred) / var_y)

        # LOGGING
        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
        writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
        writer.add_scalar("losses/clipfrac", float(np.mean(clipfracs)), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("debug/first_minibatch_ratio_error", first_minibatch_ratio_error, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        if mmer_due(global_step - args.batch_size, global_step, iteration == args.num_iterations):
            mmer = log_mmer(writer, mmer, recent, global_step)
        if iteration % max(1, args.num_iterations // 50) == 0 or iteration == args.num_iterations:
            print_progress(iteration, args.num_iterations, global_step, sps, recent, recent_by_mode)

    if args.save_model:
        model_path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        save_checkpoint(model_path, args, modes, run_name, agent, reward_scaler)
        print(f"model saved to {model_path}")
    if args.save_model and not have_helper_package():
        print(
            "evaluation report skipped: eval.json needs the cleanrl_astral_utils package (pip install -e . in the repository)"
        )
    elif args.save_model:
        from cleanrl_astral_utils import cartpole

        run = cartpole.Run(SCRIPT, args, modes, held_out, run_name, run_dir, writer, global_step, mmer)
        cartpole.report_evaluation(run, evaluate, model_path, ACTION_LATENT[args.modes_preset], device=device)

    writer.close()
