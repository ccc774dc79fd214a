"""Tests for --env-id other than NonStationaryCartPole in ppo_gru_baseline.py and ppo_gru_astral.py: the gymnasium vector
env (same-step autoreset, the final observation's bootstrap, flattened observations, MultiDiscrete actions), the
refusals, --no-prev-reward, MMER and its cadence, and what a run on such an env logs and saves."""

import collections
import copy
import dataclasses
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import REPO, SCRIPT_ENV, assert_one_line_error, load_json, logged_scalars, only_run_dir, run_script
from ppo_gru_main import run_main

import cleanrl_astral.ppo_gru_astral as ppo_gru_astral
import cleanrl_astral.ppo_gru_baseline as ppo_gru_baseline
import cleanrl_astral.tta_gating as tta_gating

SCRIPTS = {"ppo_gru_baseline": ppo_gru_baseline, "ppo_gru_astral": ppo_gru_astral}
EPISODE_STEPS = 5  # StepCounter's time limit


class StepCounter(gym.Env):
    """Observes how many steps its episode has run (0 after reset), reward 1 per step, never terminates: only the
    registered time limit of EPISODE_STEPS truncates it, so its final observation is EPISODE_STEPS."""

    observation_space = gym.spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.t], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], dtype=np.float32), 1.0, False, False, {}


class FixedObservation(gym.Env):
    """Returns `obs` of `observation_space` after reset and every step; its action space is `action_space`."""

    def __init__(self, observation_space, obs, action_space=None):
        self.observation_space = observation_space
        self.obs = obs
        self.action_space = action_space or gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return copy.deepcopy(self.obs), {}

    def step(self, action):
        return copy.deepcopy(self.obs), 0.0, False, False, {}


class ActionEcho(gym.Env):
    """Observes the last action it was given, of the MultiDiscrete([2, 3]) action space, starts (1, -1)."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3], start=[1, -1])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        return np.asarray(action, dtype=np.float32), 0.0, False, False, {}


gym.register("EnvIdTestStepCounter-v0", entry_point=StepCounter, max_episode_steps=EPISODE_STEPS)
gym.register("EnvIdTestActionEcho-v0", entry_point=ActionEcho)
gym.register("EnvIdTestBoxAction-v0", entry_point=FixedObservation, kwargs={
    "observation_space": gym.spaces.Discrete(2), "obs": 0, "action_space": gym.spaces.Box(-1.0, 1.0, (1,))
})  # fmt: skip

# each observation space kind, one fixed observation and its flattening written out by hand
FLATTENED = {
    "box": (gym.spaces.Box(-5.0, 5.0, (2, 2)), np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), [1, 2, 3, 4]),
    "discrete": (gym.spaces.Discrete(3), 2, [0, 0, 1]),
    "multidiscrete": (gym.spaces.MultiDiscrete([2, 3]), np.array([1, 2]), [0, 1, 0, 0, 1]),
    "tuple": (
        gym.spaces.Tuple((gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.Discrete(2))),
        (np.array([0.5, -1.0], np.float32), 1),
        [0.5, -1, 0, 1],
    ),
    "dict": (
        gym.spaces.Dict({"b": gym.spaces.Discrete(2), "a": gym.spaces.Box(-5.0, 5.0, (1,))}),
        {"b": 0, "a": np.array([3.0], np.float32)},
        [3, 1, 0],  # gymnasium's Dict sorts its keys
    ),
}
for kind, (space, obs, _) in FLATTENED.items():
    gym.register(f"EnvIdTestObs{kind}-v0", entry_point=FixedObservation, kwargs={"observation_space": space, "obs": obs})


@pytest.mark.parametrize("kind", list(FLATTENED))
def test_observations_of_every_space_kind_are_flattened_to_float32(kind):
    expected = np.array(FLATTENED[kind][2], dtype=np.float32)
    envs = ppo_gru_baseline.GymVectorEnv(f"EnvIdTestObs{kind}-v0", 3)
    obs, _ = envs.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (3, len(expected))
    np.testing.assert_array_equal(obs, np.tile(expected, (3, 1)))
    obs, _, _, _, info = envs.step(np.zeros(3, dtype=int))
    np.testing.assert_array_equal(obs, np.tile(expected, (3, 1)))
    assert ppo_gru_baseline.env_spaces(f"EnvIdTestObs{kind}-v0").obs_dim == len(expected)


def test_a_multidiscrete_action_space_is_one_discrete_read_in_mixed_radix():
    space = gym.spaces.MultiDiscrete([2, 3], start=[1, -1])
    digits = [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]  # the first digit the most significant
    np.testing.assert_array_equal(ppo_gru_baseline.env_action(space, np.arange(6)), np.array(digits) + [1, -1])
    np.testing.assert_array_equal(ppo_gru_baseline.env_action(gym.spaces.Discrete(3, start=-1), np.arange(3)), [-1, 0, 1])
    assert ppo_gru_baseline.env_spaces("EnvIdTestActionEcho-v0") == (2, 6)
    envs = ppo_gru_baseline.GymVectorEnv("EnvIdTestActionEcho-v0", 2)
    envs.reset(seed=0)
    obs, _, _, _, _ = envs.step(np.array([5, 3]))  # the env observes the action it was given
    np.testing.assert_array_equal(obs, [[2, 1], [2, -1]])


def test_the_vector_env_autoresets_in_the_same_step_and_keeps_the_final_observation():
    """At the truncating step the returned observation already opens the next episode (0) and info["final_obs"] holds
    the ended one's last (EPISODE_STEPS); the step after it is a real step of the new episode (observation 1, reward 1).
    With NEXT_STEP autoreset the truncating step would return EPISODE_STEPS and the next one a reset with reward 0."""
    envs = ppo_gru_baseline.GymVectorEnv("EnvIdTestStepCounter-v0", 2)
    obs, _ = envs.reset(seed=0)
    assert obs[:, 0].tolist() == [0, 0]
    for t in range(1, EPISODE_STEPS + 2):
        obs, reward, terminated, truncated, info = envs.step(np.zeros(2, dtype=int))
        assert reward.tolist() == [1.0, 1.0] and not terminated.any()
        if t < EPISODE_STEPS:
            assert obs[:, 0].tolist() == [t, t] and not truncated.any()
        if t == EPISODE_STEPS:
            assert truncated.all() and obs[:, 0].tolist() == [0, 0]
            assert info["final_obs"][:, 0].tolist() == [EPISODE_STEPS, EPISODE_STEPS]
        if t == EPISODE_STEPS + 1:
            assert obs[:, 0].tolist() == [1, 1] and not truncated.any()


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_truncated_gymnasium_episode_bootstraps_from_its_final_observation(name):
    """The rollout of a training run on StepCounter with a value function that reads the observation: the truncating
    step's reward is 1 + gamma * V(final observation) = 1 + gamma * EPISODE_STEPS; every other step's is 1 (no reset
    step with reward 0 enters the batch), and the step after the truncation opens an episode whose input shows
    observation 0."""
    module = SCRIPTS[name]
    gamma = 0.9

    def value_is_the_observation(x, state, starts):
        return x[..., 0]

    def agent_reading_the_observation(*args, **kwargs):
        agent = module.agent_from_args(*args, **kwargs)
        agent.get_value = value_is_the_observation
        return agent

    flags = ["--env-id", "EnvIdTestStepCounter-v0", "--num-envs", 2, "--num-steps", 2 * EPISODE_STEPS, "--gamma", gamma]
    flags += ["--total-timesteps", 4 * EPISODE_STEPS, "--num-minibatches", 1, "--hidden-size", 8, "--no-norm-reward"]
    run = run_main(module, *flags, agent_from_args=agent_reading_the_observation)
    _, batch, _, episodes, *_ = run.rollouts[0]
    expected = np.ones((2 * EPISODE_STEPS, 2))
    expected[[EPISODE_STEPS - 1, 2 * EPISODE_STEPS - 1]] += gamma * EPISODE_STEPS
    np.testing.assert_allclose(batch["rewards"].numpy(), expected, rtol=1e-6)
    np.testing.assert_array_equal(batch["inputs"][:, :, 0].numpy(), np.tile(np.arange(EPISODE_STEPS), 2)[:, None] * [1, 1])
    assert batch["starts"][[0, EPISODE_STEPS]].all() and batch["starts"].sum() == 4
    assert [episode[:2] for episode in episodes] == [(EPISODE_STEPS, EPISODE_STEPS)] * 4


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_nonstationary_cartpole_flags_and_box_actions_are_refused_for_another_env(name):
    module = SCRIPTS[name]
    settings = {
        "modes_preset": "mirror4",
        "hide_velocity": True,
        "fixed_mode": 1,
        "mode_share": "balanced",
        "switch_prob": 0.1,
        "oracle": True,
        "capture_video": True,
    }
    assert set(settings) == set(module.CARTPOLE_ONLY_FLAGS)
    for field, value in settings.items():
        args = module.Args(env_id="CartPole-v1", save_model=True, **{field: value})
        with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} applies to --env-id NonStationaryCartPole only"):
            module.validate(args)
        module.validate(dataclasses.replace(args, env_id="NonStationaryCartPole", mode_share="uniform", fixed_mode=None))
    module.validate(module.Args(env_id="CartPole-v1"))  # the defaults are not refused
    with pytest.raises(ValueError, match="Box action space; only Discrete and MultiDiscrete are supported"):
        module.validate(module.Args(env_id="EnvIdTestBoxAction-v0"))


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_box_action_space_is_one_line_at_the_command_line(name, tmp_path):
    result = run_script(name, "--env-id", "Pendulum-v1", "--runs-dir", tmp_path)
    assert_one_line_error(result, "--env-id Pendulum-v1 has a Box action space; only Discrete and MultiDiscrete")


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_no_prev_reward_drops_the_reward_channel(name):
    module = SCRIPTS[name]
    assert module.Args().prev_reward
    with_reward = module.agent_from_args(module.Args(), 3)
    without = module.agent_from_args(module.Args(prev_reward=False), 3)
    assert without.input_dim == with_reward.input_dim - 1 == 4 + 2
    obs = torch.randn(5, 4)
    action = torch.tensor([0, 1, -1, 1, 0])
    mode = torch.zeros(5)
    np.testing.assert_array_equal(
        without.build_input(obs, action, torch.randn(5), mode), without.build_input(obs, action, torch.randn(5), mode)
    )
    rewards = torch.randn(5)
    assert torch.equal(with_reward.build_input(obs, action, rewards, mode)[:, -1], rewards)


def test_mmer_is_sampled_every_65536_steps_and_at_the_end_only():
    batch = 4096
    total = 500_000 // batch * batch
    sampled = [
        step
        for step in range(batch, total + 1, batch)
        if ppo_gru_baseline.mmer_due(step - batch, step, step == total)  # fmt: skip
    ]
    assert sampled == [65536 * k for k in range(1, 8)] + [total]
    assert not ppo_gru_baseline.mmer_due(65536, 65536 + batch, False)  # no sample between two multiples
    assert ppo_gru_baseline.mmer_due(60000, 70000, False)  # a batch that crosses a multiple


class Scalars:
    def __init__(self):
        self.logged = []

    def add_scalar(self, tag, value, step):
        self.logged.append((tag, value, step))


def test_mmer_is_the_max_over_samples_of_the_mean_of_the_last_100_episodes():
    writer = Scalars()
    recent = collections.deque(maxlen=100)
    mmer = ppo_gru_baseline.log_mmer(writer, float("-inf"), recent, 1)
    assert writer.logged == [] and mmer == float("-inf")  # no episode yet: nothing to sample
    recent.extend([0.0] * 50 + [1.0] * 100)  # the window holds the last 100: mean 1
    mmer = ppo_gru_baseline.log_mmer(writer, mmer, recent, 2)
    recent.extend([-1.0] * 100)  # a worse window does not lower the max
    mmer = ppo_gru_baseline.log_mmer(writer, mmer, recent, 3)
    recent.extend([0.5] * 100)
    mmer = ppo_gru_baseline.log_mmer(writer, mmer, recent, 4)
    assert writer.logged == [("charts/mmer", 1.0, 2), ("charts/mmer", 1.0, 3), ("charts/mmer", 1.0, 4)] and mmer == 1.0


def test_the_scripts_share_the_env_code_as_one_text():
    """The env code, and the rollout's reward bookkeeping (scaling, the time-limit bootstrap, the episode log and the next
    input), are the same text in both scripts."""
    import inspect

    for name in ("EnvSpaces", "make_gym_env", "env_spaces", "env_action", "GymVectorEnv", "mmer_due"):
        assert inspect.getsource(getattr(ppo_gru_baseline, name)) == inspect.getsource(getattr(ppo_gru_astral, name)), name
    for name in ("log_mmer", "env_returns", "next_input"):
        assert inspect.getsource(getattr(ppo_gru_baseline, name)) == inspect.getsource(getattr(ppo_gru_astral, name)), name

    def rollout_text(module, start, end):
        source = inspect.getsource(module)
        first = source.index(start)
        return source[first : source.index(end, first)]

    for start, end in (
        ("            if reward_scaler is not None:\n", "            rewards[step] = "),
        ("            episode_return = episode_return + reward\n", "            next_start = "),
    ):
        assert rollout_text(ppo_gru_baseline, start, end) == rollout_text(ppo_gru_astral, start, end), start


# --- runs on CartPole-v1 ---------------------------------------------------------------------------------------------
RUN = ["--env-id", "CartPole-v1", "--num-envs", "64", "--num-steps", "64", "--num-minibatches", "2", "--hidden-size", "8"]


def saved_run(tmp_path, name, total_timesteps):
    """The run directory of a saved and evaluated `name` run on CartPole-v1 (4,096-step updates, one epoch each)."""
    flags = [*RUN, "--update-epochs", "1", "--total-timesteps", total_timesteps, "--save-model", "--eval-episodes", "4"]
    run_script(name, *flags, "--runs-dir", tmp_path, check=True, env=SCRIPT_ENV)
    return only_run_dir(tmp_path)


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    """A baseline run just over two MMER periods (33 updates of 4,096 steps)."""
    return saved_run(tmp_path_factory.mktemp("baseline_env"), "ppo_gru_baseline", 135168)


@pytest.fixture(scope="module")
def astral_run(tmp_path_factory):
    return saved_run(tmp_path_factory.mktemp("astral_env"), "ppo_gru_astral", 8192)


def test_a_run_logs_mmer_at_its_cadence_and_no_mode_metric(baseline_run):
    scalars = logged_scalars(baseline_run)
    assert [step for step, _ in scalars["charts/mmer"]] == [65536, 131072, 135168]
    returns = scalars["charts/episodic_return"]
    assert len(returns) > 100 and len(scalars["charts/episodic_length"]) == len(returns)
    first_mean = np.mean([value for step, value in returns if step <= 65536][-100:])
    assert scalars["charts/mmer"][0][1] == pytest.approx(first_mean, rel=1e-5)
    assert not [tag for tag in scalars if "mode" in tag or "probe" in tag]


def test_a_saved_run_evaluates_any_env_into_eval_json(baseline_run):
    report = load_json(f"{baseline_run}/eval.json")
    scalars = logged_scalars(baseline_run)
    assert report["env_id"] == "CartPole-v1" and report["episodes"] == 4
    assert report["mmer"] == pytest.approx(scalars["charts/mmer"][-1][1])
    for kind in ("deterministic", "sampled"):
        returns = report[kind]["returns"]
        assert len(returns) == 4 and all(value >= 1 for value in returns)
        assert report[kind]["mean"] == pytest.approx(np.mean(returns)) and report[kind]["std"] == pytest.approx(
            np.std(returns)
        )
        assert scalars[f"eval/episodic_return_{kind}"][0][1] == pytest.approx(report[kind]["mean"])
    assert not [key for key in report if "mode" in key or "probe" in key]


def test_astral_logs_gate_entropy_and_slot_usage_but_no_mode_metric(astral_run):
    scalars = logged_scalars(astral_run)
    assert {"slots/weight_entropy", "slots/usage_w0", "slots/usage_w1", "slots/usage_w2", "charts/mmer"} <= set(scalars)
    usage = [scalars[f"slots/usage_w{k}"][0][1] for k in range(3)]
    assert sum(usage) == pytest.approx(1.0, abs=1e-5)
    assert not [tag for tag in scalars if "mode" in tag or "nmi" in tag or "probe" in tag]
    report = load_json(f"{astral_run}/eval.json")
    assert report["env_id"] == "CartPole-v1" and len(report["sampled"]["returns"]) == 4
    assert not [key for key in report if "mode" in key or "slot" in key or "probe" in key]


def test_tta_gating_refuses_a_checkpoint_of_another_env(astral_run):
    (model,) = [f"{astral_run}/ppo_gru_astral.cleanrl_model"]
    with pytest.raises(ValueError, match="was trained on --env-id CartPole-v1; tta_gating.py gates NonStationaryCartPole"):
        tta_gating.load_astral_checkpoint(model)
    result = run_script("tta_gating", "adapt", "--checkpoint", model, "--runs-dir", f"{astral_run}/tta")
    assert_one_line_error(result, "was trained on --env-id CartPole-v1")


def test_popgym_is_imported_for_popgym_ids_only():
    """A fresh interpreter: importing the script or making another id leaves popgym unimported; a popgym-* id imports
    it and its env is made (Discrete(4) observations, one-hot; Discrete(4) actions)."""
    code = (
        "import sys\n"
        "import cleanrl_astral.ppo_gru_baseline as m\n"
        "m.env_spaces('CartPole-v1')\n"
        "assert 'popgym' not in sys.modules\n"
        "assert m.env_spaces('popgym-RepeatPreviousEasy-v0') == (4, 4)\n"
        "assert 'popgym' in sys.modules\n"
        "obs, _ = m.GymVectorEnv('popgym-RepeatPreviousEasy-v0', 2).reset(seed=0)\n"
        "assert obs.dtype.name == 'float32' and obs.shape == (2, 4) and (obs.sum(1) == 1).all()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=SCRIPT_ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
