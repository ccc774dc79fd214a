"""Tests for cleanrl_astral/ppo_gru_baseline.py: each would fail if the mechanism it names were wrong."""
import copy
import glob
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_astral import ppo_gru_astral
from cleanrl_astral import ppo_gru_baseline as m

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "cleanrl_astral", "ppo_gru_baseline.py")
TINY = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--hidden-size", "16"]


def run(args, **kwargs):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, **kwargs)


def scalars(run_dir, tag):
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def rollout(memory="gru", oracle=False, hide_velocity=False, num_envs=8, num_steps=64, iterations=2, seed=0):
    """A real rollout with an untrained agent; the second one starts from a non-zero GRU state and
    crosses several episode boundaries (random CartPole episodes last ~20 steps)."""
    torch.manual_seed(seed)
    modes = m.resolve_modes("seed3", None)
    envs = m.make_vector_env(num_envs, modes, hide_velocity)
    agent = m.Agent(2 if hide_velocity else 4, 2, len(modes), 32, memory, oracle)
    carry = m.new_carry(envs, agent, seed, "cpu")
    for _ in range(iterations):
        batch, initial_state, episodes = m.collect_rollout(agent, envs, carry, num_steps, 0.99, None, "cpu")
    return agent, batch, initial_state, episodes, carry


def zero_state_step(agent, inputs):
    """The GRU output of every step as if the state entering it were zero."""
    features = agent.encoder(inputs)
    flat = features.reshape(-1, features.shape[-1])
    return agent.gru(flat, torch.zeros_like(flat)).reshape(features.shape)


def update_args(**overrides):
    args = m.Args(num_minibatches=2, update_epochs=2)
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


# --- recurrent PPO mechanics -------------------------------------------------------------------------


@pytest.mark.parametrize("memory,oracle", [("gru", False), ("none", False), ("gru", True)])
def test_first_minibatch_ratio_is_one(memory, oracle):
    agent, batch, initial_state, _, _ = rollout(memory, oracle)
    assert initial_state.abs().sum() > 0 and batch["starts"][1:].sum() > 0
    adv, ret = m.compute_gae(batch["rewards"], batch["values"], batch["starts"], torch.zeros(8), torch.zeros(8), 0.99, 0.95)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
    stats = m.ppo_update(agent, optimizer, batch, initial_state, adv, ret, update_args())
    assert stats["first_minibatch_ratio_error"] < 1e-5


def test_replay_check_detects_wrong_state_handling():
    """The ratio check above is sensitive: replaying from a zero state, or ignoring episode starts,
    changes the log-probs of the rollout."""
    agent, batch, initial_state, _, _ = rollout("gru")
    with torch.no_grad():
        _, right, _, _, _ = agent.get_action_and_value(batch["inputs"], initial_state, batch["starts"], batch["actions"])
        _, zero_state, _, _, _ = agent.get_action_and_value(batch["inputs"], torch.zeros_like(initial_state), batch["starts"], batch["actions"])
        _, no_reset, _, _, _ = agent.get_action_and_value(batch["inputs"], initial_state, torch.zeros_like(batch["starts"]), batch["actions"])
    assert (right - batch["logprobs"]).abs().max() < 1e-5
    assert (zero_state - batch["logprobs"]).abs().max() > 1e-4
    assert (no_reset - batch["logprobs"]).abs().max() > 1e-4


def test_hidden_state_and_prev_inputs_are_zero_at_episode_starts():
    agent, batch, initial_state, _, _ = rollout("gru")
    starts = batch["starts"].bool()
    inputs = batch["inputs"]
    prev_action, prev_reward = inputs[..., 4:6], inputs[..., 6]
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
    agent, batch, initial_state, _, _ = rollout("none")
    with torch.no_grad():
        hidden, _ = agent.unroll(batch["inputs"], initial_state, batch["starts"])
        fresh = zero_state_step(agent, batch["inputs"])
    assert torch.allclose(hidden, fresh, atol=1e-6)


def test_no_autoreset_transition_enters_the_batch():
    agent, batch, _, episodes, _ = rollout("gru")
    obs = batch["inputs"][..., :4]
    # every stored transition is a real CartPole step: reward 1, and never a terminal observation
    assert torch.all(batch["raw_rewards"] == 1.0)
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


def test_rollout_checks_catch_next_step_autoreset():
    """Negative control: gymnasium's default NEXT_STEP autoreset does leak a fake transition (reward 0),
    which the check above would catch."""
    modes = m.resolve_modes("seed3", None)
    envs = gym.vector.SyncVectorEnv([m.make_env(modes) for _ in range(4)])
    agent = m.Agent(4, 2, 3, 16)
    carry = m.new_carry(envs, agent, 0, "cpu")
    batch, _, _ = m.collect_rollout(agent, envs, carry, 64, 0.99, None, "cpu")
    assert torch.any(batch["raw_rewards"] == 0.0)


def test_truncation_bootstraps_from_the_final_observation():
    modes = [(9.8, 0.5, 1.0)]

    def make():
        return m.NonStationaryCartPole(gym.make("CartPole-v1", max_episode_steps=5), modes)

    envs = gym.vector.SyncVectorEnv([make], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    torch.manual_seed(0)
    agent = m.Agent(4, 2, 1, 16)
    carry = m.new_carry(envs, agent, 3, "cpu")
    batch, initial_state, _ = m.collect_rollout(agent, envs, carry, 5, 0.99, None, "cpu")
    assert torch.all(batch["rewards"][:4] == 1.0)
    # recompute the final observation by replaying the same actions on an identically seeded env
    env = make()
    env.reset(seed=3)
    for a in batch["actions"][:, 0].tolist():
        final_obs, *_ = env.step(a)
    with torch.no_grad():
        _, state = agent.unroll(batch["inputs"], initial_state, batch["starts"])
        x = agent.build_input(torch.as_tensor(final_obs)[None], batch["actions"][4], torch.ones(1), torch.zeros(1))
        v_final = agent.get_value(x[None], state, torch.zeros(1, 1))[0, 0]
    assert batch["rewards"][4, 0].item() == pytest.approx(1.0 + 0.99 * v_final.item(), abs=1e-5)


def test_gae_does_not_bootstrap_across_episode_boundaries():
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    values = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    starts = torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    adv, ret = m.compute_gae(rewards, values, starts, torch.tensor([50.0]), torch.tensor([1.0]), 0.5, 1.0)
    # step 3 and step 1 end episodes: their deltas are r - V, with nothing from the next step
    assert adv[3, 0] == pytest.approx(4.0 - 40.0)
    assert adv[1, 0] == pytest.approx(2.0 - 20.0)
    assert adv[2, 0] == pytest.approx((3.0 + 0.5 * 40.0 - 30.0) + 0.5 * adv[3, 0])
    assert adv[0, 0] == pytest.approx((1.0 + 0.5 * 20.0 - 10.0) + 0.5 * adv[1, 0])
    assert torch.allclose(ret, adv + values)


@pytest.mark.parametrize("module", [m, ppo_gru_astral], ids=["ppo_gru_baseline", "ppo_gru_astral"])
@pytest.mark.parametrize("next_start", [0.0, 1.0])
def test_gae_matches_its_definition_with_discounting_and_bootstrapping(forward_gae, next_start, module):
    """gamma and lambda both below 1, episodes cut inside the rollout, and the rollout's last step bootstrapping
    from next_value unless the next step opens an episode: every advantage equals GAE summed forwards (both PPO
    scripts carry their own compute_gae)."""
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[1.0, -1.0], [2.0, 0.5], [3.0, 2.0], [4.0, -3.0], [0.5, 1.0]])
    values = torch.tensor([[10.0, 1.0], [20.0, -2.0], [30.0, 3.0], [40.0, 0.0], [5.0, 6.0]])
    starts = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    next_value, next_start_t = torch.tensor([50.0, -7.0]), torch.tensor([next_start, 0.0])
    adv, ret = module.compute_gae(rewards, values, starts, next_value, next_start_t, gamma, lam)
    for n in range(2):
        continues = [1.0 - starts[t + 1, n].item() for t in range(4)] + [1.0 - next_start_t[n].item()]
        expected = forward_gae(rewards[:, n].tolist(), values[:, n].tolist() + [next_value[n].item()], continues,
                               gamma, lam)
        assert adv[:, n].tolist() == pytest.approx(expected, rel=1e-6)
    assert torch.allclose(ret, adv + values)


# --- environment ---------------------------------------------------------------------------------------


def trajectory(mode, actions, seed=0, hide_velocity=False):
    env = m.make_env(m.MODE_PRESETS["inverted4"], hide_velocity, fixed_mode=mode)()
    obs, info = env.reset(seed=seed)
    out = [obs]
    for a in actions:
        obs, *_ = env.step(a)
        out.append(obs)
    return np.array(out), env


def test_each_mode_applies_its_physics():
    actions = [1, 1, 0, 1, 0, 0, 1, 1]
    trajs = [trajectory(k, actions)[0] for k in range(4)]
    for k, (g, l, s) in enumerate(m.MODE_PRESETS["inverted4"]):
        _, env = trajectory(k, [])
        cp = env.unwrapped
        assert (cp.gravity, cp.length, cp.force_mag) == (g, l, s * 10.0)
        assert cp.polemass_length == pytest.approx(cp.masspole * l)
    # same start, same actions: the three seed3 physics diverge, and mode 3 equals mode 0 only before a push
    for a in range(3):
        for b in range(a + 1, 4):
            assert not np.allclose(trajs[a][1:], trajs[b][1:])
    np.testing.assert_allclose(trajs[0][0], trajs[3][0])


def test_inverted_mode_pushes_the_other_way():
    normal, _ = trajectory(0, [1])
    inverted, _ = trajectory(3, [1])
    # action 1 pushes right: cart velocity goes up in mode 0 and down in the inverted mode
    assert normal[1, 1] > normal[0, 1] and inverted[1, 1] < inverted[0, 1]


def test_hide_velocity_observes_position_and_angle():
    full, _ = trajectory(0, [1, 0, 1])
    hidden, env = trajectory(0, [1, 0, 1], hide_velocity=True)
    assert env.observation_space.shape == (2,)
    np.testing.assert_array_equal(hidden, full[:, [0, 2]])


def test_mode_resampling():
    env = m.make_env(m.MODE_PRESETS["seed3"])()
    starts = [env.reset(seed=s)[1]["mode"] for s in range(30)]
    assert set(starts) == {0, 1, 2}
    stay = m.make_env(m.MODE_PRESETS["seed3"], switch_prob=0.0)()
    switch = m.make_env(m.MODE_PRESETS["seed3"], switch_prob=1.0)()
    for env, expect_change in ((stay, False), (switch, True)):
        _, info = env.reset(seed=0)
        seen = {info["mode"]}
        for _ in range(8):
            seen.add(env.step(0)[4]["mode"])
        assert (len(seen) > 1) == expect_change
    fixed = m.make_env(m.MODE_PRESETS["seed3"], fixed_mode=2, switch_prob=1.0)()
    assert {fixed.reset(seed=s)[1]["mode"] for s in range(10)} == {2}


def test_parse_modes():
    assert m.parse_modes("9.8,0.5 7.5,0.7 12.0,0.4 9.8,0.5,-1") == [(9.8, 0.5, 1.0), (7.5, 0.7, 1.0), (12.0, 0.4, 1.0), (9.8, 0.5, -1.0)]
    for bad in ("9.8", "9.8,0.5,2", "a,b", "9.8,-0.5", ""):
        with pytest.raises(ValueError):
            m.parse_modes(bad)


# --- script-level behaviour ----------------------------------------------------------------------------


def test_smoke_save_evaluate_round_trip(tmp_path):
    result = run([*TINY, "--total-timesteps", "256", "--runs-dir", str(tmp_path), "--save-model", "--eval-episodes", "2", "--hide-velocity"])
    assert result.returncode == 0, result.stderr
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    model = os.path.join(run_dir, "ppo_gru_baseline.cleanrl_model")
    report = json.load(open(os.path.join(run_dir, "eval.json")))
    assert set(report["per_mode"]) == {"0", "1", "2"}
    assert all(len(report["per_mode"][k]["deterministic"]["returns"]) == 2 for k in "012")
    # training logged what the benchmark reads, and the replay check held on every update
    assert scalars(run_dir, "charts/episodic_return") and scalars(run_dir, "charts/episodic_return_mode0")
    errors = [v for _, v in scalars(run_dir, "debug/first_minibatch_ratio_error")]
    assert len(errors) == 4 and max(errors) < 1e-5
    # evaluate() works on a saved file with unseen physics, and never writes to it
    before = open(model, "rb").read()
    results = m.evaluate(model, episodes_per_mode=3, modes=[(5.0, 0.9, 1.0), (15.0, 0.3, -1.0)])
    assert set(results) == {0, 1} and all(len(r) == 3 and np.all(r >= 1) for r in results.values())
    assert open(model, "rb").read() == before


def test_controls_and_tracking_run(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    for extra in (["--memory", "none"], ["--oracle", "--track"], ["--modes-preset", "inverted4", "--switch-prob", "0.05"]):
        result = run([*TINY, "--total-timesteps", "128", "--runs-dir", str(tmp_path / extra[-1])] + extra, env=env)
        assert result.returncode == 0, result.stderr
        (run_dir,) = glob.glob(str(tmp_path / extra[-1] / "*"))
        assert max(v for _, v in scalars(run_dir, "debug/first_minibatch_ratio_error")) < 1e-5
    assert glob.glob(str(tmp_path / "--track" / "*" / "wandb" / "offline-run-*"))


def test_capture_video_writes_one_video_per_mode(tmp_path):
    result = run([*TINY, "--total-timesteps", "64", "--runs-dir", str(tmp_path), "--save-model", "--capture-video", "--eval-episodes", "1"])
    assert result.returncode == 0, result.stderr
    videos = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "*" / "videos" / "*.mp4")))
    assert [v.split("-")[0] for v in videos] == ["mode0", "mode1", "mode2"]


# A kill right after or right before a checkpoint, and the resumed run's logs: tests in test_ppo_gru_astral.py
# run on this script too (BOTH_SCRIPTS).


def test_resume_after_kill_loses_no_finished_update(tmp_path):
    args = [*TINY, "--total-timesteps", str(64 * 100), "--runs-dir", str(tmp_path), "--checkpoint-every", "1"]
    proc = subprocess.Popen([sys.executable, SCRIPT, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    ckpt_path, iteration = None, 0
    while time.monotonic() < deadline and iteration < 3:
        found = glob.glob(str(tmp_path / "*" / "checkpoint.pt"))
        if found:
            ckpt_path = found[0]
            try:
                iteration = torch.load(ckpt_path, weights_only=True)["iteration"]
            except FileNotFoundError:
                pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert iteration >= 3, proc.stderr.read().decode()
    ckpt = m.load_checkpoint(ckpt_path)  # the kill never leaves a half-written checkpoint
    assert ckpt["iteration"] < 100
    result = run(["--resume", ckpt_path])
    assert result.returncode == 0, result.stderr
    assert f"resumed" in result.stdout
    final = m.load_checkpoint(ckpt_path)
    assert final["iteration"] == 100 and final["global_step"] == 64 * 100
    steps = [s for s, _ in scalars(os.path.dirname(ckpt_path), "charts/SPS")]
    # every update was logged exactly once across the two processes: none lost, none repeated
    assert sorted(steps) == list(range(64, 64 * 101, 64))


def test_checkpoint_holds_optimizer_and_scaler(tmp_path):
    """What a resume needs is in the checkpoint; that a resume uses it is
    test_ppo_gru_astral.py::test_resume_carries_on_the_optimizer_and_reward_scaler (run on both scripts)."""
    result = run([*TINY, "--total-timesteps", "128", "--runs-dir", str(tmp_path), "--checkpoint-every", "1"])
    assert result.returncode == 0, result.stderr
    (ckpt_path,) = glob.glob(str(tmp_path / "*" / "checkpoint.pt"))
    ckpt = m.load_checkpoint(ckpt_path)
    assert ckpt["optimizer"]["state"] and ckpt["reward_scaler"]["count"] > 1
    assert ckpt["global_step"] == 128 and ckpt["iteration"] == 2


BAD_INPUTS = [
    (["--num-envs", "6", "--num-minibatches", "4"], "not divisible"),
    (["--num-envs", "4", "--num-minibatches", "4", "--num-steps", "1"], "a minibatch of one step"),
    (["--modes-preset", "seed7"], "unknown --modes-preset"),
    (["--modes", "9.8,0.5 oops"], "malformed mode"),
    (["--fixed-mode", "3"], "--fixed-mode 3 is out of range"),
    (["--memory", "lstm"], "unknown --memory"),
    (["--total-timesteps", "10"], "less than one rollout"),
    (["--resume", "/nonexistent/checkpoint.pt"], "does not exist"),
    (["--learning-rate", "nan"], "--learning-rate nan must be a finite number"),
    (["--gamma", "-1"], "--gamma -1.0 must be in (0, 1]"),
    (["--gae-lambda", "2"], "--gae-lambda 2.0 in [0, 1]"),
    (["--clip-coef", "0"], "--clip-coef 0.0 must be positive"),
    (["--max-grad-norm", "-1"], "--max-grad-norm -1.0 must be positive"),
    (["--seed", "-1"], "--seed -1 must be in [0, 2**32 - 1]"),
    (["--target-kl", "nan"], "--target-kl nan must be a finite number"),
    (["--ent-coef", "-1"], "--ent-coef -1.0 must be non-negative"),
    (["--target-kl", "0"], "--target-kl 0.0 must be positive"),
]


@pytest.mark.parametrize("flags,message", BAD_INPUTS)
def test_bad_input_fails_fast_with_one_line(tmp_path, flags, message):
    result = run([*flags, "--runs-dir", str(tmp_path)])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("ppo_gru_baseline.py: error:")
    assert not os.listdir(tmp_path)  # no run directory: nothing started


def test_incompatible_checkpoints_are_refused(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"script": "ppo_gru_astral", "format": 1}, other)
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    for path, message in ((other, "written by ppo_gru_astral"), (junk, "not a readable torch file")):
        result = run(["--resume", str(path)])
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
        with pytest.raises(ValueError, match=message):
            m.evaluate(str(path))
    # a saved model (what --save-model writes) holds no optimizer or RNG state: it cannot continue a run
    model = tmp_path / "ppo_gru_baseline.cleanrl_model"
    torch.save({"script": "ppo_gru_baseline", "format": m.CHECKPOINT_FORMAT, "args": dataclasses.asdict(m.Args()),
                "modes": [], "run_name": "r", "state_dict": {}}, model)
    result = run(["--resume", str(model), "--runs-dir", str(tmp_path / "runs")])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "is a saved model, not a training checkpoint" in result.stderr and not (tmp_path / "runs").exists()


def test_learning_happens(tmp_path):
    """Catches a broken learner: a random CartPole policy averages ~22; 30k steps of this PPO must do far better."""
    result = run(["--total-timesteps", "32768", "--num-envs", "16", "--num-steps", "128", "--runs-dir", str(tmp_path), "--seed", "1"])
    assert result.returncode == 0, result.stderr
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    returns = [v for _, v in scalars(run_dir, "charts/episodic_return")]
    assert np.mean(returns[:50]) < 40
    assert np.mean(returns[-50:]) > 100


def test_reward_scaler_divides_by_running_std_of_discounted_return():
    """Checked against a direct computation: the running variance over all discounted returns seen so far,
    with each environment's return restarting after its episode ends."""
    rng = np.random.default_rng(0)
    scaler = m.RewardScaler(3, gamma=0.9)
    returns, history = np.zeros(3), []
    for t in range(40):
        rewards, dones = rng.normal(5.0, 2.0, 3), rng.random(3) < 0.2
        returns = returns * 0.9 + rewards
        history.extend(returns)
        # pooled with the scaler's prior (mean 0, variance 1, count 1e-4), as gymnasium's NormalizeReward
        n, mean, var, prior = len(history), np.mean(history), np.var(history), 1e-4
        pooled = (prior + var * n + mean**2 * prior * n / (n + prior)) / (n + prior)
        expected = rewards / np.sqrt(pooled + 1e-8)
        returns[dones] = 0.0
        np.testing.assert_allclose(scaler(rewards, dones), expected, rtol=1e-9)
    restored = m.RewardScaler(3, 0.9)
    restored.load_state_dict(scaler.state_dict())
    assert (restored.mean, restored.var, restored.count) == (scaler.mean, scaler.var, scaler.count)


# --- the PPO update, term by term ----------------------------------------------------------------------


class ScriptedAgent(torch.nn.Module):
    """Stands in for the agent in ppo_update: the log-prob, entropy and value of every (step, env) are free
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
    test reads the derivatives of the loss ppo_update minimised, and every minibatch and run sees the same agent."""

    def __init__(self, module):
        self.named = list(module.named_parameters())
        self.grads = []

    def zero_grad(self):
        for _, p in self.named:
            p.grad = None

    def step(self):
        self.grads.append({n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in self.named})


def scripted_update(advantages, returns, old_values, new_values=None, **overrides):
    """ppo_update on a ScriptedAgent whose log-probs equal the acted ones (ratio 1), without gradient clipping:
    returns (agent, spy, stats)."""
    T, N = advantages.shape
    env_index = torch.arange(N, dtype=torch.float32)
    batch = {"inputs": env_index.expand(T, N)[..., None].clone(), "starts": torch.zeros(T, N),
             "actions": torch.zeros(T, N, dtype=torch.long), "logprobs": torch.full((T, N), -0.7), "values": old_values}
    new_values = old_values if new_values is None else new_values
    agent = ScriptedAgent(batch["logprobs"], new_values, torch.full((T, N), 0.6))
    spy = GradSpy(agent)
    args = update_args(max_grad_norm=1e9, **overrides)
    stats = m.ppo_update(agent, spy, batch, env_index[:, None], advantages, returns, args)
    return agent, spy, stats


def test_entropy_bonus_lowers_the_loss():
    """The loss is pg_loss - ent_coef * H + vf_coef * v_loss (H the minibatch-mean entropy): its derivative with
    respect to each sample's entropy is -ent_coef / (samples in the minibatch). A + sign would minimise entropy, so
    training would drive the policy deterministic instead of exploring."""
    gen = torch.Generator().manual_seed(0)
    T, N = 4, 2
    adv, ret = torch.randn(T, N, generator=gen), torch.randn(T, N, generator=gen)
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
    _, spy, stats = scripted_update(torch.ones(2, 2), ret, old, new, num_minibatches=1, update_epochs=1,
                                    clip_coef=0.2, vf_coef=0.5, clip_vloss=True)
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
    T, N = 3, 4
    adv = torch.randn(T, N, generator=gen) * torch.tensor([1.0, 1.0, 20.0, 20.0]) + torch.tensor([5.0, 5.0, -40.0, 9.0])
    agent, spy, _ = scripted_update(adv, torch.zeros(T, N), torch.zeros(T, N), num_minibatches=2, update_epochs=1,
                                    norm_adv=norm_adv)
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
    T, N = 2, 8
    agent, spy, _ = scripted_update(torch.ones(T, N), torch.zeros(T, N), torch.zeros(T, N), num_minibatches=4,
                                    update_epochs=3)
    assert len(agent.minibatches) == len(spy.grads) == 12
    for epoch in range(3):
        minibatches = agent.minibatches[4 * epoch : 4 * epoch + 4]
        assert [len(mb) for mb in minibatches] == [2] * 4
        assert sorted(i for mb in minibatches for i in mb) == list(range(N)), minibatches


def synthetic_batch(agent, T=6, N=4, seed=0):
    """A batch as collect_rollout returns it, acted by `agent` on random inputs (episodes restart mid-rollout),
    with random advantages and returns: (batch, initial_state, advantages, returns)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(T, N, agent.input_dim, generator=gen)
    starts = torch.zeros(T, N)
    starts[0], starts[T // 2, ::2] = 1.0, 1.0
    initial_state = torch.zeros(N, agent.hidden_size)
    actions = torch.randint(0, 2, (T, N), generator=gen)
    with torch.no_grad():
        _, logprobs, _, values, *_ = agent.get_action_and_value(inputs, initial_state, starts, actions)
    batch = {"inputs": inputs, "starts": starts, "actions": actions, "logprobs": logprobs, "values": values}
    return batch, initial_state, torch.randn(T, N, generator=gen), torch.randn(T, N, generator=gen)


def test_target_kl_stops_the_update_after_the_epoch_that_exceeds_it():
    """--target-kl ends the update after the first epoch whose last minibatch's approx_kl exceeds it. With a tiny
    target, the first epoch's second minibatch already sees a moved policy, so only that epoch's 2 Adam steps are
    taken (of 2 minibatches x 4 epochs = 8); without a target, or with a huge one, all 8 are."""
    torch.manual_seed(0)
    agent = m.Agent(4, 2, 3, 16)
    batch, initial_state, adv, ret = synthetic_batch(agent)
    steps = {}
    for target_kl in (None, 1e-8, 1e3):
        trained = copy.deepcopy(agent)
        optimizer = torch.optim.Adam(trained.parameters(), lr=1e-2)
        args = update_args(num_minibatches=2, update_epochs=4, target_kl=target_kl)
        stats = m.ppo_update(trained, optimizer, batch, initial_state, adv, ret, args)
        steps[target_kl] = int(optimizer.state[trained.actor[-1].weight]["step"])
        if target_kl == 1e-8:
            assert stats["approx_kl"] > target_kl
    assert steps == {None: 8, 1e-8: 2, 1e3: 8}


def test_episodes_cut_by_the_time_limit_are_logged():
    """An episode ends when it terminates or is truncated by the time limit; both are finished episodes and must
    reach the episode log (charts/episodic_return). With a 5-step limit no CartPole episode can fail, so every
    episode here is a truncation: 2 envs x 12 steps finish 4 episodes of return 5, at steps 4 and 9."""
    modes = [(9.8, 0.5, 1.0)]

    def make():
        return m.NonStationaryCartPole(gym.make("CartPole-v1", max_episode_steps=5), modes)

    envs = gym.vector.SyncVectorEnv([make, make], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    torch.manual_seed(0)
    agent = m.Agent(4, 2, 1, 16)
    carry = m.new_carry(envs, agent, 0, "cpu")
    batch, _, episodes = m.collect_rollout(agent, envs, carry, 12, 0.99, None, "cpu")
    # truncations, not failures: their rewards were bootstrapped, and the envs restart right after
    assert torch.all(batch["rewards"][[4, 9]] != 1.0) and torch.all(batch["starts"][[5, 10]] == 1.0)
    assert sorted(episodes) == [(5.0, 5, 0, 4)] * 2 + [(5.0, 5, 0, 9)] * 2


def test_learning_rate_anneals_linearly_to_zero(tmp_path):
    """With --anneal-lr (the default) update k of n uses lr * (1 - (k - 1) / n): 3e-3, 2e-3, 1e-3 for n = 3, as
    logged in charts/learning_rate (the optimizer's lr). A constant lr would not decay."""
    result = run(["--num-envs", "2", "--num-steps", "8", "--num-minibatches", "1", "--update-epochs", "1",
                  "--hidden-size", "8", "--total-timesteps", "48", "--learning-rate", "0.003",
                  "--checkpoint-every", "0", "--runs-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    logged = scalars(run_dir, "charts/learning_rate")
    assert [step for step, _ in logged] == [16, 32, 48]
    assert [lr for _, lr in logged] == pytest.approx([3e-3, 2e-3, 1e-3], rel=1e-6)
