"""Tests for the slot-specialisation options of cleanrl_astral/ppo_gru_astral.py (orthonormal slots, episode
consistency), its episode-level slot metrics against the mode and the action latent,
and what a run reports of them; each fails if its mechanism is wrong."""

import math
import os

import numpy as np
import pytest
import torch
from helpers import load_json, logged_scalars, only_run_dir, run_script

import cleanrl_astral.ppo_gru_astral as ppo_gru_astral
from cleanrl_astral_utils import cartpole

B = ppo_gru_astral.BURN_IN


def episodes_batch(slots_per_episode, length=B + 5, K=4):
    """A (T, N=1) column of back-to-back episodes, episode e using the one-hot gate of slot slots_per_episode[e] past
    its burn-in and a uniform gate before it: (probs, starts, ages)."""
    probs = []
    starts = []
    ages = []
    for slot in slots_per_episode:
        for age in range(length):
            probs.append(torch.eye(K)[slot] if age >= B else torch.full((K,), 1.0 / K))
            starts.append(float(age == 0))
            ages.append(age)
    return torch.stack(probs)[:, None], torch.tensor(starts)[:, None], torch.tensor(ages)[:, None]


# --- symmetry breaking -----------------------------------------------------------------------------------


def test_orthonormal_slot_init():
    torch.manual_seed(0)
    for K, d in ((3, 8), (8, 32), (4, 4)):
        slots = ppo_gru_astral.AbstractionBank(16, K, d, 1.0, orthonormal=True).slots.detach()
        torch.testing.assert_close(slots @ slots.T, torch.eye(K), atol=1e-5, rtol=0)
    random = ppo_gru_astral.AbstractionBank(16, 3, 8, 1.0).slots.detach()
    assert (random @ random.T - torch.eye(3)).abs().max() > 0.5
    args = ppo_gru_astral.Args(slot_init="orthonormal", num_abstractions=4, slot_dim=8)
    slots = ppo_gru_astral.agent_from_args(args, 3).bank.slots.detach()
    torch.testing.assert_close(slots @ slots.T, torch.eye(4), atol=1e-5, rtol=0)


# --- episode consistency -----------------------------------------------------------------------------------


def test_episode_consistency_on_hand_made_gates():
    """I(episode; slot): log K when each episode keeps its own slot and the slots are used equally, 0 when every
    episode uses the same gate; burn-in steps do not count; episodes are cut at the starts only."""
    distinct = ppo_gru_astral.episode_consistency(*episodes_batch([0, 1, 2, 3]))
    assert distinct.item() == pytest.approx(math.log(4), abs=1e-5)
    assert ppo_gru_astral.episode_consistency(*episodes_batch([2, 2, 2, 2])).item() == pytest.approx(0.0, abs=1e-6)
    # a gate that flips slot within each episode has sharp steps but a mixed episode mean: lower
    probs, starts, ages = episodes_batch([0, 1, 2, 3])
    flipping = probs.clone()
    flipping[ages[:, 0] % 2 == 1] = torch.eye(4)[(torch.arange(len(probs)) // (B + 5) + 1) % 4][ages[:, 0] % 2 == 1][:, None]
    assert ppo_gru_astral.episode_consistency(flipping, starts, ages).item() < distinct.item() - 0.3
    # without the starts the column is one episode with a mixed mean: nothing to reward
    assert ppo_gru_astral.episode_consistency(probs, torch.zeros_like(starts), ages).item() == pytest.approx(0.0, abs=1e-6)
    # the uniform burn-in steps are skipped: counting them would lower the value
    assert ppo_gru_astral.episode_consistency(probs, starts, ages + B).item() < distinct.item() - 0.1
    # episodes of different columns are different episodes, even without a start between them
    probs0, _, ages0 = episodes_batch([0])
    probs1 = episodes_batch([1])[0]
    no_starts = torch.zeros(len(probs0), 2)
    assert ppo_gru_astral.episode_consistency(
        torch.cat([probs0, probs1], 1), no_starts, torch.cat([ages0] * 2, 1)
    ).item() == pytest.approx(math.log(2), abs=1e-5)


def test_episode_consistency_of_young_episodes_only_is_zero():
    """A minibatch of young episodes only: zero, not NaN (which would poison every parameter)."""
    probs = torch.softmax(torch.randn(30, 2, 4), -1)
    ages = torch.arange(30)[:, None].expand(30, 2)
    assert ppo_gru_astral.episode_consistency(probs, torch.zeros(30, 2), ages.clamp(max=B - 1)).item() == 0.0


# --- episode-level metrics and probes ---------------------------------------------------------------------


def episode_slot_metrics(probs, modes, starts, ages, num_modes, latent=None, latent_of_mode=None):
    """The episode-level entries of batch_slot_metrics for one (T, 1) column."""
    slots = ppo_gru_astral.batch_slot_metrics(probs, modes, starts, ages, num_modes, probs.shape[-1], latent, latent_of_mode)
    return {key: value for key, value in slots.items() if key.startswith("episode_nmi") or key == "gate_stability"}


def test_episode_nmi_and_stability():
    probs, starts, ages = episodes_batch([0, 1, 2, 0, 1, 2])
    modes = torch.tensor([0, 1, 2, 0, 1, 2]).repeat_interleave(B + 5)[:, None]
    metrics = episode_slot_metrics(probs, modes, starts, ages, 3)
    assert metrics == {"episode_nmi": pytest.approx(1.0), "gate_stability": pytest.approx(1.0)}
    # burn-in steps are skipped: wrong slots there change nothing
    early = probs.clone()
    early[ages[:, 0] < B] = torch.eye(4)[3]
    assert episode_slot_metrics(early, modes, starts, ages, 3) == metrics
    # one slot for every mode: no information
    same = episode_slot_metrics(episodes_batch([1] * 6)[0], modes, starts, ages, 3)
    assert same["episode_nmi"] == pytest.approx(0.0, abs=1e-9) and same["gate_stability"] == pytest.approx(1.0)
    # one sample per episode whatever its length: a long episode weighs as much as a short one
    unstable = probs.clone()
    unstable[(ages[:, 0] >= B) & (ages[:, 0] % 2 == 0)] = torch.eye(4)[3]
    assert episode_slot_metrics(unstable, modes, starts, ages, 3)["gate_stability"] < 0.7
    # no episode past its burn-in: nothing to score
    short = episode_slot_metrics(probs[: B - 1], modes[: B - 1], starts[: B - 1], ages[: B - 1], 3)
    assert np.isnan(short["episode_nmi"]) and np.isnan(short["gate_stability"])


def test_a_clean_sign_split_scores_sign_nmi_one_and_mode_nmi_exactly_one_half_on_mirror4():
    """On mirror4 only the force sign changes the right action. Gates that split the episodes by sign alone (slot 0 for
    the +1 modes 0 and 2, slot 1 for the -1 modes 1 and 3) hold all the information about the sign (NMI 1) and half of
    that about the four modes (log 2 / log 4 = 0.5 exactly); gates that split by mode score 1 against both."""
    modes = ppo_gru_astral.MODE_PRESETS["mirror4"]
    signs = torch.as_tensor(ppo_gru_astral.latent_labels(modes, ppo_gru_astral.ACTION_LATENT["mirror4"]))
    assert signs.tolist() == [1, 0, 1, 0, 0]
    episode_modes = [0, 1, 2, 3] * 3
    mode_of_step = torch.tensor(episode_modes).repeat_interleave(B + 5)[:, None]
    for slot_of_mode, mode_nmi in (([0, 1, 0, 1], 0.5), ([0, 1, 2, 3], 1.0)):
        probs, starts, ages = episodes_batch([slot_of_mode[k] for k in episode_modes])
        metrics = episode_slot_metrics(probs, mode_of_step, starts, ages, 5, "force_sign", signs)
        assert metrics["episode_nmi"] == pytest.approx(mode_nmi, abs=1e-12)
        assert metrics["episode_nmi_force_sign"] == pytest.approx(1.0, abs=1e-12)
    # slots that ignore the sign (one slot for modes 0 and 1, another for 2 and 3) tell the physics, not the sign
    probs, starts, ages = episodes_batch([[0, 0, 1, 1][k] for k in episode_modes])
    metrics = episode_slot_metrics(probs, mode_of_step, starts, ages, 5, "force_sign", signs)
    assert metrics["episode_nmi_force_sign"] == pytest.approx(0.0, abs=1e-12)


def test_the_logged_slot_metrics_report_the_action_latent_only_where_the_preset_has_one():
    probs, starts, ages = episodes_batch([0, 1, 0, 1])
    modes = torch.tensor([0, 1, 2, 3]).repeat_interleave(B + 5)[:, None]
    for preset in ("seed3", "inverted4", "mirror4"):
        latent = ppo_gru_astral.ACTION_LATENT[preset]
        latent_of_mode = None
        if latent is not None:
            latent_of_mode = torch.as_tensor(ppo_gru_astral.latent_labels(ppo_gru_astral.MODE_PRESETS["mirror4"], latent))
        slots = ppo_gru_astral.batch_slot_metrics(probs, modes, starts, ages, 5, 4, latent, latent_of_mode)
        assert ("episode_nmi_force_sign" in slots) == (preset != "seed3"), preset
        assert slots["episode_nmi"] == pytest.approx(0.5)
        if latent is not None:
            assert slots["episode_nmi_force_sign"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown action latent"):
        ppo_gru_astral.latent_labels(ppo_gru_astral.MODE_PRESETS["seed3"], None)


def test_held_out_routing_names_the_slot_of_the_held_out_modes_sign():
    signs = ppo_gru_astral.latent_labels(ppo_gru_astral.MODE_PRESETS["mirror4"], "force_sign")  # [+, -, +, -, -]
    eye = np.eye(3)

    def route(slot_of_mode):
        (routing,) = cartpole.held_out_routing(eye[slot_of_mode] * 0.8 + 0.05, signs, [4])
        return routing

    split = route([2, 1, 2, 1, 1])
    assert split == {"mode": 4, "slot": 1, "sign_slots": [1], "other_sign_slots": [2], "verdict": "its sign's slot"}
    assert route([2, 1, 2, 1, 2])["verdict"] == "the other sign's slot"
    assert route([1, 1, 1, 1, 1])["verdict"] == "a slot both signs use"  # collapsed onto one slot
    assert route([2, 1, 2, 1, 0])["verdict"] == "a slot no training mode uses"
    assert cartpole.held_out_routing(eye[[0, 1, 2]], signs[:3], []) == []


def test_the_final_line_says_what_the_slots_are_against_mode_and_sign_or_that_there_is_no_latent():
    slots = {"episode_nmi": 0.5, "gate_stability": 1.0, "probe_acc_w": 0.5, "probe_acc_h": 0.6}
    signed = {**slots, "episode_nmi_force_sign": 1.0, "probe_acc_w_force_sign": 1.0, "probe_acc_h_force_sign": 0.99}
    routing = [{"mode": 4, "slot": 2, "sign_slots": [2], "other_sign_slots": [3], "verdict": "its sign's slot"}]
    mirror = {"action_latent": "force_sign", "slots_deterministic": signed, "held_out_routing_deterministic": routing}
    line = cartpole.slot_summary(mirror)
    assert line.startswith("episode NMI vs mode 0.500, vs force sign 1.000;")
    assert (
        line.endswith("held-out mode 4 -> slot 2 (its sign's slot)")
        and "probe from h vs mode 0.600, vs force sign 0.990" in line
    )
    seed3 = {"action_latent": None, "slots_deterministic": slots, "held_out_routing_deterministic": []}
    line = cartpole.slot_summary(seed3)
    assert "force sign" not in line and "no action latent" in line


def test_heatmap_rows_name_their_physics_and_sign_and_mark_the_held_out_mode():
    modes = ppo_gru_astral.MODE_PRESETS["mirror4"]
    labels = [cartpole.mode_label(k, mode, [4]) for k, mode in enumerate(modes)]
    assert labels[0] == "0: g 9.8, l 0.5, force +1" and labels[1] == "1: g 9.8, l 0.5, force -1"
    assert labels[4] == "4: g 8.65, l 0.6, force -1 (held out)" and not any("held out" in x for x in labels[:4])


def test_linear_probe_accuracy():
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1, 2, 3], 200)
    episode = np.tile(np.repeat(np.arange(4), 50), 4)
    separable = np.eye(4)[labels] + 0.1 * rng.normal(size=(800, 4))
    assert cartpole.linear_probe_accuracy(separable, labels, episode) == 1.0
    assert cartpole.linear_probe_accuracy(rng.normal(size=(800, 4)), labels, episode) < 0.45
    assert math.isnan(cartpole.linear_probe_accuracy(separable, np.zeros(800, dtype=int), episode))


# --- the script -------------------------------------------------------------------------------------------


def test_smoke_all_mechanisms_on_mirror4_log_and_report(tmp_path):
    result = run_script(
        "ppo_gru_astral",
        *["--num-envs", "8", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"],
        *["--hidden-size", "16", "--slot-dim", "8", "--total-timesteps", "768"],
        *["--modes-preset", "mirror4", "--mode-share", "balanced", "--num-abstractions", "4"],
        *["--slot-init", "orthonormal", "--lambda-consistency", "0.1"],
        *["--diagnostics-every", "2", "--save-model", "--eval-episodes", "2", "--runs-dir", tmp_path],
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    scalars = logged_scalars(run_dir)
    expected = {
        "losses/grad_norm_ppo",
        "slots/episode_nmi",
        "slots/episode_nmi_force_sign",
        "slots/gate_stability",
        "slots/episode_consistency",
        "slots/eval_episode_nmi_deterministic",
        "slots/eval_episode_nmi_force_sign_deterministic",
        "slots/eval_probe_acc_w_deterministic",
        "slots/eval_probe_acc_h_sampled",
        "slots/eval_probe_acc_h_force_sign_sampled",
    } | {f"slots/grad_norm_{term}" for term in ppo_gru_astral.SlotTerms._fields}
    assert expected <= set(scalars), expected - set(scalars)
    assert max(v for _, v in scalars["debug/first_minibatch_ratio_error"]) < 1e-5
    assert max(v for _, v in scalars["debug/first_minibatch_gate_error"]) < 1e-5
    # the gradient-norm diagnostic runs on updates 1 and 3 of 3 (--diagnostics-every 2), the losses on every update
    assert [step for step, _ in scalars["slots/grad_norm_episode_consistency"]] == [256, 768]
    assert min(v for _, v in scalars["slots/grad_norm_episode_consistency"]) > 0
    assert [step for step, _ in scalars["losses/value_loss"]] == [256, 512, 768]
    report = load_json(os.path.join(run_dir, "eval.json"))
    assert report["held_out_modes"] == [4] and set(report["per_mode"]) == {"0", "1", "2", "3", "4"}
    per_mode = {k: v["deterministic"]["mean"] for k, v in report["per_mode"].items()}
    assert report["deterministic_mean"] == pytest.approx(np.mean([per_mode[k] for k in "0123"]))
    assert report["deterministic_held_out_mean"] == pytest.approx(per_mode["4"])
    assert report["action_latent"] == "force_sign"
    assert set(report["slots_deterministic"]) == {
        "episode_nmi",
        "gate_stability",
        "probe_acc_w",
        "probe_acc_h",
        "episode_nmi_force_sign",
        "probe_acc_w_force_sign",
        "probe_acc_h_force_sign",
    }
    # the held-out mode's routing is read off the mean gate weights of the report
    weights = np.array(report["slot_weights_deterministic"])
    (route,) = report["held_out_routing_deterministic"]
    assert route["mode"] == 4 and route["slot"] == weights[4].argmax()
    assert route["sign_slots"] == sorted({int(weights[k].argmax()) for k in (1, 3)})  # modes 1 and 3 push inverted too
    last = result.stdout.splitlines()[-1]
    nmi = report["slots_deterministic"]
    assert f"episode NMI vs mode {nmi['episode_nmi']:.3f}, vs force sign {nmi['episode_nmi_force_sign']:.3f}" in last
    assert f"held-out mode 4 -> slot {route['slot']} ({route['verdict']})" in last
    ckpt = torch.load(os.path.join(run_dir, "ppo_gru_astral.cleanrl_model"), weights_only=True)
    assert ckpt["args"]["slot_init"] == "orthonormal" and len(ckpt["modes"]) == 5
