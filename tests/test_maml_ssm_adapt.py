"""Tests of maml_ssm.py's `adapt` subcommand: the ExperienceBuffer, the standard and hybrid adapters, their
objectives, strategies and guards, importance weights, monitoring, online adaptation and the no-adaptation level."""

import dataclasses
import glob
import json
import os

import maml_fixtures
import numpy as np
import pytest
import torch
from helpers import logged_scalars, sha256
from maml_fixtures import TINY, run_maml, tiny_setup, validation_error

import cleanrl_astral.maml_ssm as maml_ssm

# the checkpoints the tests share (module-scoped fixtures of tests/maml_fixtures.py)
trained_ckpt = maml_fixtures.trained_ckpt
cartpole_ckpt = maml_fixtures.cartpole_ckpt


def filled_buffer(data, state_dim, capacity=500):
    buf = maml_ssm.ExperienceBuffer(capacity, 2, 5, 2, state_dim)
    for i, td in enumerate(data):
        maml_ssm.add_batch_to_buffer(buf, {k: (v.float() if v.is_floating_point() else v) for k, v in td["val"].items()}, i)
    return buf


def adapter(model, data, mode="standard", objective="pg", **kw):
    lr = kw.pop("adapt_lr", 0.1)
    theta0 = {k: v.detach() for k, v in model.named_parameters()}
    buf = filled_buffer(data, model.initial_state(1).shape[1])
    return maml_ssm.ADAPTERS[mode](
        model, theta0, maml_ssm.AdaptArgs("", **kw), objective, lr, buf, torch.Generator().manual_seed(0)
    ), theta0


def adapt(ckpt, **kw):
    aargs = dict(num_tasks=2, adapt_steps=2, adapt_lr=0.1, adaptation_mode=("standard",), adapt_objective=("pg",))
    return maml_ssm.run_adaptation(ckpt, maml_ssm.AdaptArgs(ckpt, **{**aargs, **kw}))


def gaussian_setup():
    torch.manual_seed(0)
    args = maml_ssm.Args(hidden_size=6, state_size=3, max_episode_steps=10, fast_batch_size=3, tasks_per_batch=1)
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    rng, _ = maml_ssm.task_streams(0)
    tasks = maml_ssm.sample_tasks(args.task, rng, 1, "train")
    theta0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    batch = maml_ssm.rollout(
        model, maml_ssm.per_task(theta0, 1), maml_ssm.make_env(args, tasks, 3, torch.Generator().manual_seed(0)), 10
    )
    batch["advantages"] = maml_ssm.compute_advantages(batch, args.gamma, args.gae_lambda)
    return model, args, theta0, batch


# ------------------------------------------------------------------------------------------------ EXPERIENCE BUFFER


def items(vals):
    """ExperienceBuffer.add keyword arguments whose every field holds `vals`, so a sampled row tells which it was."""
    v = torch.tensor(vals, dtype=torch.float32)
    return dict(
        obs=v[:, None],
        inputs=v[:, None],
        actions=v[:, None],
        rewards=v,
        next_obs=v[:, None],
        dones=torch.zeros(len(v), dtype=torch.bool),
        advantages=v,
        task_ids=v.long(),
        states=v[:, None],
    )


def test_buffer_ring_eviction_sampling_and_round_trip():
    buf = maml_ssm.ExperienceBuffer(5, 1, 1, 1, 1)

    buf.add(**items([0, 1, 2]))
    buf.add(**items([3, 4, 5, 6]))
    assert len(buf) == 5 and buf.data["obs"][:, 0].tolist() == [5, 6, 2, 3, 4]
    buf.add(**items([7]))  # the oldest remaining entry (2) goes next
    assert buf.data["obs"][:, 0].tolist() == [5, 6, 7, 3, 4]
    s = buf.sample(64, torch.Generator().manual_seed(0))
    assert s["obs"].shape == (64, 1) and s["task_ids"].dtype == torch.long
    assert set(s["obs"][:, 0].tolist()) <= {3.0, 4.0, 5.0, 6.0, 7.0}
    half = maml_ssm.ExperienceBuffer(10, 1, 1, 1, 1)
    half.add(**items([1, 2, 3]))
    assert set(half.sample(50, torch.Generator().manual_seed(1))["obs"][:, 0].tolist()) <= {1.0, 2.0, 3.0}
    back = maml_ssm.ExperienceBuffer.from_state_dict(buf.state_dict(), 1)
    assert (back.pos, back.size) == (buf.pos, buf.size)
    assert all(torch.equal(back.data[k], buf.data[k]) for k in maml_ssm.ExperienceBuffer.FIELDS)
    with pytest.raises(ValueError, match="recurrent states of the model's width 4"):
        maml_ssm.ExperienceBuffer.from_state_dict(buf.state_dict(), 4)
    old = buf.state_dict()
    old["data"] = {k: v for k, v in old["data"].items() if k != "states"}
    with pytest.raises(ValueError, match="does not store recurrent states of the model's width 8"):
        maml_ssm.ExperienceBuffer.from_state_dict(old, 8)


def test_buffer_samples_uniformly_over_the_stored_transitions():
    """ExperienceBuffer.sample draws indices uniformly over what is stored (after wrap-around, and when only
    partly filled): over many draws every stored transition shows up about equally often, nothing else does."""

    full = maml_ssm.ExperienceBuffer(50, 1, 1, 1, 1)
    full.add(**items(list(range(80))))  # wraps: 30..79 remain
    part = maml_ssm.ExperienceBuffer(50, 1, 1, 1, 1)
    part.add(**items(list(range(20))))
    for buf, stored in ((full, set(range(30, 80))), (part, set(range(20)))):
        drawn = buf.sample(100 * len(stored), torch.Generator().manual_seed(0))["obs"][:, 0].long().tolist()
        counts = np.bincount(drawn, minlength=80)
        assert set(drawn) == stored
        assert counts[sorted(stored)].min() > 60 and counts[sorted(stored)].max() < 140, counts


def test_a_batch_larger_than_the_buffer_keeps_its_last_rows_in_ring_order():
    """Each row is written once (repeated indices in an indexed assignment have no defined winner): the batch's last
    `capacity` rows stay, and the next add overwrites the oldest of them."""

    buf = maml_ssm.ExperienceBuffer(5, 1, 1, 1, 1)
    buf.add(**items([0, 1, 2]))
    buf.add(**items(list(range(10, 18))))
    assert len(buf) == 5 and buf.pos == 1 and buf.data["obs"][:, 0].tolist() == [17, 13, 14, 15, 16]
    buf.add(**items([20]))
    assert buf.data["obs"][:, 0].tolist() == [17, 20, 14, 15, 16]


def test_buffer_marks_each_episodes_last_valid_step_done():
    """add_batch_to_buffer stores the valid steps of each episode (time-major, one column per episode) with done
    True exactly on an episode's last valid step. Catches: the next-step mask not shifted (no step ever done)."""
    T, lengths = 6, [6, 2, 4]
    masks = torch.zeros(T, 3)
    for j, length in enumerate(lengths):
        masks[:length, j] = 1
    ids = torch.arange(T * 3, dtype=torch.float32).reshape(T, 3)  # step id t * 3 + episode
    batch = {
        "masks": masks,
        "obs": ids[..., None].expand(T, 3, 2),
        "inputs": ids[..., None].expand(T, 3, 5),
        "actions": ids[..., None].expand(T, 3, 2),
        "rewards": ids,
        "next_obs": ids[..., None].expand(T, 3, 2),
        "advantages": ids,
        "states": ids[..., None].expand(T, 3, 4),
    }
    buf = maml_ssm.ExperienceBuffer(100, 2, 5, 2, 4)
    maml_ssm.add_batch_to_buffer(buf, batch, 7)
    n = len(buf)
    assert n == sum(lengths)
    stored = buf.data["rewards"][:n].long()
    last = {(length - 1) * 3 + j for j, length in enumerate(lengths)}
    assert {int(s) for s, d in zip(stored, buf.data["dones"][:n]) if d} == last
    assert int(buf.data["dones"][:n].sum()) == len(lengths)
    assert torch.all(buf.data["task_ids"][:n] == 7)


@pytest.mark.parametrize("policy", ["ssm", "gru"])
def test_replayed_transition_continues_from_its_stored_recurrent_state(policy):
    # a transition replayed alone must give the policy/dynamics outputs it had inside its episode; from a fresh
    # (zero) state it would not, which is what this test rules out
    model, args, _ = tiny_setup(policy=policy, dtype=torch.float32)
    rng, _ = maml_ssm.task_streams(3)
    env = maml_ssm.make_env(args, maml_ssm.sample_tasks(args.task, rng, 1, "train"), 4, torch.Generator().manual_seed(3))
    theta = {k: v.detach() for k, v in model.named_parameters()}
    batch = maml_ssm.rollout(model, maml_ssm.per_task(theta, 1), env, args.max_episode_steps)
    batch["advantages"] = maml_ssm.compute_advantages(batch, args.gamma, args.gae_lambda)
    buf = maml_ssm.ExperienceBuffer(1000, 2, 5, 2, model.initial_state(1).shape[1])
    maml_ssm.add_batch_to_buffer(buf, batch, 0)
    n = len(buf)
    rows = {k: v[:n] for k, v in buf.data.items()}
    with torch.no_grad():
        seq = maml_ssm.functional_call(
            model, theta, (batch["inputs"], batch["starts"], model.initial_state(4)), {"actions": batch["actions"]}
        )
        one = maml_ssm.functional_call(
            model,
            theta,
            (rows["inputs"][None], torch.zeros(1, n, dtype=torch.bool), rows["states"]),
            {"actions": rows["actions"][None]},
        )
        fresh = maml_ssm.functional_call(
            model,
            theta,
            (rows["inputs"][None], torch.ones(1, n, dtype=torch.bool), rows["states"]),
            {"actions": rows["actions"][None]},
        )
    mask = batch["masks"] > 0
    assert torch.allclose(one.pi[0], seq.pi[mask], atol=1e-5)
    assert torch.allclose(one.next_obs[0], seq.next_obs[mask], atol=1e-5)
    assert not torch.allclose(fresh.pi[0], seq.pi[mask], atol=1e-3)
    # replay_as_batch feeds exactly these stored states: its pg loss equals the in-sequence one
    rb = maml_ssm.replay_as_batch(rows)
    l_replay, _ = maml_ssm.objective_loss(model, theta, rb, "pg")
    adv = batch["advantages"][mask]
    logp = maml_ssm.log_prob(maml_ssm.make_dist(seq, model.discrete), batch["actions"], model.discrete)[mask]
    assert l_replay.item() == pytest.approx(-(logp * adv).mean().item(), rel=1e-4)


def test_buffer_holds_only_training_task_transitions_and_adapt_leaves_checkpoint_intact(trained_ckpt):
    ckpt = torch.load(trained_ckpt, weights_only=False)
    buf = maml_ssm.ExperienceBuffer.from_state_dict(ckpt["buffer"], 2 * 4)  # TINY: SSM with --state-size 4
    train = torch.tensor(ckpt["task_split"]["train_tasks"], dtype=torch.float32)
    d = {k: v[: len(buf)] for k, v in buf.data.items()}
    assert len(buf) > 0 and d["task_ids"].max() < len(train)
    # point-nav reward is -||next_obs - goal||: every stored transition matches the goal of its training task
    assert torch.allclose(d["rewards"], -torch.linalg.vector_norm(d["next_obs"] - train[d["task_ids"]], dim=1), atol=1e-5)
    digest = sha256(trained_ckpt)
    run_maml(
        [
            "adapt",
            "--checkpoint",
            trained_ckpt,
            "--num-tasks",
            "2",
            "--adapt-steps",
            "1",
            "--adaptation-mode",
            "standard",
            "hybrid",
            "--adapt-objective",
            "pg",
            "dynamics",
            "entropy",
        ]
    )
    assert sha256(trained_ckpt) == digest
    res = json.load(open(os.path.join(os.path.dirname(trained_ckpt), "adapt.json")))
    assert set(res["results"]) == {f"{a}/{o}" for a in ("standard", "hybrid") for o in ("pg", "dynamics", "entropy")}
    assert all(list(r["returns_after_steps"]) == ["0", "1"] for r in res["results"].values())
    assert os.path.isfile(os.path.join(os.path.dirname(trained_ckpt), "adapt.png"))


# ------------------------------------------------------------------------------------------------ ADAPTERS


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


def test_adapter_max_step_guard_caps_the_parameter_change():
    """With a large SGD step, one adapter step moves the adapted parameters by exactly --max-step-norm (the guard
    rescales the change, keeping its direction) and reports that the guard fired; without the guard the change is
    far larger."""
    model, _, data = tiny_setup(dtype=torch.float32)
    theta0 = {k: v.detach() for k, v in model.named_parameters()}
    batch = data[0]["train"][0]
    cfg = maml_ssm.AdaptArgs("", grad_clip=1e9, max_step_norm=0.05, trust_region=1e9)
    free = maml_ssm.StandardAdapter(model, theta0, dataclasses.replace(cfg, max_step_norm=1e9), "pg", 50.0)
    capped = maml_ssm.StandardAdapter(model, theta0, cfg, "pg", 50.0)
    assert not free.step(batch)["fired_max_step"]
    info = capped.step(batch)
    vec = lambda p: torch.cat([p[k].detach().reshape(-1) for k in free.names])  # noqa: E731
    d_free, d_cap = vec(free.params) - vec(theta0), vec(capped.params) - vec(theta0)
    assert d_free.norm() > 1.0 and info["fired_max_step"]
    assert d_cap.norm().item() == pytest.approx(0.05, rel=1e-4)
    assert torch.allclose(d_cap, d_free * (0.05 / d_free.norm()), atol=1e-6)


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
    assert set(maml_ssm.select_params(theta0, "ssm")) == {k for k in theta0 if k.startswith("core.")}


def test_norm_selection_adapts_only_the_layernorm():
    torch.manual_seed(0)
    args = maml_ssm.Args(
        hidden_size=6, state_size=3, max_episode_steps=10, fast_batch_size=3, tasks_per_batch=2, layer_norm=True
    )
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    assert maml_ssm.count_params(model) == maml_ssm.agent_param_count("ssm", 2, 2, False, 6, 3, True, True)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    rng, _ = maml_ssm.task_streams(0)
    data, _ = maml_ssm.sample_task_batches(
        model, theta, maml_ssm.sample_tasks(args.task, rng, 2, "train"), args, torch.Generator().manual_seed(0), 1, [0.5]
    )
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
    replay = maml_ssm.replay_as_batch(hyb.buffer.sample(hyb.aargs.experience_batch_size, hyb.replay_gen))
    hyb.replay = replay
    cur, rep = std.loss(batch).item(), std.loss(replay).item()
    assert hyb.loss(batch).item() == pytest.approx(cur + 0.3 * rep, rel=1e-5)
    assert abs(rep) > 1e-6
    zero, _ = adapter(model, data, "hybrid", objective, experience_weight=0.0)
    zero.replay = replay
    assert zero.loss(batch).item() == cur


def test_hybrid_step_descends_the_current_plus_replayed_loss():
    """One SGD step of the hybrid adapter (guards off) differs from the standard adapter's step on the same batch by
    exactly -lr x experience_weight x the gradient of the replayed batch's loss (the batch its generator draws), and
    its loss_after is the combined loss. A hybrid step that ignored the replay would equal the standard one."""
    model, _, data = tiny_setup(dtype=torch.float32)
    batch = data[0]["train"][0]
    buf = maml_ssm.ExperienceBuffer(500, 2, 5, 2, model.initial_state(1).shape[1])
    for i, td in enumerate(data):
        maml_ssm.add_batch_to_buffer(buf, td["val"], i)
    cfg = maml_ssm.AdaptArgs(
        "", grad_clip=1e9, max_step_norm=1e9, trust_region=1e9, experience_weight=0.5, experience_batch_size=16
    )
    theta0 = {k: v.detach() for k, v in model.named_parameters()}
    std = maml_ssm.StandardAdapter(model, theta0, cfg, "pg", 0.2, buf, torch.Generator().manual_seed(0))
    hyb = maml_ssm.HybridAdapter(model, theta0, cfg, "pg", 0.2, buf, torch.Generator().manual_seed(0))
    replay = maml_ssm.replay_as_batch(buf.sample(16, torch.Generator().manual_seed(0)))
    std.step(batch)
    info = hyb.step(batch)
    leaves = {k: v.clone().requires_grad_(True) for k, v in theta0.items()}
    loss, _ = maml_ssm.objective_loss(model, leaves, replay, "pg")
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    expected = torch.cat(
        [(-0.2 * 0.5 * g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, leaves.values())]
    )
    diff = torch.cat([(hyb.params[k] - std.params[k]).detach().reshape(-1) for k in theta0])
    assert expected.norm() > 1e-3
    assert torch.allclose(diff, expected, atol=1e-5), (diff - expected).abs().max()
    assert all(torch.equal(hyb.replay[k], replay[k]) for k in replay)  # the batch the step drew
    combined = hyb.loss(batch).item()
    assert info["loss_after"] == pytest.approx(combined, rel=1e-6)
    assert abs(combined - maml_ssm.StandardAdapter.loss(hyb, batch).item()) > 1e-4


def test_dynamics_objective_ignores_rewards_and_pg_does_not():
    model, args, data = tiny_setup(dtype=torch.float32)
    batch = data[0]["train"][0]
    params = {k: v.detach() for k, v in model.named_parameters()}
    other = dict(batch)
    other["rewards"] = torch.randn_like(batch["rewards"]) * batch["masks"]
    inputs = batch["inputs"].clone()
    inputs[1:, :, -1] = other["rewards"][:-1]  # the in-context reward channel changes too
    other["inputs"] = inputs
    other["advantages"] = maml_ssm.compute_advantages(other, args.gamma, args.gae_lambda)
    d1, _ = maml_ssm.objective_loss(model, params, batch, "dynamics")
    d2, _ = maml_ssm.objective_loss(model, params, other, "dynamics")
    assert d1.item() == d2.item()
    p1, _ = maml_ssm.objective_loss(model, params, batch, "pg")
    p2, _ = maml_ssm.objective_loss(model, params, other, "pg")
    assert abs(p1.item() - p2.item()) > 1e-4


def test_strategy_registry_and_tent_adds_entropy():
    model, _, data = tiny_setup(dtype=torch.float32)
    assert {"none", "tent"} <= set(maml_ssm.STRATEGIES)

    @maml_ssm.register_adaptation_strategy("double_for_test")
    def double(loss, out, masks, adapter):
        return 2 * loss

    batch = data[0]["train"][0]
    base, _ = adapter(model, data, objective="dynamics")
    tent, _ = adapter(model, data, objective="dynamics", strategy="tent", tent_coef=0.5)
    dbl, _ = adapter(model, data, objective="dynamics", strategy="double_for_test")
    ent, _ = adapter(model, data, objective="entropy")
    assert tent.loss(batch).item() == pytest.approx(base.loss(batch).item() + 0.5 * ent.loss(batch).item(), rel=1e-5)
    default, _ = adapter(model, data, objective="dynamics", strategy="tent")  # the plan's example weight, 0.01
    assert default.loss(batch).item() == pytest.approx(base.loss(batch).item() + 0.01 * ent.loss(batch).item(), rel=1e-5)
    assert dbl.loss(batch).item() == pytest.approx(2 * base.loss(batch).item(), rel=1e-6)
    del maml_ssm.STRATEGIES["double_for_test"]


def test_pg_weights_steps_acted_by_other_parameters():
    """The gradient of pg on episodes drawn by behaviour parameters b is E_b[rho grad log pi A], rho = pi / pi_b:
    without the weight an EMA or online batch would be fitted as if the adapted policy had acted."""
    model, _, theta0, batch = gaussian_setup()
    cfg = maml_ssm.AdaptArgs("", ema_decay=0.9, max_step_norm=1e9, trust_region=1e9)
    ad = maml_ssm.StandardAdapter(model, theta0, cfg, "pg", 0.3)
    ad.step(batch)  # params move, the acting EMA lags behind: the two policies differ
    behaved = dict(batch, behaviour_logp=batch["logp"])
    out = maml_ssm.policy_out(model, ad.params, batch)
    logp = maml_ssm.log_prob(maml_ssm.make_dist(out, False), batch["actions"], False)
    mask = batch["masks"]
    rho = torch.where(mask > 0, logp - batch["logp"], torch.zeros_like(logp)).exp()
    assert (rho[mask > 0] - 1).abs().max() > 0.05 and 1 < rho[mask > 0].max() < cfg.max_importance_weight
    leaves = [ad.params[k] for k in ad.names if not k.startswith(("value_head", "dyn_head"))]  # the policy's
    want = torch.autograd.grad(-(rho * batch["advantages"] * mask).sum() / mask.sum(), leaves, retain_graph=True)
    got = torch.autograd.grad(ad.loss(behaved), leaves)
    assert all(torch.allclose(g, w, atol=1e-6, rtol=1e-4) for g, w in zip(got, want))
    # truncated at the cap: the weight of every step is min(rho, cap)
    capped = maml_ssm.StandardAdapter(model, theta0, dataclasses.replace(cfg, max_importance_weight=1.0), "pg", 0.3)
    capped.params = ad.params
    want = torch.autograd.grad(
        -(rho.clamp(max=1.0).detach() * logp * batch["advantages"] * mask).sum() / mask.sum(), leaves, retain_graph=True
    )
    got = torch.autograd.grad(capped.loss(behaved), leaves)
    assert all(torch.allclose(g, w, atol=1e-6, rtol=1e-4) for g, w in zip(got, want))
    # on-policy batches (no behaviour log-probs) keep the plain rule, bit for bit
    plain = -(logp * batch["advantages"] * mask).sum() / mask.sum()
    assert torch.equal(ad.loss(batch), plain)
    # steps after an episode's end never reach the loss, whatever log-prob they hold
    padded = dict(behaved, masks=mask.clone(), behaviour_logp=batch["logp"].clone())
    padded["masks"][-3:, 0] = 0
    loss = ad.loss(padded)
    padded["behaviour_logp"][-3:, 0] = float("nan")
    assert torch.equal(ad.loss(padded), loss) and torch.isfinite(loss)


# ------------------------------------------------------------------------------------------------ ADAPT RUNS


def test_adapt_draws_test_tasks_and_gives_every_task_its_own_adapter(tmp_path, monkeypatch):
    """run_adaptation evaluates on the seed's test stream (never the training stream) and builds one adapter per
    test task: each takes adapt_steps steps on its own task's episodes, so their parameters differ. One adapter
    shared by all tasks would be stepped on every task's data in turn."""
    torch.manual_seed(0)
    args = maml_ssm.Args(policy="mlp", hidden_size=6, max_episode_steps=5, fast_batch_size=2, seed=4)
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    path = str(tmp_path / "tiny.cleanrl_model")
    maml_ssm.save_checkpoint(
        path, model, args, {"task": args.task, "train_tasks": []}, maml_ssm.TASK_VERSIONS[args.task], {"buffer": None}
    )
    env_tasks, made, steps = [], [], {}
    real_make_env = maml_ssm.make_env

    def spy_make_env(args_, task_params, per, gen):
        env_tasks.append(np.array(task_params))
        return real_make_env(args_, task_params, per, gen)

    class Recording(maml_ssm.StandardAdapter):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

        def step(self, batch):
            steps[id(self)] = steps.get(id(self), 0) + 1
            return super().step(batch)

    monkeypatch.setattr(maml_ssm, "make_env", spy_make_env)
    monkeypatch.setitem(maml_ssm.ADAPTERS, "standard", Recording)
    aargs = maml_ssm.AdaptArgs(
        path,
        num_tasks=3,
        adapt_steps=2,
        adapt_lr=0.5,
        adaptation_mode=("standard",),
        adapt_objective=("pg",),
        max_step_norm=100.0,
        trust_region=100.0,
    )
    res = maml_ssm.run_adaptation(path, aargs)
    assert list(res["results"]["standard/pg"]["returns_after_steps"]) == ["0", "1", "2"]
    train_rng, test_rng = maml_ssm.task_streams(4)
    # one env for the no-adaptation level, one for the run: both on the test tasks
    test_tasks = maml_ssm.sample_tasks(args.task, test_rng, 3, "test")
    assert len(env_tasks) == 2 and all(np.array_equal(t, test_tasks) for t in env_tasks)
    assert not np.array_equal(env_tasks[0], maml_ssm.sample_tasks(args.task, train_rng, 3, "train"))
    assert len(made) == 3 and len({id(a) for a in made}) == 3
    assert sorted(steps.values()) == [2, 2, 2]
    vecs = [torch.cat([a.params[k].detach().reshape(-1) for k in a.names]) for a in made]
    theta0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert all((v - theta0).norm() > 1e-4 for v in vecs)
    assert all((vecs[i] - vecs[j]).norm() > 1e-4 for i in range(3) for j in range(i + 1, 3))


def test_feature_shift_needs_training_statistics(tmp_path):
    """--outer-steps 0 (the random-init baseline) saves feature statistics that never saw a batch (mean 0, var 1,
    count 0): adapt reports no feature shift against them rather than a meaningless number."""
    run_maml(["train", "--task", "point-nav-2d", "--runs-dir", str(tmp_path), "--save-model", *TINY, "--outer-steps", "0"])
    (path,) = glob.glob(str(tmp_path / "*" / "maml_ssm.cleanrl_model"))
    assert torch.load(path, weights_only=False)["feature_stats"]["count"] == 0
    run_maml(["adapt", "--checkpoint", path, "--num-tasks", "2", "--adapt-steps", "1"])
    res = json.load(open(os.path.join(os.path.dirname(path), "adapt.json")))
    monitors = [entry for r in res["results"].values() for entry in r["monitor"]]
    assert monitors and all("entropy" in e and "feature_shift" not in e for e in monitors)


def test_hybrid_with_zero_weight_is_standard_across_a_whole_run(cartpole_ckpt):
    """hybrid drew its replay sample from the generator of the test episodes' resets, so from the first step on it
    saw other episodes than standard; with a generator of its own, alpha = 0 is standard to the last digit."""
    res = adapt(cartpole_ckpt, adaptation_mode=("standard", "hybrid"), experience_weight=0.0)["results"]
    assert res["hybrid/pg"]["returns_after_steps"] == res["standard/pg"]["returns_after_steps"]
    assert res["hybrid/pg"]["final_drift"] == res["standard/pg"]["final_drift"] > 0
    weighted = adapt(cartpole_ckpt, adaptation_mode=("hybrid",), experience_weight=1.0)["results"]["hybrid/pg"]
    assert weighted["returns_after_steps"]["0"] == res["standard/pg"]["returns_after_steps"]["0"]
    assert weighted["final_drift"] != res["standard/pg"]["final_drift"]


def test_no_adaptation_level_is_theta0_offline_and_online(trained_ckpt, cartpole_ckpt, monkeypatch, tmp_path):
    """The no-adaptation level is theta_0 on the episodes every run starts with (cartpole: from the same random start
    states), not entry 0 of an online run, which has adapted within its episodes; adapt.png draws that level."""
    ckpt = trained_ckpt
    for path in (ckpt, cartpole_ckpt):
        offline = adapt(path, adapt_objective=("pg", "dynamics"), adaptation_mode=("standard", "hybrid"))
        level = offline["no_adaptation"]["return"]
        assert len(offline["results"]) == 4 and all(
            r["returns_after_steps"]["0"] == level for r in offline["results"].values()
        )
    offline = adapt(ckpt)
    online = adapt(ckpt, adapt_steps=0, online=True, online_every=2, adapt_lr=0.5)
    assert online["no_adaptation"] == offline["no_adaptation"]
    assert online["results"]["standard/pg"]["returns_after_steps"]["0"] != offline["no_adaptation"]["return"]
    # and that level is the line adapt.png draws
    import matplotlib.axes

    drawn = []
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", lambda self, y=0, *a, **kw: drawn.append(y))
    maml_ssm.adapt_command(maml_ssm.AdaptArgs(ckpt, num_tasks=2, adapt_steps=0, adapt_lr=0.5, online=True, online_every=2))
    written = json.load(open(os.path.join(os.path.dirname(ckpt), "adapt_online.json")))
    assert written["no_adaptation"] == offline["no_adaptation"] and drawn == [written["no_adaptation"]["return"]]


def test_adapt_passes_behaviour_log_probs_with_ema_and_online(trained_ckpt, monkeypatch):
    ckpt = trained_ckpt
    seen = []
    real_step = maml_ssm.StandardAdapter.step

    def spy(self, batch):
        seen.append(({k: v.detach().clone() for k, v in self.params.items()}, {k: v.clone() for k, v in batch.items()}))
        return real_step(self, batch)

    monkeypatch.setattr(maml_ssm.StandardAdapter, "step", spy)
    adapt(ckpt, adapt_steps=1)
    assert seen and all("behaviour_logp" not in b for _, b in seen)  # acted by the parameters it fits
    seen.clear()
    adapt(ckpt, adapt_steps=1, ema_decay=0.5)
    assert seen and all(b["behaviour_logp"] is not None and torch.equal(b["behaviour_logp"], b["logp"]) for _, b in seen)
    assert "--max-importance-weight must be >= 1" in validation_error(
        maml_ssm.validate, maml_ssm.AdaptArgs(ckpt, max_importance_weight=0.5)
    )
    seen.clear()
    adapt(ckpt, adapt_steps=0, online=True, online_every=3, adapt_lr=0.5)
    assert len(seen) >= 4 and all("behaviour_logp" in b for _, b in seen)
    # the second online step of each task (seen[2:4]): the first 3 steps were acted by theta_0, and the parameters
    # being fitted (after one step) give them other log-probs, so their weights are not 1
    model, _, _ = maml_ssm.load_checkpoint(ckpt)
    theta0 = dict(model.named_parameters())

    def logp_under(params, b):
        out = maml_ssm.policy_out(model, params, b)
        return maml_ssm.log_prob(maml_ssm.make_dist(out, model.discrete), b["actions"], model.discrete)[:3]

    for params, b in seen[2:4]:
        assert b["masks"].shape[0] == 6 and (b["masks"][:3] > 0).all()
        assert torch.allclose(logp_under(theta0, b), b["behaviour_logp"][:3], atol=1e-4)
        assert (logp_under(params, b) - b["behaviour_logp"][:3]).abs().max() > 1e-3


def test_adapt_writes_each_step_and_the_curve_to_tensorboard(trained_ckpt, tmp_path):
    """adapt_tb holds, per adapter x objective, one row of step statistics for every adaptation step of every task (x
    axis: that step's index), and the return and monitor statistics after 0..K steps, equal to adapt.json's."""
    ckpt = str(tmp_path / "maml_ssm.cleanrl_model")
    with open(trained_ckpt, "rb") as src, open(ckpt, "wb") as dst:
        dst.write(src.read())
    aargs = maml_ssm.AdaptArgs(ckpt, num_tasks=2, adapt_steps=2, episodes=2, adaptation_mode=("standard", "hybrid"))
    maml_ssm.adapt_command(aargs)
    written = json.load(open(tmp_path / "adapt.json"))["results"]
    scalars = logged_scalars(str(tmp_path / "adapt_tb"))
    for mode in ("standard", "hybrid"):
        tag = f"tta/{mode}_pg/"
        result = written[f"{mode}/pg"]
        curve = scalars[tag + "return_after_steps"]
        assert [k for k, _ in curve] == [0, 1, 2]
        assert [v for _, v in curve] == pytest.approx([result["returns_after_steps"][str(k)] for k in range(3)], rel=1e-6)
        for key in ("entropy", "confidence", "feature_shift"):
            assert [v for _, v in scalars[tag + key]] == pytest.approx([row[key] for row in result["monitor"]], rel=1e-6)
        for key in ("loss_before", "loss_after", "grad_norm", "drift", "guard_fired"):
            assert [k for k, _ in scalars[tag + key]] == [0, 1, 2, 3], key  # 2 steps x 2 tasks
        assert {v for _, v in scalars[tag + "guard_fired"]} <= {0.0, 1.0}
    standard = [v for _, v in scalars["tta/standard_pg/loss_before"]]
    hybrid = [v for _, v in scalars["tta/hybrid_pg/loss_before"]]
    assert standard[0] != hybrid[0]  # the same first batch, plus the replayed term


def test_adapt_online_and_bad_input(trained_ckpt):
    run_maml(
        [
            "adapt",
            "--checkpoint",
            trained_ckpt,
            "--num-tasks",
            "2",
            "--adapt-steps",
            "1",
            "--online",
            "--online-every",
            "4",
            "--adaptation-mode",
            "hybrid",
            "--adapt-objective",
            "dynamics",
            "--ema-decay",
            "0.5",
        ]
    )
    res = json.load(open(os.path.join(os.path.dirname(trained_ckpt), "adapt_online.json")))
    assert res["online"] and res["results"]["hybrid/dynamics"]["final_drift"] > 0
    res = run_maml(["adapt", "--checkpoint", trained_ckpt, "--adaptation-mode", "replay"], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "unknown --adaptation-mode" in lines[0], res.stderr
    # the same validator, in process (the subprocess above proves it is wired to one line + exit 2)
    assert "--adapt-lr must be positive" in validation_error(maml_ssm.validate, maml_ssm.AdaptArgs(trained_ckpt, adapt_lr=0.0))
    # entropy on a Gaussian policy has a gradient for the log-std only: with the core's parameters it was a traceback
    res = run_maml(
        ["adapt", "--checkpoint", trained_ckpt, "--adapt-objective", "entropy", "--adapt-params", "ssm"], check=False
    )
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "maml_ssm.py: error: --adapt-objective entropy on this Gaussian policy reaches only its log-std, which "
        "--adapt-params ssm does not adapt; use --adapt-params all or heads, or another objective"
    ], res.stderr
    res = run_maml(["adapt", "--checkpoint", trained_ckpt, "--adapt-params", "norm"], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "train it with --layer-norm" in lines[0], res.stderr
    horizon = torch.load(trained_ckpt, weights_only=False)["args"]["max_episode_steps"]
    res = run_maml(["adapt", "--checkpoint", trained_ckpt, "--online", "--online-every", str(horizon)], check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "no step would adapt" in lines[0], res.stderr
    assert "unknown --adapt-params" in validation_error(
        maml_ssm.validate, maml_ssm.AdaptArgs(trained_ckpt, adapt_params="bias")
    )
    assert "unknown --adapt-objective" in validation_error(
        maml_ssm.validate, maml_ssm.AdaptArgs(trained_ckpt, adapt_objective=("reward",))
    )
    assert "at least one value" in validation_error(maml_ssm.validate, maml_ssm.AdaptArgs(trained_ckpt, adapt_objective=()))
    assert "--trust-region nan must be a finite" in validation_error(
        maml_ssm.validate, maml_ssm.AdaptArgs(trained_ckpt, trust_region=float("nan"))
    )
    assert "--eval-seed -1 must be in" in validation_error(maml_ssm.validate, maml_ssm.AdaptArgs(trained_ckpt, eval_seed=-1))
    assert validation_error(maml_ssm.validate, maml_ssm.AdaptArgs(trained_ckpt)) is None


def adaptation_events(ckpt, monkeypatch, **kw):
    """run_adaptation with its rollouts and adaptation steps recorded: per rollout after the no-adaptation level, the
    online steps taken during it and the between-batch steps taken after it, and the run's result."""
    events = []
    real_rollout = maml_ssm.rollout
    real_step = maml_ssm.adapt_step

    def rollout_spy(*args, **kwargs):
        events.append("rollout")
        return real_rollout(*args, **kwargs)

    def step_spy(*args, online=False, **kwargs):
        events.append("online" if online else "between")
        return real_step(*args, online=online, **kwargs)

    monkeypatch.setattr(maml_ssm, "rollout", rollout_spy)
    monkeypatch.setattr(maml_ssm, "adapt_step", step_spy)
    res = adapt(ckpt, **kw)
    assert events[:2] == ["rollout", "rollout"], events  # the no-adaptation level acts with theta_0 alone
    per_rollout = []
    for event in events[1:]:
        if event == "rollout":
            per_rollout.append({"online": 0, "between": 0})
        else:
            per_rollout[-1][event] += 1
    return per_rollout, res


def test_online_plan_runs_the_k_steps_then_adapts_during_the_last_rollout(trained_ckpt, monkeypatch):
    """--online (the pipeline plan's): the --adapt-steps gradient steps run between batches as without --online, then
    the rollout after them adapts online. Entries 0..K-1 of the plan's run are the between-batch run's; entry K adds the
    online updates."""
    kw = dict(adapt_steps=2, adapt_lr=0.5, online_every=2)
    plan, plan_res = adaptation_events(trained_ckpt, monkeypatch, online=True, **kw)
    assert [r["between"] for r in plan] == [1, 1, 0], plan
    assert [r["online"] > 0 for r in plan] == [False, False, True], plan
    offline, offline_res = adaptation_events(trained_ckpt, monkeypatch, **kw)
    assert offline == [{"online": 0, "between": 1}, {"online": 0, "between": 1}, {"online": 0, "between": 0}]
    assert (plan_res["online_mode"], offline_res["online_mode"]) == ("plan", None)
    plan_curve = plan_res["results"]["standard/pg"]["returns_after_steps"]
    offline_curve = offline_res["results"]["standard/pg"]["returns_after_steps"]
    assert [plan_curve[k] for k in "01"] == [offline_curve[k] for k in "01"]
    assert plan_curve["2"] != offline_curve["2"]


def test_hybrid_refuses_a_checkpoint_without_a_buffer(trained_ckpt):
    """train fills a buffer whatever adapt will do; a checkpoint without one (--buffer-size 0) serves `standard` only."""
    model, _, ckpt = maml_ssm.load_checkpoint(trained_ckpt)
    assert ckpt["buffer"]["size"] > 0
    hybrid = maml_ssm.AdaptArgs(trained_ckpt, adaptation_mode=("standard", "hybrid"))
    for buffer in (None, {**ckpt["buffer"], "size": 0}):
        with pytest.raises(ValueError, match="--adaptation-mode hybrid needs a checkpoint with a non-empty ExperienceBuffer"):
            maml_ssm.validate_adapt_against(hybrid, model, {**ckpt, "buffer": buffer})
    assert maml_ssm.validate_adapt_against(maml_ssm.AdaptArgs(trained_ckpt), model, {**ckpt, "buffer": None}) is None
