"""Tests for cleanrl_astral/ppo_gru_astral.py: the ASTRAL module, its regularisers and metrics, and the recurrent
PPO around it; each would fail if the mechanism it names were wrong."""

import copy
import inspect
import math
import os
import re

import numpy as np
import pytest
import torch
import tyro
from helpers import assert_one_line_error, load_json, logged_scalars, only_run_dir, run_script
from ppo_gru_main import gae, given, run_main, update

import cleanrl_astral.ppo_gru_astral as ppo_gru_astral
import cleanrl_astral.ppo_gru_baseline as ppo_gru_baseline
from cleanrl_astral_utils import cartpole

TINY = [
    "--num-envs",
    "4",
    "--num-steps",
    "16",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--hidden-size",
    "16",
    "--slot-dim",
    "8",
]


def sharpened_agent(*args, **kwargs):
    """The agent of agent_from_args with its gate sharpened, so slot weights differ clearly between states."""
    agent = ppo_gru_astral.agent_from_args(*args, **kwargs)
    with torch.no_grad():
        agent.bank.gate[-1].weight.mul_(300.0)
    return agent


def rollout(memory="gru", oracle=False, num_envs=8, num_steps=64, seed=0, K=3):
    """The second rollout of a two-rollout training run with a sharpened gate, as its update received it, with the agent
    that acted it (trained once): it starts from a non-zero GRU state and crosses several episode boundaries. Rewards
    are not rescaled. A Rollout: (agent, batch, initial_state, episodes, advantages, returns, next_value)."""
    flags = ["--memory", memory, "--num-envs", num_envs, "--num-steps", num_steps, "--hidden-size", 32, "--seed", seed]
    flags += ["--total-timesteps", 2 * num_envs * num_steps, "--num-minibatches", 2, "--update-epochs", 2, "--no-norm-reward"]
    flags += ["--num-abstractions", K, "--slot-dim", 8]
    if oracle:
        flags.append("--oracle")
    return run_main(ppo_gru_astral, *flags, agent_from_args=sharpened_agent).rollouts[-1]


def update_args(**overrides):
    args = ppo_gru_astral.Args(num_minibatches=2, update_epochs=2)
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


def counts(modes, slots, num_modes, num_slots):
    joint = np.zeros((num_modes, num_slots))
    np.add.at(joint, (modes, slots), 1.0)
    return joint


# --- the ASTRAL module ------------------------------------------------------------------------------------


def test_shapes_and_gradient_reaches_every_parameter():
    agent, batch, initial_state, *_ = rollout()
    _, logprob, entropy, value, state, weights, probs = agent.get_action_and_value(
        batch["inputs"], initial_state, batch["starts"], batch["actions"]
    )
    assert torch.equal(weights, probs)  # the gate acts with its probabilities
    assert logprob.shape == value.shape == (64, 8) and state.shape == (8, 32) and weights.shape == (64, 8, 3)
    assert torch.allclose(weights.sum(-1), torch.ones(64, 8))
    assert agent.bank.slots.shape == (3, 8)
    loss = (
        -logprob.mean()
        + value.pow(2).mean()
        + ppo_gru_astral.weight_entropy(weights)
        - ppo_gru_astral.load_balance_entropy(weights)
        + ppo_gru_astral.orthogonality_penalty(agent.bank.slots)
    )
    loss.backward()
    for name, param in agent.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    groups = {name.split(".")[0] for name, _ in agent.named_parameters()}
    assert groups == {"encoder", "gru", "bank", "film", "actor", "critic"}


def test_slot_init_scale_and_uniform_initial_gate():
    torch.manual_seed(0)
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(num_abstractions=64, slot_dim=64), 4, 2, 3)
    assert agent.bank.slots.std().item() == pytest.approx(0.02, rel=0.1)
    _, weights, *_ = agent.bank(torch.randn(10, 128))
    assert torch.allclose(weights, torch.full_like(weights, 1 / 64), atol=2e-3)


def test_heads_see_only_the_film_modulated_state():
    torch.manual_seed(0)
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(hidden_size=16, num_abstractions=3, slot_dim=8), 4, 2, 3)
    with torch.no_grad():
        agent.bank.slots.normal_()
    hidden = torch.randn(5, 16)
    # changing z (through the gate weights) changes both heads
    modulated = [agent.film(hidden, agent.bank(hidden, torch.eye(3)[[k] * 5])[0]) for k in (0, 1)]
    a, b = (agent.actor(h) for h in modulated)
    va, vb = (agent.critic(h) for h in modulated)
    assert not torch.allclose(a, b) and not torch.allclose(va, vb)
    # with gamma forced to 0 and beta to a constant, h cannot reach the heads at all: no bypass path
    with torch.no_grad():
        agent.film.net.weight.zero_()
        agent.film.net.bias[:16] = -1.0
        agent.film.net.bias[16:] = 0.3
    x = torch.randn(1, 5, agent.input_dim)
    out1 = agent.get_action_and_value(x, torch.randn(5, 16), torch.zeros(1, 5), action=torch.zeros(1, 5, dtype=torch.long))
    out2 = agent.get_action_and_value(x * 3, torch.randn(5, 16), torch.zeros(1, 5), action=torch.zeros(1, 5, dtype=torch.long))
    assert torch.allclose(out1[1], out2[1]) and torch.allclose(out1[3], out2[3])
    assert not torch.allclose(out1[4], out2[4])  # while the GRU state itself did change


def test_clamped_weights_give_exactly_one_slot():
    torch.manual_seed(0)
    bank = ppo_gru_astral.AbstractionBank(16, 4, 8, 1.0)
    for k in range(4):
        z, *_ = bank(torch.randn(3, 16), torch.eye(4)[[k] * 3])
        assert torch.equal(z, bank.slots[k].expand(3, 8))


def test_regularisers_on_hand_made_inputs():
    uniform = torch.full((10, 4), 0.25)
    onehot = torch.eye(4)[[0, 1, 2, 3, 0, 1, 2, 3]]
    assert ppo_gru_astral.weight_entropy(uniform).item() == pytest.approx(math.log(4), abs=1e-6)
    assert ppo_gru_astral.weight_entropy(onehot).item() == pytest.approx(0.0, abs=1e-6)
    # one-hot per sample but balanced over the batch: maximal load-balance entropy
    assert ppo_gru_astral.load_balance_entropy(onehot).item() == pytest.approx(math.log(4), abs=1e-6)
    assert ppo_gru_astral.load_balance_entropy(torch.eye(4)[[2] * 8]).item() == pytest.approx(0.0, abs=1e-6)
    identical = torch.ones(3, 5)
    assert ppo_gru_astral.orthogonality_penalty(identical).item() == pytest.approx(6.0, abs=1e-5)  # 6 off-diagonal ones
    orthonormal = torch.linalg.qr(torch.randn(5, 5))[0][:3] * 7.0  # scale does not matter: rows are normalised
    assert ppo_gru_astral.orthogonality_penalty(orthonormal).item() == pytest.approx(0.0, abs=1e-6)


def test_temperature_sharpens_the_gate():
    torch.manual_seed(0)
    bank = ppo_gru_astral.AbstractionBank(16, 3, 8, 1.0)
    h = torch.randn(4, 16)
    _, w1, *_ = bank(h)
    bank.tau = 0.001
    _, w2, *_ = bank(h)
    assert ppo_gru_astral.weight_entropy(w2) < ppo_gru_astral.weight_entropy(w1)


def test_mutual_information_metric():
    modes = np.repeat([0, 1, 2], 99)
    mi, nmi = ppo_gru_astral.mutual_information(counts(modes, (modes + 1) % 3, 3, 3))
    assert mi == pytest.approx(math.log(3)) and nmi == pytest.approx(1.0)
    # slot independent of mode: every slot equally often in every mode
    mi, nmi = ppo_gru_astral.mutual_information(counts(modes, np.tile([0, 1, 2], 99), 3, 3))
    assert mi == pytest.approx(0.0, abs=1e-12) and nmi == pytest.approx(0.0, abs=1e-12)
    # two modes sharing a slot: I = H(mode) - H(mode | slot) = log 3 - (2/3) log 2
    mi, _ = ppo_gru_astral.mutual_information(counts(modes, np.minimum(modes, 1), 3, 3))
    assert mi == pytest.approx(math.log(3) - 2 / 3 * math.log(2))


# --- recurrent PPO with the gate --------------------------------------------------------------------------


@pytest.mark.parametrize("memory,oracle", [("gru", False), ("none", False), ("gru", True)])
def test_first_minibatch_ratio_and_gate_are_reproduced(memory, oracle):
    """The loop's update, on a rollout that starts from a non-zero state and crosses episode starts, replays its first
    minibatch with the acted log-probs (ratio 1) and gate weights."""
    agent, batch, initial_state, _, adv, ret, _ = rollout(memory, oracle)
    assert initial_state.abs().sum() > 0 and batch["starts"][1:].sum() > 0
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
    stats = update(ppo_gru_astral, agent, optimizer, batch, initial_state, adv, ret, update_args())
    assert stats["first_minibatch_ratio_error"] < 1e-5 and stats["first_minibatch_gate_error"] < 1e-5
    # the gate really varies along the batch, so reproducing it is not trivial
    assert batch["weights"].std(dim=(0, 1)).max() > 0.05


def test_replay_from_a_zero_state_or_without_resets_would_differ():
    """Replayed log-probs and gate weights equal the acted ones only when the replay starts from the saved state and
    zeroes it at episode starts."""
    agent, batch, initial_state, *_ = rollout()
    with torch.no_grad():
        _, right_logp, *_, right, _ = agent.get_action_and_value(
            batch["inputs"], initial_state, batch["starts"], batch["actions"]
        )
        _, zero_logp, *_, wrong, _ = agent.get_action_and_value(
            batch["inputs"], torch.zeros_like(initial_state), batch["starts"], batch["actions"]
        )
        _, no_reset_logp, *_ = agent.get_action_and_value(
            batch["inputs"], initial_state, torch.zeros_like(batch["starts"]), batch["actions"]
        )
    assert (right - batch["weights"]).abs().max() < 1e-5 and (wrong - batch["weights"]).abs().max() > 1e-3
    assert (right_logp - batch["logprobs"]).abs().max() < 1e-5
    assert (zero_logp - batch["logprobs"]).abs().max() > 1e-4 and (no_reset_logp - batch["logprobs"]).abs().max() > 1e-4


def test_a_run_and_an_evaluation_open_with_no_previous_action_or_reward():
    """Every env starts an episode at the run's first step and at the evaluation's first: that input holds the
    observation alone (no previous action, previous reward 0), starts[0] is 1 and the GRU state is zero; the next
    step's input holds the action taken."""
    flags = ["--num-envs", 4, "--num-steps", 8, "--hidden-size", 16, "--total-timesteps", 32, "--num-minibatches", 2]
    _, batch, initial_state, *_ = run_main(ppo_gru_astral, *flags).rollouts[0]
    assert torch.all(batch["starts"][0] == 1) and torch.all(initial_state == 0)
    assert batch["inputs"][0, :, 4:].abs().sum() == 0
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(hidden_size=16, slot_dim=8), 4, 2, 3)
    seen = []
    act = agent.get_action_and_value

    def spy(x, *rest, **kw):
        seen.append(x.clone())
        return act(x, *rest, **kw)

    agent.get_action_and_value = spy
    envs = ppo_gru_astral.NonStationaryCartPole(3, ppo_gru_astral.MODE_PRESETS["seed3"], max_episode_steps=5)
    ppo_gru_astral.first_episodes(agent, envs, seed=0, deterministic=True)
    assert seen[0][0, :, 4:].abs().sum() == 0
    assert torch.all(seen[1][0, :, 4:6].sum(-1) == 1)


def test_hidden_state_and_prev_inputs_are_zero_at_episode_starts():
    agent, batch, initial_state, *_ = rollout()
    starts = batch["starts"].bool()
    inputs = batch["inputs"]
    assert starts[1:].sum() > 0
    assert inputs[..., 4:7][starts].abs().sum() == 0 and torch.all(inputs[..., 6][~starts] == 1.0)
    with torch.no_grad():
        hidden, _ = agent.unroll(inputs, initial_state, batch["starts"])
        features = agent.encoder(inputs)
        fresh = agent.gru(features.reshape(-1, 32), torch.zeros(features[..., 0].numel(), 32)).reshape(features.shape)
    assert torch.allclose(hidden[starts], fresh[starts], atol=1e-6)
    assert (hidden[~starts] - fresh[~starts]).abs().amax(-1).min() > 1e-4


def test_unroll_equals_stepping_the_gru_module_with_resets():
    """unroll calls torch.gru_cell on the module's weights directly; it must equal nn.GRUCell step by step, with the
    state zeroed exactly where starts = 1 (random biases, so swapped ih/hh weights or biases would show)."""
    torch.manual_seed(0)
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(hidden_size=16), 4, 2, 3)
    with torch.no_grad():
        for p in agent.gru.parameters():
            p.normal_()
    x = torch.randn(7, 3, agent.input_dim)
    state = torch.randn(3, 16)
    starts = torch.zeros(7, 3)
    starts[0, 1] = starts[3, 0] = starts[5, 2] = 1.0
    hidden, last = agent.unroll(x, state, starts)
    h = state
    expected = []
    for t in range(7):
        h = agent.gru(agent.encoder(x[t]), h * (1 - starts[t]).unsqueeze(-1))
        expected.append(h)
    torch.testing.assert_close(hidden, torch.stack(expected), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last, expected[-1], rtol=1e-5, atol=1e-6)


def test_environment_is_the_baselines():
    """The env is copied from ppo_gru_baseline.py (single-file rule): the same presets, held-out modes and action latents,
    and identical seeds and actions give identical trajectories, so the two scripts are compared on the same task."""
    for name in ("MODE_PRESETS", "MODE_NAMES", "HELD_OUT_MODES", "ACTION_LATENT"):
        assert getattr(ppo_gru_astral, name) == getattr(ppo_gru_baseline, name), name
    presets = [
        ("inverted4", {}),
        ("inverted4", {"hide_velocity": True}),
        ("inverted4", {"switch_prob": 0.3}),
        ("inverted4", {"fixed_mode": 3}),
        ("mirror4", {"held_out": [4], "switch_prob": 0.3}),
        ("mirror4", {"held_out": [4], "mode_share": "balanced"}),
    ]
    for preset, kwargs in presets:
        envs = [mod.NonStationaryCartPole(6, mod.MODE_PRESETS[preset], **kwargs) for mod in (ppo_gru_astral, ppo_gru_baseline)]
        outs = [env.reset(seed=5) for env in envs]
        rng = np.random.default_rng(0)
        for _ in range(300):
            assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][-1]["mode"], outs[1][-1]["mode"])
            action = rng.integers(2, size=6)
            outs = [env.step(action) for env in envs]
            for a, b in zip(outs[0][1:4], outs[1][1:4]):
                assert np.array_equal(a, b)


@pytest.mark.parametrize("module", [ppo_gru_astral, ppo_gru_baseline])
def test_info_names_the_mode_that_governs_the_next_step(module):
    """info["mode_name"] beside info["mode"], in both scripts: seed3's modes carry the plan's names; every preset's names
    tell its physics apart (one name per mode, "inverted" exactly where the force sign is -1, the same word for the same
    gravity and length); modes without names are named by their physics."""
    assert module.MODE_NAMES["seed3"] == ["default", "easy", "hard"]
    for preset, modes in module.MODE_PRESETS.items():
        names = module.MODE_NAMES[preset]
        assert len(names) == len(modes) and len(set(names)) == len(names), preset
        for name, (gravity, length, sign) in zip(names, modes):
            assert ("inverted" in name) == (sign < 0), (preset, name)
            for other, (other_gravity, other_length, _) in zip(names, modes):
                same_physics = (gravity, length) == (other_gravity, other_length)
                assert same_physics == (name.replace("inverted", "").strip() == other.replace("inverted", "").strip())
    names = np.array(module.MODE_NAMES["mirror4"])
    envs = module.NonStationaryCartPole(6, module.MODE_PRESETS["mirror4"], switch_prob=0.3, held_out=[4], mode_names=names)
    info = envs.reset(seed=0)[1]
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):
        assert list(info["mode_name"]) == list(names[info["mode"]])
        seen.update(info["mode_name"].tolist())
        info = envs.step(rng.integers(2, size=6))[-1]
    assert seen == set(names[:4])  # switches reach every training mode, never the held-out one
    unnamed = module.NonStationaryCartPole(2, [(5.0, 0.9, -1.0)])
    assert list(unnamed.reset(seed=0)[1]["mode_name"]) == ["g 5, l 0.9, force -1"] * 2


def mode_steps(envs, steps=3000, seed=0):
    """How many steps each mode governed, over `steps` steps of random actions."""
    info = envs.reset(seed=seed)[1]
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(envs.gravity), dtype=int)
    for _ in range(steps):
        np.add.at(counts, info["mode"], 1)
        info = envs.step(rng.integers(2, size=envs.num_envs))[-1]
    return counts


def test_balanced_share_gives_every_training_mode_exactly_its_share():
    """Uniform draws per episode give the long-lived modes most steps (mode 1 of mirror4, inverted, ends fast);
    balanced pinning gives each of the M training modes exactly 1/M, and the held-out mode none."""
    modes = ppo_gru_astral.MODE_PRESETS["mirror4"]
    balanced = mode_steps(ppo_gru_astral.NonStationaryCartPole(8, modes, held_out=[4], mode_share="balanced"))
    assert balanced.tolist() == [6000, 6000, 6000, 6000, 0]
    uniform = mode_steps(ppo_gru_astral.NonStationaryCartPole(8, modes, held_out=[4]))
    assert uniform.sum() == 24000 and uniform[4] == 0 and uniform[:4].min() > 0 and uniform[:4].max() != uniform[:4].min()
    assert ppo_gru_astral.NonStationaryCartPole(6, modes, held_out=[4], mode_share="balanced").pinned.tolist() == [
        0,
        1,
        2,
        3,
        0,
        1,
    ]


def test_held_out_mode_is_never_drawn_in_training_but_can_be_evaluated():
    modes = ppo_gru_astral.MODE_PRESETS["mirror4"]
    # per-step switches draw modes about 3,000 times per env here; none of them is the held-out mode
    counts = mode_steps(ppo_gru_astral.NonStationaryCartPole(16, modes, held_out=[4], switch_prob=0.2))
    assert counts[4] == 0 and counts[:4].min() > 0
    assert (
        mode_steps(ppo_gru_astral.NonStationaryCartPole(16, modes), steps=300)[4] > 0
    )  # the draw does reach index 4 otherwise
    assert mode_steps(ppo_gru_astral.NonStationaryCartPole(4, modes, held_out=[4], fixed_mode=4), steps=50).tolist() == [
        0,
        0,
        0,
        0,
        200,
    ]


def test_presets_parse_in_both_scripts():
    """mirror4 is two physics x force sign ±1 (training modes 0-3) plus a held-out mode, in both scripts."""
    for mod in (ppo_gru_astral, ppo_gru_baseline):
        args = tyro.cli(mod.Args, args=["--modes-preset", "mirror4", "--mode-share", "balanced", "--num-envs", "8"])
        assert (args.modes_preset, args.mode_share) == ("mirror4", "balanced") and mod.Args().mode_share == "uniform"
        mod.validate(args)
        assert set(mod.HELD_OUT_MODES) == set(mod.MODE_PRESETS)
        modes = mod.MODE_PRESETS["mirror4"]
        assert len(modes) == 5 and mod.HELD_OUT_MODES["mirror4"] == [4]
        assert {(g, length) for g, length, _ in modes[:4]} == {modes[0][:2], modes[2][:2]} and [s for *_, s in modes[:4]] == [
            1,
            -1,
            1,
            -1,
        ]
        assert modes[4] not in modes[:4]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--fixed-mode", "5"], "--fixed-mode 5 is out of range; there are 5 modes"),
        (["--fixed-mode", "4"], "--fixed-mode 4 is held out of training in mirror4"),
        (["--mode-share", "balanced", "--num-envs", "2", "--num-minibatches", "1"], "multiple of the 4 training modes"),
        (["--mode-share", "balanced", "--num-envs", "8", "--fixed-mode", "0"], "cannot be combined with --fixed-mode"),
        (
            ["--mode-share", "balanced", "--num-envs", "8", "--switch-prob", "0.1"],
            "cannot be combined with --fixed-mode or --switch-prob",
        ),
    ],
)
def test_environment_flags_are_refused_the_same_way_in_both_scripts(flags, message):
    for mod in (ppo_gru_astral, ppo_gru_baseline):
        with pytest.raises(ValueError, match=re.escape(message)):
            mod.validate(tyro.cli(mod.Args, args=["--modes-preset", "mirror4", *flags]))


def test_truncated_episodes_are_bootstrapped_and_logged():
    """With a 5-step limit no CartPole episode can fail, so every episode is a truncation: 2 envs x 12 steps finish 4
    episodes of return 5, at steps 4 and 9, whose last rewards are bootstrapped and whose envs restart right after."""
    envs = ppo_gru_astral.NonStationaryCartPole(2, [(9.8, 0.5, 1.0)], max_episode_steps=5)
    flags = ["--num-envs", 2, "--num-steps", 12, "--total-timesteps", 24, "--num-minibatches", 1, "--hidden-size", 16]
    run = run_main(ppo_gru_astral, *flags, "--slot-dim", 8, "--no-norm-reward", NonStationaryCartPole=given(envs))
    _, batch, _, episodes, *_ = run.rollouts[0]
    assert torch.all(batch["rewards"][[4, 9]] != 1.0) and torch.all(batch["starts"][[5, 10]] == 1.0)
    assert sorted(episodes) == [(5.0, 5, 0, 4)] * 2 + [(5.0, 5, 0, 9)] * 2


@pytest.mark.parametrize("next_start", [0.0, 1.0])
def test_gae_matches_its_definition_with_discounting_and_bootstrapping(forward_gae, next_start):
    gamma = 0.9
    lam = 0.5
    rewards = torch.tensor([[1.0, -1.0], [2.0, 0.5], [3.0, 2.0], [4.0, -3.0], [0.5, 1.0]])
    values = torch.tensor([[10.0, 1.0], [20.0, -2.0], [30.0, 3.0], [40.0, 0.0], [5.0, 6.0]])
    starts = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    next_value = torch.tensor([50.0, -7.0])
    next_start_t = torch.tensor([next_start, 0.0])
    adv, ret = gae(ppo_gru_astral, rewards, values, starts, next_value, next_start_t, gamma, lam)
    for n in range(2):
        continues = [1.0 - starts[t + 1, n].item() for t in range(4)] + [1.0 - next_start_t[n].item()]
        expected = forward_gae(rewards[:, n].tolist(), values[:, n].tolist() + [next_value[n].item()], continues, gamma, lam)
        assert adv[:, n].tolist() == pytest.approx(expected, rel=1e-6)
    assert torch.allclose(ret, adv + values)


def test_the_advantages_a_run_updates_with_are_gae_of_its_rollout(forward_gae):
    """The loop's GAE, in a run: the advantages the first update received are GAE of the rollout it acted, summed forwards
    with the run's gamma and lambda, episodes cut where the next step opens one, the last step bootstrapping from the
    value after the rollout unless the next rollout opens with a new episode; the returns are advantages + values."""
    flags = ["--num-envs", 4, "--num-steps", 32, "--hidden-size", 16, "--total-timesteps", 2 * 4 * 32, "--no-norm-reward"]
    run = run_main(ppo_gru_astral, *flags, "--slot-dim", 8)
    _, batch, _, _, advantages, returns, next_value = run.rollouts[0]
    next_start = run.rollouts[1].batch["starts"][0]
    args = ppo_gru_astral.Args()
    assert batch["starts"][1:].sum() > 0
    for n in range(4):
        continues = (1.0 - torch.cat([batch["starts"][1:, n], next_start[n : n + 1]])).tolist()
        values = batch["values"][:, n].tolist() + [next_value[n].item()]
        expected = forward_gae(batch["rewards"][:, n].tolist(), values, continues, args.gamma, args.gae_lambda)
        assert advantages[:, n].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-4)
    assert torch.equal(returns, advantages + batch["values"])


def test_reward_scaler_is_the_baselines():
    rng = np.random.default_rng(1)
    ours = ppo_gru_astral.RewardScaler(4, 0.99)
    theirs = ppo_gru_baseline.RewardScaler(4, 0.99)
    for _ in range(20):
        rewards = rng.normal(1.0, 1.0, 4)
        dones = rng.random(4) < 0.1
        assert np.array_equal(ours(rewards, dones.copy()), theirs(rewards, dones.copy()))


def test_defaults_are_the_baselines_but_the_rollout_shape():
    """Every flag the two scripts share has the same default (PPO, network, environment) except the rollout shape:
    ASTRAL keeps 32 envs x 128 steps, where it learns `seed3 --hide-velocity` in 10/10 seeds against 7/10 with the
    baseline's 128 x 32 (docs/ppo_gru_astral.md). The batch is the same 4096 samples."""
    ours = vars(ppo_gru_astral.Args())
    theirs = vars(ppo_gru_baseline.Args())
    shared = sorted(set(ours) & set(theirs) - {"exp_name", "num_envs", "num_steps"})
    assert {"num_minibatches", "update_epochs", "learning_rate", "hidden_size", "ent_coef"} <= set(shared)
    assert {name: ours[name] for name in shared} == {name: theirs[name] for name in shared}
    assert (ours["num_envs"], ours["num_steps"]) == (32, 128) and theirs["num_envs"] * theirs["num_steps"] == 32 * 128


# --- the PPO update, term by term (plus the slot regularisers) --------------------------------------------


class ScriptedAgent(torch.nn.Module):
    """Stands in for the agent in the loop's update: the log-prob, entropy and value of every (step, env) are free
    parameters, so the gradient the update's loss sends to them is the loss' derivative with respect to each output.
    inputs[..., 0] and initial_state[:, 0] hold the env index, so each call records which envs its minibatch holds.
    Its gate weights are uniform constants and its slots orthonormal: the slot regularisers add nothing here."""

    def __init__(self, logprobs, values, entropy, num_abstractions=3):
        super().__init__()
        self.logprob, self.value, self.entropy = (torch.nn.Parameter(t.clone()) for t in (logprobs, values, entropy))
        self.bank = torch.nn.Module()
        self.bank.slots = torch.nn.Parameter(torch.eye(num_abstractions))
        self.minibatches = []

    def get_action_and_value(self, x, state, starts, action=None):
        mb = x[0, :, 0].long()
        assert torch.all(x[..., 0] == x[:1, :, 0]) and torch.equal(state[:, 0].long(), mb)  # inputs and state agree
        self.minibatches.append(mb.tolist())
        weights = torch.full((*x.shape[:2], len(self.bank.slots)), 1.0 / len(self.bank.slots))
        return ppo_gru_astral.ActionAndValue(
            action, self.logprob[:, mb], self.entropy[:, mb], self.value[:, mb], state, weights, weights
        )


class GradSpy:
    """An optimizer that never moves the parameters: each step() records the gradients (by parameter name), so a
    test reads the derivatives of the loss the update minimised, and every minibatch and run sees the same agent."""

    def __init__(self, module):
        self.named = list(module.named_parameters())
        self.grads = []

    def zero_grad(self):
        for _, p in self.named:
            p.grad = None

    def step(self):
        self.grads.append({n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in self.named})


def scripted_update(advantages, returns, old_values, new_values=None, **overrides):
    """The loop's update on a ScriptedAgent whose log-probs equal the acted ones (ratio 1), without gradient clipping:
    returns (agent, spy, stats)."""
    T, N = advantages.shape
    env_index = torch.arange(N, dtype=torch.float32)
    batch = {
        "inputs": env_index.expand(T, N)[..., None].clone(),
        "starts": torch.zeros(T, N),
        "actions": torch.zeros(T, N, dtype=torch.long),
        "logprobs": torch.full((T, N), -0.7),
        "values": old_values,
        "weights": torch.full((T, N, 3), 1.0 / 3),
        "ages": torch.zeros(T, N),
    }
    new_values = old_values if new_values is None else new_values
    agent = ScriptedAgent(batch["logprobs"], new_values, torch.full((T, N), 0.6))
    spy = GradSpy(agent)
    args = update_args(max_grad_norm=1e9, **overrides)
    stats = update(ppo_gru_astral, agent, spy, batch, env_index[:, None], advantages, returns, args)
    return agent, spy, stats


def test_entropy_bonus_lowers_the_loss():
    """The loss is pg_loss - ent_coef * H + vf_coef * v_loss + slot terms (H the minibatch-mean entropy): its
    derivative with respect to each sample's entropy is -ent_coef / (samples in the minibatch). A + sign would
    minimise entropy, so training would drive the policy deterministic instead of exploring."""
    gen = torch.Generator().manual_seed(0)
    T = 4
    N = 2
    adv = torch.randn(T, N, generator=gen)
    ret = torch.randn(T, N, generator=gen)
    _, spy, stats = scripted_update(adv, ret, torch.zeros(T, N), num_minibatches=1, update_epochs=1, ent_coef=0.1)
    assert len(spy.grads) == 1 and stats["entropy"] == pytest.approx(0.6)
    torch.testing.assert_close(spy.grads[0]["entropy"], torch.full((T, N), -0.1 / (T * N)))


def test_value_loss_takes_the_larger_of_the_clipped_and_unclipped_errors():
    """Clipped value loss (PPO2): 0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, +-eps) - R)^2)). On a hand case
    where the two errors differ, the loss and its gradient follow the larger one; with min, the clipping would loosen
    the value update instead of bounding it (loss 0.34375 here)."""
    old = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    new = torch.tensor([[0.5, 1.0], [0.1, 0.5]])
    ret = torch.tensor([[1.0, -1.0], [1.0, 0.0]])
    # per sample: (0.5-1)^2=0.25 vs (0.2-1)^2=0.64 | (1+1)^2=4 vs (0.2+1)^2=1.44 | 0.81 both | 0.25 vs (0.8-0)^2=0.64
    _, spy, stats = scripted_update(
        torch.ones(2, 2), ret, old, new, num_minibatches=1, update_epochs=1, clip_coef=0.2, vf_coef=0.5, clip_vloss=True
    )
    assert stats["value_loss"] == pytest.approx(0.5 * (0.64 + 4.0 + 0.81 + 0.64) / 4)
    # d/dV of vf_coef * v_loss: zero where the clipped error wins (its clip is saturated), 2 (V - R) / 4 / 2 otherwise
    torch.testing.assert_close(spy.grads[0]["value"], 0.5 * torch.tensor([[0.0, 0.5], [-0.225, 0.0]]))


@pytest.mark.parametrize("norm_adv", [True, False])
def test_advantages_are_normalised_within_each_minibatch(norm_adv):
    """At ratio 1 the derivative of the clipped surrogate with respect to a sample's log-prob is -A / (samples in
    the minibatch), A the advantage the loss used: with --norm-adv, A is standardised over its own minibatch
    (mean 0, std 1); without it, the raw advantage. Envs 0-1 and 2-3 have advantages of different scale and offset,
    so per-minibatch and whole-batch normalisation differ."""
    gen = torch.Generator().manual_seed(0)
    T = 3
    N = 4
    adv = torch.randn(T, N, generator=gen) * torch.tensor([1.0, 1.0, 20.0, 20.0]) + torch.tensor([5.0, 5.0, -40.0, 9.0])
    agent, spy, _ = scripted_update(
        adv, torch.zeros(T, N), torch.zeros(T, N), num_minibatches=2, update_epochs=1, norm_adv=norm_adv
    )
    assert len(spy.grads) == len(agent.minibatches) == 2
    for mb, grads in zip(agent.minibatches, spy.grads):
        a = adv[:, mb]
        used = (a - a.mean()) / (a.std() + 1e-8) if norm_adv else a
        if norm_adv:
            whole = (a - adv.mean()) / (adv.std() + 1e-8)
            assert (used - whole).abs().max() > 0.1  # the check below tells the two apart
        expected = torch.zeros(T, N)
        expected[:, mb] = -used / a.numel()
        torch.testing.assert_close(grads["logprob"], expected)


def test_each_epoch_visits_every_env_exactly_once():
    """Minibatches hold whole environments: in every epoch the minibatches partition the envs (a reshuffled
    permutation cut into consecutive slices). Taking the same first slice each time would train on a quarter of
    the rollout, several times over."""
    T = 2
    N = 8
    agent, spy, _ = scripted_update(torch.ones(T, N), torch.zeros(T, N), torch.zeros(T, N), num_minibatches=4, update_epochs=3)
    assert len(agent.minibatches) == len(spy.grads) == 12
    for epoch in range(3):
        minibatches = agent.minibatches[4 * epoch : 4 * epoch + 4]
        assert [len(mb) for mb in minibatches] == [2] * 4
        assert sorted(i for mb in minibatches for i in mb) == list(range(N)), minibatches


def synthetic_batch(agent, T=6, N=4, seed=0):
    """A batch as the rollout stores it, acted by `agent` on random inputs (episodes restart mid-rollout),
    with random advantages and returns: (batch, initial_state, advantages, returns)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(T, N, agent.input_dim, generator=gen)
    starts = torch.zeros(T, N)
    starts[0] = 1.0
    starts[T // 2, ::2] = 1.0
    initial_state = torch.zeros(N, agent.hidden_size)
    actions = torch.randint(0, 2, (T, N), generator=gen)
    with torch.no_grad():
        _, logprobs, _, values, _, weights, _ = agent.get_action_and_value(inputs, initial_state, starts, actions)
    ages = torch.zeros(T, N)  # steps since the episode's start: the first episode is BURN_IN old when the batch opens
    for t in range(T):
        ages[t] = 0 if t == 0 else (ages[t - 1] + 1) * (1 - starts[t])
    ages[:, ~starts[T // 2].bool()] += ppo_gru_astral.BURN_IN
    batch = {
        "inputs": inputs,
        "starts": starts,
        "actions": actions,
        "logprobs": logprobs,
        "values": values,
        "weights": weights,
        "ages": ages,
        "modes": torch.arange(N).expand(T, N) % 2,
    }
    return batch, initial_state, torch.randn(T, N, generator=gen), torch.randn(T, N, generator=gen)


def test_target_kl_stops_the_update_after_the_epoch_that_exceeds_it():
    """--target-kl ends the update after the first epoch whose last minibatch's approx_kl exceeds it. With a tiny
    target, the first epoch's second minibatch already sees a moved policy, so only that epoch's 2 Adam steps are
    taken (of 2 minibatches x 4 epochs = 8); without a target, or with a huge one, all 8 are."""
    torch.manual_seed(0)
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(hidden_size=16, num_abstractions=3, slot_dim=8), 4, 2, 3)
    batch, initial_state, adv, ret = synthetic_batch(agent)
    steps = {}
    for target_kl in (None, 1e-8, 1e3):
        trained = copy.deepcopy(agent)
        optimizer = torch.optim.Adam(trained.parameters(), lr=1e-2)
        args = update_args(num_minibatches=2, update_epochs=4, target_kl=target_kl)
        stats = update(ppo_gru_astral, trained, optimizer, batch, initial_state, adv, ret, args)
        steps[target_kl] = int(optimizer.state[trained.actor[-1].weight]["step"])
        if target_kl == 1e-8:
            assert stats["approx_kl"] > target_kl
    assert steps == {None: 8, 1e-8: 2, 1e3: 8}


def test_the_gradient_norm_diagnostic_changes_nothing_but_what_is_logged():
    """--diagnostics-every skips the per-term gradient norms (one extra backward pass per term) on most updates: with or
    without them, the update takes the same steps to the same parameters and reports the same losses."""
    torch.manual_seed(0)
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(hidden_size=16, num_abstractions=3, slot_dim=8), 4, 2, 3)
    batch, initial_state, adv, ret = synthetic_batch(agent)
    trained = {}
    stats = {}
    for diagnostics in (True, False):
        trained[diagnostics] = copy.deepcopy(agent)
        optimizer = torch.optim.Adam(trained[diagnostics].parameters(), lr=1e-2)
        np.random.seed(0)
        args = update_args(lambda_consistency=0.1, diagnostics_every=2)
        iteration = 2  # --diagnostics-every 2: the norms on updates 1, 3, ...
        if diagnostics:
            iteration = 3
        stats[diagnostics] = update(
            ppo_gru_astral, trained[diagnostics], optimizer, batch, initial_state, adv, ret, args, iteration
        )
    norms = {key for key in stats[True] if key.startswith("grad_norm_")}
    assert norms == {"grad_norm_ppo", *(f"grad_norm_{term}" for term in ppo_gru_astral.SlotTerms._fields)}
    assert {key: v for key, v in stats[True].items() if key not in norms} == stats[False]
    for (name, p), q in zip(trained[True].named_parameters(), trained[False].parameters()):
        assert torch.equal(p, q), name


def test_the_episode_consistency_at_weight_0_is_computed_only_as_a_diagnostic():
    """At --lambda-consistency 0 the term is computed (and logged) only with --diagnostics-every; computed or not, the
    update takes the same steps to the same parameters."""
    torch.manual_seed(0)
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(hidden_size=16, num_abstractions=3, slot_dim=8), 4, 2, 3)
    batch, initial_state, adv, ret = synthetic_batch(agent)
    trained = {}
    stats = {}
    for every in (0, 10):
        trained[every] = copy.deepcopy(agent)
        optimizer = torch.optim.Adam(trained[every].parameters(), lr=1e-2)
        np.random.seed(0)
        args = update_args(diagnostics_every=every)
        # the second update: without the gradient norms, which --diagnostics-every 10 takes on updates 1, 11, ...
        stats[every] = update(ppo_gru_astral, trained[every], optimizer, batch, initial_state, adv, ret, args, iteration=2)
    assert ppo_gru_astral.Args().diagnostics_every == 0 and ppo_gru_astral.Args().lambda_consistency == 0
    assert "episode_consistency" not in stats[0] and "episode_consistency" in stats[10]
    assert {key: v for key, v in stats[10].items() if key != "episode_consistency"} == stats[0]
    for (name, p), q in zip(trained[10].named_parameters(), trained[0].parameters()):
        assert torch.equal(p, q), name


SLOT_LAMBDAS = ("lambda_w_ent", "lambda_lb", "lambda_orth", "lambda_consistency")


@pytest.mark.parametrize(
    "term,flag,sign,sharpen_gate",
    [
        ("weight_entropy", "lambda_w_ent", -1.0, False),
        ("weight_entropy", "lambda_w_ent", 1.0, True),
        ("load_balance_entropy", "lambda_lb", -1.0, False),
        ("orthogonality", "lambda_orth", 1.0, False),
        ("episode_consistency", "lambda_consistency", -1.0, False),
    ],
)
def test_slot_regularisers_enter_the_loss_with_their_sign_and_lambda(term, flag, sign, sharpen_gate):
    """The update minimises ... - lambda_w_ent * H(p) (the plan's sign; + with --sharpen-gate) - lambda_lb * H(mean p)
    + lambda_orth * ||AA^T - I||^2 - lambda_consistency * I(episode; slot) (docs/ppo_gru_astral.md), p the gate
    probabilities replayed with gradient in the update. So raising one lambda by 0.5 adds 0.5 * sign * (the gradient of
    its term, computed here from a fresh replay) to every parameter's gradient, and the gate terms reach the gate's
    parameters. A flipped sign (either default of the gate entropy), a lambda that does not scale its term, or the acted
    (detached) weights batch["weights"] would each change that difference; and the logged grad norm of the term is the
    norm of exactly that difference."""
    torch.manual_seed(0)
    agent = ppo_gru_astral.Agent(ppo_gru_astral.Args(hidden_size=16, slot_dim=8), 4, 2, 3)
    with torch.no_grad():
        agent.bank.gate[-1].weight.mul_(30.0)  # a gate far from uniform, where the entropies have a gradient
        agent.bank.slots.normal_()  # slots far from orthogonal
    batch, initial_state, adv, ret = synthetic_batch(agent)

    def gradients(lam):
        np.random.seed(0)  # the same shuffle in both runs
        spy = GradSpy(agent)
        # --diagnostics-every 1: the update also logs each term's gradient norm
        args = update_args(
            num_minibatches=1, update_epochs=1, max_grad_norm=1e9, sharpen_gate=sharpen_gate, diagnostics_every=1
        )
        for name in SLOT_LAMBDAS:
            setattr(args, name, 0.0)
        setattr(args, flag, lam)
        stats = update(ppo_gru_astral, agent, spy, batch, initial_state, adv, ret, args)
        (grads,) = spy.grads
        return grads, stats

    without, _ = gradients(0.0)
    with_term, stats = gradients(0.5)
    probs = agent.get_action_and_value(batch["inputs"], initial_state, batch["starts"], batch["actions"])[6]
    value = {
        "weight_entropy": lambda: ppo_gru_astral.weight_entropy(probs),
        "load_balance_entropy": lambda: ppo_gru_astral.load_balance_entropy(probs),
        "orthogonality": lambda: ppo_gru_astral.orthogonality_penalty(agent.bank.slots),
        "episode_consistency": lambda: ppo_gru_astral.episode_consistency(probs, batch["starts"], batch["ages"]),
    }[term]()
    names, params = zip(*agent.named_parameters())
    expected = torch.autograd.grad(value, params, allow_unused=True)
    expected = {n: torch.zeros_like(p) if g is None else g for n, p, g in zip(names, params, expected)}
    gate = "bank.gate.2.weight" if term != "orthogonality" else "bank.slots"
    assert expected[gate].abs().max() > 1e-4  # the term has a gradient where it should act
    for name in names:
        torch.testing.assert_close(with_term[name] - without[name], 0.5 * sign * expected[name], atol=2e-6, rtol=1e-3)
    norm = torch.sqrt(sum((g**2).sum() for g in expected.values())).item()
    assert stats[f"grad_norm_{term}"] == pytest.approx(0.5 * norm, rel=1e-4)
    assert stats["grad_norm_ppo"] > 0


# --- script-level behaviour -------------------------------------------------------------------------------


def test_smoke_save_evaluate_json_and_heatmap(tmp_path):
    result = run_script(
        "ppo_gru_astral",
        *TINY,
        "--total-timesteps",
        "256",
        "--runs-dir",
        str(tmp_path),
        "--save-model",
        "--eval-episodes",
        "2",
        "--modes-preset",
        "inverted4",
        "--num-abstractions",
        "5",
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    report = load_json(os.path.join(run_dir, "eval.json"))
    weights = np.array(report["slot_weights_deterministic"])
    assert weights.shape == (4, 5) and np.allclose(weights.sum(1), 1.0, atol=1e-5)
    assert 0.0 <= report["mode_slot_nmi_deterministic"] <= 1.0
    assert open(os.path.join(run_dir, "slot_heatmap.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    for tag in (
        "slots/mode_slot_nmi",
        "slots/mode_slot_mi",
        "slots/usage_w0",
        "slots/weight_entropy",
        "slots/load_balance_entropy",
        "slots/orthogonality",
        "slots/slot_loss",
        "charts/episodic_return",
    ):
        assert logged_scalars(run_dir).get(tag, []), tag
    assert any(logged_scalars(run_dir).get(f"slots/mode{k}_w4", []) for k in range(4))
    assert any(logged_scalars(run_dir).get(f"charts/episodic_return_mode{k}", []) for k in range(4))
    assert max(v for _, v in logged_scalars(run_dir).get("debug/first_minibatch_ratio_error", [])) < 1e-5
    assert max(v for _, v in logged_scalars(run_dir).get("debug/first_minibatch_gate_error", [])) < 1e-5
    diagnostics = [tag for tag in logged_scalars(run_dir) if "grad_norm" in tag or tag == "slots/episode_consistency"]
    assert diagnostics == []  # off by default (--diagnostics-every)
    model = os.path.join(run_dir, "ppo_gru_astral.cleanrl_model")
    # what tta_gating reads from a saved model
    ckpt = torch.load(model, weights_only=True)
    assert (
        ckpt["script"] == "ppo_gru_astral"
        and ckpt["format"] == ppo_gru_astral.CHECKPOINT_FORMAT
        and ckpt["state_dict"]["bank.slots"].shape == (5, 8)
    )
    assert (
        {"hide_velocity", "hidden_size", "memory", "oracle", "num_abstractions", "slot_dim", "tau", "norm_reward", "gamma"}
        <= set(ckpt["args"])
        and ckpt["reward_scaler"]["var"] > 0
        and ckpt["run_name"] == os.path.basename(run_dir)
    )
    # inverted4's action latent is the force sign; it has no held-out mode to route
    assert report["action_latent"] == "force_sign" and report["held_out_routing_deterministic"] == []
    assert "episode_nmi_force_sign" in report["slots_sampled"]
    out = ppo_gru_astral.evaluate(model, episodes_per_mode=2, modes=[(5.0, 0.9, 1.0)])
    assert out["slot_weights"].shape == (1, 5) and out["slot_counts"].sum() == sum(out["returns"][0])
    with pytest.raises(ValueError, match="not written by ppo_gru_baseline"):
        ppo_gru_baseline.evaluate(model)


PHASE_C_FROZEN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "benchmark/out/astral_study/phase_C/runs/c0__g0_base__s6/NonStationaryCartPole__frozen__6__1795719021/frozen.cleanrl_model",
)


def test_a_checkpoint_of_another_format_is_refused_naming_the_commit_that_reads_it(tmp_path):
    """A documented Phase C checkpoint (format 1, saved without `sharpen_gate`) is read at commit 95652a5; one of this
    format holding the ASTRAL study's switches among its Args is read at commit 31fadaa, and one lacking a field is
    refused too, not built with defaults for what it lacks."""
    with pytest.raises(ValueError, match="another format of ppo_gru_astral.py's checkpoint; commit 95652a5 reads it"):
        ppo_gru_astral.evaluate(PHASE_C_FROZEN)
    args = ppo_gru_astral.Args()
    agent = ppo_gru_astral.agent_from_args(args, 3)
    path = str(tmp_path / "ok.cleanrl_model")
    ppo_gru_astral.save_checkpoint(path, args, ppo_gru_astral.MODE_PRESETS["seed3"], "run", agent, None)
    checkpoint = ppo_gru_astral.load_checkpoint(path)
    assert checkpoint["format"] == ppo_gru_astral.CHECKPOINT_FORMAT
    study_args = {"bottleneck": False, "hard_gate": False, "gumbel_tau": 1.0, "lambda_supervised": 0.0}
    torch.save({**checkpoint, "args": {**checkpoint["args"], **study_args}}, path)
    with pytest.raises(ValueError, match="another format of ppo_gru_astral.py's checkpoint; commit 31fadaa reads it"):
        ppo_gru_astral.load_checkpoint(path)
    del checkpoint["args"]["sharpen_gate"]
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="another format of ppo_gru_astral.py's checkpoint; commit"):
        ppo_gru_astral.load_checkpoint(path)


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names):
    check = occupied_run_names(str(tmp_path), "NonStationaryCartPole__collide__7__")
    result = run_script(
        "ppo_gru_astral",
        *TINY,
        "--total-timesteps",
        "64",
        "--exp-name",
        "collide",
        "--seed",
        "7",
        "--runs-dir",
        str(tmp_path),
        "--save-model",
        "--eval-episodes",
        "1",
    )
    assert result.returncode == 0, result.stderr
    run_dir = check()
    assert os.path.isfile(os.path.join(run_dir, "collide.cleanrl_model")) and os.path.isfile(
        os.path.join(run_dir, "eval.json")
    )
    # seed3 (the default preset) has no action latent: the report says so instead of scoring a sign it does not have
    report = load_json(os.path.join(run_dir, "eval.json"))
    assert report["action_latent"] is None and report["held_out_routing_deterministic"] == []
    assert not any("force_sign" in key for key in report["slots_deterministic"])
    assert "no action latent" in result.stdout.splitlines()[-1]


BAD_INPUTS = [
    (["--num-abstractions", "0"], "--num-abstractions must be at least 1"),
    (["--tau", "0"], "--tau 0.0 must be positive"),
    (["--tau", "-1"], "must be positive"),
    (["--slot-dim", "0"], "--slot-dim must be at least 1"),
    (["--lambda-orth", "-0.1"], "--lambda-orth -0.1 must be non-negative"),
    (["--num-envs", "6", "--num-minibatches", "4"], "not divisible"),
    (["--num-envs", "4", "--num-minibatches", "4", "--num-steps", "1"], "a minibatch of one step"),
    (["--fixed-mode", "3"], "--fixed-mode 3 is out of range"),
    (["--learning-rate", "nan"], "--learning-rate nan must be a finite number"),
    (["--gamma", "-1"], "--gamma -1.0 must be in (0, 1]"),
    (["--seed", "-1"], "--seed -1 must be in [0, 2**32 - 1]"),
    (["--tau", "inf"], "--tau inf must be a finite number"),
    (["--lambda-w-ent", "nan"], "--lambda-w-ent nan must be a finite number"),
    (["--ent-coef", "-1"], "--ent-coef -1.0 must be non-negative"),
    (["--target-kl", "0"], "--target-kl 0.0 must be positive"),
    (["--total-timesteps", "10"], "less than one rollout"),
    (["--capture-video"], "add --save-model"),
    (["--modes-preset", "mirror4", "--fixed-mode", "4"], "--fixed-mode 4 is held out of training in mirror4"),
    (
        ["--modes-preset", "mirror4", "--mode-share", "balanced", "--num-envs", "2", "--num-minibatches", "1"],
        "multiple of the 4 training modes",
    ),
    (["--modes-preset", "mirror4", "--fixed-mode", "7"], "--fixed-mode 7 is out of range"),
    (
        ["--slot-init", "orthonormal", "--num-abstractions", "9", "--slot-dim", "8"],
        "--slot-init orthonormal needs --num-abstractions 9 <= --slot-dim 8",
    ),
    (["--lambda-consistency", "-1"], "--lambda-consistency -1.0 must be non-negative"),
]


@pytest.mark.parametrize("flags,message", BAD_INPUTS)
def test_bad_input_fails_fast_with_one_line(tmp_path, flags, message):
    result = run_script("ppo_gru_astral", *flags, "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(result, message)
    assert result.stderr.startswith("ppo_gru_astral.py: error:"), result.stderr
    assert not (tmp_path / "runs").exists()


def test_learning_happens(tmp_path):
    """Catches a broken learner (FiLM or gate wiring that blocks the policy): random play averages ~22."""
    result = run_script(
        "ppo_gru_astral",
        "--total-timesteps",
        "32768",
        "--num-envs",
        "16",
        "--num-steps",
        "128",
        "--runs-dir",
        str(tmp_path),
        "--seed",
        "1",
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    returns = [v for _, v in logged_scalars(run_dir).get("charts/episodic_return", [])]
    assert np.mean(returns[:50]) < 40
    assert np.mean(returns[-50:]) > 100


def test_learning_rate_anneals_linearly_to_zero(tmp_path):
    result = run_script(
        "ppo_gru_astral",
        "--num-envs",
        "2",
        "--num-steps",
        "8",
        "--num-minibatches",
        "1",
        "--update-epochs",
        "1",
        "--hidden-size",
        "8",
        "--slot-dim",
        "4",
        "--total-timesteps",
        "48",
        "--learning-rate",
        "0.003",
        "--runs-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    logged = logged_scalars(run_dir).get("charts/learning_rate", [])
    assert [step for step, _ in logged] == [16, 32, 48]
    assert [lr for _, lr in logged] == pytest.approx([3e-3, 2e-3, 1e-3], rel=1e-6)


def test_the_progress_line_gives_the_time_left_from_the_steps_to_go_and_sps(capsys):
    # iteration 1 of 4 at 6,000 steps an iteration and 100 SPS: 18,000 steps to go take 180 s
    slots = {"mode_slot_nmi": 0.25, "episode_nmi": 0.5}
    ppo_gru_astral.print_progress(1, 4, 6000, 100, [50.0], {0: [40.0]}, slots, None)
    line = capsys.readouterr().out.strip()
    assert line.startswith("iter 1/4 step 6000 SPS 100 return 50.0 | m0 40 | slot NMI 0.25, episode NMI 0.50")
    assert line.endswith("| 3.0 min left")


def helper_text(module, start, end):
    """The source of `module` from the line that starts with `start` up to (without) the next line starting with `end`."""
    source = inspect.getsource(module)
    first = source.index(start)
    return source[first : source.index(end, first + len(start))]


def test_the_cartpole_scripts_share_their_helpers_as_one_text():
    """Copies between the CartPole scripts are the same text, so a diff between two scripts shows only what differs in
    method: the environment, the previous-reward rule, the finite-number check, claim_run_dir (tta_gating's too), and
    the mutual information the scripts log beside the package's one definition."""
    import cleanrl_astral.tta_gating as tta_gating

    scripts = (ppo_gru_baseline, ppo_gru_astral)
    pieces = [
        ("# ENVIRONMENT\n", "class RewardScaler"),
        ("class RewardScaler", "\n\n\n"),
        ("    for field in dataclasses.fields(args):", "    for name in"),
        ("def claim_run_dir(", "\n\n\n"),
    ]
    for start, end in pieces:
        texts = {module.__name__: helper_text(module, start, end) for module in scripts}
        assert len(set(texts.values())) == 1, start
    claim = {helper_text(module, "def claim_run_dir(", "\n\n\n") for module in (*scripts, tta_gating)}
    assert len(claim) == 1
    for module in scripts:
        assert "    prev_reward = np.where(done, 0.0, reward)\n" in inspect.getsource(module)
    package = helper_text(cartpole, "def mutual_information(", "\n\n\n")
    assert helper_text(ppo_gru_astral, "def mutual_information(", "\n\n\n") == package
    assert inspect.getsource(cartpole).count("def mutual_information(") == 1
