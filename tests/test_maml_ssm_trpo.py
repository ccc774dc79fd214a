"""Tests of maml_ssm.py's MAML core: sampling, the linear baseline and GAE, the inner step, the meta-objective,
its second-order gradient, TRPO (conjugate gradient, Fisher-vector products, KL radius, line search), and the recorded
tiny run."""

import copy
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import PINNED_ARITHMETIC, REPO, SCRIPT_ENV, load_json, logged_scalars, machine_kind, only_run_dir
from maml_fixtures import TINY, parsed_train_args, run_maml, tiny_setup, validation_error

import cleanrl_astral.maml_ssm as maml_ssm


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
    return torch.distributions.Normal(out.pi, torch.exp(out.log_std).expand_as(out.pi))


def flat_params(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def unflatten(model, flat):
    """{name: view of flat} shaped like the model's parameters (for torch.autograd.functional)."""
    out, i = {}, 0
    for k, p in model.named_parameters():
        out[k] = flat[i : i + p.numel()].view_as(p)
        i += p.numel()
    return out


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


# ------------------------------------------------------------------------------------------------ SAMPLING


@pytest.mark.parametrize("task", ["point-nav-2d", "cartpole-physics"])
def test_rollout_feeds_the_previous_action_and_reward_in_context(task):
    """The policy input at step t is [obs_t, a_{t-1} (one-hot if discrete), r_{t-1}], with zeros at t = 0 (docs:
    "Input: observation, previous action ... and previous reward"). Catches: prev_a never updated (stays 0), prev_r
    never updated, and the reward placed before the action (the dynamics objective zeroes the last channel)."""
    torch.manual_seed(0)
    args = maml_ssm.Args(task=task, policy="ssm", hidden_size=6, state_size=3, max_episode_steps=15)
    env_cls = maml_ssm.ENV_CLASSES[task]
    model = maml_ssm.build_agent(args, env_cls)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    rng, _ = maml_ssm.task_streams(0)
    env = maml_ssm.make_env(args, maml_ssm.sample_tasks(task, rng, 2, "train"), 3, torch.Generator().manual_seed(0))
    b = maml_ssm.rollout(model, maml_ssm.per_task(theta, 2), env, args.max_episode_steps)
    o, A = env_cls.obs_dim, model.act_dim
    inp = b["inputs"]
    assert inp.shape[-1] == o + A + 1
    prev_a = F.one_hot(b["actions"][..., 0].long(), A).float() if model.discrete else b["actions"]
    assert torch.equal(inp[..., :o], b["obs"])
    assert torch.all(inp[0, :, o:] == 0)
    valid = b["masks"][1:] > 0  # step t valid => step t-1 valid, so r_{t-1} is its (unmasked) reward
    assert valid.sum() > 5
    assert torch.allclose(inp[1:, :, o : o + A][valid], prev_a[:-1][valid])
    assert torch.allclose(inp[1:, :, -1][valid], b["rewards"][:-1][valid])
    # non-vacuous: the fed action and reward are not zero
    assert inp[1:, :, o : o + A][valid].abs().sum() > 0 and inp[1:, :, -1][valid].abs().sum() > 0


def test_rollout_rewards_and_masks_are_zero_after_the_episode_ends():
    """A point-nav policy stepping straight along +x (std e^-20): the episode whose goal is one step away ends at
    step 1, while the other (goal behind) runs on. Every later step of the ended episode must have reward 0 and
    mask 0, although the environment keeps moving it (it would be rewarded -0.1, -0.2, ...)."""
    torch.manual_seed(0)
    args = maml_ssm.Args(policy="mlp", hidden_size=6, max_episode_steps=6)
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    theta["pi.weight"] = torch.zeros_like(theta["pi.weight"])
    theta["pi.bias"] = torch.tensor([1.0, 0.0])
    theta["log_std"] = torch.full((2,), -20.0)
    env = maml_ssm.PointNav2D(torch.tensor([[0.1, 0.0], [-0.5, 0.0]]), torch.Generator().manual_seed(0))
    batch = maml_ssm.rollout(model, maml_ssm.per_task(theta, 1), env, args.max_episode_steps)
    assert batch["masks"].shape == (6, 2)
    assert batch["masks"][:, 0].tolist() == [1, 0, 0, 0, 0, 0] and batch["masks"][:, 1].tolist() == [1] * 6
    assert batch["rewards"][0, 0].item() == pytest.approx(0.0, abs=1e-6)  # reached: distance 0
    assert torch.all(batch["rewards"][1:, 0] == 0)
    assert batch["rewards"][:, 1].tolist() == pytest.approx([-(0.6 + 0.1 * t) for t in range(6)], abs=1e-5)
    assert env.pos[0, 0].item() == pytest.approx(0.6, abs=1e-5)  # the env did move the ended episode on


@pytest.mark.parametrize("fill", [False, True])
def test_fill_steps_samples_until_the_step_count_of_the_paper_sampler(fill, monkeypatch):
    made = []

    def make_env(args, task_params, per, gen):
        made.append(per)
        return FixedLengthEpisodes(torch.tensor(np.repeat(task_params, per, axis=0)))

    monkeypatch.setattr(maml_ssm, "make_env", make_env)
    torch.manual_seed(0)
    args = maml_ssm.Args(policy="mlp", hidden_size=6, max_episode_steps=10, fast_batch_size=2, fill_steps=fill)
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    tasks = np.array([[3.0], [10.0], [7.0], [4.0]])  # budget 2 x 10 = 20 steps per task
    data, returns = maml_ssm.sample_task_batches(model, theta, tasks, args, torch.Generator(), 1, [0.1])
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
    assert parsed_train_args(["train", "--config", "paper"]).fill_steps is True and maml_ssm.Args().fill_steps is False


def test_fill_steps_waves_act_with_each_tasks_own_theta_prime(monkeypatch):
    # every kept episode of a post-adaptation batch, first wave or extra, was sampled by its own task's theta'
    monkeypatch.setattr(
        maml_ssm, "make_env", lambda args, tp, per, gen: FixedLengthEpisodes(torch.tensor(np.repeat(tp, per, axis=0)))
    )
    torch.manual_seed(0)
    args = maml_ssm.Args(policy="mlp", hidden_size=6, max_episode_steps=10, fast_batch_size=2, fill_steps=True)
    model = maml_ssm.build_agent(args, maml_ssm.PointNav2D)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    data, _ = maml_ssm.sample_task_batches(model, theta, np.array([[3.0], [4.0], [10.0]]), args, torch.Generator(), 1, [0.5])
    updated = [
        maml_ssm.inner_update(model, {k: v.clone().requires_grad_(True) for k, v in theta.items()}, td["train"][0], 0.5, False)
        for td in data
    ]

    def logp(params, val):
        return (
            maml_ssm.log_prob(maml_ssm.make_dist(maml_ssm.policy_out(model, params, val), False), val["actions"], False)
            * val["masks"]
        )

    for td, params in zip(data, updated):
        val = td["val"]
        assert val["masks"].shape[1] > 2 or val["masks"][:, 0].sum() == 10  # the short tasks got extra episodes
        assert torch.allclose(logp(params, val), val["logp"] * val["masks"], atol=1e-5)
    # and the check can tell tasks apart: task 0's episodes are not what task 1's theta' would give them
    assert not torch.allclose(logp(updated[1], data[0]["val"]), data[0]["val"]["logp"] * data[0]["val"]["masks"], atol=1e-5)


# ------------------------------------------------------------------------------------------------ ADVANTAGES


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
    pred = maml_ssm.linear_baseline({"obs": obs, "masks": masks, "rewards": rewards}, gamma)
    valid = masks > 0
    assert torch.allclose(pred[valid], G[valid], atol=1e-4), (pred - G)[valid].abs().max()
    assert torch.all(pred[~valid] == 0)
    undiscounted = torch.flip(torch.cumsum(torch.flip(rewards.double(), [0]), 0), [0])
    assert (G - undiscounted)[valid].abs().max() > 0.3 and (G - rewards.double())[valid].abs().max() > 0.3


def test_linear_baseline_ignores_what_padded_steps_hold():
    """Padded steps (after an episode ended) keep the observations the environment went on producing; the ridge fit
    must use valid steps only, so garbage there cannot change the predictions on valid steps. Catches: the feature
    matrix not masked (padded rows enter the regression with target 0)."""
    gen = torch.Generator().manual_seed(0)
    T, lengths = 12, [12, 5, 8, 3]
    masks = torch.zeros(T, len(lengths))
    for j, length in enumerate(lengths):
        masks[:length, j] = 1
    obs = torch.randn(T, len(lengths), 2, generator=gen)
    rewards = -torch.rand(T, len(lengths), generator=gen) * masks
    other = obs.clone()
    other[masks == 0] = torch.randn(int((masks == 0).sum()), 2, generator=gen) * 3 + 2
    p1 = maml_ssm.linear_baseline({"obs": obs, "masks": masks, "rewards": rewards}, 0.95)
    p2 = maml_ssm.linear_baseline({"obs": other, "masks": masks, "rewards": rewards}, 0.95)
    valid = masks > 0
    assert torch.allclose(p1[valid], p2[valid], atol=1e-8), (p1 - p2)[valid].abs().max()
    assert torch.all(p1[~valid] == 0) and p1[valid].abs().max() > 0.1


def test_advantages_are_gae_on_the_linear_baseline_normalised_over_valid_steps(forward_gae, monkeypatch):
    """Episodes of different lengths padded with masks: GAE with gamma and lambda below 1 over each episode's
    valid steps, no bootstrap after the last (termination or horizon), then normalised over the task's valid steps
    and zero on the padding."""
    gamma, lam = 0.9, 0.5
    masks = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor(
        [[-1.0, -0.5, -2.0], [-0.8, -0.4, -1.0], [-0.6, -0.3, 9.0], [-0.4, 9.0, 9.0], [-0.2, 9.0, 9.0]]
    )  # 9.0 on padding must not leak in
    values = torch.tensor(
        [[-3.0, -1.0, -2.5], [-2.0, -0.7, -1.2], [-1.5, -0.2, 5.0], [-0.9, 5.0, 5.0], [-0.3, 5.0, 5.0]], dtype=torch.float64
    )
    monkeypatch.setattr(maml_ssm, "linear_baseline", lambda batch, g: values * batch["masks"].double())
    batch = {"obs": torch.zeros(5, 3, 2), "masks": masks, "rewards": rewards}
    adv = maml_ssm.compute_advantages(batch, gamma, lam)
    raw = torch.zeros(5, 3, dtype=torch.float64)
    for n, length in enumerate([5, 3, 2]):
        raw[:length, n] = torch.tensor(
            forward_gae(
                rewards[:length, n].tolist(), values[:length, n].tolist() + [0.0], [1.0] * (length - 1) + [0.0], gamma, lam
            ),
            dtype=torch.float64,
        )
    valid = raw[masks > 0]
    assert adv[masks > 0].tolist() == pytest.approx(((valid - valid.mean()) / (valid.std() + 1e-8)).tolist(), abs=1e-5)
    assert torch.all(adv[masks == 0] == 0)
    # a batch of one valid step (adapt --online --online-every 1 --episodes 1) has a NaN std, which would make
    # every parameter NaN after the step (no guard compares NaN); it is centred to 0 instead
    monkeypatch.setattr(maml_ssm, "linear_baseline", lambda batch, g: values[:, :1] * batch["masks"].double())
    one = {"obs": torch.zeros(5, 1, 2), "masks": torch.tensor([[1.0], [0.0], [0.0], [0.0], [0.0]]), "rewards": rewards[:, :1]}
    assert maml_ssm.compute_advantages(one, gamma, lam).tolist() == [[0.0]] * 5


# --- inner update and meta-objective ---------------------------------------------------------------------------


def test_functional_inner_update_equals_manual_sgd_on_copied_module():
    model, args, data = tiny_setup()
    batch = data[0]["train"][0]
    new = maml_ssm.inner_update(model, dict(model.named_parameters()), batch, 0.3, create_graph=False)
    clone = copy.deepcopy(model)
    opt = torch.optim.SGD(clone.parameters(), lr=0.3)
    out = clone(batch["inputs"], batch["starts"], clone.initial_state(batch["masks"].shape[1]))
    dist = torch.distributions.Normal(out.pi, torch.exp(clone.log_std))
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


def test_inner_loss_depends_on_rewards():
    model, args, data = tiny_setup()
    batch = data[0]["train"][0]
    params = dict(model.named_parameters())
    g1 = torch.autograd.grad(maml_ssm.inner_loss(model, params, batch), params["pi.weight"])[0]
    altered = dict(batch)
    altered["rewards"] = batch["rewards"] * 0 + torch.randn_like(batch["rewards"]) * batch["masks"]
    altered["advantages"] = maml_ssm.compute_advantages(altered, args.gamma, args.gae_lambda).double()
    g2 = torch.autograd.grad(maml_ssm.inner_loss(model, params, altered), params["pi.weight"])[0]
    assert not torch.allclose(g1, g2, atol=1e-6)


def test_inner_loss_averages_over_valid_steps_only():
    """Episodes of different lengths are padded (mask 0): the inner REINFORCE loss is the mean over valid steps of
    -log pi(a|s) A, computed here from a Normal of the policy output. Dividing by all T x B entries, padding
    included, shrinks the inner step of tasks whose episodes end early."""
    model, args, data = tiny_setup()
    batch = pad(dict(data[0]["train"][0]), [10, 4, 7])
    params = dict(model.named_parameters())
    out = maml_ssm.policy_out(model, params, batch)
    logp = gaussian(out).log_prob(batch["actions"]).sum(-1)
    valid = batch["masks"] > 0
    expected = -(logp * batch["advantages"])[valid].mean()
    assert valid.sum() < valid.numel()
    assert maml_ssm.inner_loss(model, params, batch).item() == pytest.approx(expected.item(), rel=1e-10, abs=1e-12)


def padded_meta_setup():
    """Two tasks with padded train and validation episodes; theta1 is theta0 moved far enough that the importance
    ratios of the validation actions are far from 1."""
    model, args, data = tiny_setup(per=3)
    for td in data:
        td["train"] = [pad(dict(b), [10, 3, 6]) for b in td["train"]]
        td["val"] = pad(dict(td["val"]), [5, 10, 2])
    theta0 = dict(model.named_parameters())
    _, _, old = maml_ssm.meta_objective(model, theta0, data, args)
    gen = torch.Generator().manual_seed(3)
    theta1 = {
        k: (v.detach() + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype)).requires_grad_(True)
        for k, v in theta0.items()
    }
    return model, args, data, old, theta1


def test_surrogate_is_the_exact_importance_weighted_mean_over_valid_steps():
    """The meta-objective at parameters away from the sampling ones is the mean over tasks of
    -mean_valid(exp(logp' - logp_old) A) with logp' at the inner-updated parameters. Checked against an independent
    computation: a first-order ratio 1 + logp' - logp_old, or a normaliser counting padded steps, is off."""
    model, args, data, old, theta1 = padded_meta_setup()
    expected, log_ratios = [], []
    for td, o in zip(data, old):
        val = td["val"]
        p = theta1
        for b in td["train"]:
            p = maml_ssm.inner_update(model, p, b, args.inner_lr, create_graph=False)
        out = maml_ssm.policy_out(model, p, val)
        log_ratio = gaussian(out).log_prob(val["actions"]).sum(-1) - gaussian(o).log_prob(val["actions"]).sum(-1)
        valid = val["masks"] > 0
        expected.append(-(torch.exp(log_ratio) * val["advantages"])[valid].mean())
        log_ratios.append(log_ratio[valid])
    loss, _, _ = maml_ssm.meta_objective(model, theta1, data, args, old, create_graph=False)
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
        p = theta1
        for b in td["train"]:
            p = maml_ssm.inner_update(model, p, b, args.inner_lr, create_graph=False)
        kl = torch.distributions.kl_divergence(gaussian(o), gaussian(maml_ssm.policy_out(model, p, val))).sum(-1)
        expected.append(kl[val["masks"] > 0].mean())
    _, kl, _ = maml_ssm.meta_objective(model, theta1, data, args, old, create_graph=False)
    assert kl.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-10)
    assert kl.item() > 1e-3


def test_meta_objective_kl_is_the_mean_not_the_sum_over_tasks():
    """With three tasks whose inner-updated policies move by different amounts, the meta-objective's KL is the mean over
    tasks of each task's own KL (computed here task by task, one task per call). A sum over tasks is three times
    it, which would shrink TRPO's trust region as the meta-batch grows."""
    model, args, data = tiny_setup(n_tasks=3, per=2)
    theta0 = dict(model.named_parameters())
    _, _, old = maml_ssm.meta_objective(model, theta0, data, args)
    gen = torch.Generator().manual_seed(5)
    theta1 = {
        k: (v.detach() + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype)).requires_grad_(True)
        for k, v in theta0.items()
    }
    per_task = [
        maml_ssm.meta_objective(model, theta1, [td], args, [o], create_graph=False)[1].item() for td, o in zip(data, old)
    ]
    _, kl, _ = maml_ssm.meta_objective(model, theta1, data, args, old, create_graph=False)
    assert min(per_task) > 1e-3 and max(per_task) - min(per_task) > 1e-4 * max(per_task)
    assert kl.item() == pytest.approx(float(np.mean(per_task)), rel=1e-10)
    assert abs(kl.item() - sum(per_task)) > 0.5 * kl.item()


def test_meta_objective_updates_with_the_samplers_step_sizes():
    """With two inner steps, the sampler drew the post-adaptation episodes with theta updated twice at --inner-lr;
    the meta-objective must repeat the same inner updates, so its old policy (ratio 1 at the start of the TRPO step) gives
    the recorded log-probabilities of the sampled actions. Another step size on either step would not."""
    model, args, data = tiny_setup(num_steps=2, dtype=torch.float32)
    params = dict(model.named_parameters())
    _, _, outs = maml_ssm.meta_objective(model, params, data, args)
    theta0 = {k: v.detach() for k, v in params.items()}
    for td, out in zip(data, outs):
        val = td["val"]
        assert len(td["train"]) == 2
        valid = val["masks"] > 0
        logp = gaussian(out).log_prob(val["actions"]).sum(-1)
        assert torch.allclose(logp[valid], val["logp"][valid], atol=2e-5), (logp - val["logp"])[valid].abs().max()
        # non-vacuous: theta itself gives other log-probabilities
        logp0 = gaussian(maml_ssm.policy_out(model, theta0, val)).log_prob(val["actions"]).sum(-1)
        assert (logp0 - val["logp"])[valid].abs().max() > 1e-3


def test_second_order_meta_gradient_matches_finite_differences():
    model, args, data = tiny_setup(T=8)
    params = dict(model.named_parameters())
    _, _, old = maml_ssm.meta_objective(model, params, data, args)

    def f(first_order):
        a = dataclasses.replace(args, first_order=first_order)
        return maml_ssm.meta_objective(model, dict(model.named_parameters()), data, a, old)[0]

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


# ------------------------------------------------------------------------------------------------ TRPO


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
        x = maml_ssm.conjugate_gradient(lambda v: A @ v, b, iters)
        assert torch.allclose(x, exact, atol=1e-8, rtol=0), (iters, (x - exact).abs().max().item())
    assert exact.norm() > 0.1  # the zero vector is not an answer


def test_fisher_vector_product_adds_exactly_the_damping(monkeypatch):
    """TRPO's Avp is (F + damping I) v with F the Hessian of the mean KL(old || new) at theta (through the inner
    adaptation). With damping 0.5, Avp(v) - F v must be 0.5 v; F v is computed here by torch.autograd.functional.hvp
    of the KL as a function of the flat parameter vector. Dropping the damping gives 0, doubling it gives v."""
    model, args, data = tiny_setup(T=6, per=2)
    args = dataclasses.replace(args, cg_damping=0.5, cg_iters=2, ls_max_steps=1)
    theta0 = flat_params(model)
    v = torch.randn(theta0.shape, generator=torch.Generator().manual_seed(1), dtype=theta0.dtype)
    _, _, old = maml_ssm.meta_objective(model, dict(model.named_parameters()), data, args)
    _, fv = torch.autograd.functional.hvp(
        lambda f: maml_ssm.meta_objective(model, unflatten(model, f), data, args, old)[1], theta0, v
    )
    assert fv.norm() > 1e-3 * v.norm()  # F is not negligible next to the damping

    class Captured(Exception):
        pass

    seen = {}

    def capture(Avp, b, iters, tol=1e-10):
        seen["avp"] = Avp(v).detach()
        raise Captured

    monkeypatch.setattr(maml_ssm, "conjugate_gradient", capture)
    with pytest.raises(Captured):
        maml_ssm.trpo_step(model, data, args)
    assert torch.allclose(seen["avp"] - fv, 0.5 * v, atol=1e-8, rtol=0), (seen["avp"] - fv - 0.5 * v).abs().max()
    assert torch.equal(flat_params(model), theta0)


def test_trpo_first_trial_step_has_the_kl_radius(monkeypatch):
    """The line search starts from the step along the conjugate-gradient direction whose quadratic KL estimate
    0.5 s^T F s is --max-kl (rllab's scaling), F the damped Fisher-vector product of the step; a step of twice the
    radius makes the first trials overshoot and wastes meta-objective passes."""
    model, args, data = tiny_setup()
    theta0 = flat_params(model)
    direction = torch.randn(theta0.shape, generator=torch.Generator().manual_seed(0), dtype=theta0.dtype)
    set_params = torch.nn.utils.vector_to_parameters
    seen = {}
    trials = []

    def fixed_direction(fvp, b, iters):
        seen["f_direction"] = fvp(direction)
        return direction

    def record(vec, params):
        trials.append(vec.detach().clone())
        set_params(vec, params)

    monkeypatch.setattr(maml_ssm, "conjugate_gradient", fixed_direction)
    monkeypatch.setattr(torch.nn.utils, "vector_to_parameters", record)
    for max_kl in (0.01, 0.003):
        trials.clear()
        maml_ssm.trpo_step(model, data, dataclasses.replace(args, max_kl=max_kl, ls_max_steps=1))
        set_params(theta0, model.parameters())
        step = trials[0] - theta0
        scale = step.norm() / direction.norm()
        assert torch.allclose(step / step.norm(), direction / direction.norm())
        assert (0.5 * scale**2 * direction @ seen["f_direction"]).item() == pytest.approx(max_kl, rel=1e-9)


def test_trpo_step_respects_trust_region_and_improves():
    model, args, data = tiny_setup(dtype=torch.float32)
    args = dataclasses.replace(args, max_kl=0.005, cg_iters=5)
    params = dict(model.named_parameters())
    before, _, old = maml_ssm.meta_objective(model, params, data, args)
    stats = maml_ssm.trpo_step(model, data, args)
    after, kl, _ = maml_ssm.meta_objective(model, dict(model.named_parameters()), data, args, old)
    assert stats["accepted"] == 1.0
    assert kl.item() <= args.max_kl + 1e-6 and kl.item() > 0
    assert after.item() < before.item()


def rigged_trpo(monkeypatch, trial):
    """trpo_step with every line-search trial's (loss, KL) given by trial(k, first_loss, args) for trial k = 0, 1, ...;
    returns (stats, flat theta before, flat theta after, the flat parameters each trial was evaluated at, args)."""
    model, args, data = tiny_setup(T=6, per=2, dtype=torch.float32)
    args = dataclasses.replace(args, cg_iters=3, ls_max_steps=4, max_kl=0.01, ls_backtrack_ratio=0.5)
    real = maml_ssm.meta_objective
    seen = {"first": None, "trials": []}

    def rigged(model_, params, tasks_data, args_, old_outs=None, create_graph=True):
        loss, kl, outs = real(model_, params, tasks_data, args_, old_outs, create_graph)
        if old_outs is None:
            seen["first"] = loss.detach()
            return loss, kl, outs
        seen["trials"].append(torch.cat([v.detach().reshape(-1) for v in params.values()]))
        new_loss, new_kl = trial(len(seen["trials"]) - 1, seen["first"], args_)
        return new_loss, torch.tensor(new_kl, dtype=kl.dtype), outs

    monkeypatch.setattr(maml_ssm, "meta_objective", rigged)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    stats = maml_ssm.trpo_step(model, data, args)
    after = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    return stats, before, after, seen["trials"], args


def test_line_search_backtracks_geometrically(monkeypatch):
    """Every trial is rejected (worse surrogate): trial k must sit at ls_backtrack_ratio^k times the first trial's
    step from theta, along the same direction. Catches: `frac = ratio` instead of `frac *= ratio` (the step shrinks
    once, then every later trial repeats it), and a search that does not shrink at all."""
    stats, before, after, trials, args = rigged_trpo(monkeypatch, lambda k, first, a: (first + 1.0, 0.0))
    assert len(trials) == args.ls_max_steps and stats["accepted"] == 0.0 and torch.equal(after, before)
    steps = [t - before for t in trials]
    assert steps[0].norm() > 1e-4
    for k, s in enumerate(steps):
        assert torch.allclose(s, args.ls_backtrack_ratio**k * steps[0], atol=1e-6, rtol=1e-4), k


def test_line_search_rejects_a_trial_that_does_not_lower_the_surrogate(monkeypatch):
    """rllab's TRPO accepts a trial only if it strictly lowers the surrogate: a trial with the very same loss (and
    KL 0) is rejected and the search moves on. Catches `<= 0` for `< 0` in the acceptance test."""

    def trial(k, first, a):
        return (first.clone(), 0.0) if k == 0 else (first - 1.0, 0.0)

    stats, before, after, trials, args = rigged_trpo(monkeypatch, trial)
    assert stats["accepted"] == 1.0 and stats["line_search_steps"] == 2
    assert torch.equal(after, trials[1]) and not torch.equal(trials[0], trials[1])


def line_search_with(monkeypatch, trial_loss_offset, trial_kl):
    """Runs trpo_step with every line-search trial's (loss, KL) replaced by (first loss + offset, trial_kl); returns
    (stats, parameters before, parameters after, number of trials evaluated)."""
    model, args, data = tiny_setup(T=6, per=2)
    args = dataclasses.replace(args, cg_iters=3, ls_max_steps=3, max_kl=0.01)
    real = maml_ssm.meta_objective
    calls = {"first": None, "trials": 0}

    def rigged(model_, params, tasks_data, args_, old_outs=None, create_graph=True):
        loss, kl, outs = real(model_, params, tasks_data, args_, old_outs, create_graph)
        if old_outs is None:
            calls["first"] = loss.detach()
            return loss, kl, outs
        calls["trials"] += 1
        return calls["first"] + trial_loss_offset, torch.tensor(trial_kl, dtype=kl.dtype), outs

    monkeypatch.setattr(maml_ssm, "meta_objective", rigged)
    before = [p.detach().clone() for p in model.parameters()]
    stats = maml_ssm.trpo_step(model, data, args)
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


# --- reference (autograd, one task at a time) -------------------------------------------------------------------
def reference_meta_kl_and_loss(model, params, data, inner_lr):
    """The meta-objective as plain autograd writes it: per task, theta' = theta - lr grad inner_loss (create_graph),
    the surrogate and KL(old || new) on the post-adaptation batch, old = theta's own outputs."""
    losses, kls = [], []
    for td in data:
        p = params
        for b in td["train"]:
            gs = torch.autograd.grad(maml_ssm.inner_loss(model, p, b), list(p.values()), create_graph=True, allow_unused=True)
            p = {k: p[k] - inner_lr * (g if g is not None else 0.0) for (k, g) in zip(p, gs)}
        out, val = maml_ssm.policy_out(model, p, td["val"]), td["val"]
        old = maml_ssm.AgentOutput(pi=out.pi.detach(), log_std=out.log_std.detach())
        new_d, old_d = gaussian(out), gaussian(old)
        ratio = torch.exp(new_d.log_prob(val["actions"]).sum(-1) - old_d.log_prob(val["actions"]).sum(-1))
        mask = val["masks"]
        losses.append(-(ratio * val["advantages"] * mask).sum() / mask.sum())
        kls.append((torch.distributions.kl_divergence(old_d, new_d).sum(-1) * mask).sum() / mask.sum())
    return torch.stack(losses).mean(), torch.stack(kls).mean()


@pytest.mark.parametrize("policy", ["ssm", "mlp"])
def test_meta_gradient_and_fisher_vector_product_equal_the_autograd_reference(policy, monkeypatch):
    """On a fixed batch (float64, two inner steps) trpo_step's meta-gradient g and every Fisher-vector product it
    hands to conjugate gradient equal those of the plain-autograd reference: grad of the surrogate, and the double
    backward of KL(old || new) through the inner steps."""
    model, args, data = tiny_setup(policy=policy, num_steps=2, inner_lr=0.3)
    args = dataclasses.replace(args, cg_iters=3, ls_max_steps=1)
    plist = list(model.parameters())
    loss, kl = reference_meta_kl_and_loss(model, dict(model.named_parameters()), data, args.inner_lr)

    def flat(out, **kw):
        grads = torch.autograd.grad(out, plist, allow_unused=True, **kw)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, plist)])

    ref_g, flat_kl = flat(loss, retain_graph=True), flat(kl, create_graph=True)
    seen = []

    def capture(fvp, b, iters):
        seen.append(-b)
        v = torch.randn(b.shape, dtype=b.dtype, generator=torch.Generator().manual_seed(0))
        seen.append((v, fvp(v)))
        return b

    monkeypatch.setattr(maml_ssm, "conjugate_gradient", capture)
    maml_ssm.trpo_step(model, data, args)
    g, (v, fv) = seen
    ref_fv = flat(flat_kl @ v) + args.cg_damping * v
    assert ref_g.abs().max() > 1e-3 and (ref_fv - args.cg_damping * v).abs().max() > 1e-3
    assert torch.allclose(g, ref_g, rtol=1e-9, atol=1e-12), (g - ref_g).abs().max()
    assert torch.allclose(fv, ref_fv, rtol=1e-9, atol=1e-12), (fv - ref_fv).abs().max()


@pytest.mark.parametrize("policy", ["mlp", "ssm", "gru"])
@pytest.mark.parametrize("task", ["point-nav-2d", "cartpole-physics"])
def test_fisher_product_through_the_inner_steps_equals_the_double_backward_of_the_kl_gradient(policy, task):
    """fisher_product's F v = mean over tasks of A^T G A v (A = d theta'/d theta, G the KL's Hessian in theta') equals the
    Hessian-vector product of the mean KL(old || new) at theta, taken as the double backward of the KL's gradient through
    two inner steps (float64), for every policy, Gaussian and categorical; with --first-order (A = I) it equals that
    of the first-order meta-objective. Catches a missing A or A^T (the products differ by far more than the tolerance)."""
    model, args, data = tiny_setup(policy=policy, task=task, num_steps=2, inner_lr=0.3, T=8)
    plist = list(model.parameters())
    v = torch.randn(sum(p.numel() for p in plist), dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def double_backward(a):
        flat_kl = maml_ssm.flat_grad(
            maml_ssm.meta_objective(model, dict(model.named_parameters()), data, a)[1], plist, create_graph=True
        )
        return maml_ssm.flat_grad(flat_kl @ v, plist) + a.cg_damping * v

    products = {}
    for first_order in (False, True):
        a = dataclasses.replace(args, first_order=first_order)
        ref, fv = double_backward(a), maml_ssm.fisher_product(maml_ssm.fisher_graphs(model, data, a), a.cg_damping, v)
        assert (ref - a.cg_damping * v).abs().max() > 1e-3
        assert torch.allclose(fv, ref, rtol=1e-8, atol=1e-10), (first_order, (fv - ref).abs().max())
        products[first_order] = fv
    assert not torch.allclose(products[False], products[True], rtol=1e-2)  # the inner steps' Jacobian matters here


def test_rollout_acts_with_each_tasks_stacked_parameters():
    """rollout evaluates every task's rows with that task's parameters (one vmapped call a step): the log-probability
    recorded while acting equals the task's own policy on the whole recorded sequence, and differs from another
    task's parameters."""
    model, args, _ = tiny_setup(dtype=torch.float32)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    other = {k: v + 0.3 * torch.randn_like(v) for k, v in theta.items()}
    tasks = maml_ssm.sample_tasks(args.task, maml_ssm.task_streams(3)[0], 2, "train")
    batch = maml_ssm.rollout(
        model, maml_ssm.stack_params([theta, other]), maml_ssm.make_env(args, tasks, 3, torch.Generator()), 10
    )
    for i, (params, wrong) in enumerate(((theta, other), (other, theta))):
        part = maml_ssm.split_batch(batch, 2)[i]
        for p, close in ((params, True), (wrong, False)):
            logp = maml_ssm.log_prob(maml_ssm.make_dist(maml_ssm.policy_out(model, p, part), False), part["actions"], False)
            assert torch.allclose(logp, part["logp"], atol=1e-5 if close else 1e-3) == close


def test_cg_subsample_takes_the_fisher_of_a_subset_of_the_tasks(monkeypatch):
    """--cg-subsample 0.5 on two tasks: the Fisher-vector products are those of one task's KL alone (the gradient stays
    the full meta-batch's), which the default (1.0) never gives."""
    model, args, data = tiny_setup(policy="mlp", num_steps=1, inner_lr=0.3)
    plist = list(model.parameters())
    v = torch.randn(sum(p.numel() for p in plist), dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def reference_fv(tasks):
        kl = reference_meta_kl_and_loss(model, dict(model.named_parameters()), tasks, args.inner_lr)[1]
        grads = torch.autograd.grad(kl, plist, create_graph=True, allow_unused=True)
        flat_kl = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, plist)])
        return (
            torch.cat(
                [
                    (h if h is not None else torch.zeros_like(p)).reshape(-1)
                    for h, p in zip(torch.autograd.grad(flat_kl @ v, plist, allow_unused=True), plist)
                ]
            )
            + args.cg_damping * v
        )

    def products(fraction):
        seen = []
        monkeypatch.setattr(maml_ssm, "conjugate_gradient", lambda fvp, b, iters: seen.append(fvp(v)) or b)
        state = {k: p.detach().clone() for k, p in model.named_parameters()}
        maml_ssm.trpo_step(model, data, dataclasses.replace(args, cg_subsample=fraction, ls_max_steps=1))
        model.load_state_dict(state, strict=False)
        return seen[0]

    full, half = products(1.0), products(0.5)
    assert torch.allclose(full, reference_fv(data), rtol=1e-9, atol=1e-12)
    assert any(torch.allclose(half, reference_fv([td]), rtol=1e-9, atol=1e-12) for td in data)
    assert not torch.allclose(half, full, rtol=1e-3)
    assert "--cg-subsample must be in (0, 1]" in validation_error(maml_ssm.validate, maml_ssm.Args(cg_subsample=0.0))


def test_the_pinned_arithmetic_reaches_torch_and_onednn():
    """A run under PINNED_ARITHMETIC takes torch's default kernels and oneDNN's SSE4.1 code (the GELU of the SSM's
    mixer runs there), whatever the CPU offers; were torch or oneDNN to stop reading these variables, the recorded
    run below would depend on more of the machine than its kind, and this test says why."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability()); torch.nn.functional.gelu(torch.ones(2, 1, 3, 8))"
    env = {**SCRIPT_ENV, **PINNED_ARITHMETIC, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "DEFAULT"
    gelu = [line for line in lines if ",eltwise," in line and "gelu" in line]
    assert gelu and all(",jit:sse41," in line for line in gelu), out[-2000:]


def test_machine_kind_tells_the_kinds_the_recordings_name():
    """The kind is vendor, widest vector extension and AMX: an AVX-512 AMD EPYC is neither recording's kind, so its run is
    compared with the tolerance; each recording's CPU gives the kind the recording names, and RECORDED_KINDS says which
    kinds hold which policy's run (the SSM's: the Intel kind only)."""
    intel = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw amx_bf16 amx_tile amx_int8\n"
    amd_avx2 = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n"
    amd_avx512 = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n"
    assert machine_kind(intel) == "GenuineIntel avx512 amx"
    assert machine_kind(amd_avx2) == "AuthenticAMD avx2"
    assert machine_kind(amd_avx512) == "AuthenticAMD avx512"
    with open(os.path.join(REPO, "tests", "data", "maml_ssm_trpo_tiny.json")) as f:
        recordings = json.load(f)["recordings"]
    kinds = {policy: [r["machine_kind"] for r in recordings if policy in r["untimed_scalars"]] for policy in ("mlp", "ssm")}
    assert kinds == RECORDED_KINDS
    assert RECORDED_KINDS == {"mlp": [machine_kind(intel), machine_kind(amd_avx2)], "ssm": [machine_kind(intel)]}
    for r in recordings:
        assert list(r["eval"]) == list(r["untimed_scalars"]), r["machine_kind"]


# Across machine kinds a recorded run drifts in its last digits. Measured on an AMD EPYC (AVX2) against the Intel
# recording, the tiny run under four kernel paths (pinned, pinned with ATen's AVX2 kernels, unpinned, unpinned with
# ATen's default kernels) differed by at most 4.8e-6 relative, and by at most 1.9e-8 on the outer loss, which is zero in
# exact arithmetic at a TRPO step's start. The tolerance is 20 times the relative spread and 50 times the absolute one;
# a change to the method (the inner step's sign, a surrogate term) moves these values by far more.
RECORDED_RTOL = 1e-4
RECORDED_ATOL = 1e-6
# the machine kinds each policy's run is recorded on: the SSM's only on the kind that recorded its arithmetic as it is
# (the LRU's scan as diagonal_scan), the MLP's on both
RECORDED_KINDS = {"mlp": ["GenuineIntel avx512 amx", "AuthenticAMD avx2"], "ssm": ["GenuineIntel avx512 amx"]}


@pytest.mark.parametrize("policy", ["mlp", "ssm"])
def test_trpo_reproduces_the_recorded_tiny_run(policy, tmp_path):
    """The default outer optimizer (TRPO) with the default inner estimator gives every logged scalar (but wall-clock
    ones) and eval.json of the tiny run as recorded in tests/data/maml_ssm_trpo_tiny.json from the TRPO-only script:
    to the last bit on the machine kind a recording names, within RECORDED_RTOL of every other recording of the policy
    (RECORDED_KINDS). Both run under PINNED_ARITHMETIC."""
    with open(os.path.join(REPO, "tests", "data", "maml_ssm_trpo_tiny.json")) as f:
        recordings = json.load(f)["recordings"]
    runs = tmp_path / "runs"
    run_maml(
        [
            "train",
            "--task",
            "point-nav-2d",
            "--policy",
            policy,
            "--save-model",
            "--seed",
            "1",
            "--runs-dir",
            str(runs),
            "--diagnostics",
            *TINY,
        ],
        env={**SCRIPT_ENV, **PINNED_ARITHMETIC},
    )
    run_dir = only_run_dir(runs)
    scalars = logged_scalars(run_dir)
    evaluation = load_json(os.path.join(run_dir, "eval.json"))
    kind = machine_kind()
    for recording in recordings:
        if policy not in recording["untimed_scalars"]:
            continue
        for tag, values in recording["untimed_scalars"][policy].items():
            logged = [list(x) for x in scalars[tag]]
            if recording["machine_kind"] == kind:
                assert logged == values, (kind, tag)
            else:
                assert [step for step, _ in logged] == [step for step, _ in values], tag
                expected = pytest.approx([value for _, value in values], rel=RECORDED_RTOL, abs=RECORDED_ATOL)
                assert [value for _, value in logged] == expected, (recording["machine_kind"], tag)
        if recording["machine_kind"] == kind:
            assert evaluation == recording["eval"][policy], kind
        else:
            recorded = recording["eval"][policy]
            assert evaluation.keys() == recorded.keys()
            for key, value in recorded.items():
                if isinstance(value, dict):
                    assert evaluation[key] == pytest.approx(value, rel=RECORDED_RTOL, abs=RECORDED_ATOL), key
                else:
                    assert evaluation[key] == value, key
