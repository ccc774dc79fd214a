"""Tests for cleanrl_astral/tta_gating.py written from a mutation audit: each one kills a plausible mutant that the
tests of test_tta_gating.py let survive (named in its docstring)."""
import copy
import glob
import json
import os
import runpy
import shutil
import sys

import numpy as np
import pytest
import torch

from cleanrl_astral import tta_gating as m
from test_tta_gating import adapt_args, checkpoint, run, sharpened  # noqa: F401  (checkpoint is a fixture)


def test_reinforce_loss_is_minus_the_mean_of_log_prob_times_the_normalised_return():
    """reinforce_loss = -mean_t log pi(a_t) G^_t, G^ the discounted returns standardised over the episode, so its
    gradient with respect to log pi(a_t) is -G^_t / T. If this failed with the opposite sign, the adaptation descended
    the return (the existing ascent test cannot see that: it measures the objective with reinforce_loss itself)."""
    logprobs = torch.zeros(3, requires_grad=True)
    returns = np.array([1.0 + 0.5 * (0.0 + 0.5 * 2.0), 0.0 + 0.5 * 2.0, 2.0])  # [1.5, 1.0, 2.0]
    normalised = (returns - returns.mean()) / returns.std(ddof=1)
    m.reinforce_loss(logprobs, [1.0, 0.0, 2.0], 0.5).backward()
    assert torch.allclose(logprobs.grad, -torch.tensor(normalised, dtype=torch.float32) / 3, atol=1e-6)
    # the step with the best return gets its log-probability pushed up (a gradient step lowers the loss)
    assert logprobs.grad[2] < 0 < logprobs.grad[1]


def test_mean_ci_is_the_student_t_interval_of_the_mean():
    """mean_ci's half-width is t_{0.975, n-1} * s / sqrt(n) with s the sample standard deviation (ddof=1). If this
    failed, every reported +-CI (and the CI bands of the adaptation curves) were too narrow: ddof=0, or n degrees of
    freedom instead of n - 1."""
    stat = m.mean_ci([1.0, 2.0, 3.0, 4.0])
    # t_{0.975, 3} = 3.182446305..., s = sqrt(5/3)
    assert stat["mean"] == 2.5 and stat["n"] == 4
    assert stat["ci95"] == pytest.approx(3.182446305284263 * np.sqrt(5 / 3) / 2, rel=1e-9)
    assert m.mean_ci([7.0]) == {"mean": 7.0, "ci95": None, "n": 1}


def test_online_segments_have_online_every_steps_and_bootstrap_from_the_continuing_state(checkpoint, monkeypatch):
    """--online: every segment but the episode's last is exactly --online-every steps, and its bootstrap is the
    critic's value of the next observation with the GRU state carried on (start 0), i.e. the value the next segment's
    first step computes. With a learning rate of 0 nothing changes between the two, so they must be equal. If this
    failed, the segments were one step short (an off-by-one in the cut), or the bootstrap were taken from a zeroed
    recurrent state (start 1), a value of a different (memoryless) agent."""
    ckpt, agent = m.load_astral_checkpoint(checkpoint)
    anchor = copy.deepcopy(agent).requires_grad_(False)
    optimizer = torch.optim.Adam(m.adapted_parameters(agent, "gate"), lr=0.0)
    target = m.resolve_targets([0], None, ckpt)[0]
    env = m.make_env(target["modes"], ckpt["args"]["hide_velocity"], fixed_mode=target["index"])()
    calls = []
    real_loss = m.actor_critic_loss

    def loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale):
        calls.append((len(rewards), values.detach().clone(), bootstrap_value))
        return real_loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale)

    monkeypatch.setattr(m, "actor_critic_loss", loss)
    torch.manual_seed(0)
    _, updates = m.adaptation_episode(agent, anchor, env, 3, "gate", optimizer,
                                      adapt_args(checkpoint, online=True, online_every=4), 1.0)
    assert updates == len(calls) >= 3
    assert all(n == 4 for n, _, _ in calls[:-1]) and 1 <= calls[-1][0] <= 4
    for (_, _, bootstrap), (_, next_values, _) in zip(calls[:-1], calls[1:]):
        assert bootstrap == pytest.approx(float(next_values[0]), abs=1e-6)


def test_adaptation_episodes_have_distinct_env_seeds_shared_by_every_control(checkpoint, monkeypatch):
    """Within one (target, seed), adaptation episode e of every control starts from the same env seed (the paired
    comparison), and the episodes of one run differ from one another. If this failed, every adaptation episode replayed
    one initial state (the controls adapt to, and `during` measures, a single start), or the controls saw different
    episodes."""
    ckpt, _ = m.load_astral_checkpoint(checkpoint)
    target = m.resolve_targets([1], None, ckpt)[0]
    seeds = {}
    real_episode = m.adaptation_episode

    def episode(agent, anchor, env, env_seed, control, *args):
        seeds.setdefault(control, []).append(env_seed)
        return real_episode(agent, anchor, env, env_seed, control, *args)

    monkeypatch.setattr(m, "adaptation_episode", episode)
    for control in m.CONTROLS:
        m.adapt(ckpt, target, control, 2, adapt_args(checkpoint, episodes=3), 1.0)
    assert all(s == seeds["none"] for s in seeds.values()) and len(seeds) == len(m.CONTROLS)
    assert len(set(seeds["none"])) == 3


def test_tent_anchor_stays_the_unadapted_policy_across_episodes(checkpoint, tmp_path, monkeypatch):
    """adapt gives `tent` an anchor that is a frozen copy of the checkpoint's agent: equal to the adapted policy in the
    first episode (nothing has been updated yet), different from it once the gate has moved. If this failed, the anchor
    were the adapted agent itself, its KL term always 0, and nothing held entropy minimisation back."""
    ckpt, _ = m.load_astral_checkpoint(sharpened(checkpoint, tmp_path))
    target = m.resolve_targets([0], None, ckpt)[0]
    calls = []
    real_loss = m.tent_loss

    def loss(logits, anchor_logits, gate_weights, kl_coef):
        calls.append((logits.detach().clone(), anchor_logits.detach().clone()))
        return real_loss(logits, anchor_logits, gate_weights, kl_coef)

    monkeypatch.setattr(m, "tent_loss", loss)
    agent, _, updates = m.adapt(ckpt, target, "tent", 1, adapt_args(checkpoint, episodes=2, adapt_lr=0.05), 1.0)
    assert updates == len(calls) == 2
    assert torch.allclose(calls[0][0], calls[0][1], atol=1e-6)
    assert (calls[1][0] - calls[1][1]).abs().max() > 1e-4
    assert not torch.equal(agent.state_dict()["bank.gate.2.weight"], ckpt["state_dict"]["bank.gate.2.weight"])


@pytest.fixture(scope="module")
def asymmetric_clamp(checkpoint, tmp_path_factory):
    """A clamp run on the tiny checkpoint with slots u, -u, 2v (their sum is not K times their mean, unlike the
    10u, -10u, 0 of test_tta_gating's sharp_clamp) and a 10x actor output layer (1000x, or larger slots, saturate the
    policy so that every gate setting acts alike)."""
    tmp = tmp_path_factory.mktemp("asym_clamp")
    ckpt = torch.load(checkpoint, weights_only=True)
    state = ckpt["state_dict"]
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(2, state["bank.slots"].shape[1], generator=g)
    state["bank.slots"] = torch.stack([u, -u, 2 * v])
    state["actor.2.weight"] = state["actor.2.weight"] * 10
    path = str(tmp / "asym.cleanrl_model")
    torch.save(ckpt, path)
    result = run(["clamp", "--checkpoint", path, "--mode-indices", "0", "1", "--eval-episodes", "3",
                  "--runs-dir", str(tmp / "runs")])
    assert result.returncode == 0, result.stderr
    (report,) = glob.glob(str(tmp / "runs" / "*" / "clamp.json"))
    with open(report) as f:
        return path, json.load(f)


def test_clamp_uniform_column_is_the_gate_fixed_at_one_over_k(asymmetric_clamp):
    """The `uniform` column holds the returns with the gate fixed at w = 1/K (z = the mean slot, weights summing to 1).
    If this failed, the uniform weights did not sum to 1 (e.g. all ones: z = the sum of the slots, K times too far)."""
    path, report = asymmetric_clamp
    ckpt, agent = m.load_astral_checkpoint(path)
    K = ckpt["args"]["num_abstractions"]
    differs = False
    for ti, target in enumerate(m.resolve_targets([0, 1], None, ckpt)):
        eval_seed = 100_000 + 1 + 1000 * ti  # --seed 1
        for kind, deterministic in (("deterministic", True), ("sampled", False)):
            out = {}
            for name, weights in (("mean", torch.full((K,), 1.0 / K)), ("sum", torch.ones(K))):
                torch.manual_seed(eval_seed)
                out[name] = m.evaluate_target(agent, target, ckpt["args"]["hide_velocity"], 3, deterministic,
                                              eval_seed, weights)[0].tolist()
            assert report["results"][target["name"]]["uniform"][kind]["returns"] == out["mean"], (ti, kind)
            differs |= out["mean"] != out["sum"]
    assert differs  # the weights' sum shows in the returns on these seeds, so a wrong sum cannot match


def test_gain_over_none_is_the_paired_difference_of_sampled_returns(checkpoint, tmp_path, monkeypatch):
    """gain_over_none.after_sampled is, seed by seed, the control's sampled return after adaptation minus `none`'s, and
    gain_over_none.during_mean the difference of the mean returns during adaptation. If this failed, the gain compared
    different kinds of evaluation (the control's deterministic returns against none's sampled ones)."""
    # in-process (runpy) rather than a subprocess: the same __main__ code without a second interpreter's imports
    monkeypatch.setattr(sys, "argv", [m.__file__, "adapt", "--checkpoint", checkpoint, "--mode-indices", "1",
                                      "--controls", "none", "gate", "--episodes", "1", "--num-seeds", "2",
                                      "--eval-episodes", "2", "--adapt-lr", "0.05", "--runs-dir", str(tmp_path)])
    runpy.run_path(m.__file__, run_name="__main__")
    (path,) = glob.glob(str(tmp_path / "*" / "tta.json"))
    with open(path) as f:
        controls = json.load(f)["results"]["mode1"]["controls"]
    gate, none = controls["gate"], controls["none"]
    after = np.subtract(gate["after_per_seed"]["sampled"], none["after_per_seed"]["sampled"])
    during = np.mean(gate["during_per_seed"], 1) - np.mean(none["during_per_seed"], 1)
    assert gate["gain_over_none"]["after_sampled"] == m.mean_ci(after)
    assert gate["gain_over_none"]["during_mean"] == m.mean_ci(during)
    # the deterministic and sampled evaluations differ here, so a gain over the wrong kind cannot match
    assert gate["after_per_seed"]["deterministic"] != gate["after_per_seed"]["sampled"]


def test_online_all_control_reads_the_critics_reward_scale(checkpoint, tmp_path):
    """--online with the `all` control bootstraps with the critic like `gate`, so validate must find the reward scale
    for it too. If this failed, `--online --controls none all` got a scale of None and crashed in the first update."""
    model = tmp_path / os.path.basename(checkpoint)
    shutil.copyfile(checkpoint, model)
    train_ckpt = torch.load(os.path.join(os.path.dirname(checkpoint), "checkpoint.pt"), weights_only=True)
    expected = float(np.sqrt(train_ckpt["reward_scaler"]["var"] + 1e-8))
    assert m.validate(adapt_args(str(model), online=True, controls=["none", "all"]))[-1] == expected
    assert m.validate(adapt_args(str(model), online=True, controls=["none", "tent"]))[-1] is None


def test_online_refuses_a_discount_other_than_the_critics(checkpoint):
    """--online's n-step targets bootstrap with the critic, which estimates returns at the checkpoint's gamma; another
    --gamma mixed the two discounts without a word."""
    trained = torch.load(checkpoint, weights_only=True)["args"]["gamma"]
    with pytest.raises(ValueError, match=f"--gamma 0.9 differs from the {trained} the critic was trained with"):
        m.validate(adapt_args(checkpoint, online=True, controls=["none", "gate"], gamma=0.9))
    assert m.validate(adapt_args(checkpoint, online=True, controls=["none", "gate"], gamma=trained))[-1] > 0
    m.validate(adapt_args(checkpoint, controls=["none", "gate"], gamma=0.9))  # offline REINFORCE has no critic: any gamma
