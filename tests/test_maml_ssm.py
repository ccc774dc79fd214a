"""Tests of cleanrl_astral/maml_ssm.py: SSM mechanics, MAML gradients, task splits, checkpoints, CLI."""

import copy
import dataclasses
import glob
import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from cleanrl_astral import maml_ssm as m

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("cleanrl_astral", "maml_ssm.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
TINY = ["--outer-steps", "2", "--tasks-per-batch", "2", "--fast-batch-size", "3", "--max-episode-steps", "12",
        "--hidden-size", "8", "--state-size", "4", "--cg-iters", "3", "--ls-max-steps", "3", "--eval-tasks", "3",
        "--eval-steps", "2"]


def run(args, check=True, cwd=REPO):
    return subprocess.run([sys.executable, os.path.join(REPO, SCRIPT), *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, check=check)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def trained_ckpt(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    run(["train", "--task", "point-nav-2d", "--runs-dir", str(runs), "--save-model", *TINY])
    (path,) = glob.glob(str(runs / "*" / "maml_ssm.cleanrl_model"))
    return path


def tiny_setup(policy="ssm", T=10, n_tasks=2, per=3, dtype=torch.float64, seed=0):
    """A tiny point-nav problem: model in `dtype` and per-task fast/validation batches with advantages."""
    torch.manual_seed(seed)
    args = m.Args(policy=policy, hidden_size=6, state_size=3, max_episode_steps=T, fast_batch_size=per,
                  tasks_per_batch=n_tasks, inner_lr=0.5)
    model = m.build_agent(args, m.PointNav2D)
    rng, _ = m.task_streams(seed)
    tasks = m.sample_tasks(args.task, rng, n_tasks, "train")
    theta = {k: v.detach() for k, v in model.named_parameters()}
    data, _ = m.sample_task_batches(model, theta, tasks, args, torch.Generator().manual_seed(seed), 1, [args.inner_lr])
    model = model.to(dtype)
    for td in data:
        for b in td["train"] + [td["val"]]:
            for k, v in b.items():
                if v.is_floating_point():
                    b[k] = v.to(dtype)
    return model, args, data


# ------------------------------------------------------------------------------------------------ SSM
def test_lru_stable_for_all_reachable_parameters():
    lru = m.LRU(4, 64)
    with torch.no_grad():
        lru.nu_log.copy_(torch.linspace(-200.0, 80.0, 64))  # exp(nu) from 0 to overflow-size
        lru.theta_log.copy_(torch.linspace(-50.0, 50.0, 64))
    log_r, _ = lru.lam()
    assert (torch.exp(log_r) < 1).all() and torch.isfinite(log_r).all()
    # a long constant input keeps the state bounded (|lambda| < 1 plus gamma normalisation)
    u = torch.ones(1, 4)
    x = torch.zeros(1, 128)
    for _ in range(3000):
        _, x = lru.step(u, x, torch.zeros(1, dtype=torch.bool))
    assert torch.isfinite(x).all() and x.abs().max() < 1e3


@pytest.mark.parametrize("kind", ["ssm", "gru", "mlp"])
def test_step_by_step_equals_sequence_scan(kind):
    torch.manual_seed(1)
    agent = m.Agent(kind, 3, 2, False, 8, 5, True).double()
    T, B = 17, 4
    inp = torch.randn(T, B, 6, dtype=torch.float64)
    starts = torch.rand(T, B) < 0.2
    state0 = torch.randn_like(agent.initial_state(B))
    a = agent(inp, starts, state0, scan=True)
    b = agent(inp, starts, state0, scan=False)
    assert torch.allclose(a["pi"], b["pi"], atol=1e-10) and torch.allclose(a["state"], b["state"], atol=1e-10)
    if kind != "mlp":
        # the two paths must not be trivially equal: the state has to matter
        c = agent(inp, starts, torch.zeros_like(state0), scan=True)
        assert not torch.allclose(a["pi"][: int(starts.long().argmax(0).min()) + 1], c["pi"][: int(starts.long().argmax(0).min()) + 1])


@pytest.mark.parametrize("kind", ["ssm", "gru"])
def test_state_reset_at_episode_boundary(kind):
    torch.manual_seed(2)
    agent = m.Agent(kind, 3, 2, False, 8, 5, True).double()
    T, B, k = 12, 3, 5
    inp = torch.randn(T, B, 6, dtype=torch.float64)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[0], starts[k] = True, True
    full = agent(inp, starts, torch.randn_like(agent.initial_state(B)))["pi"]
    fresh = agent(inp[k:], starts[k:], agent.initial_state(B))["pi"]
    assert torch.allclose(full[k:], fresh, atol=1e-10)
    no_reset = starts.clone()
    no_reset[k] = False
    assert not torch.allclose(agent(inp, no_reset, agent.initial_state(B))["pi"][k:], fresh, atol=1e-6)


@pytest.mark.parametrize("task", m.TASKS)
def test_matched_parameter_counts(task):
    env_cls = m.ENV_CLASSES[task]
    args = m.Args(task=task)
    counts = {}
    for kind in m.POLICIES:
        a = dataclasses.replace(args, policy=kind)
        model = m.build_agent(a, env_cls)
        w = m.policy_width(a, env_cls)
        assert m.count_params(model) == m.agent_param_count(kind, env_cls.obs_dim, env_cls.act_dim, env_cls.discrete, w, args.state_size, True)
        counts[kind] = m.count_params(model)
    assert max(counts.values()) / min(counts.values()) < 1.03


def test_matched_width_is_the_closest_at_any_size():
    """The width search used to stop at 2048, so an SSM wider than about 2,900 got an unmatched MLP baseline
    without a word. The chosen width must beat its two neighbours, whatever the size."""
    env_cls = m.ENV_CLASSES["point-nav-2d"]
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete)
    for hidden in (4, 64, 3000, 20000):
        for kind in ("gru", "mlp"):
            a = m.Args(policy=kind, hidden_size=hidden)
            target = m.agent_param_count("ssm", *spec, hidden, a.state_size, True)
            w = m.policy_width(a, env_cls)
            gap = [abs(m.agent_param_count(kind, *spec, v, a.state_size, True) - target) for v in (w - 1, w, w + 1)]
            assert gap[1] <= gap[2] and (w == 4 or gap[1] <= gap[0]), (hidden, kind, w, gap)
            if hidden >= 64:
                assert gap[1] / target < 0.03, (hidden, kind, w, gap)


# ------------------------------------------------------------------------------------------------ TASKS
def test_point_nav_scales_and_clips_actions_and_ends_at_goal():
    # the policy acts in [-1, 1]: 0.5 is a step of 0.05, and 5 is clipped to a step of 0.1 (paper's normalize)
    env = m.PointNav2D(torch.tensor([[0.05, 0.0], [0.4, 0.4]]), torch.Generator())
    env.reset()
    obs, r, done = env.step(torch.tensor([[0.5, 0.0], [5.0, -5.0]]))
    assert torch.allclose(obs, torch.tensor([[0.05, 0.0], [0.1, -0.1]]))
    assert done.tolist() == [True, False]
    assert r[1].item() == pytest.approx(-float(np.hypot(0.3, 0.5)), abs=1e-6)
    obs, _, _ = env.step(torch.tensor([[0.0, 0.0], [-0.3, 0.2]]))
    assert torch.allclose(obs[1], torch.tensor([0.07, -0.08]))


def test_point_nav_goal_box_is_the_paper_codes_rule():
    # goal at the origin's neighbour; both runs take the same step, so rewards agree and only `done` differs
    goals = torch.tensor([[0.05, 0.05], [0.05, 0.0], [0.05, 0.05]])
    step = torch.tensor([[0.41, 0.41], [0.39, 0.0], [0.5, 0.385]])  # offsets (-0.009, -0.009), (-0.011, 0), (0, -0.0115)
    results = {}
    for box in (False, True):
        env = m.PointNav2D(goals, torch.Generator(), goal_box=box)
        env.reset()
        results[box] = env.step(step)
    (_, r_l2, done_l2), (_, r_box, done_box) = results[False], results[True]
    assert torch.equal(r_l2, r_box)
    assert r_l2[0].item() == pytest.approx(-0.009 * np.sqrt(2), abs=1e-6)
    assert done_l2.tolist() == [False, False, False]  # 0.0127 away: outside the disc of radius 0.01
    assert done_box.tolist() == [True, False, False]  # |dx|, |dy| < 0.01: inside the paper code's square
    assert m.PointNav2D(goals, torch.Generator()).goal_box is False


def test_goal_box_follows_the_config_into_training_and_eval(trained_ckpt, monkeypatch, tmp_path):
    assert m.parse_cli(["train", "--config", "paper"]).goal_box is True
    assert m.parse_cli(["train", "--config", "paper", "--no-goal-box"]).goal_box is False
    assert m.parse_cli(["train"]).goal_box is False
    seen = []

    class Spy(m.PointNav2D):
        def __init__(self, tasks, gen, goal_box=False):
            seen.append(goal_box)
            super().__init__(tasks, gen, goal_box)

    monkeypatch.setattr(m, "PointNav2D", Spy)
    ckpt = torch.load(trained_ckpt, weights_only=False)
    del ckpt["args"]["goal_box"]  # a checkpoint from before the flag existed was trained on the Euclidean rule
    old = str(tmp_path / "old.cleanrl_model")
    torch.save(ckpt, old)
    m.evaluate(old, 2, 1, write=False)
    ckpt["args"]["goal_box"] = True
    box = str(tmp_path / "box.cleanrl_model")
    torch.save(ckpt, box)
    m.evaluate(box, 2, 1, write=False)
    assert seen == [False, True]


class FixedLengthEpisodes:
    """Stand-in task whose episodes last exactly `task_params[i][0]` steps (reward -1 per step)."""

    obs_dim, act_dim, discrete = 2, 2, False

    def __init__(self, rows):
        self.length, self.n = rows[:, 0].long(), len(rows)

    def reset(self):
        self.t = 0
        return torch.zeros(self.n, 2)

    def step(self, action):
        self.t += 1
        return torch.zeros(self.n, 2), -torch.ones(self.n), torch.full((self.n,), self.t) >= self.length


@pytest.mark.parametrize("fill", [False, True])
def test_fill_steps_samples_until_the_step_count_of_the_paper_sampler(fill, monkeypatch):
    made = []

    def make_env(args, task_params, per, gen):
        made.append(per)
        return FixedLengthEpisodes(torch.tensor(np.repeat(task_params, per, axis=0)))

    monkeypatch.setattr(m, "make_env", make_env)
    torch.manual_seed(0)
    args = m.Args(policy="mlp", hidden_size=6, max_episode_steps=10, fast_batch_size=2, fill_steps=fill)
    model = m.build_agent(args, m.PointNav2D)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    tasks = np.array([[3.0], [10.0], [7.0], [4.0]])  # budget 2 x 10 = 20 steps per task
    data, returns = m.sample_task_batches(model, theta, tasks, args, torch.Generator(), 1, [0.1])
    for b in [data[0]["train"][0], data[0]["val"]]:
        lengths = b["masks"].sum(0).tolist()
        if fill:  # 2 episodes of 3 steps, then ceil(14 / 3) = 5 more of which all are needed: 7 episodes, 21 steps
            assert lengths == [3.0] * 7
        else:
            assert lengths == [3.0] * 2
        assert b["starts"][0].all() and not b["starts"][1:].any()
    # a task at the full horizon needs nothing more; the third stops at the episode that passes 20 steps
    assert data[1]["val"]["masks"].sum(0).tolist() == [10.0, 10.0]
    assert data[2]["val"]["masks"].sum(0).tolist() == ([7.0] * 3 if fill else [7.0] * 2)
    # exactly 20 steps after 5 episodes of 4: the 6th is not taken
    assert data[3]["val"]["masks"].sum(0).tolist() == ([4.0] * 5 if fill else [4.0] * 2)
    for r in returns:  # per task, the mean return over all of its episodes
        assert r.tolist() == [-3.0, -10.0, -7.0, -4.0]
    # one env of 2 episodes per task for every step; with fill, one more wave per step for the short tasks, sized
    # by the neediest (task 0: 5 episodes)
    assert made == ([2, 5, 5] if fill else [2])
    assert m.parse_cli(["train", "--config", "paper"]).fill_steps is True and m.Args().fill_steps is False


def test_fill_steps_waves_act_with_each_tasks_own_adapted_parameters(monkeypatch):
    # every kept episode of a post-adaptation batch, first wave or extra, was sampled by its own task's theta'
    monkeypatch.setattr(m, "make_env", lambda args, tp, per, gen: FixedLengthEpisodes(torch.tensor(np.repeat(tp, per, axis=0))))
    torch.manual_seed(0)
    args = m.Args(policy="mlp", hidden_size=6, max_episode_steps=10, fast_batch_size=2, fill_steps=True)
    model = m.build_agent(args, m.PointNav2D)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    data, _ = m.sample_task_batches(model, theta, np.array([[3.0], [4.0], [10.0]]), args, torch.Generator(), 1, [0.5])
    adapted = [m.inner_step(model, {k: v.clone().requires_grad_(True) for k, v in theta.items()}, td["train"][0], 0.5,
                            False) for td in data]
    logp = lambda params, val: m.log_prob(m.make_dist(m.policy_out(model, params, val), False), val["actions"], False) * val["masks"]
    for td, params in zip(data, adapted):
        val = td["val"]
        assert val["masks"].shape[1] > 2 or val["masks"][:, 0].sum() == 10  # the short tasks got extra episodes
        assert torch.allclose(logp(params, val), val["logp"] * val["masks"], atol=1e-5)
    # and the check can tell tasks apart: task 0's episodes are not what task 1's theta' would give them
    assert not torch.allclose(logp(adapted[1], data[0]["val"]), data[0]["val"]["logp"] * data[0]["val"]["masks"], atol=1e-5)


def test_cartpole_physics_matches_gymnasium_at_default_physics():
    import gymnasium as gym

    ref = gym.make("CartPole-v1").unwrapped
    ref.reset(seed=0)
    env = m.CartPolePhysics(torch.tensor([[9.8, 0.5]]), torch.Generator().manual_seed(0))
    env.reset()
    env.state = torch.tensor([list(ref.state)], dtype=torch.float64)
    for a in [1, 1, 0, 1, 0, 0, 1]:
        o_ref, _, term, _, _ = ref.step(a)
        o, _, done = env.step(torch.tensor([[float(a)]]))
        assert np.allclose(o[0].numpy(), o_ref, atol=1e-5) and bool(done[0]) == term


@pytest.mark.parametrize("task", m.TASKS)
def test_train_and_test_task_streams_are_disjoint(task):
    train_rng, test_rng = m.task_streams(3)
    train = m.sample_tasks(task, train_rng, 2000, "train")
    test = m.sample_tasks(task, test_rng, 500, "test")
    assert not (np.abs(train[None] - test[:, None]).max(-1) < 1e-9).any()
    # same seed, fresh generators: the streams are reproducible
    assert np.array_equal(m.sample_tasks(task, m.task_streams(3)[1], 500, "test"), test)
    if task == "cartpole-physics":
        (g0, g1), (l0, l1) = m.CARTPOLE_TRAIN_RANGES
        (tg0, tg1), (tl0, tl1) = m.CARTPOLE_TEST_RANGES
        assert g1 < tg0 and l1 < tl0
        assert ((train[:, 0] >= g0) & (train[:, 0] <= g1) & (train[:, 1] >= l0) & (train[:, 1] <= l1)).all()
        assert ((test[:, 0] >= tg0) & (test[:, 0] <= tg1) & (test[:, 1] >= tl0) & (test[:, 1] <= tl1)).all()


# ------------------------------------------------------------------------------------------------ MAML
def test_functional_inner_step_equals_manual_sgd_on_copied_module():
    model, args, data = tiny_setup()
    batch = data[0]["train"][0]
    new = m.inner_step(model, dict(model.named_parameters()), batch, 0.3, create_graph=False)
    clone = copy.deepcopy(model)
    opt = torch.optim.SGD(clone.parameters(), lr=0.3)
    out = clone(batch["inputs"], batch["starts"], clone.initial_state(batch["masks"].shape[1]))
    dist = torch.distributions.Normal(out["pi"], torch.exp(clone.log_std))
    logp = dist.log_prob(batch["actions"]).sum(-1)
    loss = -(logp * batch["advantages"] * batch["masks"]).sum() / batch["masks"].sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    changed = 0
    for k, p in clone.named_parameters():
        assert torch.allclose(new[k], p, atol=1e-12), k
        changed += int(not torch.equal(p, dict(model.named_parameters())[k]))
    assert changed > 5


def test_advantages_are_gae_on_the_linear_baseline_normalised_over_valid_steps(forward_gae, monkeypatch):
    """Episodes of different lengths padded with masks: GAE with gamma and lambda below 1 over each episode's
    valid steps, no bootstrap after the last (termination or horizon), then normalised over the task's valid steps
    and zero on the padding."""
    gamma, lam = 0.9, 0.5
    masks = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([[-1.0, -0.5, -2.0], [-0.8, -0.4, -1.0], [-0.6, -0.3, 9.0], [-0.4, 9.0, 9.0],
                            [-0.2, 9.0, 9.0]])  # 9.0 on padding must not leak in
    values = torch.tensor([[-3.0, -1.0, -2.5], [-2.0, -0.7, -1.2], [-1.5, -0.2, 5.0], [-0.9, 5.0, 5.0],
                           [-0.3, 5.0, 5.0]], dtype=torch.float64)
    monkeypatch.setattr(m, "linear_baseline", lambda batch, g: values * batch["masks"].double())
    batch = {"obs": torch.zeros(5, 3, 2), "masks": masks, "rewards": rewards}
    adv = m.compute_advantages(batch, gamma, lam)
    raw = torch.zeros(5, 3, dtype=torch.float64)
    for n, length in enumerate([5, 3, 2]):
        raw[:length, n] = torch.tensor(forward_gae(rewards[:length, n].tolist(), values[:length, n].tolist() + [0.0],
                                                   [1.0] * (length - 1) + [0.0], gamma, lam), dtype=torch.float64)
    valid = raw[masks > 0]
    assert adv[masks > 0].tolist() == pytest.approx(((valid - valid.mean()) / (valid.std() + 1e-8)).tolist(), abs=1e-5)
    assert torch.all(adv[masks == 0] == 0)
    # a batch of one valid step (adapt --online --online-every 1 --fast-batch-size 1): its std was NaN, which made
    # every parameter NaN after the step (no guard compares NaN); it is centred to 0 instead
    monkeypatch.setattr(m, "linear_baseline", lambda batch, g: values[:, :1] * batch["masks"].double())
    one = {"obs": torch.zeros(5, 1, 2), "masks": torch.tensor([[1.0], [0.0], [0.0], [0.0], [0.0]]),
           "rewards": rewards[:, :1]}
    assert m.compute_advantages(one, gamma, lam).tolist() == [[0.0]] * 5


def test_inner_loss_depends_on_rewards():
    model, args, data = tiny_setup()
    batch = data[0]["train"][0]
    params = dict(model.named_parameters())
    g1 = torch.autograd.grad(m.inner_loss(model, params, batch), params["pi.weight"])[0]
    altered = dict(batch)
    altered["rewards"] = batch["rewards"] * 0 + torch.randn_like(batch["rewards"]) * batch["masks"]
    altered["advantages"] = m.compute_advantages(altered, args.gamma, args.gae_lambda).double()
    g2 = torch.autograd.grad(m.inner_loss(model, params, altered), params["pi.weight"])[0]
    assert not torch.allclose(g1, g2, atol=1e-6)


def test_second_order_meta_gradient_matches_finite_differences():
    model, args, data = tiny_setup(T=8)
    params = dict(model.named_parameters())
    _, _, old = m.meta_objective(model, params, data, args)

    def f(first_order):
        a = dataclasses.replace(args, first_order=first_order)
        return m.meta_objective(model, dict(model.named_parameters()), data, a, old)[0]

    names = list(params)
    g2 = torch.autograd.grad(f(False), [params[k] for k in names], allow_unused=True)
    g1 = torch.autograd.grad(f(True), [params[k] for k in names], allow_unused=True)
    flat = lambda gs: torch.cat([(g if g is not None else torch.zeros_like(params[k])).reshape(-1) for g, k in zip(gs, names)])  # noqa: E731
    g2, g1 = flat(g2), flat(g1)
    theta0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    gen = torch.Generator().manual_seed(0)
    eps = 1e-6
    for _ in range(3):
        v = torch.randn(theta0.shape, generator=gen, dtype=theta0.dtype)
        vals = []
        for sign in (1, -1):
            torch.nn.utils.vector_to_parameters(theta0 + sign * eps * v, model.parameters())
            vals.append(f(False).item())
        torch.nn.utils.vector_to_parameters(theta0, model.parameters())
        fd = (vals[0] - vals[1]) / (2 * eps)
        assert abs(fd - (g2 @ v).item()) < 1e-5 * max(1.0, abs(fd))
    assert (g2 - g1).norm() > 1e-3 * g2.norm()


def test_trpo_first_trial_step_has_the_kl_radius():
    """The line search starts from the step whose quadratic KL estimate 0.5 s^T F s is --max-kl (rllab's
    scaling); a step of twice the radius makes the first trials overshoot and wastes meta-objective passes."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    fisher = a @ a.T + 0.1 * torch.eye(6, dtype=torch.float64)
    direction = torch.randn(6, generator=gen, dtype=torch.float64)
    for max_kl in (0.01, 0.003):
        step = m.kl_radius_step(direction, fisher @ direction, max_kl)
        assert (0.5 * step @ fisher @ step).item() == pytest.approx(max_kl, rel=1e-9)
        assert torch.allclose(step / step.norm(), direction / direction.norm())


def test_trpo_step_respects_trust_region_and_improves():
    model, args, data = tiny_setup(dtype=torch.float32)
    args = dataclasses.replace(args, max_kl=0.005, cg_iters=5)
    params = dict(model.named_parameters())
    before, _, old = m.meta_objective(model, params, data, args)
    stats = m.trpo_step(model, data, args)
    after, kl, _ = m.meta_objective(model, dict(model.named_parameters()), data, args, old)
    assert stats["accepted"] == 1.0
    assert kl.item() <= args.max_kl + 1e-6 and kl.item() > 0
    assert after.item() < before.item()


# ------------------------------------------------------------------------------------------------ CHECKPOINTS / CLI
def test_atomic_save_keeps_old_file_when_writing_fails(tmp_path, monkeypatch):
    model, args, _ = tiny_setup(dtype=torch.float32)
    path = str(tmp_path / "x.cleanrl_model")
    m.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []})
    digest = sha(path)

    def boom(obj, f):
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(m.torch, "save", boom)
    with pytest.raises(OSError):
        m.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []})
    assert sha(path) == digest and os.listdir(tmp_path) == ["x.cleanrl_model"]


def test_eval_leaves_checkpoint_bit_identical_and_writes_eval_json(trained_ckpt):
    digest = sha(trained_ckpt)
    out = run(["eval", "--checkpoint", trained_ckpt, "--num-tasks", "3", "--num-steps", "3"])
    assert sha(trained_ckpt) == digest
    res = json.loads(open(os.path.join(os.path.dirname(trained_ckpt), "eval.json")).read())
    assert set(res) == {"task", "returns_after_steps", "ci95", "num_tasks"}
    assert res["task"] == "point-nav-2d" and res["num_tasks"] == 3
    assert list(res["returns_after_steps"]) == ["0", "1", "2", "3"] and list(res["ci95"]) == ["0", "1", "2", "3"]
    assert all(np.isfinite(v) and v < 0 for v in res["returns_after_steps"].values())
    assert os.path.isfile(os.path.join(os.path.dirname(trained_ckpt), "eval.png"))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == res
    # evaluation starts every task from the checkpoint's theta: the same seed gives the same numbers
    assert m.evaluate(trained_ckpt, 3, 3, write=False) == res
    # NaN passed eval's `<= 0` checks and crashed inside the first adaptation step; a bad seed failed in numpy
    for flags, needle in ((["--inner-lr", "nan"], "--inner-lr nan must be a finite number"),
                          (["--eval-seed", "-1"], "--eval-seed -1 must be in [0, 2**32 - 1]")):
        bad = run(["eval", "--checkpoint", trained_ckpt, *flags], check=False)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and needle in lines[0], bad.stderr
    assert sha(trained_ckpt) == digest


def test_eval_test_tasks_never_seen_in_training(trained_ckpt):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    seen = np.asarray(ckpt["task_split"]["train_tasks"])
    assert seen.shape == (2 * 2, 2)  # outer_steps x tasks_per_batch training goals are recorded
    _, test_rng = m.task_streams(ckpt["args"]["seed"])
    test = m.sample_tasks("point-nav-2d", test_rng, 3, "test")
    assert not (np.abs(seen[None] - test[:, None]).max(-1) < 1e-12).any()


def test_checkpoint_from_another_config_is_rejected(trained_ckpt, tmp_path):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    ckpt["args"]["policy"] = "gru"
    bad = str(tmp_path / "bad.cleanrl_model")
    torch.save(ckpt, bad)
    res = run(["eval", "--checkpoint", bad], check=False)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("maml_ssm.py: error:") and "do not match" in lines[0]
    with pytest.raises(ValueError, match="does not exist"):
        m.load_checkpoint(str(tmp_path / "missing.cleanrl_model"))
    ckpt["script"] = "ppo_gru_baseline"
    torch.save(ckpt, bad)
    with pytest.raises(ValueError, match="not a maml_ssm checkpoint"):
        m.load_checkpoint(bad)


def test_checkpoint_of_an_older_task_version_is_refused(trained_ckpt, tmp_path):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    assert ckpt["task_version"] == m.TASK_VERSIONS["point-nav-2d"] == 2
    del ckpt["task_version"]  # written before point-nav-2d scaled its actions: version 1
    old = str(tmp_path / "old.cleanrl_model")
    torch.save(ckpt, old)
    res = run(["eval", "--checkpoint", old], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "trained on version 1 of point-nav-2d" in lines[0]


def test_eval_episodes_sets_the_evaluation_batch(trained_ckpt, monkeypatch, tmp_path):
    seen = []
    real = m.sample_task_batches
    monkeypatch.setattr(m, "sample_task_batches", lambda model, p, tasks, args, *a: seen.append(args.fast_batch_size) or real(model, p, tasks, args, *a))
    ckpt = torch.load(trained_ckpt, weights_only=False)
    m.evaluate(trained_ckpt, 2, 1, write=False)
    m.evaluate(trained_ckpt, 2, 1, fast_batch_size=3, write=False)
    ckpt["args"]["eval_episodes"] = 5
    with_default = str(tmp_path / "eval5.cleanrl_model")
    torch.save(ckpt, with_default)
    m.evaluate(with_default, 2, 1, write=False)
    assert seen == [ckpt["args"]["fast_batch_size"], 3, 5]
    assert m.parse_cli(["train", "--config", "paper"]).eval_episodes == 40
    assert "--eval-episodes must be >= 1" in m.validate_args(m.Args(eval_episodes=0))


@pytest.mark.parametrize("flags,needle", [
    (["--task", "mountain-nav"], "unknown --task"),
    (["--inner-lr", "0"], "--inner-lr must be positive"),
    (["--cpu-budget", "-1"], "--cpu-budget must be >= 0"),
    (["--eval-episodes", "0"], "--eval-episodes must be >= 1"),
    (["--task", "cartpole-physics", "--goal-box"], "--goal-box only applies to --task point-nav-2d"),
    (["--cpu-budget", "nan"], "--cpu-budget nan must be a finite number"),
    (["--seed", "-1"], "--seed -1 must be in [0, 2**32 - 1]"),
])
def test_bad_input_is_one_line_and_exit_2(flags, needle, tmp_path):
    res = run(["train", "--runs-dir", str(tmp_path), *flags], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("maml_ssm.py: error:") and needle in lines[0]
    assert not os.listdir(tmp_path)  # validation happens before any work


def test_validate_args_rejects_bad_values(monkeypatch):
    assert "--outer-lr must be positive" in m.validate_args(m.Args(outer_lr=-1e-3))
    assert "unknown --policy" in m.validate_args(m.Args(policy="lstm"))
    assert "--fast-batch-size must be >= 1" in m.validate_args(m.Args(fast_batch_size=0))
    # NaN passed every `<= 0` check and trained (or crashed after the run directory existed); found by a CLI fuzz
    for kwargs, needle in (({"dynamics_coef": float("nan")}, "--dynamics-coef nan must be a finite"),
                           ({"max_kl": float("inf")}, "--max-kl inf must be a finite"),
                           ({"cg_damping": -1.0}, "--cg-damping must be >= 0, got -1.0"),
                           ({"eval_later_lr_scale": 0.0}, "--eval-later-lr-scale must be positive, got 0.0"),
                           ({"eval_tasks": 1, "save_model": True}, "needs >= 2 tasks for its 95% CI")):
        assert needle in m.validate_args(m.Args(**kwargs)), kwargs
    assert m.validate_args(m.Args(eval_tasks=1)) is None  # no evaluation without --save-model
    assert m.validate_args(m.Args()) is None
    monkeypatch.setattr(m, "mujoco_available", lambda: False)
    assert "pip install mujoco" in m.validate_args(m.Args(task="halfcheetah-vel"))


def test_config_preset_is_overridable_flag_by_flag():
    a = m.parse_cli(["train", "--config", "basic", "--inner-lr", "0.5"])
    assert (a.seed, a.fast_batch_size, a.max_episode_steps, a.outer_steps, a.tasks_per_batch) == (42, 8, 200, 50, 8)
    assert a.inner_lr == 0.5 and a.adapt_lr == 1e-2 and a.config == "basic"
    assert m.parse_cli(["train"]).seed == 1


@pytest.mark.parametrize("task", ["cartpole-physics", pytest.param("halfcheetah-vel", marks=pytest.mark.skipif(
    not m.mujoco_available(), reason="mujoco not installed"))])
def test_each_batch_of_an_iteration_starts_from_fresh_states(task, tmp_path, monkeypatch):
    """One environment serves every batch of an iteration (the inner-step batch, then the post-adaptation batch):
    each reset must draw new start states, or the outer objective is measured on the starts theta' adapted on."""
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    rng, _ = m.task_streams(0)
    tasks = m.sample_tasks(task, rng, 2, "train")
    env = m.make_env(m.Args(task=task), tasks, 3, torch.Generator().manual_seed(0))
    first, second = env.reset(), env.reset()
    assert first.shape == second.shape and not torch.isclose(first, second).all(dim=1).any()


@pytest.mark.parametrize("task,extra", [
    ("cartpole-physics", ["--outer-optimizer", "adam", "--policy", "gru"]),
    ("point-nav-2d", ["--policy", "mlp", "--num-inner-steps", "2", "--first-order"]),
    pytest.param("halfcheetah-vel", ["--max-episode-steps", "5"], marks=pytest.mark.skipif(
        not m.mujoco_available(), reason="mujoco not installed")),
])
def test_smoke_train_and_eval(task, extra, tmp_path):
    # cwd = tmp_path: MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working directory
    out = run(["train", "--task", task, "--runs-dir", str(tmp_path), "--save-model", *TINY, *extra], cwd=tmp_path)
    assert "parameters; matched counts" in out.stdout and "iter 2/2" in out.stdout
    (path,) = glob.glob(str(tmp_path / "*" / "maml_ssm.cleanrl_model"))
    res = json.load(open(os.path.join(os.path.dirname(path), "eval.json")))
    assert res["task"] == task and len(res["returns_after_steps"]) == 3
    assert glob.glob(str(tmp_path / "*" / "events.out.tfevents.*"))


def test_cpu_budget_stops_training_and_records_the_steps_done(tmp_path):
    # a budget far below one iteration's CPU time: training stops after iteration 1 of 50, and the checkpoint says so
    out = run(["train", "--runs-dir", str(tmp_path), "--save-model", *TINY, "--outer-steps", "50", "--cpu-budget", "1e-6"])
    assert "--cpu-budget 1e-06s reached after 1 of 50 outer steps" in out.stdout and "iter 2/50" not in out.stdout
    (path,) = glob.glob(str(tmp_path / "*" / "maml_ssm.cleanrl_model"))
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    assert ckpt["outer_steps_done"] == 1 and ckpt["args"]["outer_steps"] == 50 and ckpt["train_cpu_time"] > 0
    assert "--cpu-budget must be >= 0" in m.validate_args(m.Args(cpu_budget=-1))


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names):
    """Runs of one command and seed started in the same second (a shell loop over flags) used to share
    runs/{run_name}: their TensorBoard events mixed, and the later run's files replaced the earlier run's."""
    check = occupied_run_names(str(tmp_path), "point-nav-2d__collide__7__")
    run(["train", "--task", "point-nav-2d", "--runs-dir", str(tmp_path), "--save-model", *TINY, "--exp-name", "collide",
         "--seed", "7"])
    run_dir = check()
    assert glob.glob(os.path.join(run_dir, "*.cleanrl_model")) and os.path.isfile(os.path.join(run_dir, "eval.json"))


def test_a_runs_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "runs").write_text("")
    result = run(["train", "--runs-dir", str(tmp_path / "runs"), *TINY], check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("maml_ssm.py: error: ") and \
        "--runs-dir" in lines[0] and "not a directory" in lines[0], result.stderr
    assert result.stdout == ""


# ------------------------------------------------------------------------------------------------ TEST-TIME ADAPTATION (adapt)
def filled_buffer(data, state_dim, capacity=500):
    buf = m.ExperienceBuffer(capacity, 2, 5, 2, state_dim)
    for i, td in enumerate(data):
        m.add_batch_to_buffer(buf, {k: (v.float() if v.is_floating_point() else v) for k, v in td["val"].items()}, i)
    return buf


def adapter(model, data, mode="standard", objective="pg", **kw):
    cfg = m.AdaptConfig(adapt_objective=objective, adapt_lr=kw.pop("adapt_lr", 0.1), **kw)
    theta0 = {k: v.detach() for k, v in model.named_parameters()}
    buf = filled_buffer(data, model.initial_state(1).shape[1])
    return m.ADAPTERS[mode](model, theta0, cfg, buf, torch.Generator().manual_seed(0)), theta0


def test_buffer_ring_eviction_sampling_and_round_trip():
    buf = m.ExperienceBuffer(5, 1, 1, 1, 1)

    def items(vals):
        v = torch.tensor(vals, dtype=torch.float32)
        return dict(obs=v[:, None], inputs=v[:, None], actions=v[:, None], rewards=v, next_obs=v[:, None],
                    dones=torch.zeros(len(v), dtype=torch.bool), advantages=v, task_ids=v.long(), states=v[:, None])

    buf.add(**items([0, 1, 2]))
    buf.add(**items([3, 4, 5, 6]))
    assert len(buf) == 5 and buf.data["obs"][:, 0].tolist() == [5, 6, 2, 3, 4]
    buf.add(**items([7]))  # the oldest remaining entry (2) goes next
    assert buf.data["obs"][:, 0].tolist() == [5, 6, 7, 3, 4]
    s = buf.sample(64, torch.Generator().manual_seed(0))
    assert s["obs"].shape == (64, 1) and s["obs"].device == buf.device and s["task_ids"].dtype == torch.long
    assert set(s["obs"][:, 0].tolist()) <= {3.0, 4.0, 5.0, 6.0, 7.0}
    half = m.ExperienceBuffer(10, 1, 1, 1, 1)
    half.add(**items([1, 2, 3]))
    assert set(half.sample(50, torch.Generator().manual_seed(1))["obs"][:, 0].tolist()) <= {1.0, 2.0, 3.0}
    back = m.ExperienceBuffer.from_state_dict(buf.state_dict(), 1)
    assert (back.pos, back.size) == (buf.pos, buf.size)
    assert all(torch.equal(back.data[k], buf.data[k]) for k in m.ExperienceBuffer.FIELDS)
    with pytest.raises(ValueError, match="width 1"):
        m.ExperienceBuffer.from_state_dict(buf.state_dict(), 4)
    # a buffer saved before states were stored loads for a stateless (MLP) policy only
    old = buf.state_dict()
    old["data"] = {k: v for k, v in old["data"].items() if k != "states"}
    assert m.ExperienceBuffer.from_state_dict(old, 0).data["states"].shape == (5, 0)
    with pytest.raises(ValueError, match="predates stored recurrent states"):
        m.ExperienceBuffer.from_state_dict(old, 8)


@pytest.mark.parametrize("policy", ["ssm", "gru"])
def test_replayed_transition_continues_from_its_stored_recurrent_state(policy):
    # a transition replayed alone must give the policy/dynamics outputs it had inside its episode; from a fresh
    # (zero) state it would not, which is what this test rules out
    model, args, _ = tiny_setup(policy=policy, dtype=torch.float32)
    rng, _ = m.task_streams(3)
    env = m.make_env(args, m.sample_tasks(args.task, rng, 1, "train"), 4, torch.Generator().manual_seed(3))
    theta = {k: v.detach() for k, v in model.named_parameters()}
    batch = m.prepare_batch(m.rollout(model, [theta], env, args.max_episode_steps), args)
    buf = m.ExperienceBuffer(1000, 2, 5, 2, model.initial_state(1).shape[1])
    m.add_batch_to_buffer(buf, batch, 0)
    n = len(buf)
    rows = {k: v[:n] for k, v in buf.data.items()}
    with torch.no_grad():
        seq = m.functional_call(model, theta, (batch["inputs"], batch["starts"], model.initial_state(4)), {"actions": batch["actions"]})
        one = m.functional_call(model, theta, (rows["inputs"][None], torch.zeros(1, n, dtype=torch.bool), rows["states"]),
                                {"actions": rows["actions"][None]})
        fresh = m.functional_call(model, theta, (rows["inputs"][None], torch.ones(1, n, dtype=torch.bool), rows["states"]),
                                  {"actions": rows["actions"][None]})
    mask = batch["masks"] > 0
    assert torch.allclose(one["pi"][0], seq["pi"][mask], atol=1e-5)
    assert torch.allclose(one["next_obs"][0], seq["next_obs"][mask], atol=1e-5)
    assert not torch.allclose(fresh["pi"][0], seq["pi"][mask], atol=1e-3)
    # replay_as_batch feeds exactly these stored states: its pg loss equals the in-sequence one
    rb = m.replay_as_batch(rows)
    l_replay, _ = m.objective_loss(model, theta, rb, "pg")
    adv = batch["advantages"][mask]
    logp = m.log_prob(m.make_dist(seq, model.discrete), batch["actions"], model.discrete)[mask]
    assert l_replay.item() == pytest.approx(-(logp * adv).mean().item(), rel=1e-4)


def test_buffer_holds_only_training_task_transitions_and_adapt_leaves_checkpoint_intact(trained_ckpt):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    buf = m.ExperienceBuffer.from_state_dict(ckpt["buffer"], 2 * 4)  # TINY: SSM with --state-size 4
    train = torch.tensor(ckpt["task_split"]["train_tasks"], dtype=torch.float32)
    d = {k: v[: len(buf)] for k, v in buf.data.items()}
    assert len(buf) > 0 and d["task_ids"].max() < len(train)
    # point-nav reward is -||next_obs - goal||: every stored transition matches the goal of its training task
    assert torch.allclose(d["rewards"], -torch.linalg.vector_norm(d["next_obs"] - train[d["task_ids"]], dim=1), atol=1e-5)
    digest = sha(trained_ckpt)
    run(["adapt", "--checkpoint", trained_ckpt, "--num-tasks", "2", "--adapt-steps", "1", "--adaptation-mode",
         "standard", "hybrid", "--adapt-objective", "pg", "dynamics", "entropy"])
    assert sha(trained_ckpt) == digest
    res = json.load(open(os.path.join(os.path.dirname(trained_ckpt), "adapt.json")))
    assert set(res["results"]) == {f"{a}/{o}" for a in ("standard", "hybrid") for o in ("pg", "dynamics", "entropy")}
    assert all(list(r["returns_after_steps"]) == ["0", "1"] for r in res["results"].values())
    assert os.path.isfile(os.path.join(os.path.dirname(trained_ckpt), "adapt.png"))


def test_feature_shift_needs_training_statistics(tmp_path):
    """--outer-steps 0 (the random-init baseline) saves feature statistics that never saw a batch (mean 0, var 1,
    count 0); until session 17 adapt measured the feature shift against them and reported a meaningless number."""
    run(["train", "--task", "point-nav-2d", "--runs-dir", str(tmp_path), "--save-model", *TINY, "--outer-steps", "0"])
    (path,) = glob.glob(str(tmp_path / "*" / "maml_ssm.cleanrl_model"))
    assert torch.load(path, weights_only=False)["feature_stats"]["count"] == 0
    run(["adapt", "--checkpoint", path, "--num-tasks", "2", "--adapt-steps", "1"])
    res = json.load(open(os.path.join(os.path.dirname(path), "adapt.json")))
    monitors = [entry for r in res["results"].values() for entry in r["monitor"]]
    assert monitors and all("entropy" in e and "feature_shift" not in e for e in monitors)


def test_trust_region_holds_with_a_large_learning_rate():
    model, _, data = tiny_setup(dtype=torch.float32)
    ad, theta0 = adapter(model, data, adapt_lr=50.0, trust_region=0.5, max_step_norm=1e9, grad_clip=1e9)
    fired = []
    for _ in range(15):
        info = ad.step(data[0]["train"][0])
        fired.append(info["fired_trust_region"])
        assert info["drift"] <= 0.5 + 1e-4
    assert any(fired) and ad.drift() > 0.4


def test_clip_fires_on_huge_gradients_and_bounds_the_step():
    model, _, data = tiny_setup(dtype=torch.float32)
    batch = dict(data[0]["train"][0])
    batch["advantages"] = batch["advantages"] * 1e6
    ad, theta0 = adapter(model, data, adapt_lr=0.1, grad_clip=1.0, max_step_norm=1e9, trust_region=1e9)
    info = ad.step(batch)
    assert info["fired_clip"] and info["grad_norm"] > 1e3
    assert ad.drift() <= 0.1 * 1.0 + 1e-5
    # without the clip the same gradient moves theta by lr * ||g|| (lr small enough to keep the policy finite)
    ad2, _ = adapter(model, data, adapt_lr=1e-7, grad_clip=1e9, max_step_norm=1e9, trust_region=1e9)
    info2 = ad2.step(batch)
    assert not info2["guard_fired"] and info2["drift"] == pytest.approx(1e-7 * info2["grad_norm"], rel=1e-3)


def test_ema_math():
    model, _, data = tiny_setup(dtype=torch.float32)
    ad, theta0 = adapter(model, data, adapt_lr=0.5, ema_decay=0.7, trust_region=1e9, max_step_norm=1e9)
    ad.step(data[0]["train"][0])
    p1 = {k: v.detach().clone() for k, v in ad.params.items()}
    ad.step(data[0]["train"][0])
    for k in ad.names:
        e1 = 0.7 * theta0[k] + 0.3 * p1[k]
        assert torch.allclose(ad.acting_params()[k], 0.7 * e1 + 0.3 * ad.params[k].detach(), atol=1e-6)
    assert not torch.allclose(ad.acting_params()["pi.weight"], ad.params["pi.weight"].detach())


def test_parameter_selection_leaves_other_parameters_bit_identical():
    model, _, data = tiny_setup(dtype=torch.float32)
    ad, theta0 = adapter(model, data, adapt_params="heads", adapt_lr=0.5, objective="dynamics")
    for _ in range(3):
        ad.step(data[0]["train"][0])
    for k, v in ad.params.items():
        if k in ad.names:
            continue
        assert torch.equal(v, theta0[k]), k
    assert not torch.equal(ad.params["dyn_head.weight"], theta0["dyn_head.weight"])
    assert all(n.startswith(("pi.", "log_std", "value_head.", "dyn_head.")) for n in ad.names)
    assert set(m.select_params(theta0, "ssm")) == {k for k in theta0 if k.startswith("core.")}


def test_norm_selection_adapts_only_the_layernorm():
    torch.manual_seed(0)
    args = m.Args(hidden_size=6, state_size=3, max_episode_steps=10, fast_batch_size=3, tasks_per_batch=2, layer_norm=True)
    model = m.build_agent(args, m.PointNav2D)
    assert m.count_params(model) == m.agent_param_count("ssm", 2, 2, False, 6, 3, True, True)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    rng, _ = m.task_streams(0)
    data, _ = m.sample_task_batches(model, theta, m.sample_tasks(args.task, rng, 2, "train"), args,
                                    torch.Generator().manual_seed(0), 1, [0.5])
    ad, theta0 = adapter(model, data, adapt_params="norm", adapt_lr=0.5, objective="dynamics")
    assert set(ad.names) == {"norm.weight", "norm.bias"}
    for _ in range(2):
        ad.step(data[0]["train"][0])
    assert not torch.equal(ad.params["norm.weight"], theta0["norm.weight"])
    assert all(torch.equal(v, theta0[k]) for k, v in ad.params.items() if not k.startswith("norm."))


@pytest.mark.parametrize("objective", ["pg", "dynamics", "entropy"])
def test_hybrid_loss_is_current_plus_weighted_replay(objective):
    model, _, data = tiny_setup(dtype=torch.float32)
    batch = data[0]["train"][0]
    std, _ = adapter(model, data, "standard", objective)
    hyb, _ = adapter(model, data, "hybrid", objective, experience_weight=0.3)
    replay = hyb.replay_batch()
    cur, rep = std.loss(batch).item(), std.loss(replay).item()
    assert hyb.loss(batch, replay).item() == pytest.approx(cur + 0.3 * rep, rel=1e-5)
    assert abs(rep) > 1e-6
    zero, _ = adapter(model, data, "hybrid", objective, experience_weight=0.0)
    assert zero.loss(batch, replay).item() == cur


def test_dynamics_objective_ignores_rewards_and_pg_does_not():
    model, args, data = tiny_setup(dtype=torch.float32)
    batch = data[0]["train"][0]
    params = {k: v.detach() for k, v in model.named_parameters()}
    other = dict(batch)
    other["rewards"] = torch.randn_like(batch["rewards"]) * batch["masks"]
    inputs = batch["inputs"].clone()
    inputs[1:, :, -1] = other["rewards"][:-1]  # the in-context reward channel changes too
    other["inputs"] = inputs
    other["advantages"] = m.compute_advantages(other, args.gamma, args.gae_lambda)
    d1, _ = m.objective_loss(model, params, batch, "dynamics")
    d2, _ = m.objective_loss(model, params, other, "dynamics")
    assert d1.item() == d2.item()
    p1, _ = m.objective_loss(model, params, batch, "pg")
    p2, _ = m.objective_loss(model, params, other, "pg")
    assert abs(p1.item() - p2.item()) > 1e-4


def test_strategy_registry_and_tent_adds_entropy():
    model, _, data = tiny_setup(dtype=torch.float32)
    assert {"none", "tent"} <= set(m.STRATEGIES)

    @m.register_strategy("double_for_test")
    def double(loss, out, masks, cfg):
        return 2 * loss

    batch = data[0]["train"][0]
    base, _ = adapter(model, data, objective="dynamics")
    tent, _ = adapter(model, data, objective="dynamics", strategy="tent", tent_coef=0.5)
    dbl, _ = adapter(model, data, objective="dynamics", strategy="double_for_test")
    ent, _ = adapter(model, data, objective="entropy")
    assert tent.loss(batch).item() == pytest.approx(base.loss(batch).item() + 0.5 * ent.loss(batch).item(), rel=1e-5)
    assert dbl.loss(batch).item() == pytest.approx(2 * base.loss(batch).item(), rel=1e-6)
    del m.STRATEGIES["double_for_test"]


def test_adapt_online_and_bad_input(trained_ckpt):
    out = run(["adapt", "--checkpoint", trained_ckpt, "--num-tasks", "2", "--adapt-steps", "1", "--online",
               "--online-every", "4", "--adaptation-mode", "hybrid", "--adapt-objective", "dynamics", "--ema-decay", "0.5"])
    res = json.load(open(os.path.join(os.path.dirname(trained_ckpt), "adapt_online.json")))
    assert res["online"] and res["results"]["hybrid/dynamics"]["final_drift"] > 0
    res = run(["adapt", "--checkpoint", trained_ckpt, "--adaptation-mode", "replay"], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "unknown --adaptation-mode" in lines[0], res.stderr
    # the same validator, in process (the subprocess above proves it is wired to one line + exit 2)
    assert "--adapt-lr must be positive" in m.validate_adapt_args(m.AdaptArgs(trained_ckpt, adapt_lr=0.0))
    # entropy on a Gaussian policy has a gradient for the log-std only: with the core's parameters it was a traceback
    res = run(["adapt", "--checkpoint", trained_ckpt, "--adapt-objective", "entropy", "--adapt-params", "ssm"],
              check=False)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "maml_ssm.py: error: --adapt-objective entropy on this Gaussian policy reaches only its log-std, which "
        "--adapt-params ssm does not adapt; use --adapt-params all or heads, or another objective"], res.stderr
    res = run(["adapt", "--checkpoint", trained_ckpt, "--adapt-params", "norm"], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "train it with --layer-norm" in lines[0], res.stderr
    horizon = torch.load(trained_ckpt, weights_only=False)["args"]["max_episode_steps"]
    res = run(["adapt", "--checkpoint", trained_ckpt, "--online", "--online-every", str(horizon)], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "no step would adapt" in lines[0], res.stderr
    assert "unknown --adapt-params" in m.validate_adapt_args(m.AdaptArgs(trained_ckpt, adapt_params="bias"))
    assert "unknown --adapt-objective" in m.validate_adapt_args(m.AdaptArgs(trained_ckpt, adapt_objective=("reward",)))
    assert "at least one value" in m.validate_adapt_args(m.AdaptArgs(trained_ckpt, adapt_objective=()))
    assert "--trust-region nan must be a finite" in m.validate_adapt_args(m.AdaptArgs(trained_ckpt, trust_region=float("nan")))
    assert "--eval-seed -1 must be in" in m.validate_adapt_args(m.AdaptArgs(trained_ckpt, eval_seed=-1))
    assert m.validate_adapt_args(m.AdaptArgs(trained_ckpt)) is None


def probe_hunks(name):
    """(old text, new text, added lines) of each hunk of a probe patch in benchmark/probes/."""
    hunks = []
    for h in open(os.path.join(REPO, "benchmark", "probes", name)).read().split("\n@@ ")[1:]:
        lines = h.split("\n")[1:]
        old = "\n".join(x[1:] for x in lines if x[:1] in (" ", "-")) + "\n"
        new = "\n".join(x[1:] for x in lines if x[:1] in (" ", "+")) + "\n"
        hunks.append((old, new, [x for x in lines if x[:1] == "+"]))
    return hunks


@pytest.mark.parametrize("name", ["maml_ssm_paper_policy.patch", "maml_ssm_cg_subsample.patch", "maml_ssm_tanh_mean.patch",
                                  "maml_ssm_rllab_baseline.patch"])
def test_probe_patches_quoted_in_the_docs_still_apply(name):
    """Every hunk's old text (context and removed lines) occurs exactly once in the script, so `patch` places it
    unambiguously without fuzz and the docs' probe commands still apply (this does not run the patched script)."""
    script = open(os.path.join(REPO, SCRIPT)).read()
    hunks = probe_hunks(name)
    assert hunks
    for old, _, added in hunks:
        assert script.count(old) == 1, old
        assert added  # every hunk adds code


def load_probe(name, tmp_path):
    """The script with a probe patch applied (each hunk's old text replaced by its new text), imported."""
    script = open(os.path.join(REPO, SCRIPT)).read()
    for old, new, _ in probe_hunks(name):
        assert script.count(old) == 1
        script = script.replace(old, new)
    path = tmp_path / ("probe_" + name.replace(".patch", ".py"))
    path.write_text(script)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rllab_baseline_probe_predicts_each_batch_with_the_fit_made_before_it(tmp_path):
    p = load_probe("maml_ssm_rllab_baseline.patch", tmp_path)
    torch.manual_seed(0)
    args = p.Args(policy="mlp", hidden_size=6, max_episode_steps=10, fast_batch_size=3, rllab_baseline=True)
    model = p.build_agent(args, p.PointNav2D)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    tasks = p.sample_tasks(args.task, np.random.default_rng(0), 3, "train")
    fit = lambda bs: p.fit_linear_baseline(bs, args.gamma)
    same = lambda b, w: torch.allclose(b["advantages"], p.compute_advantages(b, args.gamma, args.gae_lambda, w=w), atol=1e-6)

    # evaluation (the paper's test script: one baseline per task): zero first, then the previous step's fit
    data, _ = p.sample_task_batches(model, theta, tasks, args, torch.Generator().manual_seed(0), 2, [0.1, 0.05])
    for td in data:
        (b0, b1), b2 = td["train"], td["val"]
        assert same(b0, "zero") and same(b1, fit([b0])) and same(b2, fit([b1]))
        assert not same(b1, fit([b1])) and not same(b0, fit([b0]))  # not the batch's own fit
        # the probe's default (the batch's own fit) is the script's per-task baseline, bit for bit
        assert torch.equal(p.linear_baseline(b1, args.gamma), m.linear_baseline(b1, args.gamma))
        assert torch.equal(p.compute_advantages(b1, args.gamma, args.gae_lambda),
                           m.compute_advantages(b1, args.gamma, args.gae_lambda))

    # meta-training (one baseline for all tasks): refitted after each task's batch and on each step's whole batch
    shared = {"w": fit([data[0]["val"]])}
    first = shared["w"]
    data, _ = p.sample_task_batches(model, theta, tasks, args, torch.Generator().manual_seed(1), 1, [0.1], shared)
    pre, post = [td["train"][0] for td in data], [td["val"] for td in data]
    assert same(pre[0], first) and same(pre[1], fit([pre[0]])) and same(pre[2], fit([pre[1]]))
    assert same(post[0], fit(pre)) and same(post[1], fit([post[0]])) and same(post[2], fit([post[1]]))
    assert torch.allclose(shared["w"], fit(post))
    # without the flag the probe computes what the script does
    args.rllab_baseline = False
    data, _ = p.sample_task_batches(model, theta, tasks, args, torch.Generator().manual_seed(1), 1, [0.1], shared)
    assert same(data[0]["train"][0], fit([data[0]["train"][0]]))


def test_corner_probe_mirrors_one_draw_of_goals_into_every_corner(trained_ckpt, tmp_path, capsys, monkeypatch):
    """benchmark/probes/maml_point_nav_corners.py (the docs' run-away-by-corner table): the same goals mirrored into
    each corner, adapted with eval's step sizes, and the unadapted policy's first mean action as the policy gives it."""
    spec = importlib.util.spec_from_file_location("corners", os.path.join(REPO, "benchmark", "probes",
                                                                          "maml_point_nav_corners.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    seen, real = [], probe.m.sample_task_batches

    def spy(model, theta, tasks, args, gen, num_steps, lrs, *rest):
        seen.append((np.array(tasks), list(lrs)))
        return real(model, theta, tasks, args, gen, num_steps, lrs, *rest)

    monkeypatch.setattr(probe.m, "sample_task_batches", spy)
    res = probe.corners(trained_ckpt, num_goals=3, num_steps=2)
    model, args, _ = m.load_checkpoint(trained_ckpt)
    assert [r["corner"] for r in res["rows"]] == [list(c) for c in probe.CORNERS] and len(seen) == 4
    for (tasks, lrs), (sx, sy) in zip(seen, probe.CORNERS):
        assert np.allclose(tasks, seen[0][0] * np.array([sx, sy])) and (np.sign(tasks) == [sx, sy]).all()
        assert (np.abs(tasks) >= probe.LOW).all() and lrs == [args.inner_lr, args.inner_lr * args.eval_later_lr_scale]
    for r in res["rows"]:
        assert len(r["mean"]) == 3 and all(0 <= n <= 3 for n in r["tasks_below_threshold"])
    x = model.make_input(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 1))[None]
    with torch.no_grad():
        pi = model(x, torch.tensor([[True]]), model.initial_state(1), scan=False)["pi"][0, 0].clamp(-1, 1)
    assert res["first_mean_action"] == pytest.approx(pi.tolist())
    assert probe.main([str(tmp_path / "missing.cleanrl_model")]) == 2 and "does not exist" in capsys.readouterr().err


def test_homing_diagnostic_samples_what_eval_samples(trained_ckpt, tmp_path, capsys, monkeypatch):
    """benchmark/probes/maml_point_nav_homing.py reports the docs' breakdown of the adapted return; its returns are
    eval's own (same tasks, seeds and step sizes), and its mean-action rollout is the policy without sampling noise."""
    spec = importlib.util.spec_from_file_location("homing", os.path.join(REPO, "benchmark", "probes", "maml_point_nav_homing.py"))
    homing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(homing)
    res = homing.diagnose(trained_ckpt, num_tasks=3, num_steps=2)
    ev = m.evaluate(trained_ckpt, 3, 2, write=False)
    assert [r["return_mean"] for r in res["rows"]] == [ev["returns_after_steps"][k] for k in "012"]
    model, args, _ = m.load_checkpoint(trained_ckpt)
    for r in res["rows"]:
        assert 1 <= r["episode_length"] <= args.max_episode_steps and 0 <= r["ended_at_goal"] <= 1
        assert 0 <= r["mean_action_reached"] <= 1 and r["mean_action_final_distance_median"] >= 0
        assert 0 <= r["ran_away_overshot"] <= r["ran_away_episodes"] and set(r["runaway_tasks"]) <= {0, 1, 2}
        assert (r["ran_away_episodes"] > 0) == bool(r["runaway_tasks"])
    assert np.mean(res["task_returns"][2]) == pytest.approx(res["rows"][2]["return_mean"])
    assert np.allclose(res["goals"], m.sample_tasks("point-nav-2d", m.task_streams(res["seed"])[1], 3, "test"))
    assert res["rows"][0]["action_std"] == pytest.approx(torch.exp(model.log_std).mean().item())
    # the mean-action episode of a policy whose mean is (1, 0) everywhere: a goal one full step away along x is
    # reached on the first step; a goal one step behind the start is never reached (12 steps, 0.2 ... 1.3 away)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    theta["pi.weight"] = torch.zeros_like(theta["pi.weight"])
    theta["pi.bias"] = torch.tensor([1.0, 0.0])
    ret, steps, dist, reached = homing.mean_action_rollout(model, theta, np.array([0.1, 0.0]), 12, False)
    assert reached and steps == 1 and dist == pytest.approx(0.0, abs=1e-6)
    ret, steps, dist, reached = homing.mean_action_rollout(model, theta, np.array([-0.1, 0.0]), 12, False)
    assert not reached and steps == 12 and dist == pytest.approx(1.3) and ret == pytest.approx(-sum(0.1 * (k + 1) + 0.1 for k in range(12)))
    assert homing.main([trained_ckpt, "--num-tasks", "0"]) == 2
    assert homing.main([str(tmp_path / "missing.cleanrl_model")]) == 2
    assert "does not exist" in capsys.readouterr().err
    other = copy.deepcopy(args)
    other.task = "cartpole-physics"
    monkeypatch.setattr(homing.m, "load_checkpoint", lambda path: (model, other, {}))
    assert homing.main([trained_ckpt]) == 2
    assert "this diagnostic is for point-nav-2d" in capsys.readouterr().err
    assert homing.main([trained_ckpt, "--script", str(tmp_path / "nope.py")]) == 2
    assert "--script" in capsys.readouterr().err


def test_homing_counts_run_away_episodes_from_their_last_valid_step():
    """A run-away episode ends more than RUNAWAY_DISTANCE from its goal; it overshot if it came within PASS_DISTANCE
    first. The final position is the one after the episode's last valid step, not the padded last row."""
    spec = importlib.util.spec_from_file_location("homing", os.path.join(REPO, "benchmark", "probes", "maml_point_nav_homing.py"))
    homing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(homing)
    goal = np.array([0.3, 0.0])
    # four episodes (columns), positions after each step along x; episode 0 reaches the goal at step 3 and its
    # padded row holds a far-away position that must be ignored; episode 1 passes the goal and runs on to 1.0;
    # episode 2 heads the other way and never comes near; episode 3 heads away too and ends after two steps, its
    # padded rows sitting on the goal, which must not count as having come near it
    xs = torch.tensor([[0.1, 0.1, -0.1, -0.3], [0.2, 0.2, -0.2, -0.4], [0.3, 0.3, -0.3, 0.3], [9.0, 1.0, -0.4, 0.3]])
    masks = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [0, 1, 1, 0]])
    batch = {"next_obs": torch.stack([xs, torch.zeros_like(xs)], -1), "masks": masks}
    final, closest = homing.episode_distances(batch, goal)
    assert final == pytest.approx([0.0, 0.7, 0.7, 0.7], abs=1e-6)
    assert closest == pytest.approx([0.0, 0.0, 0.4, 0.6], abs=1e-6)
    other = {"next_obs": torch.zeros(2, 1, 2), "masks": torch.ones(2, 1)}  # a second task whose episode stays at its goal
    counts = homing.count_runaways([batch, other], [goal, np.zeros(2)])
    assert counts == {"ran_away": 0.6, "ran_away_overshot": 1, "ran_away_episodes": 3, "runaway_tasks": [0]}


def zero_mean_script(tmp_path):
    """A copy of the script whose Gaussian mean is scaled by 0: a probe given it with --script acts differently."""
    src = open(os.path.join(REPO, SCRIPT)).read()
    old = 'out = {"pi": self.pi(feats),'
    assert src.count(old) == 1
    path = tmp_path / "patched.py"
    path.write_text(src.replace(old, 'out = {"pi": 0.0 * self.pi(feats),'))
    return str(path)


def test_homing_probe_acts_with_the_script_it_is_given(trained_ckpt, tmp_path, capsys):
    """--script loads a (patched) copy: a copy whose Gaussian mean is scaled by 0 gives other returns than the
    original on the same checkpoint, so the probe really acts with the given script's model."""
    spec = importlib.util.spec_from_file_location("homing", os.path.join(REPO, "benchmark", "probes", "maml_point_nav_homing.py"))
    homing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(homing)
    patched_script = zero_mean_script(tmp_path)
    line = lambda out: [json.loads(x) for x in out.splitlines() if x.startswith("{")][0]["rows"]
    assert homing.main([trained_ckpt, "--num-tasks", "2", "--num-steps", "0"]) == 0
    original = line(capsys.readouterr().out)
    assert homing.main([trained_ckpt, "--num-tasks", "2", "--num-steps", "0", "--script", patched_script]) == 0
    patched = line(capsys.readouterr().out)
    assert original[0]["return_mean"] == pytest.approx(m.evaluate(trained_ckpt, 2, 0, write=False)["returns_after_steps"]["0"])
    assert patched[0]["mean_action_return"] != original[0]["mean_action_return"]


def test_paper_goals_probe_acts_with_the_script_it_is_given(trained_ckpt, tmp_path, capsys):
    """--script loads a (patched) copy, as the homing probe's does: a copy whose Gaussian mean is scaled by 0 gives
    other returns than the original on the same checkpoint, under both goal sets and both rules."""
    spec = importlib.util.spec_from_file_location("paper_goals", os.path.join(REPO, "benchmark", "probes",
                                                                              "maml_point_nav_paper_goals.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    patched_script = zero_mean_script(tmp_path)
    result = lambda out: [json.loads(x) for x in out.splitlines() if x.startswith('{"checkpoint"')][0]
    assert probe.main([trained_ckpt, "--num-steps", "0"]) == 0
    original = result(capsys.readouterr().out)
    assert probe.main([trained_ckpt, "--num-steps", "0", "--script", patched_script]) == 0
    patched = result(capsys.readouterr().out)
    assert original["eval_goals"]["eval_rule"][0]["mean"] == pytest.approx(
        m.evaluate(trained_ckpt, num_steps=0, write=False)["returns_after_steps"]["0"], abs=1e-6)
    for name in probe.GOAL_SETS:
        for rule in probe.RULES:
            assert patched[name][rule][0]["mean"] != original[name][rule][0]["mean"]
    assert probe.main([trained_ckpt, "--script", str(tmp_path / "nope.py")]) == 2
    assert "--script" in capsys.readouterr().err


def test_homing_oracle_steps_straight_at_the_goal():
    spec = importlib.util.spec_from_file_location("homing", os.path.join(REPO, "benchmark", "probes", "maml_point_nav_homing.py"))
    homing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(homing)
    # without noise: (0.25, 0) is reached on the third step (positions 0.1, 0.2, 0.25), return -(0.15 + 0.05 + 0)
    assert homing.oracle_return(np.array([[0.25, 0.0]]), 0.0, 100, True, episodes=2) == pytest.approx(-0.2, abs=1e-6)
    # noise costs return, more the larger it is
    goals = np.array([[0.3, -0.2], [-0.4, 0.1]])
    r = [homing.oracle_return(goals, s, 100, True, episodes=200) for s in (0.0, 0.1, 0.4)]
    assert r[0] > r[1] > r[2]


def load_paper_sampler_probe():
    spec = importlib.util.spec_from_file_location("paper_sampler", os.path.join(REPO, "benchmark", "probes", "maml_paper_sampler_eval.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def simulate_vectorized_sampler(lengths, budget):
    """The paper code's sampling loop, step by step: all envs step together, each starts its next episode when one
    ends, finished episodes add their length to the count, and the count is checked after every full step."""
    W, n = lengths.shape
    keep = np.zeros((W, n), dtype=bool)
    episode, elapsed, samples = [0] * n, [0] * n, 0
    while samples < budget:
        for j in range(n):
            elapsed[j] += 1
            if elapsed[j] == lengths[episode[j], j]:
                keep[episode[j], j] = True
                samples += lengths[episode[j], j]
                episode[j], elapsed[j] = episode[j] + 1, 0
    return keep


def test_paper_sampler_keeps_what_the_papers_lockstep_loop_keeps():
    """benchmark/probes/maml_paper_sampler_eval.py: lockstep_keep is the paper's vectorised sampler's stopping rule,
    checked against a step-by-step simulation of its loop, and it favours short episodes."""
    probe = load_paper_sampler_probe()
    # two envs, horizon 4, budget 8: env 0 finishes four 1-step episodes by step 4, when env 1 finishes its first
    # 4-step one; 4 + 4 = 8 reaches the budget after step 4, so env 0's fifth and env 1's second are dropped
    lengths = np.array([[1, 4], [1, 4], [1, 4], [1, 4], [4, 4], [4, 4], [4, 4], [4, 4]])
    expected = np.zeros_like(lengths, dtype=bool)
    expected[:4, 0] = expected[0, 1] = True
    assert (probe.lockstep_keep(lengths, 8).numpy() == expected).all()
    rng = np.random.default_rng(0)
    H, n = 10, 6
    for trial in range(300):
        lengths = rng.integers(1, H + 1, size=(2 * H, n)) if trial % 3 else np.full((2 * H, n), H)
        if trial % 3 == 2:  # mostly long episodes with a few short ones, where dropping the running ones matters most
            lengths = np.where(rng.random((2 * H, n)) < 0.3, rng.integers(1, 4, size=(2 * H, n)), H)
        keep = probe.lockstep_keep(lengths, n * H).numpy()
        assert (keep == simulate_vectorized_sampler(lengths, n * H)).all()
        assert keep[0].all() and lengths[keep].sum() >= n * H  # every env's first episode ends by step H
        if trial % 3 == 0:
            assert keep.sum() == n  # all episodes as long as the horizon: exactly the first wave
    # episodes of lengths 1..H, equally likely: the kept ones are shorter on average than the episodes run
    lengths = rng.integers(1, H + 1, size=(2 * H, 200))
    assert lengths[probe.lockstep_keep(lengths, 200 * H).numpy()].mean() < lengths.mean() - 0.5
    with pytest.raises(ValueError, match="fewer than the budget"):
        probe.lockstep_keep(np.full((2, 3), 4), 100)
    with pytest.raises(ValueError, match="sample more"):
        probe.lockstep_keep(np.array([[4, 1], [4, 1]]), 8)  # env 1's episodes end at step 2, stopping is at step 4


def test_paper_sampler_probe_samples_what_eval_samples(trained_ckpt, capsys, tmp_path):
    """The probe draws eval's test tasks and first episodes (its first-episode return before adaptation is eval's
    return when eval keeps only those), applies the paper's rule to every step's batch, and restores the script."""
    probe = load_paper_sampler_probe()
    model, args, _ = m.load_checkpoint(trained_ckpt)
    assert not args.fill_steps  # so eval's own batch is exactly one episode per env
    original = m.fill_to_steps
    res = probe.paper_sampler_eval(m, trained_ckpt, num_tasks=3, num_steps=2)
    assert m.fill_to_steps is original
    ev = m.evaluate(trained_ckpt, 3, 2, write=False)
    assert res["rows"][0]["first_episode_return"] == pytest.approx(ev["returns_after_steps"]["0"], abs=1e-6)
    n = args.eval_episodes or args.fast_batch_size
    for r in res["rows"]:
        assert r["kept_episodes"] >= n and 1 <= r["kept_length"] <= args.max_episode_steps
        assert 1 <= r["first_episode_length"] <= args.max_episode_steps
        # the kept episodes reach the budget, and stop within one horizon of it (a probe that kept every episode
        # it sampled would hold at least 2 x horizon steps per env)
        assert n * args.max_episode_steps <= r["kept_steps"] < n * (2 * args.max_episode_steps - 1) + 1
    assert [r["steps"] for r in res["rows"]] == [0, 1, 2]
    assert probe.main([trained_ckpt, "--num-tasks", "2", "--num-steps", "0"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["checkpoint"] == trained_ckpt and len(line["rows"]) == 1
    assert probe.main([str(tmp_path / "missing.cleanrl_model")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert probe.main([trained_ckpt, "--num-tasks", "0"]) == 2
    assert probe.main([trained_ckpt, "--script", str(tmp_path / "nope.py")]) == 2
    assert "--script" in capsys.readouterr().err


def test_trpo_step_stats_probe_reads_what_the_run_logged(trained_ckpt):
    """benchmark/probes/maml_trpo_step_stats.py (the before/after table of docs/maml_ssm.md, "TRPO's step scaling"):
    iterations from the checkpoint, line-search trials and accepted KL from the run's own events, returns from
    eval.json."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = importlib.util.spec_from_file_location("trpo_stats", os.path.join(REPO, "benchmark", "probes", "maml_trpo_step_stats.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    run_dir = os.path.dirname(trained_ckpt)
    r = probe.stats(run_dir)
    ckpt = torch.load(trained_ckpt, weights_only=False)
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    trials = [e.value for e in acc.Scalars("meta/line_search_steps")]
    accepted = [e.value > 0.5 for e in acc.Scalars("meta/step_accepted")]
    kls = [e.value for e, a in zip(acc.Scalars("losses/approx_kl"), accepted) if a]
    assert r["iterations"] == ckpt["outer_steps_done"] == len(trials)
    assert r["cpu_s_per_iteration"] == pytest.approx(ckpt["train_cpu_time"] / ckpt["outer_steps_done"])
    assert r["mean_trials"] == pytest.approx(np.mean(trials)) and r["accepted"] == pytest.approx(np.mean(accepted))
    if kls:
        assert r["mean_accepted_kl"] == pytest.approx(np.mean(kls))
    with open(os.path.join(run_dir, "eval.json")) as f:
        ev = json.load(f)["returns_after_steps"]
    assert r["returns"] == [ev[str(k)] for k in range(len(ev))]
    assert probe.main([]) == 2


def test_paper_goals_probe_measures_eval_and_the_papers_goals_under_both_samplers(trained_ckpt, capsys, tmp_path,
                                                                                   monkeypatch):
    """benchmark/probes/maml_point_nav_paper_goals.py: the paper's goals are the ones test_maml_point.py draws
    (np.random.seed(1), then 40 uniform draws in [-0.5, 0.5]^2); on eval's goals its eval rule is `eval`; the
    paper-sampler rule is maml_paper_sampler_eval's on the same goals; each goal set reaches both rules."""
    spec = importlib.util.spec_from_file_location("paper_goals", os.path.join(REPO, "benchmark", "probes",
                                                                              "maml_point_nav_paper_goals.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    state = np.random.get_state()
    np.random.seed(1)
    expected = np.random.uniform(-0.5, 0.5, size=(40, 2))
    np.random.set_state(state)
    assert np.array_equal(probe.paper_goals(), expected)
    assert probe.paper_goals()[0] == pytest.approx([-0.0829780, 0.2203245], abs=1e-6)
    # given tasks replace the sampler probe's own draw of the same test tasks without changing anything else
    model, args, _ = m.load_checkpoint(trained_ckpt)
    tasks = m.sample_tasks(args.task, m.task_streams(args.seed)[1], 3, "test")
    sampler = load_paper_sampler_probe()
    a = sampler.paper_sampler_eval(m, trained_ckpt, num_tasks=3, num_steps=1)
    b = sampler.paper_sampler_eval(m, trained_ckpt, num_steps=1, tasks=tasks)
    assert [r["task_returns"] for r in a["rows"]] == [r["task_returns"] for r in b["rows"]]
    assert all(np.mean(r["task_returns"]) == pytest.approx(r["return"]) for r in a["rows"])
    # the probe: eval's goals under eval's rule are eval; both goal sets reach both rules
    mod = probe.load_script(probe.SCRIPT)
    seen, real = [], mod.sample_task_batches

    def spy(model, theta, goals, *rest):
        seen.append(np.array(goals))
        return real(model, theta, goals, *rest)

    monkeypatch.setattr(mod, "sample_task_batches", spy)
    res = probe.probe(mod, trained_ckpt, num_steps=2)
    ev = m.evaluate(trained_ckpt, num_steps=2, write=False)
    assert [r["mean"] for r in res["eval_goals"]["eval_rule"]] == pytest.approx(
        [ev["returns_after_steps"][k] for k in "012"], abs=1e-6)
    ours = m.sample_tasks(args.task, m.task_streams(args.seed)[1], args.eval_tasks, "test")
    assert len(seen) == 4 and all(np.array_equal(g, x) for g, x in zip(seen, [ours, ours, expected, expected]))
    for name in probe.GOAL_SETS:
        for rule in probe.RULES:
            assert len(res[name][rule]) == 3 and all(0 <= r["below_threshold"] <= 40 for r in res[name][rule])
    assert probe.summary([-1.0, -20.0, -15.0]) == {"mean": -12.0, "median": -15.0, "below_threshold": 1}  # strictly below
    # the summary table and the figure, also from a file of printed results: per-seed means, then their mean and
    # median over checkpoints
    shifted = []
    for seed, shift in ((99, 10.0), (98, 50.0)):
        other = json.loads(json.dumps(res))
        other["seed"] = seed
        for rows in other["paper_goals"].values():
            for r in rows:
                r["mean"] -= shift
        shifted.append(json.dumps(other))
    out = tmp_path / "probe_out.txt"
    out.write_text("some log line\n" + json.dumps(res) + "\n" + "\n".join(shifted) + "\n")
    png = tmp_path / "measures.png"
    capsys.readouterr()
    assert probe.main(["--from-output", str(out), "--plot", str(png)]) == 0 and png.stat().st_size > 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert args.seed < 98  # rows sorted by seed
    assert lines[2].startswith(f"| {args.seed} |") and lines[3].startswith("| 98 |") and lines[4].startswith("| 99 |")
    fmt = lambda v: " / ".join(f"{x:.2f}" for x in v)
    mean_row, median_row = lines[5].split(" | "), lines[6].split(" | ")
    ev_goals = [r["mean"] for r in res["eval_goals"]["eval_rule"]]
    pg = [r["mean"] for r in res["paper_goals"]["paper_sampler"]]
    assert mean_row[0] == "| mean over 3" and mean_row[1] == fmt(ev_goals) and median_row[1] == fmt(ev_goals)
    assert mean_row[4].rstrip(" |") == fmt([x - 20.0 for x in pg]) and median_row[4].rstrip(" |") == fmt([x - 10.0 for x in pg])
    assert "-3.33" in lines[7]
    assert probe.main([str(tmp_path / "missing.cleanrl_model")]) == 2 and "does not exist" in capsys.readouterr().err
    assert probe.main([trained_ckpt, "--num-steps", "-1"]) == 2
    assert probe.main([trained_ckpt, "--num-steps", "0", "--plot", str(png)]) == 2 and "--plot" in capsys.readouterr().err
    assert probe.main([trained_ckpt, "--plot", str(tmp_path / "no" / "x.png")]) == 2
    assert probe.main(["--from-output", str(out)]) == 2 and "--plot" in capsys.readouterr().err
    assert probe.main([]) == 2
    (tmp_path / "empty.txt").write_text("nothing\n")
    assert probe.main(["--from-output", str(tmp_path / "empty.txt"), "--plot", str(png)]) == 2
