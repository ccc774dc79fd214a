"""Tests of maml_ssm_promp.py: ProMP's objective (the clipped surrogate, the inner KL penalty, the LVC inner
estimator) and step, its command line and preset, its copies of maml_ssm.py's tasks, policies and rollout, its
checkpoints in `maml_ssm.py adapt`, and the pre-registered ProMP study's report."""

import ast
import copy
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import REPO, SCRIPT_ENV, assert_one_line_error, load_json, logged_scalars, only_run_dir
from maml_fixtures import (
    TINY,
    TINY_PROMP,
    parsed_train_args,
    run_copied_alone,
    run_maml,
    run_promp,
    tiny_setup,
    validation_error,
)

import cleanrl_astral.maml_ssm as maml_ssm
import cleanrl_astral.maml_ssm_promp as maml_ssm_promp

# what maml_ssm_promp.py shares with maml_ssm.py, as identical text: the tasks, the policies, the rollout and GAE,
# the auxiliary heads and the ExperienceBuffer, evaluation and the run's plumbing; `rollout` differs only in
# maml_ssm.py's online-adaptation hooks, which `adapt --online` alone calls
SHARED = (
    "TASKS",
    "POLICIES",
    "CARTPOLE_TRAIN_RANGES",
    "CARTPOLE_TEST_RANGES",
    "MUJOCO_PIN",
    "sample_tasks",
    "task_streams",
    "PointNav2D",
    "CartPolePhysics",
    "_CHEETAH_POOL",
    "HalfCheetahVel",
    "ENV_CLASSES",
    "TASK_VERSIONS",
    "make_env",
    "layer_init",
    "LRU",
    "diagonal_scan",
    "AgentOutput",
    "Agent",
    "make_dist",
    "log_prob",
    "build_agent",
    "policy_width",
    "agent_param_count",
    "count_params",
    "stack_steps",
    "split_batch",
    "fill_to_steps",
    "concat_episodes",
    "pad_steps",
    "per_task",
    "take",
    "clone_params",
    "stack_params",
    "compute_advantages",
    "linear_baseline",
    "policy_out",
    "masked_mean",
    "detached_dist_params",
    "kl_divergence",
    "make_aux_optimizer",
    "aux_update",
    "FeatureMonitor",
    "ExperienceBuffer",
    "make_buffer",
    "add_batch_to_buffer",
    "EvalArgs",
    "evaluate_command",
    "evaluate",
    "load_checkpoint",
    "start_run",
    "claim_run_dir",
    "print_param_counts",
    "print_progress",
    "log_scalars",
    "run_times",
    "save_model_checkpoint",
    "evaluate_saved_model",
    "atomic_torch_save",
    "atomic_write_json",
    "save_checkpoint",
    "CHECKPOINT_FORMAT",
    "read_checkpoint",
    "check_task_split",
    "training_state",
    "mean_ci95_half_width",
    "summarise",
    "write_results",
    "check_config",
    "mujoco_available",
    "flag_value",
)


def top_level_sources(module):
    """{name: source text} of a module file's top-level definitions and assignments."""
    with open(module.__file__) as f:
        text = f.read()
    sources = {}
    for node in ast.parse(text).body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign):
            names = [node.target.id]
        for name in names:
            sources[name] = ast.get_source_segment(text, node)
    return sources


def test_the_shared_definitions_are_identical_text_in_both_files():
    mine = top_level_sources(maml_ssm_promp)
    theirs = top_level_sources(maml_ssm)
    for name in SHARED:
        assert name in mine and name in theirs, name
        assert mine[name] == theirs[name], f"{name} differs between maml_ssm.py and maml_ssm_promp.py"


def test_the_promp_rollout_is_maml_ssm_s_without_its_online_adaptation_hooks():
    """Line by line, ProMP's rollout is maml_ssm.py's; the lines only maml_ssm.py has are its online hooks."""
    mine = top_level_sources(maml_ssm_promp)["rollout"].splitlines()
    theirs = top_level_sources(maml_ssm)["rollout"].splitlines()
    assert mine[0] == "def rollout(model, params, env, horizon):"
    assert theirs[0] == "def rollout(model, params, env, horizon, adapt_every=0, adapt_on=None):"
    assert mine[1] == theirs[1] + '"""'  # the one docstring line, closed
    assert [line for line in theirs[2:] if line in mine] == mine[2:]
    hooks = [line for line in theirs[2:] if line not in mine]
    assert len(hooks) == 3 and all("adapt_every" in line or "adapt_on" in line for line in hooks)


def test_promp_is_neither_an_outer_optimizer_nor_a_preset_of_maml_ssm(tmp_path):
    for flags, refusal in (
        (["--outer-optimizer", "promp"], "unknown --outer-optimizer 'promp'; choose one of trpo, adam"),
        (["--config", "promp"], "unknown --config 'promp'; choose one of none, basic, paper"),
    ):
        r = run_maml(["train", *flags, *TINY, "--runs-dir", str(tmp_path / "runs")], check=False)
        assert_one_line_error(r, refusal)
        assert not (tmp_path / "runs").exists()


def test_a_default_promp_train_run_imports_nothing_from_the_helper_package(tmp_path):
    """`train` without --save-model needs only its own file; with it, the script writes the checkpoint and eval.json, and
    the helper package, when installed, draws eval.png."""
    code = (
        "import runpy, sys\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "print('helper imported:', any(n.startswith('cleanrl_astral_utils') for n in sys.modules))\n"
    )
    script = os.path.join(REPO, "cleanrl_astral", "maml_ssm_promp.py")
    for extra, imported in (([], False), (["--save-model"], True)):
        runs = tmp_path / f"runs{len(extra)}"
        out = subprocess.run(
            [sys.executable, "-c", code, script, "train", "--runs-dir", str(runs), *TINY_PROMP, *extra],
            cwd=REPO,
            env=SCRIPT_ENV,
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"helper imported: {imported}" in out.stdout, out.stdout[-2000:]


def test_copied_alone_train_and_eval_run_without_the_helper_package(tmp_path):
    """maml_ssm_promp.py alone in a folder, without the helper package: train with --ckpt-dir and --save-model writes
    the checkpoints and eval.json, and eval of a --ckpt-dir checkpoint writes its eval.json."""
    r = run_copied_alone(
        "maml_ssm_promp", tmp_path, "train", "--save-model", "--ckpt-dir", "ck", "--runs-dir", "runs", *TINY_PROMP
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "eval.png skipped: plots need the cleanrl_astral_utils package" in r.stdout
    assert sorted(os.listdir(tmp_path / "ck")) == ["latest.cleanrl_model", "step_2.cleanrl_model"]
    run_dir = only_run_dir(str(tmp_path / "runs"))
    assert json.load(open(os.path.join(run_dir, "eval.json")))["num_tasks"] == 3
    r = run_copied_alone("maml_ssm_promp", tmp_path, "eval", "--checkpoint", "ck/latest.cleanrl_model", "--num-tasks", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.load(open(tmp_path / "ck" / "eval.json"))["num_tasks"] == 2


@pytest.fixture(scope="module")
def promp_ckpt(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    run_promp(["train", "--runs-dir", str(runs), "--save-model", *TINY_PROMP])
    return os.path.join(only_run_dir(runs), "maml_ssm_promp.cleanrl_model")


def test_maml_ssm_adapts_a_promp_checkpoint_and_refuses_to_evaluate_it_in_one_line(promp_ckpt, tmp_path):
    """`adapt` runs on ProMP's checkpoints (the same tasks, policies and rollout); `eval` would take the inner steps
    with maml_ssm.py's estimator, not the checkpoint's, so it names the file whose `eval` does."""
    run_maml(["adapt", "--checkpoint", promp_ckpt, "--adaptation-mode", "standard", "hybrid", "--adapt-steps", "1"])
    res = load_json(os.path.join(os.path.dirname(promp_ckpt), "adapt.json"))
    assert sorted(res["results"]) == ["hybrid/pg", "standard/pg"]
    r = run_maml(["eval", "--checkpoint", promp_ckpt], check=False)
    assert_one_line_error(r, "is a maml_ssm_promp checkpoint: run cleanrl_astral/maml_ssm_promp.py on it")
    r = run_promp(["eval", "--checkpoint", promp_ckpt, "--num-tasks", "2", "--episodes", "2"])
    assert json.loads(r.stdout.strip().splitlines()[-1])["num_tasks"] == 2


def test_a_checkpoint_of_another_format_from_either_script_is_refused_naming_the_commit_that_reads_it(promp_ckpt, tmp_path):
    """A maml_ssm.py checkpoint carrying ProMP's fields (as maml_ssm.py's ProMP wrote them) and a ProMP checkpoint without
    the format entry are other commits' formats: refused in one line by the scripts that read them."""
    model, args, _ = tiny_setup(policy="mlp", dtype=torch.float32)
    path = str(tmp_path / "old.cleanrl_model")
    maml_ssm.save_checkpoint(path, model, args, {"task": args.task, "train_tasks": []}, maml_ssm.TASK_VERSIONS[args.task])
    ckpt = torch.load(path, weights_only=False)
    torch.save({**ckpt, "args": {**ckpt["args"], "outer_optimizer": "promp", "inner_estimator": "lvc"}}, path)
    with pytest.raises(ValueError) as e:
        maml_ssm.load_checkpoint(path)
    assert str(e.value) == f"{path!r} holds another format of maml_ssm.py's checkpoint; commit 95652a5 reads it"
    promp = torch.load(promp_ckpt, weights_only=False)
    old = str(tmp_path / "old_promp.cleanrl_model")
    torch.save({k: v for k, v in promp.items() if k != "format"}, old)
    refusal = f"{old!r} holds another format of maml_ssm_promp.py's checkpoint; commit 95652a5 reads it"
    for script, also in ((maml_ssm, maml_ssm.ADAPTS_CHECKPOINTS_OF), (maml_ssm_promp, ())):
        with pytest.raises(ValueError) as e:
            script.load_checkpoint(old, also)
        assert str(e.value) == refusal


def test_resume_continues_a_promp_run_bit_for_bit(tmp_path):
    """Two steps then a resumed third give the weights and logged scalars of three steps in one run."""
    whole = tmp_path / "whole"
    run_promp(["train", "--runs-dir", str(whole / "runs"), "--ckpt-dir", str(whole / "ck"), *TINY_PROMP, "--outer-steps", "3"])
    part = tmp_path / "part"
    run_promp(["train", "--runs-dir", str(part / "runs"), "--ckpt-dir", str(part / "ck"), *TINY_PROMP, "--outer-steps", "2"])
    run_promp(["train", "--resume", str(part / "ck" / "latest.cleanrl_model"), "--outer-steps", "3"])
    a = torch.load(whole / "ck" / "latest.cleanrl_model", weights_only=False)
    b = torch.load(part / "ck" / "latest.cleanrl_model", weights_only=False)
    for k, v in a["state_dict"].items():
        assert torch.equal(v, b["state_dict"][k]), k
    for k, v in a["training"]["outer_opt"]["state"].items():
        assert torch.equal(v["exp_avg"], b["training"]["outer_opt"]["state"][k]["exp_avg"]), k
    sa = logged_scalars(only_run_dir(whole / "runs"))
    sb = logged_scalars(only_run_dir(part / "runs"))
    for tag in ("losses/inner_kl", "losses/clipfrac", "losses/outer_loss", "meta/post_adapt_return"):
        assert sa[tag] == sb[tag], tag


def promp_args(args, **kw):
    return dataclasses.replace(args, inner_estimator="lvc", **kw)


@pytest.mark.parametrize("policy", ["mlp", "ssm", "gru"])
def test_first_promp_step_likelihood_ratio_is_exactly_one_against_the_sampler(policy, monkeypatch):
    """At the parameters that sampled the meta-batch, the ratio pi_theta' / pi_old of ProMP's surrogate is exactly 1
    on every post-update step, and pi_old is the policy that acted (the rollout's log-probabilities, up to the float32
    of acting). The sampling policies are then held fixed: after an Adam step the ratios move away from 1."""
    model, args, data = tiny_setup(policy=policy, inner_lr=0.3, script=maml_ssm_promp)
    args = promp_args(args, promp_steps=2)
    first = maml_ssm_promp.promp_objective(model, dict(model.named_parameters()), data, args)
    for ratio, td in zip(first.ratios, data):
        valid = td["val"]["masks"] > 0
        assert torch.equal(ratio[valid], torch.ones_like(ratio[valid]))
    for old, td in zip(first.olds, data):
        acted = maml_ssm_promp.log_prob(maml_ssm_promp.make_dist(old["val"], False), td["val"]["actions"], False)
        valid = td["val"]["masks"] > 0
        assert torch.allclose(acted[valid], td["val"]["logp"][valid], atol=1e-4)
    assert first.outer_kl.item() == 0 and first.inner_kl.item() == 0 and first.clipfrac.item() == 0

    calls = []
    real = maml_ssm_promp.promp_objective

    def spy(*a, **k):
        calls.append(real(*a, **k))
        return calls[-1]

    monkeypatch.setattr(maml_ssm_promp, "promp_objective", spy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    stats = maml_ssm_promp.promp_step(model, data, args, opt)
    assert len(calls) == 3  # two Adam steps, then the statistics after them
    assert all(torch.equal(r, torch.ones_like(r)) for r, td in zip(calls[0].ratios, data) for r in [r[td["val"]["masks"] > 0]])
    assert not torch.allclose(calls[1].ratios[0], torch.ones_like(calls[1].ratios[0]), atol=1e-6)
    assert stats["approx_kl"] > 0 and stats["inner_kl"] > 0 and stats["outer_loss"] == pytest.approx(calls[0].loss.item())


def test_clipped_term_has_no_gradient_where_the_ratio_left_the_clip_range_in_the_advantages_direction():
    """-E[min(r A, clip(r, 1 - eps, 1 + eps) A)] with eps = 0.3: d/d log pi_new is -r A / N where the unclipped term
    is the minimum (inside the range, or outside against the advantage), and 0 where r > 1 + eps with A > 0 or
    r < 1 - eps with A < 0."""
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1, 0.9], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -2.0], dtype=torch.float64)
    old_logp = torch.tensor([-1.0, -0.5, -2.0, -1.5, -0.7, -1.2], dtype=torch.float64)
    new_logp = (old_logp + torch.log(ratio)).requires_grad_()
    masks = torch.ones(6, dtype=torch.float64)
    loss, r = maml_ssm_promp.clipped_surrogate(new_logp, old_logp, adv, masks, 0.3)
    (g,) = torch.autograd.grad(loss, new_logp)
    assert torch.allclose(r, ratio, rtol=1e-12)
    expected = torch.tensor([0.0, 0.0, 1.5, -0.5, -1.1, 1.8], dtype=torch.float64) / 6
    assert torch.allclose(g, expected, rtol=1e-12, atol=1e-15), g
    clipped_value = torch.minimum(ratio * adv, ratio.clamp(0.7, 1.3) * adv).mean()
    assert loss.item() == pytest.approx(-clipped_value.item(), rel=1e-12)


def test_kl_penalty_gradient_has_the_right_sign_and_scale_against_a_finite_difference():
    """The penalty is --inner-kl-coef x the mean over tasks of KL(sampler of the pre-update episodes || pre-update
    policy) on those episodes: 0 at the sampler, positive away from it, its gradient points away from the sampler and
    matches a central finite difference; it enters the loss with weight +1."""
    model, args, data = tiny_setup(policy="ssm", inner_lr=0.3, script=maml_ssm_promp)
    args = promp_args(args, inner_kl_coef=0.7)
    theta0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    olds = maml_ssm_promp.promp_objective(model, theta0, data, args).olds
    gen = torch.Generator().manual_seed(1)
    delta = {k: 0.05 * torch.randn(v.shape, dtype=v.dtype, generator=gen) for k, v in theta0.items()}
    theta1 = {k: (theta0[k] + delta[k]).requires_grad_() for k in theta0}
    objective = maml_ssm_promp.promp_objective(model, theta1, data, args, olds)
    # the KL of the pre-update policy against its sampler, computed here with torch.distributions
    kls = []
    for old, td in zip(olds, data):
        b = td["train"][0]
        out = maml_ssm_promp.policy_out(model, theta1, b)
        new = torch.distributions.Normal(out.pi, torch.exp(out.log_std).expand_as(out.pi))
        ref = torch.distributions.Normal(old["train"][0].pi, torch.exp(old["train"][0].log_std).expand_as(out.pi))
        kls.append(maml_ssm_promp.masked_mean(torch.distributions.kl_divergence(ref, new).sum(-1), b["masks"]))
    assert objective.inner_kl.item() == pytest.approx(torch.stack(kls).mean().item(), rel=1e-10)
    assert objective.kl_penalty.item() == pytest.approx(0.7 * objective.inner_kl.item(), rel=1e-12)
    assert objective.kl_penalty.item() > 0
    names = list(theta1)
    g_pen = torch.autograd.grad(objective.kl_penalty, [theta1[k] for k in names], retain_graph=True, allow_unused=True)
    g_pen = {k: torch.zeros_like(theta1[k]) if g is None else g for k, g in zip(names, g_pen)}
    g_loss = torch.autograd.grad(objective.loss, [theta1[k] for k in names], retain_graph=True, allow_unused=True)
    g_sur = torch.autograd.grad(objective.surrogate, [theta1[k] for k in names], allow_unused=True)
    for k, gl, gs in zip(names, g_loss, g_sur):
        gl = torch.zeros_like(theta1[k]) if gl is None else gl
        gs = torch.zeros_like(theta1[k]) if gs is None else gs
        assert torch.allclose(gl, gs + g_pen[k], rtol=1e-9, atol=1e-12), k
    # sign: moving away from the sampler raises the penalty
    assert sum((g_pen[k] * delta[k]).sum() for k in names).item() > 0
    # scale: the directional derivative equals a central finite difference of the penalty
    v = {k: torch.randn(theta0[k].shape, dtype=theta0[k].dtype, generator=gen) for k in names}
    h = 1e-5

    def penalty_at(sign):
        p = {k: (theta1[k].detach() + sign * h * v[k]) for k in names}
        return maml_ssm_promp.promp_objective(model, p, data, args, olds, create_graph=False).kl_penalty.item()

    fd = (penalty_at(1) - penalty_at(-1)) / (2 * h)
    analytic = sum((g_pen[k] * v[k]).sum() for k in names).item()
    assert analytic == pytest.approx(fd, rel=1e-5), (analytic, fd)
    assert abs(analytic) > 1e-6


@pytest.mark.parametrize("estimator", ["lvc", "reinforce"])
def test_inner_update_is_one_sgd_step_down_the_inner_loss(estimator):
    """theta' = theta - lr grad L: with either estimator, one SGD step of a copied module on -E[log pi A] (the LVC
    loss has that gradient where pi is the sampler), in the direction that lowers the loss."""
    model, args, data = tiny_setup(policy="mlp", inner_lr=0.3, script=maml_ssm_promp)
    batch = data[0]["train"][0]
    theta = dict(model.named_parameters())
    new = maml_ssm_promp.inner_update(model, theta, batch, 0.3, False, estimator)
    clone = copy.deepcopy(model)
    opt = torch.optim.SGD(clone.parameters(), lr=0.3)
    out = clone(batch["inputs"], batch["starts"], clone.initial_state(batch["masks"].shape[1]))
    logp = torch.distributions.Normal(out.pi, torch.exp(clone.log_std)).log_prob(batch["actions"]).sum(-1)
    loss = -(logp * batch["advantages"] * batch["masks"]).sum() / batch["masks"].sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for k, p in clone.named_parameters():
        assert torch.allclose(new[k], p, atol=1e-12), k
    with torch.no_grad():
        lower = maml_ssm_promp.inner_loss(model, {k: v.detach() for k, v in new.items()}, batch)
        start = maml_ssm_promp.inner_loss(model, theta, batch)
    assert lower.item() < start.item()


def test_lvc_gradient_is_the_score_function_gradient_in_expectation_and_its_curvature_is_exact():
    """One step, categorical policy, every action weighted by its probability (the masks): the expectation over
    a ~ pi is exact. The LVC objective E[pi / stop_grad(pi) R] has the score-function gradient E[grad log pi R] =
    grad J, J = sum_a pi(a) R(a); its Hessian is J's (the LVC estimator is unbiased in one step), which REINFORCE's
    E[log pi R] misses (it drops E[grad log pi grad log pi^T R])."""
    torch.manual_seed(0)
    model = maml_ssm_promp.Agent("mlp", 4, 3, True, 5, 2, False).double()
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    names = list(params)
    obs = torch.tensor([0.3, -0.2, 0.5, 0.1], dtype=torch.float64)
    reward = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    batch = {
        "inputs": obs.expand(1, 3, 4).clone(),
        "starts": torch.ones(1, 3, dtype=torch.bool),
        "actions": torch.arange(3, dtype=torch.float64).reshape(1, 3, 1),
        "advantages": reward.reshape(1, 3),
    }

    def probs(p):
        return torch.softmax(maml_ssm_promp.policy_out(model, p, {**batch, "masks": torch.ones(1, 3)}).pi[0, 0], -1)

    pi = probs(params)
    batch["masks"] = pi.detach().reshape(1, 3)  # masked_mean = sum_a pi(a) x_a: the exact expectation
    J = (probs(params) * reward).sum()
    score = sum(pi[a].detach() * torch.log(pi[a]) * reward[a] for a in range(3))  # E[log pi R], pi(a) held fixed
    lvc = -maml_ssm_promp.inner_loss(model, params, batch, "lvc")
    reinforce = -maml_ssm_promp.inner_loss(model, params, batch, "reinforce")

    def flat(grads):
        return torch.cat([(torch.zeros_like(params[k]) if g is None else g).reshape(-1) for k, g in zip(names, grads)])

    leaves = [params[k] for k in names]
    g_J = flat(torch.autograd.grad(J, leaves, create_graph=True, allow_unused=True))
    g_score = flat(torch.autograd.grad(score, leaves, create_graph=True, allow_unused=True))
    g_lvc = flat(torch.autograd.grad(lvc, leaves, create_graph=True, allow_unused=True))
    g_reinforce = flat(torch.autograd.grad(reinforce, leaves, create_graph=True, allow_unused=True))
    assert g_J.abs().max() > 1e-3
    assert torch.allclose(g_lvc, g_score, rtol=1e-10, atol=1e-14)
    assert torch.allclose(g_lvc, g_J, rtol=1e-10, atol=1e-14)
    assert torch.allclose(g_reinforce, g_J, rtol=1e-10, atol=1e-14)
    v = torch.randn(g_J.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    h_J = flat(torch.autograd.grad(g_J @ v, leaves, retain_graph=True, allow_unused=True))
    h_lvc = flat(torch.autograd.grad(g_lvc @ v, leaves, retain_graph=True, allow_unused=True))
    h_reinforce = flat(torch.autograd.grad(g_reinforce @ v, leaves, allow_unused=True))
    assert torch.allclose(h_lvc, h_J, rtol=1e-8, atol=1e-12)
    assert not torch.allclose(h_reinforce, h_J, rtol=1e-2, atol=1e-6)


def test_lvc_takes_the_samplers_log_probabilities_when_given():
    """With batch["old_logp"] (ProMP's later steps), the LVC inner loss is -E[pi / pi_old A] against those, so its
    gradient is the importance-weighted score-function gradient, not the one at the current policy."""
    model, args, data = tiny_setup(policy="mlp", inner_lr=0.3, script=maml_ssm_promp)
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    b = data[0]["train"][0]
    out = maml_ssm_promp.policy_out(model, params, b)
    logp = maml_ssm_promp.log_prob(maml_ssm_promp.make_dist(out, False), b["actions"], False)
    shifted = logp.detach() + 0.2
    expected = -maml_ssm_promp.masked_mean(torch.exp(logp - shifted) * b["advantages"], b["masks"])
    assert maml_ssm_promp.inner_loss(model, params, {**b, "old_logp": shifted}, "lvc").item() == pytest.approx(expected.item())
    same = maml_ssm_promp.inner_loss(model, params, {**b, "old_logp": logp.detach()}, "lvc")
    assert same.item() == pytest.approx(maml_ssm_promp.inner_loss(model, params, b, "lvc").item(), rel=1e-12)


def test_paper_preset_is_promps_reference_configuration_and_every_value_is_a_flag():
    a = parsed_train_args(["train", "--config", "paper"], maml_ssm_promp)
    assert (a.inner_estimator, a.promp_steps, a.clip_coef, a.outer_lr) == ("lvc", 5, 0.3, 1e-3)
    assert (a.inner_lr, a.inner_kl_coef, a.tasks_per_batch, a.fast_batch_size, a.max_episode_steps) == (0.1, 5e-4, 40, 20, 100)
    assert a.goal_box and a.fill_steps and a.eval_episodes == 40  # maml_ssm.py's paper preset's task rules and evaluation
    b = parsed_train_args(
        ["train", "--config", "paper", "--promp-steps", "2", "--clip-coef", "0.1", "--inner-kl-coef", "0"], maml_ssm_promp
    )
    assert (b.promp_steps, b.clip_coef, b.inner_kl_coef) == (2, 0.1, 0.0)
    for kwargs, needle in (
        (dict(inner_estimator="dice"), "unknown --inner-estimator"),
        (dict(promp_steps=0), "--promp-steps must be >= 1"),
        (dict(clip_coef=1.0), "--clip-coef must be in (0, 1)"),
        (dict(inner_kl_coef=-1.0), "--inner-kl-coef must be >= 0"),
    ):
        assert needle in validation_error(maml_ssm_promp.validate, maml_ssm_promp.Args(**kwargs)), kwargs


@pytest.mark.parametrize("policy,task", [("mlp", "point-nav-2d"), ("ssm", "cartpole-physics"), ("gru", "point-nav-2d")])
def test_promp_trains_and_evaluates_every_policy(policy, task, tmp_path):
    flags = ["--config", "paper", "--tasks-per-batch", "2", "--fast-batch-size", "3", "--max-episode-steps", "12"]
    if task != "point-nav-2d":
        flags.append("--no-goal-box")
    if policy == "gru":  # the inner loss is logged with --diagnostics only
        flags.append("--diagnostics")
    runs = tmp_path / "runs"
    run_promp(["train", *flags, *TINY_PROMP, "--task", task, "--policy", policy, "--save-model", "--runs-dir", str(runs)])
    scalars = logged_scalars(only_run_dir(runs))
    for tag in ("losses/inner_kl", "losses/clipfrac", "losses/approx_kl", "charts/learning_rate"):
        assert len(scalars[tag]) == 2 and all(np.isfinite(v) for _, v in scalars[tag]), tag
    assert ("losses/inner_loss" in scalars) == (policy == "gru")
    assert scalars["losses/approx_kl"][0][1] > 0
    assert sorted(load_json(os.path.join(only_run_dir(runs), "eval.json"))["returns_after_steps"]) == ["0", "1", "2"]


def fake_promp_study_run(root, policy, seed, returns):
    """A finished --promp-study run as benchmark/maml_ssm_report.py finds it: checkpoint dict and eval.json."""
    d = root / "promp_study" / "runs" / f"c0__{policy}__s{seed}" / f"run{seed}"
    d.mkdir(parents=True)
    args = dict(
        dataclasses.asdict(parsed_train_args(["train", "--config", "paper"], maml_ssm_promp)), policy=policy, seed=seed
    )
    ckpt = {"args": args, "script": "maml_ssm_promp", "outer_steps_done": 40 + seed}
    ckpt["task_version"] = maml_ssm_promp.TASK_VERSIONS["point-nav-2d"]
    torch.save(ckpt, d / "maml_ssm_promp.cleanrl_model")
    steps = {str(k): v for k, v in enumerate(returns)}
    (d / "eval.json").write_text(json.dumps({"task": "point-nav-2d", "num_tasks": 40, "returns_after_steps": steps}))


@pytest.mark.parametrize(
    "mlp_step1,ssm_offset,verdicts",
    [
        ([-6.8, -6.9, -6.7], 0.5, ("pass", "pass")),  # level with TRPO's MLP; the SSM above it after 1-3 steps
        ([-9.0, -9.1, -8.9], 0.5, ("fail", "pass")),  # ProMP's MLP 2.2 below TRPO's with a tight CI
        ([-6.8, -6.9, -6.7], -0.5, ("pass", "fail")),  # the SSM below the MLP
    ],
)
def test_promp_study_report_scores_the_preregistered_criteria(mlp_step1, ssm_offset, verdicts, tmp_path):
    """Criterion 1: the 95% Welch interval of ProMP MLP - TRPO MLP (the documented seeds) after one step reaches 0.
    Criterion 2: the SSM's mean after each of 1, 2, 3 steps is at least the MLP's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("maml_ssm_report", os.path.join(REPO, "benchmark", "maml_ssm_report.py"))
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    for seed, step1 in enumerate(mlp_step1, 1):
        mlp = [-40.0, step1, -4.0 - 0.1 * seed, -4.5]
        fake_promp_study_run(tmp_path / "out", "mlp", seed, mlp)
        fake_promp_study_run(tmp_path / "out", "ssm", seed, [mlp[0]] + [r + ssm_offset for r in mlp[1:]])
    assert report.main(["--promp-study", "--out", str(tmp_path / "out"), "--report", str(tmp_path / "rep")]) == 0
    summary = json.loads((tmp_path / "rep" / "promp_study.json").read_text())
    diff, half = report.welch_ci95(mlp_step1, report.TRPO_MLP_STEP1)
    assert diff == pytest.approx(np.mean(mlp_step1) - np.mean(report.TRPO_MLP_STEP1))
    assert summary["criterion_1"]["pass"] == (verdicts[0] == "pass") == (diff + half >= 0)
    assert summary["criterion_2"]["pass"] == (verdicts[1] == "pass")
    assert sorted(f.name for f in (tmp_path / "rep").glob("eval_*.json")) == [
        f"eval_{p}_s{s}.json" for p in ("mlp", "ssm") for s in (1, 2, 3)
    ]
    table = (tmp_path / "rep" / "promp_study_table.md").read_text()
    assert f"**{verdicts[0]}**" in table.split("Criterion 1")[1] and f"**{verdicts[1]}**" in table.split("Criterion 2")[1]
