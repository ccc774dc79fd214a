"""Numerical checks of cleanrl_astral/maml_ssm.py that the tests in test_maml_ssm.py let through: conjugate gradient,
TRPO's line search and Fisher-vector product, padding-aware normalisers, the importance ratio, the inner step sizes
of the meta-objective, the linear baseline's target, rollouts after an episode ends, the halfcheetah-vel reward, the
`adapt` mode's tasks and adapters, replay in the hybrid adapter, buffer sampling and the CPU budget."""

import dataclasses
import time
import types

import numpy as np
import pytest
import torch

from cleanrl_astral import maml_ssm as m


def setup(policy="ssm", T=10, n_tasks=2, per=3, num_steps=1, inner_lr=0.5, dtype=torch.float64, seed=0):
    """A tiny point-nav problem: model (in `dtype`), args and per-task batches ({"train": [num_steps], "val"}) sampled
    by the script's own sampler with `inner_lr` at every step, as meta-training does."""
    torch.manual_seed(seed)
    args = m.Args(policy=policy, hidden_size=6, state_size=3, max_episode_steps=T, fast_batch_size=per,
                  tasks_per_batch=n_tasks, inner_lr=inner_lr, num_inner_steps=num_steps)
    model = m.build_agent(args, m.PointNav2D)
    rng, _ = m.task_streams(seed)
    tasks = m.sample_tasks(args.task, rng, n_tasks, "train")
    theta = {k: v.detach() for k, v in model.named_parameters()}
    data, _ = m.sample_task_batches(model, theta, tasks, args, torch.Generator().manual_seed(seed), num_steps,
                                    [inner_lr] * num_steps)
    model = model.to(dtype)
    for td in data:
        for b in td["train"] + [td["val"]]:
            for k, v in b.items():
                if v.is_floating_point():
                    b[k] = v.to(dtype)
    return model, args, data


def pad(batch, lengths):
    """Cut episode j of `batch` to lengths[j] valid steps: the rest becomes padding (mask 0) holding garbage
    advantages and rewards, which a correct loss never reads."""
    masks = batch["masks"].clone()
    for j, length in enumerate(lengths):
        masks[length:, j] = 0
    batch["masks"] = masks
    batch["advantages"] = torch.where(masks > 0, batch["advantages"], torch.full_like(batch["advantages"], 50.0))
    batch["rewards"] = batch["rewards"] * masks
    return batch


def gaussian(out):
    return torch.distributions.Normal(out["pi"], torch.exp(out["log_std"]).expand_as(out["pi"]))


def flat_params(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def unflatten(model, flat):
    """{name: view of flat} shaped like the model's parameters (for torch.autograd.functional)."""
    out, i = {}, 0
    for k, p in model.named_parameters():
        out[k] = flat[i : i + p.numel()].view_as(p)
        i += p.numel()
    return out


# ------------------------------------------------------------------------------------------------ TRPO numerics
def test_conjugate_gradient_solves_a_small_spd_system():
    """CG on a 6x6 SPD system with condition number 50 reaches torch.linalg.solve's answer within its 6 iterations
    (exact in exact arithmetic). A CG that stops after one iteration, updates the residual with the wrong sign or
    drops the conjugation term (steepest descent) is far from it."""
    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    A = q @ torch.diag(torch.linspace(1.0, 50.0, 6, dtype=torch.float64)) @ q.T
    b = torch.randn(6, generator=gen, dtype=torch.float64) * 3
    exact = torch.linalg.solve(A, b)
    for iters in (6, 20):
        x = m.conjugate_gradient(lambda v: A @ v, b, iters)
        assert torch.allclose(x, exact, atol=1e-8, rtol=0), (iters, (x - exact).abs().max().item())
    assert exact.norm() > 0.1  # the zero vector is not an answer


def test_fisher_vector_product_adds_exactly_the_damping(monkeypatch):
    """TRPO's Avp is (F + damping I) v with F the Hessian of the mean KL(old || new) at theta (through the inner
    adaptation). With damping 0.5, Avp(v) - F v must be 0.5 v; F v is computed here by torch.autograd.functional.hvp
    of the KL as a function of the flat parameter vector. Dropping the damping gives 0, doubling it gives v."""
    model, args, data = setup(T=6, per=2)
    args = dataclasses.replace(args, cg_damping=0.5, cg_iters=2, ls_max_steps=1)
    theta0 = flat_params(model)
    v = torch.randn(theta0.shape, generator=torch.Generator().manual_seed(1), dtype=theta0.dtype)
    _, _, old = m.meta_objective(model, dict(model.named_parameters()), data, args)
    _, fv = torch.autograd.functional.hvp(lambda f: m.meta_objective(model, unflatten(model, f), data, args, old)[1],
                                          theta0, v)
    assert fv.norm() > 1e-3 * v.norm()  # F is not negligible next to the damping

    class Captured(Exception):
        pass

    seen = {}

    def capture(Avp, b, iters, tol=1e-10):
        seen["avp"] = Avp(v).detach()
        raise Captured

    monkeypatch.setattr(m, "conjugate_gradient", capture)
    with pytest.raises(Captured):
        m.trpo_step(model, data, args)
    assert torch.allclose(seen["avp"] - fv, 0.5 * v, atol=1e-8, rtol=0), (seen["avp"] - fv - 0.5 * v).abs().max()
    assert torch.equal(flat_params(model), theta0)


def line_search_with(monkeypatch, trial_loss_offset, trial_kl):
    """Runs trpo_step with every line-search trial's (loss, KL) replaced by (first loss + offset, trial_kl); returns
    (stats, parameters before, parameters after, number of trials evaluated)."""
    model, args, data = setup(T=6, per=2)
    args = dataclasses.replace(args, cg_iters=3, ls_max_steps=3, max_kl=0.01)
    real = m.meta_objective
    calls = {"first": None, "trials": 0}

    def rigged(model_, params, tasks_data, args_, old_outs=None, create_graph=True):
        loss, kl, outs = real(model_, params, tasks_data, args_, old_outs, create_graph)
        if old_outs is None:
            calls["first"] = loss.detach()
            return loss, kl, outs
        calls["trials"] += 1
        return calls["first"] + trial_loss_offset, torch.tensor(trial_kl, dtype=kl.dtype), outs

    monkeypatch.setattr(m, "meta_objective", rigged)
    before = [p.detach().clone() for p in model.parameters()]
    stats = m.trpo_step(model, data, args)
    after = [p.detach().clone() for p in model.parameters()]
    return stats, before, after, calls["trials"], args


def test_line_search_rejects_trials_that_worsen_the_surrogate(monkeypatch):
    """Every trial keeps KL at 0 but makes the surrogate worse: none may be accepted, and theta must come back bit
    for bit. A line search that checks only the KL would accept the first trial (and move theta)."""
    stats, before, after, trials, args = line_search_with(monkeypatch, 1e-3, 0.0)
    assert trials == args.ls_max_steps == stats["line_search_steps"]
    assert stats["accepted"] == 0.0 and stats["approx_kl"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(after, before))


def test_line_search_restores_theta_when_every_trial_breaks_the_kl_limit(monkeypatch):
    """Every trial improves the surrogate but exceeds --max-kl: the step is refused and theta must be restored bit
    for bit, not left at the last (smallest) trial step."""
    stats, before, after, trials, args = line_search_with(monkeypatch, -1.0, 1.0)
    assert trials == args.ls_max_steps and stats["accepted"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    # non-vacuous: with the KL satisfied the same trials are accepted and theta moves
    stats, before, after, _, _ = line_search_with(monkeypatch, -1.0, 0.0)
    assert stats["accepted"] == 1.0 and not all(torch.equal(a, b) for a, b in zip(after, before))


# ------------------------------------------------------------------------------------------------ losses and padding
def test_inner_loss_averages_over_valid_steps_only():
    """Episodes of different lengths are padded (mask 0): the inner REINFORCE loss is the mean over valid steps of
    -log pi(a|s) A, computed here from a Normal of the policy output. Dividing by all T x B entries, padding
    included, shrinks the inner step of tasks whose episodes end early."""
    model, args, data = setup()
    batch = pad(dict(data[0]["train"][0]), [10, 4, 7])
    params = dict(model.named_parameters())
    out = m.policy_out(model, params, batch)
    logp = gaussian(out).log_prob(batch["actions"]).sum(-1)
    valid = batch["masks"] > 0
    expected = -(logp * batch["advantages"])[valid].mean()
    assert valid.sum() < valid.numel()
    assert m.inner_loss(model, params, batch).item() == pytest.approx(expected.item(), rel=1e-10, abs=1e-12)


def padded_meta_setup():
    """Two tasks with padded train and validation episodes; theta1 is theta0 moved far enough that the importance
    ratios of the validation actions are far from 1."""
    model, args, data = setup(per=3)
    for td in data:
        td["train"] = [pad(dict(b), [10, 3, 6]) for b in td["train"]]
        td["val"] = pad(dict(td["val"]), [5, 10, 2])
    theta0 = dict(model.named_parameters())
    _, _, old = m.meta_objective(model, theta0, data, args)
    gen = torch.Generator().manual_seed(3)
    theta1 = {k: (v.detach() + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype)).requires_grad_(True)
              for k, v in theta0.items()}
    return model, args, data, old, theta1


def test_surrogate_is_the_exact_importance_weighted_mean_over_valid_steps():
    """The meta-objective at parameters away from the sampling ones is the mean over tasks of
    -mean_valid(exp(logp' - logp_old) A) with logp' at the adapted parameters. Checked against an independent
    computation: a first-order ratio 1 + logp' - logp_old, or a normaliser counting padded steps, is off."""
    model, args, data, old, theta1 = padded_meta_setup()
    expected, log_ratios = [], []
    for td, o in zip(data, old):
        val = td["val"]
        p = m.adapt(model, theta1, td["train"], args.inner_lr, args.first_order, create_graph=False)
        out = m.policy_out(model, p, val)
        log_ratio = gaussian(out).log_prob(val["actions"]).sum(-1) - gaussian(o).log_prob(val["actions"]).sum(-1)
        valid = val["masks"] > 0
        expected.append(-(torch.exp(log_ratio) * val["advantages"])[valid].mean())
        log_ratios.append(log_ratio[valid])
    loss, _, _ = m.meta_objective(model, theta1, data, args, old, create_graph=False)
    assert loss.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-10, abs=1e-12)
    assert torch.cat(log_ratios).abs().mean() > 0.1  # the ratio really is away from 1


def test_mean_kl_averages_over_valid_steps_only():
    """The meta-objective's KL is the mean over tasks of the mean over valid steps of KL(old || new) (summed over
    action dimensions), here from torch.distributions.kl_divergence. Averaging over padded steps too dilutes the
    trust region of tasks whose episodes end early."""
    model, args, data, old, theta1 = padded_meta_setup()
    expected = []
    for td, o in zip(data, old):
        val = td["val"]
        p = m.adapt(model, theta1, td["train"], args.inner_lr, args.first_order, create_graph=False)
        kl = torch.distributions.kl_divergence(gaussian(o), gaussian(m.policy_out(model, p, val))).sum(-1)
        expected.append(kl[val["masks"] > 0].mean())
    _, kl, _ = m.meta_objective(model, theta1, data, args, old, create_graph=False)
    assert kl.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-10)
    assert kl.item() > 1e-3


def test_meta_objective_adapts_with_the_samplers_step_sizes():
    """With two inner steps, the sampler drew the post-adaptation episodes with theta adapted twice at --inner-lr;
    the meta-objective must re-adapt the same way, so its old policy (ratio 1 at the start of the TRPO step) gives
    the recorded log-probabilities of the sampled actions. Another step size on either step would not."""
    model, args, data = setup(num_steps=2, dtype=torch.float32)
    params = dict(model.named_parameters())
    _, _, outs = m.meta_objective(model, params, data, args)
    theta0 = {k: v.detach() for k, v in params.items()}
    for td, out in zip(data, outs):
        val = td["val"]
        assert len(td["train"]) == 2
        valid = val["masks"] > 0
        logp = gaussian(out).log_prob(val["actions"]).sum(-1)
        assert torch.allclose(logp[valid], val["logp"][valid], atol=2e-5), (logp - val["logp"])[valid].abs().max()
        # non-vacuous: the unadapted policy gives other log-probabilities
        logp0 = gaussian(m.policy_out(model, theta0, val)).log_prob(val["actions"]).sum(-1)
        assert (logp0 - val["logp"])[valid].abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------ baseline and rollout
def test_linear_baseline_fits_discounted_returns():
    """The linear feature baseline regresses the discounted return G_t = r_t + gamma G_{t+1} (within each episode).
    When the first observation coordinate is G_t itself, the features fit it exactly, so the predictions must be G_t
    on every valid step (and 0 on padding). A target of one-step rewards, or undiscounted returns, is not fit."""
    gamma, T, lengths = 0.9, 8, [8, 5, 3, 6]
    gen = torch.Generator().manual_seed(0)
    masks = torch.zeros(T, len(lengths))
    for j, length in enumerate(lengths):
        masks[:length, j] = 1
    rewards = -torch.rand(T, len(lengths), generator=gen) * masks
    G = torch.zeros(T, len(lengths), dtype=torch.float64)
    for j, length in enumerate(lengths):
        running = 0.0
        for t in reversed(range(length)):
            running = rewards[t, j].item() + gamma * running
            G[t, j] = running
    obs = torch.stack([G.float(), torch.randn(T, len(lengths), generator=gen)], -1) * masks[..., None]
    pred = m.linear_baseline({"obs": obs, "masks": masks, "rewards": rewards}, gamma)
    valid = masks > 0
    assert torch.allclose(pred[valid], G[valid], atol=1e-4), (pred - G)[valid].abs().max()
    assert torch.all(pred[~valid] == 0)
    undiscounted = torch.flip(torch.cumsum(torch.flip(rewards.double(), [0]), 0), [0])
    assert (G - undiscounted)[valid].abs().max() > 0.3 and (G - rewards.double())[valid].abs().max() > 0.3


def test_rollout_rewards_and_masks_are_zero_after_the_episode_ends():
    """A point-nav policy stepping straight along +x (std e^-20): the episode whose goal is one step away ends at
    step 1, while the other (goal behind) runs on. Every later step of the ended episode must have reward 0 and
    mask 0, although the environment keeps moving it (it would be rewarded -0.1, -0.2, ...)."""
    torch.manual_seed(0)
    args = m.Args(policy="mlp", hidden_size=6, max_episode_steps=6)
    model = m.build_agent(args, m.PointNav2D)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    theta["pi.weight"] = torch.zeros_like(theta["pi.weight"])
    theta["pi.bias"] = torch.tensor([1.0, 0.0])
    theta["log_std"] = torch.full((2,), -20.0)
    env = m.PointNav2D(torch.tensor([[0.1, 0.0], [-0.5, 0.0]]), torch.Generator().manual_seed(0))
    batch = m.rollout(model, [theta], env, args.max_episode_steps)
    assert batch["masks"].shape == (6, 2)
    assert batch["masks"][:, 0].tolist() == [1, 0, 0, 0, 0, 0] and batch["masks"][:, 1].tolist() == [1] * 6
    assert batch["rewards"][0, 0].item() == pytest.approx(0.0, abs=1e-6)  # reached: distance 0
    assert torch.all(batch["rewards"][1:, 0] == 0)
    assert batch["rewards"][:, 1].tolist() == pytest.approx([-(0.6 + 0.1 * t) for t in range(6)], abs=1e-5)
    assert env.pos[0, 0].item() == pytest.approx(0.6, abs=1e-5)  # the env did move the ended episode on


def test_halfcheetah_vel_reward_is_minus_velocity_error_minus_control_cost(tmp_path, monkeypatch):
    """One step of halfcheetah-vel with action 0.5 everywhere and target 1.5: the reward is -|v_x - 1.5| - 0.1
    ||a||^2, with v_x the finite-difference forward velocity of the root (qpos[0]) over the env's dt."""
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    env = m.HalfCheetahVel(torch.tensor([[1.5]]), torch.Generator().manual_seed(0))
    env.reset()
    sim = env.envs[0].unwrapped
    x0 = float(sim.data.qpos[0])
    action = torch.full((1, 6), 0.5)
    _, reward, done = env.step(action)
    v = (float(sim.data.qpos[0]) - x0) / sim.dt
    expected = -abs(v - 1.5) - 0.1 * float((action**2).sum())
    assert reward[0].item() == pytest.approx(expected, abs=1e-5) and not done[0]
    assert abs(v) > 1e-3 and abs(v - 1.5) > 0.5  # the velocity term is not 0 and its sign matters


# ------------------------------------------------------------------------------------------------ test-time adaptation
def test_adapt_draws_test_tasks_and_gives_every_task_its_own_adapter(tmp_path, monkeypatch):
    """run_adaptation evaluates on the seed's test stream (never the training stream) and builds one adapter per
    test task: each takes adapt_steps steps on its own task's episodes, so their parameters differ. One adapter
    shared by all tasks would be stepped on every task's data in turn."""
    torch.manual_seed(0)
    args = m.Args(policy="mlp", hidden_size=6, max_episode_steps=5, fast_batch_size=2, seed=4)
    model = m.build_agent(args, m.PointNav2D)
    path = str(tmp_path / "tiny.cleanrl_model")
    m.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []}, {"buffer": None})
    env_tasks, made, steps = [], [], {}
    real_make_env = m.make_env

    def spy_make_env(args_, task_params, per, gen):
        env_tasks.append(np.array(task_params))
        return real_make_env(args_, task_params, per, gen)

    class Recording(m.StandardAdapter):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

        def step(self, batch):
            steps[id(self)] = steps.get(id(self), 0) + 1
            return super().step(batch)

    monkeypatch.setattr(m, "make_env", spy_make_env)
    monkeypatch.setitem(m.ADAPTERS, "standard", Recording)
    aargs = m.AdaptArgs(path, num_tasks=3, adapt_steps=2, adapt_lr=0.5, adaptation_mode=("standard",),
                        adapt_objective=("pg",), max_step_norm=100.0, trust_region=100.0)
    res = m.run_adaptation(path, aargs)
    assert list(res["results"]["standard/pg"]["returns_after_steps"]) == ["0", "1", "2"]
    train_rng, test_rng = m.task_streams(4)
    # one env for the no-adaptation level, one for the run: both on the test tasks
    test_tasks = m.sample_tasks(args.task, test_rng, 3, "test")
    assert len(env_tasks) == 2 and all(np.array_equal(t, test_tasks) for t in env_tasks)
    assert not np.array_equal(env_tasks[0], m.sample_tasks(args.task, train_rng, 3, "train"))
    assert len(made) == 3 and len({id(a) for a in made}) == 3
    assert sorted(steps.values()) == [2, 2, 2]
    vecs = [torch.cat([a.params[k].detach().reshape(-1) for k in a.names]) for a in made]
    theta0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert all((v - theta0).norm() > 1e-4 for v in vecs)
    assert all((vecs[i] - vecs[j]).norm() > 1e-4 for i in range(3) for j in range(i + 1, 3))


def test_hybrid_step_descends_the_current_plus_replayed_loss():
    """One SGD step of the hybrid adapter (guards off) differs from the standard adapter's step on the same batch by
    exactly -lr x experience_weight x the gradient of the replayed batch's loss (the batch its generator draws), and
    its loss_after is the combined loss. A hybrid step that ignored the replay would equal the standard one."""
    model, _, data = setup(dtype=torch.float32)
    batch = data[0]["train"][0]
    buf = m.ExperienceBuffer(500, 2, 5, 2, model.initial_state(1).shape[1])
    for i, td in enumerate(data):
        m.add_batch_to_buffer(buf, td["val"], i)
    cfg = m.AdaptConfig("pg", adapt_lr=0.2, grad_clip=1e9, max_step_norm=1e9, trust_region=1e9, experience_weight=0.5,
                        experience_batch_size=16)
    theta0 = {k: v.detach() for k, v in model.named_parameters()}
    std = m.StandardAdapter(model, theta0, cfg, buf, torch.Generator().manual_seed(0))
    hyb = m.HybridAdapter(model, theta0, cfg, buf, torch.Generator().manual_seed(0))
    replay = m.replay_as_batch(buf.sample(16, torch.Generator().manual_seed(0)))
    std.step(batch)
    info = hyb.step(batch)
    leaves = {k: v.clone().requires_grad_(True) for k, v in theta0.items()}
    loss, _ = m.objective_loss(model, leaves, replay, "pg")
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    expected = torch.cat([(-0.2 * 0.5 * g if g is not None else torch.zeros_like(p)).reshape(-1)
                          for g, p in zip(grads, leaves.values())])
    diff = torch.cat([(hyb.params[k] - std.params[k]).detach().reshape(-1) for k in theta0])
    assert expected.norm() > 1e-3
    assert torch.allclose(diff, expected, atol=1e-5), (diff - expected).abs().max()
    combined = hyb.loss(batch, replay).item()
    assert info["loss_after"] == pytest.approx(combined, rel=1e-6)
    assert abs(combined - m.StandardAdapter.loss(hyb, batch).item()) > 1e-4


def test_buffer_samples_uniformly_over_the_stored_transitions():
    """ExperienceBuffer.sample draws indices uniformly over what is stored (after wrap-around, and when only
    partly filled): over many draws every stored transition shows up about equally often, nothing else does."""
    def items(vals):
        v = torch.tensor(vals, dtype=torch.float32)
        return dict(obs=v[:, None], inputs=v[:, None], actions=v[:, None], rewards=v, next_obs=v[:, None],
                    dones=torch.zeros(len(v), dtype=torch.bool), advantages=v, task_ids=v.long(), states=v[:, None])

    full = m.ExperienceBuffer(50, 1, 1, 1, 1)
    full.add(**items(list(range(80))))  # wraps: 30..79 remain
    part = m.ExperienceBuffer(50, 1, 1, 1, 1)
    part.add(**items(list(range(20))))
    for buf, stored in ((full, set(range(30, 80))), (part, set(range(20)))):
        drawn = buf.sample(100 * len(stored), torch.Generator().manual_seed(0))["obs"][:, 0].long().tolist()
        counts = np.bincount(drawn, minlength=80)
        assert set(drawn) == stored
        assert counts[sorted(stored)].min() > 60 and counts[sorted(stored)].max() < 140, counts


def test_a_batch_larger_than_the_buffer_keeps_its_last_rows_in_ring_order():
    """Each row is written once (repeated indices in an indexed assignment have no defined winner): the batch's last
    `capacity` rows stay, and the next add overwrites the oldest of them."""
    def items(vals):
        v = torch.tensor(vals, dtype=torch.float32)
        return dict(obs=v[:, None], inputs=v[:, None], actions=v[:, None], rewards=v, next_obs=v[:, None],
                    dones=torch.zeros(len(v), dtype=torch.bool), advantages=v, task_ids=v.long(), states=v[:, None])

    buf = m.ExperienceBuffer(5, 1, 1, 1, 1)
    buf.add(**items([0, 1, 2]))
    buf.add(**items(list(range(10, 18))))
    assert len(buf) == 5 and buf.pos == 1 and buf.data["obs"][:, 0].tolist() == [17, 13, 14, 15, 16]
    buf.add(**items([20]))
    assert buf.data["obs"][:, 0].tolist() == [17, 20, 14, 15, 16]


# ------------------------------------------------------------------------------------------------ CPU budget
def test_cpu_budget_counts_process_time_not_wall_time(tmp_path, monkeypatch, capsys):
    """--cpu-budget is CPU time of this process: a wall clock that jumps a million seconds per reading (a machine
    shared with other jobs, a suspended process) must not stop training, while CPU time that passes the budget
    does, after the iteration in which it does."""
    real = time.process_time
    jump = {"t": time.time()}

    def jumping():
        jump["t"] += 1e6
        return jump["t"]

    args = m.Args(runs_dir=str(tmp_path), outer_steps=2, tasks_per_batch=2, fast_batch_size=2, max_episode_steps=4,
                  policy="mlp", hidden_size=4, cg_iters=2, ls_max_steps=2, buffer_size=0, cpu_budget=1000.0)
    clocks = {"time": jumping, "perf_counter": jumping, "monotonic": jumping, "process_time": real}
    monkeypatch.setattr(m, "time", types.SimpleNamespace(**clocks))
    m.main_train(dataclasses.replace(args, exp_name="wall"))
    out = capsys.readouterr().out
    assert "iter 2/2" in out and "--cpu-budget" not in out
    monkeypatch.setattr(m, "time", types.SimpleNamespace(**{**clocks, "process_time": jumping}))
    m.main_train(dataclasses.replace(args, exp_name="cpu"))
    out = capsys.readouterr().out
    assert "--cpu-budget 1000s reached after 1 of 2 outer steps" in out and "iter 2/2" not in out


# ------------------------------------------------------------------------------------------------ added checks
def test_meta_objective_kl_is_the_mean_not_the_sum_over_tasks():
    """With three tasks whose adapted policies move by different amounts, the meta-objective's KL is the mean over
    tasks of each task's own KL (computed here task by task, one task per call). A sum over tasks is three times
    it, which would shrink TRPO's trust region as the meta-batch grows."""
    model, args, data = setup(n_tasks=3, per=2)
    theta0 = dict(model.named_parameters())
    _, _, old = m.meta_objective(model, theta0, data, args)
    gen = torch.Generator().manual_seed(5)
    theta1 = {k: (v.detach() + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype)).requires_grad_(True)
              for k, v in theta0.items()}
    per_task = [m.meta_objective(model, theta1, [td], args, [o], create_graph=False)[1].item()
                for td, o in zip(data, old)]
    _, kl, _ = m.meta_objective(model, theta1, data, args, old, create_graph=False)
    assert min(per_task) > 1e-3 and max(per_task) - min(per_task) > 1e-4 * max(per_task)
    assert kl.item() == pytest.approx(float(np.mean(per_task)), rel=1e-10)
    assert abs(kl.item() - sum(per_task)) > 0.5 * kl.item()


def test_ci95_is_1_96_sample_sd_over_sqrt_n():
    """The evaluation's 95% interval half-width is 1.96 s / sqrt(n) with s the sample standard deviation (n - 1 in
    its denominator), computed here by hand on five known per-task returns. The population sd, or sqrt(n - 1)
    under it, is off by more than 10% at n = 5; a single task has no interval (0)."""
    x = [-3.0, -1.0, 0.5, 2.0, 7.5]
    n, mean = len(x), sum(x) / len(x)
    s = (sum((v - mean) ** 2 for v in x) / (n - 1)) ** 0.5
    expected = 1.96 * s / n**0.5
    assert m.ci95(x) == pytest.approx(expected, rel=1e-12)
    assert m.ci95(np.array(x, dtype=np.float32)) == pytest.approx(expected, rel=1e-6)
    assert m.ci95([4.0]) == 0.0 and expected > 1.0


def test_evaluate_reports_ci95_of_the_per_task_returns(tmp_path, monkeypatch):
    """evaluate's ci95 for each number of inner steps is 1.96 s / sqrt(num_tasks) of the per-task mean returns the
    sampler gave for that step (the sampler is replaced by one returning known returns)."""
    torch.manual_seed(0)
    args = m.Args(policy="mlp", hidden_size=4, max_episode_steps=3, fast_batch_size=1)
    model = m.build_agent(args, m.PointNav2D)
    path = str(tmp_path / "tiny.cleanrl_model")
    m.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []})
    known = [torch.tensor([1.0, 3.0, -2.0, 6.0]), torch.tensor([0.0, 0.0, 4.0, 10.0])]
    monkeypatch.setattr(m, "sample_task_batches", lambda *a, **kw: (None, known))
    res = m.evaluate(path, num_tasks=4, num_steps=1, write=False)
    for k, r in enumerate(known):
        v = r.double().tolist()
        mean = sum(v) / 4
        s = (sum((a - mean) ** 2 for a in v) / 3) ** 0.5
        assert res["ci95"][str(k)] == pytest.approx(1.96 * s / 2, rel=1e-6)
        assert res["returns_after_steps"][str(k)] == pytest.approx(mean, rel=1e-6)


def test_lru_matches_the_normalised_complex_recurrence():
    """LRU.step and LRU.scan equal the complex recurrence x_t = lambda x_{t-1} + gamma (B u_t), y_t = Re(C x_t) +
    D u_t with gamma = sqrt(1 - |lambda|^2), computed here in complex128 from the parameters. Without the input
    normalisation (gamma = 1) the state is 1/gamma times larger (gamma is well below 1 for every state dim here)."""
    torch.manual_seed(0)
    lru = m.LRU(4, 3).double()
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
            y_step, xs = lru.step(u[t], xs, torch.zeros(Bn, dtype=torch.bool))
    assert torch.allclose(y_scan, expected_y, atol=1e-10), (y_scan - expected_y).abs().max()
    assert torch.allclose(x_scan, expected_x, atol=1e-10) and torch.allclose(xs, expected_x, atol=1e-10)
    assert torch.allclose(y_step, expected_y[-1], atol=1e-10)
    assert expected_x.abs().max() > 0.1


def test_main_train_samples_with_inner_lr_at_every_inner_step(tmp_path, monkeypatch):
    """Meta-training samples the fast batches with theta adapted at --inner-lr on every one of the
    --num-inner-steps steps, the schedule the meta-objective re-adapts with; another list (a single entry, a smaller
    step later) would make the sampled actions' log-probabilities disagree with the TRPO step's old policy."""
    seen = []
    real = m.sample_task_batches

    def spy(model, params, task_params, args_, gen, num_steps, inner_lrs):
        seen.append((num_steps, list(inner_lrs)))
        return real(model, params, task_params, args_, gen, num_steps, inner_lrs)

    monkeypatch.setattr(m, "sample_task_batches", spy)
    args = m.Args(runs_dir=str(tmp_path), exp_name="lrs", outer_steps=1, tasks_per_batch=2, fast_batch_size=2,
                  max_episode_steps=3, policy="mlp", hidden_size=4, cg_iters=2, ls_max_steps=1, buffer_size=0,
                  num_inner_steps=2, inner_lr=0.37)
    m.main_train(args)
    assert seen == [(2, [0.37, 0.37])]


def test_adapter_max_step_guard_caps_the_parameter_change():
    """With a large SGD step, one adapter step moves the adapted parameters by exactly --max-step-norm (the guard
    rescales the change, keeping its direction) and reports that the guard fired; without the guard the change is
    far larger."""
    model, _, data = setup(dtype=torch.float32)
    theta0 = {k: v.detach() for k, v in model.named_parameters()}
    batch = data[0]["train"][0]
    cfg = m.AdaptConfig("pg", adapt_lr=50.0, grad_clip=1e9, max_step_norm=0.05, trust_region=1e9)
    free = m.StandardAdapter(model, theta0, dataclasses.replace(cfg, max_step_norm=1e9))
    capped = m.StandardAdapter(model, theta0, cfg)
    assert not free.step(batch)["fired_max_step"]
    info = capped.step(batch)
    d_free = free._vec(free.params, free.names) - free._vec(theta0, free.names)
    d_cap = capped._vec(capped.params, capped.names) - capped._vec(theta0, capped.names)
    assert d_free.norm() > 1.0 and info["fired_max_step"]
    assert d_cap.norm().item() == pytest.approx(0.05, rel=1e-4)
    assert torch.allclose(d_cap, d_free * (0.05 / d_free.norm()), atol=1e-6)


def test_save_checkpoint_writes_its_temp_file_beside_the_checkpoint(tmp_path, monkeypatch):
    """The temp file is created in the checkpoint's own directory, so the final os.replace is a rename on one
    filesystem (atomic); a temp file in /tmp or the working directory may cross filesystems. No temp file is left."""
    torch.manual_seed(0)
    args = m.Args(policy="mlp", hidden_size=4)
    model = m.build_agent(args, m.PointNav2D)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    replaced = []
    real_replace = m.os.replace
    monkeypatch.setattr(m.os, "replace", lambda src, dst: (replaced.append((src, dst)), real_replace(src, dst))[1])
    path = str(tmp_path / "ckpt" / "a.cleanrl_model")
    m.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []})
    assert len(replaced) == 1
    src, dst = replaced[0]
    assert dst == path and m.os.path.dirname(m.os.path.abspath(src)) == str(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["a.cleanrl_model"]
    assert list((tmp_path / "cwd").iterdir()) == []
