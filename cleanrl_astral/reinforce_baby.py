"""WMIL "reinforce baby": a randomly initialised transformer learns goal-directed behaviour from a parent.

Follows the WMIL plan and its five critical fixes: episodes end only on the time limit; the world model predicts
the raw next-state tensor; REINFORCE before PPO; reward components logged apart; the LLM parent is optional.

Usage (the locked MVP):
    python cleanrl_astral/reinforce_baby.py --task pattern-echo --num-actions 8 --hidden-dim 64 \
        --num-layers 2 --algorithm reinforce --parent deterministic --total-timesteps 10000
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import importlib.util
import itertools
import json
import math
import os
import pathlib
import random
import re
import sqlite3
import sys
import time
from dataclasses import dataclass
from typing import Literal

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
    parent: Literal["deterministic", "llm"] = "deterministic"
    """who judges the actions: the deterministic rule or an LLM behind an OpenAI-compatible endpoint"""
    llm_base_url: str | None = None
    """base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (required with --parent llm)"""
    llm_model: str = "gpt-4o-mini"
    """model name sent to the chat-completions endpoint"""
    llm_api_key_env: str = "OPENAI_API_KEY"
    """environment variable holding the API key (may be unset for local servers)"""
    llm_timeout: float = 10.0
    """seconds before an LLM request is abandoned"""
    llm_retries: int = 2
    """extra attempts after a failed or invalid LLM answer, before falling back to the rule"""
    llm_next_state: bool = False
    """if toggled, the LLM also proposes the next state (validated; the rule is used when invalid)"""
    llm_cache: str = ""
    """sqlite file caching LLM answers by request; empty: {runs_dir}/llm_cache.sqlite"""
    llm_concurrency: int = 4
    """parallel LLM requests per batch of episodes"""
    llm_examples: int = 0
    """worked examples (fixed instances of the same task and level, answered right and wrong) before each query"""
    llm_response_format: Literal["json-object", "json-schema", "none"] = "json-object"
    """structured output: llama.cpp's {"type": "json_object", "schema": ...}, the OpenAI API's json_schema, or none"""
    llm_check_pairs: int = 0
    """before training, the LLM judges this many seeded (state, action) pairs per task and level (agreement table)"""

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
    max_grad_norm: float = 0.5
    """gradient clipping norm"""

    # Evaluation
    eval_episodes: int = 200
    """evaluation episodes per (task, level)"""
    baselines: tuple[Literal["random", "rl-only", "kl-distill"], ...] = ("random",)
    """baselines evaluated in the same table: random, rl-only, kl-distill (the last two are trained here)"""
    kl_distill_coef: float = 1.0
    """kl_coef used by the kl-distill baseline"""
    analysis: bool = True
    """if toggled, linear probes per state attribute and a t-SNE PNG of the embeddings"""
    analysis_samples: int = 600
    """states embedded for the probes and the t-SNE"""

    # computed at runtime
    batch_size: int = 0
    """environment steps per update (computed at runtime)"""
    num_iterations: int = 0
    """number of updates (computed at runtime)"""


# Environment ----------------------------------------------------------------------------------------------------------
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
    return TASKS if task == "all" else [task]


def playable(tasks: list[str], num_actions: int) -> list[tuple[str, int]]:
    """The (task, level) pairs whose symbols fit in the action space."""
    return [(t, lv) for t in tasks for lv in range(NUM_LEVELS) if DIFFICULTY_CONFIGS[t][lv]["num_symbols"] <= num_actions]


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

    def as_list(self) -> list[int]:
        return [self.task, self.level, *self.values, *self.flags, self.last_action, self.last_correct, self.step]

    def as_dict(self) -> dict:
        return dict(zip(ATTRIBUTES, self.as_list()))

    @staticmethod
    def from_list(v: list[int], num_actions: int) -> "State":
        return State(
            int(v[0]),
            int(v[1]),
            tuple(int(x) for x in v[2:5]),
            tuple(int(x) for x in v[5:8]),
            int(v[8]),
            int(v[9]),
            int(v[10]),
            num_actions,
        )

    def to_prompt(self) -> str:
        """The task's rule in plain words and only the attributes it reads (the LLM parent's prompt, transcripts)."""
        task, pad = TASKS[self.task], self.num_actions
        if task == "pattern-echo":
            return f"Rule: {LLM_RULES[task]}\ncue = {self.values[0]}"
        if task == "sequence-next":
            return f"Rule: {LLM_RULES[task]}\nsequence = {', '.join(str(v) for v in self.values if v != pad)}"
        shown = [f"f{i} = {f}" for i, f in enumerate(self.flags) if f != FLAG_PAD]
        shown += [f"v{i} = {v}" for i, v in enumerate(self.values) if v != pad]
        return f"Rule: {LLM_RULES[DIFFICULTY_CONFIGS['conditional'][self.level]['form']]}\n{', '.join(shown)}"


class DeterministicParent:
    """Task instances, transitions and rewards by rule; `oracle_action` is the rule's answer."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions

    def new_instance(self, task: str, level: int, rng: np.random.Generator) -> State:
        cfg = DIFFICULTY_CONFIGS[task][level]
        pad, n = self.num_actions, cfg["num_symbols"]
        values, flags = [pad] * 3, [FLAG_PAD] * 3
        if task == "pattern-echo":
            values[0] = int(rng.integers(cfg["target_range"]))
        elif task == "sequence-next":
            d, length = int(rng.choice(cfg["steps"])), int(rng.choice(cfg["lengths"]))
            span = abs(d) * length  # the answer a + d * length must stay in [0, n)
            a = int(rng.integers(0, n - span)) if d > 0 else int(rng.integers(span, n))
            values[:length] = [a + d * i for i in range(length)]
        else:
            used = {"if": 2, "elif": 3, "nested": 3}[cfg["form"]]
            values[:used] = [int(x) for x in rng.integers(0, n, used)]
            flags[: cfg["conditions"]] = [int(x) for x in rng.integers(0, 2, cfg["conditions"])]
        return State(TASKS.index(task), level, tuple(values), tuple(flags), pad, FLAG_PAD, 0, self.num_actions)

    def oracle_action(self, s: State) -> int:
        task, (v0, v1, v2), (f0, f1, f2) = TASKS[s.task], s.values, s.flags
        if task == "pattern-echo":
            return v0
        if task == "sequence-next":
            items = [v for v in s.values if v != s.num_actions]
            return items[-1] + (items[1] - items[0])
        form = DIFFICULTY_CONFIGS["conditional"][s.level]["form"]
        if form == "if":
            return v0 if f0 == 1 else v1
        if form == "elif":
            return v0 if f0 == 1 else (v1 if f1 == 1 else v2)
        n = DIFFICULTY_CONFIGS["conditional"][s.level]["num_symbols"]
        return (v0 if f1 == 1 else v1) if f0 == 1 else (v2 if f2 == 1 else n - 1 - v0)

    def judge(self, s: State, action: int) -> float:
        return float(action == self.oracle_action(s))

    def transition(self, s: State, action: int, reward: float) -> State:
        # the task instance stays fixed for the whole episode: the child sees its last answer and the verdict
        return dataclasses.replace(s, last_action=int(action), last_correct=int(reward >= 0.5), step=s.step + 1)

    def respond(self, states: list[State], actions: list[int]) -> list[tuple[float, State]]:
        """(reward, next state) of each (state, action)."""
        return [(r, self.transition(s, a, r)) for s, a in zip(states, actions) for r in [self.judge(s, a)]]


LLM_SYSTEM_PROMPT = (
    'You check a child\'s answer against a rule. Reply with JSON only: {"reward": 1} if the answer '
    'follows the rule, {"reward": 0} if it does not.'
)


class LLMParent(DeterministicParent):
    """Judges actions with a model behind an OpenAI-compatible endpoint: validated, retried, cached, rule fallback."""

    def __init__(self, args: Args):
        import openai

        super().__init__(args.num_actions)
        self.vocab = attribute_vocab(args.num_actions, args.max_episode_steps)
        self.base_url, self.model, self.timeout = args.llm_base_url.rstrip("/"), args.llm_model, args.llm_timeout
        self.args, self.next_state = args, args.llm_next_state
        # the retries are ours (an invalid answer is retried as well), so the client's own are off
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=os.environ.get(args.llm_api_key_env) or "unused",
            timeout=args.llm_timeout,
            max_retries=0,
        )
        cache = args.llm_cache or os.path.join(args.runs_dir, "llm_cache.sqlite")
        os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
        self.db = sqlite3.connect(cache)
        self.db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, answer TEXT NOT NULL)")
        # running totals; "<task>/level<k>/..." keys per task and level
        self.stats, self.latencies = collections.Counter(), []

    def user_message(self, s: State, action: int) -> str:
        ask_state = (
            (
                f"\nstate = {json.dumps(s.as_dict())}\nAlso give next_state: this state with step + 1, "
                "last_action = the answer and last_correct = your reward."
            )
            if self.next_state
            else ""
        )
        return f"{s.to_prompt()}\nanswer = {int(action)}{ask_state}"

    def body(self, s: State, action: int) -> dict:
        # worked examples: fixed instances of the same task and level, answered right and wrong in turn
        rng, shots = np.random.default_rng(12345), []
        for i in range(self.args.llm_examples):
            e = self.new_instance(TASKS[s.task], s.level, rng)
            a = self.oracle_action(e) if i % 2 == 0 else (self.oracle_action(e) + 1 + i) % self.num_actions
            r = self.judge(e, a)
            nxt = {"next_state": self.transition(e, a, r).as_dict()} if self.next_state else {}
            shots += [
                {"role": "user", "content": self.user_message(e, a)},
                {"role": "assistant", "content": json.dumps({"reward": int(r), **nxt})},
            ]
        props = {"reward": {"type": "integer", "enum": [0, 1]}}
        if self.next_state:
            props["next_state"] = {
                "type": "object",
                "required": ATTRIBUTES,
                "properties": {a: {"type": "integer", "minimum": 0, "maximum": k - 1} for a, k in zip(ATTRIBUTES, self.vocab)},
            }
        schema = {"type": "object", "properties": props, "required": list(props)}
        fmt = {
            "json-object": {"type": "json_object", "schema": schema},  # llama.cpp's server
            "json-schema": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}},
            "none": None,
        }[self.args.llm_response_format]
        # max_tokens bounds a model that does not stop: the answer is about 6 tokens, 90 with the next state
        return {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 200 if self.next_state else 20,
            **({"response_format": fmt} if fmt else {}),
            "messages": [
                {"role": "system", "content": LLM_SYSTEM_PROMPT},
                *shots,
                {"role": "user", "content": self.user_message(s, action)},
            ],
        }

    def cache_key(self, s: State, action: int) -> str:
        # all that decides an answer (request, endpoint) or its validity (attribute ranges): no wrong reuse
        raw = json.dumps([self.base_url, self.body(s, action), s.as_list(), int(action), self.vocab])
        return hashlib.sha256(raw.encode()).hexdigest()

    def request(self, s: State, action: int):
        with self.client.chat.completions.with_streaming_response.create(**self.body(s, action)) as reply:
            # the client's timeout bounds each read; this deadline bounds a reply trickled a few bytes at a time
            deadline, chunks = time.monotonic() + self.timeout, []
            for chunk in reply.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no complete reply within --llm-timeout {self.timeout} s")
        return json.loads(b"".join(chunks))["choices"][0]["message"]["content"]  # as leniently as the client reads

    def validate(self, text, s: State, action: int) -> tuple[float, State | None] | None:
        """The parsed (reward, next_state) if the answer is strict, well-formed JSON; None otherwise."""
        if not isinstance(text, str):  # endpoints answer null for a refusal or a tool call
            return None
        try:
            obj = json.loads(re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip()))
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or obj.get("reward") not in (0, 1) or isinstance(obj.get("reward"), bool):
            return None
        if not self.next_state:
            return float(obj["reward"]), None
        ns = obj.get("next_state")
        if not (
            isinstance(ns, dict)
            and set(ns) == set(ATTRIBUTES)
            and all(isinstance(ns[a], int) and 0 <= ns[a] < k for a, k in zip(ATTRIBUTES, self.vocab))
        ):
            return None
        nxt = State.from_list([ns[a] for a in ATTRIBUTES], self.num_actions)
        # the LLM may set the verdict (last_correct), never a new task instance: that would move the goalposts
        ok = nxt == dataclasses.replace(s, last_action=int(action), step=s.step + 1, last_correct=nxt.last_correct)
        return (float(obj["reward"]), nxt) if ok else None

    def ask(self, s: State, action: int) -> tuple[str, float] | None:
        """The first valid answer text within 1 + retries attempts, with its latency (ms); None if all failed."""
        import openai

        for _ in range(1 + self.args.llm_retries):
            t0 = time.perf_counter()
            try:
                text = self.request(s, action)
            except (openai.OpenAIError, OSError, ValueError, LookupError, TypeError):  # OSError: timeouts
                continue
            if self.validate(text, s, action) is not None:
                return text, 1000.0 * (time.perf_counter() - t0)
        return None

    def respond(self, states: list[State], actions: list[int]) -> list[tuple[float, State]]:
        keys = [self.cache_key(s, a) for s, a in zip(states, actions)]
        answers = {
            k: row[0]
            for k in set(keys)
            if (row := self.db.execute("SELECT answer FROM answers WHERE key = ?", (k,)).fetchone())
        }
        self.stats["cache_hits"] += sum(k in answers for k in keys)
        # one request per distinct (state, action): a non-deterministic judge gives each pair one reward per batch
        first = list({k: i for i, k in reversed(list(enumerate(keys))) if k not in answers}.values())
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.llm_concurrency) as pool:
            for i, res in zip(first, pool.map(lambda i: self.ask(states[i], actions[i]), first)):
                if res is not None:
                    answers[keys[i]] = res[0]
                    self.latencies.append(res[1])
                    self.db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?)", (keys[i], res[0]))
        self.db.commit()
        out = []
        for s, a, k in zip(states, actions, keys):
            rule, where = self.judge(s, a), f"{TASKS[s.task]}/level{s.level}"
            parsed = self.validate(answers[k], s, a) if k in answers else None
            counts = ["queries", "fallbacks" if parsed is None else "judged"]
            if parsed is not None:
                counts += ["agreements"] * int(parsed[0] == rule) + ["rewarded"] * int(parsed[0] == 1)
            self.stats.update(counts + [f"{where}/{c}" for c in counts])
            reward, nxt = (rule, None) if parsed is None else parsed
            out.append((reward, nxt if nxt is not None else self.transition(s, a, reward)))
        return out

    def summary(self) -> dict:
        """Totals, and per task and level agreement with the rule and the share rewarded (a judge's bias)."""
        st, lat = self.stats, self.latencies
        out = {k: st[k] for k in ("queries", "judged", "fallbacks", "cache_hits")}
        out.update(agreement=st["agreements"] / max(1, st["judged"]), latency_ms=float(np.mean(lat)) if lat else 0.0)
        levels = sorted({k.rsplit("/", 1)[0] for k in st if k.count("/") == 2})
        out["per_level"] = {
            w: {
                "agreement": st[f"{w}/agreements"] / max(1, st[f"{w}/judged"]),
                "judged": st[f"{w}/judged"],
                "fallbacks": st[f"{w}/fallbacks"],
                "rewarded": st[f"{w}/rewarded"] / max(1, st[f"{w}/judged"]),
            }
            for w in levels
        }
        return out

    def probe(self) -> str | None:
        """What is wrong with the endpoint, or None: one listing and one judgement, asked before any training."""
        where = f"--llm-base-url {self.base_url}"

        def failed(what: str, e: Exception) -> str:  # the client's class (APIConnectionError, ...) and first line
            return f"{where}: {what} failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"

        try:
            served = [m.id for m in self.client.models.list()]
        except Exception as e:  # whatever the reply is, the run cannot use this endpoint
            return failed("listing the models", e)
        if served and self.model not in served:
            return f"--llm-model {self.model!r} is not served at {self.base_url} (it serves {', '.join(served[:5])})"
        try:
            text = self.request(self.new_instance(TASKS[0], 0, np.random.default_rng(0)), 0)
        except Exception as e:
            return failed("a chat completion", e)
        return None if isinstance(text, str) else f"{where}: a chat completion had no text"

    def check_agreement(self, tasks: list[str], pairs: int, seed: int = 0) -> dict:
        """summary() over `pairs` seeded (state, action) per task and level, half right; running totals are kept."""
        stats, latencies, rng = self.stats.copy(), list(self.latencies), np.random.default_rng(seed)
        self.stats, self.latencies = collections.Counter(), []
        for task, level in playable(tasks, self.num_actions):
            states = [self.new_instance(task, level, rng) for _ in range(pairs)]
            wrong = [int(x) for x in rng.integers(1, self.num_actions, pairs)]
            self.respond(
                states,
                [
                    (self.oracle_action(s) + (0 if i % 2 == 0 else w)) % self.num_actions
                    for i, (s, w) in enumerate(zip(states, wrong))
                ],
            )
        result = self.summary()
        self.stats, self.latencies = stats, latencies
        return result


class BabyEnv:
    """A batch of `num_envs` synchronous episodes of fixed length; the parent judges every step."""

    def __init__(self, parent: DeterministicParent, num_envs: int, max_episode_steps: int, seed: int):
        self.parent, self.num_envs, self.max_episode_steps = parent, num_envs, max_episode_steps
        self.rng, self.states, self.t = np.random.default_rng(seed), [], 0

    def reset(self, tasks: list[str], levels: list[int]) -> list[State]:
        self.states, self.t = [self.parent.new_instance(t, lv, self.rng) for t, lv in zip(tasks, levels)], 0
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


def consistency_reward(states: list[State], actions: list[int]) -> np.ndarray:
    """+1 for keeping an approved answer or changing a rejected one, -1 otherwise, 0 at an episode's start."""
    last = np.array([s.last_correct for s in states])
    keep = np.array([a == s.last_action for s, a in zip(states, actions)])
    return np.where(last == FLAG_PAD, 0.0, np.where(keep == (last == 1), 1.0, -1.0)).astype(np.float32)


# Model ----------------------------------------------------------------------------------------------------------------
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

    def get_action_and_value(self, x, action=None, greedy=False):
        h = self.embed(x)
        dist = torch.distributions.Categorical(logits=self.action_head(h))
        if action is None:
            action = dist.probs.argmax(-1) if greedy else dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value_head(h).squeeze(-1), h, dist.logits

    def world_model_target(self, next_x: torch.Tensor) -> torch.Tensor:
        return next_x.float()


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# Rewards, losses, curriculum ------------------------------------------------------------------------------------------
@dataclass
class RewardVector:
    """The plan's reward components, kept apart so each is logged under reward/...; `total` weighs them."""

    goal: np.ndarray
    pred: np.ndarray
    cons: np.ndarray

    def total(self, w_goal: float, w_pred: float, w_cons: float) -> np.ndarray:
        return w_goal * self.goal + w_pred * self.pred + w_cons * self.cons


def prediction_reward(pred: torch.Tensor, target: torch.Tensor) -> np.ndarray:
    """exp(-MSE) per sample: 1 for a perfect world-model prediction, towards 0 for a poor one."""
    return torch.exp(-((pred - target) ** 2).mean(-1)).cpu().numpy()


def reinforce_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return-to-go over (T, N) rewards (GAE with no values and lambda 1): nothing bootstraps."""
    return gae(rewards, torch.zeros(rewards.shape[0] + 1, *rewards.shape[1:]), gamma, 1.0)


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """GAE over (T, N) with values[T] = 0: the horizon is fixed and observed, so nothing is earned after it."""
    adv, last = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = rewards[t] + gamma * values[t + 1] - values[t] + gamma * lam * last
        adv[t] = last
    return adv


def scale_advantages(adv: torch.Tensor, algorithm: str) -> torch.Tensor:
    """PPO: centre and divide by the std. REINFORCE: the baseline centres; a std of 0 would scale them by 1e8."""
    if algorithm == "ppo":
        return (adv - adv.mean()) / (adv.std() + 1e-8)
    std = adv.std()
    return adv / (std + 1e-8) if std > 1e-6 else adv


def kl_to_parent(logits: torch.Tensor, oracle: torch.Tensor, smoothing: float) -> torch.Tensor:
    """KL(p_parent || pi) with p_parent the oracle action smoothed by `smoothing` mass over all actions."""
    n = logits.shape[-1]
    p = torch.full_like(logits, smoothing / n)
    p.scatter_(-1, oracle.unsqueeze(-1), 1.0 - smoothing + smoothing / n)
    # xlogy: 0 * log 0 = 0 where smoothing is 0
    return (torch.special.xlogy(p, p) - p * F.log_softmax(logits, -1)).sum(-1).mean()


class CurriculumManager:
    """Per task, the level goes up once the success rate over the last `window` episodes at it reaches `threshold`."""

    def __init__(
        self, tasks: list[str], enabled: bool, fixed_level: int, threshold: float, window: int, review_prob: float = 0.0
    ):
        self.tasks, self.enabled, self.threshold, self.window = tasks, enabled, threshold, window
        self.review_prob = review_prob
        self.levels = {t: (0 if enabled else fixed_level) for t in tasks}
        self.history = {t: collections.deque(maxlen=window) for t in tasks}

    def sample_level(self, task: str, rng: np.random.Generator) -> int:
        """The current level, or with probability review_prob a uniformly drawn mastered (lower) level."""
        current = self.levels[task]
        if self.enabled and current > 0 and rng.random() < self.review_prob:
            return int(rng.integers(0, current))
        return current

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


# Evaluation and representation analysis -------------------------------------------------------------------------------
class Evaluator:
    """Success rate, world-model MSE and policy entropy per (task, level); the rule judges, never an LLM."""

    def __init__(self, tasks: list[str], num_actions: int, max_episode_steps: int, episodes: int, seed: int):
        self.tasks, self.num_actions, self.T = tasks, num_actions, max_episode_steps
        self.episodes, self.seed = episodes, seed

    @torch.no_grad()
    def run(self, agent: Agent | None, eval_levels: dict, greedy: bool = True, transcript: list | None = None):
        """agent=None evaluates the uniform random policy."""
        parent, n, gen = DeterministicParent(self.num_actions), self.episodes, torch.Generator().manual_seed(self.seed)
        per_diff, mse_all, ent_all = {}, [], []
        for task, level in playable(self.tasks, self.num_actions):
            env = BabyEnv(parent, n, self.T, self.seed + 1000 * self.tasks.index(task) + level)
            states, success = env.reset([task] * n, [level] * n), np.zeros(n, dtype=bool)
            for _ in range(self.T):
                if agent is None:
                    action = torch.randint(0, self.num_actions, (n,), generator=gen)
                    ent = torch.full((n,), math.log(self.num_actions))
                else:
                    action, _, ent, _, h, logits = agent.get_action_and_value(states_to_tensor(states), greedy=True)
                    if not greedy:  # sampled from the evaluator's own generator: the same seed, the same episodes
                        action = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
                if transcript is not None and len(transcript) < 20:
                    transcript.append(
                        f"{states[0].to_prompt()}\n-> action {action[0].item()} (oracle {parent.oracle_action(states[0])})\n"
                    )
                states, _, _, _, info = env.step(action.tolist())
                success |= info["success"]
                ent_all.append(ent.mean().item())
                if agent is not None and level == eval_levels[task]:
                    target = agent.world_model_target(states_to_tensor(states))
                    mse_all.append(F.mse_loss(agent.world_model(h, action), target).item())
            per_diff[f"{task}/level{level}"] = float(success.mean())
        final = [per_diff[f"{t}/level{eval_levels[t]}"] for t in self.tasks]
        return {
            "success_rate": float(np.mean(final)),
            "world_model_mse": float(np.mean(mse_all)) if mse_all else None,  # the random policy has none
            "policy_entropy": float(np.mean(ent_all)),
            "per_difficulty_success": per_diff,
        }


@torch.no_grad()
def representation_analysis(
    agent: Agent, tasks: list[str], levels: dict, num_actions: int, T: int, samples: int, seed: int, png_path: str
) -> dict:
    """Linear-probe accuracy of each attribute from h, and a t-SNE PNG coloured by the oracle action."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.linear_model import LogisticRegression
    from sklearn.manifold import TSNE
    from sklearn.model_selection import train_test_split

    parent, rng, states = DeterministicParent(num_actions), np.random.default_rng(seed), []
    for i in range(samples):
        task = tasks[i % len(tasks)]
        s = parent.new_instance(task, levels[task], rng)
        for _ in range(int(rng.integers(0, T))):  # later steps too, so last_action/last_correct/step vary
            a = int(rng.integers(num_actions))
            s = parent.transition(s, a, parent.judge(s, a))
        states.append(s)
    x = states_to_tensor(states)
    h, probes = agent.embed(x).numpy(), {}
    for i, name in enumerate(ATTRIBUTES):
        y = x[:, i].numpy()
        counts = np.unique(y, return_counts=True)[1]
        if len(counts) < 2:
            continue
        h_train, h_test, y_train, y_test = train_test_split(
            h, y, test_size=0.3, random_state=seed, stratify=y if counts.min() >= 2 else None
        )
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


def build_agent(cfg: dict) -> Agent:
    return Agent(cfg["num_actions"], cfg["max_episode_steps"], cfg["hidden_dim"], cfg["num_layers"], cfg["num_heads"])


def evaluate(model_path: str, episodes: int | None = None, seed: int | None = None, greedy: bool = True) -> dict:
    """Evaluates a saved model; by default on the run's own episodes, so it reproduces the run's eval.json."""
    ckpt = torch.load(model_path, map_location="cpu", weights_only=False)
    cfg = ckpt["args"]
    agent = build_agent(cfg)
    agent.load_state_dict(ckpt["state_dict"])
    evaluator = Evaluator(
        task_list(cfg["task"]),
        cfg["num_actions"],
        cfg["max_episode_steps"],
        cfg["eval_episodes"] if episodes is None else episodes,
        cfg["seed"] + EVAL_SEED_OFFSET if seed is None else seed,
    )
    return evaluator.run(agent.eval(), ckpt["eval_levels"], greedy)


def atomic_write(path: str, write):
    """write(tmp) then rename: a run killed while saving never leaves a half-written file behind."""
    tmp = f"{path}.tmp.{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# Training -------------------------------------------------------------------------------------------------------------
@dataclass
class Rollout:
    """N whole episodes of T steps: obs[t] is the state acted in at step t, obs[t + 1] the state it led to."""

    obs: torch.Tensor  # (T + 1, N, STATE_DIM)
    actions: torch.Tensor  # (T, N)
    logprobs: torch.Tensor  # (T, N)
    values: torch.Tensor  # (T + 1, N); values[T] stays 0: nothing is earned after the time limit
    oracle: torch.Tensor  # (T, N) the rule's answers (the KL-distill target)
    rewards: RewardVector  # (T, N) each
    success: np.ndarray  # (N,) the rule's verdict on each episode's final answer
    tasks: list[str]
    levels: list[int]


@torch.no_grad()
def collect_rollout(agent: Agent, env: BabyEnv, curriculum: CurriculumManager, args: Args, device) -> Rollout:
    T, N, tasks = args.max_episode_steps, args.num_envs, curriculum.tasks
    ep_tasks = [tasks[int(i)] for i in env.rng.integers(0, len(tasks), N)]
    ep_levels = [curriculum.sample_level(t, env.rng) for t in ep_tasks]
    states, success = env.reset(ep_tasks, ep_levels), np.zeros(N, dtype=bool)
    obs = torch.zeros(T + 1, N, STATE_DIM, dtype=torch.long)
    actions, oracle = torch.zeros(T, N, dtype=torch.long), torch.zeros(T, N, dtype=torch.long)
    logprobs, values = torch.zeros(T, N), torch.zeros(T + 1, N)
    goal, pred, cons = (np.zeros((T, N), np.float32) for _ in range(3))
    for t in range(T):
        obs[t] = states_to_tensor(states)
        oracle[t] = torch.tensor([env.parent.oracle_action(s) for s in states])
        action, logprob, _, value, h, _ = agent.get_action_and_value(obs[t].to(device))
        actions[t], logprobs[t], values[t] = action.cpu(), logprob.cpu(), value.cpu()
        # consistency is judged on the state the action was taken in: its last answer and that answer's verdict
        cons[t] = consistency_reward(states, action.tolist())
        states, goal[t], _, _, info = env.step(action.tolist())
        obs[t + 1] = states_to_tensor(states)
        success |= info["success"]
        if args.pred_reward_weight != 0:
            pred[t] = prediction_reward(agent.world_model(h, action), agent.world_model_target(obs[t + 1].to(device)))
    return Rollout(obs, actions, logprobs, values, oracle, RewardVector(goal, pred, cons), success, ep_tasks, ep_levels)


def advantages_and_returns(rewards: torch.Tensor, values: torch.Tensor, baseline: torch.Tensor, args: Args):
    """(advantages, returns, new baseline): REINFORCE against the earlier batches' baseline, or PPO's GAE."""
    if args.algorithm == "reinforce":
        returns = reinforce_returns(rewards, args.gamma)
        advantages = returns - baseline.unsqueeze(1)
        return advantages, returns, args.baseline_decay * baseline + (1 - args.baseline_decay) * returns.mean(1)
    advantages = gae(rewards, values, args.gamma, args.gae_lambda)
    return advantages, advantages + values[:-1], baseline


def update(agent: Agent, optimizer, ro: Rollout, advantages: torch.Tensor, returns: torch.Tensor, args: Args, device) -> dict:
    """REINFORCE: one gradient step on the whole batch. PPO: epochs x minibatches of the clipped surrogate."""
    b_obs, b_next, b_actions, b_logprobs, b_adv, b_returns, b_oracle, b_values = (
        x.flatten(0, 1).to(device)
        for x in (ro.obs[:-1], ro.obs[1:], ro.actions, ro.logprobs, advantages, returns, ro.oracle, ro.values[:-1])
    )
    epochs, n_mb = (1, 1) if args.algorithm == "reinforce" else (args.update_epochs, args.num_minibatches)
    mb_size, clipfracs, stats = args.batch_size // n_mb, [], {}
    for _ in range(epochs):
        perm = torch.randperm(args.batch_size)
        for start in range(0, args.batch_size, mb_size):
            mb = perm[start : start + mb_size]
            _, newlogprob, entropy, newvalue, h, logits = agent.get_action_and_value(b_obs[mb], b_actions[mb])
            adv = b_adv[mb]
            if args.norm_adv and len(mb) > 1:
                adv = scale_advantages(adv, args.algorithm)
            if args.algorithm == "reinforce":
                pg_loss = -(adv * newlogprob).mean()
                v_loss, approx_kl = torch.zeros(()), torch.zeros(())
            else:
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v_loss = 0.5 * ((newvalue - b_returns[mb]) ** 2).mean()
            # the world model is trained through the shared core: its loss shapes the representation h
            wm_loss = F.mse_loss(agent.world_model(h, b_actions[mb]), agent.world_model_target(b_next[mb]))
            kl = kl_to_parent(logits, b_oracle[mb], args.kl_smoothing) if args.kl_coef > 0 else torch.zeros(())
            loss = (
                pg_loss
                - args.ent_coef * entropy.mean()
                + args.vf_coef * v_loss
                + args.world_model_coef * wm_loss
                + args.kl_coef * kl
            )
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            stats = {
                "losses/policy_loss": pg_loss.item(),
                "losses/value_loss": v_loss.item(),
                "losses/entropy": entropy.mean().item(),
                "losses/approx_kl": approx_kl.item(),
                "losses/world_model_mse": wm_loss.item(),
                "losses/kl_to_parent": kl.item(),
            }
    if args.algorithm == "ppo":
        var_y = b_returns.var()
        stats["losses/clipfrac"] = float(np.mean(clipfracs))
        stats["losses/explained_variance"] = (1 - (b_returns - b_values).var() / var_y).item() if var_y > 0 else 0.0
    return stats


def train(args: Args, writer, parent: DeterministicParent | None = None, label: str = "") -> tuple[Agent, dict]:
    """Trains one agent; returns it with the evaluation levels per task (the curriculum's final levels)."""
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    tasks = task_list(args.task)
    agent = build_agent(vars(args)).to(device)
    if not label:
        print(f"model parameters: {num_parameters(agent):,} (< 1M: {num_parameters(agent) < 1_000_000})")
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    curriculum = CurriculumManager(
        tasks, args.curriculum, args.level, args.mastery_threshold, args.mastery_window, args.review_prob
    )
    parent = parent or (LLMParent(args) if args.parent == "llm" else DeterministicParent(args.num_actions))
    env = BabyEnv(parent, args.num_envs, args.max_episode_steps, args.seed)
    baseline, start_time = torch.zeros(args.max_episode_steps), time.time()
    recent_success = collections.deque(maxlen=100)  # charts/success_rate: the last 100 episodes
    recent_level = collections.defaultdict(lambda: collections.deque(maxlen=100))
    for iteration in range(1, args.num_iterations + 1):
        global_step = iteration * args.batch_size
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # ROLLOUT: N whole episodes of exactly T steps (the time limit is the only episode end)
        ro = collect_rollout(agent, env, curriculum, args, device)
        rewards = torch.as_tensor(ro.rewards.total(args.goal_reward_weight, args.pred_reward_weight, args.cons_reward_weight))
        for task, level, success in zip(ro.tasks, ro.levels, ro.success):
            recent_success.append(float(success))
            recent_level[(task, level)].append(float(success))
            if curriculum.record(task, level, bool(success)):
                print(f"{label}curriculum: {task} -> level {curriculum.levels[task]} at global_step={global_step}")

        # ADVANTAGES and UPDATE
        advantages, returns, baseline = advantages_and_returns(rewards, ro.values, baseline, args)
        stats = update(agent, optimizer, ro, advantages, returns, args, device)

        # LOGGING
        sps = int(global_step / max(time.time() - start_time, 1e-9))
        scalars = {
            "charts/success_rate": float(np.mean(recent_success)),
            **{f"charts/success_rate_{t}_level{lv}": float(np.mean(d)) for (t, lv), d in recent_level.items()},
            "charts/episodic_return": rewards.sum(0).mean().item(),
            "charts/episodic_length": float(args.max_episode_steps),
            "charts/SPS": sps,
            "charts/learning_rate": optimizer.param_groups[0]["lr"],
            **stats,
            **{f"reward/{k}": float(getattr(ro.rewards, k).sum(0).mean()) for k in ("goal", "pred", "cons")},
            "reward/total": rewards.sum(0).mean().item(),
            **{f"curriculum/level_{t}": curriculum.levels[t] for t in tasks},
        }
        if isinstance(parent, LLMParent):
            scalars.update({f"parent/{k}": v for k, v in parent.summary().items() if k != "per_level"})
        for k, v in scalars.items():
            writer.add_scalar(k, v, global_step)
        if iteration % 25 == 0 or iteration == args.num_iterations:
            lv = " ".join(f"{t}:L{curriculum.levels[t]}" for t in tasks)
            print(
                f"{label}global_step={global_step} SPS={sps} success={scalars['charts/success_rate']:.3f} "
                f"entropy={stats['losses/entropy']:.3f} wm_mse={stats['losses/world_model_mse']:.3f} [{lv}]"
            )
    return agent, dict(curriculum.levels)


# Arguments and run directory ------------------------------------------------------------------------------------------
def fail(message: str):
    print(f"{SCRIPT}.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def validate_args(args: Args) -> str | None:
    """The first problem with the arguments that would crash late or run wrong in silence, as one line; or None."""

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    def must(name: str, ok: bool, need: str) -> tuple[bool, str]:
        return not ok, f"{flag(name)} {getattr(args, name)} must be {need}"

    batch, llm = args.num_envs * args.max_episode_steps, args.parent == "llm"
    top = NUM_LEVELS - 1 if args.curriculum else args.level
    need = max(DIFFICULTY_CONFIGS[t][lv]["num_symbols"] for t in task_list(args.task) for lv in range(top + 1))
    # NaN and inf pass every range check
    checks = [
        must(f.name, math.isfinite(getattr(args, f.name)), "a finite number")
        for f in dataclasses.fields(Args)
        if f.type is float
    ]
    checks += [
        (not 0 <= args.seed < 2**32, f"--seed {args.seed} must be in [0, 2**32 - 1] (the range numpy accepts)"),
        (
            not args.exp_name.strip() or "/" in args.exp_name,
            f"--exp-name {args.exp_name!r} must be a non-empty name without '/'",
        ),
    ]
    checks += [
        (getattr(args, n) < 1, f"{flag(n)} must be >= 1")
        for n in (
            "num_heads",
            "num_minibatches",
            "update_epochs",
            "llm_concurrency",
            "max_episode_steps",
            "num_envs",
            "hidden_dim",
            "num_layers",
            "eval_episodes",
            "mastery_window",
        )
    ]
    checks += [
        must(n, getattr(args, n) > 0, "positive") for n in ("learning_rate", "llm_timeout", "clip_coef", "max_grad_norm")
    ]
    checks += [must(n, getattr(args, n) >= 0, ">= 0") for n in ("llm_retries", "llm_examples", "llm_check_pairs")]
    checks += [must(n, 0 <= getattr(args, n) <= 1, "in [0, 1]") for n in ("gae_lambda", "review_prob", "kl_smoothing")]
    checks += [
        must("gamma", 0 < args.gamma <= 1, "in (0, 1]"),
        must("baseline_decay", 0 <= args.baseline_decay < 1, "in [0, 1)"),
        must("mastery_threshold", 0 < args.mastery_threshold <= 1, "in (0, 1]"),
        (
            args.total_timesteps < batch,
            f"--total-timesteps {args.total_timesteps} is less than one update (--num-envs x --max-episode-steps = {batch})",
        ),
        (args.analysis and args.analysis_samples < 2, "--analysis-samples must be >= 2 (or --no-analysis)"),
        (
            args.num_actions < need,
            f"--num-actions {args.num_actions} is smaller than the {need} symbols task "
            f"{args.task!r} needs up to level {top}; use --num-actions >= {need}",
        ),
        (
            args.hidden_dim % max(args.num_heads, 1) != 0,
            f"--hidden-dim {args.hidden_dim} must be divisible by --num-heads {args.num_heads}",
        ),
        (
            args.algorithm == "ppo" and batch % max(args.num_minibatches, 1) != 0,
            "--num-envs * --max-episode-steps must be divisible by --num-minibatches",
        ),
        (
            llm and importlib.util.find_spec("openai") is None,
            "--parent llm needs the openai client: pip install -r requirements-llm.txt",
        ),
        (
            llm and not args.llm_base_url,
            "--parent llm needs --llm-base-url (an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1)",
        ),
        (
            llm and not str(args.llm_base_url).startswith(("http://", "https://")),
            f"--llm-base-url {args.llm_base_url!r} must be an http:// or https:// URL (http://127.0.0.1:8000/v1)",
        ),
    ]
    if error := next((message for bad, message in checks if bad), None):
        return error
    n_params = num_parameters(build_agent(vars(args)))
    if n_params < 1_000_000:
        return None
    # the state embedding has one row per value of every attribute, the step counter included
    embeddings = sum(attribute_vocab(args.num_actions, args.max_episode_steps)) * args.hidden_dim
    fix = (
        "reduce --hidden-dim or --num-layers (e.g. --hidden-dim 128 --num-layers 4)"
        if embeddings < n_params / 2
        else f"reduce --max-episode-steps or --num-actions ({embeddings:,} of them are in the state embedding)"
    )
    return f"the model would have {n_params:,} parameters; the baby model must stay under 1M: {fix}"


def claim_run_dir(runs_dir: str, run_name: str) -> tuple[str, str]:
    """(run_name, run_dir) of a new directory: runs started in the same second get __2, __3, ... (mkdir is atomic)."""
    try:
        os.makedirs(runs_dir, exist_ok=True)
        for suffix in itertools.count(1):
            name = run_name if suffix == 1 else f"{run_name}__{suffix}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.join(runs_dir, name))
                return name, os.path.join(runs_dir, name)
    except OSError as e:  # --runs-dir itself is unusable: a file, not writable, ...
        reason = "not a directory" if os.path.exists(runs_dir) and not os.path.isdir(runs_dir) else e.strerror
        fail(f"cannot create a run directory in --runs-dir {runs_dir!r} ({reason}); pass a writable directory")


# Evaluation against the baselines, results ----------------------------------------------------------------------------
def evaluate_with_baselines(
    args: Args, agent: Agent, eval_levels: dict, run_dir: str, transcript: list | None
) -> tuple[dict, dict]:
    """The agent's evaluation and each --baselines row, on the same episodes (the rule judges, never an LLM)."""
    evaluator = Evaluator(
        task_list(args.task), args.num_actions, args.max_episode_steps, args.eval_episodes, args.seed + EVAL_SEED_OFFSET
    )
    result, baselines = evaluator.run(agent, eval_levels, transcript=transcript), {}
    for name in args.baselines:
        if name == "random":
            baselines[name] = evaluator.run(None, eval_levels)
            continue
        variant = (
            dataclasses.replace(args, world_model_coef=0.0, pred_reward_weight=0.0, kl_coef=0.0)
            if name == "rl-only"
            else dataclasses.replace(args, kl_coef=args.kl_distill_coef)
        )
        print(f"training baseline {name} with the same budget")
        seed_everything(args.seed)  # as its own run with these flags would be, whatever the agent's run consumed
        with contextlib.closing(SummaryWriter(os.path.join(run_dir, f"baseline_{name}"))) as sub:
            b_agent, b_levels = train(variant, sub, label=f"[{name}] ")
        baselines[name] = evaluator.run(b_agent.eval(), b_levels)
    print(f"\n{'policy':<12} {'success':>8} {'wm_mse':>8} {'entropy':>8}  per-difficulty success")
    for name, r in {"agent": result, **baselines}.items():
        diff = " ".join(f"{k}={v:.2f}" for k, v in r["per_difficulty_success"].items())
        mse = "-" if r["world_model_mse"] is None else f"{r['world_model_mse']:.3f}"
        print(f"{name:<12} {r['success_rate']:>8.3f} {mse:>8} {r['policy_entropy']:>8.3f}  {diff}")
    # eval.json's rows: flat, and without a world-model MSE where there is none (random)
    return result, {
        name: {
            "success_rate": r["success_rate"],
            "policy_entropy": r["policy_entropy"],
            **({} if r["world_model_mse"] is None else {"world_model_mse": r["world_model_mse"]}),
            **{f"success_{k}": v for k, v in r["per_difficulty_success"].items()},
        }
        for name, r in baselines.items()
    }


if __name__ == "__main__":
    args = tyro.cli(Args)
    if error := validate_args(args):
        fail(error)
    args.batch_size = args.num_envs * args.max_episode_steps
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)
    parent, check, tasks = None, None, task_list(args.task)
    if args.parent == "llm":  # an unusable cache or endpoint is found before any work
        try:
            parent = LLMParent(args)
        except (sqlite3.Error, OSError) as e:
            cache = args.llm_cache or os.path.join(args.runs_dir, "llm_cache.sqlite")
            fail(f"--llm-cache {cache!r} cannot be used as an sqlite file ({e}); give a writable file path")
        if error := parent.probe():
            fail(error)
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
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    seed_everything(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    t0 = time.time()
    if parent is not None and args.llm_check_pairs:
        check = parent.check_agreement(tasks, args.llm_check_pairs, args.seed)
        print(
            f"LLM agreement with the rule before training ({args.llm_check_pairs} pairs per task and level): "
            + " ".join(f"{w}={v['agreement']:.2f}" for w, v in check["per_level"].items())
        )
    agent, eval_levels = train(args, writer, parent)
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
        atomic_write(model_path, lambda tmp: torch.save(saved, tmp))
        print(f"model saved to {model_path}")

    # EVALUATION: the trained agent and the baselines in one table
    transcript = [] if args.capture_video else None
    result, baselines = evaluate_with_baselines(args, agent, eval_levels, run_dir, transcript)
    out = {
        "script": SCRIPT,
        "task": args.task,
        **result,
        "baselines": baselines,
        "train_time_s": train_time,
        "eval_levels": eval_levels,
        "num_parameters": num_parameters(agent),
    }
    if parent is not None:
        out.update(parent=parent.summary(), **({"llm_agreement_check": check} if check is not None else {}))
    if args.analysis:
        png = os.path.join(run_dir, "tsne.png")
        out["probe_accuracy"] = representation_analysis(
            agent, tasks, eval_levels, args.num_actions, args.max_episode_steps, args.analysis_samples, args.seed, png
        )
        print("linear-probe accuracy: " + " ".join(f"{k}={v:.2f}" for k, v in out["probe_accuracy"].items()))
        print(f"t-SNE written to {png}")
    if transcript is not None:
        pathlib.Path(run_dir, "videos").mkdir(exist_ok=True)
        pathlib.Path(run_dir, "videos", "eval_transcript.txt").write_text("\n".join(transcript))
    for k in ("success_rate", "world_model_mse", "policy_entropy"):
        writer.add_scalar(f"eval/{k}", result[k], args.total_timesteps)
    text = json.dumps(out, indent=2)
    atomic_write(os.path.join(run_dir, "eval.json"), lambda tmp: pathlib.Path(tmp).write_text(text))
    print(f"eval.json written to {run_dir}")
    writer.close()
