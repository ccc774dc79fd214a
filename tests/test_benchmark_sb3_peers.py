"""Tests of benchmark/sb3_peers.py: its NonStationaryCartPole gives ppo_gru_baseline.py's trajectories, its callback logs
every episode under its mode, bad values are refused before any work, and RecurrentPPO uses the zoo's policy and
saves its observation normalisation."""

import dataclasses
import glob
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from benchmark_helpers import load_benchmark_script, run_benchmark_script
from helpers import assert_one_line_error, load_json, only_run_dir

import cleanrl_astral.ppo_gru_baseline as ppo_gru_baseline

sb3_peers = load_benchmark_script("sb3_peers")


# random actions end an episode in about 20 steps: 100 episodes are about 2,000 steps of each mode
EPISODES_PER_MODE = 100


@pytest.mark.parametrize("preset,hide_velocity", [("seed3", False), ("inverted4", True)])
def test_peers_env_gives_the_baselines_trajectories(preset, hide_velocity):
    """The peers' gymnasium env (one CartPole-v1 per env, as SB3 steps it) and ppo_gru_baseline's vectorised env,
    started from the same state in the same mode and given the same actions, return the same observations, rewards,
    terminations and modes, over episodes in every mode."""
    modes = ppo_gru_baseline.MODE_PRESETS[preset]
    assert sb3_peers.resolve_modes(preset, None) == modes
    rng = np.random.default_rng(0)
    episodes = 0
    for k in range(len(modes)):
        ours = ppo_gru_baseline.NonStationaryCartPole(1, modes, hide_velocity, fixed_mode=k)
        theirs = sb3_peers.make_env(modes, hide_velocity, fixed_mode=k)()
        obs_a, info_a = ours.reset(seed=k)
        for _ in range(EPISODES_PER_MODE):
            obs_b, info_b = theirs.reset(seed=k)
            theirs.unwrapped.state = ours.state[0].copy()
            np.testing.assert_array_equal(obs_a[0], ours.state[0, [0, 2] if hide_velocity else slice(None)].astype(np.float32))
            assert info_a["mode"][0] == info_b["mode"] == k
            done = False
            while not done:
                action = int(rng.integers(2))
                obs_a, rew_a, term_a, trunc_a, info_a = ours.step(np.array([action]))
                obs_b, rew_b, term_b, trunc_b, info_b = theirs.step(action)
                np.testing.assert_array_equal(info_a["final_obs"][0], obs_b)
                assert (rew_a[0], term_a[0], trunc_a[0]) == (rew_b, term_b, trunc_b) and info_b["mode"] == k
                done = term_b or trunc_b
            episodes += 1
    assert episodes == EPISODES_PER_MODE * len(modes) and obs_b.shape == ((2,) if hide_velocity else (4,))


def test_peers_use_the_baselines_mode_presets_and_never_train_on_a_held_out_mode():
    assert (
        sb3_peers.MODE_PRESETS == ppo_gru_baseline.MODE_PRESETS and sb3_peers.HELD_OUT_MODES == ppo_gru_baseline.HELD_OUT_MODES
    )
    env = sb3_peers.make_env(sb3_peers.MODE_PRESETS["mirror4"], switch_prob=0.5, held_out=[4])()
    _, info = env.reset(seed=0)
    seen = [info["mode"]]
    for _ in range(400):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        seen.append(info["mode"])
        if terminated or truncated:
            _, info = env.reset()
            seen.append(info["mode"])
    assert set(seen) == {0, 1, 2, 3}


@pytest.mark.parametrize("normalize", [False, True])
def test_peers_callback_logs_each_episode_under_its_mode(normalize):
    class Spy(gym.Wrapper):
        """Ground truth: (return, mode) of every finished episode, seen from inside the env."""

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            self.ret = 0.0
            self.mode = info["mode"]
            return obs, info

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.ret += reward
            if terminated or truncated:
                finished.append((self.ret, self.mode))
            return obs, reward, terminated, truncated, info

    class Writer:
        def __init__(self):
            self.calls = []

        def add_scalar(self, tag, value, step):
            self.calls.append((tag, value))

    finished = []
    writer = Writer()
    modes = sb3_peers.MODE_PRESETS["inverted4"]
    envs = sb3_peers.DummyVecEnv([lambda: Spy(sb3_peers.make_env(modes)()) for _ in range(3)])
    if normalize:  # as for recurrent_ppo: the wrapper has reset_infos of its own, which hold no mode
        envs = sb3_peers.VecNormalize(envs, norm_obs=True, norm_reward=False)
    args = sb3_peers.Args(num_envs=3, num_steps=64, minibatch_size=64, update_epochs=1, total_timesteps=192)
    model = sb3_peers.build_model(args, envs)
    model.set_logger(sb3_peers.configure(None, []))
    model.learn(args.total_timesteps, callback=sb3_peers.CleanRLLogger(writer, 10**9))
    logged_returns = [v for t, v in writer.calls if t == "charts/episodic_return"]
    logged_modes = [
        (v, int(t[len("charts/episodic_return_mode") :]))
        for t, v in writer.calls
        if t.startswith("charts/episodic_return_mode")
    ]
    assert len(finished) > 5
    assert sorted(logged_returns) == sorted(r for r, _ in finished)
    assert sorted(logged_modes) == sorted(finished)
    assert any(t == "losses/value_loss" for t, _ in writer.calls) and any(t == "charts/SPS" for t, _ in writer.calls)


def test_peers_bad_flag_exits_2():
    r = run_benchmark_script("sb3_peers", "--algo", "a2c")
    assert_one_line_error(r, "unknown --algo 'a2c'")
    assert r.stderr.startswith("sb3_peers.py: error: unknown --algo")


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"learning_rate": float("nan")}, "--learning-rate nan must be a finite number"),
        ({"max_grad_norm": float("nan")}, "--max-grad-norm nan must be a finite number"),
        ({"gamma": -1.0}, "--gamma -1.0 must be in (0, 1]"),
        ({"clip_coef": 0.0}, "--clip-coef 0.0 must be positive"),
        ({"ent_coef": -0.1}, "--ent-coef -0.1 must be non-negative"),
        ({"seed": -1}, "--seed -1 must be in"),
        ({"minibatch_size": 1}, "--minibatch-size must be at least 2"),
        ({"modes_preset": "mirror4", "fixed_mode": 4}, "--fixed-mode 4 is held out of training in mirror4"),
    ],
)
def test_peers_refuse_meaningless_values_before_any_work(overrides, needle):
    """Each would otherwise train silently with the value, or fail inside SB3 after the run directory exists."""
    with pytest.raises(ValueError) as err:
        sb3_peers.validate(dataclasses.replace(sb3_peers.Args(), **overrides))
    assert needle in str(err.value)
    sb3_peers.validate(sb3_peers.Args())


@pytest.fixture(scope="module")
def recurrent_ppo_run(tmp_path_factory):
    """The run directory of one tiny RecurrentPPO run with --hide-velocity and --save-model (two evaluation episodes
    per mode), shared by the tests below."""
    runs_dir = tmp_path_factory.mktemp("recurrent_ppo")
    run_benchmark_script(
        "sb3_peers",
        "--algo",
        "recurrent_ppo",
        "--hide-velocity",
        "--total-timesteps",
        "256",
        "--num-envs",
        "2",
        "--num-steps",
        "64",
        "--minibatch-size",
        "64",
        "--update-epochs",
        "1",
        "--lstm-hidden-size",
        "8",
        "--save-model",
        "--eval-episodes",
        "2",
        "--runs-dir",
        runs_dir,
        check=True,
    )
    return only_run_dir(runs_dir)


def test_peers_recurrent_ppo_smoke(recurrent_ppo_run):
    data = load_json(os.path.join(recurrent_ppo_run, "eval.json"))
    assert sorted(data["per_mode"]) == ["0", "1", "2"]
    assert all(len(m["deterministic"]["returns"]) == 2 for m in data["per_mode"].values())


def test_peers_recurrent_ppo_uses_the_zoo_policy_and_its_saved_obs_normalisation(recurrent_ppo_run):
    # rl-baselines3-zoo ppo_lstm.yml CartPoleNoVel-v1: ReLU, no orthogonal init, LSTM 64 with a critic LSTM,
    # pi/vf [64], observations normalised (rewards not)
    args = sb3_peers.Args(algo="recurrent_ppo", hide_velocity=True)
    model = sb3_peers.build_model(args, sb3_peers.make_sb3_env(2, sb3_peers.MODE_PRESETS["seed3"], True))
    pol = model.policy
    assert pol.lstm_actor.hidden_size == 64 and pol.lstm_critic is not None and not pol.ortho_init
    assert pol.activation_fn is torch.nn.ReLU and pol.net_arch == dict(pi=[64], vf=[64])
    assert sb3_peers.normalizes_obs("recurrent_ppo") and not sb3_peers.normalizes_obs("ppo")
    (path,) = glob.glob(os.path.join(recurrent_ppo_run, "*.cleanrl_model"))
    rms = torch.load(path, weights_only=True)["obs_rms"]
    assert rms["mean"].shape == (2,) and rms["mean"].abs().sum() > 0  # statistics of real observations were saved
    _, _, _, prep = sb3_peers.load_policy(str(path))
    obs = np.array([[0.1, -0.05]], dtype=np.float32)
    expected = np.clip(
        (obs - rms["mean"].numpy()) / np.sqrt(rms["var"].numpy() + rms["epsilon"]), -rms["clip_obs"], rms["clip_obs"]
    )
    assert np.allclose(prep(obs), expected, atol=1e-6) and not np.allclose(prep(obs), obs)


def test_peers_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names):
    """A run whose runs/{run_name} another run of the same command and seed holds writes into run_name__2: sharing
    the directory would mix their TensorBoard events."""
    check = occupied_run_names(str(tmp_path), "NonStationaryCartPole__collide__7__")
    flags = ["--algo", "ppo", "--total-timesteps", "128", "--num-envs", "2", "--num-steps", "64", "--minibatch-size", "64"]
    flags += ["--update-epochs", "1", "--exp-name", "collide", "--seed", "7", "--runs-dir", tmp_path]
    run_benchmark_script("sb3_peers", *flags, check=True)
    check()
