"""maml_ssm.py: the defects a session-17 review listed as known and session 18 fixed. Each test fails on the code
before the fix: the logged inner loss, --dynamics-coef under Adam, eval's defaults, the cartpole ranges of a
checkpoint, hybrid's replay generator, adapt's no-adaptation level, and importance weights for pg on episodes
acted by other parameters (--ema-decay, --online)."""

import dataclasses
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from cleanrl_astral import maml_ssm as m

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
TINY = dict(outer_steps=1, tasks_per_batch=2, fast_batch_size=3, max_episode_steps=12, hidden_size=8, state_size=4,
            cg_iters=3, ls_max_steps=3, eval_tasks=3, eval_steps=2)


def run(*args, check=True):
    return subprocess.run([sys.executable, os.path.join(REPO, "cleanrl_astral", "maml_ssm.py"), *args], cwd=REPO,
                          env=ENV, capture_output=True, text=True, check=check)


def train_in_process(tmp_path, monkeypatch, **kw):
    """Runs main_train in this process; returns (the trained model, its parameters before training, run dir)."""
    made = []
    real_build = m.build_agent

    def spy_build(args, env_cls):
        model = real_build(args, env_cls)
        made.append((model, {k: v.detach().clone() for k, v in model.named_parameters()}))
        return model

    monkeypatch.setattr(m, "build_agent", spy_build)
    runs = tmp_path / f"runs{len(list(tmp_path.iterdir()))}"
    m.main_train(m.Args(runs_dir=str(runs), **{**TINY, **kw}))
    monkeypatch.setattr(m, "build_agent", real_build)
    (run_dir,) = glob.glob(str(runs / "*"))
    return made[0][0], made[0][1], run_dir


def train_tiny(runs, *extra):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()] + ["--outer-steps=2", *extra]
    run("train", "--runs-dir", str(runs), "--save-model", *flags)
    (path,) = glob.glob(str(runs / "*" / "maml_ssm.cleanrl_model"))
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny point-nav checkpoint whose evaluation settings are not eval's old defaults (40 tasks, 3 steps, 0.5)."""
    return train_tiny(tmp_path_factory.mktemp("runs"), "--eval-later-lr-scale=0.25")


@pytest.fixture(scope="module")
def cartpole_ckpt(tmp_path_factory):
    """cartpole-physics draws random start states from the env's generator (point-nav starts at the origin)."""
    return train_tiny(tmp_path_factory.mktemp("runs"), "--task=cartpole-physics", "--max-episode-steps=30")


def test_logged_inner_loss_is_that_of_the_parameters_that_sampled_the_batch(tmp_path, monkeypatch):
    """theta = {k: p.detach()} shares storage with the parameters; Adam updates them in place, so an inner loss
    computed after the outer step was the updated parameters' (under TRPO, which assigns new tensors, the old)."""
    seen = []
    real = m.inner_loss

    def spy(model, params, batch):
        if not torch.is_grad_enabled():  # the logging call (the inner step itself needs the graph)
            seen.append({k: v.detach().clone() for k, v in params.items()})
        return real(model, params, batch)

    monkeypatch.setattr(m, "inner_loss", spy)
    model, before, _ = train_in_process(tmp_path, monkeypatch, outer_optimizer="adam", outer_lr=0.01)
    assert seen and all(torch.equal(s["encoder.weight"], before["encoder.weight"]) for s in seen)
    assert not torch.equal(model.encoder.weight.detach(), before["encoder.weight"])  # the outer step did move it


@pytest.mark.parametrize("layer_norm", [False, True])
def test_dynamics_coef_sets_the_trunks_step_under_adam(tmp_path, monkeypatch, layer_norm):
    """The trunk's only gradient in the auxiliary step is the dynamics loss's. Adam's first step is lr * sign(g)
    whatever the scale of g, so scaling the loss made 0.01 and 1 move the trunk alike; the coefficient now scales the
    trunk's step size. With 0 the trunk is not in the auxiliary step at all."""
    models = {c: train_in_process(tmp_path, monkeypatch, outer_optimizer="adam", dynamics_coef=c, layer_norm=layer_norm)[0]
              for c in (0.0, 0.01, 1.0)}
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


def test_eval_defaults_are_the_checkpoints_own_evaluation(ckpt):
    """eval used 40 tasks, 3 steps and alpha/2 whatever the checkpoint's --eval-tasks, --eval-steps and
    --eval-later-lr-scale; a bare `eval` now repeats the evaluation training wrote."""
    trained = json.load(open(os.path.join(os.path.dirname(ckpt), "eval.json")))
    default = m.evaluate(ckpt, write=False)
    assert default == trained and default["num_tasks"] == 3 and list(default["returns_after_steps"]) == ["0", "1", "2"]
    assert default == m.evaluate(ckpt, 3, 2, later_lr_scale=0.25, write=False)
    assert default["returns_after_steps"]["2"] != m.evaluate(ckpt, 3, 2, later_lr_scale=0.5, write=False)["returns_after_steps"]["2"]
    out = run("eval", "--checkpoint", ckpt)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == trained
    res = run("eval", "--checkpoint", ckpt, "--num-tasks", "1", check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "--num-tasks must be >= 2" in res.stderr


def test_a_cartpole_checkpoint_with_other_physics_ranges_is_refused(cartpole_ckpt, tmp_path):
    m.load_checkpoint(cartpole_ckpt)
    for key in ("train_ranges", "test_ranges"):
        ckpt = torch.load(cartpole_ckpt, weights_only=False)
        ckpt["task_split"][key] = [[1.0, 2.0], [0.1, 0.2]]
        other = str(tmp_path / f"{key}.cleanrl_model")
        torch.save(ckpt, other)
        with pytest.raises(ValueError, match=f"cartpole {key.replace('_', ' ')} .* are not this script's"):
            m.load_checkpoint(other)
    res = run("eval", "--checkpoint", other, check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "retrain it" in res.stderr
    for malformed in ({"gravity": 1}, [[1.0], [2.0, 3.0]], None):  # hand-edited or missing: the same one-line reason
        ckpt["task_split"]["test_ranges"] = malformed
        torch.save(ckpt, other)
        with pytest.raises(ValueError, match="are not this script's"):
            m.load_checkpoint(other)


def adapt(ckpt, **kw):
    aargs = dict(num_tasks=2, adapt_steps=2, adapt_lr=0.1, adaptation_mode=("standard",), adapt_objective=("pg",))
    return m.run_adaptation(ckpt, m.AdaptArgs(ckpt, **{**aargs, **kw}))


def test_hybrid_with_zero_weight_is_standard_across_a_whole_run(cartpole_ckpt):
    """hybrid drew its replay sample from the generator of the test episodes' resets, so from the first step on it
    saw other episodes than standard; with a generator of its own, alpha = 0 is standard to the last digit."""
    res = adapt(cartpole_ckpt, adaptation_mode=("standard", "hybrid"), experience_weight=0.0)["results"]
    assert res["hybrid/pg"]["returns_after_steps"] == res["standard/pg"]["returns_after_steps"]
    assert res["hybrid/pg"]["final_drift"] == res["standard/pg"]["final_drift"] > 0
    weighted = adapt(cartpole_ckpt, adaptation_mode=("hybrid",), experience_weight=1.0)["results"]["hybrid/pg"]
    assert weighted["returns_after_steps"]["0"] == res["standard/pg"]["returns_after_steps"]["0"]
    assert weighted["final_drift"] != res["standard/pg"]["final_drift"]


def test_no_adaptation_level_is_theta0_offline_and_online(ckpt, cartpole_ckpt, monkeypatch, tmp_path):
    """adapt.png's "no adaptation" line was entry 0 of the last run; with --online that entry has adapted within its
    episodes. The level is now measured with theta_0 on the episodes every run starts with (cartpole: from the same
    random start states)."""
    for path in (ckpt, cartpole_ckpt):
        offline = adapt(path, adapt_objective=("pg", "dynamics"), adaptation_mode=("standard", "hybrid"))
        level = offline["no_adaptation"]["return"]
        assert len(offline["results"]) == 4 and all(r["returns_after_steps"]["0"] == level for r in offline["results"].values())
    offline = adapt(ckpt)
    online = adapt(ckpt, adapt_steps=0, online=True, online_every=2, adapt_lr=0.5)
    assert online["no_adaptation"] == offline["no_adaptation"]
    assert online["results"]["standard/pg"]["returns_after_steps"]["0"] != offline["no_adaptation"]["return"]
    # and that level is the line adapt.png draws
    import matplotlib.axes

    drawn = []
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", lambda self, y=0, *a, **kw: drawn.append(y))
    m.plot_adaptation(online, str(tmp_path / "adapt.png"))
    assert drawn == [online["no_adaptation"]["return"]]


def gaussian_setup():
    torch.manual_seed(0)
    args = m.Args(hidden_size=6, state_size=3, max_episode_steps=10, fast_batch_size=3, tasks_per_batch=1)
    model = m.build_agent(args, m.PointNav2D)
    rng, _ = m.task_streams(0)
    tasks = m.sample_tasks(args.task, rng, 1, "train")
    theta0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    batch = m.rollout(model, [theta0], m.make_env(args, tasks, 3, torch.Generator().manual_seed(0)), 10)
    batch["advantages"] = m.compute_advantages(batch, args.gamma, args.gae_lambda)
    return model, args, theta0, batch


def test_pg_weights_steps_acted_by_other_parameters():
    """The gradient of pg on episodes drawn by behaviour parameters b is E_b[rho grad log pi A], rho = pi / pi_b:
    without the weight (before session 18) an EMA or online batch was fitted as if the adapted policy had acted."""
    model, _, theta0, batch = gaussian_setup()
    cfg = m.AdaptConfig(adapt_objective="pg", adapt_lr=0.3, ema_decay=0.9, max_step_norm=1e9, trust_region=1e9)
    ad = m.StandardAdapter(model, theta0, cfg)
    ad.step(batch)  # params move, the acting EMA lags behind: the two policies differ
    behaved = dict(batch, behaviour_logp=batch["logp"])
    out = m.policy_out(model, ad.params, batch)
    logp = m.log_prob(m.make_dist(out, False), batch["actions"], False)
    mask = batch["masks"]
    rho = torch.where(mask > 0, logp - batch["logp"], torch.zeros_like(logp)).exp()
    assert (rho[mask > 0] - 1).abs().max() > 0.05 and 1 < rho[mask > 0].max() < cfg.max_importance_weight
    leaves = [ad.params[k] for k in ad.names if not k.startswith(("value_head", "dyn_head"))]  # the policy's
    want = torch.autograd.grad(-(rho * batch["advantages"] * mask).sum() / mask.sum(), leaves, retain_graph=True)
    got = torch.autograd.grad(ad.loss(behaved), leaves)
    assert all(torch.allclose(g, w, atol=1e-6, rtol=1e-4) for g, w in zip(got, want))
    # truncated at the cap: the weight of every step is min(rho, cap)
    capped = m.StandardAdapter(model, theta0, dataclasses.replace(cfg, max_importance_weight=1.0))
    capped.params = ad.params
    want = torch.autograd.grad(-(rho.clamp(max=1.0).detach() * logp * batch["advantages"] * mask).sum() / mask.sum(),
                               leaves, retain_graph=True)
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


def test_adapt_passes_behaviour_log_probs_with_ema_and_online(ckpt, monkeypatch):
    seen = []
    real_step = m.StandardAdapter.step

    def spy(self, batch):
        seen.append(({k: v.detach().clone() for k, v in self.params.items()}, {k: v.clone() for k, v in batch.items()}))
        return real_step(self, batch)

    monkeypatch.setattr(m.StandardAdapter, "step", spy)
    adapt(ckpt, adapt_steps=1)
    assert seen and all("behaviour_logp" not in b for _, b in seen)  # acted by the parameters it fits
    seen.clear()
    adapt(ckpt, adapt_steps=1, ema_decay=0.5)
    assert seen and all(b["behaviour_logp"] is not None and torch.equal(b["behaviour_logp"], b["logp"]) for _, b in seen)
    assert "--max-importance-weight must be >= 1" in m.validate_adapt_args(m.AdaptArgs(ckpt, max_importance_weight=0.5))
    seen.clear()
    adapt(ckpt, adapt_steps=0, online=True, online_every=3, adapt_lr=0.5)
    assert len(seen) >= 4 and all("behaviour_logp" in b for _, b in seen)
    # the second online step of each task (seen[2:4]): the first 3 steps were acted by theta_0, and the parameters
    # being fitted (after one step) give them other log-probs, so their weights are not 1
    model, _, _ = m.load_checkpoint(ckpt)
    theta0 = dict(model.named_parameters())

    def logp_under(params, b):
        out = m.policy_out(model, params, b)
        return m.log_prob(m.make_dist(out, model.discrete), b["actions"], model.discrete)[:3]

    for params, b in seen[2:4]:
        assert b["masks"].shape[0] == 6 and (b["masks"][:3] > 0).all()
        assert torch.allclose(logp_under(theta0, b), b["behaviour_logp"][:3], atol=1e-4)
        assert (logp_under(params, b) - b["behaviour_logp"][:3]).abs().max() > 1e-3
