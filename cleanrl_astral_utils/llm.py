"""The LLM parent of reinforce_baby (`--parent llm`): an OpenAI-compatible client with validation, retries, an sqlite
cache and the rule as fallback, and the statistics it reports (queries, fallbacks, agreement with the rule, latency).

The script's rule parent (`DeterministicParent`) sets the task instances and the transitions, and gives the reward
whenever the LLM's answer is missing or invalid; this module only asks, checks and counts."""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import sqlite3
import time

import numpy as np
import openai

LLM_SYSTEM_PROMPT = (
    'You check a child\'s answer against a rule. Reply with JSON only: {"reward": 1} if the answer '
    'follows the rule, {"reward": 0} if it does not.'
)


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
    every query the LLM does not answer validly. `tasks` and `attributes` name the task indices and state attributes,
    `vocab` holds each attribute's number of values (what a proposed next state is checked against)."""

    def __init__(self, rule, args, tasks: list[str], attributes: list[str], vocab: list[int]):
        self.rule = rule
        self.args = args
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
        self.db = open_cache(args.llm_cache or os.path.join(args.runs_dir, "llm_cache.sqlite"))
        # running totals; "<task>/level<k>/..." keys per task and level
        self.stats = collections.Counter()
        self.latencies = []

    # the rule's part: task instances, the oracle and the transitions
    def new_instance(self, task: str, level: int, rng: np.random.Generator):
        return self.rule.new_instance(task, level, rng)

    def oracle_action(self, s) -> int:
        return self.rule.oracle_action(s)

    def judge(self, s, action: int) -> float:
        return self.rule.judge(s, action)

    def transition(self, s, action: int, reward: float):
        return self.rule.transition(s, action, reward)

    # the request
    def user_message(self, s, action: int) -> str:
        message = f"{s.to_prompt()}\nanswer = {int(action)}"
        if self.next_state:
            message += (
                f"\nstate = {json.dumps(s.as_dict())}\nAlso give next_state: this state with step + 1, "
                "last_action = the answer and last_correct = your reward."
            )
        return message

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

    def body(self, s, action: int) -> dict:
        # worked examples: fixed instances of the same task and level, answered right and wrong in turn
        rng = np.random.default_rng(12345)
        shots = []
        for i in range(self.args.llm_examples):
            e = self.new_instance(s.task_name, s.level, rng)
            a = self.oracle_action(e)
            if i % 2 == 1:
                a = (self.oracle_action(e) + 1 + i) % self.num_actions
            r = self.judge(e, a)
            verdict = {"reward": int(r)}
            if self.next_state:
                verdict["next_state"] = self.transition(e, a, r).as_dict()
            shots.append({"role": "user", "content": self.user_message(e, a)})
            shots.append({"role": "assistant", "content": json.dumps(verdict)})
        # max_tokens bounds a model that does not stop: the answer is about 6 tokens, 90 with the next state
        body = {"model": self.model, "temperature": 0, "max_tokens": 20}
        if self.next_state:
            body["max_tokens"] = 200
        fmt = self.response_format()
        if fmt:
            body["response_format"] = fmt
        body["messages"] = [
            {"role": "system", "content": LLM_SYSTEM_PROMPT},
            *shots,
            {"role": "user", "content": self.user_message(s, action)},
        ]
        return body

    def cache_key(self, s, action: int) -> str:
        # all that decides an answer (request, endpoint) or its validity (attribute ranges): no wrong reuse
        raw = json.dumps([self.base_url, self.body(s, action), s.as_list(), int(action), self.vocab])
        return hashlib.sha256(raw.encode()).hexdigest()

    def request(self, s, action: int):
        with self.client.chat.completions.with_streaming_response.create(**self.body(s, action)) as reply:
            # the client's timeout bounds each read; this deadline bounds a reply trickled a few bytes at a time
            deadline = time.monotonic() + self.timeout
            chunks = []
            for chunk in reply.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no complete reply within --llm-timeout {self.timeout} s")
        return json.loads(b"".join(chunks))["choices"][0]["message"]["content"]  # as leniently as the client reads

    # the answer
    def validate(self, text, s, action: int):
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
        nxt = type(s).from_list([ns[a] for a in self.attributes], self.num_actions)
        # the LLM may set the verdict (last_correct), never a new task instance: that would move the goalposts
        kept = dataclasses.replace(s, last_action=int(action), step=s.step + 1, last_correct=nxt.last_correct)
        if nxt != kept:
            return None
        return float(obj["reward"]), nxt

    def ask(self, s, action: int) -> tuple[str, float] | None:
        """The first valid answer text within 1 + retries attempts, with its latency (ms); None if all failed."""
        for _ in range(1 + self.args.llm_retries):
            t0 = time.perf_counter()
            try:
                text = self.request(s, action)
            except (openai.OpenAIError, OSError, ValueError, LookupError, TypeError):  # OSError: timeouts
                continue
            if self.validate(text, s, action) is not None:
                return text, 1000.0 * (time.perf_counter() - t0)
        return None

    def cached(self, keys: list[str]) -> dict:
        answers = {}
        for k in set(keys):
            row = self.db.execute("SELECT answer FROM answers WHERE key = ?", (k,)).fetchone()
            if row:
                answers[k] = row[0]
        return answers

    def respond(self, states: list, actions: list[int]) -> list[tuple[float, object]]:
        """(reward, next state) of each (state, action): the LLM's verdict where it answered validly, else the rule's."""
        keys = [self.cache_key(s, a) for s, a in zip(states, actions)]
        answers = self.cached(keys)
        self.stats["cache_hits"] += sum(k in answers for k in keys)
        # one request per distinct (state, action): a non-deterministic judge gives each pair one reward per batch
        first = {}
        for i in reversed(range(len(keys))):
            if keys[i] not in answers:
                first[keys[i]] = i  # the key's first index

        def ask_index(i):
            return self.ask(states[i], actions[i])

        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.llm_concurrency) as pool:
            for i, res in zip(first.values(), pool.map(ask_index, first.values())):
                if res is not None:
                    answers[keys[i]] = res[0]
                    self.latencies.append(res[1])
                    self.db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?)", (keys[i], res[0]))
        self.db.commit()
        out = []
        for s, a, k in zip(states, actions, keys):
            rule = self.judge(s, a)
            where = f"{s.task_name}/level{s.level}"
            parsed = None
            if k in answers:
                parsed = self.validate(answers[k], s, a)
            counts = ["queries", "fallbacks" if parsed is None else "judged"]
            if parsed is not None:
                counts += ["agreements"] * int(parsed[0] == rule) + ["rewarded"] * int(parsed[0] == 1)
            self.stats.update(counts + [f"{where}/{c}" for c in counts])
            reward = rule
            nxt = None
            if parsed is not None:
                reward, nxt = parsed
            if nxt is None:
                nxt = self.transition(s, a, reward)
            out.append((reward, nxt))
        return out

    # what it reports
    def summary(self) -> dict:
        """Totals, and per task and level agreement with the rule and the share rewarded (a judge's bias)."""
        st = self.stats
        out = {k: st[k] for k in ("queries", "judged", "fallbacks", "cache_hits")}
        out["agreement"] = st["agreements"] / max(1, st["judged"])
        out["latency_ms"] = float(np.mean(self.latencies)) if self.latencies else 0.0
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

    def probe(self):
        """Raises ValueError (one line) saying what is wrong with the endpoint: one listing and one judgement, asked
        before any training."""
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
        try:
            text = self.request(self.new_instance(self.tasks[0], 0, np.random.default_rng(0)), 0)
        except Exception as e:
            raise ValueError(failed("a chat completion", e)) from e
        if not isinstance(text, str):
            raise ValueError(f"{where}: a chat completion had no text")

    def check_agreement(self, levels: list[tuple[str, int]], pairs: int, seed: int = 0) -> dict:
        """summary() over `pairs` seeded (state, action) per (task, level) of `levels`, half right; the running totals
        are kept."""
        stats = self.stats.copy()
        latencies = list(self.latencies)
        rng = np.random.default_rng(seed)
        self.stats = collections.Counter()
        self.latencies = []
        for task, level in levels:
            states = [self.new_instance(task, level, rng) for _ in range(pairs)]
            wrong = [int(x) for x in rng.integers(1, self.num_actions, pairs)]
            actions = []
            for i, (s, w) in enumerate(zip(states, wrong)):
                shift = w
                if i % 2 == 0:
                    shift = 0
                actions.append((self.oracle_action(s) + shift) % self.num_actions)
            self.respond(states, actions)
        result = self.summary()
        self.stats = stats
        self.latencies = latencies
        return result
