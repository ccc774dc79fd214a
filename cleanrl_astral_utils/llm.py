"""The LLM parent of reinforce_baby (`--parent llm`): an OpenAI-compatible client with validation, retries, an sqlite
cache and the rule as fallback, and the statistics it reports (queries, fallbacks, agreement with the rule, latency).

Two roles (`--llm-role`):
- answer: the LLM states the right action for a state, through the completions endpoint, from a plain few-shot
  prompt; the goal reward is 1 where the child's action equals that answer. One request per distinct state. By default
  (`--llm-answer-format grammar`) the request carries a GBNF grammar (llama.cpp's `grammar` field) that admits only
  the actions' numbers; an endpoint that ignores it is read as free text, the first integer.
- judge: the LLM judges each (state, action) with a JSON verdict {"reward": 0 | 1}, through the chat-completions
  endpoint. One request per distinct (state, action).

The script's rule parent (`DeterministicParent`) sets the task instances and the transitions and gives the reward
whenever the LLM's answer is missing or invalid. `ParentPrompt` writes the prompt word for word (rule, worked examples,
asked state) from what the script passes in; `LLMParent` sends it, checks the reply, caches and counts."""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import sqlite3
import time
from typing import NamedTuple

import numpy as np
import openai

# request fields the openai client has no parameter for, sent as they are (llama.cpp's server reads them)
EXTRA_FIELDS = ("grammar",)


# THE PROMPTS: the LLM parent's requests word for word. The script's State, rule and level definitions, which they read,
# are passed in (PromptSymbols).
LLM_SYSTEM_PROMPT = (
    'You check a child\'s answer against a rule. Reply with JSON only: {"reward": 1} if the answer '
    'follows the rule, {"reward": 0} if it does not.'
)
LLM_ANSWER_EXAMPLES = 8  # --llm-examples default of the answer role (the judge's is 0)
LLM_EXAMPLES_SEED = 12345  # the worked examples are the same fixed instances in every prompt
# --task-source parent: each request shows 8 rule-drawn instances of the level, one per line, and the start of the next
# line; the model completes that one line (SmolLM2-135M wanders off after one or two lines of its own), sampled at
# temperature 1 with a seed of its own (the run's seed, task, level, request): requests differ, a rerun is cached
LLM_TASK_EXAMPLES = 8
LLM_TASK_TEMPERATURE = 1.0
LLM_TASK_LINE_START = {"pattern-echo": "cue =", "sequence-next": "sequence =", "conditional": "f0 ="}


def level_text(task: str, cfg: dict) -> str:
    """A level's definition (`cfg`, its entry in the script's DIFFICULTY_CONFIGS) in plain words (the task-generation
    prompt)."""
    top = cfg["num_symbols"] - 1
    if task == "pattern-echo":
        return f"the cue is a number from 0 to {cfg['target_range'] - 1}"
    if task == "sequence-next":
        lengths = " or ".join(str(k) for k in cfg["lengths"])
        steps = ", ".join(str(d) for d in cfg["steps"])
        return f"{lengths} numbers with a step of {steps}; every number and the next one are from 0 to {top}"
    used = {"if": 2, "elif": 3, "nested": 3}[cfg["form"]]
    flags = ", ".join(f"f{i}" for i in range(cfg["conditions"]))
    values = ", ".join(f"v{i}" for i in range(used))
    return f"the flags {flags} are 0 or 1, the values {values} are numbers from 0 to {top}"


class PromptSymbols(NamedTuple):
    """What the prompts read of the script: its State class, task names, difficulty configs, absent-flag value and
    attribute names."""

    state_type: type
    tasks: list[str]
    configs: dict
    flag_pad: int
    attributes: list[str]


def state_from_list(state_type: type, v: list[int], num_actions: int):
    """The script's State (`state_type`) whose as_list() is v."""
    return state_type(
        int(v[0]),
        int(v[1]),
        tuple(int(x) for x in v[2:5]),
        tuple(int(x) for x in v[5:8]),
        int(v[8]),
        int(v[9]),
        int(v[10]),
        num_actions,
    )


def in_level(s, symbols: PromptSymbols, num_actions: int) -> bool:
    """Whether the rule parent's new_instance can draw s at its task and level (how a proposed instance is checked)."""
    cfg = symbols.configs[s.task_name][s.level]
    pad = num_actions
    flag_pad = symbols.flag_pad
    n = cfg["num_symbols"]
    if (s.last_action, s.last_correct, s.step) != (pad, flag_pad, 0):
        return False
    if s.task_name == "pattern-echo":
        return 0 <= s.values[0] < cfg["target_range"] and s.values[1:] == (pad, pad) and s.flags == (flag_pad,) * 3
    if s.task_name == "sequence-next":
        items = [v for v in s.values if v != pad]
        if s.flags != (flag_pad,) * 3 or list(s.values[: len(items)]) != items or len(items) not in cfg["lengths"]:
            return False
        d = items[1] - items[0]
        answer = items[-1] + d
        steps_ok = all(b - a == d for a, b in zip(items, items[1:]))
        return d in cfg["steps"] and steps_ok and all(0 <= v < n for v in [*items, answer])
    used = {"if": 2, "elif": 3, "nested": 3}[cfg["form"]]
    c = cfg["conditions"]
    values_ok = all(0 <= v < n for v in s.values[:used]) and all(v == pad for v in s.values[used:])
    flags_ok = all(f in (0, 1) for f in s.flags[:c]) and all(f == flag_pad for f in s.flags[c:])
    return values_ok and flags_ok


class ParentPrompt:
    """The LLM parent's prompt. answer role (a completion): the rule, worked examples answered by the rule, the asked
    state, each as `<attributes>` then `answer = <n>`. judge role (chat messages): a system message, worked examples of
    the same task and level answered right and wrong in turn with their verdicts, then the asked (state, answer)."""

    def __init__(self, rule, levels: list[tuple[str, int]], examples: int, next_state: bool, symbols: "PromptSymbols"):
        self.rule = rule
        self.levels = levels  # the (task, level) pairs that fit in the action space: where worked examples come from
        self.examples = examples
        self.next_state = next_state
        self.symbols = symbols

    def worked_examples(self, s) -> list:
        """`examples` instances drawn with a fixed seed from s's level, never s's instance. A level whose examples would
        all be one instance (pattern-echo's level 0: two cues) takes them from the next level with the same rule: a
        prompt that repeats one answer eight times is copied, whatever the asked state."""
        same_rule = [lv for t, lv in self.levels if t == s.task_name and lv >= s.level]
        same_rule = [lv for lv in same_rule if dataclasses.replace(s, level=lv).rule_text() == s.rule_text()]
        examples = []
        for level in same_rule:
            rng = np.random.default_rng(LLM_EXAMPLES_SEED)
            examples = []
            for _ in range(100 * self.examples):  # a level with a single instance has none to give
                if len(examples) == self.examples:
                    break
                e = self.rule.new_instance(s.task_name, level, rng)
                if e.shown_attributes() != s.shown_attributes():
                    examples.append(e)
            if len({e.shown_attributes() for e in examples}) > 1 or self.examples < 2:
                return examples
        return examples

    def answer_prompt(self, s) -> str:
        blocks = [f"Rule: {s.rule_text()}"]
        for e in self.worked_examples(s):
            blocks.append(f"{e.shown_attributes()}\nanswer = {self.rule.oracle_action(e)}")
        blocks.append(f"{s.shown_attributes()}\nanswer =")
        return "\n\n".join(blocks)

    def attribute_values(self, s) -> dict:
        """A state's attributes by name (the judge's view of a next state)."""
        return dict(zip(self.symbols.attributes, s.as_list()))

    def user_message(self, s, action: int) -> str:
        """The rule and the attributes it reads, then the answer (the judge role's question)."""
        message = f"Rule: {s.rule_text()}\n{s.shown_attributes()}\nanswer = {int(action)}"
        if self.next_state:
            message += (
                f"\nstate = {json.dumps(self.attribute_values(s))}\nAlso give next_state: this state with step + 1, "
                "last_action = the answer and last_correct = your reward."
            )
        return message

    def task_request(self, task: str, level: int, seed: int) -> dict:
        """The task-generation request but the model: the rule, the level's definition, instances drawn by the rule, one
        per line, and the start of one more line, which the model completes (a line is at most ~30 tokens)."""
        rng = np.random.default_rng(LLM_EXAMPLES_SEED)
        examples = [self.rule.new_instance(task, level, rng) for _ in range(LLM_TASK_EXAMPLES)]
        definition = level_text(task, self.symbols.configs[task][level])
        lines = [f"Rule: {examples[0].rule_text()}", f"Instances, one per line; {definition}."]
        lines += [e.shown_attributes() for e in examples]
        lines.append(LLM_TASK_LINE_START[task])
        prompt = "\n".join(lines)
        return {"prompt": prompt, "temperature": LLM_TASK_TEMPERATURE, "max_tokens": 40, "seed": seed, "stop": ["\n"]}

    def read_proposal(self, task: str, level: int, text: str) -> object | None:
        """The instance the completed line names, if it is one of the level's; else None."""
        return self.read_instance(task, level, LLM_TASK_LINE_START[task] + text.split("\n")[0])

    def read_instance(self, task: str, level: int, line: str) -> object | None:
        """The instance a line of the reply names, if it is one of the level's (what shown_attributes writes); else None."""
        pad = self.rule.num_actions
        flag_pad = self.symbols.flag_pad
        values = [pad] * 3
        flags = [flag_pad] * 3
        line = line.strip()
        if task == "pattern-echo":
            match = re.fullmatch(r"cue = (\d+)", line)
            if match is None:
                return None
            values[0] = int(match.group(1))
        elif task == "sequence-next":
            match = re.fullmatch(r"sequence = (\d+(?:, \d+){0,2})", line)
            if match is None:
                return None
            items = [int(x) for x in match.group(1).split(", ")]
            values[: len(items)] = items
        else:
            seen = set()
            for part in line.split(", "):
                match = re.fullmatch(r"([fv])([0-2]) = (\d+)", part)
                if match is None or match.group(1, 2) in seen:
                    return None
                seen.add(match.group(1, 2))
                target = flags
                if match.group(1) == "v":
                    target = values
                target[int(match.group(2))] = int(match.group(3))
        s = self.symbols.state_type(self.symbols.tasks.index(task), level, tuple(values), tuple(flags), pad, flag_pad, 0, pad)
        if not in_level(s, self.symbols, pad):
            return None
        return s

    def judge_messages(self, s, action: int) -> list[dict]:
        rng = np.random.default_rng(LLM_EXAMPLES_SEED)
        shots = []
        for i in range(self.examples):
            e = self.rule.new_instance(s.task_name, s.level, rng)
            a = self.rule.oracle_action(e)
            if i % 2 == 1:
                a = (self.rule.oracle_action(e) + 1 + i) % self.rule.num_actions
            r = self.rule.judge(e, a)
            verdict = {"reward": int(r)}
            if self.next_state:
                verdict["next_state"] = self.attribute_values(self.rule.transition(e, a, r))
            shots.append({"role": "user", "content": self.user_message(e, a)})
            shots.append({"role": "assistant", "content": json.dumps(verdict)})
        return [
            {"role": "system", "content": LLM_SYSTEM_PROMPT},
            *shots,
            {"role": "user", "content": self.user_message(s, action)},
        ]


# THE CLIENT
class Reply(NamedTuple):
    text: str | None  # the first valid reply; None when every attempt failed
    latency_ms: float  # of the valid reply's request
    invalid: list  # the replies that came back but were not valid (unparsable, out of range, malformed)


def missing_paths(path: str) -> list[str]:
    """path and each of its missing parent directories, innermost first: what opening a cache at path creates."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    return missing


def open_cache(path: str) -> sqlite3.Connection:
    """The sqlite answer cache at path (created if missing); ValueError (one line) if the file cannot be one."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, answer TEXT NOT NULL)")
    except (sqlite3.Error, OSError) as e:
        raise ValueError(f"--llm-cache {path!r} cannot be used as an sqlite file ({e}); give a writable file path") from e
    return db


class LLMParent:
    """Judges actions with a model behind an OpenAI-compatible endpoint: validated, retried, cached, rule fallback.

    `rule` is the script's DeterministicParent: it draws task instances, makes the transitions and gives the reward of
    every query the LLM does not answer validly. `prompt` is a ParentPrompt (answer_prompt, judge_messages,
    next_state). `tasks` and `attributes` name the task indices and state attributes, `vocab` holds each attribute's
    number of values (what a proposed next state is checked against)."""

    def __init__(self, rule, prompt, args, tasks: list[str], attributes: list[str], vocab: list[int]):
        self.rule = rule
        self.prompt = prompt
        self.args = args
        self.role = args.llm_role
        self.tasks = tasks
        self.attributes = attributes
        self.vocab = vocab
        self.num_actions = args.num_actions
        self.base_url = args.llm_base_url.rstrip("/")
        self.model = args.llm_model
        self.timeout = args.llm_timeout
        self.next_state = args.llm_next_state
        # the retries are ours (an invalid answer is retried as well), so the client's own are off
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=os.environ.get(args.llm_api_key_env) or "unused",
            timeout=args.llm_timeout,
            max_retries=0,
        )
        cache = args.llm_cache or os.path.join(args.runs_dir, "llm_cache.sqlite")
        self.created = missing_paths(cache)  # what discard() removes
        self.db = open_cache(cache)
        # running totals; "<task>/level<k>/..." keys per task and level
        self.stats = collections.Counter()
        self.latencies = []
        self.invalid_samples = []  # the first few distinct invalid replies, for the report
        self.prompts = {}  # the answer role's prompt of each instance shown
        self.pools = {}  # --task-source parent: (task, level) -> the instances episodes draw from
        self.task_stats = {}  # "<task>/level<k>" -> the pool's validity and diversity

    # the task instances: the rule's, or (--task-source parent) drawn from a pool the LLM proposed
    def new_instance(self, task: str, level: int, rng: np.random.Generator):
        if self.args.task_source == "rule":
            return self.rule.new_instance(task, level, rng)
        if (task, level) not in self.pools:
            self.fill_pool(task, level)
        pool = self.pools[(task, level)]
        return pool[int(rng.integers(len(pool)))]

    def fill_pool(self, task: str, level: int):
        """--task-pool-size requests, each proposing one instance with a seed of its own, sent --llm-concurrency at a
        time; a proposal that is not an instance of the level, and a request with no reply, is replaced by an instance
        the rule draws."""
        where = f"{task}/level{level}"
        t = self.tasks.index(task)
        size = self.args.task_pool_size
        bodies = []
        for i in range(size):
            seed = int(np.random.SeedSequence([self.args.seed, t, level, i]).generate_state(1)[0] >> 1)
            bodies.append({"model": self.model, **self.prompt.task_request(task, level, seed)})
        texts = self.proposals(bodies)
        fallback = np.random.default_rng([self.args.seed, t, level])
        pool = []
        valid = []
        invalid = []
        for text in texts:
            s = None
            if text is not None:
                s = self.prompt.read_proposal(task, level, text)
            if s is None and text is not None:
                invalid.append(text)
            if s is None:
                s = self.rule.new_instance(task, level, fallback)
            else:
                valid.append(s)
            pool.append(s)
        targets = np.bincount([self.rule.oracle_action(s) for s in valid], minlength=self.num_actions)
        p = targets[targets > 0] / max(1, len(valid))
        self.task_stats[where] = {
            "asked": size,
            "valid": len(valid),
            "invalid": len(invalid),
            "failed": texts.count(None),
            "valid_share": len(valid) / size,
            "distinct": len(set(valid)),
            "target_entropy_bits": float(-(p * np.log2(p)).sum()) + 0.0,  # + 0.0: no -0.0 for a single target
            "invalid_samples": list(dict.fromkeys(invalid))[:5],
        }
        self.pools[(task, level)] = pool
        st = self.task_stats[where]
        print(
            f"task pool {where}: {st['valid']}/{size} proposals valid ({st['invalid']} invalid, {st['failed']} without a "
            f"reply, replaced by the rule's), {st['distinct']} distinct, target entropy {st['target_entropy_bits']:.2f} bits"
        )

    def proposals(self, bodies: list[dict]) -> list:
        """The reply text of each task-generation request (completions endpoint), from the cache or asked --llm-concurrency
        at a time with retries; None where every attempt failed. The cache is read and written in this thread only."""
        keys = [hashlib.sha256(json.dumps([self.base_url, body, "tasks"]).encode()).hexdigest() for body in bodies]
        texts = self.cached(keys)
        self.stats["task_cache_hits"] += sum(k in texts for k in keys)
        ask = [i for i, k in enumerate(keys) if k not in texts]
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.llm_concurrency) as threads:
            replies = list(threads.map(self.propose, [bodies[i] for i in ask]))
        for i, text in zip(ask, replies):
            self.stats["task_requests"] += 1
            if text is None:
                self.stats["task_requests_failed"] += 1
                continue
            texts[keys[i]] = text
            self.db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?)", (keys[i], text))
        self.db.commit()
        return [texts.get(k) for k in keys]

    def propose(self, body: dict):
        for _ in range(1 + self.args.llm_retries):
            try:
                text = self.send(body, chat=False)
            except (openai.OpenAIError, OSError, ValueError, LookupError, TypeError):  # OSError: timeouts
                continue
            if isinstance(text, str):
                return text
        return None

    # the rule's part: the oracle and the transitions

    def oracle_action(self, s) -> int:
        return self.rule.oracle_action(s)

    def judge(self, s, action: int) -> float:
        return self.rule.judge(s, action)

    def transition(self, s, action: int, reward: float):
        return self.rule.transition(s, action, reward)

    # the answer role: the script's few-shot completion prompt, the first integer of the reply
    def answer_prompt(self, s) -> str:
        key = (s.task, s.level, s.shown_attributes())
        if key not in self.prompts:
            self.prompts[key] = self.prompt.answer_prompt(s)
        return self.prompts[key]

    def answer_grammar(self) -> str:
        """GBNF admitting an optional space, then one action's number: what the prompt's `answer =` asks for."""
        actions = " | ".join(f'"{a}"' for a in range(self.num_actions))
        return f'root ::= " "? ({actions})'

    def answer_body(self, s) -> dict:
        # the answer is one number: a few tokens, and the line ends it
        body = {"model": self.model, "prompt": self.answer_prompt(s), "temperature": 0, "max_tokens": 8, "stop": ["\n"]}
        if self.args.llm_answer_format == "grammar":
            body["grammar"] = self.answer_grammar()
        return body

    def parse_answer(self, text) -> int | None:
        """The first integer of the reply if it is an action, None otherwise."""
        if not isinstance(text, str):
            return None
        match = re.search(r"-?\d+", text)
        if match is None or not 0 <= int(match.group()) < self.num_actions:
            return None
        return int(match.group())

    # the judge role: a JSON verdict on (state, action) through the chat-completions endpoint
    def response_format(self) -> dict | None:
        """A JSON schema of {"reward": 0 | 1} (and the next state, each attribute in range) in the endpoint's form."""
        props = {"reward": {"type": "integer", "enum": [0, 1]}}
        if self.next_state:
            ranges = {a: {"type": "integer", "minimum": 0, "maximum": k - 1} for a, k in zip(self.attributes, self.vocab)}
            props["next_state"] = {"type": "object", "required": self.attributes, "properties": ranges}
        schema = {"type": "object", "properties": props, "required": list(props)}
        if self.args.llm_response_format == "json-object":  # llama.cpp's server
            return {"type": "json_object", "schema": schema}
        if self.args.llm_response_format == "json-schema":
            return {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}
        return None

    def judge_body(self, s, action: int) -> dict:
        # max_tokens bounds a model that does not stop: the answer is about 6 tokens, 90 with the next state
        body = {"model": self.model, "temperature": 0, "max_tokens": 20}
        if self.next_state:
            body["max_tokens"] = 200
        fmt = self.response_format()
        if fmt:
            body["response_format"] = fmt
        body["messages"] = self.prompt.judge_messages(s, action)
        return body

    def judge_verdict(self, text, s, action: int):
        """The parsed (reward, next_state or None) if the answer is strict, well-formed JSON; None otherwise."""
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
        if not isinstance(ns, dict) or set(ns) != set(self.attributes):
            return None
        if not all(isinstance(ns[a], int) and 0 <= ns[a] < k for a, k in zip(self.attributes, self.vocab)):
            return None
        nxt = state_from_list(type(s), [ns[a] for a in self.attributes], self.num_actions)
        # the LLM may set the verdict (last_correct), never a new task instance: that would move the goalposts
        kept = dataclasses.replace(s, last_action=int(action), step=s.step + 1, last_correct=nxt.last_correct)
        if nxt != kept:
            return None
        return float(obj["reward"]), nxt

    # either role: the request, its validation, the cache
    def body(self, s, action: int) -> dict:
        if self.role == "answer":
            return self.answer_body(s)
        return self.judge_body(s, action)

    def verdict(self, text, s, action: int):
        """(reward, the LLM's next state or None) from a valid reply, None from an invalid one."""
        if self.role == "judge":
            return self.judge_verdict(text, s, action)
        answer = self.parse_answer(text)
        if answer is None:
            return None
        return float(action == answer), None

    def cache_key(self, s, action: int) -> str:
        # all that decides an answer (request, endpoint) or its validity (actions, attribute ranges): no wrong reuse;
        # an answer is one per state, a judgement one per (state, action)
        raw = [self.base_url, self.body(s, action), self.num_actions]
        if self.role == "judge":
            raw = [self.base_url, self.body(s, action), s.as_list(), int(action), self.vocab]
        return hashlib.sha256(json.dumps(raw).encode()).hexdigest()

    def request(self, s, action: int):
        """The reply's text: the completion (answer) or the chat message's content (judge)."""
        return self.send(self.body(s, action), chat=self.role == "judge")

    def send(self, body: dict, chat: bool):
        """The text of the reply to body: the chat message's content, or the completion."""
        endpoint = self.client.completions
        if chat:
            endpoint = self.client.chat.completions
        fields = {k: v for k, v in body.items() if k not in EXTRA_FIELDS}
        extra = {k: v for k, v in body.items() if k in EXTRA_FIELDS}
        with endpoint.with_streaming_response.create(**fields, extra_body=extra or None) as reply:
            # the client's timeout bounds each read; this deadline bounds a reply trickled a few bytes at a time
            deadline = time.monotonic() + self.timeout
            chunks = []
            for chunk in reply.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no complete reply within --llm-timeout {self.timeout} s")
        choice = json.loads(b"".join(chunks))["choices"][0]  # as leniently as the client reads
        if chat:
            return choice["message"]["content"]
        return choice["text"]

    def ask(self, s, action: int) -> Reply:
        """The first valid reply within 1 + retries attempts, with its latency, and the invalid replies before it."""
        invalid = []
        for _ in range(1 + self.args.llm_retries):
            t0 = time.perf_counter()
            try:
                text = self.request(s, action)
            except (openai.OpenAIError, OSError, ValueError, LookupError, TypeError):  # OSError: timeouts
                continue
            if self.verdict(text, s, action) is not None:
                return Reply(text, 1000.0 * (time.perf_counter() - t0), invalid)
            invalid.append(text)
        return Reply(None, 0.0, invalid)

    def cached(self, keys: list[str]) -> dict:
        answers = {}
        for k in set(keys):
            row = self.db.execute("SELECT answer FROM answers WHERE key = ?", (k,)).fetchone()
            if row:
                answers[k] = row[0]
        return answers

    def respond(self, states: list, actions: list[int]) -> list[tuple[float, object]]:
        """(reward, next state) of each (state, action): the LLM's where it replied validly, else the rule's."""
        keys = [self.cache_key(s, a) for s, a in zip(states, actions)]
        answers = self.cached(keys)
        self.stats["cache_hits"] += sum(k in answers for k in keys)
        # one request per distinct key: a non-deterministic model gives each state (or pair) one reward per batch
        first = {}
        for i in reversed(range(len(keys))):
            if keys[i] not in answers:
                first[keys[i]] = i  # the key's first index
        # why a key asked now has no valid answer: "unparsed" (replies came, none valid) or "failed" (no reply at all)
        unanswered = {}

        def ask_index(i):
            return self.ask(states[i], actions[i])

        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.llm_concurrency) as pool:
            for i, reply in zip(first.values(), pool.map(ask_index, first.values())):
                self.stats["invalid_answers"] += len(reply.invalid)
                for text in reply.invalid:
                    if len(self.invalid_samples) < 5 and text not in self.invalid_samples:
                        self.invalid_samples.append(text)
                if reply.text is not None:
                    answers[keys[i]] = reply.text
                    self.latencies.append(reply.latency_ms)
                    self.db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?)", (keys[i], reply.text))
                elif reply.invalid:
                    unanswered[keys[i]] = "unparsed"
                else:
                    unanswered[keys[i]] = "failed"
        self.db.commit()
        out = []
        for s, a, k in zip(states, actions, keys):
            rule = self.judge(s, a)
            where = f"{s.task_name}/level{s.level}"
            parsed = None
            if k in answers:
                parsed = self.verdict(answers[k], s, a)
            counts = ["queries", "fallbacks" if parsed is None else "judged"]
            if parsed is not None:
                counts += ["agreements"] * int(parsed[0] == rule) + ["rewarded"] * int(parsed[0] == 1)
            if parsed is not None and self.role == "answer":
                counts += ["right_answers"] * int(self.parse_answer(answers[k]) == self.oracle_action(s))
            self.stats.update(counts + [f"{where}/{c}" for c in counts])
            if parsed is None:  # the totals only: the server's faults apart from replies the parser could not read
                self.stats[f"fallbacks_{unanswered.get(k, 'unparsed')}"] += 1
            reward = rule
            nxt = None
            if parsed is not None:
                reward, nxt = parsed
            if nxt is None:
                nxt = self.transition(s, a, reward)
            out.append((reward, nxt))
        return out

    # what a resumed run continues: the running totals (the answers are in the sqlite cache)
    def state_dict(self) -> dict:
        return {
            "stats": dict(self.stats),
            "latencies": list(self.latencies),
            "invalid_samples": list(self.invalid_samples),
            "pools": {key: [s.as_list() for s in pool] for key, pool in self.pools.items()},
            "task_stats": dict(self.task_stats),
        }

    def load_state_dict(self, state: dict):
        self.stats = collections.Counter(state["stats"])
        self.latencies = list(state["latencies"])
        self.invalid_samples = list(state["invalid_samples"])
        self.pools = {}
        for (task, level), pool in state["pools"].items():
            state_class = type(self.rule.new_instance(task, level, np.random.default_rng(0)))  # the script's State
            self.pools[(task, level)] = [state_from_list(state_class, v, self.num_actions) for v in pool]
        self.task_stats = dict(state["task_stats"])

    # what it reports
    def summary(self) -> dict:
        """Totals, and per task and level: agreement of the LLM's rewards with the rule's, the share rewarded (a judge's
        bias) and, for the answer role, the share of queries whose answer equals the rule's (accuracy)."""
        st = self.stats
        out = {"role": self.role}
        out.update({k: st[k] for k in ("queries", "judged", "fallbacks", "invalid_answers", "cache_hits")})
        out["fallbacks_unparsed"] = st["fallbacks_unparsed"]  # replies came back, none valid
        out["fallbacks_failed"] = st["fallbacks_failed"]  # no reply within the attempts: a server fault
        out["agreement"] = st["agreements"] / max(1, st["judged"])
        if self.role == "answer":  # a query that fell back (an answer out of range, no number, no reply) is not right
            out["accuracy"] = st["right_answers"] / max(1, st["queries"])
        out["latency_ms"] = 0.0
        if self.latencies:
            out["latency_ms"] = float(np.mean(self.latencies))
        out["invalid_samples"] = list(self.invalid_samples)
        if self.args.task_source == "parent":
            out.update({k: st[k] for k in ("task_requests", "task_requests_failed", "task_cache_hits")})
            out["task_generation"] = dict(self.task_stats)
        levels = sorted({k.rsplit("/", 1)[0] for k in st if k.count("/") == 2})
        out["per_level"] = {}
        for w in levels:
            judged = max(1, st[f"{w}/judged"])
            row = {
                "agreement": st[f"{w}/agreements"] / judged,
                "judged": st[f"{w}/judged"],
                "fallbacks": st[f"{w}/fallbacks"],
                "rewarded": st[f"{w}/rewarded"] / judged,
            }
            if self.role == "answer":
                row["accuracy"] = st[f"{w}/right_answers"] / max(1, st[f"{w}/queries"])
            out["per_level"][w] = row
        return out

    def scalars(self) -> dict:
        """What the script logs of the parent at every update: its running totals (parent/...) and the validity and
        diversity of the tasks it drew (tasks/...)."""
        summary = self.summary()
        out = {f"parent/{k}": v for k, v in summary.items() if isinstance(v, int | float)}
        for where, row in summary.get("task_generation", {}).items():
            for k in ("valid_share", "distinct", "target_entropy_bits"):
                out[f"tasks/{where}/{k}"] = row[k]
        return out

    def start(self):
        """probe(): an unusable endpoint raises ValueError (one line) before any work, and the cache this parent opened
        is removed again (discard)."""
        try:
            self.probe()
        except ValueError:
            self.discard()
            raise

    def discard(self):
        """Closes the cache and removes the file and directories opening it created: a run that fails to start leaves
        nothing behind."""
        self.db.close()
        for p in self.created:
            if os.path.isdir(p) and not os.listdir(p):  # a directory something else wrote into stays
                os.rmdir(p)
            elif os.path.lexists(p):
                os.remove(p)

    def probe(self):
        """Raises ValueError (one line) saying what is wrong with the endpoint: one listing and one request of the role,
        asked before any training."""
        where = f"--llm-base-url {self.base_url}"

        def failed(what: str, e: Exception) -> str:  # the client's class (APIConnectionError, ...) and first line
            return f"{where}: {what} failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"

        try:
            served = [m.id for m in self.client.models.list()]
        except Exception as e:  # whatever the reply is, the run cannot use this endpoint
            raise ValueError(failed("listing the models", e)) from e
        if served and self.model not in served:
            raise ValueError(
                f"--llm-model {self.model!r} is not served at {self.base_url} (it serves {', '.join(served[:5])})"
            )
        what = "a completion"
        if self.role == "judge":
            what = "a chat completion"
        try:
            text = self.request(self.rule.new_instance(self.tasks[0], 0, np.random.default_rng(0)), 0)
        except Exception as e:
            message = failed(what, e)
            if self.role == "answer" and self.args.llm_answer_format == "grammar":
                message += " (an endpoint without llama.cpp's grammar field needs --llm-answer-format free)"
            raise ValueError(message) from e
        if not isinstance(text, str):
            raise ValueError(f"{where}: {what} had no text")

    def agreement_pairs(self, levels: list[tuple[str, int]], pairs: int, seed: int = 0) -> list[tuple[list, list[int]]]:
        """(states, actions) per (task, level) of `levels`: `pairs` seeded states, every other action the rule's."""
        rng = np.random.default_rng(seed)
        out = []
        for task, level in levels:
            states = [self.rule.new_instance(task, level, rng) for _ in range(pairs)]
            wrong = [int(x) for x in rng.integers(1, self.num_actions, pairs)]
            actions = []
            for i, (s, w) in enumerate(zip(states, wrong)):
                shift = w
                if i % 2 == 0:
                    shift = 0
                actions.append((self.oracle_action(s) + shift) % self.num_actions)
            out.append((states, actions))
        return out

    def agreement_report(self, levels: list[tuple[str, int]], pairs: int, seed: int) -> dict:
        """--llm-check-pairs: check_agreement, printed per task and level; returns it (eval.json's llm_agreement_check)."""
        check = self.check_agreement(levels, pairs, seed)
        shares = " ".join(f"{w}={v['agreement']:.2f}" for w, v in check["per_level"].items())
        print(f"LLM agreement with the rule before training ({pairs} pairs per task and level): {shares}")
        if self.role == "answer":
            shares = " ".join(f"{w}={v['accuracy']:.2f}" for w, v in check["per_level"].items())
            print(f"LLM answers equal to the rule's before training: {shares}")
        return check

    def check_agreement(self, levels: list[tuple[str, int]], pairs: int, seed: int = 0) -> dict:
        """summary() over `pairs` seeded (state, action) per (task, level) of `levels`, half right; the running totals
        are kept."""
        stats = self.stats.copy()
        latencies = list(self.latencies)
        samples = list(self.invalid_samples)
        self.stats = collections.Counter()
        self.latencies = []
        self.invalid_samples = []
        for states, actions in self.agreement_pairs(levels, pairs, seed):
            self.respond(states, actions)
        result = self.summary()
        self.stats = stats
        self.latencies = latencies
        self.invalid_samples = samples
        return result
