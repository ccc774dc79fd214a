"""Tests for cleanrl_astral/reinforce_baby.py: environment rules, model, what train computes step by step, curriculum,
evaluation, runs and bad input. The LLM parent's tests are in test_reinforce_baby_llm.py."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import SCRIPT_ENV, assert_one_line_error, logged_scalars, only_run_dir, run_script

import cleanrl_astral.reinforce_baby as reinforce_baby

TINY = [
    "--num-actions",
    "8",
    "--hidden-dim",
    "32",
    "--num-layers",
    "1",
    "--num-envs",
    "16",
    "--total-timesteps",
    "64",
    "--eval-episodes",
    "8",
    "--no-analysis",
]


def assert_refused(result, needle):
    """One line on stderr, `reinforce_baby.py: error: ...` with needle, exit code 2, and nothing on stdout."""
    assert_one_line_error(result, needle)
    assert result.stderr.startswith("reinforce_baby.py: error: ") and result.stdout == ""


def refusal(args):
    """The one-line message validate(args) raises (fails if it accepts args)."""
    with pytest.raises(ValueError) as refused:
        reinforce_baby.validate(args)
    message = str(refused.value)
    assert "\n" not in message, message
    return message


class RecordingWriter:
    """Stands in for the SummaryWriter: every scalar train logs, in order."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, []).append(value)


def train_tiny(parent=None, **overrides):
    """reinforce_baby.train in-process on a tiny pattern-echo setting (16 envs, a 1-layer width-32 core); returns (agent,
    levels, the logged scalars)."""
    settings = dict(task="pattern-echo", num_actions=8, hidden_dim=32, num_layers=1, num_envs=16, total_timesteps=32, seed=1)
    args = reinforce_baby.Args(**{**settings, **overrides})
    args.batch_size = args.num_envs * args.max_episode_steps
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)
    reinforce_baby.seed_everything(args.seed)
    writer = RecordingWriter()
    agent, levels = reinforce_baby.train(args, writer, parent)
    return agent, levels, writer.scalars


# --------------------------------------------------------------------------------------------------- environment


def test_oracle_gets_reward_one_on_every_task_and_level():
    parent = reinforce_baby.DeterministicParent(8)
    for task in reinforce_baby.TASKS:
        for level in range(reinforce_baby.NUM_LEVELS):
            env = reinforce_baby.BabyEnv(parent, 300, 1, seed=level)
            states = env.reset([task] * 300, [level] * 300)
            oracle = [parent.oracle_action(s) for s in states]
            assert all(0 <= a < reinforce_baby.DIFFICULTY_CONFIGS[task][level]["num_symbols"] for a in oracle)
            _, rewards, _, _, info = env.step(oracle)
            assert np.all(rewards == 1.0) and info["success"].all(), (task, level)


def test_random_policy_gets_one_over_num_actions():
    for num_actions in (8, 16):
        parent = reinforce_baby.DeterministicParent(num_actions)
        env = reinforce_baby.BabyEnv(parent, 20000, 1, seed=3)
        env.reset(["pattern-echo"] * 20000, [2] * 20000)
        actions = np.random.default_rng(0).integers(0, num_actions, 20000).tolist()
        _, rewards, _, _, _ = env.step(actions)
        # the std of the mean is about 0.0023 at 1/8: 0.012 is five of them
        assert abs(rewards.mean() - 1.0 / num_actions) < 0.012, (num_actions, rewards.mean())


def test_episode_ends_only_on_time_limit():
    parent = reinforce_baby.DeterministicParent(8)
    env = reinforce_baby.BabyEnv(parent, 64, 3, seed=0)
    states = env.reset(["conditional"] * 64, [1] * 64)
    for t in range(1, 4):
        # the oracle answers correctly from the first step: success must not end the episode
        states, rewards, terminated, truncated, _ = env.step([parent.oracle_action(s) for s in states])
        assert np.all(rewards == 1.0)
        assert not terminated.any()
        assert truncated.all() == (t == 3) and truncated.any() == (t == 3)
        assert all(s.step == t for s in states)


def test_success_is_tracked_apart_from_reward():
    class GenerousParent(reinforce_baby.DeterministicParent):
        def judge(self, s, action):
            return 1.0

    parent = GenerousParent(8)
    env = reinforce_baby.BabyEnv(parent, 200, 2, seed=1)
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


def test_a_correct_answer_before_the_time_limit_is_not_a_success():
    """Success is the answer at the episode's end (the time limit): an episode answered correctly at its first steps
    and wrongly at its last one failed. If this failed, `success` were set by any correct step, and training's
    `success |= info["success"]` would count such episodes (and the curriculum master levels) as successes."""
    parent = reinforce_baby.DeterministicParent(8)
    env = reinforce_baby.BabyEnv(parent, 50, 3, seed=0)
    states = env.reset(["pattern-echo"] * 50, [2] * 50)
    for t in range(3):
        right = [parent.oracle_action(s) for s in states]
        states, _, _, truncated, info = env.step(right if t < 2 else [(a + 1) % 8 for a in right])
        assert truncated.all() == (t == 2) and info["correct"].all() == (t < 2)
        assert not info["success"].any(), t


def test_state_tensor_rule_text_and_shown_attributes():
    parent = reinforce_baby.DeterministicParent(16)
    rng = np.random.default_rng(0)
    vocab = reinforce_baby.attribute_vocab(16, 1)
    for task in reinforce_baby.TASKS:
        s = parent.new_instance(task, 2, rng)
        x = reinforce_baby.states_to_tensor([s])[0]
        assert x.shape == (reinforce_baby.STATE_DIM,) and x.dtype == torch.long
        assert all(0 <= int(v) < k for v, k in zip(x, vocab))
        assert x.tolist() == s.as_list()
    # the rule in plain words and only the attributes the rule reads (the transcripts' and the LLM prompts' words)
    echo = parent.new_instance("pattern-echo", 2, rng)
    assert (
        echo.rule_text() == reinforce_baby.LLM_RULES["pattern-echo"] and echo.shown_attributes() == f"cue = {echo.values[0]}"
    )
    seq = reinforce_baby.State(1, 0, (3, 4, 16), (2, 2, 2), 16, 2, 0, 16)
    assert seq.shown_attributes() == "sequence = 3, 4"
    cond = reinforce_baby.State(2, 0, (5, 6, 16), (1, 2, 2), 16, 2, 0, 16)  # level 0: if f0 then v0 else v1
    assert cond.rule_text() == reinforce_baby.LLM_RULES["if"] and cond.shown_attributes() == "f0 = 1, v0 = 5, v1 = 6"


def test_reward_vector_and_consistency():
    parent = reinforce_baby.DeterministicParent(8)
    s0 = parent.new_instance("pattern-echo", 2, np.random.default_rng(0))
    right, wrong = parent.oracle_action(s0), (parent.oracle_action(s0) + 1) % 8
    approved, rejected = parent.transition(s0, right, 1.0), parent.transition(s0, wrong, 0.0)
    cons = reinforce_baby.consistency_reward([s0, approved, approved, rejected, rejected], [wrong, right, wrong, wrong, right])
    assert cons.tolist() == [0.0, 1.0, -1.0, -1.0, 1.0]
    rv = reinforce_baby.RewardVector(np.array([1.0, 0.0]), np.array([0.5, 0.5]), np.array([1.0, -1.0]))
    assert np.allclose(rv.total(1.0, 0.1, 0.2), [1.25, -0.15])


# --------------------------------------------------------------------------------------------------------- model


def make_agent():
    torch.manual_seed(0)
    return reinforce_baby.Agent(8, 3, 32, 2, 4)


def test_world_model_predicts_the_raw_next_state_tensor():
    agent = make_agent()
    parent = reinforce_baby.DeterministicParent(8)
    env = reinforce_baby.BabyEnv(parent, 5, 3, seed=0)
    states = env.reset(["sequence-next"] * 5, [1] * 5)
    actions = [1, 2, 3, 4, 5]
    next_states, _, _, _, _ = env.step(actions)
    nx = reinforce_baby.states_to_tensor(next_states)
    target = nx.float()
    assert target.shape == (5, reinforce_baby.STATE_DIM)
    assert nx[:, reinforce_baby.ATTRIBUTES.index("last_action")].tolist() == actions
    pred = agent.world_model(agent.embed(reinforce_baby.states_to_tensor(states)), torch.tensor(actions))
    assert pred.shape == target.shape


def test_gradients_reach_every_parameter():
    agent = make_agent()
    parent = reinforce_baby.DeterministicParent(8)
    env = reinforce_baby.BabyEnv(parent, 32, 3, seed=0)
    states = env.reset(["conditional"] * 32, [2] * 32)
    x = reinforce_baby.states_to_tensor(states)
    action, logprob, entropy, value, h, logits = agent.get_action_and_value(x)
    nx = reinforce_baby.states_to_tensor(env.step(action.tolist())[0])
    wm_loss = torch.nn.functional.mse_loss(agent.world_model(h, action), nx.float())
    wm_loss.backward(retain_graph=True)
    # the world-model loss alone shapes the shared representation (encoder and core), not the policy head
    for name, p in agent.named_parameters():
        touched = p.grad is not None and p.grad.abs().sum() > 0
        assert touched == (not name.startswith(("action_head", "value_head"))), name
    agent.zero_grad()
    loss = -(logprob * torch.randn(32)).mean() - 0.01 * entropy.mean() + value.pow(2).mean() + wm_loss
    loss = loss + reinforce_baby.kl_to_parent(logits, torch.zeros(32, dtype=torch.long), 0.1)
    loss.backward()
    for name, p in agent.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# ------------------------------------------------------------------------------------------- what train computes


def test_returns_gae_and_kl(forward_gae):
    r = torch.tensor([[1.0], [0.0], [1.0]])
    assert torch.allclose(reinforce_baby.reinforce_returns(r, 0.5), torch.tensor([[1.25], [0.5], [1.0]]))
    values = torch.tensor([[0.5], [0.5], [0.5], [0.0]])
    adv = reinforce_baby.gae(r, values, 1.0, 1.0)
    assert torch.allclose(adv + values[:3], torch.tensor([[2.0], [1.0], [1.0]]))
    # gamma and lambda below 1 each show, and values[T] enters the last step's delta as given (the script passes 0)
    values = torch.tensor([[0.5, -1.0], [0.2, 0.3], [0.8, 2.0], [0.4, -0.6]])
    r2 = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, -1.0]])
    adv = reinforce_baby.gae(r2, values, 0.9, 0.5)
    for n in range(2):
        expected = forward_gae(r2[:, n].tolist(), values[:, n].tolist(), [1.0, 1.0, 1.0], 0.9, 0.5)
        assert adv[:, n].tolist() == pytest.approx(expected, rel=1e-6)
    logits = torch.zeros(1, 4)
    assert reinforce_baby.kl_to_parent(logits, torch.tensor([2]), 1.0).abs() < 1e-6  # full smoothing = uniform = pi
    assert reinforce_baby.kl_to_parent(logits, torch.tensor([2]), 0.0) == pytest.approx(np.log(4), abs=1e-5)


def test_reinforce_advantages_are_scaled_only_when_the_returns_differ():
    """REINFORCE's advantages are return - running baseline, already centred: they are divided by their std, except
    when every return in the batch is equal (all 0/1 episodes succeeded or all failed), where the std is 0 and the
    division would blow them up by 1e8. PPO's are centred and scaled as usual."""
    same = torch.full((32,), 0.7)
    assert torch.equal(reinforce_baby.scale_advantages(same), same)
    mixed = torch.tensor([0.5, -0.5, 0.5, 1.5])
    assert torch.allclose(reinforce_baby.scale_advantages(mixed), mixed / mixed.std(), rtol=1e-6)
    ppo = reinforce_baby.normalize_advantages(mixed)
    assert ppo.mean().abs() < 1e-6 and ppo.std() == pytest.approx(1.0, abs=1e-5)


def test_reinforce_with_0_1_returns_keeps_its_policy_loss_bounded(tmp_path):
    """Without the prediction reward, pattern-echo's returns are 0 or 1, and once the task is learnt whole batches
    succeed: the policy loss must stay of order one, not jump to ~1e5 with the entropy collapsing."""
    run_script(
        "reinforce_baby",
        "--task",
        "pattern-echo",
        "--num-actions",
        "8",
        "--world-model-coef",
        "0",
        "--pred-reward-weight",
        "0",
        "--total-timesteps",
        "6400",
        "--eval-episodes",
        "8",
        "--no-analysis",
        "--runs-dir",
        str(tmp_path),
        check=True,
    )
    scalars = logged_scalars(only_run_dir(tmp_path))
    losses = [abs(v) for _, v in scalars["losses/policy_loss"]]
    assert len(losses) == 200 and max(losses) < 50, max(losses)
    assert scalars["charts/success_rate"][-1][1] > 0.9


def test_reinforce_learns_pattern_echo_quickly():
    agent, levels, scalars = train_tiny(hidden_dim=64, num_layers=2, num_envs=32, total_timesteps=3200)
    result = reinforce_baby.Evaluator(["pattern-echo"], 8, 1, 400, 5).run(agent.eval(), levels)
    assert result["success_rate"] > 0.6, result  # random is 0.125
    ent = scalars["losses/entropy"]
    assert np.mean(ent[-10:]) < np.mean(ent[:10])


@pytest.mark.parametrize("order", ["after", "before"])
def test_reinforce_advantage_is_the_return_minus_the_baseline_of_earlier_batches(monkeypatch, order):
    """REINFORCE's advantage is G_t - b_t, b the running mean of the earlier batches' returns, and b is updated with
    this batch's returns only afterwards. If this failed, either nothing were subtracted (a noisier gradient), or b
    were updated first, so that it holds this batch's own returns (which depend on its actions: a biased gradient).
    --baseline-update before is the plan's order: b takes this batch's returns in first, and the advantage is G_t minus
    that b; either order fails the other's expectation."""
    returns_seen, advantages_seen = [], []
    real_returns, real_scale = reinforce_baby.reinforce_returns, reinforce_baby.scale_advantages

    def reinforce_returns(rewards, gamma):
        returns_seen.append(real_returns(rewards, gamma))
        return returns_seen[-1]

    def scale_advantages(adv):
        advantages_seen.append(adv.detach().clone())
        return real_scale(adv)

    monkeypatch.setattr(reinforce_baby, "reinforce_returns", reinforce_returns)
    monkeypatch.setattr(reinforce_baby, "scale_advantages", scale_advantages)
    decay = 0.8
    train_tiny(max_episode_steps=2, total_timesteps=96, baseline_decay=decay, baseline_update=order)
    assert len(returns_seen) == len(advantages_seen) == 3
    baseline = torch.zeros(2)
    for returns, adv in zip(returns_seen, advantages_seen):
        updated = decay * baseline + (1 - decay) * returns.mean(1)
        against = {"after": baseline, "before": updated}[order]
        expected = (returns - against.unsqueeze(1)).reshape(-1)
        # the update's minibatch is a permutation of the batch
        assert torch.allclose(adv.sort().values, expected.sort().values, atol=1e-6)
        baseline = updated
    assert baseline.abs().min() > 0.05  # a baseline that matters


@pytest.mark.parametrize("max_grad_norm", [0.5, 0.0])
def test_the_gradient_is_clipped_at_max_grad_norm_and_not_at_all_with_0(monkeypatch, max_grad_norm):
    """Every update clips the gradient norm at --max-grad-norm (0.5 by default); --max-grad-norm 0 (the plan's
    REINFORCE) clips nothing, rather than zeroing the gradient, and the weights still move."""
    calls = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(parameters, max_norm, *a, **kw):
        calls.append(max_norm)
        return real_clip(parameters, max_norm, *a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    reinforce_baby.seed_everything(1)
    before = [
        p.detach().clone()
        for p in reinforce_baby.build_agent(reinforce_baby.Args(num_actions=8, hidden_dim=32, num_layers=1)).parameters()
    ]
    agent, _, _ = train_tiny(total_timesteps=48, max_grad_norm=max_grad_norm)
    assert calls == [0.5] * 3 * (max_grad_norm > 0)
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters()))


@pytest.mark.parametrize("eps", [1e-5, 1e-8])
def test_adams_epsilon_is_adam_eps(monkeypatch, eps):
    """The one optimizer train builds is Adam with --adam-eps (1e-5 by default; the plan's is PyTorch's 1e-8)."""
    built = []
    real_adam = torch.optim.Adam

    class RecordingAdam(real_adam):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built.append(self)

    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)
    train_tiny(adam_eps=eps)
    assert [opt.param_groups[0]["eps"] for opt in built] == [eps]
    assert reinforce_baby.Args().adam_eps == 1e-5


def test_world_model_loss_of_the_update_reaches_the_shared_representation(monkeypatch):
    """The world-model loss of train's update shapes the encoder and the transformer core (the plan's auxiliary
    objective): with every other loss term switched off, the gradient at the update reaches every parameter of both.
    If this failed, the world-model head were trained on a detached h and the representation learnt nothing from it."""
    agents, grads = [], []

    class Agent(reinforce_baby.Agent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            agents.append(self)

    real_clip = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm):
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in agents[0].named_parameters()})
        return real_clip(parameters, max_norm)

    monkeypatch.setattr(reinforce_baby, "Agent", Agent)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)
    # no rewards (so zero advantages), no entropy or KL term: the loss is world_model_coef * wm_loss alone
    train_tiny(goal_reward_weight=0.0, pred_reward_weight=0.0, cons_reward_weight=0.0, ent_coef=0.0)
    grad = grads[0]  # the first update's
    assert all(g is None or not g.any() for n, g in grad.items() if n.startswith(("action_head", "value_head")))
    shared = {n: g for n, g in grad.items() if n.startswith(("encoder.", "core."))}
    untouched = [n for n, g in shared.items() if g is None or not g.any()]
    assert len(shared) > 10 and not untouched, untouched


def test_world_model_loss_pairs_each_state_and_action_with_its_own_next_state(monkeypatch):
    """The update's world-model loss compares the prediction from (s_t, a_t) with s_{t+1} of the same episode, row by
    row of the shuffled batch. If this failed, the target were the current state s_t (a model that learns that nothing
    happens), or the rows of states, actions and next states were out of step."""
    taken, next_states, perms, targets, wm_actions = [], [], [], [], []
    real_step, real_mse, real_wm = (
        reinforce_baby.BabyEnv.step,
        reinforce_baby.F.mse_loss,
        reinforce_baby.WorldModelHead.forward,
    )
    real_randperm = torch.randperm

    def step(self, actions):
        out = real_step(self, actions)
        taken.append(torch.tensor(actions))
        next_states.append(reinforce_baby.states_to_tensor(out[0]))
        return out

    def randperm(n, *args, **kwargs):
        perms.append(real_randperm(n, *args, **kwargs))
        return perms[-1]

    def mse_loss(prediction, target, *args, **kwargs):
        targets.append(target.clone())
        return real_mse(prediction, target, *args, **kwargs)

    def world_model(self, h, action):
        wm_actions.append(action.clone())
        return real_wm(self, h, action)

    monkeypatch.setattr(reinforce_baby.BabyEnv, "step", step)
    monkeypatch.setattr(torch, "randperm", randperm)
    monkeypatch.setattr(reinforce_baby.F, "mse_loss", mse_loss)
    monkeypatch.setattr(reinforce_baby.WorldModelHead, "forward", world_model)
    train_tiny(max_episode_steps=2, total_timesteps=32)  # one update of 16 episodes x 2 steps
    (perm,) = [p for p in perms if len(p) == 32]
    (target,) = [t for t in targets if len(t) == 32]  # the rollout's prediction-reward calls have 16 rows
    (action,) = [a for a in wm_actions if len(a) == 32]
    assert torch.equal(target, torch.cat(next_states)[perm].float())
    assert torch.equal(action, torch.cat(taken)[perm])
    # s_{t+1} differs from s_t in every row (the step counter), so the current state cannot pass for the next
    assert not torch.equal(
        torch.cat(next_states)[:, reinforce_baby.ATTRIBUTES.index("step")], torch.zeros(32, dtype=torch.long)
    )


def test_prediction_reward_scores_the_world_model_against_the_next_state(monkeypatch):
    """The rollout's prediction reward is exp(-MSE) of the world model's prediction against the state the action led
    to (obs[t + 1]). If this failed, it were scored against the current state, rewarding a model that predicts that
    nothing happens."""
    targets, next_states = [], []
    real_reward, real_step = reinforce_baby.prediction_reward, reinforce_baby.BabyEnv.step

    def prediction_reward(pred, target):
        targets.append(target.clone())
        return real_reward(pred, target)

    def step(self, actions):
        out = real_step(self, actions)
        next_states.append(reinforce_baby.states_to_tensor(out[0]))
        return out

    monkeypatch.setattr(reinforce_baby, "prediction_reward", prediction_reward)
    monkeypatch.setattr(reinforce_baby.BabyEnv, "step", step)
    train_tiny(max_episode_steps=2, total_timesteps=64)
    assert len(targets) == len(next_states) == 4
    for target, nxt in zip(targets, next_states):
        assert torch.equal(target, nxt.float())


def test_consistency_reward_judges_each_action_against_the_verdict_it_was_taken_after(monkeypatch):
    """reward/cons is computed on the state the action was taken in: its last_action and last_correct are the previous
    answer and its verdict, so an episode's first step earns 0. If this failed, it were computed on the state the
    action led to, whose last_action is the action itself: +1 for any correct answer and -1 for any wrong one, a second
    goal reward instead of a consistency reward."""
    acted = []
    real_step = reinforce_baby.BabyEnv.step

    def step(self, actions):
        acted.append((list(self.states), list(actions)))
        return real_step(self, actions)

    monkeypatch.setattr(reinforce_baby.BabyEnv, "step", step)
    _, _, one_step = train_tiny(max_episode_steps=1, total_timesteps=32)
    assert one_step["reward/cons"] == [0.0, 0.0]
    acted.clear()
    _, _, two_steps = train_tiny(max_episode_steps=2, total_timesteps=64)
    assert len(acted) == 4
    expected = [float(sum(reinforce_baby.consistency_reward(s, a) for s, a in acted[u : u + 2]).mean()) for u in (0, 2)]
    assert two_steps["reward/cons"] == pytest.approx(expected, abs=1e-6)
    assert any(v != 0.0 for v in expected)  # the second step's answers do count


def test_entropy_term_is_a_bonus_that_keeps_an_untrained_policy_near_uniform():
    """The loss subtracts ent_coef * entropy: with no reward and no world-model term, the updates can only keep the
    (initially near-uniform) policy's entropy at its maximum log(num_actions). If this failed, the entropy term were a
    penalty and the updates would collapse the policy onto arbitrary symbols."""
    _, _, scalars = train_tiny(
        goal_reward_weight=0.0,
        pred_reward_weight=0.0,
        cons_reward_weight=0.0,
        world_model_coef=0.0,
        ent_coef=0.5,
        total_timesteps=16 * 20,
    )
    entropy = scalars["losses/entropy"]
    assert len(entropy) == 20 and entropy[0] > np.log(8) - 0.01
    assert min(entropy) > np.log(8) - 0.01


def test_ppo_ratio_uses_the_stored_log_probs_and_the_value_target_is_advantage_plus_value(monkeypatch):
    """PPO's ratio is pi_new / pi_old with pi_old the rollout's stored log-probs: 1 on the first minibatch of the first
    epoch (nothing has changed yet), and no longer 1 once earlier minibatches have updated the policy. The value head's
    target is the GAE advantage plus the rollout's value. If this failed, the ratio were always 1 (no clipping: plain
    policy gradient over several epochs), or the value head regressed onto the advantages."""
    seen = []
    real_gae = reinforce_baby.gae

    def gae(rewards, values, gamma, lam):
        seen.append((values.clone(), real_gae(rewards, values, gamma, lam)))
        return seen[-1][1]

    monkeypatch.setattr(reinforce_baby, "gae", gae)
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


def test_ppo_bootstraps_the_value_after_the_time_limit_only_when_asked(monkeypatch):
    """By default nothing is earned after the time limit: GAE gets values[T] = 0. With --bootstrap-time-limit it gets
    V(obs[T]), the value head's estimate of the state the last action led to, and the rest of the rollout is the same
    (the value is read without drawing from the random stream)."""
    rollouts = []
    for bootstrap in (False, True):
        args = reinforce_baby.Args(task="pattern-echo", num_actions=8, hidden_dim=32, num_layers=1, num_envs=16)
        args.algorithm = "ppo"
        args.max_episode_steps = 2
        args.bootstrap_time_limit = bootstrap
        reinforce_baby.seed_everything(1)
        agent = reinforce_baby.build_agent(args)
        env = reinforce_baby.BabyEnv(reinforce_baby.DeterministicParent(8), args.num_envs, args.max_episode_steps, 1)
        curriculum = reinforce_baby.make_curriculum(args, ["pattern-echo"])
        rollouts.append((agent, reinforce_baby.collect_rollout(agent, env, curriculum, args, "cpu")))
    (_, plain), (agent, boot) = rollouts
    assert torch.equal(plain.values[:2], boot.values[:2]) and torch.equal(plain.obs, boot.obs)
    assert torch.equal(plain.values[2], torch.zeros(16))
    with torch.no_grad():
        assert torch.allclose(boot.values[2], agent.get_value(boot.obs[2]))
    assert boot.values[2].abs().min() > 0
    # the last step's advantage moves by gamma * V(obs[T]) (lambda enters the earlier steps only through it)
    rewards = torch.ones(2, 16)
    adv_plain = reinforce_baby.gae(rewards, plain.values, 0.99, 0.95)
    adv_boot = reinforce_baby.gae(rewards, boot.values, 0.99, 0.95)
    assert torch.allclose(adv_boot[1] - adv_plain[1], 0.99 * boot.values[2])
    # and train passes the rollout's values to GAE as they are: 0 at T by default
    seen = []
    real_gae = reinforce_baby.gae
    monkeypatch.setattr(reinforce_baby, "gae", lambda r, v, g, lam: seen.append(v.clone()) or real_gae(r, v, g, lam))
    train_tiny(algorithm="ppo", max_episode_steps=2, total_timesteps=32)
    train_tiny(algorithm="ppo", max_episode_steps=2, total_timesteps=32, bootstrap_time_limit=True)
    assert torch.equal(seen[0][2], torch.zeros(16)) and seen[1][2].abs().min() > 0


def test_bootstrap_time_limit_is_refused_without_a_value_to_bootstrap():
    error = refusal(reinforce_baby.Args(bootstrap_time_limit=True))
    assert error == "--bootstrap-time-limit is for --algorithm ppo: reinforce has no value to bootstrap"
    reinforce_baby.validate(reinforce_baby.Args(bootstrap_time_limit=True, algorithm="ppo"))


# ---------------------------------------------------------------------------------------------------- curriculum


def test_curriculum_advances_on_mastery_and_not_before():
    cm = reinforce_baby.CurriculumManager(["pattern-echo", "conditional"], True, 2, threshold=0.9, window=10)
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
    replaying = reinforce_baby.CurriculumManager(["pattern-echo"], True, 2, 0.9, 10, review_prob=0.25)
    replaying.levels["pattern-echo"] = 2
    drawn = np.array([replaying.sample_level("pattern-echo", rng) for _ in range(4000)])
    assert set(drawn.tolist()) == {0, 1, 2} and abs((drawn < 2).mean() - 0.25) < 0.03
    assert {cm.sample_level("conditional", rng) for _ in range(100)} == {0}  # nothing mastered yet
    fixed = reinforce_baby.CurriculumManager(["conditional"], False, 1, 0.9, 10, review_prob=0.5)
    assert {fixed.sample_level("conditional", rng) for _ in range(100)} == {1}
    for _ in range(30):
        assert not fixed.record("conditional", 1, True)
    assert fixed.levels == {"conditional": 1}


def test_curriculum_levels_up_when_the_success_rate_reaches_the_threshold_exactly():
    """Mastery is a success rate over the window of at least --mastery-threshold: 9 successes in a window of 10 reach
    0.9. If this failed, the rule were "above the threshold" and a threshold of 1.0 could never be met."""
    cm = reinforce_baby.CurriculumManager(["pattern-echo"], True, 2, threshold=0.9, window=10)
    assert not cm.record("pattern-echo", 0, False)
    for _ in range(8):
        assert not cm.record("pattern-echo", 0, True)
    assert cm.record("pattern-echo", 0, True) and cm.levels["pattern-echo"] == 1
    perfect = reinforce_baby.CurriculumManager(["pattern-echo"], True, 2, threshold=1.0, window=5)
    assert [perfect.record("pattern-echo", 0, True) for _ in range(5)] == [False] * 4 + [True]


class ApprovingParent(reinforce_baby.DeterministicParent):
    """A parent that rewards every answer, right or wrong."""

    def respond(self, states, actions):
        return [(1.0, self.transition(s, a, 1.0)) for s, a in zip(states, actions)]


def test_the_plans_curriculum_counts_the_parents_reward_over_100_episodes_without_review(monkeypatch):
    """--curriculum-rule plan: a parent that approves every answer moves an untrained baby up one level per 100
    episodes at its level (the window fills at the 100th: update 7 of 16 episodes; level 1 from update 8 fills it in
    update 14), and every episode is played at the current level. The mastery rule counts the rule's verdict, so the
    same baby stays at level 0."""
    played = []
    real_reset = reinforce_baby.BabyEnv.reset

    def reset(self, tasks, levels):
        played.append(list(levels))
        return real_reset(self, tasks, levels)

    monkeypatch.setattr(reinforce_baby.BabyEnv, "reset", reset)
    plan = dict(curriculum=True, curriculum_rule="plan", total_timesteps=16 * 14)
    _, levels, scalars = train_tiny(ApprovingParent(8), **plan)
    assert levels == {"pattern-echo": 2}
    level = scalars["curriculum/level_pattern-echo"]
    assert level.index(1) == 6 and level.index(2) == 13  # after updates 7 and 14
    assert played == [[level_at] * 16 for level_at in [0] + level[:-1]]
    _, levels, _ = train_tiny(ApprovingParent(8), curriculum=True, total_timesteps=16 * 14)
    assert levels == {"pattern-echo": 0}


def test_the_plans_curriculum_is_one_flag_with_its_own_settings():
    assert "--curriculum" in refusal(reinforce_baby.Args(curriculum_rule="plan"))
    assert "--mastery-" in refusal(reinforce_baby.Args(curriculum=True, curriculum_rule="plan", mastery_window=50))
    reinforce_baby.validate(reinforce_baby.Args(curriculum=True, curriculum_rule="plan"))


def test_curriculum_counts_an_episode_at_the_level_it_was_played(monkeypatch):
    """With --review-prob some episodes replay an easier, already mastered level: train records each episode with the
    level it was played at, so only episodes at the current level count towards mastering it. If this failed, easy
    review episodes would fill the current level's mastery window and level the task up unearned."""
    managers, played = [], []

    class Mastered(reinforce_baby.CurriculumManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.levels = {t: reinforce_baby.NUM_LEVELS - 1 for t in self.tasks}  # every lower level mastered: reviews happen
            managers.append(self)

    real_reset = reinforce_baby.BabyEnv.reset

    def reset(self, tasks, levels):
        played.extend(levels)
        return real_reset(self, tasks, levels)

    monkeypatch.setattr(reinforce_baby, "CurriculumManager", Mastered)
    monkeypatch.setattr(reinforce_baby.BabyEnv, "reset", reset)
    train_tiny(curriculum=True, review_prob=0.5, mastery_window=1000, total_timesteps=64)
    (cm,) = managers
    at_current = played.count(reinforce_baby.NUM_LEVELS - 1)
    assert len(played) == 64 and 10 < at_current < 54  # about half were reviews
    assert len(cm.history["pattern-echo"]) == at_current


# ---------------------------------------------------------------------------------------------------- evaluation


def test_evaluation_headline_is_the_success_at_each_tasks_evaluation_level():
    """Evaluator's success_rate is the mean over tasks of the success at that task's evaluation level (the level the
    run reached or was set to), not at any other. If this failed, the headline reported an easier level's success."""
    levels = {"pattern-echo": 2, "conditional": 1}
    result = reinforce_baby.Evaluator(list(levels), 8, 1, 100, 3).run(None, levels)
    per = result["per_difficulty_success"]
    assert result["success_rate"] == pytest.approx((per["pattern-echo/level2"] + per["conditional/level1"]) / 2)
    # the levels' successes differ, so the headline of another level cannot match
    assert len({per[f"pattern-echo/level{k}"] for k in range(3)}) == 3


def test_evaluation_is_greedy_and_reproducible():
    """Evaluator.run (the script's final evaluation) acts greedily: the same agent gives the same result whatever the
    global torch RNG holds. If this failed, the actions were sampled and eval.json changed from one evaluation of the
    same model to the next."""
    torch.manual_seed(0)
    agent = reinforce_baby.Agent(8, 1, 32, 1, 4).eval()
    evaluator = reinforce_baby.Evaluator(["pattern-echo"], 8, 1, 100, 5)
    levels = {"pattern-echo": 2}
    results = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        results.append(evaluator.run(agent, levels))
    # an untrained policy is near uniform: actions sampled from the global generator would differ between the seeds
    assert results[0] == results[1]


# ---------------------------------------------------------------------------------------------- runs and outputs


@pytest.mark.parametrize(
    "task,algorithm,extra",
    [
        ("pattern-echo", "reinforce", []),
        ("sequence-next", "ppo", []),
        ("conditional", "reinforce", ["--max-episode-steps", "3"]),
        ("all", "ppo", ["--max-episode-steps", "2", "--curriculum"]),
    ],
)
def test_smoke_per_task_and_algorithm(tmp_path, task, algorithm, extra):
    result = run_script(
        "reinforce_baby", "--task", task, "--algorithm", algorithm, *TINY, *extra, "--runs-dir", str(tmp_path), check=True
    )
    progress = [line for line in result.stdout.splitlines() if line.startswith("global_step=")]
    assert progress and progress[-1].endswith("] 0.0 min left")  # the last update's line: nothing is left
    run_dir = only_run_dir(tmp_path)
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)
    assert ev["script"] == "reinforce_baby" and ev["task"] == task
    assert 0.0 <= ev["success_rate"] <= 1.0 and ev["baselines"]["random"]["success_rate"] < 0.5
    tasks = reinforce_baby.TASKS if task == "all" else [task]
    assert {k.split("/")[0] for k in ev["per_difficulty_success"]} == set(tasks)
    sc = logged_scalars(run_dir)
    tags = set(sc)
    assert {
        "charts/success_rate",
        "losses/entropy",
        "losses/world_model_mse",
        "reward/goal",
        "reward/pred",
        "reward/cons",
        "charts/SPS",
    } <= tags
    steps = [step for step, _ in sc["charts/success_rate"]]
    T = int(extra[extra.index("--max-episode-steps") + 1]) if "--max-episode-steps" in extra else 1
    batch = 16 * T
    assert steps == list(range(batch, 64 // batch * batch + 1, batch))  # logged against environment steps


# Each job the page documents that needs no report, plot, resume or LLM, at a tiny budget: (name, flags). The first
# runs the default analysis and saves the model that evaluate() reads back.
ALONE_JOBS = [
    ("mvp", ["--task", "pattern-echo", *[f for f in TINY if f != "--no-analysis"], "--analysis-samples", "40",
             "--save-model", "--capture-video"]),
    ("plan_reinforce", [*TINY, "--learning-rate", "1e-3", "--ent-coef", "0.01", "--world-model-coef", "1.0",
                        "--no-norm-adv", "--baseline-decay", "0.99", "--baseline-update", "before", "--adam-eps", "1e-8",
                        "--max-grad-norm", "0"]),
    ("curriculum_ppo", [*TINY, "--task", "all", "--curriculum", "--algorithm", "ppo", "--save-model"]),
    ("rl_only", [*TINY, "--task", "all", "--curriculum", "--world-model-coef", "0", "--pred-reward-weight", "0"]),
    ("kl_distill", [*TINY, "--task", "all", "--curriculum", "--kl-coef", "1.0"]),
    ("plan_rules", [*[f if f != "8" else "16" for f in TINY], "--task", "conditional", "--conditional-rule", "plan",
                    "--curriculum", "--curriculum-rule", "plan"]),
    ("ppo_bootstrap", [*TINY, "--algorithm", "ppo", "--bootstrap-time-limit", "--max-episode-steps", "2"]),
]  # fmt: skip
# the options that need the helper package: refused in one line before any work
PACKAGE_OPTIONS = [
    ("--resume", ["--resume", "checkpoint.pt"]),
    ("--checkpoint-every", [*TINY, "--checkpoint-every", "16"]),
    ("--parent llm", ["--parent", "llm", "--llm-base-url", "http://127.0.0.1:9/v1"]),
]
# runs each job of argv[1] (a JSON list of [name, argv]) in this interpreter, then evaluate() on the file that argv[2]
# matches; prints {"jobs": {name: [exit code, stderr]}, "evaluate": its result or None}
ALONE_DRIVER = """
import contextlib, glob, io, json, runpy, sys, traceback
jobs = json.loads(sys.argv[1])
model_glob = sys.argv[2]
results = {}
for name, argv in jobs:
    sys.argv = argv
    err = io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stderr(err):
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
    except Exception:
        code = "raised"
        err.write(traceback.format_exc())
    results[name] = [code, err.getvalue()]
evaluated = None
for path in glob.glob(model_glob):
    evaluated = runpy.run_path(jobs[0][1][0])["evaluate"](path)
print(json.dumps({"jobs": results, "evaluate": evaluated}))
"""


def test_the_script_copied_alone_runs_every_documented_job_and_refuses_the_package_options_in_one_line(tmp_path):
    """The script copied into an empty folder, where cleanrl_astral_utils and cleanrl_astral are packages whose import
    fails (first on PYTHONPATH, so the editable install cannot leak in): each documented training job writes eval.json,
    --save-model its checkpoint (atomically), the default analysis its t-SNE, --capture-video its transcript, and
    evaluate() reads the checkpoint back to the run's own evaluation; --resume, --checkpoint-every and --parent llm each
    say in one line that they need the package, before any work."""
    alone = tmp_path / "alone"
    alone.mkdir()
    script = shutil.copy(reinforce_baby.__file__, alone)
    for package in ("cleanrl_astral_utils", "cleanrl_astral"):
        stub = tmp_path / "blocked" / package
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("raise ImportError('blocked: the script must run without this package')\n")
    runs = str(tmp_path / "runs")
    jobs = [(name, [script, *flags, "--runs-dir", f"{runs}/{name}"]) for name, flags in ALONE_JOBS]
    jobs += [(option, [script, *flags, "--runs-dir", f"{runs}/refused"]) for option, flags in PACKAGE_OPTIONS]
    mvp_model = f"{runs}/mvp/*/reinforce_baby.cleanrl_model"
    env = {**SCRIPT_ENV, "PYTHONPATH": str(tmp_path / "blocked")}
    r = subprocess.run(
        [sys.executable, "-c", ALONE_DRIVER, json.dumps(jobs), mvp_model],
        capture_output=True,
        text=True,
        env=env,
        cwd=alone,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    for name, _ in ALONE_JOBS:
        assert out["jobs"][name][0] in (0, None), (name, out["jobs"][name][1][-2000:])
        assert os.path.isfile(os.path.join(only_run_dir(f"{runs}/{name}"), "eval.json")), name
    for name in ("mvp", "curriculum_ppo"):
        run_dir = only_run_dir(f"{runs}/{name}")
        saved = torch.load(os.path.join(run_dir, "reinforce_baby.cleanrl_model"), weights_only=False)
        assert saved["script"] == "reinforce_baby"
        reinforce_baby.build_agent(reinforce_baby.Args(**saved["args"])).load_state_dict(saved["state_dict"])
        assert not [f for f in os.listdir(run_dir) if ".tmp." in f]
    mvp = only_run_dir(f"{runs}/mvp")
    assert os.path.isfile(os.path.join(mvp, "tsne.png"))
    assert os.path.isfile(os.path.join(mvp, "videos", "eval_transcript.txt"))
    with open(os.path.join(mvp, "eval.json")) as f:
        ev = json.load(f)
    assert "probe_accuracy" in ev
    assert out["evaluate"]["success_rate"] == ev["success_rate"]
    assert out["evaluate"]["per_difficulty_success"] == ev["per_difficulty_success"]
    for option, _ in PACKAGE_OPTIONS:
        code, stderr = out["jobs"][option]
        assert code == 2 and stderr.count("\n") == 1, (option, stderr)
        assert f"error: {option} needs the cleanrl_astral_utils package" in stderr, stderr
    assert not os.path.exists(f"{runs}/refused")


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names):
    """Runs of one command and seed started in the same second (a shell loop over flags) each get a directory: sharing
    runs/{run_name} would mix their TensorBoard events, and the later run's files would replace the earlier run's."""
    check = occupied_run_names(str(tmp_path), "pattern-echo__collide__7__")
    flags = ["--task", "pattern-echo", *TINY, "--exp-name", "collide", "--seed", "7", "--runs-dir", str(tmp_path)]
    run_script("reinforce_baby", *flags, "--save-model", check=True)
    run_dir = check()
    assert os.path.isfile(os.path.join(run_dir, "collide.cleanrl_model"))
    assert os.path.isfile(os.path.join(run_dir, "eval.json"))


def test_full_run_saves_evaluates_baselines_and_analysis(tmp_path):
    runs = tmp_path / "runs"
    flags = [f for f in TINY if f != "--no-analysis"] + ["--analysis-samples", "120"]
    run_script(
        "reinforce_baby",
        "--task",
        "all",
        "--curriculum",
        *flags,
        "--save-model",
        "--capture-video",
        "--runs-dir",
        str(runs),
        "--seed",
        "4",
        check=True,
    )
    run_dir = only_run_dir(runs)

    def strict(name):
        raise AssertionError(f"eval.json holds {name}, which is not JSON")

    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.loads(f.read(), parse_constant=strict)
    assert set(ev["baselines"]) == {"random"} and "world_model_mse" not in ev["baselines"]["random"]
    assert set(ev["probe_accuracy"]) >= {"task", "v0", "v1"}
    assert os.path.getsize(os.path.join(run_dir, "tsne.png")) > 1000
    assert os.path.isfile(os.path.join(run_dir, "videos", "eval_transcript.txt"))
    model = os.path.join(run_dir, "reinforce_baby.cleanrl_model")
    saved = torch.load(model, weights_only=False)
    assert saved["script"] == "reinforce_baby" and saved["args"]["task"] == "all"
    assert not [f for f in os.listdir(run_dir) if ".tmp." in f]
    # evaluate() on the saved file reproduces the run's own evaluation exactly: by default on the run's own episodes
    # (its --eval-episodes, drawn from seed + 777)
    again = reinforce_baby.evaluate(model)
    assert again["success_rate"] == ev["success_rate"]
    assert again["per_difficulty_success"] == ev["per_difficulty_success"]
    assert again == reinforce_baby.evaluate(model, episodes=8, seed=4 + reinforce_baby.EVAL_SEED_OFFSET)
    # a checkpoint whose Args differ from this file's (another commit's format) is refused in one line
    saved["args"]["an_older_flag"] = 1
    other = str(tmp_path / "other.cleanrl_model")
    torch.save(saved, other)
    with pytest.raises(ValueError, match="another format of reinforce_baby.py's checkpoint; commit 95652a5 reads it"):
        reinforce_baby.evaluate(other)


def test_the_benchmark_trains_the_baselines_as_runs_of_their_own_and_tables_them(tmp_path):
    """benchmark/reinforce_baby_baselines.py runs the agent's command as given, as RL-only (no world model, no
    prediction reward) and as KL-distill, one seed each, and tables the three evaluations with the random row. Each
    baseline's logged losses show that its flags took effect."""
    runs = tmp_path / "runs"
    flags = ["--task", "pattern-echo", *TINY, "--seed", "3"]
    script = os.path.join(os.path.dirname(reinforce_baby.__file__), "..", "benchmark", "reinforce_baby_baselines.py")
    subprocess.run([sys.executable, script, "--runs-dir", str(runs), "--", *flags], check=True, env=SCRIPT_ENV)
    with open(runs / "baselines.json") as f:
        rows = json.load(f)
    assert list(rows) == ["agent", "random", "rl-only", "kl-distill"]
    logged = {}
    for name in ("agent", "rl-only", "kl-distill"):
        run_dir = only_run_dir(runs / name)
        with open(os.path.join(run_dir, "eval.json")) as f:
            ev = json.load(f)
        assert rows[name]["success_rate"] == ev["success_rate"]
        assert rows[name]["success_pattern-echo/level2"] == ev["per_difficulty_success"]["pattern-echo/level2"]
        logged[name] = logged_scalars(run_dir)
    assert all(v == 0 for _, v in logged["rl-only"]["reward/pred"]) and any(v > 0 for _, v in logged["agent"]["reward/pred"])
    assert all(v > 0 for _, v in logged["kl-distill"]["losses/kl_to_parent"])
    assert all(v == 0 for _, v in logged["agent"]["losses/kl_to_parent"])


# ----------------------------------------------------------------------------------------------------- bad input


def test_a_runs_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "runs").write_text("")
    result = run_script("reinforce_baby", "--task", "pattern-echo", *TINY, "--runs-dir", str(tmp_path / "runs"))
    assert_refused(result, "--runs-dir")
    assert "not a directory" in result.stderr


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--task", "pattern-echo", "--num-actions", "4"], "--num-actions 4"),
        (["--task", "conditional", "--curriculum", "--num-actions", "6"], "--num-actions 6"),
        (["--parent", "llm"], "--llm-base-url"),
        (["--learning-rate", "nan"], "--learning-rate nan must be a finite number"),
    ],
)
def test_bad_input_fails_with_one_line_before_any_work(tmp_path, flags, needle):
    assert_refused(run_script("reinforce_baby", *flags, "--runs-dir", str(tmp_path / "runs")), needle)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"learning_rate": float("nan")}, "--learning-rate nan must be a finite number"),
        ({"baseline_decay": float("inf")}, "--baseline-decay inf must be a finite number"),
        ({"algorithm": "ppo", "update_epochs": 0}, "--update-epochs must be >= 1"),
        ({"total_timesteps": 0}, "--total-timesteps 0 is less than one update"),
        ({"gamma": -1.0}, "--gamma -1.0 must be in (0, 1]"),
        ({"algorithm": "ppo", "gae_lambda": 2.0}, "--gae-lambda 2.0 must be in [0, 1]"),
        ({"baseline_decay": 2.0}, "--baseline-decay 2.0 must be in [0, 1)"),
        ({"mastery_threshold": 0.0}, "--mastery-threshold 0.0 must be in (0, 1]"),
        ({"clip_coef": 0.0}, "--clip-coef 0.0 must be positive"),
        ({"adam_eps": 0.0}, "--adam-eps 0.0 must be positive"),
        ({"max_grad_norm": -0.5}, "--max-grad-norm -0.5 must be >= 0 (0: no clipping)"),
        ({"llm_retries": -1}, "--llm-retries -1 must be >= 0"),
        ({"llm_timeout": 0.0}, "--llm-timeout 0.0 must be positive"),
        ({"llm_concurrency": 0}, "--llm-concurrency must be >= 1"),
        ({"algorithm": "ppo", "num_minibatches": 0}, "--num-minibatches must be >= 1"),
        ({"analysis_samples": 0}, "--analysis-samples must be >= 2"),
        ({"llm_examples": -1}, "--llm-examples -1 must be >= 0"),
        ({"llm_check_pairs": -1}, "--llm-check-pairs -1 must be >= 0"),
        ({"review_prob": 1.5}, "--review-prob 1.5 must be in [0, 1]"),
        ({"parent": "llm", "llm_base_url": "notaurl"}, "must be an http:// or https:// URL"),
        ({"parent": "llm", "llm_base_url": "http://127.0.0.1:1/v1", "llm_next_state": True}, "needs --llm-role judge"),
    ],
)
def test_meaningless_values_are_refused_by_validate(kwargs, needle):
    """Values that would train a meaningless run in silence (NaN, a budget of 0, a decay of 2, an LLM URL that every
    request fails on, so that the whole run falls back to the rule) or crash after the run directory exists."""
    error = refusal(reinforce_baby.Args(**{"num_actions": 8, **kwargs}))
    assert needle in error, error
    reinforce_baby.validate(reinforce_baby.Args(num_actions=8))


def test_num_actions_check_depends_on_the_levels_used():
    reinforce_baby.validate(reinforce_baby.Args(task="pattern-echo", num_actions=4, level=1))
    assert "--num-actions 4" in refusal(reinforce_baby.Args(task="pattern-echo", num_actions=4, level=2))
    reinforce_baby.validate(dataclasses.replace(reinforce_baby.Args(), num_actions=8, task="all", curriculum=True))


# ------------------------------------------------------------------- the plan's conditional rule (--conditional-rule)


def test_the_plans_conditional_rule_answers_the_shapes_block_plus_8_for_red():
    """--conditional-rule plan: f0 the shape (0 circle, 1 square), f1 the colour (1 red), v0 the place in the block:
    circle 0-3, square 4-7, red adds 8. Level 0 has no colour; level 2 uses all 16 actions."""
    parent = reinforce_baby.PlanConditionalParent(16)
    rng = np.random.default_rng(0)
    answers = {0: set(), 1: set(), 2: set()}
    for level in range(3):
        for _ in range(400):
            s = parent.new_instance("conditional", level, rng)
            shape, colour = s.flags[0], s.flags[1]
            assert shape in (0, 1) and 0 <= s.values[0] < reinforce_baby.CONDITIONAL_PLAN_LEVELS[level]["places"]
            expected = s.values[0] + 4 * shape + 8 * (colour == 1)
            assert parent.oracle_action(s) == expected and parent.judge(s, expected) == 1.0
            assert s.values[1:] == (16, 16)
            if level == 0:
                assert colour == reinforce_baby.FLAG_PAD
            answers[level].add(expected)
    assert answers == {0: set(range(8)), 1: {0, 1, 4, 5, 8, 9, 12, 13}, 2: set(range(16))}
    s = parent.new_instance("conditional", 2, rng)
    assert "plus 8 if f1" in parent.rule_text(s) and "plus 8" not in s.rule_text()


def test_the_plans_conditional_rule_leaves_the_models_shapes_and_weights_as_they_are():
    """The flag changes what the conditional task asks, never the model: the same seed builds the same parameters."""
    default = reinforce_baby.Args(task="all", num_actions=16)
    plan = dataclasses.replace(default, conditional_rule="plan")
    torch.manual_seed(0)
    a = reinforce_baby.build_agent(default).state_dict()
    torch.manual_seed(0)
    b = reinforce_baby.build_agent(plan).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_with_the_plans_conditional_rule_trains_and_evaluates_its_levels(tmp_path):
    flags = [f if f != "8" else "16" for f in TINY]
    run_script(
        "reinforce_baby", "--task", "conditional", "--conditional-rule", "plan", *flags, "--curriculum", "--capture-video",
        "--runs-dir", str(tmp_path), check=True,
    )  # fmt: skip
    run_dir = only_run_dir(tmp_path)
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)
    assert set(ev["per_difficulty_success"]) == {f"conditional/level{k}" for k in range(3)}
    assert "plus 8 if f1" in open(os.path.join(run_dir, "videos", "eval_transcript.txt")).read()


def test_the_plans_conditional_rule_needs_16_actions_the_conditional_task_and_the_rule_parent():
    args = reinforce_baby.Args(task="conditional", conditional_rule="plan", num_actions=8)
    assert "--num-actions 8" in refusal(args) and "16" in refusal(args)
    reinforce_baby.validate(dataclasses.replace(args, num_actions=16))
    assert "--task" in refusal(reinforce_baby.Args(task="pattern-echo", conditional_rule="plan", num_actions=16))
    llm = reinforce_baby.Args(task="all", conditional_rule="plan", num_actions=16, parent="llm", llm_base_url="http://x/v1")
    assert "rule parent" in refusal(llm)
