"""MAML meta-RL with a diagonal linear state-space-model (LRU) policy.

Follows Finn et al. 2017, "Model-Agnostic Meta-Learning for Fast Adaptation of Deep Networks" (RL part:
policy-gradient inner step with a linear feature baseline, TRPO outer step) with the policy network replaced
by a Linear Recurrent Unit (Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long Sequences").
GRU and MLP policies with matched parameter counts serve as baselines.

The file reads in CleanRL's order: Args, tasks, model, the rollout and GAE, the inner step, the meta-objective, TRPO's
step (or one Adam step), then `train`, whose loop reads ROLLOUT, UPDATE, LOGGING, then `eval` and `adapt`; the plumbing
a default run needs comes after the method. ProMP is maml_ssm_promp.py, beside this file.

The plans it implements, and how it reads them: docs/plans.md.

Usage: python cleanrl_astral/maml_ssm.py train --config basic --outer-steps 100 --tasks-per-batch 8 --ckpt-dir ckpts
       python cleanrl_astral/maml_ssm.py eval --checkpoint ckpts/latest.cleanrl_model --episodes 50
       python cleanrl_astral/maml_ssm.py adapt --checkpoint ckpts/latest.cleanrl_model --adaptation-mode standard hybrid
"""

import dataclasses
import functools
import importlib.util
import itertools
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.func import functional_call, grad, vmap

TASKS = ("point-nav-2d", "cartpole-physics", "halfcheetah-vel")
POLICIES = ("ssm", "gru", "mlp")
OUTER_OPTIMIZERS = ("trpo", "adam")
# cartpole-physics: (gravity, pole half-length) ranges; train and test boxes are disjoint in both coordinates
CARTPOLE_TRAIN_RANGES = ((7.0, 11.0), (0.3, 0.6))
CARTPOLE_TEST_RANGES = ((11.5, 14.0), (0.65, 0.9))
MUJOCO_PIN = "mujoco==4.0.0"
SCRIPT = "maml_ssm"  # the name its checkpoints carry


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (also seeds the train and test task streams)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """train the policy on a CUDA device when one exists (the tasks step on CPU; eval and adapt run on CPU)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl_astral"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    save_model: bool = False
    """whether to save the model (and run `eval` on it) at the end of training"""
    runs_dir: str = "runs"
    """directory holding {run_name}/ with TensorBoard logs, checkpoint and eval.json"""
    config: str = "none"
    """named preset whose values are the defaults of the other flags: none | basic | paper (see PRESETS)"""
    ckpt_dir: str | None = None
    """write a resumable checkpoint every --ckpt-every outer steps to DIR/step_N.cleanrl_model and DIR/latest.cleanrl_model"""
    ckpt_every: int = 10
    """outer steps between the checkpoints of --ckpt-dir (the last step is always written)"""
    resume: str | None = None
    """continue the run of a --ckpt-dir checkpoint: its Args, run directory, TensorBoard steps, optimizer and RNG states"""

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
    buffer_size: int = 10_000
    """capacity of the ExperienceBuffer of meta-training transitions saved with the checkpoint, the transitions
    `adapt --adaptation-mode hybrid` replays (0 disables)"""

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
    """outer update: trpo (KL trust region, as in the paper) | adam (one step); ProMP is maml_ssm_promp.py"""
    outer_lr: float = 1e-3
    """Adam learning rate of the outer update (--outer-optimizer adam)"""
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

    # Evaluation (with --save-model)
    eval_tasks: int = 40
    """number of fresh test tasks evaluated after training (with --save-model)"""
    eval_steps: int = 3
    """inner steps evaluated after training (returns after 0..eval_steps steps)"""
    eval_later_lr_scale: float = 0.5
    """evaluation step size is inner_lr for the first step and inner_lr * this for later steps (paper: 0.5)"""
    eval_episodes: int | None = None
    """episodes per test task and inner step in that evaluation (default: fast_batch_size; paper: 40)"""
    log_every: int = 10
    """print a progress line every this many iterations"""
    diagnostics: bool = False
    """log losses/inner_loss, the inner loss of the parameters that sampled the batch (one more forward pass per task)"""
    num_threads: int = 1
    """torch CPU threads (the networks are tiny: extra threads mostly add contention)"""


# ENVIRONMENT
def sample_tasks(task: str, rng: np.random.Generator, n: int, split: str) -> np.ndarray:
    """Task parameters, one row per task: goal (x, y) | (gravity, half-length) | target velocity."""
    if task == "point-nav-2d":
        return rng.uniform(-0.5, 0.5, size=(n, 2))
    if task == "cartpole-physics":
        if split == "train":
            ranges = CARTPOLE_TRAIN_RANGES
        else:
            ranges = CARTPOLE_TEST_RANGES
        (g0, g1), (l0, l1) = ranges
        return np.stack([rng.uniform(g0, g1, n), rng.uniform(l0, l1, n)], 1)
    if task == "halfcheetah-vel":
        return rng.uniform(0.0, 2.0, size=(n, 1))
    raise ValueError(f"unknown task {task}")


def task_streams(seed: int):
    """Train and test task samples come from separate seeded streams (SeedSequence entropy [seed, 0|1])."""
    return np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])


class PointNav2D:
    """MAML paper 2D navigation: reward -||p - goal||; actions in [-1, 1] scale to a 0.1 step (rllab's normalize)."""

    obs_dim = 2
    act_dim = 2
    discrete = False
    max_step = 0.1

    def __init__(self, tasks: torch.Tensor, gen: torch.Generator, goal_box: bool = False):
        self.goals = tasks.float()
        self.n = len(tasks)
        self.goal_box = goal_box

    def reset(self):
        self.pos = torch.zeros(self.n, 2)
        return self.pos.clone()

    def step(self, action):
        self.pos = self.pos + self.max_step * action.clamp(-1.0, 1.0)
        diff = self.pos - self.goals
        dist = torch.linalg.vector_norm(diff, dim=1)
        if self.goal_box:
            reached = diff.abs().amax(1) < 0.01
        else:
            reached = dist < 0.01
        return self.pos.clone(), -dist, reached


class CartPolePhysics:
    """Gymnasium's CartPole-v1 dynamics, vectorised, with per-episode gravity and pole half-length."""

    obs_dim = 4
    act_dim = 2
    discrete = True
    masspole = 0.1
    total_mass = 1.1
    tau = 0.02

    def __init__(self, tasks: torch.Tensor, gen: torch.Generator):
        self.gravity = tasks[:, 0].double()
        self.length = tasks[:, 1].double()
        self.n = len(tasks)
        self.gen = gen

    def reset(self):
        self.state = torch.rand(self.n, 4, generator=self.gen, dtype=torch.float64) * 0.1 - 0.05
        return self.state.float()

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        polemass_length = self.masspole * self.length
        force = torch.where(action.reshape(-1) == 1, 10.0, -10.0).double()
        cos = torch.cos(theta)
        sin = torch.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / self.total_mass
        thetaacc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - self.masspole * cos**2 / self.total_mass))
        xacc = temp - polemass_length * thetaacc * cos / self.total_mass
        # explicit Euler, as gymnasium: positions move with the old velocities
        new_x = x + self.tau * x_dot
        new_x_dot = x_dot + self.tau * xacc
        new_theta = theta + self.tau * theta_dot
        new_theta_dot = theta_dot + self.tau * thetaacc
        self.state = torch.stack([new_x, new_x_dot, new_theta, new_theta_dot], 1)
        done = (new_x.abs() > 2.4) | (new_theta.abs() > 12 * 2 * math.pi / 360)
        return self.state.float(), torch.ones(self.n), done


_CHEETAH_POOL: list = []  # gymnasium envs are reused across batches: building one compiles the MJCF model


class HalfCheetahVel:
    """HalfCheetah-v5 with a target forward velocity: reward -|v - v*| - 0.1 ||a||^2."""

    obs_dim = 17
    act_dim = 6
    discrete = False

    def __init__(self, tasks: torch.Tensor, gen: torch.Generator):
        import gymnasium as gym

        self.target = tasks[:, 0].double().numpy()
        self.n = len(tasks)
        while len(_CHEETAH_POOL) < self.n:
            _CHEETAH_POOL.append(gym.make("HalfCheetah-v5"))
        self.envs = _CHEETAH_POOL[: self.n]
        self.gen = gen

    def reset(self):
        # fresh start states at every reset: the inner-step batch and the post-adaptation batch must not share them
        seeds = torch.randint(0, 2**31 - 1, (self.n,), generator=self.gen).tolist()
        first_obs = [env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)]
        return torch.tensor(np.stack(first_obs), dtype=torch.float32)

    def step(self, action):
        obs = []
        rew = []
        for env, a, v in zip(self.envs, action.clamp(-1, 1).numpy(), self.target):
            o, _, _, _, info = env.step(a)
            obs.append(o)
            rew.append(-abs(info["x_velocity"] - v) + info["reward_ctrl"])
        next_obs = torch.tensor(np.stack(obs), dtype=torch.float32)
        reward = torch.tensor(rew, dtype=torch.float32)
        return next_obs, reward, torch.zeros(self.n, dtype=torch.bool)


ENV_CLASSES = {"point-nav-2d": PointNav2D, "cartpole-physics": CartPolePhysics, "halfcheetah-vel": HalfCheetahVel}
# bumped when a task's dynamics change, so a checkpoint trained on the old ones is refused, not silently evaluated
TASK_VERSIONS = {"point-nav-2d": 2, "cartpole-physics": 1, "halfcheetah-vel": 1}


def make_env(args: Args, task_params: np.ndarray, episodes_per_task: int, gen: torch.Generator):
    """One batched environment running `episodes_per_task` episodes of every task (rows grouped by task)."""
    rows = torch.tensor(np.repeat(task_params, episodes_per_task, axis=0))
    if args.task == "point-nav-2d":
        return PointNav2D(rows, gen, goal_box=args.goal_box)
    return ENV_CLASSES[args.task](rows, gen)


# AGENT
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class LRU(nn.Module):
    """x_t = lambda x_{t-1} + gamma B u_t, y_t = Re(C x_t) + D u_t: real parameters, a complex state carried as [Re x, Im x];
    |lambda| < 1 by construction."""

    DELTA_MIN = 1e-4

    def __init__(self, d_model, d_state, r_min=0.4, r_max=0.99, max_phase=math.pi / 10):
        super().__init__()
        u1 = torch.rand(d_state)
        u2 = torch.rand(d_state)
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
        """The recurrence over a sequence u (T, B, d_model) from the state x0 (B, 2 d_state), zeroed where an episode
        starts (starts (T, B)); returns (y, final state)."""
        log_r, phase = self.lam()
        gamma = torch.sqrt(1 - torch.exp(2 * log_r))  # keeps the state's scale as |lambda| -> 1
        lam = torch.complex(torch.exp(log_r) * torch.cos(phase), torch.exp(log_r) * torch.sin(phase))
        B = (torch.stack([self.B_re, self.B_im], 1) * gamma[:, None, None]).flatten(0, 1)  # rows Re, Im of gamma_n B_n
        b = torch.view_as_complex((u @ B.T).unflatten(-1, (-1, 2)))  # one matmul for Re and Im
        keep = ~starts[..., None]  # (T, B, 1): the state carries over into step t
        x0_re, x0_im = x0.chunk(2, -1)
        b = torch.cat([b[:1] + keep[:1] * lam * torch.complex(x0_re, x0_im), b[1:]])  # x_{-1} = x0 enters at t = 0
        x = diagonal_scan(lam, keep, b)
        C = torch.stack([self.C_re, -self.C_im], -1).flatten(1)  # columns Re C_n, -Im C_n: Re(C x) in one matmul
        y = torch.view_as_real(x).flatten(-2) @ C.T + self.D * u
        return y, torch.cat([x[-1].real, x[-1].imag], -1)


def diagonal_scan(lam, keep, b):
    """x_t = keep_t lam x_{t-1} + b_t from x_{-1} = 0 along dim 0 (lam (N,), keep (T, B, 1) bool, b (T, B, N) complex),
    in O(T) work and log2(T) levels: steps 2i and 2i + 1 fold into one step of lam^2, whose scan gives the odd steps,
    then each even step is one step from the odd one before it."""
    T = len(b)
    if T == 1:
        return b
    if T % 2:  # one more step, cut off at the end
        b = torch.cat([b, torch.zeros_like(b[:1])])
        keep = torch.cat([keep, torch.ones_like(keep[:1])])
    b_even, b_odd = b.unflatten(0, (-1, 2)).unbind(1)
    keep_even, keep_odd = keep.unflatten(0, (-1, 2)).unbind(1)
    x_odd = diagonal_scan(lam * lam, keep_odd & keep_even, keep_odd * lam * b_even + b_odd)
    x_before = torch.cat([torch.zeros_like(x_odd[:1]), x_odd[:-1]])  # x_{2i-1}
    x_even = keep_even * lam * x_before + b_even
    return torch.stack([x_even, x_odd], 1).flatten(0, 1)[:T]


class AgentOutput(NamedTuple):
    pi: torch.Tensor
    """the action distribution's parameters: Gaussian mean or logits (T, B, act_dim)"""
    log_std: torch.Tensor | None = None
    """the Gaussian's state-independent log-std (None for discrete actions)"""
    value: torch.Tensor | None = None
    """the diagnostic value head, on detached features (T, B)"""
    feats: torch.Tensor | None = None
    """the features the heads read (T, B, hidden)"""
    next_obs: torch.Tensor | None = None
    """the next-observation head's prediction (only when forward is given the actions)"""
    state: torch.Tensor | None = None
    """the recurrent state after the last step"""


class Agent(nn.Module):
    """Encoder -> core (LRU | GRU | MLP) -> features; heads: action distribution, value, next observation."""

    def __init__(self, kind, obs_dim, act_dim, discrete, hidden, state_size, in_context, layer_norm=False):
        super().__init__()
        self.kind = kind
        self.discrete = discrete
        self.in_context = in_context
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.hidden = hidden
        self.state_size = state_size
        in_dim = obs_dim
        if in_context:
            in_dim = obs_dim + act_dim + 1
        self.encoder = layer_init(nn.Linear(in_dim, hidden))
        if kind == "ssm":
            self.core = LRU(hidden, state_size)
        elif kind == "gru":
            self.core = nn.GRU(hidden, hidden)
        else:
            self.core = layer_init(nn.Linear(hidden, hidden))
        if layer_norm:
            self.norm = nn.LayerNorm(hidden)
        else:
            self.norm = nn.Identity()
        self.fc = layer_init(nn.Linear(hidden, hidden))
        self.pi = layer_init(nn.Linear(hidden, act_dim), std=0.01)
        self.log_std = None
        if not discrete:
            self.log_std = nn.Parameter(torch.zeros(act_dim))
        self.value_head = layer_init(nn.Linear(hidden, 1), std=1.0)
        self.dyn_head = layer_init(nn.Linear(hidden + act_dim, obs_dim), std=1.0)

    def initial_state(self, n):
        width = {"ssm": 2 * self.state_size, "gru": self.hidden, "mlp": 0}[self.kind]
        return torch.zeros(n, width, dtype=self.encoder.weight.dtype, device=self.encoder.weight.device)

    def make_input(self, obs, prev_action, prev_reward):
        """prev_action is a vector (one-hot for discrete actions), zero on the first step of an episode."""
        if self.in_context:
            return torch.cat([obs, prev_action, prev_reward], -1)
        return obs

    def forward(self, inputs, starts, state, actions=None):
        """inputs (T, B, in_dim), starts (T, B) bool; next_obs only when `actions` (T, B, .) are given."""
        h = torch.tanh(self.encoder(inputs))
        if self.kind == "mlp":
            z = torch.tanh(self.core(h))
        elif self.kind == "ssm":
            y, state = self.core.scan(h, state, starts)
            z = F.gelu(y) + h
        else:
            z, state = self.gru_sequence(h, starts, state)
        feats = torch.tanh(self.fc(self.norm(z)))
        next_obs = None
        if actions is not None:
            a = actions
            if self.discrete:
                a = F.one_hot(actions.long()[..., 0], self.act_dim).to(feats.dtype)
            next_obs = self.dyn_head(torch.cat([feats, a], -1))
        return AgentOutput(
            pi=self.pi(feats),
            log_std=self.log_std,
            value=self.value_head(feats.detach())[..., 0],
            feats=feats,
            next_obs=next_obs,
            state=state,
        )

    def gru_sequence(self, h, starts, state):
        """The GRU over a sequence: one fused call when the only reset is the first step, else step by step."""
        T = h.shape[0]
        if starts[1:].any():
            spans = [(t, t + 1) for t in range(T)]
        else:
            spans = [(0, T)]
        ys = []
        for t0, t1 in spans:
            # zero the state where an episode starts
            y_t, hn = self.core(h[t0:t1], (state * (~starts[t0]).unsqueeze(-1)).unsqueeze(0))
            ys.append(y_t)
            state = hn[0]
        return torch.cat(ys), state


def make_dist(out, discrete):
    # no argument validation: it branches on the values, which vmap cannot
    if discrete:
        return torch.distributions.Categorical(logits=out.pi, validate_args=False)
    return torch.distributions.Normal(out.pi, torch.exp(out.log_std).expand_as(out.pi), validate_args=False)


def log_prob(dist, actions, discrete):
    if discrete:
        return dist.log_prob(actions[..., 0].long())
    return dist.log_prob(actions).sum(-1)


def entropy(out, discrete):
    ent = make_dist(out, discrete).entropy()
    if discrete:
        return ent
    return ent.sum(-1)


def build_agent(args: Args, env_cls) -> Agent:
    width = policy_width(args, env_cls)
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete)
    return Agent(args.policy, *spec, width, args.state_size, args.in_context, args.layer_norm)


# ROLLOUT
def sample_task_batches(model, params, task_params, args, gen, num_steps, inner_lrs):
    """Per task: fast batches sampled after 0..num_steps-1 inner steps, then the post-adaptation "val" batch."""
    K = len(task_params)
    env = make_env(args, task_params, args.fast_batch_size, gen)
    task_p = per_task(params, K)
    train_batches = [[] for _ in range(K)]
    returns = []
    for j in range(num_steps + 1):
        parts = split_batch(rollout(model, task_p, env, args.max_episode_steps), K)  # rows grouped by task
        if args.fill_steps:
            parts = fill_to_steps(model, parts, task_p, task_params, args, gen)
        returns.append(torch.stack([(b["rewards"] * b["masks"]).sum(0).mean() for b in parts]))
        # ADVANTAGES (GAE)
        for b in parts:
            b["advantages"] = compute_advantages(b, args.gamma, args.gae_lambda)
        device = model.encoder.weight.device
        parts = [{k: v.to(device) for k, v in b.items()} for b in parts]
        if j == num_steps:
            tasks_data = [{"train": train_batches[i], "val": parts[i]} for i in range(K)]
            return tasks_data, returns
        # the inner step of every task: the next batch is sampled with theta'
        adapted = []
        for i, b in enumerate(parts):
            train_batches[i].append(b)
            theta_prime = inner_update(model, take(task_p, i), b, inner_lrs[j], False)
            adapted.append(clone_params(theta_prime))
        task_p = stack_params(adapted)


@torch.no_grad()
def rollout(model, params, env, horizon, adapt_every=0, adapt_on=None):
    """env.n episodes, rows grouped by task, task k acting with params[.][k]; time-major (T, n, ...) tensors.
    Online: every `adapt_every` steps, `adapt_on(episodes so far)` returns new stacked parameters."""
    K = len(next(iter(params.values())))
    n = env.n
    per = n // K
    device = model.encoder.weight.device  # the tasks step on CPU, the policy acts on its device
    obs = env.reset()
    prev_a = torch.zeros(n, model.act_dim)
    prev_r = torch.zeros(n, 1)
    state = model.initial_state(n).reshape(K, per, -1)
    alive = torch.ones(n, dtype=torch.bool)
    buf = {k: [] for k in ("obs", "inputs", "actions", "rewards", "masks", "next_obs", "logp", "states")}

    def act(p, x, start, st):  # one step of one task; vmap returns tensors only
        out = functional_call(model, p, (x[None], start[None], st))
        return out.pi, out.state

    for t in range(horizon):
        if adapt_every and t > 0 and t % adapt_every == 0:
            params = adapt_on(stack_steps(buf))
        inp = model.make_input(obs, prev_a, prev_r)
        state_in = state.reshape(n, -1).cpu()  # the recurrent state this step starts from (stored for replay)
        starts = torch.full((K, per), t == 0, device=device)
        x = inp.reshape(K, per, -1).to(device)
        if model.kind == "gru":  # the GRU's fused kernel cannot be vmapped: one task at a time
            outs = [act(take(params, i), x[i], starts[i], state[i]) for i in range(K)]
            pi = torch.stack([o[0] for o in outs])
            state = torch.stack([o[1] for o in outs])
        else:
            pi, state = vmap(act)(params, x, starts, state)
        log_std = None
        if not model.discrete:
            log_std = params["log_std"].repeat_interleave(per, 0)
        dist = make_dist(AgentOutput(pi=pi[:, 0].reshape(n, -1), log_std=log_std), model.discrete)
        action = dist.sample()
        if model.discrete:
            action = action[:, None].float()
        logp = log_prob(dist, action, model.discrete).cpu()
        action = action.cpu()
        next_obs, reward, done = env.step(action)
        buf["obs"].append(obs)
        buf["inputs"].append(inp)
        buf["actions"].append(action)
        buf["rewards"].append(reward * alive)
        buf["masks"].append(alive.clone())
        buf["next_obs"].append(next_obs)
        buf["logp"].append(logp)
        buf["states"].append(state_in)
        alive = alive & ~done
        prev_a = action
        if model.discrete:
            prev_a = F.one_hot(action[:, 0].long(), model.act_dim).float()
        obs = next_obs
        prev_r = reward[:, None]
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
            episode_steps = b["masks"].sum(0)
            before = steps[i] + torch.cumsum(episode_steps, 0) - episode_steps  # steps held before each episode
            keep = int((before < budget).sum())
            batches[i] = concat_episodes([batches[i], {k: v[:, :keep] for k, v in b.items()}])
            steps[i] = int(batches[i]["masks"].sum())


def concat_episodes(parts):
    """Episodes of several time-major batches side by side; shorter ones are padded with masked-out steps."""
    T = max(b["masks"].shape[0] for b in parts)
    return {k: torch.cat([pad_steps(b[k], T) for b in parts], 1) for k in parts[0]}


def pad_steps(v, T):
    if v.shape[0] < T:
        return torch.cat([v, v.new_zeros((T - v.shape[0], *v.shape[1:]))])
    return v


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


# ADVANTAGES (GAE)
def compute_advantages(batch, gamma, gae_lambda):
    """GAE with the linear baseline, normalised over the task's valid steps."""
    values = linear_baseline(batch, gamma)
    masks = batch["masks"].double()
    rewards = batch["rewards"].double()
    T = masks.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros(masks.shape[1], dtype=torch.float64)
    for t in reversed(range(T)):
        next_v = 0.0
        next_m = 0.0
        if t + 1 < T:
            next_v = values[t + 1] * masks[t + 1]
            next_m = masks[t + 1]
        delta = rewards[t] + gamma * next_v - values[t]
        last = delta + gamma * gae_lambda * next_m * last
        adv[t] = last * masks[t]
    valid = adv[masks > 0]
    # one valid step has no spread (its std is NaN, which no guard catches): it is centred to 0, not scaled
    scale = torch.ones((), dtype=valid.dtype)
    if valid.numel() > 1:
        scale = valid.std()
    adv = (adv - valid.mean()) / (scale + 1e-8) * masks
    return adv.float()


def linear_baseline(batch, gamma, reg=1e-5):
    """Linear feature baseline (Duan et al. 2016): ridge fit of the return on [obs, obs^2, t, t^2, t^3, 1]."""
    obs = batch["obs"].double()
    masks = batch["masks"].double()
    rewards = batch["rewards"].double()
    T, n = masks.shape
    ret = torch.zeros_like(rewards)
    running = torch.zeros(n, dtype=torch.float64)
    for t in reversed(range(T)):
        running = rewards[t] + gamma * running * masks[t]
        ret[t] = running
    o = obs.clamp(-10, 10)
    al = (torch.arange(T, dtype=torch.float64) / 100.0)[:, None, None].expand(T, n, 1)
    X = torch.cat([o, o**2, al, al**2, al**3, torch.ones_like(al)], -1) * masks[..., None]
    Xf = X.reshape(-1, X.shape[-1])
    yf = (ret * masks).reshape(-1)
    A = Xf.T @ Xf
    rhs = Xf.T @ yf
    for _ in range(5):  # raise the ridge until the solve is finite (degenerate features, e.g. constant obs)
        w = torch.linalg.solve(A + reg * torch.eye(A.shape[0], dtype=A.dtype), rhs)
        if torch.isfinite(w).all():
            break
        reg *= 10
    return (X @ w) * masks


# INNER STEP
def inner_update(model, params, batch, lr, create_graph):
    """theta' = theta - lr * grad inner_loss(theta); differentiable in theta unless create_graph is False."""
    g = grad(inner_loss, argnums=1)(model, params, batch)
    if create_graph:
        return {k: params[k] - lr * g[k] for k in params}
    return {k: params[k] - lr * g[k].detach() for k in params}


def inner_loss(model, params, batch):
    """The inner objective, -E[log pi(a|s) A] on GAE advantages (from rewards through the linear baseline)."""
    logp = log_prob(make_dist(policy_out(model, params, batch), model.discrete), batch["actions"], model.discrete)
    return -masked_mean(logp * batch["advantages"], batch["masks"])


def policy_out(model, params, batch, actions=None):
    """The policy's output on a batch's sequences, from the state they start in: the stored one for replayed
    transitions, zero for fresh episodes; next_obs only when `actions` are given."""
    if "state0" in batch:
        state = batch["state0"]
    else:
        state = model.initial_state(batch["masks"].shape[1])
    return functional_call(model, params, (batch["inputs"], batch["starts"], state), {"actions": actions})


def masked_mean(x, masks):
    return (x * masks).sum() / masks.sum()


# META-OBJECTIVE
def meta_objective(model, params, tasks_data, args, old_outs=None, create_graph=True):
    """Mean over tasks of -E[pi_theta'/pi_old A] on post-adaptation episodes, and of KL(old || new) there."""
    losses = []
    kls = []
    outs = []
    with torch.set_grad_enabled(create_graph and torch.is_grad_enabled()):
        for i, td in enumerate(tasks_data):
            adapted = params
            for b in td["train"]:  # theta' after one inner step on each of the task's fast batches
                adapted = inner_update(model, adapted, b, args.inner_lr, not args.first_order)
            val = td["val"]
            out = policy_out(model, adapted, val)
            if old_outs is None:
                old = detached_dist_params(out)
            else:
                old = old_outs[i]
            outs.append(old)
            new_logp = log_prob(make_dist(out, model.discrete), val["actions"], model.discrete)
            old_logp = log_prob(make_dist(old, model.discrete), val["actions"], model.discrete)
            ratio = torch.exp(new_logp - old_logp)
            losses.append(-masked_mean(ratio * val["advantages"], val["masks"]))
            kls.append(masked_mean(kl_divergence(old, out, model.discrete), val["masks"]))
    return torch.stack(losses).mean(), torch.stack(kls).mean(), outs


def detached_dist_params(out):
    """The action distribution's parameters of a policy output, detached: the policy that sampled."""
    log_std = None
    if out.log_std is not None:
        log_std = out.log_std.detach()
    return AgentOutput(pi=out.pi.detach(), log_std=log_std)


def kl_divergence(old, new, discrete):
    """KL(old || new) per step, summed over action dimensions."""
    if discrete:
        lo = F.log_softmax(old.pi, -1)
        ln = F.log_softmax(new.pi, -1)
        return (lo.exp() * (lo - ln)).sum(-1)
    ls_o = old.log_std.expand_as(old.pi)
    ls_n = new.log_std.expand_as(new.pi)
    return (ls_n - ls_o + (torch.exp(2 * ls_o) + (old.pi - new.pi) ** 2) / (2 * torch.exp(2 * ls_n)) - 0.5).sum(-1)


# UPDATE: TRPO'S OUTER STEP, OR ONE ADAM STEP
def trpo_step(model, tasks_data, args):
    """TRPO outer update: conjugate-gradient natural gradient, KL-radius scaling, backtracking line search."""
    plist = list(model.parameters())
    loss, _, old_outs = meta_objective(model, dict(model.named_parameters()), tasks_data, args)
    g = flat_grad(loss, plist)
    keep = range(len(tasks_data))
    if args.cg_subsample < 1:  # the Fisher of a random subset of the tasks (other maths)
        keep = torch.randperm(len(tasks_data))[: max(1, round(args.cg_subsample * len(tasks_data)))].tolist()
    stages = fisher_graphs(model, [tasks_data[i] for i in keep], args)
    fvp = functools.partial(fisher_product, stages, args.cg_damping)
    step_dir = conjugate_gradient(fvp, -g, args.cg_iters)
    # the multiple of step_dir at the trust region's edge, 0.5 s^T F s = max_kl
    step = step_dir * torch.sqrt(2 * args.max_kl / (step_dir @ fvp(step_dir) + 1e-12))
    old_flat = torch.cat([p.detach().reshape(-1) for p in plist])
    # LINE SEARCH: the largest fraction of the step that lowers the surrogate within the KL bound, else no step
    frac = 1.0
    accepted = False
    new_kl = torch.tensor(0.0)
    ls_steps = 0
    while ls_steps < args.ls_max_steps:
        ls_steps += 1
        torch.nn.utils.vector_to_parameters(old_flat + frac * step, plist)
        params = dict(model.named_parameters())
        new_loss, new_kl, _ = meta_objective(model, params, tasks_data, args, old_outs, create_graph=False)
        accepted = (new_loss - loss).item() < 0 and new_kl.item() <= args.max_kl
        if accepted:
            break
        frac *= args.ls_backtrack_ratio
    if not accepted:
        torch.nn.utils.vector_to_parameters(old_flat, plist)
    approx_kl = 0.0
    if accepted:
        approx_kl = new_kl.item()
    return {
        "outer_loss": loss.item(),
        "approx_kl": approx_kl,
        "line_search_steps": ls_steps,
        "accepted": float(accepted),
        "expected_improve": -(g @ step).item(),
    }


def flat_grad(out, plist, **kw):
    grads = torch.autograd.grad(out, plist, allow_unused=True, **kw)
    flat = []
    for g, p in zip(grads, plist):
        if g is None:
            g = torch.zeros_like(p)
        flat.append(g.reshape(-1))
    return torch.cat(flat)


def fisher_graphs(model, tasks_data, args):
    """The graphs fisher_product goes through, built once per outer step: per task, one (leaves, outputs) stage per
    inner step (theta' of the step's input, detached into leaves that require grad), then (theta' leaves, the gradient
    of the task's KL(old || pi_theta') in theta')."""
    stages = []
    for td in tasks_data:
        chain = []
        p = dict(model.named_parameters())
        for b in td["train"]:
            q = leaf_params(p)
            p = inner_update(model, q, b, args.inner_lr, not args.first_order)
            chain.append((q, p))
        q = leaf_params(p)
        out = policy_out(model, q, td["val"])
        kl = masked_mean(kl_divergence(detached_dist_params(out), out, model.discrete), td["val"]["masks"])
        kl_grad = torch.autograd.grad(kl, list(q.values()), create_graph=True, allow_unused=True)
        chain.append((q, dict(zip(q, kl_grad))))
        stages.append(chain)
    return stages


def leaf_params(params):
    """Detached copies that require grad: the inputs of one stage of fisher_graphs."""
    return {k: v.detach().requires_grad_() for k, v in params.items()}


def fisher_product(stages, damping, v):
    """F v + damping v, F the Hessian at theta of the mean KL(old || pi_theta'). The KL's gradient in theta' is zero
    there, so F = mean_i A_i^T G_i A_i: G_i the Hessian of task i's KL in theta', A_i = d theta'/d theta = prod_j (I -
    alpha H_j), H_j an inner loss's (symmetric) Hessian. So: A_i v (each A_j is symmetric: a vjp too), then G_i, then
    A_i^T, 2J + 1 second-order vjps through fisher_graphs' stages, each one backward call for every task at once."""
    sizes = [q.numel() for q in stages[0][0][0].values()]
    vs = [v] * len(stages)
    J = len(stages[0]) - 1
    for j in [*range(J + 1), *reversed(range(J))]:
        # every task's v^T d(output of stage j) / d(its leaves)
        outs = []
        us = []
        for chain, v_i in zip(stages, vs):
            for o, u in zip(chain[j][1].values(), v_i.split(sizes)):
                if o is not None:
                    outs.append(o)
                    us.append(u.view_as(o))
        leaves = [q for chain in stages for q in chain[j][0].values()]
        vs = list(flat_grad(outs, leaves, grad_outputs=us, retain_graph=True).split(sum(sizes)))
    return torch.stack(vs).mean(0) + damping * v


def conjugate_gradient(Avp, b, iters, tol=1e-10):
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r @ r
    for _ in range(iters):
        Ap = Avp(p)
        alpha = rr / (p @ Ap)
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = r @ r
        if rr_new < tol:
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def adam_step(model, tasks_data, args, outer_opt):
    """--outer-optimizer adam: one Adam step on TRPO's meta-objective, without its trust region."""
    loss, _, old_outs = meta_objective(model, dict(model.named_parameters()), tasks_data, args)
    outer_opt.zero_grad()
    loss.backward()
    outer_opt.step()
    _, kl, _ = meta_objective(model, dict(model.named_parameters()), tasks_data, args, old_outs, create_graph=False)
    return {"outer_loss": loss.item(), "approx_kl": kl.item(), "line_search_steps": 0, "accepted": 1.0}


# AUXILIARY HEADS
def make_aux_optimizer(model, args):
    """Adam on the value and dynamics heads; the trunk's rate, not a loss weight, scales the dynamics loss (Adam
    ignores a loss's scale)."""
    heads = list(model.value_head.parameters()) + list(model.dyn_head.parameters())
    groups = [{"params": heads, "lr": args.aux_lr}]
    if args.dynamics_coef > 0:
        not_trunk = ("value_head", "dyn_head", "pi", "log_std")
        trunk = [p for n, p in model.named_parameters() if not n.startswith(not_trunk)]
        groups.append({"params": trunk, "lr": args.dynamics_coef * args.aux_lr})
    return torch.optim.Adam(groups)


def aux_update(model, tasks_data, args, aux_opt, monitor):
    """One Adam step of the value (diagnostic) and next-observation heads; returns (value loss, dynamics loss)."""
    v_losses = []
    d_losses = []
    aux_opt.zero_grad()
    for td in tasks_data:
        b = td["val"]
        m = b["masks"]
        out = policy_out(model, dict(model.named_parameters()), b)
        monitor.update(out.feats, m)
        ret = torch.flip(torch.cumsum(torch.flip(b["rewards"], [0]), 0), [0])
        v_loss = masked_mean((out.value - ret) ** 2, m)
        feats = out.feats
        if args.dynamics_coef == 0:
            feats = feats.detach()
        a = b["actions"]
        if model.discrete:
            a = F.one_hot(b["actions"].long()[..., 0], model.act_dim).float()
        d_loss = masked_mean(((model.dyn_head(torch.cat([feats, a], -1)) - b["next_obs"]) ** 2).mean(-1), m)
        ((v_loss + d_loss) / len(tasks_data)).backward()
        v_losses.append(v_loss.item())
        d_losses.append(d_loss.item())
    aux_opt.step()
    return float(np.mean(v_losses)), float(np.mean(d_losses))


# META-TRAINING
def train(args: Args):
    """Meta-trains a policy with MAML (`train` subcommand); with --resume, continues a --ckpt-dir checkpoint's run."""
    saved = None
    if args.resume:
        from cleanrl_astral_utils.maml import read_resume_state

        saved = read_resume_state(read_checkpoint(args.resume, SCRIPT, Args), args, args.resume)
    run_dir, writer = start_run(args, saved)
    gen = torch.Generator().manual_seed(args.seed)
    train_rng, _ = task_streams(args.seed)
    env_cls = ENV_CLASSES[args.task]
    device = torch.device("cpu")
    if args.cuda and torch.cuda.is_available():
        device = torch.device("cuda")
    model = build_agent(args, env_cls).to(device)
    print_param_counts(model, args, env_cls)
    print(f"device {device}")
    aux_opt = make_aux_optimizer(model, args)
    outer_opt = None
    if args.outer_optimizer == "adam":
        outer_opt = torch.optim.Adam(model.parameters(), lr=args.outer_lr)
    buffer = make_buffer(args, model, env_cls)
    monitor = FeatureMonitor(model.hidden)
    train_tasks = []
    global_step = 0
    spent = {"wall": 0.0, "cpu": 0.0}
    if saved is not None:
        from cleanrl_astral_utils.maml import restore_training

        train_tasks, global_step, spent = restore_training(saved, model, aux_opt, outer_opt, buffer, monitor, gen, train_rng)
        print(f"resumed {args.resume} after {len(train_tasks)} outer steps, {spent['cpu']:.1f} CPU-seconds spent")
    start_time = time.time() - spent["wall"]
    start_cpu = time.process_time() - spent["cpu"]
    for it in range(len(train_tasks) + 1, args.outer_steps + 1):
        it_start = time.time()
        task_params = sample_tasks(args.task, train_rng, args.tasks_per_batch, "train")
        train_tasks.append(task_params)

        # ROLLOUT: per task, fast batches with theta (and theta after j inner steps), then the post-adaptation batch;
        # each batch gets its ADVANTAGES (GAE) as it is sampled, since the inner step that follows needs them
        theta = {k: v.detach() for k, v in model.named_parameters()}
        inner_lrs = [args.inner_lr] * args.num_inner_steps
        tasks_data, returns = sample_task_batches(model, theta, task_params, args, gen, args.num_inner_steps, inner_lrs)
        if buffer is not None:  # task id = index of the task in the checkpoint's task_split["train_tasks"]
            for i, td in enumerate(tasks_data):
                add_batch_to_buffer(buffer, td["val"], (it - 1) * args.tasks_per_batch + i)
        steps = 0
        for td in tasks_data:
            for b in td["train"] + [td["val"]]:
                steps += b["masks"].sum().item()
        inner_l = float("nan")
        if args.diagnostics and args.num_inner_steps:
            with torch.no_grad():  # before the outer step, which updates theta's storage in place
                inner_l = np.mean([inner_loss(model, theta, td["train"][0]).item() for td in tasks_data])

        # UPDATE: the meta step on the post-adaptation episodes, then one step of the value and dynamics heads
        if args.outer_optimizer == "trpo":
            stats = trpo_step(model, tasks_data, args)
        else:
            stats = adam_step(model, tasks_data, args, outer_opt)
        v_loss, d_loss = aux_update(model, tasks_data, args, aux_opt, monitor)

        # LOGGING: returns before, during and after adaptation, the losses, the outer step's statistics
        global_step += int(steps)
        pre = returns[0].mean().item()
        post = returns[-1].mean().item()
        writer.add_scalar("meta/pre_adapt_return", pre, global_step)
        for j in range(1, len(returns) - 1):
            writer.add_scalar(f"meta/return_after_{j}_steps", returns[j].mean().item(), global_step)
        writer.add_scalar("meta/post_adapt_return", post, global_step)
        writer.add_scalar("charts/episodic_return", post, global_step)
        writer.add_scalar("charts/episodic_length", tasks_data[0]["val"]["masks"].sum(0).mean().item(), global_step)
        if args.diagnostics:
            writer.add_scalar("losses/inner_loss", inner_l, global_step)
        writer.add_scalar("losses/outer_loss", stats["outer_loss"], global_step)
        writer.add_scalar("losses/approx_kl", stats["approx_kl"], global_step)
        writer.add_scalar("losses/value_loss", v_loss, global_step)
        writer.add_scalar("losses/dynamics_loss", d_loss, global_step)
        writer.add_scalar("meta/line_search_steps", stats["line_search_steps"], global_step)
        writer.add_scalar("meta/step_accepted", stats["accepted"], global_step)
        buffer_size = 0
        if buffer is not None:
            buffer_size = len(buffer)
        writer.add_scalar("meta/buffer_size", buffer_size, global_step)
        if args.outer_optimizer == "adam":
            writer.add_scalar("charts/learning_rate", args.outer_lr, global_step)
        dt = time.time() - it_start
        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("meta/iteration_time", dt, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        if it % args.log_every == 0 or it == 1 or it == args.outer_steps:
            print_progress(it, args, global_step, sps, pre, post, stats, dt, time.time() - start_time)
        out_of_budget = args.cpu_budget > 0 and time.process_time() - start_cpu >= args.cpu_budget
        if args.ckpt_dir and (it % args.ckpt_every == 0 or it == args.outer_steps or out_of_budget):
            times = run_times(start_time, start_cpu, train_tasks)
            training = training_state(aux_opt, outer_opt, gen, train_rng, global_step, run_dir)
            save_model_checkpoint(model, args, train_tasks, buffer, monitor, times, training)
        if out_of_budget:
            print(f"--cpu-budget {args.cpu_budget:g}s reached after {it} of {args.outer_steps} outer steps")
            break

    times = run_times(start_time, start_cpu, train_tasks)
    log_scalars(writer, {f"meta/{k}": v for k, v in times.items()}, global_step)
    print(f"meta-training wall time {times['train_wall_time']:.1f}s, CPU time {times['train_cpu_time']:.1f}s")
    if args.save_model:
        path = save_model_checkpoint(model, args, train_tasks, buffer, monitor, times, None, run_dir)
        evaluate_saved_model(path, writer)
    writer.close()


# EVALUATION
@dataclass
class EvalArgs:
    checkpoint: str
    """path of a .cleanrl_model written by `train --save-model` or `train --ckpt-dir`"""
    config: str | None = None
    """the checkpoint's --config (default); another one is refused: the preset was applied when it was trained"""
    episodes: int | None = None
    """episodes each test task runs at each of the 0..num_steps inner steps (default: the checkpoint's eval_episodes,
    else its fast_batch_size); the run is num_tasks x (num_steps + 1) x episodes episodes"""
    eval_seed: int | None = None
    """seed of the test-task stream and the sampling (default: the checkpoint's seed)"""
    num_tasks: int | None = None
    """number of fresh test tasks (default: the checkpoint's eval_tasks)"""
    num_steps: int | None = None
    """evaluate returns after 0..num_steps inner steps (default: the checkpoint's eval_steps)"""
    inner_lr: float | None = None
    """first-step size (default: the checkpoint's inner_lr)"""
    later_lr_scale: float | None = None
    """later steps use inner_lr * this (paper: alpha then alpha/2; default: the checkpoint's eval_later_lr_scale)"""


def evaluate_command(args: EvalArgs):
    """Returns after 0..K inner steps on fresh test tasks (`eval` subcommand); writes eval.json beside the checkpoint."""
    validate(args)
    _, ckpt_args, _ = load_checkpoint(args.checkpoint)
    check_config(args, ckpt_args)
    torch.set_num_threads(1)
    result = evaluate(
        args.checkpoint,
        args.num_tasks,
        args.num_steps,
        args.inner_lr,
        args.later_lr_scale,
        args.episodes,
        args.eval_seed,
    )
    print(json.dumps(result))


def evaluate(
    checkpoint,
    num_tasks=None,
    num_steps=None,
    inner_lr=None,
    later_lr_scale=None,
    episodes=None,
    eval_seed=None,
):
    """Returns on fresh test tasks after 0..num_steps inner steps; None takes the checkpoint's setting."""
    model, args, ckpt = load_checkpoint(checkpoint)
    if num_tasks is None:
        num_tasks = args.eval_tasks
    if num_steps is None:
        num_steps = args.eval_steps
    if later_lr_scale is None:
        later_lr_scale = args.eval_later_lr_scale
    if inner_lr is None:
        inner_lr = args.inner_lr
    if eval_seed is None:
        eval_seed = args.seed
    if episodes is None:
        episodes = args.eval_episodes
    if episodes is not None:
        args.fast_batch_size = episodes
    torch.manual_seed(eval_seed)
    gen = torch.Generator().manual_seed(eval_seed)
    tasks = sample_tasks(args.task, task_streams(eval_seed)[1], num_tasks, "test")
    seen = np.asarray(ckpt["task_split"]["train_tasks"]).reshape(-1, tasks.shape[1])
    if len(seen) and (np.abs(seen[None] - tasks[:, None]).max(-1) < 1e-12).any():
        raise ValueError("a test task coincides with a training task")
    theta = clone_params(dict(model.named_parameters()))
    lrs = [inner_lr] + [inner_lr * later_lr_scale] * max(num_steps - 1, 0)
    _, returns = sample_task_batches(model, theta, tasks, args, gen, num_steps, lrs)
    result = {"task": args.task, **summarise([r.numpy() for r in returns]), "num_tasks": num_tasks}
    path = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "eval.json")
    write_results(result, path, "plot_eval", args.policy)
    return result


def load_checkpoint(path, also=()):
    """(model, args, ckpt) of a checkpoint this script (or a script of `also`) wrote, or a ValueError with a one-line
    reason."""
    ckpt = read_checkpoint(path, SCRIPT, Args, also)
    args = Args(**ckpt["args"])
    try:
        validate(args)
    except ValueError as e:
        raise ValueError(f"checkpoint config is invalid: {e}") from e
    cartpole_ranges = {"train_ranges": CARTPOLE_TRAIN_RANGES, "test_ranges": CARTPOLE_TEST_RANGES}
    check_task_split(ckpt, args.task, TASK_VERSIONS[args.task], args.task == "cartpole-physics", cartpole_ranges)
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


# TEST-TIME ADAPTATION
@dataclass
class AdaptArgs:
    checkpoint: str
    """path of a .cleanrl_model written by `train --save-model` or `train --ckpt-dir`"""
    config: str | None = None
    """the checkpoint's --config (default); another one is refused: the preset was applied when it was trained"""
    episodes: int | None = None
    """episodes each test task runs at each of the 0..adapt_steps steps, per adapter and objective (default: the
    checkpoint's fast_batch_size); the run is num_tasks x (adapt_steps + 1) x episodes episodes per adapter and objective"""
    eval_seed: int | None = None
    """seed of the test-task stream and the sampling (default: the checkpoint's seed)"""
    num_tasks: int = 20
    """number of fresh test tasks"""
    adapt_steps: int = 5
    """adaptation steps K; returns are reported after 0..K steps"""
    adapt_lr: float = 1e-2
    """adaptation learning rate"""
    adaptation_mode: tuple[str, ...] = ("standard",)
    """one or more adapters: standard (loss_current: the objective on the task's own episodes) | hybrid
    (loss_current + experience_weight x loss_experience, the same objective on a batch of the checkpoint's training
    transitions: pg replays their actions with their stored advantages, dynamics their (obs, next_obs) pairs as the
    plan's MSE, entropy their inputs)"""
    adapt_objective: tuple[str, ...] = ("pg",)
    """one or more objectives: pg (uses rewards) | dynamics (reward-free next-obs prediction) | entropy (Tent)"""
    strategy: str = "none"
    """registered loss strategy: none | tent (adds --tent-coef x policy entropy; 0.01 is the plan's example weight)"""
    tent_coef: float = 0.01
    """weight of the entropy term of the tent strategy"""
    experience_weight: float = 0.1
    """hybrid: alpha of loss_current + alpha x loss_experience (the replayed batch's loss)"""
    experience_batch_size: int = 32
    """hybrid: training transitions per replayed batch, drawn uniformly from the checkpoint's ExperienceBuffer"""
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
    """the pipeline plan's online adaptation: the --adapt-steps steps run between batches, as without --online, then
    the last rollout, the one after K steps, adapts online during it every --online-every env steps"""
    online_every: int = 20
    """online mode: env steps between adaptation steps"""


def adapt_command(args: AdaptArgs):
    """Test-time adaptation (`adapt` subcommand): standard/hybrid x pg/dynamics/entropy; writes adapt.json."""
    validate(args)
    model, ckpt_args, ckpt = load_checkpoint(args.checkpoint, ADAPTS_CHECKPOINTS_OF)
    check_config(args, ckpt_args)
    validate_adapt_against(args, model, ckpt)
    torch.set_num_threads(1)
    from torch.utils.tensorboard import SummaryWriter

    stem = "adapt"
    if args.online:
        stem = "adapt_online"
    stem = os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), stem)
    writer = SummaryWriter(stem + "_tb")
    res = run_adaptation(args.checkpoint, args, writer)
    writer.close()
    write_results(res, stem + ".json", "plot_adapt")
    print(f"wrote {stem}.json")


def run_adaptation(checkpoint, aargs, writer=None):
    """Returns on fresh test tasks after 0..K adaptation steps for every adapter x objective."""
    model, args, ckpt = load_checkpoint(checkpoint, ADAPTS_CHECKPOINTS_OF)
    buffer = None
    if ckpt.get("buffer"):
        buffer = ExperienceBuffer.from_state_dict(ckpt["buffer"], model.initial_state(1).shape[1])
    monitor = None
    fs = ckpt.get("feature_stats")
    if fs and fs["count"] > 0:  # --outer-steps 0 has none
        monitor = FeatureMonitor(len(fs["mean"]), **fs)
    K = aargs.adapt_steps
    n_eps = aargs.episodes
    if n_eps is None:
        n_eps = args.fast_batch_size
    seed = aargs.eval_seed
    if seed is None:
        seed = args.seed
    tasks = sample_tasks(args.task, task_streams(seed)[1], aargs.num_tasks, "test")
    theta0 = clone_params(dict(model.named_parameters()))

    # the no-adaptation level: theta_0 on the episodes every run starts with
    batch = rollout(model, per_task(theta0, len(tasks)), seeded_env(args, tasks, n_eps, seed), args.max_episode_steps)
    base = task_returns(batch, len(tasks))
    results = {}
    for mode in aargs.adaptation_mode:
        for objective in aargs.adapt_objective:
            env = seeded_env(args, tasks, n_eps, seed)
            # replay draws from its own generator, so hybrid and standard see the same episodes
            replay_gen = torch.Generator().manual_seed(int(np.random.default_rng([seed, 2]).integers(2**62)))
            adapters = [ADAPTERS[mode](model, theta0, aargs, objective, aargs.adapt_lr, buffer, replay_gen) for _ in tasks]
            per_step = []
            step_logs = []
            mon = []
            # with --online the rollout calls this every --online-every env steps with the segment it has gathered
            adapt_online = functools.partial(adapt_step, adapters, objective, args, step_logs, online=True)
            for k in range(K + 1):
                acting = stack_params([ad.acting_params() for ad in adapters])
                online_every = 0
                if aargs.online and k == K:  # --online adapts online in the rollout after the K steps
                    online_every = aargs.online_every
                batch = rollout(model, acting, env, args.max_episode_steps, online_every, adapt_online)
                per_step.append(task_returns(batch, len(tasks)))
                stats = []
                for ad, part in zip(adapters, split_batch(batch, len(tasks))):
                    stats.append(monitor_stats(model, ad.acting_params(), part, monitor))
                mon.append({key: float(np.mean([st[key] for st in stats])) for key in stats[0]})
                # every task's adapter takes one step on its own rows of the batch
                if k < K:
                    adapt_step(adapters, objective, args, step_logs, batch)
            name = f"{mode}/{objective}"
            guard_fired_frac = 0.0
            if step_logs:
                guard_fired_frac = float(np.mean([s["guard_fired"] for s in step_logs]))
            results[name] = {
                **summarise(per_step),
                "monitor": mon,
                "guard_fired_frac": guard_fired_frac,
                "final_drift": float(np.mean([ad.drift() for ad in adapters])),
            }
            if writer is not None:
                log_adaptation(writer, f"tta/{mode}_{objective}/", step_logs, per_step, mon)
            steps = " ".join(f"{k}:{v:.2f}" for k, v in results[name]["returns_after_steps"].items())
            print(f"adapt {name}: {steps}", flush=True)
    return {
        "task": args.task,
        "num_tasks": len(tasks),
        "online": aargs.online,
        "online_mode": "plan" if aargs.online else None,
        "adapt_steps": K,
        "adapt_lr": aargs.adapt_lr,
        "experience_weight": aargs.experience_weight,
        "experience_batch_size": aargs.experience_batch_size,
        "no_adaptation": {"return": float(base.mean()), "ci95": mean_ci95_half_width(base)},
        "results": results,
    }


def log_adaptation(writer, tag, step_logs, per_step, mon):
    """`adapt`'s TensorBoard scalars of one adapter x objective: each adaptation step's statistics (x axis: the step
    of any task), then the return and monitor statistics after k steps (x axis: k)."""
    for i, row in enumerate(step_logs):
        for key in ("loss_before", "loss_after", "grad_norm", "drift", "guard_fired"):
            writer.add_scalar(tag + key, float(row[key]), i)
    for k, (r, row) in enumerate(zip(per_step, mon)):
        for key, v in {"return_after_steps": r.mean(), **row}.items():
            writer.add_scalar(tag + key, float(v), k)


def seeded_env(args, tasks, n_eps, seed):
    """Runs with the same parameters see the same episodes: both generators restart from `seed`."""
    torch.manual_seed(seed)
    return make_env(args, tasks, n_eps, torch.Generator().manual_seed(seed))


def task_returns(batch, num_tasks):
    """Each task's mean episode return: the batch holds num_tasks x episodes episodes, task-major."""
    return (batch["rewards"] * batch["masks"]).sum(0).reshape(num_tasks, -1).mean(1).numpy()


def adapt_step(adapters, objective, args, step_logs, batch, online=False):
    """One step of every task's adapter on its rows of `batch`; returns their new acting parameters. Inside a rollout
    (--online) the rollout calls it with the segment it has gathered."""
    for ad, b in zip(adapters, split_batch(batch, len(adapters))):
        if objective == "pg":
            b["advantages"] = compute_advantages(b, args.gamma, args.gae_lambda)
            # acted by other parameters than the adapted ones (the EMA, or earlier parameters within an online episode)
            if ad.ema is not None or online:
                b["behaviour_logp"] = b["logp"]
        with torch.enable_grad():
            step_logs.append(ad.step(b))
    return stack_params([ad.acting_params() for ad in adapters])


class StandardAdapter:
    """Guarded gradient steps on the task's objective from theta_0: clip, max step, trust region, optional EMA. It
    replays nothing: `buffer` and `replay_gen` are the hybrid adapter's (every adapter is built with the same call)."""

    def __init__(self, model, theta0, aargs, objective, lr, buffer=None, replay_gen=None):
        self.model = model
        self.aargs = aargs
        self.objective = objective
        self.theta0 = clone_params(theta0)
        self.names = select_params(list(theta0), aargs.adapt_params)
        self.params = clone_params(theta0)
        leaves = [self.params[k].requires_grad_(True) for k in self.names]
        if aargs.adapt_optimizer == "adam":
            self.opt = torch.optim.Adam(leaves, lr=lr)
        else:
            self.opt = torch.optim.SGD(leaves, lr=lr)
        self.ema = None
        if aargs.ema_decay > 0:
            self.ema = clone_params(self.params)

    def acting_params(self):
        if self.ema is not None:
            return self.ema
        return {k: v.detach() for k, v in self.params.items()}

    def loss(self, batch):
        """loss_current: the objective on the task's own episodes, shaped by the registered strategy (none; tent adds
        the policy's entropy)."""
        loss, out = objective_loss(self.model, self.params, batch, self.objective, self.aargs.max_importance_weight)
        return STRATEGIES[self.aargs.strategy](loss, out, batch["masks"], self)

    def drift(self):
        """Distance from the meta-learned theta_0, which the trust region bounds."""
        return torch.sqrt(sum(((self.params[k].detach() - self.theta0[k]) ** 2).sum() for k in self.names)).item()

    def step(self, batch):
        a = self.aargs
        loss = self.loss(batch)
        leaves = [self.params[k] for k in self.names]
        grads = []
        for g, p in zip(torch.autograd.grad(loss, leaves, allow_unused=True), leaves):
            if g is None:
                g = torch.zeros_like(p)
            grads.append(g)
        gnorm = torch.sqrt(sum((g**2).sum() for g in grads)).item()
        fired = {"clip": gnorm > a.grad_clip}
        before = [p.detach().clone() for p in leaves]
        for p, g in zip(leaves, grads):
            if fired["clip"]:
                g = g * (a.grad_clip / (gnorm + 1e-12))
            p.grad = g
        self.opt.step()
        with torch.no_grad():
            fired["max_step"] = project_to_ball(leaves, before, a.max_step_norm)
            fired["trust_region"] = project_to_ball(leaves, [self.theta0[k] for k in self.names], a.trust_region)
            if self.ema is not None:
                for k in self.names:
                    self.ema[k] = a.ema_decay * self.ema[k] + (1 - a.ema_decay) * self.params[k].detach()
        with torch.enable_grad():
            after = self.loss(batch).item()
        return {
            "loss_before": loss.item(),
            "loss_after": after,
            "grad_norm": gnorm,
            "drift": self.drift(),
            "guard_fired": any(fired.values()),
            **{f"fired_{k}": v for k, v in fired.items()},
        }


class HybridAdapter(StandardAdapter):
    """The standard adapter's guarded step on loss_current + experience_weight x loss_experience, loss_experience the
    same objective on a batch of the checkpoint's training transitions, drawn once per step."""

    def __init__(self, model, theta0, aargs, objective, lr, buffer=None, replay_gen=None):
        super().__init__(model, theta0, aargs, objective, lr)
        self.buffer = buffer
        self.replay_gen = replay_gen

    def step(self, batch):
        self.replay = replay_as_batch(self.buffer.sample(self.aargs.experience_batch_size, self.replay_gen))
        return super().step(batch)

    def loss(self, batch):
        loss_current = super().loss(batch)
        if self.aargs.experience_weight == 0:
            return loss_current
        loss_experience = super().loss(self.replay)
        return loss_current + self.aargs.experience_weight * loss_experience


ADAPTERS = {"standard": StandardAdapter, "hybrid": HybridAdapter}
# `adapt` adapts the policies ProMP meta-trains too: maml_ssm_promp.py's tasks, policies and rollout are this file's
ADAPTS_CHECKPOINTS_OF = ("maml_ssm_promp",)


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
    if objective == "dynamics" and model.in_context:  # reward-free: the previous reward is zeroed in the input
        inputs = batch["inputs"]
        batch = {**batch, "inputs": torch.cat([inputs[..., :-1], torch.zeros_like(inputs[..., -1:])], -1)}
    out = policy_out(model, params, batch, batch["actions"])
    if objective == "dynamics":
        return masked_mean(((out.next_obs - batch["next_obs"]) ** 2).mean(-1), m), out
    return masked_mean(entropy(out, model.discrete), m), out


def replay_as_batch(sample):
    """Replayed transitions as length-1 sequences, each continuing from its stored recurrent state."""
    B = len(sample["obs"])
    return {
        **{k: sample[k][None] for k in ("inputs", "actions", "advantages", "rewards", "next_obs", "obs")},
        "starts": torch.zeros(1, B, dtype=torch.bool),
        "state0": sample["states"],
        "masks": torch.ones(1, B),
    }


def no_strategy(loss, out, masks, adapter):
    return loss


def tent_strategy(loss, out, masks, adapter):
    """Tent: plus --tent-coef x the policy's mean entropy."""
    return loss + adapter.aargs.tent_coef * masked_mean(entropy(out, adapter.model.discrete), masks)


# a strategy maps (loss, model output, masks, adapter) to the loss that is minimised; register more by name
STRATEGIES = {"none": no_strategy, "tent": tent_strategy}


def register_adaptation_strategy(name):
    """Decorator: STRATEGIES[name] = the decorated function."""

    def register(fn):
        STRATEGIES[name] = fn
        return fn

    return register


PARAM_GROUPS = {"all": ("",), "ssm": ("core.",), "heads": ("pi.", "log_std", "value_head.", "dyn_head."), "norm": ("norm.",)}
OBJECTIVES = ("pg", "dynamics", "entropy")


def select_params(names, which):
    """Names of the adapted parameters: all | ssm (the core) | heads | norm (LayerNorm affine)."""
    return [n for n in names if n.startswith(PARAM_GROUPS[which])]


def project_to_ball(params, centre, radius):
    """Scales params - centre down to norm `radius` where it is longer (in place); returns whether it did."""
    dist = torch.sqrt(sum(((p - c) ** 2).sum() for p, c in zip(params, centre))).item()
    if not dist > radius:  # NaN included
        return False
    for p, c in zip(params, centre):
        p.copy_(c + (p - c) * (radius / dist))
    return True


@torch.no_grad()
def monitor_stats(model, params, batch, monitor):
    """Predictive entropy, confidence (exp(-entropy) per step) and feature shift versus training statistics."""
    out = policy_out(model, params, batch)
    ent = entropy(out, model.discrete)
    m = batch["masks"]
    stats = {"entropy": masked_mean(ent, m).item(), "confidence": masked_mean(torch.exp(-ent), m).item()}
    if monitor is not None:
        stats["feature_shift"] = monitor.shift(out.feats, m)
    return stats


# PLUMBING: THE EXPERIENCE BUFFER AND THE FEATURE MONITOR THAT TRAIN FILLS
class ExperienceBuffer:
    """Ring buffer of meta-training transitions, with the policy input, advantage and recurrent state acted from;
    saved with the checkpoint for `adapt --adaptation-mode hybrid`."""

    FIELDS = ("obs", "inputs", "actions", "rewards", "next_obs", "dones", "advantages", "task_ids", "states")

    def __init__(self, capacity, obs_dim, in_dim, act_dim, state_dim=0):
        widths = dict(obs=(obs_dim,), inputs=(in_dim,), actions=(act_dim,), next_obs=(obs_dim,), states=(state_dim,))
        dtypes = {"dones": torch.bool, "task_ids": torch.long}
        self.data = {k: torch.zeros((capacity, *widths.get(k, ())), dtype=dtypes.get(k, torch.float32)) for k in self.FIELDS}
        self.capacity = capacity
        self.pos = 0
        self.size = 0

    def add(self, **items):
        n = len(items["obs"])
        # an oversized batch keeps its last `capacity` rows: repeated indices in an assignment have no defined winner
        skip = max(n - self.capacity, 0)
        idx = (self.pos + skip + torch.arange(n - skip)) % self.capacity
        for k in self.FIELDS:
            self.data[k][idx] = items[k][skip:].to(self.data[k].dtype)
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

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
        buf.pos = sd["pos"]
        buf.size = sd["size"]
        return buf


def make_buffer(args, model, env_cls):
    """The ExperienceBuffer of this run's transitions (None with --buffer-size 0)."""
    if args.buffer_size == 0:
        return None
    act_width = model.act_dim
    if model.discrete:
        act_width = 1
    state_width = model.initial_state(1).shape[1]
    return ExperienceBuffer(args.buffer_size, env_cls.obs_dim, model.encoder.in_features, act_width, state_width)


def add_batch_to_buffer(buffer, batch, task_id):
    """Valid steps of one task's episodes; done marks an episode's last step."""
    m = batch["masks"] > 0
    last = m & ~(torch.cat([batch["masks"][1:], torch.zeros_like(batch["masks"][:1])]) > 0)
    buffer.add(
        **{k: batch[k][m].cpu() for k in ("obs", "inputs", "actions", "rewards", "next_obs", "advantages", "states")},
        dones=last[m].cpu(),
        task_ids=torch.full((int(m.sum()),), task_id, dtype=torch.long),
    )


class FeatureMonitor:
    """EMA of training feature mean/variance; shift = mean |mu_test - mu_train| / sigma_train."""

    def __init__(self, dim, decay=0.99, mean=None, var=None, count=0):
        self.mean = mean
        if mean is None:
            self.mean = torch.zeros(dim)
        self.var = var
        if var is None:
            self.var = torch.ones(dim)
        self.decay = decay
        self.count = count

    def update(self, feats, masks):
        f = feats[masks > 0].detach().float().cpu()
        d = 0.0
        if self.count:
            d = self.decay
        self.mean = d * self.mean + (1 - d) * f.mean(0)
        self.var = d * self.var + (1 - d) * f.var(0, unbiased=False)
        self.count += 1

    def shift(self, feats, masks):
        f = feats[masks > 0].detach().float().cpu()
        return ((f.mean(0) - self.mean).abs() / torch.sqrt(self.var + 1e-6)).mean().item()


# PLUMBING: PARAMETER-COUNT MATCHING, THE RUN DIRECTORY, PROGRESS, CHECKPOINTS
def policy_width(args: Args, env_cls) -> int:
    """The SSM uses --hidden-size; gru/mlp get the width whose parameter count is closest to the SSM's."""
    if args.policy == "ssm":
        return args.hidden_size
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete, args.state_size, args.in_context, args.layer_norm)
    target = agent_param_count("ssm", *spec[:3], args.hidden_size, *spec[3:])
    hi = 4
    while agent_param_count(args.policy, *spec[:3], hi, *spec[3:]) < target:  # counts grow with the width
        hi *= 2
    best = 4
    best_gap = abs(agent_param_count(args.policy, *spec[:3], best, *spec[3:]) - target)
    for w in range(5, hi + 1):
        gap = abs(agent_param_count(args.policy, *spec[:3], w, *spec[3:]) - target)
        if gap < best_gap:  # strictly closer: the smaller width wins a tie
            best = w
            best_gap = gap
    return best


def agent_param_count(kind, obs_dim, act_dim, discrete, w, n_state, in_context, layer_norm=False):
    """Closed form of count_params(Agent(...)) so the width search does not build hundreds of networks."""
    in_dim = obs_dim
    if in_context:
        in_dim = obs_dim + act_dim + 1
    core = {"ssm": 2 * n_state + 4 * n_state * w + w, "gru": 6 * w * w + 6 * w, "mlp": w * w + w}[kind]
    heads = (w * act_dim + act_dim) + (w + 1) + ((w + act_dim) * obs_dim + obs_dim)
    if not discrete:
        heads += act_dim
    norm = 0
    if layer_norm:
        norm = 2 * w
    return in_dim * w + w + core + norm + (w * w + w) + heads


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def start_run(args: Args, saved=None):
    """Run directory (a resumed run's own), TensorBoard writer (and wandb), threads and seeds: (run_dir, writer)."""
    if saved is None:
        run_name, run_dir = claim_run_dir(args.runs_dir, f"{args.task}__{args.exp_name}__{args.seed}__{int(time.time())}")
    else:
        run_dir = saved["training"]["run_dir"]
        run_name = os.path.basename(run_dir)
        os.makedirs(run_dir, exist_ok=True)
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

    purge_step = None
    if saved is not None:  # TensorBoard drops what the interrupted run logged after the checkpoint
        purge_step = saved["training"]["global_step"] + 1
    writer = SummaryWriter(run_dir, purge_step=purge_step)
    if saved is None:
        table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    torch.set_num_threads(args.num_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    return run_dir, writer


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


def print_param_counts(model, args, env_cls):
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete)
    counts = {}
    for kind in POLICIES:
        width = policy_width(dataclasses.replace(args, policy=kind), env_cls)
        counts[kind] = agent_param_count(kind, *spec, width, args.state_size, args.in_context, args.layer_norm)
    print(
        f"policy {args.policy} (width {model.hidden}): {count_params(model)} parameters; matched counts "
        f"ssm {counts['ssm']} gru {counts['gru']} mlp {counts['mlp']}; obs/act/discrete {spec}"
    )


def print_progress(it, args, global_step, sps, pre, post, stats, dt, elapsed):
    """One progress line. The time left assumes all --outer-steps run; a --cpu-budget can end the run sooner."""
    print(
        f"iter {it}/{args.outer_steps} step {global_step} SPS {sps} pre {pre:.2f} post {post:.2f} "
        f"kl {stats['approx_kl']:.4f} ls {stats['line_search_steps']} {dt:.2f}s/it "
        f"elapsed {elapsed:.0f}s, {elapsed / it * (args.outer_steps - it) / 60:.1f} min left",
        flush=True,
    )


def log_scalars(writer, scalars, step):
    for tag, v in scalars.items():
        writer.add_scalar(tag, float(v), step)


def run_times(start_time, start_cpu, train_tasks):
    return {
        "train_wall_time": time.time() - start_time,
        "train_cpu_time": time.process_time() - start_cpu,
        "outer_steps_done": len(train_tasks),
    }


def save_model_checkpoint(model, args, train_tasks, buffer, monitor, times, training, run_dir=None):
    """The checkpoint: at run_dir/{exp_name}.cleanrl_model (--save-model), or with the training state to
    --ckpt-dir's step_N and latest files. Returns the (last) path written."""
    cartpole = args.task == "cartpole-physics"
    seen = np.zeros((0, 1))
    if train_tasks:
        seen = np.concatenate(train_tasks)
    split = {
        "task": args.task,
        "train_stream": [args.seed, 0],
        "test_stream": [args.seed, 1],
        "train_ranges": CARTPOLE_TRAIN_RANGES if cartpole else None,
        "test_ranges": CARTPOLE_TEST_RANGES if cartpole else None,
        "train_tasks": seen.tolist(),
    }
    buffer_state = None
    if buffer is not None:
        buffer_state = buffer.state_dict()
    extra = {**times, "feature_stats": vars(monitor), "buffer": buffer_state}
    paths = [os.path.join(str(run_dir), f"{args.exp_name}.cleanrl_model")]
    if training is not None:
        extra["training"] = training
        os.makedirs(args.ckpt_dir, exist_ok=True)
        paths = [os.path.join(args.ckpt_dir, f"step_{len(train_tasks)}.cleanrl_model")]
        paths.append(os.path.join(args.ckpt_dir, "latest.cleanrl_model"))
    for path in paths:
        save_checkpoint(path, model, args, split, TASK_VERSIONS[args.task], extra, SCRIPT)
        print(f"model saved to {path}")
    return paths[-1]


def evaluate_saved_model(path, writer):
    """Evaluates the checkpoint with its own eval settings, as `eval` would."""
    res = evaluate(path)
    for k, v in res["returns_after_steps"].items():  # x axis: inner updates
        writer.add_scalar("eval/return_after_steps", v, int(k))
    print(f"eval: {json.dumps(res)}")


# PLUMBING: WRITING AND READING CHECKPOINTS, THE RESULTS FILE
def atomic_torch_save(obj, path):
    """torch.save(obj, path), atomically: to a temp file in the same directory, then os.replace."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_json(obj, path):
    """json.dump(obj, indent=2) to path, atomically."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(path, model, args, task_split, task_version, extra=None, script="maml_ssm"):
    """The model's weights, its full config, the task split and version, and `extra`, written atomically; `script`
    names the script that wrote it."""
    ckpt = {
        "state_dict": model.state_dict(),
        "args": dataclasses.asdict(args),
        "script": script,
        "format": CHECKPOINT_FORMAT,
        "task_split": task_split,
        "param_count": sum(p.numel() for p in model.parameters()),
        "task_version": task_version,
    }
    if extra:
        ckpt.update(extra)
    atomic_torch_save(ckpt, path)


# what read_checkpoint accepts; a checkpoint of another format is another commit's, which it names
CHECKPOINT_FORMAT = 1


def read_checkpoint(path, script, args_cls, also=()):
    """The checkpoint dict written by this commit's `script`, or by a script of `also` (its config then without the
    fields `args_cls` lacks), or a ValueError with a one-line reason."""
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {path!r} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # corrupted or not a torch file
        raise ValueError(f"cannot read checkpoint {path!r}: {type(e).__name__}") from e
    writer = None
    if isinstance(ckpt, dict):
        writer = ckpt.get("script")
    if writer in ("maml_ssm", "maml_ssm_promp") and writer not in (script, *also):
        raise ValueError(f"{path!r} is a {writer} checkpoint: run cleanrl_astral/{writer}.py on it")
    if writer not in (script, *also):
        raise ValueError(f"{path!r} is not a {script} checkpoint")
    fields = {f.name for f in dataclasses.fields(args_cls)}
    if ckpt.get("format") != CHECKPOINT_FORMAT or (writer == script and set(ckpt["args"]) != fields):
        raise ValueError(f"{path!r} holds another format of {writer}.py's checkpoint; commit 95652a5 reads it")
    ckpt["args"] = {k: v for k, v in ckpt["args"].items() if k in fields}
    return ckpt


def check_task_split(ckpt, task, task_version, check_ranges, ranges):
    """A ValueError with a one-line reason when the checkpoint's tasks are not the ones this script runs: another task
    in its split than in its config, other train/test ranges (`ranges`: {split key: ranges}), another task version."""
    split = ckpt["task_split"]
    version = ckpt["task_version"]
    if split.get("task") != task:
        raise ValueError(f"checkpoint task split is for {split.get('task')!r} but its config says {task!r}")
    if check_ranges:
        for key, expected in ranges.items():
            if json.dumps(split.get(key)) != json.dumps(expected):
                raise ValueError(
                    f"the checkpoint's cartpole {key.replace('_', ' ')} {split.get(key)} are not this script's "
                    f"{[list(r) for r in expected]} (gravity, pole length); retrain it with this script"
                )
    if version != task_version:
        raise ValueError(
            f"checkpoint was trained on version {version} of {task}, this script runs version {task_version} "
            "(see TASK_VERSIONS); retrain it"
        )


def training_state(aux_opt, outer_opt, gen, train_rng, global_step, run_dir):
    """What --resume restores besides the model, buffer and feature statistics: optimizers, every RNG, the step."""
    outer = None
    if outer_opt is not None:
        outer = outer_opt.state_dict()
    return {
        "aux_opt": aux_opt.state_dict(),
        "outer_opt": outer,
        "gen": gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
        "train_rng": train_rng.bit_generator.state,
        "global_step": global_step,
        "run_dir": run_dir,
    }


def mean_ci95_half_width(x):
    """Half-width of the normal 95% confidence interval of the mean: 1.96 sample sd / sqrt(n) (0 for one value)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return 0.0
    return float(1.96 * x.std(ddof=1) / math.sqrt(len(x)))


def summarise(per_step):
    """{"returns_after_steps": mean over tasks, "ci95": its 95% CI half-width}, keyed by the step as a string."""
    return {
        "returns_after_steps": {str(k): float(r.mean()) for k, r in enumerate(per_step)},
        "ci95": {str(k): mean_ci95_half_width(r) for k, r in enumerate(per_step)},
    }


def have_helper_package():
    """Whether cleanrl_astral_utils (reports, plots, video, resume) can be imported: a script copied alone runs without it."""
    try:
        import cleanrl_astral_utils  # noqa: F401
    except ImportError:
        return False
    return True


def write_results(result, path, plot, *plot_args):
    """The results file (eval.json, adapt.json) at path, and its plot beside it (the same name, .png) when the helper
    package is installed; without it, one line says the plot was skipped. `plot` names the helper's plotting function,
    called with the result, the plot's path and `plot_args`."""
    atomic_write_json(result, path)
    if not have_helper_package():
        print(f"{path[: -len('.json')]}.png skipped: plots need the cleanrl_astral_utils package (pip install -e .)")
        return
    from cleanrl_astral_utils import maml

    getattr(maml, plot)(result, path[: -len(".json")] + ".png", *plot_args)


# VALIDATION
def validate(args):
    """Refuses, in one line (ValueError), the settings that would crash late or run wrong in silence: `train`'s Args,
    `eval`'s EvalArgs and `adapt`'s AdaptArgs (the checkpoint is checked on loading, and by validate_adapt_against)."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes any <, >
            raise ValueError(f"--{field.name.replace('_', '-')} {value} must be a finite number")
    if not isinstance(args, Args) and args.eval_seed is not None and not 0 <= args.eval_seed < 2**32:
        raise ValueError(f"--eval-seed {args.eval_seed} must be in [0, 2**32 - 1]")
    if isinstance(args, EvalArgs):
        for name in ("inner_lr", "later_lr_scale"):
            if getattr(args, name) is not None and not getattr(args, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
        if args.num_tasks is not None and args.num_tasks < 2:  # a confidence interval needs two tasks
            raise ValueError(f"--num-tasks must be >= 2, got {args.num_tasks}")
        if args.episodes is not None and args.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
        if args.num_steps is not None and args.num_steps < 0:
            raise ValueError(f"--num-steps must be >= 0, got {args.num_steps}")
        return
    if isinstance(args, AdaptArgs):
        for name in ("adapt_lr", "grad_clip", "max_step_norm", "trust_region"):
            if not getattr(args, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
        if args.num_tasks < 2:  # a confidence interval needs two tasks
            raise ValueError(f"--num-tasks must be >= 2, got {args.num_tasks}")
        # an importance cap below 1 would scale on-policy steps
        for name in ("experience_batch_size", "online_every", "max_importance_weight"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if args.episodes is not None and args.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
        for name in ("adapt_steps", "experience_weight", "ema_decay"):
            if getattr(args, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
        if not args.adaptation_mode or not args.adapt_objective:
            raise ValueError("--adaptation-mode and --adapt-objective each need at least one value")
        choices = {"adaptation_mode": ADAPTERS, "adapt_objective": OBJECTIVES, "strategy": STRATEGIES}
        choices = {**choices, "adapt_params": PARAM_GROUPS, "adapt_optimizer": ("sgd", "adam")}
        for name, allowed in choices.items():
            values = getattr(args, name)
            if not isinstance(values, tuple):  # the multi-valued flags give tuples, the others one value
                values = (values,)
            for value in values:
                if value not in allowed:
                    raise ValueError(f"unknown --{name.replace('_', '-')} {value!r}; choose one of {', '.join(allowed)}")
        if args.ema_decay >= 1:
            raise ValueError(f"--ema-decay must be in [0, 1), got {args.ema_decay}")
        return
    # `train`'s Args
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed {args.seed} must be in [0, 2**32 - 1]")
    for name in ("inner_lr", "outer_lr", "aux_lr", "max_kl", "eval_later_lr_scale"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("tasks_per_batch", "fast_batch_size", "max_episode_steps", "hidden_size", "state_size", "eval_tasks"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("cg_iters", "num_threads", "ls_max_steps", "log_every", "ckpt_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.eval_episodes is not None and args.eval_episodes < 1:
        raise ValueError(f"--eval-episodes must be >= 1, got {args.eval_episodes}")
    for name in ("outer_steps", "num_inner_steps", "eval_steps", "buffer_size", "dynamics_coef", "cg_damping"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.cpu_budget < 0:
        raise ValueError(f"--cpu-budget must be >= 0, got {args.cpu_budget}")
    choices = {"task": TASKS, "policy": POLICIES, "outer_optimizer": OUTER_OPTIMIZERS}
    for name, allowed in {**choices, "config": tuple(PRESETS)}.items():
        if getattr(args, name) not in allowed:
            raise ValueError(f"unknown --{name.replace('_', '-')} {getattr(args, name)!r}; choose one of {', '.join(allowed)}")
    if not args.exp_name.strip() or "/" in args.exp_name:
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    if not 0 < args.ls_backtrack_ratio < 1:
        raise ValueError(f"--ls-backtrack-ratio must be in (0, 1), got {args.ls_backtrack_ratio}")
    if not 0 < args.cg_subsample <= 1:
        raise ValueError(f"--cg-subsample must be in (0, 1], got {args.cg_subsample}")
    if not (0 < args.gamma <= 1 and 0 <= args.gae_lambda <= 1):
        raise ValueError("--gamma must be in (0, 1] and --gae-lambda in [0, 1]")
    if args.save_model and args.eval_tasks < 2:
        raise ValueError(f"--eval-tasks {args.eval_tasks}: the evaluation after --save-model needs >= 2 tasks for its 95% CI")
    if args.goal_box and args.task != "point-nav-2d":
        raise ValueError(
            f"--goal-box only applies to --task point-nav-2d, not {args.task}; drop it (or --no-goal-box with --config paper)"
        )
    if args.task == "halfcheetah-vel" and not mujoco_available():
        raise ValueError(f"--task halfcheetah-vel needs the 'mujoco' package: pip install {MUJOCO_PIN}")


def validate_adapt_against(args: AdaptArgs, model, ckpt):
    """Refuses, in one line (ValueError), `adapt` options this checkpoint cannot serve."""
    horizon = ckpt["args"]["max_episode_steps"]
    buf = ckpt.get("buffer")
    if args.online and args.online_every >= horizon:
        raise ValueError(
            f"--online-every {args.online_every} is not below the checkpoint's horizon ({horizon} steps): no step "
            "would adapt; choose a smaller --online-every"
        )
    if args.adapt_params == "norm" and not ckpt["args"].get("layer_norm"):
        raise ValueError(
            "--adapt-params norm: this checkpoint has no normalisation layer; train it with --layer-norm, or use all, "
            "ssm or heads"
        )
    # a Gaussian policy's entropy depends only on its state-independent log-std, which the core's parameters miss
    if "entropy" in args.adapt_objective and not model.discrete and args.adapt_params in ("ssm", "norm"):
        raise ValueError(
            f"--adapt-objective entropy on this Gaussian policy reaches only its log-std, which --adapt-params "
            f"{args.adapt_params} does not adapt; use --adapt-params all or heads, or another objective"
        )
    if "hybrid" in args.adaptation_mode and not (buf and buf["size"] > 0):
        raise ValueError(
            "--adaptation-mode hybrid needs a checkpoint with a non-empty ExperienceBuffer (train with --buffer-size > 0)"
        )
    if buf:  # replay needs the buffer's recurrent states at the model's width
        ExperienceBuffer.from_state_dict(buf, model.initial_state(1).shape[1])


def check_config(args, ckpt_args):
    """Refuses an `eval`/`adapt` --config other than the one the checkpoint was trained with."""
    if args.config is not None and args.config != ckpt_args.config:
        raise ValueError(f"--config {args.config} contradicts the checkpoint's own --config {ckpt_args.config}; drop it")


def mujoco_available() -> bool:
    return importlib.util.find_spec("mujoco") is not None


# COMMAND LINE
# `train --config NAME` makes these the defaults; every flag still overrides them
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


COMMANDS = ("train", "eval", "adapt")
USAGE = "usage: maml_ssm.py {train,eval,adapt} [--help] [flags]"


def flag_value(argv, name):
    """The value of the last `name VALUE` or `name=VALUE` in argv, or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        if arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def train_defaults(argv) -> Args:
    """What `train`'s flags override: the --config preset, or with --resume the checkpoint's own Args."""
    resume = flag_value(argv, "--resume")
    if resume is not None and not have_helper_package():
        raise ValueError("--resume needs the cleanrl_astral_utils package: pip install -e . in the repository")
    if resume is not None:
        from cleanrl_astral_utils.maml import resumed_args

        return resumed_args(read_checkpoint(resume, SCRIPT, Args), Args, resume)
    config = flag_value(argv, "--config")
    if config is None:
        config = "none"
    if config not in PRESETS:
        raise ValueError(f"unknown --config {config!r}; choose one of {', '.join(PRESETS)}")
    return Args(config=config, **PRESETS[config])


def main(argv):
    """One tyro parse of the subcommand's Args (train: over the --config preset's values), validated, then run."""
    if not argv or argv[0] not in COMMANDS:
        print(USAGE)
        if argv and argv[0] in ("-h", "--help"):
            sys.exit(0)
        sys.exit(2)
    command = argv[0]
    prog = f"maml_ssm.py {command}"
    try:
        if command == "train":
            args = tyro.cli(Args, args=argv[1:], default=train_defaults(argv), prog=prog)
            validate(args)
            train(args)
        if command == "eval":
            evaluate_command(tyro.cli(EvalArgs, args=argv[1:], prog=prog))
        if command == "adapt":
            adapt_command(tyro.cli(AdaptArgs, args=argv[1:], prog=prog))
    except ValueError as e:
        print(f"maml_ssm.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
