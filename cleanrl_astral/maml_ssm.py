"""MAML meta-RL with a diagonal linear state-space-model (LRU) policy.

Follows Finn et al. 2017, "Model-Agnostic Meta-Learning for Fast Adaptation of Deep Networks" (RL part:
policy-gradient inner step with a linear feature baseline, TRPO outer step) with the policy network replaced
by a Linear Recurrent Unit (Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long Sequences").
GRU and MLP policies with matched parameter counts serve as baselines.

Usage: python cleanrl_astral/maml_ssm.py train --task point-nav-2d --save-model
       python cleanrl_astral/maml_ssm.py eval --checkpoint runs/<run>/maml_ssm.cleanrl_model
"""

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import operator
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_map

TASKS = ("point-nav-2d", "cartpole-physics", "halfcheetah-vel")
POLICIES = ("ssm", "gru", "mlp")
# cartpole-physics: (gravity, pole half-length) ranges; train and test boxes are disjoint in both coordinates
CARTPOLE_TRAIN_RANGES = ((7.0, 11.0), (0.3, 0.6))
CARTPOLE_TEST_RANGES = ((11.5, 14.0), (0.65, 0.9))
MUJOCO_PIN = "mujoco==4.0.0"


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (also seeds the train and test task streams)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """accepted for CleanRL compatibility; everything runs on CPU (tiny networks, batched simulation)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl_astral"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """not supported here (tasks are batched tensors without a renderer); setting it is an error"""
    save_model: bool = False
    """whether to save the model (and run `eval` on it) at the end of training"""
    runs_dir: str = "runs"
    """directory holding {run_name}/ with TensorBoard logs, checkpoint and eval.json"""
    config: str = "none"
    """named preset applied before the other flags: none | basic | paper (see docs/maml_ssm.md)"""

    # Task
    task: str = "point-nav-2d"
    """task distribution: point-nav-2d | cartpole-physics | halfcheetah-vel"""
    max_episode_steps: int = 100
    """episode horizon"""
    goal_box: bool = False
    """point-nav-2d: an episode ends when both coordinates (not the distance) are within 0.01 of the goal (paper code)"""

    # Policy
    policy: str = "ssm"
    """policy network: ssm (diagonal LRU) | gru | mlp (the latter two matched in parameter count)"""
    hidden_size: int = 64
    """width of the SSM policy; the gru/mlp widths are chosen to match its parameter count"""
    state_size: int = 32
    """number of complex state dimensions of the LRU"""
    in_context: bool = True
    """feed the previous action and reward to the policy besides the observation"""
    layer_norm: bool = False
    """LayerNorm (with affine parameters) on the core's output: what `adapt --adapt-params norm` adapts"""
    dynamics_coef: float = 0.0
    """trunk learning rate on the next-observation loss, as a multiple of aux_lr (0: only the head learns it)"""
    aux_lr: float = 1e-3
    """Adam learning rate of the value and dynamics heads"""
    buffer_size: int = 50_000
    """capacity of the ExperienceBuffer of meta-training transitions saved with the checkpoint (0 disables)"""

    # MAML
    outer_steps: int = 200
    """number of meta-training iterations (0 saves the random initialisation)"""
    cpu_budget: float = 0.0
    """stop meta-training once this process has used this many CPU-seconds (0: no limit; --outer-steps still caps)"""
    tasks_per_batch: int = 20
    """tasks per meta-batch"""
    fast_batch_size: int = 20
    """episodes per task for each inner step and for the post-adaptation (validation) batch"""
    fill_steps: bool = False
    """count a batch in steps (paper code): add episodes until they hold fast_batch_size x max_episode_steps steps"""
    num_inner_steps: int = 1
    """inner policy-gradient steps (0 trains a multi-task policy without adaptation: a baseline)"""
    inner_lr: float = 0.1
    """inner step size alpha"""
    first_order: bool = False
    """use first-order MAML (inner gradients are not differentiated)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 1.0
    """lambda of generalised advantage estimation"""
    outer_optimizer: str = "trpo"
    """outer update: trpo (KL trust region, as in the paper) | adam"""
    outer_lr: float = 1e-3
    """Adam learning rate of the outer update (only with --outer-optimizer adam)"""
    max_kl: float = 0.01
    """TRPO trust-region size"""
    cg_iters: int = 10
    """conjugate-gradient iterations of TRPO"""
    cg_damping: float = 1e-5
    """damping added to the Fisher-vector product"""
    cg_subsample: float = 1.0
    """fraction of the meta-batch's tasks whose KL gives the Fisher-vector products (1: all; less changes the maths)"""
    ls_max_steps: int = 15
    """maximum backtracking steps of the TRPO line search"""
    ls_backtrack_ratio: float = 0.8
    """step shrink factor of the TRPO line search"""

    # Evaluation / adaptation
    eval_tasks: int = 40
    """number of fresh test tasks evaluated after training (with --save-model)"""
    eval_steps: int = 3
    """inner steps evaluated after training (returns after 0..eval_steps steps)"""
    eval_later_lr_scale: float = 0.5
    """evaluation step size is inner_lr for the first step and inner_lr * this for later steps (paper: 0.5)"""
    eval_episodes: int | None = None
    """episodes per test task and inner step in that evaluation (default: fast_batch_size; paper: 40)"""
    adapt_steps: int = 5
    """default number of test-time adaptation steps of the `adapt` subcommand"""
    adapt_lr: float = 1e-2
    """default learning rate of the `adapt` subcommand"""
    log_every: int = 10
    """print a progress line every this many iterations"""
    num_threads: int = 1
    """torch CPU threads (the networks are tiny: extra threads mostly add contention)"""


PRESETS = {
    "none": {},
    "basic": dict(
        seed=42,
        fast_batch_size=8,
        max_episode_steps=200,
        outer_steps=50,
        tasks_per_batch=8,
        num_inner_steps=1,
        inner_lr=1e-2,
        adapt_steps=5,
        adapt_lr=1e-2,
    ),
    # MAML paper, 2D navigation, with its code's goal box and step-counted batches; its test batch is 4,000 steps
    "paper": dict(
        fast_batch_size=20,
        tasks_per_batch=20,
        max_episode_steps=100,
        num_inner_steps=1,
        inner_lr=0.1,
        outer_optimizer="trpo",
        max_kl=0.01,
        eval_episodes=40,
        goal_box=True,
        fill_steps=True,
    ),
}


@dataclass
class CheckpointArgs:
    checkpoint: str
    """path of a .cleanrl_model written by `train --save-model`"""
    eval_seed: int | None = None
    """seed of the test-task stream and the sampling (default: the checkpoint's seed)"""


@dataclass
class EvalArgs(CheckpointArgs):
    num_tasks: int | None = None
    """number of fresh test tasks (default: the checkpoint's eval_tasks)"""
    num_steps: int | None = None
    """evaluate returns after 0..num_steps inner steps (default: the checkpoint's eval_steps)"""
    inner_lr: float | None = None
    """first-step size (default: the checkpoint's inner_lr)"""
    later_lr_scale: float | None = None
    """later steps use inner_lr * this (paper: alpha then alpha/2; default: the checkpoint's eval_later_lr_scale)"""
    fast_batch_size: int | None = None
    """episodes per task and step (default: the checkpoint's eval_episodes, else its fast_batch_size)"""


@dataclass
class AdaptArgs(CheckpointArgs):
    num_tasks: int = 20
    """number of fresh test tasks"""
    adapt_steps: int | None = None
    """adaptation steps K (default: the checkpoint's adapt_steps); returns are reported after 0..K steps"""
    adapt_lr: float | None = None
    """adaptation learning rate (default: the checkpoint's adapt_lr)"""
    adaptation_mode: tuple[str, ...] = ("standard",)
    """one or more adapters: standard (current-task loss) | hybrid (plus replayed training transitions)"""
    adapt_objective: tuple[str, ...] = ("pg",)
    """one or more objectives: pg (uses rewards) | dynamics (reward-free next-obs prediction) | entropy (Tent)"""
    strategy: str = "none"
    """registered loss strategy: none | tent (adds --tent-coef x policy entropy)"""
    tent_coef: float = 1.0
    """weight of the entropy term of the tent strategy"""
    experience_weight: float = 1.0
    """hybrid: weight alpha of the replayed-batch loss"""
    experience_batch_size: int = 256
    """hybrid: transitions per replayed batch"""
    adapt_params: str = "all"
    """parameters adapted: all | ssm (the recurrent core) | heads (policy, value, dynamics) | norm (needs --layer-norm)"""
    adapt_optimizer: str = "sgd"
    """sgd | adam"""
    grad_clip: float = 10.0
    """guard: clip the gradient norm to this"""
    max_step_norm: float = 1.0
    """guard: maximum parameter change (L2 norm) per step"""
    trust_region: float = 2.0
    """guard: after each step project theta onto ||theta - theta_0|| <= this around the meta-learned theta_0"""
    ema_decay: float = 0.0
    """act with an exponential moving average of the adapted parameters (0 disables)"""
    max_importance_weight: float = 10.0
    """truncation (>= 1) of the weight pi_theta / pi_acting of pg on episodes acted by other parameters (EMA, online)"""
    online: bool = False
    """adapt during the episode every --online-every env steps instead of between episode batches"""
    online_every: int = 20
    """online mode: env steps between adaptation steps"""
    fast_batch_size: int | None = None
    """episodes per task and step (default: the checkpoint's fast_batch_size)"""


# ------------------------------------------------------------------------------------------------ TASKS
def sample_tasks(task: str, rng: np.random.Generator, n: int, split: str) -> np.ndarray:
    """Task parameters, one row per task: goal (x, y) | (gravity, half-length) | target velocity."""
    if task == "point-nav-2d":
        return rng.uniform(-0.5, 0.5, size=(n, 2))
    if task == "cartpole-physics":
        (g0, g1), (l0, l1) = CARTPOLE_TRAIN_RANGES if split == "train" else CARTPOLE_TEST_RANGES
        return np.stack([rng.uniform(g0, g1, n), rng.uniform(l0, l1, n)], 1)
    if task == "halfcheetah-vel":
        return rng.uniform(0.0, 2.0, size=(n, 1))
    raise ValueError(f"unknown task {task}")


def task_streams(seed: int):
    """Train and test task samples come from separate seeded streams (SeedSequence entropy [seed, 0|1])."""
    return np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])


class PointNav2D:
    """MAML paper 2D navigation: reward -||p - goal||; actions in [-1, 1] scale to a 0.1 step (rllab's normalize)."""

    obs_dim, act_dim, discrete = 2, 2, False
    max_step = 0.1

    def __init__(self, tasks: torch.Tensor, gen: torch.Generator, goal_box: bool = False):
        self.goals, self.n, self.goal_box = tasks.float(), len(tasks), goal_box

    def reset(self):
        self.pos = torch.zeros(self.n, 2)
        return self.pos.clone()

    def step(self, action):
        self.pos = self.pos + self.max_step * action.clamp(-1.0, 1.0)
        diff = self.pos - self.goals
        dist = torch.linalg.vector_norm(diff, dim=1)
        reached = diff.abs().amax(1) < 0.01 if self.goal_box else dist < 0.01
        return self.pos.clone(), -dist, reached


class CartPolePhysics:
    """Gymnasium's CartPole-v1 dynamics, vectorised, with per-episode gravity and pole half-length."""

    obs_dim, act_dim, discrete = 4, 2, True

    def __init__(self, tasks: torch.Tensor, gen: torch.Generator):
        self.gravity, self.length = tasks[:, 0].double(), tasks[:, 1].double()
        self.n, self.gen = len(tasks), gen

    def reset(self):
        self.state = torch.rand(self.n, 4, generator=self.gen, dtype=torch.float64) * 0.1 - 0.05
        return self.state.float()

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        masspole, total_mass, tau = 0.1, 1.1, 0.02
        polemass_length = masspole * self.length
        force = torch.where(action.reshape(-1) == 1, 10.0, -10.0).double()
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        thetaacc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - masspole * cos**2 / total_mass))
        xacc = temp - polemass_length * thetaacc * cos / total_mass
        x, x_dot = x + tau * x_dot, x_dot + tau * xacc
        theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * thetaacc
        self.state = torch.stack([x, x_dot, theta, theta_dot], 1)
        done = (x.abs() > 2.4) | (theta.abs() > 12 * 2 * math.pi / 360)
        return self.state.float(), torch.ones(self.n), done


_CHEETAH_POOL: list = []  # gymnasium envs are reused across batches: building one compiles the MJCF model


class HalfCheetahVel:
    """HalfCheetah-v5 with a target forward velocity: reward -|v - v*| - 0.1 ||a||^2."""

    obs_dim, act_dim, discrete = 17, 6, False

    def __init__(self, tasks: torch.Tensor, gen: torch.Generator):
        import gymnasium as gym

        self.target = tasks[:, 0].double().numpy()
        self.n = len(tasks)
        while len(_CHEETAH_POOL) < self.n:
            _CHEETAH_POOL.append(gym.make("HalfCheetah-v5"))
        self.envs, self.gen = _CHEETAH_POOL[: self.n], gen

    def reset(self):
        # fresh start states at every reset: the inner-step batch and the post-adaptation batch must not share them
        seeds = torch.randint(0, 2**31 - 1, (self.n,), generator=self.gen).tolist()
        return torch.tensor(np.stack([e.reset(seed=s)[0] for e, s in zip(self.envs, seeds)]), dtype=torch.float32)

    def step(self, action):
        obs, rew = [], []
        for env, a, v in zip(self.envs, action.clamp(-1, 1).numpy(), self.target):
            o, _, _, _, info = env.step(a)
            obs.append(o)
            rew.append(-abs(info["x_velocity"] - v) + info["reward_ctrl"])
        return (
            torch.tensor(np.stack(obs), dtype=torch.float32),
            torch.tensor(rew, dtype=torch.float32),
            torch.zeros(self.n, dtype=torch.bool),
        )


ENV_CLASSES = {"point-nav-2d": PointNav2D, "cartpole-physics": CartPolePhysics, "halfcheetah-vel": HalfCheetahVel}
# bumped when a task's dynamics change, so a checkpoint trained on the old ones is refused, not silently evaluated
TASK_VERSIONS = {"point-nav-2d": 2, "cartpole-physics": 1, "halfcheetah-vel": 1}


def make_env(args: Args, task_params: np.ndarray, episodes_per_task: int, gen: torch.Generator):
    """One batched environment running `episodes_per_task` episodes of every task (rows grouped by task)."""
    rows = torch.tensor(np.repeat(task_params, episodes_per_task, axis=0))
    if args.task == "point-nav-2d":
        return PointNav2D(rows, gen, goal_box=args.goal_box)
    return ENV_CLASSES[args.task](rows, gen)


# ------------------------------------------------------------------------------------------------ MODEL
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class LRU(nn.Module):
    """x_t = lambda x_{t-1} + gamma B u_t, y_t = Re(C x_t) + D u_t in real arithmetic; |lambda| < 1 by construction."""

    DELTA_MIN = 1e-4

    def __init__(self, d_model, d_state, r_min=0.4, r_max=0.99, max_phase=math.pi / 10):
        super().__init__()
        u1, u2 = torch.rand(d_state), torch.rand(d_state)
        self.nu_log = nn.Parameter(torch.log(-0.5 * torch.log(u1 * (r_max**2 - r_min**2) + r_min**2)))
        self.theta_log = nn.Parameter(torch.log(max_phase * u2 + 1e-3))
        self.B_re = nn.Parameter(torch.randn(d_state, d_model) / math.sqrt(2 * d_model))
        self.B_im = nn.Parameter(torch.randn(d_state, d_model) / math.sqrt(2 * d_model))
        self.C_re = nn.Parameter(torch.randn(d_model, d_state) / math.sqrt(d_state))
        self.C_im = nn.Parameter(torch.randn(d_model, d_state) / math.sqrt(d_state))
        self.D = nn.Parameter(torch.randn(d_model) * 0.1)

    def lam(self):
        """(log |lambda|, arg lambda) per state dimension; log |lambda| <= -DELTA_MIN < 0 by construction."""
        return -(torch.exp(self.nu_log) + self.DELTA_MIN), torch.exp(self.theta_log)

    def scan(self, u, x0, starts):
        """Whole sequence as one masked Toeplitz contraction x_t = sum_s lambda^(t-s) b_s; returns (y, final state)."""
        T = u.shape[0]
        log_r, phase = self.lam()
        power = lambda k: (torch.exp(k * log_r) * torch.cos(k * phase), torch.exp(k * log_r) * torch.sin(k * phase))  # noqa: E731
        gamma = torch.sqrt(1 - torch.exp(2 * log_r))  # keeps the state's scale as |lambda| -> 1
        b_re, b_im = (u @ self.B_re.T) * gamma, (u @ self.B_im.T) * gamma
        lag = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # t - s
        causal = (lag >= 0).to(u.dtype)
        # lambda^k for k = 0..T-1, gathered into the (N, T, S) Toeplitz matrix lambda^(t-s)
        pow_re, pow_im = power(torch.arange(T, dtype=u.dtype)[:, None])
        L_re, L_im = pow_re.T[:, lag.clamp(min=0)] * causal, pow_im.T[:, lag.clamp(min=0)] * causal
        seg = torch.cumsum(starts.long(), 0)  # (T, B): episode segment index; a reset starts a new segment
        if T > 1 and starts[1:].any():  # decided by the shape at T = 1, so acting runs under vmap
            same = (seg.T[:, :, None] == seg.T[:, None, :]).to(u.dtype)  # (B, T, S)
            conv = lambda L, v: torch.einsum("nts,bts,sbn->tbn", L, same, v)  # noqa: E731
        else:
            conv = lambda L, v: torch.einsum("nts,sbn->tbn", L, v)  # noqa: E731
        x_re = conv(L_re, b_re) - conv(L_im, b_im)
        x_im = conv(L_re, b_im) + conv(L_im, b_re)
        # carry of x0: lambda^(t+1) x0 while no reset has happened yet
        p_re, p_im = power(torch.arange(1, T + 1, dtype=u.dtype)[:, None])
        c0 = (seg == 0).to(u.dtype)[..., None]
        x0_re, x0_im = x0.chunk(2, -1)
        x_re = x_re + c0 * (p_re[:, None] * x0_re - p_im[:, None] * x0_im)
        x_im = x_im + c0 * (p_im[:, None] * x0_re + p_re[:, None] * x0_im)
        return x_re @ self.C_re.T - x_im @ self.C_im.T + self.D * u, torch.cat([x_re[-1], x_im[-1]], -1)


class Agent(nn.Module):
    """Encoder -> core (LRU | GRU | MLP) -> features; heads: action distribution, value, next observation."""

    def __init__(self, kind, obs_dim, act_dim, discrete, hidden, state_size, in_context, layer_norm=False):
        super().__init__()
        self.kind, self.discrete, self.in_context = kind, discrete, in_context
        self.obs_dim, self.act_dim, self.hidden, self.state_size = obs_dim, act_dim, hidden, state_size
        in_dim = obs_dim + (act_dim + 1 if in_context else 0)
        self.encoder = layer_init(nn.Linear(in_dim, hidden))
        if kind == "ssm":
            self.core = LRU(hidden, state_size)
        elif kind == "gru":
            self.core = nn.GRU(hidden, hidden)
        else:
            self.core = layer_init(nn.Linear(hidden, hidden))
        self.norm = nn.LayerNorm(hidden) if layer_norm else nn.Identity()
        self.fc = layer_init(nn.Linear(hidden, hidden))
        self.pi = layer_init(nn.Linear(hidden, act_dim), std=0.01)
        self.log_std = None if discrete else nn.Parameter(torch.zeros(act_dim))
        self.value_head = layer_init(nn.Linear(hidden, 1), std=1.0)
        self.dyn_head = layer_init(nn.Linear(hidden + act_dim, obs_dim), std=1.0)

    def initial_state(self, n):
        width = {"ssm": 2 * self.state_size, "gru": self.hidden, "mlp": 0}[self.kind]
        return torch.zeros(n, width, dtype=self.encoder.weight.dtype)

    def make_input(self, obs, prev_action, prev_reward):
        """prev_action is a vector (one-hot for discrete actions), zero on the first step of an episode."""
        return torch.cat([obs, prev_action, prev_reward], -1) if self.in_context else obs

    def forward(self, inputs, starts, state, actions=None):
        """inputs (T, B, in_dim), starts (T, B) bool; returns pi, log_std, value, feats, next_obs, state."""
        h = torch.tanh(self.encoder(inputs))
        if self.kind == "mlp":
            y = self.core(h)
        elif self.kind == "ssm":
            y, state = self.core.scan(h, state, starts)
        else:  # GRU: one fused call when the only reset is the first step, else step by step
            T = h.shape[0]
            ys = []
            for t0, t1 in [(0, T)] if not starts[1:].any() else [(t, t + 1) for t in range(T)]:
                y_t, hn = self.core(h[t0:t1], (state * (~starts[t0]).unsqueeze(-1)).unsqueeze(0))
                ys.append(y_t)
                state = hn[0]
            y = torch.cat(ys)
        z = F.gelu(y) + h if self.kind == "ssm" else (y if self.kind == "gru" else torch.tanh(y))
        feats = torch.tanh(self.fc(self.norm(z)))
        out = {"pi": self.pi(feats), "value": self.value_head(feats.detach())[..., 0], "feats": feats, "state": state}
        if self.log_std is not None:
            out["log_std"] = self.log_std
        if actions is not None:
            a = F.one_hot(actions.long()[..., 0], self.act_dim).to(feats.dtype) if self.discrete else actions
            out["next_obs"] = self.dyn_head(torch.cat([feats, a], -1))
        return out


def make_dist(out, discrete):
    # no argument validation: it branches on the values, which vmap cannot
    if discrete:
        return torch.distributions.Categorical(logits=out["pi"], validate_args=False)
    return torch.distributions.Normal(out["pi"], torch.exp(out["log_std"]).expand_as(out["pi"]), validate_args=False)


def log_prob(dist, actions, discrete):
    return dist.log_prob(actions[..., 0].long()) if discrete else dist.log_prob(actions).sum(-1)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def agent_param_count(kind, obs_dim, act_dim, discrete, w, n_state, in_context, layer_norm=False):
    """Closed form of count_params(Agent(...)) so the width search does not build hundreds of networks."""
    in_dim = obs_dim + (act_dim + 1 if in_context else 0)
    core = {"ssm": 2 * n_state + 4 * n_state * w + w, "gru": 6 * w * w + 6 * w, "mlp": w * w + w}[kind]
    heads = (w * act_dim + act_dim) + (0 if discrete else act_dim) + (w + 1) + ((w + act_dim) * obs_dim + obs_dim)
    return in_dim * w + w + core + (2 * w if layer_norm else 0) + (w * w + w) + heads


def policy_width(args: Args, env_cls) -> int:
    """The SSM uses --hidden-size; gru/mlp get the width whose parameter count is closest to the SSM's."""
    if args.policy == "ssm":
        return args.hidden_size
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete)
    count = lambda kind, w: agent_param_count(kind, *spec, w, args.state_size, args.in_context, args.layer_norm)  # noqa: E731
    target, hi = count("ssm", args.hidden_size), 4
    while count(args.policy, hi) < target:  # counts grow with the width: the closest is below the first reaching it
        hi *= 2
    return min(range(4, hi + 1), key=lambda w: (abs(count(args.policy, w) - target), w))  # the smaller on a tie


def build_agent(args: Args, env_cls) -> Agent:
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete)
    return Agent(args.policy, *spec, policy_width(args, env_cls), args.state_size, args.in_context, args.layer_norm)


# ------------------------------------------------------------------------------------------------ ROLLOUT
def map_tasks(model, fn, *args):
    """fn over dim 0 (the task) as one vmapped call; the GRU's fused kernel cannot be vmapped, so it loops."""
    if model.kind != "gru":
        return vmap(fn)(*args)
    outs = [fn(*tree_map(operator.itemgetter(i), args)) for i in range(len(args[1]))]
    return tree_map(lambda *xs: torch.stack(xs), *outs)


def per_task(params, K):
    """One copy of theta for each of K tasks (a view), stacked as adapted parameters are."""
    return {k: v.expand(K, *v.shape) for k, v in params.items()}


def take(tensors, idx):
    """Entries idx along dim 0 of every tensor of a dict: task(s) of stacked parameters, rows of a buffer."""
    return {k: v[idx] for k, v in tensors.items()}


def clone_params(params):
    return {k: v.detach().clone() for k, v in params.items()}


def stack_params(plist):
    return {k: torch.stack([p[k] for p in plist]) for k in plist[0]}


@torch.no_grad()
def rollout(model, params, env, horizon, adapt_every=0, adapt_on=None):
    """env.n episodes, rows grouped by task, task k acting with params[.][k]; time-major (T, n, ...) tensors.
    Online: every `adapt_every` steps, `adapt_on(episodes so far)` returns new stacked parameters."""
    K = len(next(iter(params.values())))
    n, per = env.n, env.n // K
    obs = env.reset()
    prev_a, prev_r = torch.zeros(n, model.act_dim), torch.zeros(n, 1)
    state = model.initial_state(n).reshape(K, per, -1)
    alive = torch.ones(n, dtype=torch.bool)
    keys = ("obs", "inputs", "actions", "rewards", "masks", "next_obs", "logp", "states")
    buf = {k: [] for k in keys}
    act = lambda p, x, start, st: functional_call(model, p, (x[None], start[None], st))  # noqa: E731  one step, one task
    for t in range(horizon):
        if adapt_every and t > 0 and t % adapt_every == 0:
            params = adapt_on(stack_steps(buf))
        inp = model.make_input(obs, prev_a, prev_r)
        state_in = state.reshape(n, -1)  # the recurrent state this step starts from (stored for replay)
        out = map_tasks(model, act, params, inp.reshape(K, per, -1), torch.full((K, per), t == 0), state)
        state = out["state"]
        out = {
            k: out[k][:, 0].reshape(n, -1) if k == "pi" else out[k].repeat_interleave(per, 0)
            for k in ("pi", "log_std")
            if k in out
        }
        dist = make_dist(out, model.discrete)
        action = dist.sample()
        action = action[:, None].float() if model.discrete else action
        next_obs, reward, done = env.step(action)
        logp = log_prob(dist, action, model.discrete)
        for k, v in zip(keys, (obs, inp, action, reward * alive, alive.clone(), next_obs, logp, state_in)):
            buf[k].append(v)
        alive = alive & ~done
        prev_a = F.one_hot(action[:, 0].long(), model.act_dim).float() if model.discrete else action
        obs, prev_r = next_obs, reward[:, None]
        if not alive.any():
            break
    return stack_steps(buf)


def stack_steps(buf):
    batch = {k: torch.stack(v) for k, v in buf.items()}
    batch["masks"] = batch["masks"].float()
    batch["starts"] = torch.zeros_like(batch["masks"], dtype=torch.bool)
    batch["starts"][0] = True
    return batch


def split_batch(batch, G):
    """Per-group views (group g = rows g*per .. (g+1)*per)."""
    per = batch["masks"].shape[1] // G
    return [{k: v[:, g * per : (g + 1) * per] for k, v in batch.items()} for g in range(G)]


def concat_episodes(parts):
    """Episodes of several time-major batches side by side; shorter ones are padded with masked-out steps."""
    T = max(b["masks"].shape[0] for b in parts)
    pad = lambda v: torch.cat([v, v.new_zeros((T - v.shape[0], *v.shape[1:]))]) if v.shape[0] < T else v  # noqa: E731
    return {k: torch.cat([pad(b[k]) for b in parts], 1) for k in parts[0]}


def fill_to_steps(model, batches, params, task_params, args, gen):
    """--fill-steps: add episodes to each short task up to the one reaching the step count (none is cut off)."""
    budget = args.fast_batch_size * args.max_episode_steps
    steps = [int(b["masks"].sum()) for b in batches]
    while True:
        need = [i for i, s in enumerate(steps) if s < budget]
        if not need:
            return batches
        # one more wave for every task still short, sized by its mean episode length so far
        per = max(math.ceil((budget - steps[i]) * batches[i]["masks"].shape[1] / steps[i]) for i in need)
        env = make_env(args, task_params[need], per, gen)
        more = split_batch(rollout(model, take(params, need), env, args.max_episode_steps), len(need))
        for i, b in zip(need, more):
            before = steps[i] + torch.cumsum(b["masks"].sum(0), 0) - b["masks"].sum(0)  # steps held before each
            keep = int((before < budget).sum())
            batches[i] = concat_episodes([batches[i], {k: v[:, :keep] for k, v in b.items()}])
            steps[i] = int(batches[i]["masks"].sum())


def episode_returns(batch):
    return (batch["rewards"] * batch["masks"]).sum(0)


# ------------------------------------------------------------------------------------------------ ADVANTAGES (GAE)
def linear_baseline(batch, gamma, reg=1e-5):
    """Linear feature baseline (Duan et al. 2016): ridge fit of the return on [obs, obs^2, t, t^2, t^3, 1]."""
    obs, masks, rewards = batch["obs"].double(), batch["masks"].double(), batch["rewards"].double()
    T, n = masks.shape
    ret = torch.zeros_like(rewards)
    running = torch.zeros(n, dtype=torch.float64)
    for t in reversed(range(T)):
        running = rewards[t] + gamma * running * masks[t]
        ret[t] = running
    o = obs.clamp(-10, 10)
    al = (torch.arange(T, dtype=torch.float64) / 100.0)[:, None, None].expand(T, n, 1)
    X = torch.cat([o, o**2, al, al**2, al**3, torch.ones_like(al)], -1) * masks[..., None]
    Xf, yf = X.reshape(-1, X.shape[-1]), (ret * masks).reshape(-1)
    A, rhs = Xf.T @ Xf, Xf.T @ yf
    for _ in range(5):  # raise the ridge until the solve is finite (degenerate features, e.g. constant obs)
        w = torch.linalg.solve(A + reg * torch.eye(A.shape[0], dtype=A.dtype), rhs)
        if torch.isfinite(w).all():
            break
        reg *= 10
    return (X @ w) * masks


def compute_advantages(batch, gamma, gae_lambda):
    """GAE with the linear baseline, normalised over the task's valid steps."""
    values = linear_baseline(batch, gamma)
    masks, rewards = batch["masks"].double(), batch["rewards"].double()
    T = masks.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros(masks.shape[1], dtype=torch.float64)
    for t in reversed(range(T)):
        next_v, next_m = (values[t + 1] * masks[t + 1], masks[t + 1]) if t + 1 < T else (0.0, 0.0)
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * gae_lambda * next_m * last
        adv[t] = last * masks[t]
    valid = adv[masks > 0]
    # one valid step has no spread (its std is NaN, which no guard catches): it is centred to 0, not scaled
    scale = valid.std() if valid.numel() > 1 else torch.ones((), dtype=valid.dtype)
    adv = (adv - valid.mean()) / (scale + 1e-8) * masks
    return adv.float()


# ------------------------------------------------------------------------------------------------ MAML
def start_state(model, batch):
    """The state a batch's sequences start from: stored for replayed transitions, zero for fresh episodes."""
    return batch["state0"] if "state0" in batch else model.initial_state(batch["masks"].shape[1])


def policy_out(model, params, batch):
    return functional_call(model, params, (batch["inputs"], batch["starts"], start_state(model, batch)))


def masked_mean(x, masks):
    return (x * masks).sum() / masks.sum()


def entropy(out, discrete):
    ent = make_dist(out, discrete).entropy()
    return ent if discrete else ent.sum(-1)


def inner_loss(model, params, batch):
    """REINFORCE with GAE advantages (from rewards through the linear baseline): -E[log pi(a|s) A]."""
    logp = log_prob(make_dist(policy_out(model, params, batch), model.discrete), batch["actions"], model.discrete)
    return -masked_mean(logp * batch["advantages"], batch["masks"])


def inner_update(model, params, batch, lr, create_graph):
    """theta' = theta - lr * grad inner_loss(theta); differentiable in theta unless create_graph is False."""
    g = grad(lambda p: inner_loss(model, p, batch))(params)
    return {k: params[k] - lr * (g[k] if create_graph else g[k].detach()) for k in params}


def inner_loop(model, params, train_batches, lr, first_order, create_graph=True):
    """theta' after one inner step on each of a task's fast batches."""
    for b in train_batches:
        params = inner_update(model, params, b, lr, create_graph and not first_order)
    return params


def kl_divergence(old, new, discrete):
    """KL(old || new) per step, summed over action dimensions."""
    if discrete:
        lo, ln = F.log_softmax(old["pi"], -1), F.log_softmax(new["pi"], -1)
        return (lo.exp() * (lo - ln)).sum(-1)
    ls_o, ls_n = old["log_std"].expand_as(old["pi"]), new["log_std"].expand_as(new["pi"])
    return (ls_n - ls_o + (torch.exp(2 * ls_o) + (old["pi"] - new["pi"]) ** 2) / (2 * torch.exp(2 * ls_n)) - 0.5).sum(-1)


def meta_objective(model, params, tasks_data, args, old_outs=None, create_graph=True):
    """Mean over tasks of -E[pi_theta'/pi_old A] on post-adaptation episodes, and of KL(old || new) there."""
    losses, kls, outs = [], [], []
    with torch.set_grad_enabled(create_graph and torch.is_grad_enabled()):
        for i, td in enumerate(tasks_data):
            val = td["val"]
            out = policy_out(model, inner_loop(model, params, td["train"], args.inner_lr, args.first_order), val)
            old = old_outs[i] if old_outs is not None else {k: out[k].detach() for k in ("pi", "log_std") if k in out}
            outs.append(old)
            ratio = torch.exp(
                log_prob(make_dist(out, model.discrete), val["actions"], model.discrete)
                - log_prob(make_dist(old, model.discrete), val["actions"], model.discrete)
            )
            losses.append(-masked_mean(ratio * val["advantages"], val["masks"]))
            kls.append(masked_mean(kl_divergence(old, out, model.discrete), val["masks"]))
    return torch.stack(losses).mean(), torch.stack(kls).mean(), outs


def conjugate_gradient(Avp, b, iters, tol=1e-10):
    x, r, p = torch.zeros_like(b), b.clone(), b.clone()
    rr = r @ r
    for _ in range(iters):
        Ap = Avp(p)
        alpha = rr / (p @ Ap)
        x, r = x + alpha * p, r - alpha * Ap
        rr_new = r @ r
        if rr_new < tol:
            break
        p, rr = r + (rr_new / rr) * p, rr_new
    return x


def kl_radius_step(step_dir, f_step_dir, max_kl):
    """The multiple s of step_dir with 0.5 s^T F s = max_kl; f_step_dir = F step_dir."""
    return step_dir * torch.sqrt(2 * max_kl / (step_dir @ f_step_dir + 1e-12))


def flat_grad(out, plist, **kw):
    grads = torch.autograd.grad(out, plist, allow_unused=True, **kw)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, plist)])


def fisher_product(model, tasks_data, args):
    """v -> F v + damping v, F the Hessian at theta of the mean KL(old || pi_theta'). The KL's gradient in theta' is zero
    there, so F = mean_i A_i^T G_i A_i: G_i the Hessian of task i's KL in theta', A_i = d theta'/d theta = prod_j (I -
    alpha H_j), H_j an inner loss's (symmetric) Hessian. A product is 2J + 1 second-order vjps through graphs built once."""
    sizes = [p.numel() for p in model.parameters()]
    leaf = lambda p: {k: v.detach().requires_grad_() for k, v in p.items()}  # noqa: E731
    stages = []  # per task: (leaf, output) of each inner step, then (theta' leaf, gradient of the KL in theta')
    for td in tasks_data:
        p, chain = dict(model.named_parameters()), []
        for b in td["train"]:
            chain.append((q := leaf(p), (p := inner_update(model, q, b, args.inner_lr, not args.first_order))))
        out = policy_out(model, q := leaf(p), td["val"])
        old = {k: out[k].detach() for k in ("pi", "log_std") if k in out}
        kl = masked_mean(kl_divergence(old, out, model.discrete), td["val"]["masks"])
        stages.append(
            chain + [(q, dict(zip(q, torch.autograd.grad(kl, list(q.values()), create_graph=True, allow_unused=True))))]
        )

    def vjp(j, vs):  # every task's v^T d(output of stage j) / d(its leaf), in one backward call
        outs, us = zip(
            *[(o, u.view_as(o)) for s, v in zip(stages, vs) for o, u in zip(s[j][1].values(), v.split(sizes)) if o is not None]
        )
        return list(
            flat_grad(outs, [q for s in stages for q in s[j][0].values()], grad_outputs=us, retain_graph=True).split(
                sum(sizes)
            )
        )

    def fvp(v):  # A_i v (A_j symmetric: a vjp too), G_i, then A_i^T
        vs, J = [v] * len(stages), len(stages[0]) - 1
        for j in [*range(J + 1), *reversed(range(J))]:
            vs = vjp(j, vs)
        return torch.stack(vs).mean(0) + args.cg_damping * v

    return fvp


def trpo_step(model, tasks_data, args):
    """TRPO outer update: conjugate-gradient natural gradient, KL-radius scaling, backtracking line search."""
    plist = list(model.parameters())
    loss, _, old_outs = meta_objective(model, dict(model.named_parameters()), tasks_data, args)
    g = flat_grad(loss, plist)
    keep = (
        torch.randperm(len(tasks_data))[: max(1, round(args.cg_subsample * len(tasks_data)))].tolist()
        if args.cg_subsample < 1
        else range(len(tasks_data))
    )  # the Fisher of a random subset of the tasks (other maths)
    fvp = fisher_product(model, [tasks_data[i] for i in keep], args)
    step_dir = conjugate_gradient(fvp, -g, args.cg_iters)
    step = kl_radius_step(step_dir, fvp(step_dir), args.max_kl)
    old_flat = torch.cat([p.detach().reshape(-1) for p in plist])
    frac, accepted, new_kl, ls_steps = 1.0, False, torch.tensor(0.0), 0
    for ls_steps in range(1, args.ls_max_steps + 1):  # noqa: B007 (the count is logged after the loop)
        torch.nn.utils.vector_to_parameters(old_flat + frac * step, plist)
        new_loss, new_kl, _ = meta_objective(
            model, dict(model.named_parameters()), tasks_data, args, old_outs, create_graph=False
        )
        accepted = (new_loss - loss).item() < 0 and new_kl.item() <= args.max_kl
        if accepted:
            break
        frac *= args.ls_backtrack_ratio
    else:
        torch.nn.utils.vector_to_parameters(old_flat, plist)
    return {
        "outer_loss": loss.item(),
        "approx_kl": new_kl.item() if accepted else 0.0,
        "line_search_steps": ls_steps,
        "accepted": float(accepted),
        "expected_improve": -(g @ step).item(),
    }


def sample_task_batches(model, params, task_params, args, gen, num_steps, inner_lrs):
    """Per task: fast batches sampled after 0..num_steps-1 inner steps, then the post-adaptation "val" batch."""
    K = len(task_params)
    env = make_env(args, task_params, args.fast_batch_size, gen)
    task_p = per_task(params, K)
    train = [[] for _ in range(K)]
    returns = []
    for j in range(num_steps + 1):
        parts = split_batch(rollout(model, task_p, env, args.max_episode_steps), K)
        if args.fill_steps:
            parts = fill_to_steps(model, parts, task_p, task_params, args, gen)
        returns.append(torch.stack([episode_returns(b).mean() for b in parts]))
        for b in parts:
            b["advantages"] = compute_advantages(b, args.gamma, args.gae_lambda)
        if j == num_steps:
            return [{"train": train[i], "val": parts[i]} for i in range(K)], returns
        for i in range(K):
            train[i].append(parts[i])
        task_p = stack_params(
            [clone_params(inner_update(model, take(task_p, i), b, inner_lrs[j], False)) for i, b in enumerate(parts)]
        )


# ------------------------------------------------------------------------------------------------ TRAINING
def make_optimizers(model, args):
    """(aux_opt, outer_opt): the trunk's rate, not a loss weight, scales the dynamics loss (Adam ignores scale)."""
    groups = [{"params": list(model.value_head.parameters()) + list(model.dyn_head.parameters()), "lr": args.aux_lr}]
    if args.dynamics_coef > 0:
        trunk = [p for n, p in model.named_parameters() if not n.startswith(("value_head", "dyn_head", "pi", "log_std"))]
        groups.append({"params": trunk, "lr": args.dynamics_coef * args.aux_lr})
    outer_opt = torch.optim.Adam(model.parameters(), lr=args.outer_lr) if args.outer_optimizer == "adam" else None
    return torch.optim.Adam(groups), outer_opt


def outer_update(model, tasks_data, args, outer_opt):
    """UPDATE: the meta step, TRPO (as in the paper) or one Adam step on the same meta-objective."""
    if outer_opt is None:
        return trpo_step(model, tasks_data, args)
    loss, _, old_outs = meta_objective(model, dict(model.named_parameters()), tasks_data, args)
    outer_opt.zero_grad()
    loss.backward()
    outer_opt.step()
    _, kl, _ = meta_objective(model, dict(model.named_parameters()), tasks_data, args, old_outs, create_graph=False)
    return {"outer_loss": loss.item(), "approx_kl": kl.item(), "line_search_steps": 0, "accepted": 1.0}


def aux_update(model, tasks_data, args, aux_opt, monitor):
    """One Adam step of the value (diagnostic) and next-observation heads; returns (value loss, dynamics loss)."""
    v_losses, d_losses = [], []
    aux_opt.zero_grad()
    for td in tasks_data:
        b, m = td["val"], td["val"]["masks"]
        out = policy_out(model, dict(model.named_parameters()), b)
        monitor.update(out["feats"], m)
        ret = torch.flip(torch.cumsum(torch.flip(b["rewards"], [0]), 0), [0])
        v_loss = masked_mean((out["value"] - ret) ** 2, m)
        feats = out["feats"] if args.dynamics_coef > 0 else out["feats"].detach()
        a = F.one_hot(b["actions"].long()[..., 0], model.act_dim).float() if model.discrete else b["actions"]
        d_loss = masked_mean(((model.dyn_head(torch.cat([feats, a], -1)) - b["next_obs"]) ** 2).mean(-1), m)
        ((v_loss + d_loss) / len(tasks_data)).backward()
        v_losses.append(v_loss.item())
        d_losses.append(d_loss.item())
    aux_opt.step()
    return float(np.mean(v_losses)), float(np.mean(d_losses))


def start_run(args: Args):
    """Run directory, TensorBoard writer (and wandb), threads and seeds; returns (run_dir, writer)."""
    run_name, run_dir = claim_run_dir(args.runs_dir, f"{args.task}__{args.exp_name}__{args.seed}__{int(time.time())}")
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
        )
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    torch.set_num_threads(args.num_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    return run_dir, writer


def meta_iteration(model, args, task_params, gen, buffer, first_task_id, aux_opt, outer_opt, monitor):
    """One meta-training iteration on a meta-batch of tasks; returns (env steps taken, scalars to log)."""
    # ROLLOUT: fast batches with theta (and theta after j inner updates), then post-adaptation batches
    theta = {k: v.detach() for k, v in model.named_parameters()}
    tasks_data, returns = sample_task_batches(
        model, theta, task_params, args, gen, args.num_inner_steps, [args.inner_lr] * args.num_inner_steps
    )
    if buffer is not None:  # task id = index of the task in the checkpoint's task_split["train_tasks"]
        for i, td in enumerate(tasks_data):
            add_batch_to_buffer(buffer, td["val"], first_task_id + i)
    steps = int(sum(b["masks"].sum().item() for td in tasks_data for b in td["train"] + [td["val"]]))
    with torch.no_grad():  # before the outer step, which updates theta's storage in place
        inner_l = (
            np.mean([inner_loss(model, theta, td["train"][0]).item() for td in tasks_data])
            if args.num_inner_steps
            else float("nan")
        )
    # UPDATE
    stats = outer_update(model, tasks_data, args, outer_opt)
    v_loss, d_loss = aux_update(model, tasks_data, args, aux_opt, monitor)
    post = returns[-1].mean().item()
    return steps, {
        "meta/pre_adapt_return": returns[0].mean().item(),
        "meta/post_adapt_return": post,
        **{f"meta/return_after_{j}_steps": r.mean().item() for j, r in enumerate(returns[1:-1], 1)},
        "charts/episodic_return": post,
        "charts/episodic_length": tasks_data[0]["val"]["masks"].sum(0).mean().item(),
        "losses/inner_loss": inner_l,
        "losses/outer_loss": stats["outer_loss"],
        "losses/approx_kl": stats["approx_kl"],
        "losses/value_loss": v_loss,
        "losses/dynamics_loss": d_loss,
        "meta/line_search_steps": stats["line_search_steps"],
        "meta/step_accepted": stats["accepted"],
        **({"charts/learning_rate": args.outer_lr} if outer_opt is not None else {}),
    }


def save_and_evaluate(model, args, run_dir, writer, train_tasks, extra):
    """Writes the checkpoint, then evaluates it with its own eval settings, as `eval` would."""
    path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
    cartpole = args.task == "cartpole-physics"
    split = {
        "task": args.task,
        "train_stream": [args.seed, 0],
        "test_stream": [args.seed, 1],
        "train_ranges": CARTPOLE_TRAIN_RANGES if cartpole else None,
        "test_ranges": CARTPOLE_TEST_RANGES if cartpole else None,
        "train_tasks": (np.concatenate(train_tasks) if train_tasks else np.zeros((0, 1))).tolist(),
    }
    save_checkpoint(path, model, args, split, extra)
    print(f"model saved to {path}")
    res = evaluate(path)
    for k, v in res["returns_after_steps"].items():  # x axis: inner updates
        writer.add_scalar("eval/return_after_steps", v, int(k))
    print(f"eval: {json.dumps(res)}")


def main_train(args: Args):
    fail(validate_args(args))
    run_dir, writer = start_run(args)
    gen = torch.Generator().manual_seed(args.seed)
    train_rng, _ = task_streams(args.seed)
    env_cls = ENV_CLASSES[args.task]
    model = build_agent(args, env_cls)
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete)
    counts = {
        k: agent_param_count(
            k,
            *spec,
            policy_width(dataclasses.replace(args, policy=k), env_cls),
            args.state_size,
            args.in_context,
            args.layer_norm,
        )
        for k in POLICIES
    }
    print(
        f"policy {args.policy} (width {model.hidden}): {count_params(model)} parameters; matched counts "
        f"ssm {counts['ssm']} gru {counts['gru']} mlp {counts['mlp']}; obs/act/discrete {spec}"
    )
    aux_opt, outer_opt = make_optimizers(model, args)
    act_width = 1 if model.discrete else model.act_dim
    buffer = (
        ExperienceBuffer(
            args.buffer_size, env_cls.obs_dim, model.encoder.in_features, act_width, model.initial_state(1).shape[1]
        )
        if args.buffer_size > 0
        else None
    )
    monitor = FeatureMonitor(model.hidden)
    train_tasks, global_step, start_time, start_cpu = [], 0, time.time(), time.process_time()
    for it in range(1, args.outer_steps + 1):
        it_start = time.time()
        train_tasks.append(sample_tasks(args.task, train_rng, args.tasks_per_batch, "train"))
        steps, scalars = meta_iteration(
            model, args, train_tasks[-1], gen, buffer, (it - 1) * args.tasks_per_batch, aux_opt, outer_opt, monitor
        )
        # LOGGING
        global_step += steps
        dt, sps = time.time() - it_start, int(global_step / (time.time() - start_time))
        log_scalars(writer, {**scalars, "meta/iteration_time": dt, "charts/SPS": sps}, global_step)
        if it % args.log_every == 0 or it == 1 or it == args.outer_steps:
            print(
                f"iter {it}/{args.outer_steps} step {global_step} SPS {sps} "
                f"pre {scalars['meta/pre_adapt_return']:.2f} post {scalars['meta/post_adapt_return']:.2f} "
                f"kl {scalars['losses/approx_kl']:.4f} ls {scalars['meta/line_search_steps']} {dt:.2f}s/it "
                f"elapsed {time.time() - start_time:.0f}s",
                flush=True,
            )
        if args.cpu_budget and time.process_time() - start_cpu >= args.cpu_budget:
            print(f"--cpu-budget {args.cpu_budget:g}s reached after {it} of {args.outer_steps} outer steps")
            break

    times = {
        "train_wall_time": time.time() - start_time,
        "train_cpu_time": time.process_time() - start_cpu,
        "outer_steps_done": len(train_tasks),
    }
    log_scalars(writer, {f"meta/{k}": v for k, v in times.items()}, global_step)
    print(f"meta-training wall time {times['train_wall_time']:.1f}s, CPU time {times['train_cpu_time']:.1f}s")
    if args.save_model:
        save_and_evaluate(
            model,
            args,
            run_dir,
            writer,
            train_tasks,
            {**times, "feature_stats": vars(monitor), "buffer": buffer.state_dict() if buffer is not None else None},
        )
    writer.close()


def log_scalars(writer, scalars, step):
    for tag, v in scalars.items():
        writer.add_scalar(tag, float(v), step)


# ------------------------------------------------------------------------------------------------ CHECKPOINTS
def atomic_write(obj, path):
    """JSON or torch.save to a temp file beside `path`, then os.replace: a crash never leaves a torn file."""
    tmp = os.path.abspath(path) + ".tmp"
    try:
        if path.endswith(".json"):
            with open(tmp, "w") as f:
                json.dump(obj, f, indent=2)
        else:
            torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(path, model, args, task_split, extra=None):
    atomic_write(
        {
            "state_dict": model.state_dict(),
            "args": dataclasses.asdict(args),
            "script": "maml_ssm",
            "task_split": task_split,
            "param_count": count_params(model),
            "task_version": TASK_VERSIONS[args.task],
            **(extra or {}),
        },
        path,
    )


def load_checkpoint(path):
    """Returns (model, args, ckpt) or raises ValueError with a one-line reason."""
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path!r} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # corrupted or not a torch file
        raise ValueError(f"cannot read checkpoint {path!r}: {type(e).__name__}") from e
    if not isinstance(ckpt, dict) or ckpt.get("script") != "maml_ssm":
        raise ValueError(f"{path!r} is not a maml_ssm checkpoint")
    missing = [k for k in ("state_dict", "args", "task_split") if k not in ckpt]
    unknown = set(ckpt.get("args", {})) - {f.name for f in dataclasses.fields(Args)}
    if missing or unknown:
        raise ValueError(f"checkpoint {path!r} lacks {missing} or has unknown config fields {sorted(unknown)}")
    args, split, version = Args(**ckpt["args"]), ckpt["task_split"], ckpt.get("task_version", 1)
    bad_config = validate_args(args)
    msg = first_failure(
        [
            (bad_config is not None, f"checkpoint config is invalid: {bad_config}"),
            (
                split.get("task") != args.task,
                f"checkpoint task split is for {split.get('task')!r} but its config says {args.task!r}",
            ),
            *[
                (
                    args.task == "cartpole-physics" and json.dumps(split.get(key)) != json.dumps(ranges),
                    f"the checkpoint's cartpole {key.replace('_', ' ')} {split.get(key)} are not this script's "
                    f"{[list(r) for r in ranges]} (gravity, pole length); retrain it with this script",
                )
                for key, ranges in (("train_ranges", CARTPOLE_TRAIN_RANGES), ("test_ranges", CARTPOLE_TEST_RANGES))
            ],
            (
                version != TASK_VERSIONS[args.task],
                f"checkpoint was trained on version {version} of {args.task}, this script "
                f"runs version {TASK_VERSIONS[args.task]} (see TASK_VERSIONS); retrain it",
            ),
        ]
    )
    if msg:
        raise ValueError(msg)
    torch.manual_seed(0)
    model = build_agent(args, ENV_CLASSES[args.task])
    try:
        model.load_state_dict(ckpt["state_dict"], strict=True)
    except RuntimeError as e:
        raise ValueError(
            f"checkpoint weights do not match its config (--policy {args.policy}, --hidden-size "
            f"{args.hidden_size}): {str(e).splitlines()[0]}"
        ) from e
    return model, args, ckpt


# ------------------------------------------------------------------------------------------------ EVALUATION
def ci95(x):
    x = np.asarray(x, dtype=np.float64)
    return float(1.96 * x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0


def summarise(per_step):
    """{"returns_after_steps": mean over tasks, "ci95": its 95% CI half-width}, keyed by the step as a string."""
    return {
        "returns_after_steps": {str(k): float(r.mean()) for k, r in enumerate(per_step)},
        "ci95": {str(k): ci95(r) for k, r in enumerate(per_step)},
    }


def evaluate(
    checkpoint,
    num_tasks=None,
    num_steps=None,
    inner_lr=None,
    later_lr_scale=None,
    fast_batch_size=None,
    eval_seed=None,
    write=True,
):
    """Returns on fresh test tasks after 0..num_steps inner steps; None takes the checkpoint's setting."""
    model, args, ckpt = load_checkpoint(checkpoint)
    num_tasks = args.eval_tasks if num_tasks is None else num_tasks
    num_steps = args.eval_steps if num_steps is None else num_steps
    later_lr_scale = args.eval_later_lr_scale if later_lr_scale is None else later_lr_scale
    args.fast_batch_size = fast_batch_size or args.eval_episodes or args.fast_batch_size
    lr = args.inner_lr if inner_lr is None else inner_lr
    seed = args.seed if eval_seed is None else eval_seed
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tasks = sample_tasks(args.task, task_streams(seed)[1], num_tasks, "test")
    seen = np.asarray(ckpt["task_split"]["train_tasks"]).reshape(-1, tasks.shape[1])
    if len(seen) and (np.abs(seen[None] - tasks[:, None]).max(-1) < 1e-12).any():
        raise ValueError("a test task coincides with a training task")
    theta = clone_params(dict(model.named_parameters()))
    lrs = [lr] + [lr * later_lr_scale] * max(num_steps - 1, 0)
    _, returns = sample_task_batches(model, theta, tasks, args, gen, num_steps, lrs)
    result = {"task": args.task, **summarise([r.numpy() for r in returns]), "num_tasks": num_tasks}
    if write:
        out_dir = os.path.dirname(os.path.abspath(checkpoint))
        atomic_write(result, os.path.join(out_dir, "eval.json"))
        plot_returns(
            {args.policy: result}, os.path.join(out_dir, "eval.png"), f"{args.task} / {args.policy}", "inner gradient steps"
        )
    return result


def plot_returns(curves, path, title, xlabel, level=None):
    """Mean return (95% CI) after 0..K steps, one line per entry of `curves`; `level` draws the no-adaptation line."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend and no global figure state

    fig = Figure(figsize=(5.5, 3.6), layout="tight")
    ax = fig.subplots()
    for name, r in curves.items():
        ks = sorted(r["returns_after_steps"], key=int)
        ax.errorbar(
            [int(k) for k in ks],
            [r["returns_after_steps"][k] for k in ks],
            yerr=[r["ci95"][k] for k in ks],
            marker="o",
            capsize=2,
            label=name,
        )
    if level is not None:
        ax.axhline(level, color="grey", ls=":", lw=1, label="no adaptation (theta_0)")
    ax.set(xlabel=xlabel, ylabel="mean return (95% CI)", title=title)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)


# ------------------------------------------------------------------------------------------------ TEST-TIME ADAPTATION
class ExperienceBuffer:
    """Ring buffer of meta-training transitions, with the policy input, advantage and recurrent state acted from."""

    FIELDS = ("obs", "inputs", "actions", "rewards", "next_obs", "dones", "advantages", "task_ids", "states")

    def __init__(self, capacity, obs_dim, in_dim, act_dim, state_dim=0):
        widths = dict(obs=(obs_dim,), inputs=(in_dim,), actions=(act_dim,), next_obs=(obs_dim,), states=(state_dim,))
        dtypes = {"dones": torch.bool, "task_ids": torch.long}
        self.data = {k: torch.zeros((capacity, *widths.get(k, ())), dtype=dtypes.get(k, torch.float32)) for k in self.FIELDS}
        self.capacity, self.pos, self.size = capacity, 0, 0

    def add(self, **items):
        n = len(items["obs"])
        # an oversized batch keeps its last `capacity` rows: repeated indices in an assignment have no defined winner
        skip = max(n - self.capacity, 0)
        idx = (self.pos + skip + torch.arange(n - skip)) % self.capacity
        for k in self.FIELDS:
            self.data[k][idx] = items[k][skip:].to(self.data[k].dtype)
        self.pos, self.size = int((self.pos + n) % self.capacity), min(self.size + n, self.capacity)

    def __len__(self):
        return self.size

    def sample(self, batch_size, gen):
        idx = torch.randint(0, self.size, (batch_size,), generator=gen)  # uniform; only the sampled rows are gathered
        return take(self.data, idx)

    def state_dict(self):
        return {"capacity": self.capacity, "pos": self.pos, "size": self.size, "data": dict(self.data)}

    @classmethod
    def from_state_dict(cls, sd, state_dim):
        d = sd["data"]
        if "states" not in d or d["states"].shape[1] != state_dim:
            raise ValueError(
                f"the checkpoint's ExperienceBuffer does not store recurrent states of the model's width "
                f"{state_dim}; retrain it to use hybrid"
            )
        buf = cls(sd["capacity"], d["obs"].shape[1], d["inputs"].shape[1], d["actions"].shape[1], state_dim)
        buf.data = {k: d[k].clone() for k in cls.FIELDS}
        buf.pos, buf.size = sd["pos"], sd["size"]
        return buf


def add_batch_to_buffer(buffer, batch, task_id):
    """Valid steps of one task's episodes; done marks an episode's last step."""
    m = batch["masks"] > 0
    last = m & ~(torch.cat([batch["masks"][1:], torch.zeros_like(batch["masks"][:1])]) > 0)
    buffer.add(
        **{k: batch[k][m] for k in ("obs", "inputs", "actions", "rewards", "next_obs", "advantages", "states")},
        dones=last[m],
        task_ids=torch.full((int(m.sum()),), task_id, dtype=torch.long),
    )


def replay_as_batch(sample):
    """Replayed transitions as length-1 sequences, each continuing from its stored recurrent state."""
    B = len(sample["obs"])
    return {
        **{k: sample[k][None] for k in ("inputs", "actions", "advantages", "rewards", "next_obs", "obs")},
        "starts": torch.zeros(1, B, dtype=torch.bool),
        "state0": sample["states"],
        "masks": torch.ones(1, B),
    }


def objective_loss(model, params, batch, objective, max_importance_weight=10.0):
    """(loss, output) of pg (truncated importance weights on "behaviour_logp"), dynamics (reward-free) or entropy."""
    m = batch["masks"]
    if objective == "pg":
        out = policy_out(model, params, batch)
        logp = log_prob(make_dist(out, model.discrete), batch["actions"], model.discrete)
        if "behaviour_logp" in batch:  # steps after an episode's end (mask 0) get weight 1, whatever they hold
            log_ratio = torch.where(m > 0, logp.detach() - batch["behaviour_logp"], torch.zeros_like(logp))
            logp = logp * torch.exp(log_ratio).clamp(max=max_importance_weight)
        return -masked_mean(logp * batch["advantages"], m), out
    inputs = batch["inputs"]
    if objective == "dynamics" and model.in_context:
        inputs = torch.cat([inputs[..., :-1], torch.zeros_like(inputs[..., -1:])], -1)
    out = functional_call(model, params, (inputs, batch["starts"], start_state(model, batch)), {"actions": batch["actions"]})
    if objective == "dynamics":
        return masked_mean(((out["next_obs"] - batch["next_obs"]) ** 2).mean(-1), m), out
    return masked_mean(entropy(out, model.discrete), m), out


# a strategy maps (loss, model output, masks, adapter) to the loss that is minimised; register more by name
STRATEGIES = {
    "none": lambda loss, out, masks, ad: loss,
    "tent": lambda loss, out, masks, ad: loss + ad.aargs.tent_coef * masked_mean(entropy(out, ad.model.discrete), masks),
}


def register_strategy(name):
    return lambda fn: STRATEGIES.update({name: fn}) or fn


PARAM_GROUPS = {"all": ("",), "ssm": ("core.",), "heads": ("pi.", "log_std", "value_head.", "dyn_head."), "norm": ("norm.",)}
OBJECTIVES = ("pg", "dynamics", "entropy")


def select_params(names, which):
    """Names of the adapted parameters: all | ssm (the core) | heads | norm (LayerNorm affine)."""
    return [n for n in names if n.startswith(PARAM_GROUPS[which])]


def project_to_ball(params, centre, radius):
    """Scales params - centre down to norm `radius` where it is longer (in place); returns whether it did."""
    dist = torch.sqrt(sum(((p - c) ** 2).sum() for p, c in zip(params, centre))).item()
    for p, c in zip(params, centre) if dist > radius else ():
        p.copy_(c + (p - c) * (radius / dist))
    return dist > radius


class StandardAdapter:
    """Guarded gradient steps on the task's objective from theta_0: clip, max step, trust region, optional EMA."""

    def __init__(self, model, theta0, aargs, objective, lr, buffer=None, replay_gen=None):
        self.model, self.aargs, self.objective, self.buffer, self.replay_gen = model, aargs, objective, buffer, replay_gen
        self.theta0 = clone_params(theta0)
        self.names = select_params(list(theta0), aargs.adapt_params)
        self.params = clone_params(theta0)
        leaves = [self.params[k].requires_grad_(True) for k in self.names]
        self.opt = (torch.optim.Adam if aargs.adapt_optimizer == "adam" else torch.optim.SGD)(leaves, lr=lr)
        self.ema = clone_params(self.params) if aargs.ema_decay > 0 else None

    def acting_params(self):
        return self.ema if self.ema is not None else {k: v.detach() for k, v in self.params.items()}

    def replay_batch(self):
        return None

    def loss(self, batch, replay=None):
        loss, out = objective_loss(self.model, self.params, batch, self.objective, self.aargs.max_importance_weight)
        loss = STRATEGIES[self.aargs.strategy](loss, out, batch["masks"], self)
        w = self.aargs.experience_weight
        return loss if replay is None or w == 0 else loss + w * self.loss(replay)

    def drift(self):  # distance from the meta-learned theta_0, which the trust region bounds
        return torch.sqrt(sum(((self.params[k].detach() - self.theta0[k]) ** 2).sum() for k in self.names)).item()

    def step(self, batch):
        a, replay = self.aargs, self.replay_batch()
        loss = self.loss(batch, replay)
        leaves = [self.params[k] for k in self.names]
        grads = [
            g if g is not None else torch.zeros_like(p)
            for g, p in zip(torch.autograd.grad(loss, leaves, allow_unused=True), leaves)
        ]
        gnorm = torch.sqrt(sum((g**2).sum() for g in grads)).item()
        fired = {"clip": gnorm > a.grad_clip}
        before = [p.detach().clone() for p in leaves]
        for p, g in zip(leaves, grads):
            p.grad = g * (a.grad_clip / (gnorm + 1e-12)) if fired["clip"] else g
        self.opt.step()
        with torch.no_grad():
            fired["max_step"] = project_to_ball(leaves, before, a.max_step_norm)
            fired["trust_region"] = project_to_ball(leaves, [self.theta0[k] for k in self.names], a.trust_region)
            for k in self.names if self.ema is not None else ():
                self.ema[k] = a.ema_decay * self.ema[k] + (1 - a.ema_decay) * self.params[k].detach()
        with torch.enable_grad():
            after = self.loss(batch, replay).item()
        return {
            "loss_before": loss.item(),
            "loss_after": after,
            "grad_norm": gnorm,
            "drift": self.drift(),
            "guard_fired": any(fired.values()),
            **{f"fired_{k}": v for k, v in fired.items()},
        }


class HybridAdapter(StandardAdapter):
    """Current-task loss + experience_weight x the same loss on replayed training transitions."""

    def replay_batch(self):
        return replay_as_batch(self.buffer.sample(self.aargs.experience_batch_size, self.replay_gen))


ADAPTERS = {"standard": StandardAdapter, "hybrid": HybridAdapter}


class FeatureMonitor:
    """EMA of training feature mean/variance; shift = mean |mu_test - mu_train| / sigma_train."""

    def __init__(self, dim, decay=0.99, mean=None, var=None, count=0):
        self.mean = torch.zeros(dim) if mean is None else mean
        self.var = torch.ones(dim) if var is None else var
        self.decay, self.count = decay, count

    def update(self, feats, masks):
        f = feats[masks > 0].detach().float()
        d = self.decay if self.count else 0.0
        self.mean, self.var = d * self.mean + (1 - d) * f.mean(0), d * self.var + (1 - d) * f.var(0, unbiased=False)
        self.count += 1

    def shift(self, feats, masks):
        f = feats[masks > 0].detach().float()
        return ((f.mean(0) - self.mean).abs() / torch.sqrt(self.var + 1e-6)).mean().item()


@torch.no_grad()
def monitor_stats(model, params, batch, monitor):
    """Predictive entropy, confidence (exp(-entropy) per step) and feature shift versus training statistics."""
    out = policy_out(model, params, batch)
    ent, m = entropy(out, model.discrete), batch["masks"]
    stats = {"entropy": masked_mean(ent, m).item(), "confidence": masked_mean(torch.exp(-ent), m).item()}
    if monitor is not None:
        stats["feature_shift"] = monitor.shift(out["feats"], m)
    return stats


def online_step(adapters, objective, args, step_logs, batch):
    """One adaptation step inside a rollout (--online): the rollout calls it with the segment it has gathered."""
    return adapt_step(adapters, batch, objective, args, step_logs, online=True)


def adapt_step(adapters, batch, objective, args, step_logs, online=False):
    """One step of every task's adapter on its rows of `batch`; returns their new acting parameters."""
    for ad, b in zip(adapters, split_batch(batch, len(adapters))):
        if objective == "pg":
            b["advantages"] = compute_advantages(b, args.gamma, args.gae_lambda)
            # acted by other parameters than the adapted ones (the EMA, or earlier parameters within an online episode)
            if ad.ema is not None or online:
                b["behaviour_logp"] = b["logp"]
        with torch.enable_grad():
            step_logs.append(ad.step(b))
    return stack_params([ad.acting_params() for ad in adapters])


def run_adaptation(checkpoint, aargs, writer=None):
    """Returns on fresh test tasks after 0..K adaptation steps for every adapter x objective."""
    model, args, ckpt = load_checkpoint(checkpoint)
    buffer = ExperienceBuffer.from_state_dict(ckpt["buffer"], model.initial_state(1).shape[1]) if ckpt.get("buffer") else None
    fs = ckpt.get("feature_stats")
    monitor = FeatureMonitor(len(fs["mean"]), **fs) if fs and fs["count"] > 0 else None  # --outer-steps 0 has none
    K = args.adapt_steps if aargs.adapt_steps is None else aargs.adapt_steps
    lr = args.adapt_lr if aargs.adapt_lr is None else aargs.adapt_lr
    n_eps = args.fast_batch_size if aargs.fast_batch_size is None else aargs.fast_batch_size
    seed = args.seed if aargs.eval_seed is None else aargs.eval_seed
    tasks = sample_tasks(args.task, task_streams(seed)[1], aargs.num_tasks, "test")
    theta0 = clone_params(dict(model.named_parameters()))
    task_returns = lambda batch: episode_returns(batch).reshape(len(tasks), n_eps).mean(1).numpy()  # noqa: E731

    def seeded_env():  # runs with the same parameters see the same episodes: both generators restart from `seed`
        torch.manual_seed(seed)
        return make_env(args, tasks, n_eps, torch.Generator().manual_seed(seed))

    # the no-adaptation level: theta_0 on the episodes every run starts with
    base = task_returns(rollout(model, per_task(theta0, len(tasks)), seeded_env(), args.max_episode_steps))
    results = {}
    for mode in aargs.adaptation_mode:
        for objective in aargs.adapt_objective:
            env = seeded_env()
            # replay draws from its own generator, so hybrid and standard see the same episodes
            replay_gen = torch.Generator().manual_seed(int(np.random.default_rng([seed, 2]).integers(2**62)))
            adapters = [ADAPTERS[mode](model, theta0, aargs, objective, lr, buffer, replay_gen) for _ in tasks]
            per_step, step_logs, mon = [], [], []
            online = functools.partial(online_step, adapters, objective, args, step_logs)
            for k in range(K + 1):
                acting = stack_params([ad.acting_params() for ad in adapters])
                batch = rollout(model, acting, env, args.max_episode_steps, aargs.online_every if aargs.online else 0, online)
                per_step.append(task_returns(batch))
                parts = split_batch(batch, len(tasks))
                stats = [monitor_stats(model, ad.acting_params(), p, monitor) for ad, p in zip(adapters, parts)]
                mon.append({key: float(np.mean([st[key] for st in stats])) for key in stats[0]})
                if k < K and not aargs.online:
                    adapt_step(adapters, batch, objective, args, step_logs)
            name = f"{mode}/{objective}"
            results[name] = {
                **summarise(per_step),
                "monitor": mon,
                "guard_fired_frac": float(np.mean([s["guard_fired"] for s in step_logs])) if step_logs else 0.0,
                "final_drift": float(np.mean([ad.drift() for ad in adapters])),
            }
            tag = f"tta/{mode}_{objective}/"
            for i, row in enumerate(step_logs if writer else []):  # x axis: adaptation step of any task
                log_scalars(
                    writer,
                    {tag + key: row[key] for key in ("loss_before", "loss_after", "grad_norm", "drift", "guard_fired")},
                    i,
                )
            for k, (r, row) in enumerate(zip(per_step, mon) if writer else []):  # x axis: steps taken
                log_scalars(writer, {tag + key: v for key, v in {"return_after_steps": r.mean(), **row}.items()}, k)
            print(
                f"adapt {name}: " + " ".join(f"{k}:{v:.2f}" for k, v in results[name]["returns_after_steps"].items()),
                flush=True,
            )
    return {
        "task": args.task,
        "num_tasks": len(tasks),
        "online": aargs.online,
        "adapt_steps": K,
        "adapt_lr": lr,
        "no_adaptation": {"return": float(base.mean()), "ci95": ci95(base)},
        "results": results,
    }


# ------------------------------------------------------------------------------------------------ VALIDATION AND CLI
def fail(msg: str | None):
    """A one-line error (exit status 2) when there is a message; None lets the run go on."""
    if msg:
        print(f"maml_ssm.py: error: {msg}", file=sys.stderr)
        sys.exit(2)


def flag(name):
    return "--" + name.replace("_", "-")


# valid values by field name, for whichever of Args / EvalArgs / AdaptArgs has the field (None takes a default)
POSITIVE = (
    "inner_lr",
    "outer_lr",
    "aux_lr",
    "adapt_lr",
    "max_kl",
    "eval_later_lr_scale",
    "later_lr_scale",
    "grad_clip",
    "max_step_norm",
    "trust_region",
)
AT_LEAST = {
    2: ("num_tasks",),  # a confidence interval needs two tasks
    1: (
        "tasks_per_batch",
        "fast_batch_size",
        "max_episode_steps",
        "hidden_size",
        "state_size",
        "eval_tasks",
        "cg_iters",
        "num_threads",
        "ls_max_steps",
        "log_every",
        "eval_episodes",
        "experience_batch_size",
        "online_every",
        "max_importance_weight",
    ),  # an importance cap below 1 would scale on-policy steps
    0: (
        "outer_steps",
        "num_inner_steps",
        "eval_steps",
        "adapt_steps",
        "buffer_size",
        "dynamics_coef",
        "cg_damping",
        "cpu_budget",
        "num_steps",
        "experience_weight",
        "ema_decay",
    ),
}
CHOICES = {
    "task": TASKS,
    "policy": POLICIES,
    "outer_optimizer": ("trpo", "adam"),
    "config": PRESETS,
    "adaptation_mode": ADAPTERS,
    "adapt_objective": OBJECTIVES,
    "strategy": STRATEGIES,
    "adapt_params": PARAM_GROUPS,
    "adapt_optimizer": ("sgd", "adam"),
}


def validate_args(a) -> str | None:
    """The one-line reason why these Args/EvalArgs/AdaptArgs would crash late or run wrong; None if fine."""
    given = {f.name: getattr(a, f.name) for f in dataclasses.fields(a) if getattr(a, f.name) is not None}
    # NaN and inf pass every bound; a seed outside numpy's range fails after the run directory exists
    checks = [
        (isinstance(v, float) and not math.isfinite(v), f"{flag(n)} {v} must be a finite number") for n, v in given.items()
    ]
    checks += [
        (not 0 <= given[n] < 2**32, f"{flag(n)} {given[n]} must be in [0, 2**32 - 1]")
        for n in ("seed", "eval_seed")
        if n in given
    ]
    checks += [(not given[n] > 0, f"{flag(n)} must be positive, got {given[n]}") for n in POSITIVE if n in given]
    checks += [
        (given[n] < lo, f"{flag(n)} must be >= {lo}, got {given[n]}")
        for lo, names in AT_LEAST.items()
        for n in names
        if n in given
    ]
    checks += [
        (v not in CHOICES[n], f"unknown {flag(n)} {v!r}; choose one of {', '.join(CHOICES[n])}")
        for n in CHOICES
        if n in given
        for v in (given[n] if isinstance(given[n], tuple) else (given[n],))
    ]
    if isinstance(a, AdaptArgs):
        checks += [
            (
                not a.adaptation_mode or not a.adapt_objective,
                "--adaptation-mode and --adapt-objective each need at least one value",
            ),
            (a.ema_decay >= 1, f"--ema-decay must be in [0, 1), got {a.ema_decay}"),
        ]
    elif isinstance(a, Args):
        checks += [
            (not a.exp_name.strip() or "/" in a.exp_name, f"--exp-name {a.exp_name!r} must be a non-empty name without '/'"),
            (not 0 < a.ls_backtrack_ratio < 1, f"--ls-backtrack-ratio must be in (0, 1), got {a.ls_backtrack_ratio}"),
            (not 0 < a.cg_subsample <= 1, f"--cg-subsample must be in (0, 1], got {a.cg_subsample}"),
            (not (0 < a.gamma <= 1 and 0 <= a.gae_lambda <= 1), "--gamma must be in (0, 1] and --gae-lambda in [0, 1]"),
            (
                a.save_model and a.eval_tasks < 2,
                f"--eval-tasks {a.eval_tasks}: the evaluation after --save-model needs >= 2 tasks for its 95% CI",
            ),
            (
                a.goal_box and a.task != "point-nav-2d",
                f"--goal-box only applies to --task point-nav-2d, not {a.task}; "
                "drop it (or --no-goal-box with --config paper)",
            ),
            (a.capture_video, "--capture-video is not supported: the tasks are batched tensors without a renderer"),
            (
                a.task == "halfcheetah-vel" and not mujoco_available(),
                f"--task halfcheetah-vel needs the 'mujoco' package: pip install {MUJOCO_PIN}",
            ),
        ]
    return first_failure(checks)


def first_failure(checks):
    """The message of the first (condition, message) pair whose condition holds, else None."""
    return next((msg for bad, msg in checks if bad), None)


def mujoco_available() -> bool:
    return importlib.util.find_spec("mujoco") is not None


def claim_run_dir(runs_dir: str, run_name: str) -> tuple[str, str]:
    """(run_name, run_dir) of a new directory; its atomic mkdir gives a taken name the suffix __2, __3, ..."""
    for suffix in range(1, 10**6):
        name = run_name if suffix == 1 else f"{run_name}__{suffix}"
        try:
            os.makedirs(os.path.join(runs_dir, name))
            return name, os.path.join(runs_dir, name)
        except FileExistsError:
            continue
        except OSError as e:
            reason = "not a directory" if os.path.exists(runs_dir) and not os.path.isdir(runs_dir) else e.strerror
            fail(f"cannot create a run directory in --runs-dir {runs_dir!r} ({reason}); pass a writable directory")


def parse_cli(argv):
    """tyro subcommands; `train --config NAME` sets the preset as the defaults so every flag still overrides it."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default="none")
    config = pre.parse_known_args(argv)[0].config
    if config not in PRESETS:
        fail(f"unknown --config {config!r}; choose one of {', '.join(PRESETS)}")
    train_default = dataclasses.replace(Args(), config=config, **PRESETS[config])
    Cmd = (
        Annotated[Args, tyro.conf.subcommand("train", default=train_default, description="meta-train a policy with MAML")]
        | Annotated[EvalArgs, tyro.conf.subcommand("eval", description="returns after 0..K inner steps on fresh test tasks")]
        | Annotated[
            AdaptArgs, tyro.conf.subcommand("adapt", description="test-time adaptation: standard/hybrid x pg/dynamics/entropy")
        ]
    )
    return tyro.cli(Cmd, args=argv, prog="maml_ssm.py")


def checked_checkpoint(a):
    """Validates eval/adapt arguments and their checkpoint before any work: (model, ckpt) or a one-line error."""
    fail(validate_args(a))
    try:
        model, _, ckpt = load_checkpoint(a.checkpoint)
    except ValueError as e:
        fail(str(e))
    torch.set_num_threads(1)
    return model, ckpt


def main_eval(eargs: EvalArgs):
    checked_checkpoint(eargs)
    print(
        json.dumps(
            evaluate(
                eargs.checkpoint,
                eargs.num_tasks,
                eargs.num_steps,
                eargs.inner_lr,
                eargs.later_lr_scale,
                eargs.fast_batch_size,
                eargs.eval_seed,
            )
        )
    )


def main_adapt(aargs: AdaptArgs):
    model, ckpt = checked_checkpoint(aargs)
    horizon, buf = ckpt["args"]["max_episode_steps"], ckpt.get("buffer")
    fail(
        first_failure(
            [
                (
                    aargs.online and aargs.online_every >= horizon,
                    f"--online-every {aargs.online_every} is not below the "
                    f"checkpoint's horizon ({horizon} steps): no step would adapt; choose a smaller --online-every",
                ),
                (
                    aargs.adapt_params == "norm" and not ckpt["args"].get("layer_norm"),
                    "--adapt-params norm: this checkpoint has "
                    "no normalisation layer; train it with --layer-norm, or use all, ssm or heads",
                ),
                # a Gaussian policy's entropy depends only on its state-independent log-std, which the core's parameters miss
                (
                    "entropy" in aargs.adapt_objective and not model.discrete and aargs.adapt_params in ("ssm", "norm"),
                    f"--adapt-objective entropy on this Gaussian policy reaches only its log-std, which --adapt-params "
                    f"{aargs.adapt_params} does not adapt; use --adapt-params all or heads, or another objective",
                ),
                (
                    "hybrid" in aargs.adaptation_mode and not (buf and buf["size"] > 0),
                    "--adaptation-mode hybrid needs a checkpoint with a non-empty ExperienceBuffer "
                    "(train with --buffer-size > 0)",
                ),
            ]
        )
    )
    try:  # replay needs the buffer's recurrent states at the model's width
        if buf:
            ExperienceBuffer.from_state_dict(buf, model.initial_state(1).shape[1])
    except ValueError as e:
        fail(str(e))

    from torch.utils.tensorboard import SummaryWriter

    stem = os.path.join(os.path.dirname(os.path.abspath(aargs.checkpoint)), "adapt_online" if aargs.online else "adapt")
    writer = SummaryWriter(stem + "_tb")
    res = run_adaptation(aargs.checkpoint, aargs, writer)
    writer.close()
    atomic_write(res, stem + ".json")
    plot_returns(
        res["results"],
        stem + ".png",
        f"{res['task']}: test-time adaptation" + (" (online)" if res["online"] else ""),
        "adaptation steps",
        level=res["no_adaptation"]["return"],
    )
    print(f"wrote {stem}.json")


if __name__ == "__main__":
    cmd = parse_cli(sys.argv[1:])
    {Args: main_train, EvalArgs: main_eval, AdaptArgs: main_adapt}[type(cmd)](cmd)
