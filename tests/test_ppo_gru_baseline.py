"""Tests for cleanrl_astral/ppo_gru_baseline.py: each would fail if the mechanism it names were wrong."""

import copy
import glob
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import SCRIPT_ENV, assert_one_line_error, load_json, logged_scalars, only_run_dir, run_script
from ppo_gru_main import gae, given, run_main, update

import cleanrl_astral.ppo_gru_baseline as ppo_gru_baseline
from cleanrl_astral_utils import cartpole

TINY = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--hidden-size", "16"]


def rollout(memory="gru", oracle=False, hide_velocity=False, num_envs=8, num_steps=64, seed=0):
    """The second rollout of a two-rollout training run, as its update received it, with the agent that acted it (trained
    once): it starts from a non-zero GRU state and crosses several episode boundaries (random CartPole episodes last ~20
    steps). Rewards are not rescaled. A Rollout: (agent, batch, initial_state, episodes, advantages, returns, next_value)."""
    flags = ["--memory", memory, "--num-envs", num_envs, "--num-steps", num_steps, "--hidden-size", 32, "--seed", seed]
    flags += ["--total-timesteps", 2 * num_envs * num_steps, "--num-minibatches", 2, "--update-epochs", 2, "--no-norm-reward"]
    if oracle:
        flags.append("--oracle")
    if hide_velocity:
        flags.append("--hide-velocity")
    return run_main(ppo_gru_baseline, *flags).rollouts[-1]


def zero_state_step(agent, inputs):
    """The GRU output of every step as if the state entering it were zero."""
    features = agent.encoder(inputs)
    flat = features.reshape(-1, features.shape[-1])
    return agent.gru(flat, torch.zeros_like(flat)).reshape(features.shape)


def update_args(**overrides):
    args = ppo_gru_baseline.Args(num_minibatches=2, update_epochs=2)
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


# --- environment ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset,mode_of_env", [("seed3", [0, 1, 2, 0, 1, 2]), ("inverted4", [3, 3, 0, 1, 2, 3])])
def test_env_gives_gymnasiums_cartpole_trajectories(preset, mode_of_env):
    """Started from the same states, with the same actions and each env's physics set on gymnasium's CartPole-v1 (as
    the script's modes define it), the vectorised env returns the same observations, rewards, terminations and
    time-limit truncations, bit for bit, over many episodes."""
    modes = ppo_gru_baseline.MODE_PRESETS[preset]
    n = len(mode_of_env)
    envs = ppo_gru_baseline.NonStationaryCartPole(n, modes, max_episode_steps=40)
    envs.pinned[:] = mode_of_env
    envs.reset(seed=0)
    reference = [gym.make("CartPole-v1", max_episode_steps=40) for _ in range(n)]

    def restart(i):
        reference[i].reset(seed=i)
        cartpole = reference[i].unwrapped
        gravity, half_length, sign = modes[mode_of_env[i]]
        cartpole.gravity = gravity
        cartpole.length = half_length
        cartpole.force_mag = sign * 10.0
        cartpole.polemass_length = cartpole.masspole * half_length
        cartpole.state = envs.state[i].copy()

    for i in range(n):
        restart(i)
    rng = np.random.default_rng(1)
    truncations = 0
    ends = 0
    for _ in range(2000):
        # mostly the action that holds the pole up, so some episodes reach the time limit
        action = np.where(
            rng.random(n) < 0.8,
            (envs.state[:, 2] + 0.3 * envs.state[:, 3] > 0) == (envs.force_sign[envs.mode] > 0),
            rng.integers(2, size=n),
        ).astype(int)
        _, reward, terminated, truncated, info = envs.step(action)
        for i in range(n):
            obs, r, term, trunc, _ = reference[i].step(int(action[i]))
            assert np.array_equal(obs, info["final_obs"][i]) and (r, term, trunc) == (reward[i], terminated[i], truncated[i])
            if term or trunc:
                ends = ends + 1
                truncations = truncations + (trunc and not term)
                restart(i)
    assert ends > 100 and truncations > 5


def test_autoreset_is_same_step_with_fresh_first_observations():
    envs = ppo_gru_baseline.NonStationaryCartPole(16, ppo_gru_baseline.MODE_PRESETS["seed3"], max_episode_steps=30)
    obs, info = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(300):
        obs, reward, terminated, truncated, info = envs.step(rng.integers(2, size=16))
        done = terminated | truncated
        ended += done.sum()
        # where done, obs is the next episode's first observation (CartPole samples it in [-0.05, 0.05]), and the ended
        # episode's last observation is in final_obs; elsewhere the two are the same
        assert np.abs(obs[done]).max(initial=0) <= 0.05 and np.array_equal(obs[~done], info["final_obs"][~done])
        assert np.all(np.abs(info["final_obs"][terminated][:, [0, 2]]).max(-1) > 0.2)
        assert np.all(reward == 1.0)
    assert ended > 50


def test_inverted_mode_pushes_the_other_way():
    envs = ppo_gru_baseline.NonStationaryCartPole(2, ppo_gru_baseline.MODE_PRESETS["inverted4"])
    envs.pinned[:] = [0, 3]
    obs, _ = envs.reset(seed=0)
    envs.state[1] = envs.state[0]
    before = envs.state[:, 1].copy()
    envs.step(np.array([1, 1]))  # action 1 pushes right: cart velocity goes up in mode 0 and down in the inverted mode
    assert envs.state[0, 1] > before[0] and envs.state[1, 1] < before[1]


def test_hide_velocity_observes_position_and_angle():
    full, hidden = (
        ppo_gru_baseline.NonStationaryCartPole(4, ppo_gru_baseline.MODE_PRESETS["seed3"], hide) for hide in (False, True)
    )
    obs_full, _ = full.reset(seed=3)
    obs_hidden, _ = hidden.reset(seed=3)
    for _ in range(50):
        assert obs_hidden.shape == (4, 2) and np.array_equal(obs_hidden, obs_full[:, [0, 2]])
        obs_full, *_ = full.step(np.ones(4, dtype=int))
        obs_hidden, *_ = hidden.step(np.ones(4, dtype=int))


def test_modes_are_drawn_per_episode_switched_by_switch_prob_and_pinned_by_fixed_mode():
    def modes_seen(switch_prob=0.0, fixed_mode=None, steps=200):
        envs = ppo_gru_baseline.NonStationaryCartPole(
            8, ppo_gru_baseline.MODE_PRESETS["seed3"], fixed_mode=fixed_mode, switch_prob=switch_prob
        )
        _, info = envs.reset(seed=0)
        rng = np.random.default_rng(0)
        changes = 0
        episode_modes = [info["mode"]]
        mode = info["mode"]
        for _ in range(steps):
            _, _, terminated, truncated, info = envs.step(rng.integers(2, size=8))
            done = terminated | truncated
            changes += (info["final_mode"] != mode)[~done].sum()  # a change inside an episode
            # final_mode is the mode the ended episode had at its end, mode the next episode's
            assert np.array_equal(info["final_mode"][~done], info["mode"][~done])
            episode_modes.append(info["mode"][done])
            mode = info["mode"]
        return changes, np.concatenate(episode_modes)

    changes, drawn = modes_seen()
    assert changes == 0 and set(drawn) == {0, 1, 2} and np.bincount(drawn).min() > len(drawn) / 5
    changes, _ = modes_seen(switch_prob=0.5)
    assert changes > 100
    changes, drawn = modes_seen(switch_prob=1.0, fixed_mode=2)
    assert changes == 0 and set(drawn) == {2}


def test_balanced_share_gives_every_training_mode_the_same_share_of_steps():
    """--mode-share balanced pins env i to training mode i mod M, whatever the episode lengths: the inverted mode's
    ~20-step episodes get as many steps as the upright modes' 500-step ones; a held-out mode none."""

    class StepModes(ppo_gru_baseline.NonStationaryCartPole):
        """Keeps the mode that governs each step."""

        def step(self, action):
            self.step_modes.append(self.mode.copy())
            return super().step(action)

    flags = ["--modes-preset", "inverted4", "--num-envs", 12, "--num-steps", 64, "--total-timesteps", 12 * 64]
    for held_out, training in (((), [0, 1, 2, 3]), ((1,), [0, 2, 3])):
        envs = StepModes(12, ppo_gru_baseline.MODE_PRESETS["inverted4"], held_out=held_out, mode_share="balanced")
        envs.step_modes = []
        episodes = (
            run_main(ppo_gru_baseline, *flags, "--hidden-size", 16, NonStationaryCartPole=given(envs)).rollouts[0].episodes
        )
        counts = np.bincount(np.concatenate(envs.step_modes), minlength=4)
        assert [k for k in range(4) if counts[k]] == training and len(set(counts[training])) == 1, counts
        assert counts.sum() == 12 * 64 and {mode for _, _, mode, _ in episodes} == set(training)


def test_held_out_mode_is_never_drawn_in_training_and_is_evaluated(tmp_path):
    envs = ppo_gru_baseline.NonStationaryCartPole(
        16, ppo_gru_baseline.MODE_PRESETS["inverted4"], switch_prob=0.3, held_out=(2,), max_episode_steps=20
    )
    _, info = envs.reset(seed=0)
    seen = [info["mode"]]
    rng = np.random.default_rng(0)
    for _ in range(300):
        _, _, _, _, info = envs.step(rng.integers(2, size=16))
        seen.append(info["mode"])
    assert set(np.concatenate(seen)) == {0, 1, 3}
    result = run_script(
        "ppo_gru_baseline",
        *TINY,
        "--total-timesteps",
        "128",
        "--modes-preset",
        "mirror4",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    report = load_json(os.path.join(run_dir, "eval.json"))
    assert report["held_out_modes"] == [4] and set(report["per_mode"]) == {"0", "1", "2", "3", "4"}
    training = [report["per_mode"][str(k)]["deterministic"]["mean"] for k in range(4)]
    assert report["deterministic_mean"] == pytest.approx(np.mean(training))
    assert report["deterministic_held_out_mean"] == report["per_mode"]["4"]["deterministic"]["mean"]
    # the force-inverted training modes end their episodes within the budget; the held-out mode is never logged
    assert not logged_scalars(run_dir).get("charts/episodic_return_mode4", [])
    assert logged_scalars(run_dir).get("charts/episodic_return_mode1", []) or logged_scalars(run_dir).get(
        "charts/episodic_return_mode3", []
    )


# --- recurrent PPO mechanics -------------------------------------------------------------------------


@pytest.mark.parametrize("memory,oracle", [("gru", False), ("none", False), ("gru", True)])
def test_first_minibatch_ratio_is_one(memory, oracle):
    """The loop's update, on a rollout that starts from a non-zero state and crosses episode starts, replays its first
    minibatch with the acted log-probs: ratio 1."""
    agent, batch, initial_state, _, adv, ret, _ = rollout(memory, oracle)
    assert initial_state.abs().sum() > 0 and batch["starts"][1:].sum() > 0
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
    stats = update(ppo_gru_baseline, agent, optimizer, batch, initial_state, adv, ret, update_args())
    assert stats["first_minibatch_ratio_error"] < 1e-5


def test_replayed_log_probs_equal_the_acted_ones_and_wrong_state_handling_breaks_them():
    """Replaying from the saved initial state with the episode starts reproduces the acted log-probs; replaying from a
    zero state, or ignoring episode starts, does not (so the ratio check above is sensitive)."""
    agent, batch, initial_state, *_ = rollout("gru")
    with torch.no_grad():
        _, right, _, _, _ = agent.get_action_and_value(batch["inputs"], initial_state, batch["starts"], batch["actions"])
        _, zero_state, _, _, _ = agent.get_action_and_value(
            batch["inputs"], torch.zeros_like(initial_state), batch["starts"], batch["actions"]
        )
        _, no_reset, _, _, _ = agent.get_action_and_value(
            batch["inputs"], initial_state, torch.zeros_like(batch["starts"]), batch["actions"]
        )
    assert (right - batch["logprobs"]).abs().max() < 1e-5
    assert (zero_state - batch["logprobs"]).abs().max() > 1e-4
    assert (no_reset - batch["logprobs"]).abs().max() > 1e-4


def test_a_run_and_an_evaluation_open_with_no_previous_action_or_reward():
    """Every env starts an episode at the run's first step and at the evaluation's first: that input holds the
    observation alone (no previous action, previous reward 0), starts[0] is 1 and the GRU state is zero; the next
    step's input holds the action taken."""
    flags = ["--num-envs", 4, "--num-steps", 8, "--hidden-size", 16, "--total-timesteps", 32, "--num-minibatches", 2]
    _, batch, initial_state, *_ = run_main(ppo_gru_baseline, *flags).rollouts[0]
    assert torch.all(batch["starts"][0] == 1) and torch.all(initial_state == 0)
    assert batch["inputs"][0, :, 4:].abs().sum() == 0
    agent = ppo_gru_baseline.Agent(4, 2, 3, 16)
    seen = []
    act = agent.get_action_and_value

    def spy(x, *rest, **kw):
        seen.append(x.clone())
        return act(x, *rest, **kw)

    agent.get_action_and_value = spy
    envs = ppo_gru_baseline.NonStationaryCartPole(3, ppo_gru_baseline.MODE_PRESETS["seed3"], max_episode_steps=5)
    ppo_gru_baseline.first_episodes(agent, envs, seed=0, deterministic=True)
    assert seen[0][0, :, 4:].abs().sum() == 0
    assert torch.all(seen[1][0, :, 4:6].sum(-1) == 1)


def test_hidden_state_and_prev_inputs_are_zero_at_episode_starts():
    agent, batch, initial_state, *_ = rollout("gru")
    starts = batch["starts"].bool()
    inputs = batch["inputs"]
    prev_action = inputs[..., 4:6]
    prev_reward = inputs[..., 6]
    assert starts[1:].sum() > 0
    assert prev_action[starts].abs().sum() == 0 and prev_reward[starts].abs().sum() == 0
    # inside an episode: previous reward is CartPole's 1 and the previous action is the one taken
    assert torch.all(prev_reward[~starts] == 1.0)
    inside = ~starts[1:]
    assert torch.equal(prev_action[1:].argmax(-1)[inside], batch["actions"][:-1][inside])
    assert torch.all(prev_action[~starts].sum(-1) == 1.0)
    with torch.no_grad():
        hidden, _ = agent.unroll(inputs, initial_state, batch["starts"])
        fresh = zero_state_step(agent, inputs)
    # the state entering a first step is zero: its output equals a fresh zero-state step, and only there
    assert torch.allclose(hidden[starts], fresh[starts], atol=1e-6)
    assert (hidden[~starts] - fresh[~starts]).abs().amax(-1).min() > 1e-4


def test_memory_none_zeroes_state_every_step():
    agent, batch, initial_state, *_ = rollout("none")
    with torch.no_grad():
        hidden, _ = agent.unroll(batch["inputs"], initial_state, batch["starts"])
        fresh = zero_state_step(agent, batch["inputs"])
    assert torch.allclose(hidden, fresh, atol=1e-6)


def test_unroll_equals_stepping_the_gru_module_with_resets():
    """unroll calls torch.gru_cell on the module's weights directly; it must equal nn.GRUCell step by step, with the
    state zeroed exactly where starts = 1 (random biases, so swapped ih/hh weights or biases would show)."""
    torch.manual_seed(0)
    agent = ppo_gru_baseline.Agent(4, 2, 3, 16)
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


def test_no_autoreset_transition_enters_the_batch():
    agent, batch, _, episodes, *_ = rollout("gru")
    obs = batch["inputs"][..., :4]
    # every stored transition is a real CartPole step: reward 1 (no reset step of reward 0; no time limit is reached in
    # two rollouts, so nothing is bootstrapped), and never a terminal observation
    assert torch.all(batch["rewards"] == 1.0)
    assert obs[..., 0].abs().max() <= 2.4 and obs[..., 2].abs().max() <= 0.2095
    # first observations are fresh resets (CartPole samples them in [-0.05, 0.05])
    assert obs[batch["starts"].bool()].abs().max() <= 0.05
    # lengths of the episodes that lie wholly inside the batch match the episode log
    lengths = []
    for i in range(batch["starts"].shape[1]):
        idx = torch.nonzero(batch["starts"][:, i]).flatten().tolist()
        lengths += [b - a for a, b in zip(idx, idx[1:])]
    logged = sorted(length for _, length, _, _ in episodes)
    assert lengths and all(length in logged for length in lengths)
    # each episode's end index (its logged step is global_step + (end + 1) * num_envs) is the step after which
    # its env restarts; episodes ending at the last step restart in the next rollout
    T = batch["starts"].shape[0]
    restarts = sorted(t for t, _ in torch.nonzero(batch["starts"][1:]).tolist())
    assert restarts and restarts == sorted(end for *_, end in episodes if end < T - 1)


def test_truncation_bootstraps_from_the_final_observation_and_is_logged():
    """An episode cut by the time limit is not a failure: its last reward is 1 + gamma V(final observation), with the
    final observation recomputed independently on gymnasium's CartPole, and it reaches the episode log. With a 5-step
    limit, 2 envs x 12 steps finish 4 episodes of return 5, at steps 4 and 9."""
    envs = ppo_gru_baseline.NonStationaryCartPole(2, [(9.8, 0.5, 1.0)], max_episode_steps=5)
    envs.reset(seed=3)  # as the run resets it
    start_state = envs.state[0].copy()
    flags = ["--seed", 3, "--num-envs", 2, "--num-steps", 12, "--total-timesteps", 24, "--num-minibatches", 1]
    run = run_main(ppo_gru_baseline, *flags, "--hidden-size", 16, "--no-norm-reward", NonStationaryCartPole=given(envs))
    agent, batch, initial_state, episodes, *_ = run.rollouts[0]
    assert sorted(episodes) == [(5.0, 5, 0, 4)] * 2 + [(5.0, 5, 0, 9)] * 2
    assert torch.all(batch["rewards"][[0, 1, 2, 3, 5, 6, 7, 8]] == 1.0) and torch.all(batch["starts"][[5, 10]] == 1.0)
    reference = gym.make("CartPole-v1").unwrapped
    reference.reset(seed=0)
    reference.state = start_state
    for a in batch["actions"][:5, 0].tolist():
        final_obs, *_ = reference.step(a)
    with torch.no_grad():
        _, state = agent.unroll(batch["inputs"][:5], initial_state, batch["starts"][:5])
        x = agent.build_input(torch.as_tensor(final_obs)[None], batch["actions"][4, :1], torch.ones(1), torch.zeros(1))
        v_final = agent.get_value(x[None], state[:1], torch.zeros(1, 1))[0, 0]
    assert batch["rewards"][4, 0].item() == pytest.approx(1.0 + 0.99 * v_final.item(), abs=1e-5)


def test_gae_does_not_bootstrap_across_episode_boundaries():
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    values = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    starts = torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    adv, ret = gae(ppo_gru_baseline, rewards, values, starts, torch.tensor([50.0]), torch.tensor([1.0]), 0.5, 1.0)
    # step 3 and step 1 end episodes: their deltas are r - V, with nothing from the next step
    assert adv[3, 0] == pytest.approx(4.0 - 40.0)
    assert adv[1, 0] == pytest.approx(2.0 - 20.0)
    assert adv[2, 0] == pytest.approx((3.0 + 0.5 * 40.0 - 30.0) + 0.5 * adv[3, 0])
    assert adv[0, 0] == pytest.approx((1.0 + 0.5 * 20.0 - 10.0) + 0.5 * adv[1, 0])
    assert torch.allclose(ret, adv + values)


@pytest.mark.parametrize("next_start", [0.0, 1.0])
def test_gae_matches_its_definition_with_discounting_and_bootstrapping(forward_gae, next_start):
    """gamma and lambda both below 1, episodes cut inside the rollout, and the rollout's last step bootstrapping
    from next_value unless the next step opens an episode: every advantage equals GAE summed forwards."""
    gamma = 0.9
    lam = 0.5
    rewards = torch.tensor([[1.0, -1.0], [2.0, 0.5], [3.0, 2.0], [4.0, -3.0], [0.5, 1.0]])
    values = torch.tensor([[10.0, 1.0], [20.0, -2.0], [30.0, 3.0], [40.0, 0.0], [5.0, 6.0]])
    starts = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    next_value = torch.tensor([50.0, -7.0])
    next_start_t = torch.tensor([next_start, 0.0])
    adv, ret = gae(ppo_gru_baseline, rewards, values, starts, next_value, next_start_t, gamma, lam)
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
    run = run_main(ppo_gru_baseline, *flags)
    _, batch, _, _, advantages, returns, next_value = run.rollouts[0]
    next_start = run.rollouts[1].batch["starts"][0]
    args = ppo_gru_baseline.Args()
    assert batch["starts"][1:].sum() > 0
    for n in range(4):
        continues = (1.0 - torch.cat([batch["starts"][1:, n], next_start[n : n + 1]])).tolist()
        values = batch["values"][:, n].tolist() + [next_value[n].item()]
        expected = forward_gae(batch["rewards"][:, n].tolist(), values, continues, args.gamma, args.gae_lambda)
        assert advantages[:, n].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-4)
    assert torch.equal(returns, advantages + batch["values"])


def test_reward_scaler_divides_by_running_std_of_discounted_return():
    """Checked against a direct computation: the running variance over all discounted returns seen so far,
    with each environment's return restarting after its episode ends."""
    rng = np.random.default_rng(0)
    scaler = ppo_gru_baseline.RewardScaler(3, gamma=0.9)
    returns = np.zeros(3)
    history = []
    for _ in range(40):
        rewards = rng.normal(5.0, 2.0, 3)
        dones = rng.random(3) < 0.2
        returns = returns * 0.9 + rewards
        history.extend(returns)
        # pooled with the scaler's prior (mean 0, variance 1, count 1e-4), as gymnasium's NormalizeReward
        n = len(history)
        mean = np.mean(history)
        var = np.var(history)
        prior = 1e-4
        pooled = (prior + var * n + mean**2 * prior * n / (n + prior)) / (n + prior)
        expected = rewards / np.sqrt(pooled + 1e-8)
        returns[dones] = 0.0
        np.testing.assert_allclose(scaler(rewards, dones), expected, rtol=1e-9)


# --- the PPO update, term by term ----------------------------------------------------------------------


class ScriptedAgent(torch.nn.Module):
    """Stands in for the agent in the loop's update: the log-prob, entropy and value of every (step, env) are free
    parameters, so the gradient the update's loss sends to them is the loss' derivative with respect to each output.
    inputs[..., 0] and initial_state[:, 0] hold the env index, so each call records which envs its minibatch holds."""

    def __init__(self, logprobs, values, entropy):
        super().__init__()
        self.logprob, self.value, self.entropy = (torch.nn.Parameter(t.clone()) for t in (logprobs, values, entropy))
        self.minibatches = []

    def get_action_and_value(self, x, state, starts, action=None):
        mb = x[0, :, 0].long()
        assert torch.all(x[..., 0] == x[:1, :, 0]) and torch.equal(state[:, 0].long(), mb)  # inputs and state agree
        self.minibatches.append(mb.tolist())
        return action, self.logprob[:, mb], self.entropy[:, mb], self.value[:, mb], state


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
    }
    new_values = old_values if new_values is None else new_values
    agent = ScriptedAgent(batch["logprobs"], new_values, torch.full((T, N), 0.6))
    spy = GradSpy(agent)
    stats = update(
        ppo_gru_baseline,
        agent,
        spy,
        batch,
        env_index[:, None],
        advantages,
        returns,
        update_args(max_grad_norm=1e9, **overrides),
    )
    return agent, spy, stats


def test_entropy_bonus_lowers_the_loss():
    """The loss is pg_loss - ent_coef * H + vf_coef * v_loss (H the minibatch-mean entropy): its derivative with
    respect to each sample's entropy is -ent_coef / (samples in the minibatch). A + sign would minimise entropy, so
    training would drive the policy deterministic instead of exploring."""
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


def test_target_kl_stops_the_update_after_the_epoch_that_exceeds_it():
    """--target-kl ends the update after the first epoch whose last minibatch's approx_kl exceeds it. With a tiny
    target, the first epoch's second minibatch already sees a moved policy, so only that epoch's 2 Adam steps are
    taken (of 2 minibatches x 4 epochs = 8); without a target, or with a huge one, all 8 are."""
    torch.manual_seed(0)
    agent = ppo_gru_baseline.Agent(4, 2, 3, 16)
    gen = torch.Generator().manual_seed(0)
    T = 6
    N = 4
    inputs = torch.randn(T, N, agent.input_dim, generator=gen)
    starts = torch.zeros(T, N)
    starts[0] = 1.0
    starts[T // 2, ::2] = 1.0
    initial_state = torch.zeros(N, agent.hidden_size)
    actions = torch.randint(0, 2, (T, N), generator=gen)
    with torch.no_grad():
        _, logprobs, _, values, _ = agent.get_action_and_value(inputs, initial_state, starts, actions)
    batch = {"inputs": inputs, "starts": starts, "actions": actions, "logprobs": logprobs, "values": values}
    adv = torch.randn(T, N, generator=gen)
    ret = torch.randn(T, N, generator=gen)
    steps = {}
    for target_kl in (None, 1e-8, 1e3):
        trained = copy.deepcopy(agent)
        optimizer = torch.optim.Adam(trained.parameters(), lr=1e-2)
        stats = update(
            ppo_gru_baseline,
            trained,
            optimizer,
            batch,
            initial_state,
            adv,
            ret,
            update_args(update_epochs=4, target_kl=target_kl),
        )
        steps[target_kl] = int(optimizer.state[trained.actor[-1].weight]["step"])
        if target_kl == 1e-8:
            assert stats["approx_kl"] > target_kl
    assert steps == {None: 8, 1e-8: 2, 1e3: 8}


# --- script-level behaviour ----------------------------------------------------------------------------


def test_smoke_save_evaluate_round_trip(tmp_path):
    result = run_script(
        "ppo_gru_baseline",
        *TINY,
        "--total-timesteps",
        "256",
        "--runs-dir",
        str(tmp_path),
        "--save-model",
        "--eval-episodes",
        "2",
        "--hide-velocity",
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    model = os.path.join(run_dir, "ppo_gru_baseline.cleanrl_model")
    report = load_json(os.path.join(run_dir, "eval.json"))
    assert set(report["per_mode"]) == {"0", "1", "2"}
    assert all(len(report["per_mode"][k][kind]["returns"]) == 2 for k in "012" for kind in ("deterministic", "sampled"))
    for k in "012":
        assert [v for _, v in logged_scalars(run_dir).get(f"eval/episodic_return_mode{k}_deterministic", [])] == pytest.approx(
            [report["per_mode"][k]["deterministic"]["mean"]]
        )
    # training logged what the benchmark reads, and the replay check held on every update
    assert logged_scalars(run_dir).get("charts/episodic_return", []) and logged_scalars(run_dir).get(
        "charts/episodic_return_mode0", []
    )
    errors = [v for _, v in logged_scalars(run_dir).get("debug/first_minibatch_ratio_error", [])]
    assert len(errors) == 4 and max(errors) < 1e-5
    # what tta_gating reads from a saved model
    ckpt = torch.load(model, weights_only=True)
    assert ckpt["args"]["hide_velocity"] and ckpt["reward_scaler"]["var"] > 0 and len(ckpt["modes"]) == 3
    # evaluate() works on a saved file with unseen physics, and never writes to it
    before = open(model, "rb").read()
    results = ppo_gru_baseline.evaluate(model, episodes_per_mode=3, modes=[(5.0, 0.9, 1.0), (15.0, 0.3, -1.0)])["returns"]
    assert set(results) == {0, 1} and all(len(r) == 3 and np.all(r >= 1) for r in results.values())
    assert open(model, "rb").read() == before
    # seed3 has no action latent: no probe, and the report says so
    assert report["action_latent"] is None and report["probes_deterministic"] == {}
    assert "none (no mode of this preset changes which action is right)" in result.stdout


def test_evaluation_returns_the_first_episode_of_each_env():
    """evaluate's episodes are the first episode of each env: an env that finishes early and restarts must not add its
    second episode's rewards."""
    agent = ppo_gru_baseline.Agent(4, 2, 3, 16)
    envs = ppo_gru_baseline.NonStationaryCartPole(6, ppo_gru_baseline.MODE_PRESETS["seed3"], fixed_mode=1, max_episode_steps=7)
    first, steps = ppo_gru_baseline.first_episodes(agent, envs, seed=0, deterministic=True)
    assert all(ret <= 7 and ret == length and mode == 1 for ret, length, mode in first)
    # the probe's columns: one age per step of each first episode (0, 1, ...), -1 after it; h of the same shape
    for i, (_, length, _) in enumerate(first):
        ages = steps["ages"][:, i]
        assert ages[:length].tolist() == list(range(length)) and np.all(ages[length:] == -1)
    assert steps["hidden"].shape == (*steps["ages"].shape, 16)


def probe_columns(rng, label, num_envs, steps, sign_in_h=True, mislead_early=False):
    """One mode's evaluation columns for the probe: h (steps, envs, 4) whose first coordinate is +-1 by `label` (noise
    only without `sign_in_h`), ages 0, 1, ...; with `mislead_early` the burn-in steps carry the opposite sign."""
    hidden = rng.normal(size=(steps, num_envs, 4))
    if sign_in_h:
        hidden[:, :, 0] += 3.0 * (2 * label - 1)
    if mislead_early:
        hidden[: cartpole.PROBE_BURN_IN, :, 0] = -3.0 * (2 * label - 1)
    ages = np.tile(np.arange(steps)[:, None], (1, num_envs))
    return {"hidden": hidden, "ages": ages}


def test_sign_probe_reads_a_sign_that_h_carries_and_only_that():
    """The baseline's probe fits a logistic regression from h to the mode's force sign on even episodes past burn-in and
    scores the odd ones: about 1 where h carries the sign, about 0.5 where it does not; the held-out mode (here with
    the opposite sign in h) and the burn-in steps (here misleading) are left out, or the accuracy would drop."""
    rng = np.random.default_rng(0)
    labels = np.array([1, 0, 1, 0, 0])
    hidden = {k: probe_columns(rng, labels[k], 6, 40, mislead_early=True) for k in range(4)}
    hidden[4] = probe_columns(rng, 1 - labels[4], 6, 40)  # the held-out mode's h says the other sign
    assert cartpole.hidden_state_probe(hidden, labels, [4], 6) > 0.99
    assert cartpole.hidden_state_probe(hidden, labels, [], 6) < 0.95
    noise = {k: probe_columns(rng, labels[k], 6, 40, sign_in_h=False) for k in range(4)}
    assert abs(cartpole.hidden_state_probe(noise, labels, [], 6) - 0.5) < 0.1
    with_burn_in = {k: probe_columns(rng, labels[k], 6, 12, mislead_early=True) for k in range(4)}
    assert cartpole.hidden_state_probe(with_burn_in, labels, [], 6) > 0.99


def test_evaluation_probes_the_force_sign_from_h_of_the_training_modes(tmp_path):
    """evaluate() reports the probe of a saved agent: an oracle agent's h holds its mode one-hot, so the probe reads the
    force sign from it almost perfectly; seed3 has no action latent and no probe."""
    result = run_script(
        "ppo_gru_baseline",
        *TINY,
        "--total-timesteps",
        "64",
        "--modes-preset",
        "mirror4",
        "--oracle",
        "--runs-dir",
        tmp_path,
        "--save-model",
        "--eval-episodes",
        "2",
    )
    assert result.returncode == 0, result.stderr
    model = os.path.join(only_run_dir(tmp_path), "ppo_gru_baseline.cleanrl_model")
    out = ppo_gru_baseline.evaluate(model, episodes_per_mode=8)
    assert set(out["probes"]) == {"probe_acc_h_force_sign"}
    assert out["probes"]["probe_acc_h_force_sign"] > 0.9


def test_controls_and_tracking_run(tmp_path):
    env = {**SCRIPT_ENV, "WANDB_SILENT": "true"}
    for extra in (["--memory", "none"], ["--oracle", "--track"], ["--modes-preset", "inverted4", "--switch-prob", "0.05"]):
        result = run_script(
            "ppo_gru_baseline", *TINY, "--total-timesteps", "128", "--runs-dir", tmp_path / extra[-1], *extra, env=env
        )
        assert result.returncode == 0, result.stderr
        run_dir = only_run_dir(tmp_path / extra[-1])
        assert max(v for _, v in logged_scalars(run_dir).get("debug/first_minibatch_ratio_error", [])) < 1e-5
    assert glob.glob(str(tmp_path / "--track" / "*" / "wandb" / "offline-run-*"))


def test_capture_video_writes_one_video_per_mode(tmp_path):
    result = run_script(
        "ppo_gru_baseline",
        *TINY,
        "--total-timesteps",
        "64",
        "--runs-dir",
        str(tmp_path),
        "--save-model",
        "--capture-video",
        "--eval-episodes",
        "1",
    )
    assert result.returncode == 0, result.stderr
    videos = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "*" / "videos" / "*.mp4")))
    assert videos == ["mode0-episode-0.mp4", "mode1-episode-0.mp4", "mode2-episode-0.mp4"]


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names):
    """Runs of one command and seed started in the same second (a shell loop over flags) would otherwise share
    runs/{run_name}: their TensorBoard events would mix, and the later run's files would replace the earlier run's."""
    check = occupied_run_names(str(tmp_path), "NonStationaryCartPole__collide__7__")
    result = run_script(
        "ppo_gru_baseline",
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


BAD_INPUTS = [
    (["--num-envs", "6", "--num-minibatches", "4"], "not divisible"),
    (["--num-envs", "4", "--num-minibatches", "4", "--num-steps", "1"], "a minibatch of one step"),
    (["--num-minibatches", "0"], "--num-minibatches must be at least 1"),
    (["--fixed-mode", "3"], "--fixed-mode 3 is out of range"),
    (["--total-timesteps", "10"], "less than one rollout"),
    (["--learning-rate", "nan"], "--learning-rate nan must be a finite number"),
    (["--gamma", "-1"], "--gamma -1.0 must be in (0, 1]"),
    (["--gae-lambda", "2"], "--gae-lambda 2.0 in [0, 1]"),
    (["--clip-coef", "0"], "--clip-coef 0.0 must be positive"),
    (["--max-grad-norm", "-1"], "--max-grad-norm -1.0 must be positive"),
    (["--seed", "-1"], "--seed -1 must be in [0, 2**32 - 1]"),
    (["--target-kl", "nan"], "--target-kl nan must be a finite number"),
    (["--ent-coef", "-1"], "--ent-coef -1.0 must be non-negative"),
    (["--target-kl", "0"], "--target-kl 0.0 must be positive"),
    (["--switch-prob", "1.5"], "--switch-prob 1.5 must be in [0, 1]"),
    (["--capture-video"], "add --save-model"),
    (["--exp-name", "a/b"], "--exp-name 'a/b' must be a non-empty name without '/'"),
    (["--modes-preset", "mirror4", "--fixed-mode", "4"], "--fixed-mode 4 is held out of training in mirror4"),
    (
        ["--mode-share", "balanced", "--num-envs", "6", "--num-minibatches", "2", "--fixed-mode", "1"],
        "--mode-share balanced pins every env's mode",
    ),
    (
        ["--mode-share", "balanced", "--num-envs", "4", "--num-minibatches", "2"],
        "--mode-share balanced needs --num-envs 4 to be a multiple of the 3 training modes",
    ),
    (
        ["--mode-share", "balanced", "--num-envs", "6", "--num-minibatches", "2", "--modes-preset", "mirror4"],
        "--mode-share balanced needs --num-envs 6 to be a multiple of the 4 training modes",
    ),
]


@pytest.mark.parametrize("flags,message", BAD_INPUTS)
def test_bad_input_fails_fast_with_one_line(tmp_path, flags, message):
    result = run_script("ppo_gru_baseline", *flags, "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(result, message)
    assert result.stderr.startswith("ppo_gru_baseline.py: error:"), result.stderr
    assert not (tmp_path / "runs").exists()  # no run directory: nothing started


@pytest.mark.parametrize("flags", [["--memory", "lstm"], ["--modes-preset", "seed7"]])
def test_choices_are_checked_by_the_parser(tmp_path, flags):
    result = run_script("ppo_gru_baseline", *flags, "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode != 0 and "invalid choice" in result.stderr.lower() and not (tmp_path / "runs").exists()


def test_a_runs_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "runs").write_text("")
    result = run_script("ppo_gru_baseline", *TINY, "--total-timesteps", "64", "--runs-dir", str(tmp_path / "runs"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--runs-dir" in lines[0] and "not a directory" in lines[0]
    assert result.stdout == "" and (tmp_path / "runs").read_text() == ""


def test_another_scripts_model_is_refused(tmp_path):
    other = tmp_path / "other.pt"
    junk = tmp_path / "junk.pt"
    torch.save({"script": "ppo_gru_astral", "format": 1}, other)
    torch.save([1, 2], junk)
    for path in (other, junk):
        with pytest.raises(ValueError, match="not written by ppo_gru_baseline.py"):
            ppo_gru_baseline.evaluate(str(path))


def test_learning_happens(tmp_path):
    """Catches a broken learner: a random CartPole policy averages ~22; 30k steps of this PPO (with the default
    reward scaling) must do far better."""
    result = run_script(
        "ppo_gru_baseline",
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
    """With --anneal-lr (the default) update k of n uses lr * (1 - (k - 1) / n): 3e-3, 2e-3, 1e-3 for n = 3, as
    logged in charts/learning_rate (the optimizer's lr). A constant lr would not decay."""
    result = run_script(
        "ppo_gru_baseline",
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
    # iteration 2 of 4 at 6,000 steps an iteration and 100 SPS: 12,000 steps to go take 120 s
    ppo_gru_baseline.print_progress(2, 4, 12000, 100, [50.0], {0: [40.0], 1: []})
    line = capsys.readouterr().out.strip()
    assert line.startswith("iter 2/4 step 12000 SPS 100 return 50.0 | m0 40 m1 -")
    assert line.endswith("| 2.0 min left")
