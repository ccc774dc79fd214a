"""Tests for cleanrl_astral/reinforce_baby.py: environment rules, world-model target, LLM parent (against a
local OpenAI-compatible server), curriculum, smoke runs per task and algorithm, and bad input."""

import dataclasses
import http.server
import json
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from cleanrl_astral import reinforce_baby as rb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = "cleanrl_astral/reinforce_baby.py"
TINY = ["--num-actions", "8", "--hidden-dim", "32", "--num-layers", "1", "--num-envs", "16",
        "--total-timesteps", "64", "--eval-episodes", "8", "--no-analysis"]


def run_script(*flags, check=True):
    return subprocess.run([sys.executable, SCRIPT, *flags], cwd=REPO, capture_output=True, text=True, check=check,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def only_run_dir(runs_dir):
    dirs = [d for d in os.listdir(runs_dir) if os.path.isdir(os.path.join(runs_dir, d))]
    assert len(dirs) == 1, dirs
    return os.path.join(runs_dir, dirs[0])


def scalar_steps(run_dir):
    """tag -> steps of the run's scalars, read with TensorBoard's own reader (purges applied, sub-directories not)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def logged_values():
    """`logged_values(run_dir)`: {tag: [(step, value), ...]} as TensorBoard shows the run (resumes purged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def read(run_dir):
        acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return read


# --------------------------------------------------------------------------------------------------- env
def test_oracle_gets_reward_one_on_every_task_and_level():
    parent = rb.DeterministicParent(8)
    for task in rb.TASKS:
        for level in range(rb.NUM_LEVELS):
            env = rb.BabyEnv(parent, 300, 1, seed=level)
            states = env.reset([task] * 300, [level] * 300)
            oracle = [parent.oracle_action(s) for s in states]
            assert all(0 <= a < rb.DIFFICULTY_CONFIGS[task][level]["num_symbols"] for a in oracle)
            _, rewards, _, _, info = env.step(oracle)
            assert np.all(rewards == 1.0) and info["success"].all(), (task, level)


def test_random_policy_gets_one_over_num_actions():
    for num_actions in (8, 16):
        parent = rb.DeterministicParent(num_actions)
        env = rb.BabyEnv(parent, 20000, 1, seed=3)
        env.reset(["pattern-echo"] * 20000, [2] * 20000)
        actions = np.random.default_rng(0).integers(0, num_actions, 20000).tolist()
        _, rewards, _, _, _ = env.step(actions)
        # the std of the mean is about 0.0023 at 1/8: 0.012 is five of them
        assert abs(rewards.mean() - 1.0 / num_actions) < 0.012, (num_actions, rewards.mean())


def test_episode_ends_only_on_time_limit():
    parent = rb.DeterministicParent(8)
    env = rb.BabyEnv(parent, 64, 3, seed=0)
    states = env.reset(["conditional"] * 64, [1] * 64)
    for t in range(1, 4):
        # the oracle answers correctly from the first step: success must not end the episode
        states, rewards, terminated, truncated, _ = env.step([parent.oracle_action(s) for s in states])
        assert np.all(rewards == 1.0)
        assert not terminated.any()
        assert truncated.all() == (t == 3) and truncated.any() == (t == 3)
        assert all(s.step == t for s in states)


def test_success_is_tracked_apart_from_reward():
    class GenerousParent(rb.DeterministicParent):
        def judge(self, s, action):
            return 1.0

    parent = GenerousParent(8)
    env = rb.BabyEnv(parent, 200, 2, seed=1)
    states = env.reset(["pattern-echo"] * 200, [2] * 200)
    wrong = [(parent.oracle_action(s) + 1) % 8 for s in states]
    states, rewards, _, _, info = env.step(wrong)
    assert np.all(rewards == 1.0) and not info["success"].any()  # not at the time limit yet
    states, rewards, _, _, info = env.step(wrong)
    assert np.all(rewards == 1.0)
    assert not info["success"].any() and not info["correct"].any()
    env.reset(["pattern-echo"] * 200, [2] * 200)
    env.step([parent.oracle_action(s) for s in env.states])
    _, _, _, _, info = env.step([parent.oracle_action(s) for s in env.states])
    assert info["success"].all()


def test_state_tensor_prompt_and_round_trip():
    parent = rb.DeterministicParent(16)
    rng = np.random.default_rng(0)
    for task in rb.TASKS:
        s = parent.new_instance(task, 2, rng)
        x = s.to_tensor()
        assert x.shape == (rb.STATE_DIM,) and x.dtype == torch.long
        vocab = rb.attribute_vocab(16, 1)
        assert all(0 <= int(v) < k for v, k in zip(x, vocab))
        assert rb.State.from_list(x.tolist(), 16) == s
        assert task in s.to_prompt() and "Actions are symbols 0..15" in s.to_prompt()


def test_reward_vector_and_consistency():
    parent = rb.DeterministicParent(8)
    s0 = parent.new_instance("pattern-echo", 2, np.random.default_rng(0))
    right, wrong = parent.oracle_action(s0), (parent.oracle_action(s0) + 1) % 8
    approved, rejected = parent.transition(s0, right, 1.0), parent.transition(s0, wrong, 0.0)
    cons = rb.consistency_reward([s0, approved, approved, rejected, rejected], [wrong, right, wrong, wrong, right])
    assert cons.tolist() == [0.0, 1.0, -1.0, -1.0, 1.0]
    rv = rb.RewardVector(np.array([1.0, 0.0]), np.array([0.5, 0.5]), np.array([1.0, -1.0]))
    assert np.allclose(rv.total(1.0, 0.1, 0.2), [1.25, -0.15])


# ------------------------------------------------------------------------------------------------- model
def make_agent(wm_target="raw"):
    torch.manual_seed(0)
    return rb.Agent(8, 3, 32, 2, 4, wm_target)


def test_world_model_target_is_the_raw_next_state_tensor():
    agent = make_agent("raw")
    parent = rb.DeterministicParent(8)
    env = rb.BabyEnv(parent, 5, 3, seed=0)
    states = env.reset(["sequence-next"] * 5, [1] * 5)
    actions = [1, 2, 3, 4, 5]
    next_states, _, _, _, _ = env.step(actions)
    nx = rb.states_to_tensor(next_states)
    target = agent.world_model_target(nx)
    assert torch.equal(target, nx.float()) and target.shape == (5, rb.STATE_DIM)
    assert nx[:, rb.ATTRIBUTES.index("last_action")].tolist() == actions
    pred = agent.world_model(agent.embed(rb.states_to_tensor(states)), torch.tensor(actions))
    assert pred.shape == target.shape
    emb_agent = make_agent("embedding")
    emb_target = emb_agent.world_model_target(nx)
    assert emb_target.shape == (5, 32) and not emb_target.requires_grad


def test_gradients_reach_every_parameter():
    agent = make_agent()
    parent = rb.DeterministicParent(8)
    env = rb.BabyEnv(parent, 32, 3, seed=0)
    states = env.reset(["conditional"] * 32, [2] * 32)
    x = rb.states_to_tensor(states)
    action, logprob, entropy, value, h, logits = agent.get_action_and_value(x)
    nx = rb.states_to_tensor(env.step(action.tolist())[0])
    wm_loss = torch.nn.functional.mse_loss(agent.world_model(h, action), agent.world_model_target(nx))
    wm_loss.backward(retain_graph=True)
    # the world-model loss alone shapes the shared representation (encoder and core), not the policy head
    for name, p in agent.named_parameters():
        touched = p.grad is not None and p.grad.abs().sum() > 0
        assert touched == (not name.startswith(("action_head", "value_head"))), name
    agent.zero_grad()
    loss = -(logprob * torch.randn(32)).mean() - 0.01 * entropy.mean() + value.pow(2).mean() + wm_loss
    loss = loss + rb.kl_to_parent(logits, torch.zeros(32, dtype=torch.long), 0.1)
    loss.backward()
    for name, p in agent.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_model_size_is_capped_below_one_million_parameters():
    assert rb.num_parameters(rb.Agent(16, 1, 128, 4, 4)) < 1_000_000
    assert rb.validate_args(rb.Args(hidden_dim=128, num_layers=4)) is None
    assert "under 1M" in rb.validate_args(rb.Args(hidden_dim=256, num_layers=4))


def test_returns_gae_and_kl(forward_gae):
    r = torch.tensor([[1.0], [0.0], [1.0]])
    assert torch.allclose(rb.reinforce_returns(r, 0.5), torch.tensor([[1.25], [0.5], [1.0]]))
    values = torch.tensor([[0.5], [0.5], [0.5], [0.0]])
    adv = rb.gae(r, values, 1.0, 1.0)
    assert torch.allclose(adv + values[:3], torch.tensor([[2.0], [1.0], [1.0]]))
    # gamma and lambda below 1 each show, and values[T] enters the last step's delta as given (the script passes 0)
    values = torch.tensor([[0.5, -1.0], [0.2, 0.3], [0.8, 2.0], [0.4, -0.6]])
    r2 = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, -1.0]])
    adv = rb.gae(r2, values, 0.9, 0.5)
    for n in range(2):
        expected = forward_gae(r2[:, n].tolist(), values[:, n].tolist(), [1.0, 1.0, 1.0], 0.9, 0.5)
        assert adv[:, n].tolist() == pytest.approx(expected, rel=1e-6)
    logits = torch.zeros(1, 4)
    assert rb.kl_to_parent(logits, torch.tensor([2]), 1.0).abs() < 1e-6  # full smoothing = uniform = pi
    assert rb.kl_to_parent(logits, torch.tensor([2]), 0.0) == pytest.approx(np.log(4), abs=1e-5)


def test_reinforce_advantages_are_scaled_only_when_the_returns_differ():
    """REINFORCE's advantages are return - running baseline, already centred: they are divided by their std, except
    when every return in the batch is equal (all 0/1 episodes succeeded or all failed), where the std is 0 and the
    division would blow them up by 1e8. PPO's are centred and scaled as usual."""
    same = torch.full((32,), 0.7)
    assert torch.equal(rb.scale_advantages(same, "reinforce"), same)
    mixed = torch.tensor([0.5, -0.5, 0.5, 1.5])
    assert torch.allclose(rb.scale_advantages(mixed, "reinforce"), mixed / mixed.std(), rtol=1e-6)
    ppo = rb.scale_advantages(mixed, "ppo")
    assert ppo.mean().abs() < 1e-6 and ppo.std() == pytest.approx(1.0, abs=1e-5)


def test_reinforce_with_0_1_returns_keeps_its_policy_loss_bounded(tmp_path, logged_values):
    """Without the prediction reward, pattern-echo's returns are 0 or 1, and once the task is learnt whole batches
    succeed: the policy loss must stay of order one, not jump to ~1e5 with the entropy collapsing."""
    run_script("--task", "pattern-echo", "--num-actions", "8", "--world-model-coef", "0", "--pred-reward-weight", "0",
               "--total-timesteps", "6400", "--eval-episodes", "8", "--no-analysis", "--runs-dir", str(tmp_path))
    scalars = logged_values(only_run_dir(tmp_path))
    losses = [abs(v) for _, v in scalars["losses/policy_loss"]]
    assert len(losses) == 200 and max(losses) < 50, max(losses)
    assert scalars["charts/success_rate"][-1][1] > 0.9


def test_reinforce_learns_pattern_echo_quickly():
    args = rb.Args(task="pattern-echo", num_actions=8, total_timesteps=3200, checkpoint_every=0, print_every=10**9)
    args.batch_size, args.num_iterations = args.num_envs, 3200 // args.num_envs
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)

    class Writer:
        def __init__(self):
            self.scalars = {}

        def add_scalar(self, k, v, step):
            self.scalars.setdefault(k, []).append(v)

    w = Writer()
    agent, levels = rb.train(args, "/nonexistent", w)
    result = rb.Evaluator(["pattern-echo"], 8, 1, 400, 5).run(agent.eval(), levels)
    assert result["success_rate"] > 0.6, result  # random is 0.125
    ent = w.scalars["losses/entropy"]
    assert np.mean(ent[-10:]) < np.mean(ent[:10])


# ------------------------------------------------------------------------------------------- curriculum
def test_curriculum_advances_on_mastery_and_not_before():
    cm = rb.CurriculumManager(["pattern-echo", "conditional"], True, 2, threshold=0.9, window=10)
    assert cm.levels == {"pattern-echo": 0, "conditional": 0}
    for _ in range(9):
        assert not cm.record("pattern-echo", 0, True)  # perfect but the window is not full yet
    assert cm.levels["pattern-echo"] == 0
    assert cm.record("pattern-echo", 0, True) and cm.levels["pattern-echo"] == 1
    assert cm.levels["conditional"] == 0
    # 8/10 is below 0.9: no level-up however long it lasts
    for i in range(50):
        assert not cm.record("pattern-echo", 1, i % 5 not in (0, 1))
    assert cm.levels["pattern-echo"] == 1
    for _ in range(10):
        cm.record("pattern-echo", 0, True)  # outcomes at an old level do not count
    assert cm.levels["pattern-echo"] == 1
    for _ in range(9):
        cm.record("pattern-echo", 1, True)
    assert cm.levels["pattern-echo"] == 2  # 9 of the last 10 were successes
    for _ in range(30):
        cm.record("pattern-echo", 2, True)
    assert cm.levels["pattern-echo"] == 2  # top level stays
    rng = np.random.default_rng(0)
    review = rb.CurriculumManager(["pattern-echo"], True, 2, 0.9, 10, review_prob=0.25)
    review.levels["pattern-echo"] = 2
    drawn = np.array([review.sample_level("pattern-echo", rng) for _ in range(4000)])
    assert set(drawn.tolist()) == {0, 1, 2} and abs((drawn < 2).mean() - 0.25) < 0.03
    assert {cm.sample_level("conditional", rng) for _ in range(100)} == {0}  # nothing mastered yet
    fixed = rb.CurriculumManager(["conditional"], False, 1, 0.9, 10, review_prob=0.5)
    assert {fixed.sample_level("conditional", rng) for _ in range(100)} == {1}
    for _ in range(30):
        assert not fixed.record("conditional", 1, True)
    assert fixed.levels == {"conditional": 1}
    restored = rb.CurriculumManager(["pattern-echo", "conditional"], True, 2, 0.9, 10)
    restored.load_state_dict(cm.state_dict())
    assert restored.levels == cm.levels and list(restored.history["pattern-echo"]) == list(cm.history["pattern-echo"])


# ----------------------------------------------------------------------------------------- LLM parent
class FakeLLM(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        srv = self.server
        srv.count += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv.last_body, srv.last_auth = body, self.headers.get("Authorization")
        if srv.mode == "http500":
            self.send_error(500, "internal error")
            return
        if srv.mode == "slow":
            srv.release.wait(10)
        if srv.mode == "garbage":  # not HTTP at all: http.client raises BadStatusLine, an HTTPException
            self.wfile.write(b"garbage\r\n\r\n")
            self.close_connection = True
            return
        content = {"valid": json.dumps({"reward": 1}), "fenced": "```json\n{\"reward\": 0}\n```",
                   "malformed": "{reward: yes", "slow": json.dumps({"reward": 1}), "drip": json.dumps({"reward": 1}),
                   "bad_reward": json.dumps({"reward": 0.5}), "null": None,
                   "parts": [{"type": "text", "text": json.dumps({"reward": 1})}],
                   "alternate": json.dumps({"reward": srv.count % 2}),
                   "next_state": json.dumps({"reward": 1, "next_state": srv.next_state})}[srv.mode]
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
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
    srv.mode, srv.count, srv.release, srv.next_state = "valid", 0, threading.Event(), None
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def make_llm_parent(srv, tmp_path, name="cache.sqlite", **kw):
    opts = dict(timeout=2.0, retries=1, next_state=False, concurrency=2)
    opts.update(kw)
    return rb.LLMParent(8, 3, srv.url, "test-model", "sk-test", opts["timeout"], opts["retries"],
                        str(tmp_path / name), opts["next_state"], opts["concurrency"])


def instance(parent, seed=0):
    s = parent.new_instance("pattern-echo", 2, np.random.default_rng(seed))
    return s, parent.oracle_action(s), (parent.oracle_action(s) + 1) % 8


def test_llm_parent_valid_answers_are_used_and_cached(llm_server, tmp_path):
    parent = make_llm_parent(llm_server, tmp_path)
    s, right, wrong = instance(parent)
    replies = parent.respond([s, s], [right, wrong])
    # the server approves everything: its verdict is the reward, even where the rule disagrees
    assert [r for r, _ in replies] == [1.0, 1.0]
    assert replies[1][1].last_action == wrong and replies[1][1].last_correct == 1
    assert llm_server.count == 2 and llm_server.last_auth == "Bearer sk-test"
    assert llm_server.last_body["model"] == "test-model" and "pattern-echo" in json.dumps(llm_server.last_body)
    stats = parent.log_stats()
    assert stats["parent/llm_agreement"] == 0.5 and stats["parent/fallbacks"] == 0
    assert parent.respond([s], [wrong])[0][0] == 1.0
    assert llm_server.count == 2 and parent.stats["cache_hits"] == 1
    # a new parent on the same cache file answers from disk: reruns are reproducible
    again = make_llm_parent(llm_server, tmp_path)
    assert again.respond([s], [right])[0][0] == 1.0 and llm_server.count == 2
    llm_server.mode = "fenced"
    assert parent.respond([s], [(right + 2) % 8])[0][0] == 0.0 and parent.stats["fallbacks"] == 0


@pytest.mark.parametrize("mode", ["malformed", "bad_reward", "http500", "slow", "null", "parts", "garbage", "drip"])
def test_llm_parent_failures_fall_back_to_the_rule(llm_server, tmp_path, mode):
    """Every kind of failed answer costs an attempt and ends in the rule's reward, never in an exception: until
    session 17 a null or list content (refusals, tool calls) raised AttributeError in validate, a reply that is not
    HTTP raised BadStatusLine, and a server dripping its reply held the request open past --llm-timeout."""
    llm_server.mode = mode
    parent = make_llm_parent(llm_server, tmp_path, timeout=0.3 if mode in ("slow", "drip") else 2.0)
    s, right, wrong = instance(parent)
    replies = parent.respond([s, s], [right, wrong])
    assert [r for r, _ in replies] == [1.0, 0.0]  # the deterministic rule's rewards
    assert parent.stats["fallbacks"] == 2 and parent.stats["judged"] == 0
    assert llm_server.count == 4  # 1 + retries attempts per query
    # failures are not cached: the next identical query asks again
    parent.respond([s], [wrong])
    assert llm_server.count == 6 and parent.stats["fallbacks"] == 3 and parent.stats["cache_hits"] == 0


def test_llm_parent_next_state_is_validated(llm_server, tmp_path):
    parent = make_llm_parent(llm_server, tmp_path, next_state=True)
    s, right, wrong = instance(parent)
    # a valid state the rule would not produce from this reply (the rule sets last_correct = 1 for reward 1), so
    # nxt == proposed shows the LLM's state is used, not recomputed
    proposed = dataclasses.replace(parent.transition(s, wrong, 1.0), last_correct=0)
    assert proposed != parent.transition(s, wrong, 1.0)
    llm_server.mode = "next_state"
    llm_server.next_state = dict(zip(rb.ATTRIBUTES, proposed.as_list()))
    (r, nxt), = parent.respond([s], [wrong])
    assert r == 1.0 and nxt == proposed and parent.stats["fallbacks"] == 0
    llm_server.next_state = {**llm_server.next_state, "v0": 99}  # out of the attribute's range
    (r, nxt), = parent.respond([s], [right])
    assert r == 1.0 and nxt == parent.transition(s, right, 1.0) and parent.stats["fallbacks"] == 1


@pytest.mark.parametrize("change", [{"v0": "answer"}, {"task": 1}, {"level": 0}, {"f0": 1}, {"step": 2},
                                    {"last_action": "other"}])
def test_llm_next_state_may_not_change_the_task_instance(llm_server, tmp_path, change):
    """Success is judged by the rule on the instance, so an LLM that rewrote it could turn a wrong answer into a
    success (v0 set to the child's answer) or make the instance unsolvable: such a state is an invalid answer."""
    parent = make_llm_parent(llm_server, tmp_path, next_state=True)
    s, right, wrong = instance(parent)
    proposed = dict(zip(rb.ATTRIBUTES, parent.transition(s, wrong, 1.0).as_list()))
    for key, value in change.items():
        proposed[key] = {"answer": wrong, "other": right}.get(value, value)
    assert proposed != dict(zip(rb.ATTRIBUTES, parent.transition(s, wrong, 1.0).as_list()))
    llm_server.mode, llm_server.next_state = "next_state", proposed
    (r, nxt), = parent.respond([s], [wrong])
    assert (r, nxt) == (0.0, parent.transition(s, wrong, 0.0)) and parent.stats["fallbacks"] == 1


def test_llm_cache_key_holds_what_changes_an_answer_or_its_validity(llm_server, tmp_path):
    """The prompt names the action range and the validation the step range: a cache shared by runs with another
    --num-actions, --max-episode-steps or endpoint must not serve their answers (until session 17 it did, and an
    answer invalid for this run fell back on every use without the LLM ever being asked)."""
    def key(num_actions=8, horizon=3, url=llm_server.url, model="test-model"):
        p = rb.LLMParent(num_actions, horizon, url, model, "", 1.0, 0, str(tmp_path / "k.sqlite"), True, 1)
        s = dataclasses.replace(rb.State(2, 1, (1, 2, 3), (0, 1, rb.FLAG_PAD), 8, rb.FLAG_PAD, 1, 8),
                                num_actions=num_actions)
        return p.cache_key(s, 2)

    assert key() == key()
    assert len({key(), key(num_actions=16), key(horizon=9), key(url="http://127.0.0.1:1/v1"), key(model="m2")}) == 5


def test_llm_parent_asks_once_per_distinct_pair_in_a_batch(llm_server, tmp_path):
    """A judge that alternates its verdict: four copies of one (state, action) in a batch get one request and one
    reward, not four requests and conflicting rewards."""
    llm_server.mode = "alternate"
    parent = make_llm_parent(llm_server, tmp_path)
    s, right, wrong = instance(parent)
    replies = parent.respond([s] * 4 + [s], [wrong] * 4 + [right])
    assert llm_server.count == 2
    assert len({r for r, _ in replies[:4]}) == 1 and parent.stats["queries"] == 5


def test_training_with_llm_parent_runs_and_logs_fallbacks(llm_server, tmp_path):
    cache = tmp_path / "llm.sqlite"
    out = run_script("--task", "pattern-echo", *TINY, "--parent", "llm", "--llm-base-url", llm_server.url,
                     "--llm-cache", str(cache), "--runs-dir", str(tmp_path / "runs"))
    run_dir = only_run_dir(tmp_path / "runs")
    assert os.path.isfile(os.path.join(run_dir, "eval.json")) and cache.exists()
    assert llm_server.count > 0, out.stdout
    tags = set(scalar_steps(run_dir))
    assert {"parent/llm_agreement", "parent/fallbacks", "parent/latency_ms"} <= tags


# -------------------------------------------------------------------------------------------- smoke runs
@pytest.mark.parametrize("task,algorithm,extra", [
    ("pattern-echo", "reinforce", []),
    ("sequence-next", "ppo", ["--wm-target", "embedding"]),
    ("conditional", "reinforce", ["--max-episode-steps", "3"]),
    ("all", "ppo", ["--max-episode-steps", "2", "--curriculum"]),
])
def test_smoke_per_task_and_algorithm(tmp_path, task, algorithm, extra):
    run_script("--task", task, "--algorithm", algorithm, *TINY, *extra, "--runs-dir", str(tmp_path))
    run_dir = only_run_dir(tmp_path)
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)
    assert ev["script"] == "reinforce_baby" and ev["task"] == task
    assert 0.0 <= ev["success_rate"] <= 1.0 and ev["baselines"]["random"]["success_rate"] < 0.5
    tasks = rb.TASKS if task == "all" else [task]
    assert {k.split("/")[0] for k in ev["per_difficulty_success"]} == set(tasks)
    sc = scalar_steps(run_dir)
    tags = set(sc)
    assert {"charts/success_rate", "losses/entropy", "losses/world_model_mse", "reward/goal", "reward/pred",
            "reward/cons", "charts/SPS"} <= tags
    steps = sc["charts/success_rate"]
    T = int(extra[extra.index("--max-episode-steps") + 1]) if "--max-episode-steps" in extra else 1
    batch = 16 * T
    assert steps == list(range(batch, 64 // batch * batch + 1, batch))  # logged against environment steps


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names):
    """Runs of one command and seed started in the same second (a shell loop over flags) used to share
    runs/{run_name}: their TensorBoard events mixed, and the later run's files replaced the earlier run's."""
    check = occupied_run_names(str(tmp_path), "pattern-echo__collide__7__")
    run_script("--task", "pattern-echo", *TINY, "--exp-name", "collide", "--seed", "7", "--runs-dir", str(tmp_path),
               "--save-model")
    run_dir = check()
    assert os.path.isfile(os.path.join(run_dir, "collide.cleanrl_model"))
    assert os.path.isfile(os.path.join(run_dir, "eval.json"))


def test_a_runs_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "runs").write_text("")
    result = run_script("--task", "pattern-echo", *TINY, "--runs-dir", str(tmp_path / "runs"), check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("reinforce_baby.py: error: ") and \
        "--runs-dir" in lines[0] and "not a directory" in lines[0], result.stderr
    assert result.stdout == ""


def test_full_run_save_evaluate_baselines_analysis_and_eval_only(tmp_path):
    runs = tmp_path / "runs"
    flags = [f for f in TINY if f != "--no-analysis"] + ["--analysis-samples", "120"]
    run_script("--task", "all", "--curriculum", *flags, "--save-model", "--capture-video",
               "--baselines", "random", "rl-only", "kl-distill", "--runs-dir", str(runs), "--seed", "4")
    run_dir = only_run_dir(runs)
    def strict(name):
        raise AssertionError(f"eval.json holds {name}, which is not JSON")

    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.loads(f.read(), parse_constant=strict)
    assert set(ev["baselines"]) == {"random", "rl-only", "kl-distill"}
    assert "world_model_mse" not in ev["baselines"]["random"] and "world_model_mse" in ev["baselines"]["rl-only"]
    assert all(isinstance(v, float) for v in ev["baselines"]["kl-distill"].values())
    assert set(ev["probe_accuracy"]) >= {"task", "v0", "v1"}
    assert os.path.getsize(os.path.join(run_dir, "tsne.png")) > 1000
    assert os.path.isfile(os.path.join(run_dir, "videos", "eval_transcript.txt"))
    model = os.path.join(run_dir, "reinforce_baby.cleanrl_model")
    saved = torch.load(model, weights_only=False)
    assert saved["script"] == "reinforce_baby" and saved["args"]["task"] == "all"
    assert not [f for f in os.listdir(run_dir) if ".tmp." in f]
    # evaluate() on the saved file reproduces the run's own evaluation exactly, with its defaults (until session 17
    # they were 200 episodes of seed 12345, not the run's own --eval-episodes of seed + 777)
    again = rb.evaluate(model)
    assert again["success_rate"] == ev["success_rate"]
    assert again["per_difficulty_success"] == ev["per_difficulty_success"]
    assert again == rb.evaluate(model, episodes=8, seed=4 + rb.EVAL_SEED_OFFSET)
    # so does --eval-only without --seed or --eval-episodes: it takes the saved run's
    out = run_script("--task", "all", "--num-actions", "8", "--eval-only", "--model-path", model, "--no-analysis",
                     "--runs-dir", str(tmp_path / "eval"))
    with open(os.path.join(only_run_dir(tmp_path / "eval"), "eval.json")) as f:
        only = json.load(f)
    assert only["success_rate"] == ev["success_rate"] and only["per_difficulty_success"] == ev["per_difficulty_success"]
    assert "model parameters" in out.stdout


def test_a_checkpoint_never_claims_updates_whose_logs_are_not_on_disk(tmp_path, die_at_checkpoint):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    flags = [f if f != "64" else "160" for f in TINY]
    subprocess.run([sys.executable, "-c", die_at_checkpoint(3), SCRIPT, "--task", "pattern-echo", *flags,
                    "--checkpoint-every", "1", "--runs-dir", str(tmp_path)], cwd=REPO, check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir = only_run_dir(tmp_path)
    assert torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=False)["global_step"] == 48
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "charts/SPS" in tags
    assert {tag: [e.step for e in acc.Scalars(tag)] for tag in tags} == {tag: [16, 32, 48] for tag in tags}


def test_resumed_run_logs_every_update_exactly_once(tmp_path, die_at_checkpoint, logged_scalars):
    """Killed after logging update 4 but before checkpointing it, the run resumes from update 3 and plays update 4
    again: TensorBoard must show the resumed run's update 4 only (purge_step)."""
    flags = ["--task", "pattern-echo", *[f if f != "64" else "96" for f in TINY], "--checkpoint-every", "1",
             "--runs-dir", str(tmp_path)]
    subprocess.run([sys.executable, "-c", die_at_checkpoint(4, written=False), SCRIPT, *flags], cwd=REPO, check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir = only_run_dir(tmp_path)
    ckpt = os.path.join(run_dir, "checkpoint.pt")
    assert torch.load(ckpt, weights_only=False)["global_step"] == 48
    assert max(step for step, _ in logged_scalars(run_dir)["charts/SPS"]) == 64  # update 4 reached the disk
    resumed_at = time.time()
    run_script(*flags, "--resume", ckpt)
    final = logged_scalars(run_dir)
    assert [step for step, _ in final["charts/SPS"]] == [16, 32, 48, 64, 80, 96]
    stale = [(tag, step) for tag, events in final.items() for step, wall in events if (step > 48) != (wall > resumed_at)]
    assert not stale, stale[:5]


def test_resumed_run_retrains_baselines_without_their_partial_logs(tmp_path, logged_scalars):
    """Killed while training the rl-only baseline (never checkpointed), a resumed run trains it again from scratch:
    the killed run's partial baseline logs must not show (purge_step=0 in the baseline's writer). The kill comes
    after every writer flushed, as TensorBoard's 2-minute timer would during a real baseline's training, so the
    agent's eval scalars would show twice after the resume if they were logged before the baselines."""
    die_in_baseline = """
import os, runpy, sys
from torch.utils.tensorboard import SummaryWriter
real_add_scalar, seen, writers = SummaryWriter.add_scalar, [], []
def add_scalar(self, tag, value, step=None, *args, **kwargs):
    real_add_scalar(self, tag, value, step, *args, **kwargs)
    if all(w is not self for w in writers):
        writers.append(self)
    if "baseline_" in self.log_dir and tag == "charts/SPS":
        seen.append(step)
        if len(seen) == 3:
            for w in writers:
                w.flush()
            os._exit(0)
SummaryWriter.add_scalar = add_scalar
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    flags = ["--task", "pattern-echo", *[f if f != "64" else "96" for f in TINY], "--checkpoint-every", "1",
             "--baselines", "rl-only", "--runs-dir", str(tmp_path)]
    subprocess.run([sys.executable, "-c", die_in_baseline, SCRIPT, *flags], cwd=REPO, check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir = only_run_dir(tmp_path)
    baseline_dir = os.path.join(run_dir, "baseline_rl-only")
    assert [step for step, _ in logged_scalars(baseline_dir)["charts/SPS"]] == [16, 32, 48]
    resumed_at = time.time()
    out = run_script(*flags, "--resume", os.path.join(run_dir, "checkpoint.pt"))
    assert "resumed from" in out.stdout and "global_step=96" in out.stdout
    final = logged_scalars(baseline_dir)
    assert [step for step, _ in final["charts/SPS"]] == [16, 32, 48, 64, 80, 96]
    assert all(wall > resumed_at for events in final.values() for _, wall in events)
    agent_eval = {tag: events for tag, events in logged_scalars(run_dir).items() if tag.startswith("eval/")}
    assert sorted(agent_eval) == ["eval/policy_entropy", "eval/success_rate", "eval/world_model_mse"]
    assert all([step for step, _ in events] == [96] for events in agent_eval.values()), agent_eval



def test_a_run_killed_in_its_analysis_logs_its_evaluation_once(tmp_path, logged_scalars):
    """Killed during the t-SNE analysis, after every writer flushed (as TensorBoard's 2-minute timer would during a
    long analysis), the run has no eval.json and its resume evaluates again. Until session 21 the eval scalars were
    logged before the analysis, so they showed twice; now they are logged beside eval.json, and show once."""
    die_in_tsne = """
import os, runpy, sys
from sklearn.manifold import TSNE
from torch.utils.tensorboard import SummaryWriter
real_init, writers = SummaryWriter.__init__, []
def init(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    writers.append(self)
def die(self, *args, **kwargs):
    for w in writers:
        w.flush()
    os._exit(0)
SummaryWriter.__init__, TSNE.fit_transform = init, die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    flags = ["--task", "pattern-echo", *[f for f in TINY if f != "--no-analysis"], "--analysis-samples", "64",
             "--checkpoint-every", "1", "--runs-dir", str(tmp_path)]
    subprocess.run([sys.executable, "-c", die_in_tsne, SCRIPT, *flags], cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir = only_run_dir(tmp_path)
    assert not os.path.exists(os.path.join(run_dir, "eval.json"))
    run_script("--resume", os.path.join(run_dir, "checkpoint.pt"))
    assert os.path.isfile(os.path.join(run_dir, "eval.json"))
    logged = {tag: events for tag, events in logged_scalars(run_dir).items() if tag.startswith("eval/")}
    assert sorted(logged) == ["eval/policy_entropy", "eval/success_rate", "eval/world_model_mse"]
    assert all([step for step, _ in events] == [64] for events in logged.values()), logged

def test_resumed_run_logs_what_an_uninterrupted_run_logs(tmp_path, die_at_checkpoint, logged_values):
    """A run killed after checkpoint 5 and resumed must log, from update 6 on, exactly the values of the same run
    left alone, for every tag but SPS: the per-level success windows included (they were not checkpointed and
    restarted empty)."""
    flags = ["--task", "all", "--curriculum", *[f if f != "64" else "160" for f in TINY], "--checkpoint-every", "1",
             "--seed", "2"]
    run_script(*flags, "--runs-dir", str(tmp_path / "whole"))
    subprocess.run([sys.executable, "-c", die_at_checkpoint(5), SCRIPT, *flags, "--runs-dir", str(tmp_path / "cut")],
                   cwd=REPO, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    cut = only_run_dir(tmp_path / "cut")
    run_script(*flags, "--runs-dir", str(tmp_path / "cut"), "--resume", os.path.join(cut, "checkpoint.pt"))
    whole, resumed = logged_values(only_run_dir(tmp_path / "whole")), logged_values(cut)
    per_level = [t for t in whole if t.startswith("charts/success_rate_")]
    assert per_level and set(resumed) == set(whole)
    for tag in whole:
        if tag != "charts/SPS":
            assert resumed[tag] == whole[tag], tag
    assert [step for step, _ in resumed["charts/SPS"]] == list(range(16, 161, 16))


def test_resumed_llm_run_continues_the_parents_running_totals(llm_server, tmp_path, die_at_checkpoint,
                                                               logged_values):
    """parent/queries, cache_hits and fallbacks are running totals: until session 17 a resumed run restarted them at
    0 (the parent's counters were not in the checkpoint). Each run has its own cache file, as a fresh run would."""
    def flags(name):
        return ["--task", "pattern-echo", *[f if f != "64" else "96" for f in TINY], "--checkpoint-every", "1",
                "--parent", "llm", "--llm-base-url", llm_server.url, "--llm-cache", str(tmp_path / f"{name}.sqlite"),
                "--runs-dir", str(tmp_path / name)]
    run_script(*flags("whole"))
    subprocess.run([sys.executable, "-c", die_at_checkpoint(3), SCRIPT, *flags("cut")], cwd=REPO, check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    cut = only_run_dir(tmp_path / "cut")
    run_script(*flags("cut"), "--resume", os.path.join(cut, "checkpoint.pt"))
    whole, resumed = logged_values(only_run_dir(tmp_path / "whole")), logged_values(cut)
    for tag in ("parent/queries", "parent/cache_hits", "parent/fallbacks", "parent/llm_agreement"):
        assert resumed[tag] == whole[tag], tag
    assert whole["parent/queries"][-1] == (96, 96.0)


def test_in_process_baseline_is_the_run_its_own_flags_would_make(tmp_path, logged_values):
    """`--baselines rl-only` trains in the agent's process; it must reseed first, so that its training is the run
    `--world-model-coef 0 --pred-reward-weight 0` would make alone with the same seed, not one that depends on how
    much randomness the agent's run consumed."""
    common = ["--task", "pattern-echo", *[f if f != "64" else "160" for f in TINY], "--seed", "3"]
    run_script(*common, "--baselines", "rl-only", "--runs-dir", str(tmp_path / "with"))
    run_script(*common, "--world-model-coef", "0", "--pred-reward-weight", "0", "--runs-dir", str(tmp_path / "alone"))
    inside = logged_values(os.path.join(only_run_dir(tmp_path / "with"), "baseline_rl-only"))
    alone = logged_values(only_run_dir(tmp_path / "alone"))
    for tag in ("losses/entropy", "losses/policy_loss", "charts/success_rate", "charts/episodic_return"):
        assert inside[tag] == alone[tag], tag
    with open(os.path.join(only_run_dir(tmp_path / "with"), "eval.json")) as f:
        in_eval = json.load(f)["baselines"]["rl-only"]
    with open(os.path.join(only_run_dir(tmp_path / "alone"), "eval.json")) as f:
        alone_eval = json.load(f)
    assert in_eval["success_rate"] == alone_eval["success_rate"]
    assert {k: v for k, v in in_eval.items() if k.startswith("success_") and k != "success_rate"} == \
        {f"success_{k}": v for k, v in alone_eval["per_difficulty_success"].items()}


def test_resume_continues_from_checkpoint(tmp_path):
    run_script("--task", "pattern-echo", *TINY, "--checkpoint-every", "2", "--runs-dir", str(tmp_path))
    run_dir = only_run_dir(tmp_path)
    ckpt = os.path.join(run_dir, "checkpoint.pt")
    assert torch.load(ckpt, weights_only=False)["global_step"] == 64
    out = run_script("--task", "pattern-echo", *[f if f != "64" else "128" for f in TINY], "--resume", ckpt,
                     "--checkpoint-every", "2", "--runs-dir", str(tmp_path))
    assert "resumed from" in out.stdout and "global_step=64" in out.stdout
    assert torch.load(ckpt, weights_only=False)["global_step"] == 128
    # only --resume and --total-timesteps: every other setting is the checkpoint's (8 actions, 1 layer, no analysis),
    # not the defaults (16 actions, 2 layers, analysis on)
    out = run_script("--resume", ckpt, "--total-timesteps", "192")
    saved = torch.load(ckpt, weights_only=False)
    assert saved["global_step"] == 192 and saved["args"]["total_timesteps"] == 192
    assert (saved["args"]["num_actions"], saved["args"]["num_layers"], saved["args"]["analysis"]) == (8, 1, False)
    # a flag that disagrees with the checkpoint is refused in one line before any work, not silently taken or dropped
    for flags, needle in ((["--curriculum"], "--curriculum True differs from the checkpoint's False"),
                          (["--learning-rate", "0.01"], "--learning-rate 0.01 differs"),
                          (["--task", "sequence-next"], "--task 'sequence-next' differs")):
        refused = run_script("--resume", ckpt, *flags, check=False)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and needle in lines[0], refused.stderr
    assert torch.load(ckpt, weights_only=False)["global_step"] == 192
    # validated with the checkpoint's settings: one update is 16 env steps here (16 envs), 32 with the defaults,
    # so a budget of 16 is a valid budget for this run, not "less than one update"; but one the run has already
    # reached, with its eval.json written, so there is nothing left to resume: refused in one line
    eval_json = os.path.join(run_dir, "eval.json")
    written = os.path.getmtime(eval_json)
    for budget in ("16", "192"):
        refused = run_script("--resume", ckpt, "--total-timesteps", budget, check=False)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr
        assert lines[0].startswith("reinforce_baby.py: error: nothing to resume") and refused.stdout == ""
    assert os.path.getmtime(eval_json) == written
    args, error = rb.resumed_args(rb.Args(task="pattern-echo", num_actions=8, resume=ckpt), saved["args"],
                                  {"task", "num_actions", "resume"})
    assert error is None and args.hidden_dim == 32 and args.total_timesteps == 192
    assert "not a readable checkpoint" in rb.validate_args(rb.Args(num_actions=8, resume=os.path.join(run_dir, "eval.json")))
    # a checkpoint from before the per-level success windows were saved would restart them empty: refused
    old = torch.load(ckpt, weights_only=False)
    del old["recent_level"]
    torch.save(old, tmp_path / "old.pt")
    assert "older reinforce_baby" in rb.validate_args(rb.Args(task="pattern-echo", num_actions=8, hidden_dim=32,
                                                               num_layers=1, resume=str(tmp_path / "old.pt")))


@pytest.mark.parametrize("flags,needle", [
    (["--task", "pattern-echo", "--num-actions", "4"], "--num-actions 4"),
    (["--task", "conditional", "--curriculum", "--num-actions", "6"], "--num-actions 6"),
    (["--task", "juggling"], "unknown --task"),
    (["--parent", "llm"], "--llm-base-url"),
    (["--eval-only", "--model-path", "missing.cleanrl_model"], "--model-path"),
])
def test_bad_input_fails_with_one_line_before_any_work(tmp_path, flags, needle):
    out = run_script(*flags, "--runs-dir", str(tmp_path / "runs"), check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reinforce_baby.py: error: ") and needle in lines[0], out.stderr
    assert not (tmp_path / "runs").exists() and out.stdout == ""


@pytest.mark.parametrize("kwargs,needle", [
    ({"learning_rate": float("nan")}, "--learning-rate nan must be a finite number"),
    ({"baseline_decay": float("inf")}, "--baseline-decay inf must be a finite number"),
    ({"seed": -1}, "--seed -1 must be in [0, 2**32 - 1]"),
    ({"num_heads": 0}, "--num-heads must be >= 1"),  # was a ZeroDivisionError inside the check itself
    ({"print_every": 0}, "--print-every must be >= 1"),
    ({"algorithm": "ppo", "update_epochs": 0}, "--update-epochs must be >= 1"),
    ({"total_timesteps": 0}, "--total-timesteps 0 is less than one update"),
    ({"gamma": -1.0}, "--gamma -1.0 must be in (0, 1]"),
    ({"algorithm": "ppo", "gae_lambda": 2.0}, "--gae-lambda 2.0 must be in [0, 1]"),
    ({"baseline_decay": 2.0}, "--baseline-decay 2.0 must be in [0, 1)"),
    ({"mastery_threshold": 0.0}, "--mastery-threshold 0.0 must be in (0, 1]"),
    ({"clip_coef": 0.0}, "--clip-coef 0.0 must be positive"),
    ({"checkpoint_every": -1}, "--checkpoint-every -1 must be >= 0"),
    ({"llm_retries": -1}, "--llm-retries -1 must be >= 0"),
    ({"llm_timeout": 0.0}, "--llm-timeout 0.0 must be positive"),
    ({"llm_concurrency": 0}, "--llm-concurrency must be >= 1"),
    ({"algorithm": "ppo", "num_minibatches": 0}, "--num-minibatches must be >= 1"),  # was a ZeroDivisionError
    ({"analysis_samples": 0}, "--analysis-samples must be >= 2"),
    ({"model_path": "x.cleanrl_model"}, "--model-path is only read with --eval-only"),
    ({"parent": "llm", "llm_base_url": "notaurl"}, "must be an http:// or https:// URL"),
])
def test_meaningless_values_are_refused_by_validate_args(kwargs, needle):
    """Values that used to train silently (NaN, a budget of 0, a decay of 2, an LLM URL that every request fails on,
    so the whole run fell back to the rule) or crash after the run directory existed."""
    error = rb.validate_args(rb.Args(**{"num_actions": 8, **kwargs}))
    assert error is not None and needle in error, error
    assert rb.validate_args(rb.Args(num_actions=8)) is None


def test_foreign_model_files_and_llm_caches_are_refused_before_any_work(tmp_path):
    """--eval-only on an empty file or another script's model was an EOFError or KeyError, and an --llm-cache that
    is a directory or not an sqlite file an sqlite3 traceback after the run directory existed."""
    empty, foreign, junk = tmp_path / "empty.cleanrl_model", tmp_path / "ppo.cleanrl_model", tmp_path / "junk.sqlite"
    empty.write_bytes(b"")
    torch.save({"state_dict": {}, "args": {}}, foreign)  # what another script's --save-model writes
    junk.write_text("not a database, but long enough for sqlite to read its header " * 4)
    base = {"num_actions": 8}
    cases = [
        ({"eval_only": True, "model_path": str(empty)}, "is not a readable model file"),
        ({"eval_only": True, "model_path": str(foreign)}, "is not a reinforce_baby model"),
        ({"parent": "llm", "llm_base_url": "http://127.0.0.1:9/v1", "llm_cache": str(tmp_path)}, "is a directory"),
        ({"parent": "llm", "llm_base_url": "http://127.0.0.1:9/v1", "llm_cache": str(junk)},
         "is not an sqlite database"),
    ]
    for kwargs, needle in cases:
        error = rb.validate_args(rb.Args(**base, **kwargs))
        assert error is not None and needle in error, (kwargs, error)
    # a cache a run wrote, and a path not there yet, are fine
    rb.LLMParent(8, 1, "http://127.0.0.1:9/v1", "m", "", 1.0, 0, str(tmp_path / "ok.sqlite")).db.close()
    for cache in (tmp_path / "ok.sqlite", tmp_path / "new.sqlite"):
        assert rb.validate_args(rb.Args(**base, parent="llm", llm_base_url="http://127.0.0.1:9/v1",
                                        llm_cache=str(cache))) is None
    out = run_script("--eval-only", "--model-path", str(foreign), "--runs-dir", str(tmp_path / "runs"), check=False)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "not a reinforce_baby model" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_an_oversized_model_names_the_flag_that_made_it_so():
    """A long horizon grows the step-counter embedding, not the transformer: the message must not advise
    shrinking --hidden-dim for it."""
    error = rb.validate_args(rb.Args(max_episode_steps=100_000, total_timesteps=10**9, num_envs=1))
    assert "under 1M" in error and "--max-episode-steps" in error and "--hidden-dim" not in error, error
    error = rb.validate_args(rb.Args(hidden_dim=256, num_layers=4))
    assert "under 1M" in error and "--hidden-dim" in error and "--max-episode-steps" not in error, error


def test_num_actions_check_depends_on_the_levels_used():
    assert rb.validate_args(rb.Args(task="pattern-echo", num_actions=4, level=1)) is None
    assert "--num-actions 4" in rb.validate_args(rb.Args(task="pattern-echo", num_actions=4, level=2))
    assert rb.validate_args(dataclasses.replace(rb.Args(), num_actions=8, task="all", curriculum=True)) is None


# ------------------------------------------------------------------------- what train computes, step by step
class RecordingWriter:
    """Stands in for the SummaryWriter: every scalar train logs, in order."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, []).append(value)

    def flush(self):
        pass


def train_tiny(**overrides):
    """rb.train in-process on a tiny pattern-echo setting (16 envs, a 1-layer width-32 core); returns (agent, levels,
    the logged scalars)."""
    settings = dict(task="pattern-echo", num_actions=8, hidden_dim=32, num_layers=1, num_envs=16, total_timesteps=32,
                    checkpoint_every=0, print_every=10**9, seed=1)
    args = rb.Args(**{**settings, **overrides})
    args.batch_size = args.num_envs * args.max_episode_steps
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)
    rb.seed_everything(args.seed)
    writer = RecordingWriter()
    agent, levels = rb.train(args, "/nonexistent", writer)
    return agent, levels, writer.scalars


def test_a_correct_answer_before_the_time_limit_is_not_a_success():
    """Success is the answer at the episode's end (the time limit): an episode answered correctly at its first steps
    and wrongly at its last one failed. If this failed, `success` were set by any correct step, and training's
    `success |= info["success"]` would count such episodes (and the curriculum master levels) as successes."""
    parent = rb.DeterministicParent(8)
    env = rb.BabyEnv(parent, 50, 3, seed=0)
    states = env.reset(["pattern-echo"] * 50, [2] * 50)
    for t in range(3):
        right = [parent.oracle_action(s) for s in states]
        states, _, _, truncated, info = env.step(right if t < 2 else [(a + 1) % 8 for a in right])
        assert truncated.all() == (t == 2) and info["correct"].all() == (t < 2)
        assert not info["success"].any(), t


def test_reinforce_advantage_is_the_return_minus_the_baseline_of_earlier_batches(monkeypatch):
    """REINFORCE's advantage is G_t - b_t, b the running mean of the earlier batches' returns, and b is updated with
    this batch's returns only afterwards. If this failed, either nothing were subtracted (a noisier gradient), or b
    were updated first, so that it holds this batch's own returns (which depend on its actions: a biased gradient)."""
    returns_seen, advantages_seen = [], []
    real_returns, real_scale = rb.reinforce_returns, rb.scale_advantages

    def reinforce_returns(rewards, gamma):
        returns_seen.append(real_returns(rewards, gamma))
        return returns_seen[-1]

    def scale_advantages(adv, algorithm):
        advantages_seen.append(adv.detach().clone())
        return real_scale(adv, algorithm)

    monkeypatch.setattr(rb, "reinforce_returns", reinforce_returns)
    monkeypatch.setattr(rb, "scale_advantages", scale_advantages)
    decay = 0.8
    train_tiny(max_episode_steps=2, total_timesteps=96, baseline_decay=decay)
    assert len(returns_seen) == len(advantages_seen) == 3
    baseline = torch.zeros(2)
    for returns, adv in zip(returns_seen, advantages_seen):
        expected = (returns - baseline.unsqueeze(1)).reshape(-1)
        # the update's minibatch is a permutation of the batch
        assert torch.allclose(adv.sort().values, expected.sort().values, atol=1e-6)
        baseline = decay * baseline + (1 - decay) * returns.mean(1)
    assert baseline.abs().min() > 0.05  # a baseline that matters


def test_trains_world_model_loss_reaches_the_shared_representation(monkeypatch):
    """The world-model loss of train's update shapes the encoder and the transformer core (the plan's auxiliary
    objective): with every other loss term switched off, the gradient at the update reaches every parameter of both.
    If this failed, the world-model head were trained on a detached h and the representation learnt nothing from it."""
    agents, grads = [], []

    class Agent(rb.Agent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            agents.append(self)

    real_clip = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm):
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in agents[0].named_parameters()})
        return real_clip(parameters, max_norm)

    monkeypatch.setattr(rb, "Agent", Agent)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)
    # no rewards (so zero advantages), no entropy or KL term: the loss is world_model_coef * wm_loss alone
    train_tiny(goal_reward_weight=0.0, pred_reward_weight=0.0, cons_reward_weight=0.0, ent_coef=0.0)
    grad = grads[0]  # the first update's
    assert all(g is None or not g.any() for n, g in grad.items() if n.startswith(("action_head", "value_head")))
    shared = {n: g for n, g in grad.items() if n.startswith(("encoder.", "core."))}
    untouched = [n for n, g in shared.items() if g is None or not g.any()]
    assert len(shared) > 10 and not untouched, untouched


def test_curriculum_counts_an_episode_at_the_level_it_was_played(monkeypatch):
    """With --review-prob some episodes replay an easier, already mastered level: train records each episode with the
    level it was played at, so only episodes at the current level count towards mastering it. If this failed, easy
    review episodes would fill the current level's mastery window and level the task up unearned."""
    managers, played = [], []

    class Mastered(rb.CurriculumManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.levels = {t: rb.NUM_LEVELS - 1 for t in self.tasks}  # every lower level mastered: reviews happen
            managers.append(self)

    real_reset = rb.BabyEnv.reset

    def reset(self, tasks, levels):
        played.extend(levels)
        return real_reset(self, tasks, levels)

    monkeypatch.setattr(rb, "CurriculumManager", Mastered)
    monkeypatch.setattr(rb.BabyEnv, "reset", reset)
    train_tiny(curriculum=True, review_prob=0.5, mastery_window=1000, total_timesteps=64)
    (cm,) = managers
    at_current = played.count(rb.NUM_LEVELS - 1)
    assert len(played) == 64 and 10 < at_current < 54  # about half were reviews
    assert len(cm.history["pattern-echo"]) == at_current


def test_ppo_ratio_uses_the_stored_log_probs_and_the_value_target_is_advantage_plus_value(monkeypatch):
    """PPO's ratio is pi_new / pi_old with pi_old the rollout's stored log-probs: 1 on the first minibatch of the first
    epoch (nothing has changed yet), and no longer 1 once earlier minibatches have updated the policy. The value head's
    target is the GAE advantage plus the rollout's value. If this failed, the ratio were always 1 (no clipping: plain
    policy gradient over several epochs), or the value head regressed onto the advantages."""
    seen = []
    real_gae = rb.gae

    def gae(rewards, values, gamma, lam):
        seen.append((values.clone(), real_gae(rewards, values, gamma, lam)))
        return seen[-1][1]

    monkeypatch.setattr(rb, "gae", gae)
    # one epoch of one minibatch: the logged approx_kl and value loss are those of the very first minibatch
    _, _, first = train_tiny(algorithm="ppo", max_episode_steps=2, update_epochs=1, num_minibatches=1)
    ((values, adv),) = seen
    assert abs(first["losses/approx_kl"][0]) < 1e-8  # ratio 1: the stored log-probs are the policy's own
    # the value head still gives the rollout's values, so the loss is 0.5 mean (returns - values)^2
    assert first["losses/value_loss"][0] == pytest.approx(0.5 * adv.pow(2).mean().item(), rel=1e-4)
    assert abs(0.5 * (values[:2] - adv).pow(2).mean().item() - first["losses/value_loss"][0]) > 0.01
    # four epochs of two minibatches: the last minibatch is scored against the rollout's policy, which has moved
    _, _, later = train_tiny(algorithm="ppo", max_episode_steps=2, update_epochs=4, num_minibatches=2)
    assert later["losses/approx_kl"][0] > 1e-6


def test_prediction_reward_scores_the_world_model_against_the_next_state(monkeypatch):
    """The rollout's prediction reward is exp(-MSE) of the world model's prediction against the state the action led
    to (obs[t + 1]). If this failed, it were scored against the current state, rewarding a model that predicts that
    nothing happens."""
    targets, next_states = [], []
    real_reward, real_step = rb.prediction_reward, rb.BabyEnv.step

    def prediction_reward(pred, target):
        targets.append(target.clone())
        return real_reward(pred, target)

    def step(self, actions):
        out = real_step(self, actions)
        next_states.append(rb.states_to_tensor(out[0]))
        return out

    monkeypatch.setattr(rb, "prediction_reward", prediction_reward)
    monkeypatch.setattr(rb.BabyEnv, "step", step)
    train_tiny(max_episode_steps=2, total_timesteps=64)
    assert len(targets) == len(next_states) == 4
    for target, nxt in zip(targets, next_states):
        assert torch.equal(target, nxt.float())
