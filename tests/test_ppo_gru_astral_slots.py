"""Tests for the slot-specialisation options of cleanrl_astral/ppo_gru_astral.py (bottleneck, orthonormal slots,
hard gate, episode consistency, supervised gate) and its episode-level slot metrics; each fails if its mechanism is wrong."""

import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_astral import ppo_gru_astral as m

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = m.BURN_IN


def episodes_batch(slots_per_episode, length=B + 5, K=4):
    """A (T, N=1) column of back-to-back episodes, episode e using the one-hot gate of slot slots_per_episode[e] past
    its burn-in and a uniform gate before it: (probs, starts, ages)."""
    probs, starts, ages = [], [], []
    for slot in slots_per_episode:
        for age in range(length):
            probs.append(torch.eye(K)[slot] if age >= B else torch.full((K,), 1.0 / K))
            starts.append(float(age == 0))
            ages.append(age)
    return torch.stack(probs)[:, None], torch.tensor(starts)[:, None], torch.tensor(ages)[:, None]


# --- bottleneck and symmetry breaking ---------------------------------------------------------------------


def test_bottleneck_lets_memory_reach_the_heads_only_through_the_gate():
    """With the bottleneck, two different GRU states under the same gate weights give the same policy and value;
    without it they do not. And the gradient of the logits reaches the GRU only through the gate."""
    torch.manual_seed(0)
    x, starts, w = torch.randn(1, 5, 7), torch.zeros(1, 5), torch.eye(3)[[0, 1, 2, 0, 1]][None]
    states = torch.randn(5, 16), torch.randn(5, 16)
    for bottleneck in (True, False):
        agent = m.Agent(4, 2, 3, 16, num_abstractions=3, slot_dim=8, bottleneck=bottleneck)
        with torch.no_grad():
            agent.bank.slots.normal_()
        out = [agent.get_action_and_value(x, s, starts, action=torch.zeros(1, 5, dtype=torch.long), weights=w) for s in states]
        assert not torch.allclose(out[0][4], out[1][4])  # the GRU states differ
        same = torch.allclose(out[0][1], out[1][1]) and torch.allclose(out[0][3], out[1][3])
        assert same == bottleneck
    state = torch.randn(5, 16, requires_grad=True)
    agent = m.Agent(4, 2, 3, 16, num_abstractions=3, slot_dim=8, bottleneck=True)
    with torch.no_grad():
        agent.bank.slots.normal_()
    modulated, *_ = agent(x, state, starts)
    (grad_free,) = torch.autograd.grad(agent.actor(modulated).sum(), state)
    modulated, *_ = agent(x, state, starts, weights=w)
    (grad_clamped,) = torch.autograd.grad(agent.actor(modulated).sum(), state, allow_unused=True)
    assert grad_free.abs().max() > 1e-6 and (grad_clamped is None or grad_clamped.abs().max() == 0)


def test_orthonormal_slot_init():
    torch.manual_seed(0)
    for K, d in ((3, 8), (8, 32), (4, 4)):
        slots = m.AbstractionBank(16, K, d, 1.0, orthonormal=True).slots.detach()
        torch.testing.assert_close(slots @ slots.T, torch.eye(K), atol=1e-5, rtol=0)
    random = m.AbstractionBank(16, 3, 8, 1.0).slots.detach()
    assert (random @ random.T - torch.eye(3)).abs().max() > 0.5
    args = m.Args(slot_init="orthonormal", num_abstractions=4, slot_dim=8)
    slots = m.agent_from_args(args, 3).bank.slots.detach()
    torch.testing.assert_close(slots @ slots.T, torch.eye(4), atol=1e-5, rtol=0)


# --- hard gate --------------------------------------------------------------------------------------------


def test_hard_gate_is_torchs_straight_through_gumbel_softmax():
    torch.manual_seed(0)
    bank = m.AbstractionBank(16, 5, 8, 0.7, gumbel_tau=0.5)
    h = torch.randn(6, 16)
    torch.manual_seed(1)
    _, weights, probs, noise = bank(h)
    torch.manual_seed(1)
    expected = torch.nn.functional.gumbel_softmax(bank.gate(h) / 0.7, tau=0.5, hard=True)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(probs, torch.softmax(bank.gate(h) / 0.7, -1))
    assert torch.equal(bank(h, noise=noise)[1], weights)  # the same noise, the same slot
    assert torch.equal(bank(h, noise=torch.zeros_like(noise))[1].argmax(-1), probs.argmax(-1))  # no noise: the likeliest slot


def test_hard_gate_is_one_hot_and_only_the_chosen_slot_gets_gradient():
    torch.manual_seed(0)
    bank = m.AbstractionBank(16, 4, 8, 1.0, gumbel_tau=1.0)
    for _ in range(8):
        z, weights, _, _ = bank(torch.randn(1, 16))
        chosen = weights.argmax(-1).item()
        assert (
            torch.equal(weights.detach().round(), torch.eye(4)[[chosen]])
            and (weights - torch.eye(4)[chosen]).abs().max() < 1e-6
        )
        (grad,) = torch.autograd.grad((z * torch.randn_like(z)).sum(), bank.slots)
        others = [k for k in range(4) if k != chosen]
        assert grad[chosen].abs().max() > 0 and torch.all(grad[others] == 0)
        # while the gate itself still learns through the straight-through estimator
        assert (
            torch.autograd.grad((bank(torch.randn(1, 16), noise=torch.zeros(1, 4))[0] ** 2).sum(), bank.gate[-1].weight)[0]
            .abs()
            .max()
            > 0
        )


def test_deterministic_acting_uses_the_noiseless_hard_gate():
    torch.manual_seed(0)
    agent = m.Agent(4, 2, 3, 16, num_abstractions=3, slot_dim=8, gumbel_tau=1.0)
    x, state, starts = torch.randn(1, 64, agent.input_dim), torch.randn(64, 16), torch.zeros(1, 64)
    *_, weights, probs, noise = agent.get_action_and_value(x, state, starts, deterministic=True)
    assert torch.equal(noise, torch.zeros_like(noise)) and torch.equal(weights.argmax(-1), probs.argmax(-1))
    *_, sampled, _, noise = agent.get_action_and_value(x, state, starts)
    assert noise.abs().sum() > 0 and not torch.equal(sampled.argmax(-1), probs.argmax(-1))


# --- episode consistency and the supervised ceiling -------------------------------------------------------


def test_episode_consistency_on_hand_made_gates():
    """I(episode; slot): log K when each episode keeps its own slot and the slots are used equally, 0 when every
    episode uses the same gate; burn-in steps do not count; episodes are cut at the starts only."""
    distinct = m.episode_consistency(*episodes_batch([0, 1, 2, 3]))
    assert distinct.item() == pytest.approx(math.log(4), abs=1e-5)
    assert m.episode_consistency(*episodes_batch([2, 2, 2, 2])).item() == pytest.approx(0.0, abs=1e-6)
    # a gate that flips slot within each episode has sharp steps but a mixed episode mean: lower
    probs, starts, ages = episodes_batch([0, 1, 2, 3])
    flipping = probs.clone()
    flipping[ages[:, 0] % 2 == 1] = torch.eye(4)[(torch.arange(len(probs)) // (B + 5) + 1) % 4][ages[:, 0] % 2 == 1][:, None]
    assert m.episode_consistency(flipping, starts, ages).item() < distinct.item() - 0.3
    # without the starts the column is one episode with a mixed mean: nothing to reward
    assert m.episode_consistency(probs, torch.zeros_like(starts), ages).item() == pytest.approx(0.0, abs=1e-6)
    # the uniform burn-in steps are skipped: counting them would lower the value
    assert m.episode_consistency(probs, starts, ages + B).item() < distinct.item() - 0.1
    # episodes of different columns are different episodes, even without a start between them
    probs0, _, ages0 = episodes_batch([0])
    probs1 = episodes_batch([1])[0]
    no_starts = torch.zeros(len(probs0), 2)
    assert m.episode_consistency(torch.cat([probs0, probs1], 1), no_starts, torch.cat([ages0] * 2, 1)).item() == pytest.approx(
        math.log(2), abs=1e-5
    )


def test_supervised_gate_loss_is_the_cross_entropy_to_the_true_mode_past_burn_in():
    probs = torch.softmax(torch.randn(30, 2, 4), -1)
    modes, ages = torch.randint(0, 4, (30, 2)), torch.arange(30)[:, None].expand(30, 2)
    expected = -torch.log(probs.gather(-1, modes[..., None])[..., 0])[B:].mean()
    torch.testing.assert_close(m.supervised_gate_loss(probs, modes, ages), expected, atol=1e-6, rtol=1e-5)
    # a minibatch of young episodes only: zero, not NaN (which would poison every parameter)
    young = m.supervised_gate_loss(probs.requires_grad_(), modes, ages.clamp(max=B - 1))
    assert young.item() == 0.0 and torch.autograd.grad(young, probs)[0].abs().max() == 0
    assert m.episode_consistency(probs, torch.zeros(30, 2), ages.clamp(max=B - 1)).item() == 0.0


# --- episode-level metrics and probes ---------------------------------------------------------------------


def test_episode_nmi_and_stability():
    probs, starts, ages = episodes_batch([0, 1, 2, 0, 1, 2])
    modes = torch.tensor([0, 1, 2, 0, 1, 2]).repeat_interleave(B + 5)[:, None]
    metrics = m.episode_slot_metrics(probs, modes, starts, ages, 3)
    assert metrics == {"episode_nmi": pytest.approx(1.0), "gate_stability": pytest.approx(1.0)}
    # burn-in steps are skipped: wrong slots there change nothing
    early = probs.clone()
    early[ages[:, 0] < B] = torch.eye(4)[3]
    assert m.episode_slot_metrics(early, modes, starts, ages, 3) == metrics
    # one slot for every mode: no information
    same = m.episode_slot_metrics(episodes_batch([1] * 6)[0], modes, starts, ages, 3)
    assert same["episode_nmi"] == pytest.approx(0.0, abs=1e-9) and same["gate_stability"] == pytest.approx(1.0)
    # one sample per episode whatever its length: a long episode weighs as much as a short one
    unstable = probs.clone()
    unstable[(ages[:, 0] >= B) & (ages[:, 0] % 2 == 0)] = torch.eye(4)[3]
    assert m.episode_slot_metrics(unstable, modes, starts, ages, 3)["gate_stability"] < 0.7


def test_linear_probe_accuracy():
    rng = np.random.default_rng(0)
    labels, episode = np.repeat([0, 1, 2, 3], 200), np.tile(np.repeat(np.arange(4), 50), 4)
    separable = np.eye(4)[labels] + 0.1 * rng.normal(size=(800, 4))
    assert m.linear_probe_accuracy(separable, labels, episode) == 1.0
    assert m.linear_probe_accuracy(rng.normal(size=(800, 4)), labels, episode) < 0.45
    assert math.isnan(m.linear_probe_accuracy(separable, np.zeros(800, dtype=int), episode))


# --- the script -------------------------------------------------------------------------------------------


def test_smoke_all_mechanisms_on_mirror4_log_and_report(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "cleanrl_astral/ppo_gru_astral.py",
            "--num-envs",
            "8",
            "--num-steps",
            "32",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "2",
            "--hidden-size",
            "16",
            "--slot-dim",
            "8",
            "--total-timesteps",
            "512",
            "--modes-preset",
            "mirror4",
            "--mode-share",
            "balanced",
            "--num-abstractions",
            "4",
            "--bottleneck",
            "--slot-init",
            "orthonormal",
            "--hard-gate",
            "--lambda-consistency",
            "0.1",
            "--lambda-supervised",
            "0.1",
            "--save-model",
            "--eval-episodes",
            "2",
            "--runs-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {
        "losses/grad_norm_ppo",
        "slots/episode_nmi",
        "slots/gate_stability",
        "slots/episode_consistency",
        "slots/supervised_ce",
        "slots/eval_episode_nmi_deterministic",
        "slots/eval_probe_acc_w_deterministic",
        "slots/eval_probe_acc_h_sampled",
    } | {f"slots/grad_norm_{term}" for term in m.SLOT_TERMS}
    assert expected <= tags, expected - tags
    assert max(e.value for e in acc.Scalars("debug/first_minibatch_ratio_error")) < 1e-5
    assert max(e.value for e in acc.Scalars("debug/first_minibatch_gate_error")) < 1e-5
    assert min(e.value for e in acc.Scalars("slots/grad_norm_supervised_ce")) > 0
    report = json.load(open(os.path.join(run_dir, "eval.json")))
    assert report["held_out_modes"] == [4] and set(report["per_mode"]) == {"0", "1", "2", "3", "4"}
    per_mode = {k: v["deterministic"]["mean"] for k, v in report["per_mode"].items()}
    assert report["deterministic_mean"] == pytest.approx(np.mean([per_mode[k] for k in "0123"]))
    assert report["deterministic_held_out_mean"] == pytest.approx(per_mode["4"])
    assert set(report["slots_deterministic"]) == {"episode_nmi", "gate_stability", "probe_acc_w", "probe_acc_h"}
    assert "episode_nmi" in result.stdout.splitlines()[-1] and "probe_acc_h" in result.stdout.splitlines()[-1]
    ckpt = torch.load(os.path.join(run_dir, "ppo_gru_astral.cleanrl_model"), weights_only=True)
    assert ckpt["args"]["hard_gate"] and ckpt["args"]["bottleneck"] and len(ckpt["modes"]) == 5
