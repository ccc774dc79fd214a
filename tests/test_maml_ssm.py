"""Tests of cleanrl_astral/maml_ssm.py: the LRU and the policies, the tasks, the training loop, checkpoints,
`eval` and the command line. MAML/TRPO numerics are in test_maml_ssm_trpo.py, `adapt` in test_maml_ssm_adapt.py."""

import dataclasses
import glob
import json
import os
import subprocess
import sys
import time
import types

import maml_fixtures
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO, SCRIPT_ENV, assert_one_line_error, logged_scalars, sha256
from maml_fixtures import (
    TINY,
    TINY_ARGS,
    parsed_train_args,
    run_maml,
    tiny_setup,
    train_tiny,
    validation_error,
)

import cleanrl_astral.maml_ssm as maml_ssm

# the checkpoints the tests share (module-scoped fixtures of tests/maml_fixtures.py)
trained_ckpt = maml_fixtures.trained_ckpt
cartpole_ckpt = maml_fixtures.cartpole_ckpt


def train_in_process(tmp_path, monkeypatch, **kw):
    """Runs main_train in this process; returns (the trained model, its parameters before training, run dir)."""
    made = []
    real_build = maml_ssm.build_agent

    def spy_build(args, env_cls):
        model = real_build(args, env_cls)
        made.append((model, {k: v.detach().clone() for k, v in model.named_parameters()}))
        return model

    monkeypatch.setattr(maml_ssm, "build_agent", spy_build)
    runs = tmp_path / f"runs{len(list(tmp_path.iterdir()))}"
    maml_ssm.train(maml_ssm.Args(runs_dir=str(runs), **{**TINY_ARGS, **kw}))
    monkeypatch.setattr(maml_ssm, "build_agent", real_build)
    (run_dir,) = glob.glob(str(runs / "*"))
    return made[0][0], made[0][1], run_dir


def train_spied(tmp_path, monkeypatch, **kw):
    """main_train in this process on tiny settings; returns the tasks_data each iteration sampled, the batches
    handed to add_batch_to_buffer, every logged scalar and the policy outputs of the aux step's val batches."""
    sampled, buffered, scalars, aux_outs, outer_done = [], [], {}, [], []
    real_sample, real_add, real_policy_out = maml_ssm.sample_task_batches, maml_ssm.add_batch_to_buffer, maml_ssm.policy_out
    real_trpo = maml_ssm.trpo_step

    def spy_trpo(*a, **k):
        res = real_trpo(*a, **k)
        outer_done.append(True)  # policy_out calls from here on are the aux step's
        return res

    def spy_sample(*a, **k):
        res = real_sample(*a, **k)
        sampled.append(res[0])
        return res

    def spy_add(buffer, batch, task_id):
        buffered.append((batch, task_id))
        return real_add(buffer, batch, task_id)

    def spy_policy_out(model, params, batch):
        out = real_policy_out(model, params, batch)
        if outer_done and any(batch is td["val"] for td in sampled[-1]):
            # the dynamics head as the aux step reads it (aux_opt.step() comes after every val batch's loss)
            aux_outs.append((batch, out, {k: v.detach().clone() for k, v in model.dyn_head.state_dict().items()}))
        return out

    from torch.utils.tensorboard import SummaryWriter

    real_add_scalar = SummaryWriter.add_scalar

    def spy_add_scalar(self, tag, value, step=None, *a, **k):
        scalars.setdefault(tag, []).append(float(value))
        return real_add_scalar(self, tag, value, step, *a, **k)

    monkeypatch.setattr(maml_ssm, "sample_task_batches", spy_sample)
    monkeypatch.setattr(maml_ssm, "add_batch_to_buffer", spy_add)
    monkeypatch.setattr(maml_ssm, "policy_out", spy_policy_out)
    monkeypatch.setattr(maml_ssm, "trpo_step", spy_trpo)
    monkeypatch.setattr(SummaryWriter, "add_scalar", spy_add_scalar)
    args = maml_ssm.Args(
        runs_dir=str(tmp_path),
        exp_name="spied",
        outer_steps=1,
        fast_batch_size=3,
        hidden_size=6,
        state_size=3,
        cg_iters=2,
        ls_max_steps=2,
        buffer_size=1000,
        **kw,
    )
    maml_ssm.train(args)
    return sampled, buffered, scalars, aux_outs


# ------------------------------------------------------------------------------------------------ SSM AND POLICIES


def test_lru_stable_for_all_reachable_parameters():
    lru = maml_ssm.LRU(4, 64)
    with torch.no_grad():
        lru.nu_log.copy_(torch.linspace(-200.0, 80.0, 64))  # exp(nu) from 0 to overflow-size
        lru.theta_log.copy_(torch.linspace(-50.0, 50.0, 64))
    log_r, _ = lru.lam()
    assert (torch.exp(log_r) < 1).all() and torch.isfinite(log_r).all()
    # a long constant input keeps the state bounded (|lambda| < 1 plus gamma normalisation)
    u = torch.ones(1, 4)
    x = torch.zeros(1, 128)
    for _ in range(3000):  # acting: one step at a time
        _, x = lru.scan(u[None], x, torch.zeros(1, 1, dtype=torch.bool))
    assert torch.isfinite(x).all() and x.abs().max() < 1e3


def test_lru_matches_the_normalised_complex_recurrence():
    """LRU.scan over a sequence and step by step equals the complex recurrence x_t = lambda x_{t-1} + gamma (B u_t),
    y_t = Re(C x_t) + D u_t with gamma = sqrt(1 - |lambda|^2), computed here in complex128 from the parameters.
    Without the input normalisation (gamma = 1) the state is 1/gamma times larger (gamma is well below 1 for every
    state dim here)."""
    torch.manual_seed(0)
    lru = maml_ssm.LRU(4, 3).double()
    T, Bn = 7, 2
    u = torch.randn(T, Bn, 4, dtype=torch.float64)
    r = torch.exp(-(torch.exp(lru.nu_log) + lru.DELTA_MIN)).detach()
    lam = torch.polar(r, torch.exp(lru.theta_log).detach())
    gamma = torch.sqrt(1 - r**2)
    B = torch.complex(lru.B_re, lru.B_im).detach()
    C = torch.complex(lru.C_re, lru.C_im).detach()
    x = torch.zeros(Bn, 3, dtype=torch.complex128)
    ys = []
    for t in range(T):
        x = lam * x + gamma * (u[t].to(torch.complex128) @ B.T)
        ys.append((x @ C.T).real + lru.D.detach() * u[t])
    expected_y, expected_x = torch.stack(ys), torch.cat([x.real, x.imag], -1)
    assert gamma.max() < 0.95
    with torch.no_grad():
        y_scan, x_scan = lru.scan(u, torch.zeros(Bn, 6, dtype=torch.float64), torch.zeros(T, Bn, dtype=torch.bool))
        xs = torch.zeros(Bn, 6, dtype=torch.float64)
        for t in range(T):
            y_step, xs = lru.scan(u[t : t + 1], xs, torch.zeros(1, Bn, dtype=torch.bool))
    assert torch.allclose(y_scan, expected_y, atol=1e-10), (y_scan - expected_y).abs().max()
    assert torch.allclose(x_scan, expected_x, atol=1e-10) and torch.allclose(xs, expected_x, atol=1e-10)
    assert torch.allclose(y_step[0], expected_y[-1], atol=1e-10)
    assert expected_x.abs().max() > 0.1


def lru_loop(lru, u, x0, starts):
    """The LRU step by step in complex arithmetic: x_t = lambda x_{t-1} + gamma (B u_t), the state zeroed where an
    episode starts, y_t = Re(C x_t) + D u_t; differentiable in the parameters, u and x0."""
    log_r, phase = lru.lam()
    lam = torch.polar(torch.exp(log_r), phase)
    gamma = torch.sqrt(1 - torch.exp(2 * log_r))
    B = torch.complex(lru.B_re, lru.B_im)
    C = torch.complex(lru.C_re, lru.C_im)
    x_re, x_im = x0.chunk(2, -1)
    x = torch.complex(x_re, x_im)
    ys = []
    for t in range(u.shape[0]):
        x = torch.where(starts[t, :, None], torch.zeros_like(x), lam * x) + gamma * (u[t].to(x.dtype) @ B.T)
        ys.append((x @ C.T).real + lru.D * u[t])
    return torch.stack(ys), torch.cat([x.real, x.imag], -1)


@pytest.mark.parametrize("T", [1, 2, 7, 16, 23])
@pytest.mark.parametrize("restarts", [False, True])
def test_lru_scan_equals_the_step_by_step_loop_in_value_and_first_and_second_derivatives(T, restarts):
    """LRU.scan against lru_loop on random parameters, inputs and a nonzero initial state, with no episode start (x0
    carries through the whole sequence) or with starts anywhere (each step starts one with probability 0.3): the outputs
    and final state, their gradient in every parameter, the input and x0, and a Hessian-vector product of a scalar of
    them (float64)."""
    torch.manual_seed(T + 100 * restarts)
    lru = maml_ssm.LRU(5, 4).double()
    with torch.no_grad():
        for p in lru.parameters():
            p.add_(0.3 * torch.randn_like(p))
    Bn = 3
    u = torch.randn(T, Bn, 5, dtype=torch.float64, requires_grad=True)
    x0 = torch.randn(Bn, 8, dtype=torch.float64, requires_grad=True)
    starts = torch.zeros(T, Bn, dtype=torch.bool)
    if restarts:
        starts = torch.rand(T, Bn) < 0.3
        starts[0, 0] = False  # one row carries x0 into the sequence
        starts[T // 2, 1] = True
    leaves = [*lru.parameters(), u, x0]
    wy = torch.randn(T, Bn, 5, dtype=torch.float64)
    wx = torch.randn(Bn, 8, dtype=torch.float64)
    vs = [torch.randn_like(p) for p in leaves]

    def derivatives(scan):
        y, x = scan(lru, u, x0, starts)
        f = (wy * y).sum() + (wx * x).sum() + (y**2).sum() + (x**3).sum()  # nonlinear: a nonzero Hessian in y and x
        g = torch.autograd.grad(f, leaves, create_graph=True)
        hv = torch.autograd.grad(sum((gi * vi).sum() for gi, vi in zip(g, vs)), leaves)
        return y, x, g, hv

    y, x, g, hv = derivatives(maml_ssm.LRU.scan)
    y_ref, x_ref, g_ref, hv_ref = derivatives(lru_loop)
    assert torch.allclose(y, y_ref, atol=1e-12, rtol=1e-10) and torch.allclose(x, x_ref, atol=1e-12, rtol=1e-10)
    for name, a, b in zip([n for n, _ in lru.named_parameters()] + ["u", "x0"], g, g_ref):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-9), ("grad", name, (a - b).abs().max())
    for name, a, b in zip([n for n, _ in lru.named_parameters()] + ["u", "x0"], hv, hv_ref):
        assert torch.allclose(a, b, atol=1e-9, rtol=1e-8), ("hvp", name, (a - b).abs().max())
    # the state carries x0 into the sequence (row 0 does not start at t = 0)
    assert g[-1][0].abs().max() > 1e-3 and x_ref.abs().max() > 0.1


@pytest.mark.parametrize("kind", ["ssm", "gru", "mlp"])
def test_step_by_step_equals_sequence_scan(kind):
    """Acting runs the policy one step at a time, carrying the state; training runs it over the whole sequence."""
    torch.manual_seed(1)
    agent = maml_ssm.Agent(kind, 3, 2, False, 8, 5, True).double()
    T, B = 17, 4
    inp = torch.randn(T, B, 6, dtype=torch.float64)
    starts = torch.rand(T, B) < 0.2
    state0 = torch.randn_like(agent.initial_state(B))
    a = agent(inp, starts, state0)
    state, pis = state0, []
    for t in range(T):
        out = agent(inp[t : t + 1], starts[t : t + 1], state)
        pis.append(out.pi[0])
        state = out.state
    assert torch.allclose(a.pi, torch.stack(pis), atol=1e-10) and torch.allclose(a.state, state, atol=1e-10)
    if kind != "mlp":
        # the two paths must not be trivially equal: the state has to matter
        c = agent(inp, starts, torch.zeros_like(state0))
        assert not torch.allclose(
            a.pi[: int(starts.long().argmax(0).min()) + 1], c.pi[: int(starts.long().argmax(0).min()) + 1]
        )


@pytest.mark.parametrize("kind", ["ssm", "gru"])
def test_state_reset_at_episode_boundary(kind):
    torch.manual_seed(2)
    agent = maml_ssm.Agent(kind, 3, 2, False, 8, 5, True).double()
    T, B, k = 12, 3, 5
    inp = torch.randn(T, B, 6, dtype=torch.float64)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[0], starts[k] = True, True
    full = agent(inp, starts, torch.randn_like(agent.initial_state(B))).pi
    fresh = agent(inp[k:], starts[k:], agent.initial_state(B)).pi
    assert torch.allclose(full[k:], fresh, atol=1e-10)
    no_reset = starts.clone()
    no_reset[k] = False
    assert not torch.allclose(agent(inp, no_reset, agent.initial_state(B)).pi[k:], fresh, atol=1e-6)


def test_ssm_block_is_gelu_of_the_lru_plus_its_input():
    """Agent.forward with the LRU core: z = gelu(LRU(h)) + h with h = tanh(encoder(input)), then
    feats = tanh(fc(z)) (docs: "then gelu(y) + u (residual)"), computed here from the modules. Catches: the residual
    dropped (z = gelu(y))."""
    torch.manual_seed(0)
    model = maml_ssm.Agent("ssm", 2, 2, False, 6, 3, True).double()
    inp = torch.randn(7, 3, 5, dtype=torch.float64)
    starts = torch.zeros(7, 3, dtype=torch.bool)
    starts[0] = True
    with torch.no_grad():
        out = model(inp, starts, model.initial_state(3))
        h = torch.tanh(model.encoder(inp))
        y, _ = model.core.scan(h, model.initial_state(3), starts)
        expected = torch.tanh(model.fc(F.gelu(y) + h))
        without = torch.tanh(model.fc(F.gelu(y)))
    assert torch.allclose(out.feats, expected, atol=1e-12)
    assert (expected - without).abs().max() > 1e-2


def test_value_head_reads_detached_features():
    """The value head is a diagnostic trained on detached features (docs): its output has no gradient path into the
    trunk or the policy head, only into value_head itself. Catches: value_head(feats) without .detach(), which lets
    the value loss move the trunk in the aux step whenever --dynamics-coef > 0."""
    torch.manual_seed(0)
    model = maml_ssm.Agent("ssm", 2, 2, False, 6, 3, True)
    inp = torch.randn(5, 3, 5)
    starts = torch.zeros(5, 3, dtype=torch.bool)
    starts[0] = True
    out = model(inp, starts, model.initial_state(3))
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(out.value.sum(), list(model.parameters()), allow_unused=True)
    for n, g in zip(names, grads):
        if n.startswith("value_head."):
            assert g is not None and g.abs().sum() > 0, n
        else:
            assert g is None or torch.all(g == 0), n


@pytest.mark.parametrize("task", maml_ssm.TASKS)
def test_matched_parameter_counts(task):
    env_cls = maml_ssm.ENV_CLASSES[task]
    args = maml_ssm.Args(task=task)
    counts = {}
    for kind in maml_ssm.POLICIES:
        a = dataclasses.replace(args, policy=kind)
        model = maml_ssm.build_agent(a, env_cls)
        w = maml_ssm.policy_width(a, env_cls)
        assert maml_ssm.count_params(model) == maml_ssm.agent_param_count(
            kind, env_cls.obs_dim, env_cls.act_dim, env_cls.discrete, w, args.state_size, True
        )
        counts[kind] = maml_ssm.count_params(model)
    assert max(counts.values()) / min(counts.values()) < 1.03


def test_matched_width_is_the_closest_at_any_size():
    """The width search has no upper bound: an SSM wider than about 2,900 must get a matched MLP baseline too
    without a word. The chosen width must beat its two neighbours, whatever the size."""
    env_cls = maml_ssm.ENV_CLASSES["point-nav-2d"]
    spec = (env_cls.obs_dim, env_cls.act_dim, env_cls.discrete)
    for hidden in (4, 64, 3000, 20000):
        for kind in ("gru", "mlp"):
            a = maml_ssm.Args(policy=kind, hidden_size=hidden)
            target = maml_ssm.agent_param_count("ssm", *spec, hidden, a.state_size, True)
            w = maml_ssm.policy_width(a, env_cls)
            gap = [abs(maml_ssm.agent_param_count(kind, *spec, v, a.state_size, True) - target) for v in (w - 1, w, w + 1)]
            assert gap[1] <= gap[2] and (w == 4 or gap[1] <= gap[0]), (hidden, kind, w, gap)
            if hidden >= 64:
                assert gap[1] / target < 0.03, (hidden, kind, w, gap)


# ------------------------------------------------------------------------------------------------ TASKS


def test_point_nav_scales_and_clips_actions_and_ends_at_goal():
    # the policy acts in [-1, 1]: 0.5 is a step of 0.05, and 5 is clipped to a step of 0.1 (paper's normalize)
    env = maml_ssm.PointNav2D(torch.tensor([[0.05, 0.0], [0.4, 0.4]]), torch.Generator())
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
        env = maml_ssm.PointNav2D(goals, torch.Generator(), goal_box=box)
        env.reset()
        results[box] = env.step(step)
    (_, r_l2, done_l2), (_, r_box, done_box) = results[False], results[True]
    assert torch.equal(r_l2, r_box)
    assert r_l2[0].item() == pytest.approx(-0.009 * np.sqrt(2), abs=1e-6)
    assert done_l2.tolist() == [False, False, False]  # 0.0127 away: outside the disc of radius 0.01
    assert done_box.tolist() == [True, False, False]  # |dx|, |dy| < 0.01: inside the paper code's square
    assert maml_ssm.PointNav2D(goals, torch.Generator()).goal_box is False


def test_goal_box_follows_the_config_into_training_and_eval(trained_ckpt, monkeypatch, tmp_path):
    assert parsed_train_args(["train", "--config", "paper"]).goal_box is True
    assert parsed_train_args(["train", "--config", "paper", "--no-goal-box"]).goal_box is False
    assert parsed_train_args(["train"]).goal_box is False
    seen = []

    class Spy(maml_ssm.PointNav2D):
        def __init__(self, tasks, gen, goal_box=False):
            seen.append(goal_box)
            super().__init__(tasks, gen, goal_box)

    monkeypatch.setattr(maml_ssm, "PointNav2D", Spy)
    ckpt = torch.load(trained_ckpt, weights_only=False)
    assert ckpt["args"]["goal_box"] is False
    plain = str(tmp_path / "plain.cleanrl_model")  # evaluate writes eval.json beside the checkpoint
    torch.save(ckpt, plain)
    maml_ssm.evaluate(plain, 2, 1)
    ckpt["args"]["goal_box"] = True
    box = str(tmp_path / "box.cleanrl_model")
    torch.save(ckpt, box)
    maml_ssm.evaluate(box, 2, 1)
    assert seen == [False, True]


def test_cartpole_physics_matches_gymnasium_at_default_physics():
    import gymnasium as gym

    ref = gym.make("CartPole-v1").unwrapped
    ref.reset(seed=0)
    env = maml_ssm.CartPolePhysics(torch.tensor([[9.8, 0.5]]), torch.Generator().manual_seed(0))
    env.reset()
    env.state = torch.tensor([list(ref.state)], dtype=torch.float64)
    for a in [1, 1, 0, 1, 0, 0, 1]:
        o_ref, _, term, _, _ = ref.step(a)
        o, _, done = env.step(torch.tensor([[float(a)]]))
        assert np.allclose(o[0].numpy(), o_ref, atol=1e-5) and bool(done[0]) == term


def test_halfcheetah_vel_reward_is_minus_velocity_error_minus_control_cost(tmp_path, monkeypatch):
    """One step of halfcheetah-vel with action 0.5 everywhere and target 1.5: the reward is -|v_x - 1.5| - 0.1
    ||a||^2, with v_x the finite-difference forward velocity of the root (qpos[0]) over the env's dt."""
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    env = maml_ssm.HalfCheetahVel(torch.tensor([[1.5]]), torch.Generator().manual_seed(0))
    env.reset()
    sim = env.envs[0].unwrapped
    x0 = float(sim.data.qpos[0])
    action = torch.full((1, 6), 0.5)
    _, reward, done = env.step(action)
    v = (float(sim.data.qpos[0]) - x0) / sim.dt
    expected = -abs(v - 1.5) - 0.1 * float((action**2).sum())
    assert reward[0].item() == pytest.approx(expected, abs=1e-5) and not done[0]
    assert abs(v) > 1e-3 and abs(v - 1.5) > 0.5  # the velocity term is not 0 and its sign matters


@pytest.mark.parametrize("task", maml_ssm.TASKS)
def test_train_and_test_task_streams_are_disjoint(task):
    train_rng, test_rng = maml_ssm.task_streams(3)
    train = maml_ssm.sample_tasks(task, train_rng, 2000, "train")
    test = maml_ssm.sample_tasks(task, test_rng, 500, "test")
    assert not (np.abs(train[None] - test[:, None]).max(-1) < 1e-9).any()
    # same seed, fresh generators: the streams are reproducible
    assert np.array_equal(maml_ssm.sample_tasks(task, maml_ssm.task_streams(3)[1], 500, "test"), test)
    if task == "cartpole-physics":
        (g0, g1), (l0, l1) = maml_ssm.CARTPOLE_TRAIN_RANGES
        (tg0, tg1), (tl0, tl1) = maml_ssm.CARTPOLE_TEST_RANGES
        assert g1 < tg0 and l1 < tl0
        assert ((train[:, 0] >= g0) & (train[:, 0] <= g1) & (train[:, 1] >= l0) & (train[:, 1] <= l1)).all()
        assert ((test[:, 0] >= tg0) & (test[:, 0] <= tg1) & (test[:, 1] >= tl0) & (test[:, 1] <= tl1)).all()


@pytest.mark.parametrize(
    "task",
    [
        "cartpole-physics",
        pytest.param(
            "halfcheetah-vel", marks=pytest.mark.skipif(not maml_ssm.mujoco_available(), reason="mujoco not installed")
        ),
    ],
)
def test_each_batch_of_an_iteration_starts_from_fresh_states(task, tmp_path, monkeypatch):
    """One environment serves every batch of an iteration (the inner-step batch, then the post-adaptation batch):
    each reset must draw new start states, or the outer objective is measured on the starts theta' adapted on."""
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    rng, _ = maml_ssm.task_streams(0)
    tasks = maml_ssm.sample_tasks(task, rng, 2, "train")
    env = maml_ssm.make_env(maml_ssm.Args(task=task), tasks, 3, torch.Generator().manual_seed(0))
    first, second = env.reset(), env.reset()
    assert first.shape == second.shape and not torch.isclose(first, second).all(dim=1).any()


# ------------------------------------------------------------------------------------------------ TRAINING LOOP


def test_main_train_samples_with_inner_lr_at_every_inner_step(tmp_path, monkeypatch):
    """Meta-training samples the fast batches with theta adapted at --inner-lr on every one of the
    --num-inner-steps steps, the schedule the meta-objective re-adapts with; another list (a single entry, a smaller
    step later) would make the sampled actions' log-probabilities disagree with the TRPO step's old policy."""
    seen = []
    real = maml_ssm.sample_task_batches

    def spy(model, params, task_params, args_, gen, num_steps, inner_lrs):
        seen.append((num_steps, list(inner_lrs)))
        return real(model, params, task_params, args_, gen, num_steps, inner_lrs)

    monkeypatch.setattr(maml_ssm, "sample_task_batches", spy)
    args = maml_ssm.Args(
        runs_dir=str(tmp_path),
        exp_name="lrs",
        outer_steps=1,
        tasks_per_batch=2,
        fast_batch_size=2,
        max_episode_steps=3,
        policy="mlp",
        hidden_size=4,
        cg_iters=2,
        ls_max_steps=1,
        buffer_size=0,
        num_inner_steps=2,
        inner_lr=0.37,
    )
    maml_ssm.train(args)
    assert seen == [(2, [0.37, 0.37])]


def test_logged_inner_loss_is_that_of_the_parameters_that_sampled_the_batch(tmp_path, monkeypatch):
    """theta = {k: p.detach()} shares storage with the parameters; Adam updates them in place, so an inner loss
    computed after the outer step would be the updated parameters' under Adam (and the old ones under TRPO)."""
    seen = []
    real = maml_ssm.inner_loss

    def spy(model, params, batch):
        if not torch.is_grad_enabled():  # the logging call (the inner step itself needs the graph)
            seen.append({k: v.detach().clone() for k, v in params.items()})
        return real(model, params, batch)

    monkeypatch.setattr(maml_ssm, "inner_loss", spy)
    model, before, run_dir = train_in_process(tmp_path, monkeypatch, outer_optimizer="adam", outer_lr=0.01, diagnostics=True)
    assert seen and all(torch.equal(s["encoder.weight"], before["encoder.weight"]) for s in seen)
    assert not torch.equal(model.encoder.weight.detach(), before["encoder.weight"])  # the outer step did move it
    assert len(logged_scalars(run_dir)["losses/inner_loss"]) == TINY_ARGS["outer_steps"]
    seen.clear()  # without --diagnostics: no logging call, no tag
    _, _, run_dir = train_in_process(tmp_path, monkeypatch, outer_optimizer="adam", outer_lr=0.01)
    assert seen == [] and "losses/inner_loss" not in logged_scalars(run_dir)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_dynamics_coef_sets_the_trunks_step_under_adam(tmp_path, monkeypatch, layer_norm):
    """The trunk's only gradient in the auxiliary step is the dynamics loss's. Adam's first step is lr * sign(g)
    whatever the scale of g, so scaling the loss would move the trunk alike for 0.01 and 1; the coefficient scales the
    trunk's step size. With 0 the trunk is not in the auxiliary step at all."""
    models = {
        c: train_in_process(tmp_path, monkeypatch, outer_optimizer="adam", dynamics_coef=c, layer_norm=layer_norm)[0]
        for c in (0.0, 0.01, 1.0)
    }
    trunk = [n for n, _ in models[0.0].named_parameters() if n.startswith(("encoder", "core", "norm", "fc"))]
    assert any(n.startswith("norm.") for n in trunk) == layer_norm

    def moved(c):  # the aux step's change of the trunk (the outer step before it is the same in every run)
        p, q = dict(models[c].named_parameters()), dict(models[0.0].named_parameters())
        return torch.cat([(p[n] - q[n]).detach().reshape(-1) for n in trunk]).norm().item()

    assert moved(1.0) > 0
    assert moved(0.01) / moved(1.0) == pytest.approx(0.01, rel=0.05)
    for n in trunk:  # every trunk tensor takes the aux step
        assert not torch.equal(dict(models[1.0].named_parameters())[n], dict(models[0.0].named_parameters())[n]), n
    # the heads learn at aux_lr in every run, on the same features
    assert torch.equal(models[0.01].value_head.weight, models[1.0].value_head.weight)


def test_train_fills_the_buffer_with_the_post_adaptation_episodes(tmp_path, monkeypatch):
    """The ExperienceBuffer holds each iteration's post-adaptation (theta') episodes, task id = the task's index in
    the run's task list (docs: "filled by `train` from each iteration's post-adaptation episodes"). Catches: the
    pre-adaptation batch td["train"][0] stored instead (replay would then rehearse theta's behaviour, not theta')."""
    sampled, buffered, _, _ = train_spied(tmp_path, monkeypatch, tasks_per_batch=2, max_episode_steps=5)
    (tasks_data,) = sampled
    assert len(buffered) == 2
    for i, (batch, task_id) in enumerate(buffered):
        assert batch is tasks_data[i]["val"] and batch is not tasks_data[i]["train"][0] and task_id == i


def test_logged_aux_losses_average_over_valid_steps(tmp_path, monkeypatch):
    """The aux step's value loss regresses the undiscounted reward-to-go sum_{s>=t} r_s and the dynamics loss the
    next observation, both averaged over each episode's valid steps, then over tasks; the logged losses/value_loss
    and losses/dynamics_loss are recomputed here from the aux step's own outputs. Cart-pole episodes end before the
    horizon, so the padding (where the cart keeps moving) is non-empty. Catches: a forward cumulative sum as the
    value target, and a dynamics loss averaged over padded steps too."""
    _, _, scalars, aux_outs = train_spied(
        tmp_path, monkeypatch, task="cartpole-physics", tasks_per_batch=2, max_episode_steps=60
    )
    assert len(aux_outs) == 2
    v_exp, d_exp, padded = [], [], 0
    for b, out, dyn in aux_outs:
        msk = b["masks"]
        padded += int((msk == 0).sum())
        togo = torch.flip(torch.cumsum(torch.flip(b["rewards"], [0]), 0), [0])
        v_exp.append(((((out.value - togo) ** 2) * msk).sum() / msk.sum()).item())
        a = F.one_hot(b["actions"].long()[..., 0], 2).float()
        with torch.no_grad():
            pred = F.linear(torch.cat([out.feats, a], -1), dyn["weight"], dyn["bias"])
        err = ((pred - b["next_obs"]) ** 2).mean(-1)
        d_exp.append(((err * msk).sum() / msk.sum()).item())
        assert (err * (1 - msk)).sum() > 0  # the padded steps' error is not zero: including them would show
    assert padded > 0
    assert scalars["losses/value_loss"][0] == pytest.approx(float(np.mean(v_exp)), rel=1e-5)
    assert scalars["losses/dynamics_loss"][0] == pytest.approx(float(np.mean(d_exp)), rel=1e-5)


def test_cpu_budget_stops_training_and_records_the_steps_done(tmp_path):
    # a budget far below one iteration's CPU time: training stops after iteration 1 of 50, and the checkpoint says so
    out = run_maml(
        ["train", "--runs-dir", str(tmp_path), "--save-model", *TINY, "--outer-steps", "50", "--cpu-budget", "1e-6"]
    )
    assert "--cpu-budget 1e-06s reached after 1 of 50 outer steps" in out.stdout and "iter 2/50" not in out.stdout
    (path,) = glob.glob(str(tmp_path / "*" / "maml_ssm.cleanrl_model"))
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    assert ckpt["outer_steps_done"] == 1 and ckpt["args"]["outer_steps"] == 50 and ckpt["train_cpu_time"] > 0
    assert "--cpu-budget must be >= 0" in validation_error(maml_ssm.validate, maml_ssm.Args(cpu_budget=-1))


def test_cpu_budget_counts_process_time_not_wall_time(tmp_path, monkeypatch, capsys):
    """--cpu-budget is CPU time of this process: a wall clock that jumps a million seconds per reading (a machine
    shared with other jobs, a suspended process) must not stop training, while CPU time that passes the budget
    does, after the iteration in which it does."""
    real = time.process_time
    jump = {"t": time.time()}

    def jumping():
        jump["t"] += 1e6
        return jump["t"]

    args = maml_ssm.Args(
        runs_dir=str(tmp_path),
        outer_steps=2,
        tasks_per_batch=2,
        fast_batch_size=2,
        max_episode_steps=4,
        policy="mlp",
        hidden_size=4,
        cg_iters=2,
        ls_max_steps=2,
        buffer_size=0,
        cpu_budget=1000.0,
    )
    clocks = {"time": jumping, "perf_counter": jumping, "monotonic": jumping, "process_time": real}
    monkeypatch.setattr(maml_ssm, "time", types.SimpleNamespace(**clocks))
    maml_ssm.train(dataclasses.replace(args, exp_name="wall"))
    out = capsys.readouterr().out
    assert "iter 2/2" in out and "--cpu-budget" not in out
    monkeypatch.setattr(maml_ssm, "time", types.SimpleNamespace(**{**clocks, "process_time": jumping}))
    maml_ssm.train(dataclasses.replace(args, exp_name="cpu"))
    out = capsys.readouterr().out
    assert "--cpu-budget 1000s reached after 1 of 2 outer steps" in out and "iter 2/2" not in out


# ------------------------------------------------------------------------------------------------ CHECKPOINTS AND EVAL


def test_atomic_save_keeps_old_file_when_writing_fails(tmp_path, monkeypatch):
    model, args, _ = tiny_setup(dtype=torch.float32)
    path = str(tmp_path / "x.cleanrl_model")
    maml_ssm.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []}, maml_ssm.TASK_VERSIONS[args.task])
    digest = sha256(path)

    def boom(obj, f):
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(maml_ssm.torch, "save", boom)
    with pytest.raises(OSError):
        maml_ssm.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []}, maml_ssm.TASK_VERSIONS[args.task])
    assert sha256(path) == digest and os.listdir(tmp_path) == ["x.cleanrl_model"]


def test_save_checkpoint_writes_its_temp_file_beside_the_checkpoint(tmp_path, monkeypatch):
    """The temp file is created in the checkpoint's own directory, so the final os.replace is a rename on one
    filesystem (atomic); a temp file in /tmp or the working directory may cross filesystems. No temp file is left."""
    torch.manual_seed(0)
    args = maml_ssm.Args(policy="mlp", hidden_size=4)
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    replaced = []
    real_replace = maml_ssm.os.replace
    monkeypatch.setattr(maml_ssm.os, "replace", lambda src, dst: (replaced.append((src, dst)), real_replace(src, dst))[1])
    path = str(tmp_path / "ckpt" / "a.cleanrl_model")
    maml_ssm.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []}, maml_ssm.TASK_VERSIONS[args.task])
    assert len(replaced) == 1
    src, dst = replaced[0]
    assert dst == path and os.path.dirname(os.path.abspath(src)) == str(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["a.cleanrl_model"]
    assert list((tmp_path / "cwd").iterdir()) == []


def test_eval_leaves_checkpoint_bit_identical_and_writes_eval_json(trained_ckpt):
    digest = sha256(trained_ckpt)
    out = run_maml(["eval", "--checkpoint", trained_ckpt, "--num-tasks", "3", "--num-steps", "3"])
    assert sha256(trained_ckpt) == digest
    res = json.loads(open(os.path.join(os.path.dirname(trained_ckpt), "eval.json")).read())
    assert set(res) == {"task", "returns_after_steps", "ci95", "num_tasks"}
    assert res["task"] == "point-nav-2d" and res["num_tasks"] == 3
    assert list(res["returns_after_steps"]) == ["0", "1", "2", "3"] and list(res["ci95"]) == ["0", "1", "2", "3"]
    assert all(np.isfinite(v) and v < 0 for v in res["returns_after_steps"].values())
    assert os.path.isfile(os.path.join(os.path.dirname(trained_ckpt), "eval.png"))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == res
    # evaluation starts every task from the checkpoint's theta: the same seed gives the same numbers
    assert maml_ssm.evaluate(trained_ckpt, 3, 3) == res
    # NaN passed eval's `<= 0` checks and crashed inside the first adaptation step; a bad seed failed in numpy
    for flags, needle in (
        (["--inner-lr", "nan"], "--inner-lr nan must be a finite number"),
        (["--eval-seed", "-1"], "--eval-seed -1 must be in [0, 2**32 - 1]"),
    ):
        bad = run_maml(["eval", "--checkpoint", trained_ckpt, *flags], check=False)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and needle in lines[0], bad.stderr
    assert sha256(trained_ckpt) == digest


def test_eval_defaults_are_the_checkpoints_own_evaluation(tmp_path):
    """A bare `eval` repeats the evaluation training wrote: the checkpoint's --eval-tasks, --eval-steps and
    --eval-later-lr-scale, not fixed defaults (40 tasks, 3 steps, 0.5)."""
    ckpt = train_tiny(tmp_path, "--eval-later-lr-scale=0.25")
    trained = json.load(open(os.path.join(os.path.dirname(ckpt), "eval.json")))
    default = maml_ssm.evaluate(ckpt)
    assert default == trained and default["num_tasks"] == 3 and list(default["returns_after_steps"]) == ["0", "1", "2"]
    assert default == maml_ssm.evaluate(ckpt, 3, 2, later_lr_scale=0.25)
    assert default["returns_after_steps"]["2"] != maml_ssm.evaluate(ckpt, 3, 2, later_lr_scale=0.5)["returns_after_steps"]["2"]
    out = run_maml(["eval", "--checkpoint", ckpt])
    assert json.loads(out.stdout.strip().splitlines()[-1]) == trained
    res = run_maml(["eval", "--checkpoint", ckpt, "--num-tasks", "1"], check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "--num-tasks must be >= 2" in res.stderr


def test_eval_test_tasks_never_seen_in_training(trained_ckpt):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    seen = np.asarray(ckpt["task_split"]["train_tasks"])
    assert seen.shape == (2 * 2, 2)  # outer_steps x tasks_per_batch training goals are recorded
    _, test_rng = maml_ssm.task_streams(ckpt["args"]["seed"])
    test = maml_ssm.sample_tasks("point-nav-2d", test_rng, 3, "test")
    assert not (np.abs(seen[None] - test[:, None]).max(-1) < 1e-12).any()


def test_checkpoint_from_another_config_is_rejected(trained_ckpt, tmp_path):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    ckpt["args"]["policy"] = "gru"
    bad = str(tmp_path / "bad.cleanrl_model")
    torch.save(ckpt, bad)
    res = run_maml(["eval", "--checkpoint", bad], check=False)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("maml_ssm.py: error:") and "do not match" in lines[0]
    with pytest.raises(ValueError, match="does not exist"):
        maml_ssm.load_checkpoint(str(tmp_path / "missing.cleanrl_model"))
    ckpt["script"] = "ppo_gru_baseline"
    torch.save(ckpt, bad)
    with pytest.raises(ValueError, match="not a maml_ssm checkpoint"):
        maml_ssm.load_checkpoint(bad)


def test_a_checkpoint_of_another_format_is_refused_in_one_line_naming_the_commit_that_reads_it(trained_ckpt, tmp_path):
    """Another format (no format entry, another one, or other Args fields) is another commit's checkpoint."""
    ckpt = torch.load(trained_ckpt, weights_only=False)
    assert ckpt["format"] == maml_ssm.CHECKPOINT_FORMAT
    no_format = {k: v for k, v in ckpt.items() if k != "format"}
    other_fields = {**ckpt, "args": {**ckpt["args"], "adapt_steps": 3}}
    fewer_fields = {**ckpt, "args": {k: v for k, v in ckpt["args"].items() if k != "goal_box"}}
    for i, old in enumerate((no_format, {**ckpt, "format": 0}, other_fields, fewer_fields)):
        path = str(tmp_path / f"old{i}.cleanrl_model")
        torch.save(old, path)
        refusal = f"{path!r} holds another format of maml_ssm.py's checkpoint; commit 95652a5 reads it"
        with pytest.raises(ValueError) as e:
            maml_ssm.load_checkpoint(path)
        assert str(e.value) == refusal
    for command in ("eval", "adapt"):
        assert_one_line_error(run_maml([command, "--checkpoint", path], check=False), refusal)


def test_checkpoint_of_an_older_task_version_is_refused(trained_ckpt, tmp_path):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    assert ckpt["task_version"] == maml_ssm.TASK_VERSIONS["point-nav-2d"] == 2
    ckpt["task_version"] = 1  # point-nav-2d before it scaled its actions
    old = str(tmp_path / "old.cleanrl_model")
    torch.save(ckpt, old)
    res = run_maml(["eval", "--checkpoint", old], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "trained on version 1 of point-nav-2d" in lines[0]


def test_a_cartpole_checkpoint_with_other_physics_ranges_is_refused(cartpole_ckpt, tmp_path):
    maml_ssm.load_checkpoint(cartpole_ckpt)
    for key in ("train_ranges", "test_ranges"):
        ckpt = torch.load(cartpole_ckpt, weights_only=False)
        ckpt["task_split"][key] = [[1.0, 2.0], [0.1, 0.2]]
        other = str(tmp_path / f"{key}.cleanrl_model")
        torch.save(ckpt, other)
        with pytest.raises(ValueError, match=f"cartpole {key.replace('_', ' ')} .* are not this script's"):
            maml_ssm.load_checkpoint(other)
    res = run_maml(["eval", "--checkpoint", other], check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "retrain it" in res.stderr
    for malformed in ({"gravity": 1}, [[1.0], [2.0, 3.0]], None):  # hand-edited or missing: the same one-line reason
        ckpt["task_split"]["test_ranges"] = malformed
        torch.save(ckpt, other)
        with pytest.raises(ValueError, match="are not this script's"):
            maml_ssm.load_checkpoint(other)


def test_eval_episodes_sets_the_evaluation_batch(trained_ckpt, monkeypatch, tmp_path):
    seen = []
    real = maml_ssm.sample_task_batches
    monkeypatch.setattr(
        maml_ssm,
        "sample_task_batches",
        lambda model, p, tasks, args, *a: seen.append(args.fast_batch_size) or real(model, p, tasks, args, *a),
    )
    ckpt = torch.load(trained_ckpt, weights_only=False)
    plain = str(tmp_path / "plain.cleanrl_model")  # evaluate writes eval.json beside the checkpoint
    torch.save(ckpt, plain)
    maml_ssm.evaluate(plain, 2, 1)
    maml_ssm.evaluate(plain, 2, 1, episodes=3)
    ckpt["args"]["eval_episodes"] = 5
    with_default = str(tmp_path / "eval5.cleanrl_model")
    torch.save(ckpt, with_default)
    maml_ssm.evaluate(with_default, 2, 1)
    assert seen == [ckpt["args"]["fast_batch_size"], 3, 5]
    assert parsed_train_args(["train", "--config", "paper"]).eval_episodes == 40
    assert "--eval-episodes must be >= 1" in validation_error(maml_ssm.validate, maml_ssm.Args(eval_episodes=0))


def test_mean_ci95_half_width_is_1_96_sample_sd_over_sqrt_n():
    """The evaluation's 95% interval half-width is 1.96 s / sqrt(n) with s the sample standard deviation (n - 1 in
    its denominator), computed here by hand on five known per-task returns. The population sd, or sqrt(n - 1)
    under it, is off by more than 10% at n = 5; a single task has no interval (0)."""
    x = [-3.0, -1.0, 0.5, 2.0, 7.5]
    n, mean = len(x), sum(x) / len(x)
    s = (sum((v - mean) ** 2 for v in x) / (n - 1)) ** 0.5
    expected = 1.96 * s / n**0.5
    assert maml_ssm.mean_ci95_half_width(x) == pytest.approx(expected, rel=1e-12)
    assert maml_ssm.mean_ci95_half_width(np.array(x, dtype=np.float32)) == pytest.approx(expected, rel=1e-6)
    assert maml_ssm.mean_ci95_half_width([4.0]) == 0.0 and expected > 1.0


def test_evaluate_reports_ci95_of_the_per_task_returns(tmp_path, monkeypatch):
    """evaluate's ci95 for each number of inner steps is 1.96 s / sqrt(num_tasks) of the per-task mean returns the
    sampler gave for that step (the sampler is replaced by one returning known returns)."""
    torch.manual_seed(0)
    args = maml_ssm.Args(policy="mlp", hidden_size=4, max_episode_steps=3, fast_batch_size=1)
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    path = str(tmp_path / "tiny.cleanrl_model")
    maml_ssm.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []}, maml_ssm.TASK_VERSIONS[args.task])
    known = [torch.tensor([1.0, 3.0, -2.0, 6.0]), torch.tensor([0.0, 0.0, 4.0, 10.0])]
    monkeypatch.setattr(maml_ssm, "sample_task_batches", lambda *a, **kw: (None, known))
    res = maml_ssm.evaluate(path, num_tasks=4, num_steps=1)
    for k, r in enumerate(known):
        v = r.double().tolist()
        mean = sum(v) / 4
        s = (sum((a - mean) ** 2 for a in v) / 3) ** 0.5
        assert res["ci95"][str(k)] == pytest.approx(1.96 * s / 2, rel=1e-6)
        assert res["returns_after_steps"][str(k)] == pytest.approx(mean, rel=1e-6)


# ------------------------------------------------------------------------------------------------ COMMAND LINE


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--task", "mountain-nav"], "unknown --task"),
        (["--inner-lr", "0"], "--inner-lr must be positive"),
        (["--cpu-budget", "-1"], "--cpu-budget must be >= 0"),
        (["--eval-episodes", "0"], "--eval-episodes must be >= 1"),
        (["--task", "cartpole-physics", "--goal-box"], "--goal-box only applies to --task point-nav-2d"),
        (["--cpu-budget", "nan"], "--cpu-budget nan must be a finite number"),
        (["--seed", "-1"], "--seed -1 must be in [0, 2**32 - 1]"),
        (["--cg-subsample", "1.5"], "--cg-subsample must be in (0, 1], got 1.5"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(flags, needle, tmp_path):
    res = run_maml(["train", "--runs-dir", str(tmp_path), *flags], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("maml_ssm.py: error:") and needle in lines[0]
    assert not os.listdir(tmp_path)  # validation happens before any work


def test_validate_args_rejects_bad_values(monkeypatch):
    assert "--outer-lr must be positive" in validation_error(maml_ssm.validate, maml_ssm.Args(outer_lr=-1e-3))
    assert "unknown --policy" in validation_error(maml_ssm.validate, maml_ssm.Args(policy="lstm"))
    assert "--fast-batch-size must be >= 1" in validation_error(maml_ssm.validate, maml_ssm.Args(fast_batch_size=0))
    # NaN passes every `<= 0` check and would train (or crash after the run directory exists)
    for kwargs, needle in (
        ({"dynamics_coef": float("nan")}, "--dynamics-coef nan must be a finite"),
        ({"max_kl": float("inf")}, "--max-kl inf must be a finite"),
        ({"cg_damping": -1.0}, "--cg-damping must be >= 0, got -1.0"),
        ({"eval_later_lr_scale": 0.0}, "--eval-later-lr-scale must be positive, got 0.0"),
        ({"eval_tasks": 1, "save_model": True}, "needs >= 2 tasks for its 95% CI"),
    ):
        assert needle in validation_error(maml_ssm.validate, maml_ssm.Args(**kwargs)), kwargs
    assert validation_error(maml_ssm.validate, maml_ssm.Args(eval_tasks=1)) is None  # no evaluation without --save-model
    assert validation_error(maml_ssm.validate, maml_ssm.Args()) is None
    monkeypatch.setattr(maml_ssm, "mujoco_available", lambda: False)
    assert "pip install mujoco" in validation_error(maml_ssm.validate, maml_ssm.Args(task="halfcheetah-vel"))


def test_config_preset_is_overridable_flag_by_flag():
    a = parsed_train_args(["train", "--config", "basic", "--inner-lr", "0.5"])
    assert (a.seed, a.fast_batch_size, a.max_episode_steps, a.outer_steps, a.tasks_per_batch) == (42, 8, 200, 50, 8)
    assert a.inner_lr == 0.5 and a.seed == 42 and a.config == "basic"
    assert parsed_train_args(["train"]).seed == 1


@pytest.mark.parametrize(
    "task,extra",
    [
        ("cartpole-physics", ["--outer-optimizer", "adam", "--policy", "gru"]),
        ("point-nav-2d", ["--policy", "mlp", "--num-inner-steps", "2", "--first-order"]),
        pytest.param(
            "halfcheetah-vel",
            ["--max-episode-steps", "5"],
            marks=pytest.mark.skipif(not maml_ssm.mujoco_available(), reason="mujoco not installed"),
        ),
    ],
)
def test_smoke_train_and_eval(task, extra, tmp_path):
    # cwd = tmp_path: MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working directory
    out = run_maml(["train", "--task", task, "--runs-dir", str(tmp_path), "--save-model", *TINY, *extra], cwd=tmp_path)
    assert "parameters; matched counts" in out.stdout and "iter 2/2" in out.stdout
    (path,) = glob.glob(str(tmp_path / "*" / "maml_ssm.cleanrl_model"))
    res = json.load(open(os.path.join(os.path.dirname(path), "eval.json")))
    assert res["task"] == task and len(res["returns_after_steps"]) == 3
    assert glob.glob(str(tmp_path / "*" / "events.out.tfevents.*"))


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names):
    """Runs of one command and seed started in the same second (a shell loop over flags) get directories of their
    own: sharing runs/{run_name} would mix their TensorBoard events and replace the earlier run's files."""
    check = occupied_run_names(str(tmp_path), "point-nav-2d__collide__7__")
    run_maml(
        [
            "train",
            "--task",
            "point-nav-2d",
            "--runs-dir",
            str(tmp_path),
            "--save-model",
            *TINY,
            "--exp-name",
            "collide",
            "--seed",
            "7",
        ]
    )
    run_dir = check()
    assert glob.glob(os.path.join(run_dir, "*.cleanrl_model")) and os.path.isfile(os.path.join(run_dir, "eval.json"))


def test_a_runs_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "runs").write_text("")
    result = run_maml(["train", "--runs-dir", str(tmp_path / "runs"), *TINY], check=False)
    lines = result.stderr.strip().splitlines()
    assert (
        result.returncode == 2
        and len(lines) == 1
        and lines[0].startswith("maml_ssm.py: error: ")
        and "--runs-dir" in lines[0]
        and "not a directory" in lines[0]
    ), result.stderr
    assert result.stdout == ""


def test_a_default_train_run_imports_nothing_from_the_helper_package(tmp_path):
    """`train` without --save-model needs only its own file; with it, the script writes the checkpoint and eval.json, and
    cleanrl_astral_utils, when installed, draws eval.png."""
    code = (
        "import runpy, sys\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "print('helper imported:', any(n.startswith('cleanrl_astral_utils') for n in sys.modules))\n"
    )
    script = os.path.join(REPO, "cleanrl_astral", "maml_ssm.py")
    for extra, imported in (([], False), (["--save-model"], True)):
        runs = tmp_path / f"runs{len(extra)}"
        out = subprocess.run(
            [sys.executable, "-c", code, script, "train", "--runs-dir", str(runs), *TINY, *extra],
            cwd=REPO,
            env=SCRIPT_ENV,
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"helper imported: {imported}" in out.stdout, out.stdout[-2000:]


def test_the_progress_line_gives_the_time_left_from_the_mean_iteration_time(capsys):
    # 4 of 10 outer steps in 120 s: 6 more at 30 s each take 3 minutes
    stats = {"approx_kl": 0.01, "line_search_steps": 1}
    maml_ssm.print_progress(4, types.SimpleNamespace(outer_steps=10), 400, 3, -1.0, -0.5, stats, 30.0, 120.0)
    line = capsys.readouterr().out.strip()
    assert line.startswith("iter 4/10 step 400 SPS 3 pre -1.00 post -0.50")
    assert line.endswith("elapsed 120s, 3.0 min left")
