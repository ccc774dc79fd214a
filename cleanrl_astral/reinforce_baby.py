"""reinforce_baby: a randomly initialised transformer learns goal-directed behaviour from a parent, through interaction
and its own world model.

Follows the plan behind it (docs/plans.md#parent-taught-transformer: learning through interaction with an LLM-powered
environment) and its five critical fixes: episodes end only on the time limit; the world model predicts the raw
next-state tensor; REINFORCE before PPO; reward components logged apart; the LLM parent is optional.

Usage (the locked MVP):
    python cleanrl_astral/reinforce_baby.py --task pattern-echo --num-actions 8 --hidden-dim 64 \
        --num-layers 2 --algorithm reinforce --parent deterministic --total-timesteps 10000
"""

import collections
import dataclasses
import importlib.util
import itertools
import json
import math
import os
import pathlib
import random
import sys
import time
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter

SCRIPT = os.path.splitext(os.path.basename(__file__))[0]
EVAL_SEED_OFFSET = 777  # evaluation episodes are drawn from seed + this: never the training stream


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, cuda will be used when available (the model is tiny: the CPU is faster)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanrl_astral"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """the environment is symbolic: writes text transcripts of evaluation episodes to {run_dir}/videos/"""
    save_model: bool = False
    """whether to save the model (atomically) into {runs_dir}/{run_name}/{exp_name}.cleanrl_model"""
    runs_dir: str = "runs"
    """directory that holds one sub-directory per run"""
    checkpoint_every: int = 0
    """write the whole training state to {run_dir}/checkpoint.pt (atomically) every this many steps and at the end; 0: never"""
    resume: str | None = None
    """a run's checkpoint.pt: continue that run in its directory with its flags (of this command only --llm-base-url counts)"""

    # Environment
    task: Literal["pattern-echo", "sequence-next", "conditional", "all"] = "pattern-echo"
    """the task, or all: each episode draws one of the three"""
    num_actions: int = 16
    """size of the action space (arbitrary symbols); the MVP uses 8"""
    max_episode_steps: int = 1
    """time limit: episodes end only here (truncated), never on success"""
    level: Literal[0, 1, 2] = 2
    """difficulty level used without --curriculum (0 easiest .. 2 hardest)"""
    curriculum: bool = False
    """if toggled, each task starts at level 0 and levels up on mastery"""
    mastery_threshold: float = 0.9
    """success rate over the window at which a task's level goes up"""
    mastery_window: int = 200
    """number of recent episodes at the current level the mastery check averages over"""
    review_prob: float = 0.2
    """with --curriculum: probability that an episode replays a random already-mastered level (against forgetting)"""
    conditional_rule: Literal["flags", "plan"] = "flags"
    """conditional task: flags (values picked by flags) or plan (the plan's shape/colour rule; 16 actions, rule parent)"""
    curriculum_rule: Literal["mastery", "plan"] = "mastery"
    """mastery (the rule's verdict, --mastery-* flags, review) or plan (the parent's reward > 0.5, 0.8 of 100, no review)"""
    parent: Literal["deterministic", "llm"] = "deterministic"
    """who gives the goal reward: the deterministic rule or an LLM behind an OpenAI-compatible endpoint"""
    llm_role: Literal["answer", "judge"] = "answer"
    """answer (the LLM states the right action, reward 1 where the action equals it) or judge (a JSON verdict per action)"""
    llm_base_url: str | None = None
    """base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (required with --parent llm)"""
    llm_model: str = "gpt-4o-mini"
    """model name sent to the endpoint"""
    llm_api_key_env: str = "OPENAI_API_KEY"
    """environment variable holding the API key (may be unset for local servers)"""
    llm_timeout: float = 10.0
    """seconds before an LLM request is abandoned"""
    llm_retries: int = 2
    """extra attempts after a failed or invalid LLM answer, before falling back to the rule"""
    llm_next_state: bool = False
    """with --llm-role judge: the LLM also proposes the next state (validated; the rule is used when invalid)"""
    llm_cache: str = ""
    """sqlite file caching LLM answers by request; empty: {runs_dir}/llm_cache.sqlite"""
    llm_concurrency: int = 4
    """parallel LLM requests per batch of episodes"""
    llm_examples: int | None = None
    """worked examples before each query, answered by the rule; default: 8 with --llm-role answer, 0 with judge"""
    llm_response_format: Literal["json-object", "json-schema", "none"] = "json-object"
    """judge's structured output: llama.cpp's {"type": "json_object", "schema": ...}, the OpenAI API's json_schema, or none"""
    llm_answer_format: Literal["grammar", "free"] = "grammar"
    """answer role: grammar (llama.cpp's GBNF `grammar` admits only an action's number) or free (the first integer read)"""
    task_source: Literal["rule", "parent"] = "rule"
    """who draws the task instances: the rule, or (with --parent llm) the LLM, into a pool per task and level"""
    task_pool_size: int = 32
    """--task-source parent: instances per task and level, one request each (the run's budget: size x levels visited)"""
    llm_check_pairs: int = 0
    """before training, the LLM rewards this many seeded (state, action) pairs per task and level, half of them right"""

    # Model
    hidden_dim: int = 64
    """width of the transformer core"""
    num_layers: int = 2
    """number of transformer layers"""
    num_heads: int = 4
    """attention heads per layer"""

    # Algorithm
    algorithm: Literal["reinforce", "ppo"] = "reinforce"
    """reinforce (running-mean baseline, the default per the plan) or ppo (GAE, clipped surrogate)"""
    total_timesteps: int = 20000
    """total environment steps"""
    learning_rate: float = 3e-3
    """Adam learning rate"""
    adam_eps: float = 1e-5
    """Adam's epsilon (the plan: PyTorch's default, 1e-8)"""
    anneal_lr: bool = False
    """if toggled, the learning rate decays linearly to 0"""
    num_envs: int = 32
    """episodes collected in parallel per update"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda (ppo)"""
    baseline_decay: float = 0.9
    """running-mean baseline: b <- decay * b + (1 - decay) * mean return (reinforce)"""
    baseline_update: Literal["after", "before"] = "after"
    """reinforce: the batch's returns enter the baseline after its advantages are computed, or before (the plan)"""
    norm_adv: bool = True
    """if toggled, advantages are divided by their batch standard deviation"""
    ent_coef: float = 0.03
    """entropy bonus coefficient (0.01 lets the policy commit to a wrong symbol for some cues)"""
    world_model_coef: float = 0.1
    """weight of the world-model loss (0 disables the world model: the RL-only baseline)"""
    goal_reward_weight: float = 1.0
    """weight of the parent's goal reward"""
    pred_reward_weight: float = 0.1
    """weight (the plan's scale) of the prediction reward exp(-world-model MSE)"""
    cons_reward_weight: float = 0.1
    """weight of the consistency reward (keep an approved answer, change a rejected one)"""
    kl_coef: float = 0.0
    """weight of KL(parent oracle distribution || policy); > 0 is the KL-distill baseline"""
    kl_smoothing: float = 0.1
    """probability mass the parent's oracle distribution spreads uniformly over all actions"""
    update_epochs: int = 4
    """ppo: epochs over each batch"""
    num_minibatches: int = 1
    """ppo: minibatches per epoch (a batch is only --num-envs episodes)"""
    clip_coef: float = 0.2
    """ppo: surrogate clipping coefficient"""
    vf_coef: float = 0.5
    """ppo: value loss coefficient"""
    bootstrap_time_limit: bool = False
    """ppo: if toggled, GAE bootstraps the value of the state after the time limit; by default nothing is earned after it"""
    max_grad_norm: float = 0.5
    """gradient clipping norm; 0: no clipping (the plan's REINFORCE)"""

    # Evaluation
    eval_episodes: int = 200
    """evaluation episodes per (task, level)"""
    baselines: tuple[Literal["random"], ...] = ("random",)
    """baselines evaluated on the same episodes (trained ones: benchmark/reinforce_baby_baselines.py)"""
    analysis: bool = True
    """if toggled, linear probes per state attribute and a t-SNE PNG of the embeddings"""
    analysis_samples: int = 600
    """states embedded for the probes and the t-SNE"""

    # computed at runtime
    batch_size: int = 0
    """environment steps per update (computed at runtime)"""
    num_iterations: int = 0
    """number of updates (computed at runtime)"""


# ENVIRONMENT: the symbolic tasks, their levels and states
TASKS = ["pattern-echo", "sequence-next", "conditional"]
# every level names the number of symbols it uses: --num-actions must cover the levels a run visits
DIFFICULTY_CONFIGS = {
    "pattern-echo": [
        {"target_range": 2, "num_symbols": 2},
        {"target_range": 4, "num_symbols": 4},
        {"target_range": 8, "num_symbols": 8},
    ],
    "sequence-next": [
        {"steps": [1], "lengths": [2], "num_symbols": 8},
        {"steps": [1, 2], "lengths": [3], "num_symbols": 8},
        {"steps": [-2, -1, 1, 2], "lengths": [2, 3], "num_symbols": 8},
    ],
    "conditional": [
        {"conditions": 1, "form": "if", "num_symbols": 8},
        {"conditions": 2, "form": "elif", "num_symbols": 8},
        {"conditions": 3, "form": "nested", "num_symbols": 8},
    ],
}
NUM_LEVELS = 3
# --conditional-rule plan, the plan's rule read literally: f0 is the shape (0 circle, 1 square), f1 the colour (1 red),
# v0 the place within the shape's block of four actions: the answer is v0 + 4 * f0, plus 8 if red
CONDITIONAL_PLAN_LEVELS = [
    {"form": "shape", "conditions": 1, "places": 4, "num_symbols": 8},
    {"form": "shape-red", "conditions": 2, "places": 2, "num_symbols": 16},
    {"form": "shape-red", "conditions": 2, "places": 4, "num_symbols": 16},
]
ATTRIBUTES = ["task", "level", "v0", "v1", "v2", "f0", "f1", "f2", "last_action", "last_correct", "step"]
STATE_DIM = len(ATTRIBUTES)
FLAG_PAD = 2  # flags and last_correct: 0, 1, or 2 = absent
# What a small model needs to judge an answer: the rule in plain words and only the attributes the rule reads.
LLM_RULES = {
    "pattern-echo": "the answer must equal the cue.",
    "sequence-next": "the answer must be the next number of the sequence (add the step between its numbers).",
    "if": "if f0 is 1 the answer must be v0, otherwise v1.",
    "elif": "if f0 is 1 the answer must be v0, else if f1 is 1 it must be v1, otherwise v2.",
    "nested": "if f0 is 1 the answer must be v0 when f1 is 1, else v1; if f0 is 0 it must be v2 when f2 is 1, "
    "else 7 minus v0.",
}


def task_list(task: str) -> list[str]:
    if task == "all":
        return TASKS
    return [task]


def level_configs(task: str, conditional_rule: str = "flags") -> list[dict]:
    """The task's levels; --conditional-rule plan swaps the conditional task's."""
    if task == "conditional" and conditional_rule == "plan":
        return CONDITIONAL_PLAN_LEVELS
    return DIFFICULTY_CONFIGS[task]


def playable(tasks: list[str], num_actions: int, conditional_rule: str = "flags") -> list[tuple[str, int]]:
    """The (task, level) pairs whose symbols fit in the action space."""
    return [
        (t, lv)
        for t in tasks
        for lv in range(NUM_LEVELS)
        if level_configs(t, conditional_rule)[lv]["num_symbols"] <= num_actions
    ]


def attribute_vocab(num_actions: int, max_episode_steps: int) -> list[int]:
    """Number of categories of each attribute; values and last_action use num_actions as padding."""
    return [
        len(TASKS),
        NUM_LEVELS,
        num_actions + 1,
        num_actions + 1,
        num_actions + 1,
        3,
        3,
        3,
        num_actions + 1,
        3,
        max_episode_steps + 1,
    ]


@dataclass(frozen=True)
class State:
    """One symbolic state; every attribute is a categorical index (absent = padding index)."""

    task: int
    level: int
    values: tuple[int, int, int]
    flags: tuple[int, int, int]
    last_action: int
    last_correct: int
    step: int
    num_actions: int

    @property
    def task_name(self) -> str:
        return TASKS[self.task]

    def as_list(self) -> list[int]:
        return [self.task, self.level, *self.values, *self.flags, self.last_action, self.last_correct, self.step]

    def rule_text(self) -> str:
        """The task's rule in plain words."""
        if self.task_name == "conditional":
            return LLM_RULES[DIFFICULTY_CONFIGS["conditional"][self.level]["form"]]
        return LLM_RULES[self.task_name]

    def shown_attributes(self) -> str:
        """Only the attributes the rule reads: `cue = 3`, `sequence = 3, 4`, `f0 = 1, v0 = 5, v1 = 6`."""
        pad = self.num_actions
        if self.task_name == "pattern-echo":
            return f"cue = {self.values[0]}"
        if self.task_name == "sequence-next":
            return f"sequence = {', '.join(str(v) for v in self.values if v != pad)}"
        shown = [f"f{i} = {f}" for i, f in enumerate(self.flags) if f != FLAG_PAD]
        shown += [f"v{i} = {v}" for i, v in enumerate(self.values) if v != pad]
        return ", ".join(shown)


# PARENT: task instances, transitions and rewards by rule (--parent llm: an LLM, the rule as its fallback)
class DeterministicParent:
    """Task instances, transitions and rewards by rule; `oracle_action` is the rule's answer."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions

    def new_instance(self, task: str, level: int, rng: np.random.Generator) -> State:
        cfg = DIFFICULTY_CONFIGS[task][level]
        pad = self.num_actions
        n = cfg["num_symbols"]
        values = [pad] * 3
        flags = [FLAG_PAD] * 3
        if task == "pattern-echo":
            values[0] = int(rng.integers(cfg["target_range"]))
        elif task == "sequence-next":
            d = int(rng.choice(cfg["steps"]))
            length = int(rng.choice(cfg["lengths"]))
            span = abs(d) * length  # the answer a + d * length must stay in [0, n)
            if d > 0:
                a = int(rng.integers(0, n - span))
            else:
                a = int(rng.integers(span, n))
            values[:length] = [a + d * i for i in range(length)]
        else:
            used = {"if": 2, "elif": 3, "nested": 3}[cfg["form"]]
            values[:used] = [int(x) for x in rng.integers(0, n, used)]
            flags[: cfg["conditions"]] = [int(x) for x in rng.integers(0, 2, cfg["conditions"])]
        return State(TASKS.index(task), level, tuple(values), tuple(flags), pad, FLAG_PAD, 0, self.num_actions)

    def oracle_action(self, s: State) -> int:
        v0, v1, v2 = s.values
        f0, f1, f2 = s.flags
        if s.task_name == "pattern-echo":
            return v0
        if s.task_name == "sequence-next":
            items = [v for v in s.values if v != s.num_actions]
            return items[-1] + (items[1] - items[0])
        form = DIFFICULTY_CONFIGS["conditional"][s.level]["form"]
        if form == "if":
            return v0 if f0 == 1 else v1
        if form == "elif":
            if f0 == 1:
                return v0
            return v1 if f1 == 1 else v2
        if f0 == 1:
            return v0 if f1 == 1 else v1
        if f2 == 1:
            return v2
        return DIFFICULTY_CONFIGS["conditional"][s.level]["num_symbols"] - 1 - v0

    def rule_text(self, s: State) -> str:
        """The task's rule in plain words (evaluation transcripts)."""
        return s.rule_text()

    def judge(self, s: State, action: int) -> float:
        return float(action == self.oracle_action(s))

    def transition(self, s: State, action: int, reward: float) -> State:
        # the task instance stays fixed for the whole episode: the child sees its last answer and the verdict
        return dataclasses.replace(s, last_action=int(action), last_correct=int(reward >= 0.5), step=s.step + 1)

    def respond(self, states: list[State], actions: list[int]) -> list[tuple[float, State]]:
        """(reward, next state) of each (state, action)."""
        replies = []
        for s, a in zip(states, actions):
            reward = self.judge(s, a)
            replies.append((reward, self.transition(s, a, reward)))
        return replies


class PlanConditionalParent(DeterministicParent):
    """--conditional-rule plan: the conditional task is the plan's shape/colour rule read literally
    (CONDITIONAL_PLAN_LEVELS); the other tasks are the rule parent's."""

    def new_instance(self, task: str, level: int, rng: np.random.Generator) -> State:
        if task != "conditional":
            return super().new_instance(task, level, rng)
        cfg = CONDITIONAL_PLAN_LEVELS[level]
        values = [self.num_actions] * 3
        flags = [FLAG_PAD] * 3
        values[0] = int(rng.integers(0, cfg["places"]))
        flags[: cfg["conditions"]] = [int(x) for x in rng.integers(0, 2, cfg["conditions"])]
        return State(TASKS.index(task), level, tuple(values), tuple(flags), self.num_actions, FLAG_PAD, 0, self.num_actions)

    def oracle_action(self, s: State) -> int:
        if s.task_name != "conditional":
            return super().oracle_action(s)
        # a shape's block of four, 8 further on if red (f1 is absent at level 0)
        return s.values[0] + 4 * s.flags[0] + 8 * int(s.flags[1] == 1)

    def rule_text(self, s: State) -> str:
        if s.task_name != "conditional":
            return super().rule_text(s)
        return "the answer is v0, plus 4 if f0 (the shape) is 1 (a square), plus 8 if f1 (the colour) is 1 (red)."


def rule_parent(num_actions: int, conditional_rule: str = "flags") -> DeterministicParent:
    """The rule parent of --conditional-rule."""
    if conditional_rule == "plan":
        return PlanConditionalParent(num_actions)
    return DeterministicParent(num_actions)


def make_parent(args: Args):
    """The rule, or with --parent llm the LLM parent: the only run that needs the helper package's LLM client."""
    rule = rule_parent(args.num_actions, args.conditional_rule)
    if args.parent == "deterministic":
        return rule
    from cleanrl_astral_utils.llm import LLM_ANSWER_EXAMPLES, LLMParent, ParentPrompt, PromptSymbols

    examples = args.llm_examples
    if examples is None and args.llm_role == "answer":
        examples = LLM_ANSWER_EXAMPLES
    if examples is None:
        examples = 0
    symbols = PromptSymbols(State, TASKS, DIFFICULTY_CONFIGS, FLAG_PAD, ATTRIBUTES)
    prompt = ParentPrompt(rule, playable(TASKS, args.num_actions), examples, args.llm_next_state, symbols)
    vocab = attribute_vocab(args.num_actions, args.max_episode_steps)
    return LLMParent(rule, prompt, args, TASKS, ATTRIBUTES, vocab)


# EPISODES: a batch of fixed-length episodes the parent judges
class BabyEnv:
    """A batch of `num_envs` synchronous episodes of fixed length; the parent judges every step."""

    def __init__(self, parent: DeterministicParent, num_envs: int, max_episode_steps: int, seed: int):
        self.parent = parent
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.rng = np.random.default_rng(seed)
        self.states = []
        self.t = 0

    def reset(self, tasks: list[str], levels: list[int]) -> list[State]:
        self.states = [self.parent.new_instance(t, lv, self.rng) for t, lv in zip(tasks, levels)]
        self.t = 0
        return self.states

    def step(self, actions: list[int]):
        """Returns next states, the parent's goal rewards, terminated, truncated, and per-episode infos."""
        self.t += 1
        replies = self.parent.respond(self.states, actions)
        correct = np.array([a == self.parent.oracle_action(s) for s, a in zip(self.states, actions)])
        rewards = np.array([r for r, _ in replies], dtype=np.float32)
        self.states = [nxt for _, nxt in replies]
        # plan fix 1: no terminal state on success; the only episode end is the time limit
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.full(self.num_envs, self.t >= self.max_episode_steps)
        # success is the rule's verdict on the last answer, whatever the (possibly LLM) reward said
        return self.states, rewards, terminated, truncated, {"correct": correct, "success": correct & truncated}


def states_to_tensor(states: list[State]) -> torch.Tensor:
    return torch.tensor([s.as_list() for s in states], dtype=torch.long)


# AGENT: a randomly initialised transformer with a world model
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class StateEncoder(nn.Module):
    """One token per attribute: the attribute's own value embedding plus an attribute-position embedding."""

    def __init__(self, vocab: list[int], hidden_dim: int):
        super().__init__()
        self.values = nn.ModuleList(nn.Embedding(k, hidden_dim) for k in vocab)
        self.position = nn.Parameter(torch.randn(len(vocab), hidden_dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([emb(x[:, i]) for i, emb in enumerate(self.values)], dim=1) + self.position


class TransformerCore(nn.Module):
    """Transformer over the attribute tokens; a learned summary token gives the state embedding h."""

    def __init__(self, hidden_dim: int, num_layers: int, num_heads: int):
        super().__init__()
        self.summary = nn.Parameter(torch.randn(1, 1, hidden_dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            hidden_dim, num_heads, 2 * hidden_dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.summary.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        return self.norm(self.layers(x)[:, 0])


class WorldModelHead(nn.Module):
    """Predicts the raw next-state tensor (plan fix 2: a target in embedding space is met by collapsing it)."""

    def __init__(self, hidden_dim: int, num_actions: int):
        super().__init__()
        self.num_actions = num_actions
        self.net = nn.Sequential(
            layer_init(nn.Linear(hidden_dim + num_actions, 2 * hidden_dim)),
            nn.ReLU(),
            layer_init(nn.Linear(2 * hidden_dim, STATE_DIM), std=1.0),
        )

    def forward(self, h: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([h, F.one_hot(action, self.num_actions).float()], dim=-1))


class ActionAndValue(NamedTuple):
    action: torch.Tensor
    logprob: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor
    h: torch.Tensor  # the state embedding (the world model's input)
    logits: torch.Tensor


class Agent(nn.Module):
    def __init__(self, num_actions: int, max_episode_steps: int, hidden_dim: int, num_layers: int, num_heads: int):
        super().__init__()
        self.encoder = StateEncoder(attribute_vocab(num_actions, max_episode_steps), hidden_dim)
        self.core = TransformerCore(hidden_dim, num_layers, num_heads)
        self.action_head = layer_init(nn.Linear(hidden_dim, num_actions), std=0.01)
        self.value_head = layer_init(nn.Linear(hidden_dim, 1), std=1.0)
        self.world_model = WorldModelHead(hidden_dim, num_actions)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.core(self.encoder(x))

    def get_value(self, x) -> torch.Tensor:
        return self.value_head(self.embed(x)).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy=False) -> ActionAndValue:
        h = self.embed(x)
        dist = torch.distributions.Categorical(logits=self.action_head(h))
        if action is None and greedy:
            action = dist.probs.argmax(-1)
        if action is None:
            action = dist.sample()
        return ActionAndValue(action, dist.log_prob(action), dist.entropy(), self.value_head(h).squeeze(-1), h, dist.logits)


def make_optimizer(agent: Agent, args: Args) -> torch.optim.Adam:
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)


def build_agent(args: Args) -> Agent:
    return Agent(args.num_actions, args.max_episode_steps, args.hidden_dim, args.num_layers, args.num_heads)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# REWARDS
@dataclass
class RewardVector:
    """The plan's reward components, kept apart so each is logged under reward/...; `total` weighs them."""

    goal: np.ndarray
    pred: np.ndarray
    cons: np.ndarray

    def total(self, w_goal: float, w_pred: float, w_cons: float) -> np.ndarray:
        return w_goal * self.goal + w_pred * self.pred + w_cons * self.cons


def consistency_reward(states: list[State], actions: list[int]) -> np.ndarray:
    """+1 for keeping an approved answer or changing a rejected one, -1 otherwise, 0 at an episode's start."""
    last = np.array([s.last_correct for s in states])
    keep = np.array([a == s.last_action for s, a in zip(states, actions)])
    return np.where(last == FLAG_PAD, 0.0, np.where(keep == (last == 1), 1.0, -1.0)).astype(np.float32)


def prediction_reward(pred: torch.Tensor, target: torch.Tensor) -> np.ndarray:
    """exp(-MSE) per sample: 1 for a perfect world-model prediction, towards 0 for a poor one."""
    return torch.exp(-((pred - target) ** 2).mean(-1)).cpu().numpy()


# CURRICULUM
class CurriculumManager:
    """Per task, the level goes up once the success rate over the last `window` episodes at it reaches `threshold`. An
    episode succeeds by the rule's verdict on its last answer, or (`parent_rewarded`, the plan's) by the parent's last
    reward above 0.5."""

    def __init__(
        self,
        tasks: list[str],
        enabled: bool,
        fixed_level: int,
        threshold: float,
        window: int,
        review_prob: float = 0.0,
        parent_rewarded: bool = False,
    ):
        self.tasks = tasks
        self.enabled = enabled
        self.threshold = threshold
        self.window = window
        self.review_prob = review_prob
        self.parent_rewarded = parent_rewarded
        self.levels = {t: (0 if enabled else fixed_level) for t in tasks}
        self.history = {t: collections.deque(maxlen=window) for t in tasks}

    def sample_level(self, task: str, rng: np.random.Generator) -> int:
        """The current level, or with probability review_prob a uniformly drawn mastered (lower) level."""
        current = self.levels[task]
        if self.enabled and current > 0 and rng.random() < self.review_prob:
            return int(rng.integers(0, current))
        return current

    def outcomes(self, success: np.ndarray, last_goal_reward: np.ndarray) -> np.ndarray:
        """What mastery counts of each episode of a batch."""
        if self.parent_rewarded:
            return last_goal_reward > 0.5
        return success

    def record(self, task: str, level: int, success: bool) -> bool:
        """Adds one episode's outcome; returns True when this episode made the task level up."""
        if not self.enabled or level != self.levels[task]:
            return False
        h = self.history[task]
        h.append(float(success))
        up = bool(self.levels[task] < NUM_LEVELS - 1 and len(h) == self.window and np.mean(h) >= self.threshold)
        if up:
            self.levels[task] += 1
            h.clear()
        return up


PLAN_MASTERY_THRESHOLD = 0.8  # --curriculum-rule plan: the plan's CurriculumManager settings
PLAN_MASTERY_WINDOW = 100


def make_curriculum(args: Args, tasks: list[str]) -> CurriculumManager:
    """One level per task: the mastery rule with its flags, or (--curriculum-rule plan) the plan's settings, no review,
    counting the parent's rewards."""
    if args.curriculum_rule == "plan":
        return CurriculumManager(tasks, args.curriculum, args.level, PLAN_MASTERY_THRESHOLD, PLAN_MASTERY_WINDOW, 0.0, True)
    return CurriculumManager(tasks, args.curriculum, args.level, args.mastery_threshold, args.mastery_window, args.review_prob)


# ROLLOUT
@dataclass
class Rollout:
    """N whole episodes of T steps: obs[t] is the state acted in at step t, obs[t + 1] the state it led to."""

    obs: torch.Tensor  # (T + 1, N, STATE_DIM)
    actions: torch.Tensor  # (T, N)
    logprobs: torch.Tensor  # (T, N)
    values: torch.Tensor  # (T + 1, N); values[T] is 0 (nothing is earned after the time limit) or V(obs[T])
    oracle: torch.Tensor  # (T, N) the rule's answers (the KL-distill target)
    rewards: RewardVector  # (T, N) each
    success: np.ndarray  # (N,) the rule's verdict on each episode's final answer
    tasks: list[str]
    levels: list[int]


@torch.no_grad()
def collect_rollout(agent: Agent, env: BabyEnv, curriculum: CurriculumManager, args: Args, device) -> Rollout:
    T = args.max_episode_steps
    N = args.num_envs
    ep_tasks = [curriculum.tasks[int(i)] for i in env.rng.integers(0, len(curriculum.tasks), N)]
    ep_levels = [curriculum.sample_level(t, env.rng) for t in ep_tasks]
    states = env.reset(ep_tasks, ep_levels)
    success = np.zeros(N, dtype=bool)
    obs = torch.zeros(T + 1, N, STATE_DIM, dtype=torch.long)
    actions = torch.zeros(T, N, dtype=torch.long)
    oracle = torch.zeros(T, N, dtype=torch.long)
    logprobs = torch.zeros(T, N)
    values = torch.zeros(T + 1, N)
    goal = np.zeros((T, N), np.float32)
    pred = np.zeros((T, N), np.float32)
    cons = np.zeros((T, N), np.float32)
    for t in range(T):
        obs[t] = states_to_tensor(states)
        oracle[t] = torch.tensor([env.parent.oracle_action(s) for s in states])
        out = agent.get_action_and_value(obs[t].to(device))
        actions[t] = out.action.cpu()
        logprobs[t] = out.logprob.cpu()
        values[t] = out.value.cpu()
        # consistency is judged on the state the action was taken in: its last answer and that answer's verdict
        cons[t] = consistency_reward(states, out.action.tolist())
        states, goal[t], _, _, info = env.step(out.action.tolist())
        obs[t + 1] = states_to_tensor(states)
        success |= info["success"]
        if args.pred_reward_weight != 0:
            prediction = agent.world_model(out.h, out.action)
            pred[t] = prediction_reward(prediction, obs[t + 1].to(device).float())
    if args.bootstrap_time_limit:
        values[T] = agent.get_value(obs[T].to(device)).cpu()
    return Rollout(obs, actions, logprobs, values, oracle, RewardVector(goal, pred, cons), success, ep_tasks, ep_levels)


# ADVANTAGES
def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """GAE over (T, N) rewards and (T + 1, N) values; values[T] is 0 unless --bootstrap-time-limit (the horizon is
    fixed and observed, so nothing is earned after it)."""
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = rewards[t] + gamma * values[t + 1] - values[t] + gamma * lam * last
        adv[t] = last
    return adv


def reinforce_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return-to-go over (T, N) rewards (GAE with no values and lambda 1): nothing bootstraps."""
    return gae(rewards, torch.zeros(rewards.shape[0] + 1, *rewards.shape[1:]), gamma, 1.0)


def reinforce_advantages(rewards: torch.Tensor, baseline: torch.Tensor, args: Args) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, the baseline for the next batch): the return minus the running-mean baseline (per time step) of the
    earlier batches, which takes this batch in only afterwards; --baseline-update before takes it in first (the plan's
    order)."""
    returns = reinforce_returns(rewards, args.gamma)
    new_baseline = args.baseline_decay * baseline + (1 - args.baseline_decay) * returns.mean(1)
    against = baseline
    if args.baseline_update == "before":
        against = new_baseline
    return returns - against.unsqueeze(1), new_baseline


def ppo_advantages(rewards: torch.Tensor, values: torch.Tensor, args: Args) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns): GAE, and the value target it implies."""
    advantages = gae(rewards, values, args.gamma, args.gae_lambda)
    return advantages, advantages + values[:-1]


# UPDATE
def scale_advantages(adv: torch.Tensor) -> torch.Tensor:
    """REINFORCE's advantages divided by their std; the baseline centres them. A std of 0 (every return of the batch
    equal) would scale them by 1e8: they are left as they are."""
    std = adv.std()
    if std > 1e-6:
        return adv / (std + 1e-8)
    return adv


def normalize_advantages(adv: torch.Tensor) -> torch.Tensor:
    """PPO's advantages centred and divided by their std, as CleanRL's."""
    return (adv - adv.mean()) / (adv.std() + 1e-8)


def kl_to_parent(logits: torch.Tensor, oracle: torch.Tensor, smoothing: float) -> torch.Tensor:
    """KL(p_parent || pi) with p_parent the oracle action smoothed by `smoothing` mass over all actions."""
    n = logits.shape[-1]
    p = torch.full_like(logits, smoothing / n)
    p.scatter_(-1, oracle.unsqueeze(-1), 1.0 - smoothing + smoothing / n)
    # xlogy: 0 * log 0 = 0 where smoothing is 0
    return (torch.special.xlogy(p, p) - p * F.log_softmax(logits, -1)).sum(-1).mean()


def reinforce_update(agent: Agent, optimizer, ro: Rollout, advantages: torch.Tensor, args: Args, device) -> dict:
    """One gradient step on the whole batch: the policy gradient, the entropy bonus, the world model's loss and
    (--kl-coef) the KL to the parent."""
    b_obs = ro.obs[:-1].flatten(0, 1).to(device)
    b_next = ro.obs[1:].flatten(0, 1).to(device)
    b_actions = ro.actions.flatten(0, 1).to(device)
    b_adv = advantages.flatten(0, 1).to(device)
    b_oracle = ro.oracle.flatten(0, 1).to(device)
    # the batch in a random order, as PPO's single minibatch: the order sets the last bits of the sums
    perm = torch.randperm(args.batch_size)
    new = agent.get_action_and_value(b_obs[perm], b_actions[perm])
    adv = b_adv[perm]
    if args.norm_adv and args.batch_size > 1:
        adv = scale_advantages(adv)
    pg_loss = -(adv * new.logprob).mean()
    # the world model is trained through the shared core: its loss shapes the representation h
    wm_loss = F.mse_loss(agent.world_model(new.h, b_actions[perm]), b_next[perm].float())
    kl = torch.zeros(())
    if args.kl_coef > 0:
        kl = kl_to_parent(new.logits, b_oracle[perm], args.kl_smoothing)
    loss = pg_loss - args.ent_coef * new.entropy.mean() + args.world_model_coef * wm_loss + args.kl_coef * kl
    optimizer.zero_grad()
    loss.backward()
    if args.max_grad_norm > 0:
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return {
        "losses/policy_loss": pg_loss.item(),
        "losses/entropy": new.entropy.mean().item(),
        "losses/world_model_mse": wm_loss.item(),
        "losses/kl_to_parent": kl.item(),
    }


def ppo_update(agent: Agent, optimizer, ro: Rollout, advantages, returns, args: Args, device) -> dict:
    """--update-epochs x --num-minibatches steps of the clipped surrogate, the value loss, the entropy bonus, the world
    model's loss and (--kl-coef) the KL to the parent."""
    b_obs = ro.obs[:-1].flatten(0, 1).to(device)
    b_next = ro.obs[1:].flatten(0, 1).to(device)
    b_actions = ro.actions.flatten(0, 1).to(device)
    b_logprobs = ro.logprobs.flatten(0, 1).to(device)
    b_adv = advantages.flatten(0, 1).to(device)
    b_returns = returns.flatten(0, 1).to(device)
    b_oracle = ro.oracle.flatten(0, 1).to(device)
    b_values = ro.values[:-1].flatten(0, 1).to(device)
    mb_size = args.batch_size // args.num_minibatches
    clipfracs = []
    stats = {}
    for _ in range(args.update_epochs):
        perm = torch.randperm(args.batch_size)
        for start in range(0, args.batch_size, mb_size):
            mb = perm[start : start + mb_size]
            new = agent.get_action_and_value(b_obs[mb], b_actions[mb])
            mb_adv = b_adv[mb]
            if args.norm_adv and len(mb) > 1:
                mb_adv = normalize_advantages(mb_adv)
            logratio = new.logprob - b_logprobs[mb]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
            pg_loss1 = -mb_adv * ratio
            pg_loss2 = -mb_adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            v_loss = 0.5 * ((new.value - b_returns[mb]) ** 2).mean()
            # the world model is trained through the shared core: its loss shapes the representation h
            wm_loss = F.mse_loss(agent.world_model(new.h, b_actions[mb]), b_next[mb].float())
            kl = torch.zeros(())
            if args.kl_coef > 0:
                kl = kl_to_parent(new.logits, b_oracle[mb], args.kl_smoothing)
            loss = (
                pg_loss
                - args.ent_coef * new.entropy.mean()
                + args.vf_coef * v_loss
                + args.world_model_coef * wm_loss
                + args.kl_coef * kl
            )
            optimizer.zero_grad()
            loss.backward()
            if args.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            stats = {
                "losses/policy_loss": pg_loss.item(),
                "losses/value_loss": v_loss.item(),
                "losses/entropy": new.entropy.mean().item(),
                "losses/approx_kl": approx_kl.item(),
                "losses/world_model_mse": wm_loss.item(),
                "losses/kl_to_parent": kl.item(),
            }
    var_y = b_returns.var()
    stats["losses/clipfrac"] = float(np.mean(clipfracs))
    stats["losses/explained_variance"] = 0.0
    if var_y > 0:
        stats["losses/explained_variance"] = (1 - (b_returns - b_values).var() / var_y).item()
    return stats


# TRAINING LOOP
def train(args: Args, writer, parent=None, checkpoints=None) -> tuple[Agent, dict]:
    """Trains one agent; returns it with the evaluation levels per task (the curriculum's final levels). `checkpoints`
    (--checkpoint-every, --resume: cleanrl_astral_utils.baby.Checkpoints) saves the training state and, when resuming,
    restores it before the first update."""
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    tasks = task_list(args.task)
    agent = build_agent(args).to(device)
    print(f"model parameters: {num_parameters(agent):,} (< 1M: {num_parameters(agent) < 1_000_000})")
    optimizer = make_optimizer(agent, args)
    curriculum = make_curriculum(args, tasks)
    if parent is None:
        parent = make_parent(args)
    env = BabyEnv(parent, args.num_envs, args.max_episode_steps, args.seed)
    baseline = torch.zeros(args.max_episode_steps)
    log = TrainingLog(writer, tasks, args)
    start = 1
    if checkpoints is not None and checkpoints.resumed is not None:
        start, baseline = checkpoints.restore(agent, optimizer, curriculum, env, log, parent)
    for iteration in range(start, args.num_iterations + 1):
        global_step = iteration * args.batch_size
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # ROLLOUT: N whole episodes of exactly T steps (the time limit is the only episode end)
        ro = collect_rollout(agent, env, curriculum, args, device)
        rewards = torch.as_tensor(ro.rewards.total(args.goal_reward_weight, args.pred_reward_weight, args.cons_reward_weight))

        # CURRICULUM: each episode counts at the level it was played; a task levels up on mastery
        for task, level, outcome in zip(ro.tasks, ro.levels, curriculum.outcomes(ro.success, ro.rewards.goal[-1])):
            if curriculum.record(task, level, bool(outcome)):
                print(f"curriculum: {task} -> level {curriculum.levels[task]} at global_step={global_step}")

        if args.algorithm == "reinforce":
            # ADVANTAGES: the return minus the running baseline of the earlier batches
            advantages, baseline = reinforce_advantages(rewards, baseline, args)
            # UPDATE: one gradient step on the whole batch
            stats = reinforce_update(agent, optimizer, ro, advantages, args, device)
        else:
            # ADVANTAGES (GAE)
            advantages, returns = ppo_advantages(rewards, ro.values, args)
            # UPDATE: epochs x minibatches of the clipped surrogate
            stats = ppo_update(agent, optimizer, ro, advantages, returns, args, device)

        # LOGGING
        log.update(iteration, global_step, ro, rewards, stats, optimizer.param_groups[0]["lr"], curriculum, parent)
        if checkpoints is not None and checkpoints.due(iteration, args):
            checkpoints.save(args, iteration, agent, optimizer, baseline, curriculum, env, log, parent)
    return agent, dict(curriculum.levels)


# EVALUATION
class Evaluator:
    """Success rate, world-model MSE and policy entropy per (task, level); the rule judges, never an LLM."""

    def __init__(
        self,
        tasks: list[str],
        num_actions: int,
        max_episode_steps: int,
        episodes: int,
        seed: int,
        conditional_rule: str = "flags",
    ):
        self.tasks = tasks
        self.num_actions = num_actions
        self.T = max_episode_steps
        self.episodes = episodes
        self.seed = seed
        self.conditional_rule = conditional_rule

    @torch.no_grad()
    def run(self, agent: Agent | None, eval_levels: dict, transcript: list | None = None):
        """agent=None evaluates the uniform random policy."""
        parent = rule_parent(self.num_actions, self.conditional_rule)
        n = self.episodes
        gen = torch.Generator().manual_seed(self.seed)
        per_diff = {}
        mse_all = []
        ent_all = []
        for task, level in playable(self.tasks, self.num_actions, self.conditional_rule):
            env = BabyEnv(parent, n, self.T, self.seed + 1000 * self.tasks.index(task) + level)
            states = env.reset([task] * n, [level] * n)
            success = np.zeros(n, dtype=bool)
            for _ in range(self.T):
                if agent is None:
                    action = torch.randint(0, self.num_actions, (n,), generator=gen)
                    ent = torch.full((n,), math.log(self.num_actions))
                else:
                    out = agent.get_action_and_value(states_to_tensor(states), greedy=True)
                    action = out.action
                    ent = out.entropy
                if transcript is not None and len(transcript) < 20:
                    oracle = parent.oracle_action(states[0])
                    shown = f"Rule: {parent.rule_text(states[0])}\n{states[0].shown_attributes()}"
                    transcript.append(f"{shown}\n-> action {action[0].item()} (oracle {oracle})\n")
                states, _, _, _, info = env.step(action.tolist())
                success |= info["success"]
                ent_all.append(ent.mean().item())
                if agent is not None and level == eval_levels[task]:
                    target = states_to_tensor(states).float()
                    mse_all.append(F.mse_loss(agent.world_model(out.h, action), target).item())
            per_diff[f"{task}/level{level}"] = float(success.mean())
        final = [per_diff[f"{t}/level{eval_levels[t]}"] for t in self.tasks]
        world_model_mse = None  # the random policy has none
        if mse_all:
            world_model_mse = float(np.mean(mse_all))
        return {
            "success_rate": float(np.mean(final)),
            "world_model_mse": world_model_mse,
            "policy_entropy": float(np.mean(ent_all)),
            "per_difficulty_success": per_diff,
        }


def evaluate(model_path: str, episodes: int | None = None, seed: int | None = None) -> dict:
    """Evaluates a saved model; by default on the run's own episodes, so it reproduces the run's eval.json."""
    ckpt = torch.load(model_path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or ckpt.get("script") != SCRIPT:
        raise ValueError(f"{model_path!r} was not written by {SCRIPT}.py")
    if set(ckpt["args"]) != {field.name for field in dataclasses.fields(Args)}:
        raise ValueError(f"{model_path!r} holds another format of {SCRIPT}.py's checkpoint; commit 95652a5 reads it")
    saved = Args(**ckpt["args"])
    agent = build_agent(saved)
    agent.load_state_dict(ckpt["state_dict"])
    if episodes is None:
        episodes = saved.eval_episodes
    if seed is None:
        seed = saved.seed + EVAL_SEED_OFFSET
    tasks = task_list(saved.task)
    evaluator = Evaluator(tasks, saved.num_actions, saved.max_episode_steps, episodes, seed, saved.conditional_rule)
    return evaluator.run(agent.eval(), ckpt["eval_levels"])


# LOGGING
class TrainingLog:
    """The scalars of every update (charts/, losses/, reward/, curriculum/, parent/) and a progress line every 25."""

    def __init__(self, writer, tasks: list[str], args: Args):
        self.writer = writer
        self.tasks = tasks
        self.args = args
        self.start_time = time.time()
        self.recent_success = collections.deque(maxlen=100)  # charts/success_rate: the last 100 episodes
        self.recent_level = {}

    def update(self, iteration, global_step, ro: Rollout, rewards, stats, learning_rate, curriculum, parent):
        args = self.args
        for task, level, success in zip(ro.tasks, ro.levels, ro.success):
            self.recent_success.append(float(success))
            self.recent_level.setdefault((task, level), collections.deque(maxlen=100)).append(float(success))
        sps = int(global_step / max(time.time() - self.start_time, 1e-9))
        scalars = {
            "charts/success_rate": float(np.mean(self.recent_success)),
            **{f"charts/success_rate_{t}_level{lv}": float(np.mean(d)) for (t, lv), d in self.recent_level.items()},
            "charts/episodic_return": rewards.sum(0).mean().item(),
            "charts/episodic_length": float(args.max_episode_steps),
            "charts/SPS": sps,
            "charts/learning_rate": learning_rate,
            **stats,
            **{f"reward/{k}": float(getattr(ro.rewards, k).sum(0).mean()) for k in ("goal", "pred", "cons")},
            "reward/total": rewards.sum(0).mean().item(),
            **{f"curriculum/level_{t}": curriculum.levels[t] for t in self.tasks},
        }
        if hasattr(parent, "scalars"):  # an LLM parent: its running totals, and the validity and diversity of its tasks
            scalars.update(parent.scalars())
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, global_step)
        if iteration % 25 == 0 or iteration == args.num_iterations:
            levels = " ".join(f"{t}:L{curriculum.levels[t]}" for t in self.tasks)
            minutes_left = (args.num_iterations - iteration) * global_step / iteration / max(sps, 1) / 60
            print(
                f"global_step={global_step} SPS={sps} success={scalars['charts/success_rate']:.3f} "
                f"entropy={stats['losses/entropy']:.3f} wm_mse={stats['losses/world_model_mse']:.3f} [{levels}] "
                f"{minutes_left:.1f} min left"
            )


# RESULTS: the evaluation against the baselines, the representation analysis, eval.json
def evaluate_with_baselines(args: Args, agent: Agent, eval_levels: dict, transcript: list | None) -> tuple[dict, dict]:
    """The agent's evaluation and each --baselines row, on the same episodes (the rule judges, never an LLM)."""
    evaluator = Evaluator(
        task_list(args.task),
        args.num_actions,
        args.max_episode_steps,
        args.eval_episodes,
        args.seed + EVAL_SEED_OFFSET,
        args.conditional_rule,
    )
    result = evaluator.run(agent, eval_levels, transcript=transcript)
    baselines = {}
    for name in args.baselines:
        baselines[name] = evaluator.run(None, eval_levels)
    print(f"\n{'policy':<12} {'success':>8} {'wm_mse':>8} {'entropy':>8}  per-difficulty success")
    for name, r in {"agent": result, **baselines}.items():
        diff = " ".join(f"{k}={v:.2f}" for k, v in r["per_difficulty_success"].items())
        mse = "-"
        if r["world_model_mse"] is not None:
            mse = f"{r['world_model_mse']:.3f}"
        print(f"{name:<12} {r['success_rate']:>8.3f} {mse:>8} {r['policy_entropy']:>8.3f}  {diff}")
    # eval.json's rows: flat, and without a world-model MSE where there is none (random)
    rows = {}
    for name, r in baselines.items():
        rows[name] = {"success_rate": r["success_rate"], "policy_entropy": r["policy_entropy"]}
        if r["world_model_mse"] is not None:
            rows[name]["world_model_mse"] = r["world_model_mse"]
        rows[name].update({f"success_{k}": v for k, v in r["per_difficulty_success"].items()})
    return result, rows


def evaluate_run(args: Args, run_dir: str, writer, agent: Agent, eval_levels: dict, parent, check, train_time: float) -> dict:
    """The trained agent and the baselines on the same episodes, the representation analysis, the transcripts
    (--capture-video) and eval.json; returns what eval.json holds."""
    transcript = None
    if args.capture_video:
        transcript = []
    result, baselines = evaluate_with_baselines(args, agent, eval_levels, transcript)
    out = {
        "script": SCRIPT,
        "task": args.task,
        **result,
        "baselines": baselines,
        "train_time_s": train_time,
        "eval_levels": eval_levels,
        "num_parameters": num_parameters(agent),
    }
    if args.parent == "llm":
        out["parent"] = parent.summary()
    if check is not None:
        out["llm_agreement_check"] = check
    if args.analysis:
        png = os.path.join(run_dir, "tsne.png")
        out["probe_accuracy"] = representation_analysis(agent, args, eval_levels, png)
        print("linear-probe accuracy: " + " ".join(f"{k}={v:.2f}" for k, v in out["probe_accuracy"].items()))
        print(f"t-SNE written to {png}")
    if transcript is not None:
        pathlib.Path(run_dir, "videos").mkdir(exist_ok=True)
        pathlib.Path(run_dir, "videos", "eval_transcript.txt").write_text("\n".join(transcript))
    for k in ("success_rate", "world_model_mse", "policy_entropy"):
        writer.add_scalar(f"eval/{k}", result[k], args.total_timesteps)
    write_atomically(os.path.join(run_dir, "eval.json"), json.dumps(out, indent=2))
    print(f"eval.json written to {run_dir}")
    return out


@torch.no_grad()
def representation_analysis(agent: Agent, args: Args, levels: dict, png_path: str) -> dict:
    """Linear-probe accuracy of each attribute from h, and a t-SNE PNG coloured by the oracle action, on
    --analysis-samples states of the evaluation levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.linear_model import LogisticRegression
    from sklearn.manifold import TSNE
    from sklearn.model_selection import train_test_split

    tasks = task_list(args.task)
    num_actions = args.num_actions
    seed = args.seed
    parent = rule_parent(num_actions, args.conditional_rule)
    rng = np.random.default_rng(seed)
    states = []
    for i in range(args.analysis_samples):
        task = tasks[i % len(tasks)]
        s = parent.new_instance(task, levels[task], rng)
        for _ in range(int(rng.integers(0, args.max_episode_steps))):  # later steps too, so last_action/last_correct/step vary
            a = int(rng.integers(num_actions))
            s = parent.transition(s, a, parent.judge(s, a))
        states.append(s)
    x = states_to_tensor(states)
    h = agent.embed(x).numpy()
    probes = {}
    for i, name in enumerate(ATTRIBUTES):
        y = x[:, i].numpy()
        counts = np.unique(y, return_counts=True)[1]
        if len(counts) < 2:
            continue
        stratify = y if counts.min() >= 2 else None
        h_train, h_test, y_train, y_test = train_test_split(h, y, test_size=0.3, random_state=seed, stratify=stratify)
        if len(np.unique(y_train)) >= 2:
            probes[name] = float(LogisticRegression(max_iter=1000).fit(h_train, y_train).score(h_test, y_test))
    emb = TSNE(n_components=2, init="pca", perplexity=min(30, len(states) // 4), random_state=seed).fit_transform(h)
    fig, ax = plt.subplots(figsize=(5, 4.5))
    sc = ax.scatter(
        emb[:, 0],
        emb[:, 1],
        c=np.array([parent.oracle_action(s) for s in states]),
        cmap="tab10" if num_actions <= 10 else "tab20",
        s=8,
    )
    fig.colorbar(sc, ax=ax, label="target (oracle action)")
    ax.set_title(f"t-SNE of state embeddings ({', '.join(tasks)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return probes


def write_atomically(path: str, data: str | dict):
    """Text, or a dict in torch.save's format, to a temporary file beside `path`, then a rename: a run killed while
    writing never leaves a half-written file behind."""
    tmp = f"{path}.tmp.{os.getpid()}"
    if isinstance(data, str):
        pathlib.Path(tmp).write_text(data)
    else:
        torch.save(data, tmp)
    os.replace(tmp, path)


# PLUMBING: VALIDATION, THE PARENT'S START-UP AND THE RUN DIRECTORY
def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def validate(args: Args):
    """Raises ValueError (one line) for arguments that would crash late or run wrong in silence."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes any <, >
            raise ValueError(f"{flag(field.name)} {value} must be a finite number")
    if not args.exp_name.strip() or "/" in args.exp_name:
        raise ValueError(f"--exp-name {args.exp_name!r} must be a non-empty name without '/'")
    for name in ("num_minibatches", "update_epochs", "llm_concurrency", "num_layers", "eval_episodes", "mastery_window"):
        if getattr(args, name) < 1:
            raise ValueError(f"{flag(name)} must be >= 1")
    for name in ("learning_rate", "llm_timeout", "clip_coef", "adam_eps"):
        if not getattr(args, name) > 0:
            raise ValueError(f"{flag(name)} {getattr(args, name)} must be positive")
    if args.bootstrap_time_limit and args.algorithm != "ppo":
        raise ValueError("--bootstrap-time-limit is for --algorithm ppo: reinforce has no value to bootstrap")
    if args.max_grad_norm < 0:
        raise ValueError(f"--max-grad-norm {args.max_grad_norm} must be >= 0 (0: no clipping)")
    for name in ("llm_retries", "llm_check_pairs"):
        if not getattr(args, name) >= 0:
            raise ValueError(f"{flag(name)} {getattr(args, name)} must be >= 0")
    if args.llm_examples is not None and args.llm_examples < 0:
        raise ValueError(f"--llm-examples {args.llm_examples} must be >= 0")
    for name in ("gae_lambda", "review_prob", "kl_smoothing"):
        if not 0 <= getattr(args, name) <= 1:
            raise ValueError(f"{flag(name)} {getattr(args, name)} must be in [0, 1]")
    if not 0 < args.gamma <= 1:
        raise ValueError(f"--gamma {args.gamma} must be in (0, 1]")
    if not 0 <= args.baseline_decay < 1:
        raise ValueError(f"--baseline-decay {args.baseline_decay} must be in [0, 1)")
    if not 0 < args.mastery_threshold <= 1:
        raise ValueError(f"--mastery-threshold {args.mastery_threshold} must be in (0, 1]")
    batch = args.num_envs * args.max_episode_steps
    if args.total_timesteps < batch:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one update (--num-envs x --max-episode-steps = {batch})"
        )
    if args.analysis and args.analysis_samples < 2:
        raise ValueError("--analysis-samples must be >= 2 (or --no-analysis)")
    top = args.level
    if args.curriculum:
        top = NUM_LEVELS - 1
    configs = [level_configs(t, args.conditional_rule) for t in task_list(args.task)]
    need = max(levels[lv]["num_symbols"] for levels in configs for lv in range(top + 1))
    if args.num_actions < need:
        raise ValueError(
            f"--num-actions {args.num_actions} is smaller than the {need} symbols task {args.task!r} needs up to level "
            f"{top}; use --num-actions >= {need}"
        )
    if args.algorithm == "ppo" and batch % args.num_minibatches != 0:
        raise ValueError("--num-envs * --max-episode-steps must be divisible by --num-minibatches")
    if args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every {args.checkpoint_every} must be >= 0 (0: no checkpoints)")
    if args.checkpoint_every:  # the package writes the training state
        require_helper_package("--checkpoint-every")
    if args.parent == "llm":  # the package holds the LLM client
        require_helper_package("--parent llm")
    if args.parent == "llm" and importlib.util.find_spec("openai") is None:
        raise ValueError("--parent llm needs the openai client: pip install -r requirements-llm.txt")
    if args.conditional_rule == "plan" and args.task not in ("conditional", "all"):
        raise ValueError("--conditional-rule plan changes the conditional task only: use --task conditional or all")
    if args.conditional_rule == "plan" and args.parent == "llm":
        raise ValueError("--conditional-rule plan is taught by the rule parent only (the LLM prompts state the flags rule)")
    if args.curriculum_rule == "plan" and not args.curriculum:
        raise ValueError("--curriculum-rule plan needs --curriculum")
    plan_fixed = ("mastery_threshold", "mastery_window", "review_prob")
    if args.curriculum_rule == "plan" and any(getattr(args, k) != getattr(Args, k) for k in plan_fixed):
        raise ValueError("--curriculum-rule plan fixes the threshold (0.8), window (100) and review (none): drop --mastery-*")
    if args.task_source == "parent" and args.parent != "llm":
        raise ValueError("--task-source parent needs --parent llm (the rule parent's instances are the rule's)")
    if args.task_pool_size < 1:
        raise ValueError(f"--task-pool-size {args.task_pool_size} must be >= 1")
    if args.parent == "llm" and args.llm_role == "answer" and args.llm_next_state:
        raise ValueError("--llm-next-state needs --llm-role judge: SmolLM2-135M does not write a valid next state")
    if args.parent == "llm" and not args.llm_base_url:
        raise ValueError("--parent llm needs --llm-base-url (an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1)")
    if args.parent == "llm" and not args.llm_base_url.startswith(("http://", "https://")):
        raise ValueError(f"--llm-base-url {args.llm_base_url!r} must be an http:// or https:// URL (http://127.0.0.1:8000/v1)")


def require_helper_package(option: str):
    """Raises ValueError (one line) when the helper package, which `option` needs, cannot be imported (the script was
    copied alone)."""
    try:
        import cleanrl_astral_utils  # noqa: F401
    except ImportError as e:
        raise ValueError(f"{option} needs the cleanrl_astral_utils package: pip install -e . in the repository") from e


def fail(message: str):
    print(f"{SCRIPT}.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
    args = tyro.cli(Args)
    resumed = None
    try:
        if args.resume is not None:
            require_helper_package("--resume")
            from cleanrl_astral_utils.baby import resumed_args

            args, resumed = resumed_args(args, Args, SCRIPT)
        validate(args)
    except ValueError as e:
        fail(str(e))
    args.batch_size = args.num_envs * args.max_episode_steps
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)
    try:
        parent = make_parent(args)
        if args.parent == "llm":  # the endpoint is probed: an unusable one stops the run here, its cache removed
            parent.start()
        if resumed is None:
            run_name, run_dir = claim_run_dir(args.runs_dir, f"{args.task}__{args.exp_name}__{args.seed}__{int(time.time())}")
    except ValueError as e:
        fail(str(e))
    purge_step = None
    if resumed is not None:  # the run's own directory; TensorBoard drops what the stopped run logged after the checkpoint
        run_dir = os.path.dirname(os.path.abspath(args.resume))
        run_name = os.path.basename(run_dir)
        purge_step = resumed["global_step"] + 1
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
    writer = SummaryWriter(run_dir, purge_step=purge_step)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    seed_everything(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    t0 = time.time()
    check = None
    if args.parent == "llm" and args.llm_check_pairs:
        check = parent.agreement_report(playable(task_list(args.task), args.num_actions), args.llm_check_pairs, args.seed)
    checkpoints = None
    if args.checkpoint_every:
        from cleanrl_astral_utils.baby import Checkpoints

        checkpoints = Checkpoints(os.path.join(run_dir, "checkpoint.pt"), args.checkpoint_every, SCRIPT, resumed)

    agent, eval_levels = train(args, writer, parent, checkpoints)

    train_time = time.time() - t0
    agent.eval()
    if args.save_model:
        model_path = os.path.join(run_dir, f"{args.exp_name}.cleanrl_model")
        saved = {
            "state_dict": agent.state_dict(),
            "args": dataclasses.asdict(args),
            "script": SCRIPT,
            "eval_levels": eval_levels,
        }
        write_atomically(model_path, saved)
        print(f"model saved to {model_path}")
    evaluate_run(args, run_dir, writer, agent, eval_levels, parent, check, train_time)
    writer.close()
