"""Checks of cleanrl_astral/maml_ssm.py added after a mutation audit: each test kills a plausible mutant that the
other maml_ssm test files let through, or killed only through the textual context check of the probe patches (the
mutant is named in its docstring). In-context inputs of rollouts, the value head's detached features, the LRU
block's residual, the baseline's independence of padding, TRPO's backtracking and strict acceptance, the buffer's
done flags and source batch, and the logged auxiliary losses."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cleanrl_astral import maml_ssm as m


def tiny(T=6, n_tasks=2, per=2, inner_lr=0.5, seed=0):
    """Point-nav SSM model, args and per-task batches sampled by the script's own sampler (one inner step)."""
    torch.manual_seed(seed)
    args = m.Args(policy="ssm", hidden_size=6, state_size=3, max_episode_steps=T, fast_batch_size=per,
                  tasks_per_batch=n_tasks, inner_lr=inner_lr)
    model = m.build_agent(args, m.PointNav2D)
    rng, _ = m.task_streams(seed)
    tasks = m.sample_tasks(args.task, rng, n_tasks, "train")
    theta = {k: v.detach() for k, v in model.named_parameters()}
    data, _ = m.sample_task_batches(model, theta, tasks, args, torch.Generator().manual_seed(seed), 1, [inner_lr])
    return model, args, data


# ------------------------------------------------------------------------------------------------ rollout inputs
@pytest.mark.parametrize("task", ["point-nav-2d", "cartpole-physics"])
def test_rollout_feeds_the_previous_action_and_reward_in_context(task):
    """The policy input at step t is [obs_t, a_{t-1} (one-hot if discrete), r_{t-1}], with zeros at t = 0 (docs:
    "Input: observation, previous action ... and previous reward"). Kills: prev_a never updated (stays 0), prev_r
    never updated, and the reward placed before the action (the dynamics objective zeroes the last channel)."""
    torch.manual_seed(0)
    args = m.Args(task=task, policy="ssm", hidden_size=6, state_size=3, max_episode_steps=15)
    env_cls = m.ENV_CLASSES[task]
    model = m.build_agent(args, env_cls)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    rng, _ = m.task_streams(0)
    env = m.make_env(args, m.sample_tasks(task, rng, 2, "train"), 3, torch.Generator().manual_seed(0))
    b = m.rollout(model, [theta, theta], env, args.max_episode_steps)
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


# ------------------------------------------------------------------------------------------------ model
def test_value_head_reads_detached_features():
    """The value head is a diagnostic trained on detached features (docs): its output has no gradient path into the
    trunk or the policy head, only into value_head itself. Kills: value_head(feats) without .detach(), which lets
    the value loss move the trunk in the aux step whenever --dynamics-coef > 0."""
    torch.manual_seed(0)
    model = m.Agent("ssm", 2, 2, False, 6, 3, True)
    inp = torch.randn(5, 3, 5)
    starts = torch.zeros(5, 3, dtype=torch.bool)
    starts[0] = True
    out = model(inp, starts, model.initial_state(3))
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(out["value"].sum(), list(model.parameters()), allow_unused=True)
    for n, g in zip(names, grads):
        if n.startswith("value_head."):
            assert g is not None and g.abs().sum() > 0, n
        else:
            assert g is None or torch.all(g == 0), n


def test_ssm_block_is_gelu_of_the_lru_plus_its_input():
    """Agent.forward with the LRU core: z = gelu(LRU(h)) + h with h = tanh(encoder(input)), then
    feats = tanh(fc(z)) (docs: "then gelu(y) + u (residual)"), computed here from the modules. Kills: the residual
    dropped (z = gelu(y))."""
    torch.manual_seed(0)
    model = m.Agent("ssm", 2, 2, False, 6, 3, True).double()
    inp = torch.randn(7, 3, 5, dtype=torch.float64)
    starts = torch.zeros(7, 3, dtype=torch.bool)
    starts[0] = True
    with torch.no_grad():
        out = model(inp, starts, model.initial_state(3))
        h = torch.tanh(model.encoder(inp))
        y, _ = model.core.scan(h, model.initial_state(3), starts)
        expected = torch.tanh(model.fc(F.gelu(y) + h))
        without = torch.tanh(model.fc(F.gelu(y)))
    assert torch.allclose(out["feats"], expected, atol=1e-12)
    assert (expected - without).abs().max() > 1e-2


# ------------------------------------------------------------------------------------------------ baseline
def test_linear_baseline_ignores_what_padded_steps_hold():
    """Padded steps (after an episode ended) keep the observations the environment went on producing; the ridge fit
    must use valid steps only, so garbage there cannot change the predictions on valid steps. Kills: the feature
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
    p1 = m.linear_baseline({"obs": obs, "masks": masks, "rewards": rewards}, 0.95)
    p2 = m.linear_baseline({"obs": other, "masks": masks, "rewards": rewards}, 0.95)
    valid = masks > 0
    assert torch.allclose(p1[valid], p2[valid], atol=1e-8), (p1 - p2)[valid].abs().max()
    assert torch.all(p1[~valid] == 0) and p1[valid].abs().max() > 0.1


# ------------------------------------------------------------------------------------------------ TRPO line search
def rigged_trpo(monkeypatch, trial):
    """trpo_step with every line-search trial's (loss, KL) given by trial(k, first_loss, args) for trial k = 0, 1, ...;
    returns (stats, flat theta before, flat theta after, the flat parameters each trial was evaluated at, args)."""
    model, args, data = tiny()
    args = dataclasses.replace(args, cg_iters=3, ls_max_steps=4, max_kl=0.01, ls_backtrack_ratio=0.5)
    real = m.meta_objective
    seen = {"first": None, "trials": []}

    def rigged(model_, params, tasks_data, args_, old_outs=None, create_graph=True):
        loss, kl, outs = real(model_, params, tasks_data, args_, old_outs, create_graph)
        if old_outs is None:
            seen["first"] = loss.detach()
            return loss, kl, outs
        seen["trials"].append(torch.cat([v.detach().reshape(-1) for v in params.values()]))
        new_loss, new_kl = trial(len(seen["trials"]) - 1, seen["first"], args_)
        return new_loss, torch.tensor(new_kl, dtype=kl.dtype), outs

    monkeypatch.setattr(m, "meta_objective", rigged)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    stats = m.trpo_step(model, data, args)
    after = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    return stats, before, after, seen["trials"], args


def test_line_search_backtracks_geometrically(monkeypatch):
    """Every trial is rejected (worse surrogate): trial k must sit at ls_backtrack_ratio^k times the first trial's
    step from theta, along the same direction. Kills: `frac = ratio` instead of `frac *= ratio` (the step shrinks
    once, then every later trial repeats it), and a search that does not shrink at all."""
    stats, before, after, trials, args = rigged_trpo(monkeypatch, lambda k, first, a: (first + 1.0, 0.0))
    assert len(trials) == args.ls_max_steps and stats["accepted"] == 0.0 and torch.equal(after, before)
    steps = [t - before for t in trials]
    assert steps[0].norm() > 1e-4
    for k, s in enumerate(steps):
        assert torch.allclose(s, args.ls_backtrack_ratio**k * steps[0], atol=1e-6, rtol=1e-4), k


def test_line_search_rejects_a_trial_that_does_not_lower_the_surrogate(monkeypatch):
    """rllab's TRPO accepts a trial only if it strictly lowers the surrogate: a trial with the very same loss (and
    KL 0) is rejected and the search moves on. Kills `<= 0` for `< 0` in the acceptance test."""
    def trial(k, first, a):
        return (first.clone(), 0.0) if k == 0 else (first - 1.0, 0.0)

    stats, before, after, trials, args = rigged_trpo(monkeypatch, trial)
    assert stats["accepted"] == 1.0 and stats["line_search_steps"] == 2
    assert torch.equal(after, trials[1]) and not torch.equal(trials[0], trials[1])


# ------------------------------------------------------------------------------------------------ experience buffer
def test_buffer_marks_each_episodes_last_valid_step_done():
    """add_batch_to_buffer stores the valid steps of each episode (time-major, one column per episode) with done
    True exactly on an episode's last valid step. Kills: the next-step mask not shifted (no step ever done)."""
    T, lengths = 6, [6, 2, 4]
    masks = torch.zeros(T, 3)
    for j, length in enumerate(lengths):
        masks[:length, j] = 1
    ids = torch.arange(T * 3, dtype=torch.float32).reshape(T, 3)  # step id t * 3 + episode
    batch = {"masks": masks, "obs": ids[..., None].expand(T, 3, 2), "inputs": ids[..., None].expand(T, 3, 5),
             "actions": ids[..., None].expand(T, 3, 2), "rewards": ids, "next_obs": ids[..., None].expand(T, 3, 2),
             "advantages": ids, "states": ids[..., None].expand(T, 3, 4)}
    buf = m.ExperienceBuffer(100, 2, 5, 2, 4)
    m.add_batch_to_buffer(buf, batch, 7)
    n = len(buf)
    assert n == sum(lengths)
    stored = buf.data["rewards"][:n].long()
    last = {(length - 1) * 3 + j for j, length in enumerate(lengths)}
    assert {int(s) for s, d in zip(stored, buf.data["dones"][:n]) if d} == last
    assert int(buf.data["dones"][:n].sum()) == len(lengths)
    assert torch.all(buf.data["task_ids"][:n] == 7)


def train_spied(tmp_path, monkeypatch, **kw):
    """main_train in this process on tiny settings; returns the tasks_data each iteration sampled, the batches
    handed to add_batch_to_buffer, every logged scalar and the policy outputs of the aux step's val batches."""
    sampled, buffered, scalars, aux_outs, outer_done = [], [], {}, [], []
    real_sample, real_add, real_policy_out = m.sample_task_batches, m.add_batch_to_buffer, m.policy_out
    real_trpo = m.trpo_step

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

    monkeypatch.setattr(m, "sample_task_batches", spy_sample)
    monkeypatch.setattr(m, "add_batch_to_buffer", spy_add)
    monkeypatch.setattr(m, "policy_out", spy_policy_out)
    monkeypatch.setattr(m, "trpo_step", spy_trpo)
    monkeypatch.setattr(SummaryWriter, "add_scalar", spy_add_scalar)
    args = m.Args(runs_dir=str(tmp_path), exp_name="spied", outer_steps=1, fast_batch_size=3, hidden_size=6,
                  state_size=3, cg_iters=2, ls_max_steps=2, buffer_size=1000, **kw)
    m.main_train(args)
    return sampled, buffered, scalars, aux_outs


def test_train_fills_the_buffer_with_the_post_adaptation_episodes(tmp_path, monkeypatch):
    """The ExperienceBuffer holds each iteration's post-adaptation (theta') episodes, task id = the task's index in
    the run's task list (docs: "filled by `train` from each iteration's post-adaptation episodes"). Kills: the
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
    horizon, so the padding (where the cart keeps moving) is non-empty. Kills: a forward cumulative sum as the
    value target, and a dynamics loss averaged over padded steps too."""
    _, _, scalars, aux_outs = train_spied(tmp_path, monkeypatch, task="cartpole-physics", tasks_per_batch=2,
                                          max_episode_steps=60)
    assert len(aux_outs) == 2
    v_exp, d_exp, padded = [], [], 0
    for b, out, dyn in aux_outs:
        msk = b["masks"]
        padded += int((msk == 0).sum())
        togo = torch.flip(torch.cumsum(torch.flip(b["rewards"], [0]), 0), [0])
        v_exp.append(((((out["value"] - togo) ** 2) * msk).sum() / msk.sum()).item())
        a = F.one_hot(b["actions"].long()[..., 0], 2).float()
        with torch.no_grad():
            pred = F.linear(torch.cat([out["feats"], a], -1), dyn["weight"], dyn["bias"])
        err = ((pred - b["next_obs"]) ** 2).mean(-1)
        d_exp.append(((err * msk).sum() / msk.sum()).item())
        assert (err * (1 - msk)).sum() > 0  # the padded steps' error is not zero: including them would show
    assert padded > 0
    assert scalars["losses/value_loss"][0] == pytest.approx(float(np.mean(v_exp)), rel=1e-5)
    assert scalars["losses/dynamics_loss"][0] == pytest.approx(float(np.mean(d_exp)), rel=1e-5)
