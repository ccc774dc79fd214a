"""Tests for cleanrl_astral/ppo_gru_astral.py: the ASTRAL module, its regularisers and metrics, and the
recurrent PPO plumbing it shares with the baseline."""
import glob
import json
import dataclasses
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_astral import ppo_gru_astral as m
from cleanrl_astral import ppo_gru_baseline as baseline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "cleanrl_astral", "ppo_gru_astral.py")
TINY = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--hidden-size", "16", "--slot-dim", "8"]


def run(args, **kwargs):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, **kwargs)


def scalars(run_dir, tag):
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def rollout(memory="gru", oracle=False, num_envs=8, num_steps=64, seed=0, K=3):
    torch.manual_seed(seed)
    modes = m.resolve_modes("seed3", None)
    envs = m.make_vector_env(num_envs, modes)
    agent = m.Agent(4, 2, len(modes), 32, memory, oracle, num_abstractions=K, slot_dim=8)
    # sharpen the gate so slot weights differ clearly between states
    with torch.no_grad():
        agent.bank.gate[-1].weight.mul_(300.0)
    carry = m.new_carry(envs, agent, seed, "cpu")
    for _ in range(2):
        batch, initial_state, episodes = m.collect_rollout(agent, envs, carry, num_steps, 0.99, None, "cpu")
    return agent, batch, initial_state


# --- the ASTRAL module ------------------------------------------------------------------------------------


def test_shapes_and_gradient_reaches_every_parameter():
    agent, batch, initial_state = rollout()
    _, logprob, entropy, value, state, weights = agent.get_action_and_value(batch["inputs"], initial_state, batch["starts"], batch["actions"])
    assert logprob.shape == value.shape == (64, 8) and state.shape == (8, 32) and weights.shape == (64, 8, 3)
    assert torch.allclose(weights.sum(-1), torch.ones(64, 8))
    assert agent.bank.slots.shape == (3, 8)
    loss = -logprob.mean() + value.pow(2).mean() + m.weight_entropy(weights) - m.load_balance_entropy(weights) + m.orthogonality_penalty(agent.bank.slots)
    loss.backward()
    for name, param in agent.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    groups = {name.split(".")[0] for name, _ in agent.named_parameters()}
    assert groups == {"encoder", "gru", "bank", "film", "actor", "critic"}


def test_slot_init_scale_and_uniform_initial_gate():
    torch.manual_seed(0)
    agent = m.Agent(4, 2, 3, 128, num_abstractions=64, slot_dim=64)
    assert agent.bank.slots.std().item() == pytest.approx(0.02, rel=0.1)
    _, weights = agent.bank(torch.randn(10, 128))
    assert torch.allclose(weights, torch.full_like(weights, 1 / 64), atol=2e-3)


def test_heads_see_only_the_film_modulated_state():
    torch.manual_seed(0)
    agent = m.Agent(4, 2, 3, 16, num_abstractions=3, slot_dim=8)
    with torch.no_grad():
        agent.bank.slots.normal_()
    hidden = torch.randn(5, 16)
    # changing z (through the gate weights) changes both heads
    a = agent.actor(agent.modulate(hidden, torch.eye(3)[[0] * 5])[0])
    b = agent.actor(agent.modulate(hidden, torch.eye(3)[[1] * 5])[0])
    va = agent.critic(agent.modulate(hidden, torch.eye(3)[[0] * 5])[0])
    vb = agent.critic(agent.modulate(hidden, torch.eye(3)[[1] * 5])[0])
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
    bank = m.AbstractionBank(16, 4, 8, 1.0)
    for k in range(4):
        z, _ = bank(torch.randn(3, 16), torch.eye(4)[[k] * 3])
        assert torch.equal(z, bank.slots[k].expand(3, 8))


def test_regularisers_on_hand_made_inputs():
    uniform = torch.full((10, 4), 0.25)
    onehot = torch.eye(4)[[0, 1, 2, 3, 0, 1, 2, 3]]
    assert m.weight_entropy(uniform).item() == pytest.approx(math.log(4), abs=1e-6)
    assert m.weight_entropy(onehot).item() == pytest.approx(0.0, abs=1e-6)
    # one-hot per sample but balanced over the batch: maximal load-balance entropy
    assert m.load_balance_entropy(onehot).item() == pytest.approx(math.log(4), abs=1e-6)
    assert m.load_balance_entropy(torch.eye(4)[[2] * 8]).item() == pytest.approx(0.0, abs=1e-6)
    identical = torch.ones(3, 5)
    assert m.orthogonality_penalty(identical).item() == pytest.approx(6.0, abs=1e-5)  # 6 off-diagonal ones
    orthonormal = torch.linalg.qr(torch.randn(5, 5))[0][:3] * 7.0  # scale does not matter: rows are normalised
    assert m.orthogonality_penalty(orthonormal).item() == pytest.approx(0.0, abs=1e-6)


def test_temperature_sharpens_the_gate():
    torch.manual_seed(0)
    bank = m.AbstractionBank(16, 3, 8, 1.0)
    h = torch.randn(4, 16)
    _, w1 = bank(h)
    bank.tau = 0.001
    _, w2 = bank(h)
    assert m.weight_entropy(w2) < m.weight_entropy(w1)


def test_mutual_information_metric():
    modes = np.repeat([0, 1, 2], 99)
    mi, nmi = m.mutual_information(m.mode_slot_counts(modes, (modes + 1) % 3, 3, 3))
    assert mi == pytest.approx(math.log(3)) and nmi == pytest.approx(1.0)
    # slot independent of mode: every slot equally often in every mode
    mi, nmi = m.mutual_information(m.mode_slot_counts(modes, np.tile([0, 1, 2], 99), 3, 3))
    assert mi == pytest.approx(0.0, abs=1e-12) and nmi == pytest.approx(0.0, abs=1e-12)
    # two modes sharing a slot: I = H(mode) - H(mode | slot) = log 3 - (2/3) log 2
    mi, _ = m.mutual_information(m.mode_slot_counts(modes, np.minimum(modes, 1), 3, 3))
    assert mi == pytest.approx(math.log(3) - 2 / 3 * math.log(2))


# --- recurrent PPO with the gate --------------------------------------------------------------------------


@pytest.mark.parametrize("memory,oracle", [("gru", False), ("none", False), ("gru", True)])
def test_first_minibatch_ratio_and_gate_are_reproduced(memory, oracle):
    agent, batch, initial_state = rollout(memory, oracle)
    assert initial_state.abs().sum() > 0 and batch["starts"][1:].sum() > 0
    adv, ret = m.compute_gae(batch["rewards"], batch["values"], batch["starts"], torch.zeros(8), torch.zeros(8), 0.99, 0.95)
    args = m.Args(num_minibatches=2, update_epochs=2)
    stats = m.ppo_update(agent, torch.optim.Adam(agent.parameters(), lr=1e-3), batch, initial_state, adv, ret, args)
    assert stats["first_minibatch_ratio_error"] < 1e-5 and stats["first_minibatch_gate_error"] < 1e-5
    # the gate really varies along the batch, so reproducing it is not trivial
    assert batch["weights"].std(dim=(0, 1)).max() > 0.05


def test_gate_replay_from_zero_state_would_differ():
    agent, batch, initial_state = rollout()
    with torch.no_grad():
        *_, right = agent.get_action_and_value(batch["inputs"], initial_state, batch["starts"], batch["actions"])
        *_, wrong = agent.get_action_and_value(batch["inputs"], torch.zeros_like(initial_state), batch["starts"], batch["actions"])
    assert (right - batch["weights"]).abs().max() < 1e-5 and (wrong - batch["weights"]).abs().max() > 1e-3


def test_environment_is_the_baselines():
    """The env is copied from ppo_gru_baseline.py (single-file rule); identical seeds and actions must give
    identical trajectories, so the two scripts are compared on the same task."""
    for kwargs in ({}, {"hide_velocity": True}, {"switch_prob": 0.3}):
        modes = m.MODE_PRESETS["inverted4"]
        assert modes == baseline.MODE_PRESETS["inverted4"]
        envs = [mod.make_env(modes, **kwargs)() for mod in (m, baseline)]
        outs = [env.reset(seed=5) for env in envs]
        assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][1]["mode"] == outs[1][1]["mode"]
        rng = np.random.default_rng(0)
        for _ in range(200):
            a = int(rng.integers(2))
            outs = [env.step(a) for env in envs]
            assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][1:4] == outs[1][1:4]
            assert outs[0][4]["mode"] == outs[1][4]["mode"]
            if outs[0][2] or outs[0][3]:
                outs = [env.reset() for env in envs]
                assert outs[0][1]["mode"] == outs[1][1]["mode"]


# --- script-level behaviour -------------------------------------------------------------------------------


def test_smoke_save_evaluate_json_and_heatmap(tmp_path):
    result = run([*TINY, "--total-timesteps", "256", "--runs-dir", str(tmp_path), "--save-model", "--eval-episodes", "2",
                  "--modes-preset", "inverted4", "--num-abstractions", "5"])
    assert result.returncode == 0, result.stderr
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    report = json.load(open(os.path.join(run_dir, "eval.json")))
    weights = np.array(report["slot_weights_deterministic"])
    assert weights.shape == (4, 5) and np.allclose(weights.sum(1), 1.0, atol=1e-5)
    assert 0.0 <= report["mode_slot_nmi_deterministic"] <= 1.0
    png = os.path.join(run_dir, "slot_heatmap.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    for tag in ("slots/mode_slot_nmi", "slots/mode_slot_mi", "slots/mode3_w4", "slots/usage_w0", "slots/weight_entropy",
                "slots/load_balance_entropy", "slots/orthogonality", "charts/episodic_return"):
        assert scalars(run_dir, tag), tag
    assert any(scalars(run_dir, f"charts/episodic_return_mode{k}") for k in range(4))
    assert max(v for _, v in scalars(run_dir, "debug/first_minibatch_ratio_error")) < 1e-5
    assert max(v for _, v in scalars(run_dir, "debug/first_minibatch_gate_error")) < 1e-5
    model = os.path.join(run_dir, "ppo_gru_astral.cleanrl_model")
    out = m.evaluate(model, episodes_per_mode=2, modes=[(5.0, 0.9, 1.0)])
    assert out["slot_weights"].shape == (1, 5) and out["slot_counts"].sum() == sum(out["returns"][0])
    with pytest.raises(ValueError, match="written by ppo_gru_astral"):
        baseline.evaluate(model)


# The checkpoint, resume and logging plumbing is the baseline's, copied into this script: these run on both.
BOTH_SCRIPTS = pytest.mark.parametrize("script,tiny", [
    (SCRIPT, TINY), (os.path.join(ROOT, "cleanrl_astral", "ppo_gru_baseline.py"), TINY[:-2]),
], ids=["astral", "baseline"])


@BOTH_SCRIPTS
def test_a_checkpoint_never_claims_updates_whose_logs_are_not_on_disk(tmp_path, die_at_checkpoint, script, tiny):
    args = [*tiny, "--total-timesteps", str(64 * 10), "--runs-dir", str(tmp_path), "--checkpoint-every", "1"]
    result = subprocess.run([sys.executable, "-c", die_at_checkpoint(3), script, *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (ckpt_path,) = glob.glob(str(tmp_path / "*" / "checkpoint.pt"))
    assert torch.load(ckpt_path, weights_only=True)["iteration"] == 3
    assert [s for s, _ in scalars(os.path.dirname(ckpt_path), "charts/SPS")] == [64, 128, 192]


@BOTH_SCRIPTS
def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, occupied_run_names, script, tiny):
    """Runs of one command and seed started in the same second (a shell loop over flags) used to share
    runs/{run_name}: their TensorBoard events mixed, and the later run's files replaced the earlier run's."""
    check = occupied_run_names(str(tmp_path), "NonStationaryCartPole__collide__7__")
    result = subprocess.run([sys.executable, script, *tiny, "--total-timesteps", "64", "--exp-name", "collide",
                             "--seed", "7", "--runs-dir", str(tmp_path), "--save-model", "--eval-episodes", "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    run_dir = check()
    assert os.path.isfile(os.path.join(run_dir, "collide.cleanrl_model"))
    assert os.path.isfile(os.path.join(run_dir, "eval.json"))


@BOTH_SCRIPTS
def test_a_runs_dir_that_is_a_file_is_a_one_line_error(tmp_path, script, tiny):
    (tmp_path / "runs").write_text("")
    result = subprocess.run([sys.executable, script, *tiny, "--total-timesteps", "64", "--runs-dir",
                             str(tmp_path / "runs")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{os.path.basename(script)}: error: ")
    assert "--runs-dir" in lines[0] and "not a directory" in lines[0], result.stderr
    assert result.stdout == ""


@BOTH_SCRIPTS
def test_resumed_run_logs_every_update_exactly_once(tmp_path, die_at_checkpoint, logged_scalars, script, tiny):
    """Killed after logging update 4 but before checkpointing it, the run resumes from update 3 and plays update 4
    again. TensorBoard must show the resumed run's update 4 only (purge_step), and every episode at the step it
    ended: an episode logged at its update's first step would share a step with the previous update's logs."""
    args = [*tiny, "--total-timesteps", str(64 * 6), "--runs-dir", str(tmp_path), "--checkpoint-every", "1"]
    result = subprocess.run([sys.executable, "-c", die_at_checkpoint(4, written=False), script, *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (ckpt_path,) = glob.glob(str(tmp_path / "*" / "checkpoint.pt"))
    run_dir = os.path.dirname(ckpt_path)
    assert torch.load(ckpt_path, weights_only=True)["global_step"] == 192
    killed = logged_scalars(run_dir)
    # update 4 reached the disk, episodes included, and nothing later
    assert max(step for events in killed.values() for step, _ in events) == 256
    assert any(192 < step for step, _ in killed["charts/episodic_return"])
    resumed_at = time.time()
    result = subprocess.run([sys.executable, script, "--resume", ckpt_path], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    final = logged_scalars(run_dir)
    assert [step for step, _ in final["charts/SPS"]] == [64, 128, 192, 256, 320, 384]
    stale = [(tag, step) for tag, events in final.items() for step, wall in events if (step > 192) != (wall > resumed_at)]
    assert not stale, stale[:5]
    assert any(step > 192 for step, _ in final["charts/episodic_return"])


@BOTH_SCRIPTS
def test_resume_carries_on_the_optimizer_and_reward_scaler(tmp_path, die_at_checkpoint, script, tiny):
    """Killed after update 2 of 3 and resumed, the run must end with the Adam step count and the reward scaler's
    sample count of the run left alone: both continue from the checkpoint instead of starting afresh (their
    moments differ, because the resumed run restarts the episodes that were in flight)."""
    args = [*tiny, "--total-timesteps", str(64 * 3), "--checkpoint-every", "1"]
    alone = subprocess.run([sys.executable, script, *args, "--runs-dir", str(tmp_path / "whole")], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    cut = subprocess.run([sys.executable, "-c", die_at_checkpoint(2), script, *args, "--runs-dir", str(tmp_path / "cut")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cut.returncode == 0, cut.stderr
    (ckpt_path,) = glob.glob(str(tmp_path / "cut" / "*" / "checkpoint.pt"))
    killed = torch.load(ckpt_path, weights_only=True)
    assert killed["iteration"] == 2
    result = subprocess.run([sys.executable, script, "--resume", ckpt_path], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (whole_path,) = glob.glob(str(tmp_path / "whole" / "*" / "checkpoint.pt"))
    whole, resumed = torch.load(whole_path, weights_only=True), torch.load(ckpt_path, weights_only=True)
    assert resumed["iteration"] == whole["iteration"] == 3
    adam_steps = lambda ckpt: {int(state["step"]) for state in ckpt["optimizer"]["state"].values()}  # noqa: E731
    assert adam_steps(resumed) == adam_steps(whole) and adam_steps(whole) == {3 * adam_steps(killed).pop() // 2}
    assert resumed["reward_scaler"]["count"] == pytest.approx(whole["reward_scaler"]["count"])
    assert resumed["reward_scaler"]["count"] > killed["reward_scaler"]["count"] > 1


@BOTH_SCRIPTS
def test_a_flag_beside_resume_must_agree_with_the_checkpoint(tmp_path, script, tiny):
    """A resumed run takes the checkpoint's settings. A flag that disagrees (asking for more steps, say) used to be
    dropped without a word; it is refused in one line before any work. A flag that agrees is accepted."""
    result = subprocess.run([sys.executable, script, *tiny, "--total-timesteps", "128", "--checkpoint-every", "1",
                             "--runs-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (ckpt_path,) = glob.glob(str(tmp_path / "*" / "checkpoint.pt"))
    before = os.path.getmtime(ckpt_path)
    for flags, needle in ((["--total-timesteps", "256"], "--total-timesteps 256 differs from the checkpoint's 128"),
                          (["--no-norm-reward"], "--norm-reward False differs from the checkpoint's True")):
        result = subprocess.run([sys.executable, script, "--resume", ckpt_path, *flags], cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and needle in lines[0], result.stderr
    assert os.path.getmtime(ckpt_path) == before
    result = subprocess.run([sys.executable, script, "--resume", ckpt_path, "--num-envs", "4"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "resumed" in result.stdout, result.stderr


def test_resume_continues_the_run(tmp_path):
    result = run([*TINY, "--total-timesteps", "128", "--runs-dir", str(tmp_path), "--checkpoint-every", "1"])
    assert result.returncode == 0, result.stderr
    (ckpt_path,) = glob.glob(str(tmp_path / "*" / "checkpoint.pt"))
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["args"]["total_timesteps"] = 256  # extend the budget, as if the first run had been killed half-way
    torch.save(ckpt, ckpt_path)
    result = run(["--resume", ckpt_path])
    assert result.returncode == 0, result.stderr
    final = m.load_checkpoint(ckpt_path)
    assert final["iteration"] == 4 and final["global_step"] == 256
    steps = [s for s, _ in scalars(os.path.dirname(ckpt_path), "charts/SPS")]
    assert steps == [64, 128, 192, 256]


BAD_INPUTS = [
    (["--num-abstractions", "0"], "--num-abstractions must be at least 1"),
    (["--tau", "0"], "--tau 0.0 must be positive"),
    (["--tau", "-1"], "must be positive"),
    (["--slot-dim", "0"], "--slot-dim must be at least 1"),
    (["--lambda-orth", "-0.1"], "--lambda-orth must be non-negative"),
    (["--num-envs", "6", "--num-minibatches", "4"], "not divisible"),
    (["--num-envs", "4", "--num-minibatches", "4", "--num-steps", "1"], "a minibatch of one step"),
    (["--modes", "9.8"], "malformed mode"),
    (["--learning-rate", "nan"], "--learning-rate nan must be a finite number"),
    (["--gamma", "-1"], "--gamma -1.0 must be in (0, 1]"),
    (["--gae-lambda", "2"], "--gae-lambda 2.0 in [0, 1]"),
    (["--clip-coef", "0"], "--clip-coef 0.0 must be positive"),
    (["--max-grad-norm", "-1"], "--max-grad-norm -1.0 must be positive"),
    (["--seed", "-1"], "--seed -1 must be in [0, 2**32 - 1]"),
    (["--tau", "inf"], "--tau inf must be a finite number"),
    (["--lambda-w-ent", "nan"], "--lambda-w-ent nan must be a finite number"),
    (["--ent-coef", "-1"], "--ent-coef -1.0 must be non-negative"),
    (["--target-kl", "0"], "--target-kl 0.0 must be positive"),
]


@pytest.mark.parametrize("flags,message", BAD_INPUTS)
def test_bad_input_fails_fast_with_one_line(tmp_path, flags, message):
    result = run([*flags, "--runs-dir", str(tmp_path)])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("ppo_gru_astral.py: error:")
    assert not os.listdir(tmp_path)


def test_baseline_checkpoint_is_refused(tmp_path):
    path = tmp_path / "base.pt"
    torch.save({"script": "ppo_gru_baseline", "format": 1}, path)
    result = run(["--resume", str(path)])
    assert result.returncode == 2 and "written by ppo_gru_baseline" in result.stderr


def test_a_saved_model_cannot_be_resumed(tmp_path):
    """--save-model's file holds no optimizer or RNG state: --resume on it is a one-line error, not a KeyError."""
    model = tmp_path / "ppo_gru_astral.cleanrl_model"
    torch.save({"script": "ppo_gru_astral", "format": m.CHECKPOINT_FORMAT, "args": dataclasses.asdict(m.Args()),
                "modes": [], "run_name": "r", "state_dict": {}}, model)
    result = run(["--resume", str(model), "--runs-dir", str(tmp_path / "runs")])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "is a saved model, not a training checkpoint" in result.stderr and not (tmp_path / "runs").exists()


def test_learning_happens(tmp_path):
    """Catches a broken learner (FiLM or gate wiring that blocks the policy): random play averages ~22."""
    result = run(["--total-timesteps", "32768", "--num-envs", "16", "--num-steps", "128", "--runs-dir", str(tmp_path), "--seed", "1"])
    assert result.returncode == 0, result.stderr
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    returns = [v for _, v in scalars(run_dir, "charts/episodic_return")]
    assert np.mean(returns[:50]) < 40
    assert np.mean(returns[-50:]) > 100


def test_reward_scaler_is_the_baselines():
    rng = np.random.default_rng(1)
    ours, theirs = m.RewardScaler(4, 0.99), baseline.RewardScaler(4, 0.99)
    for _ in range(20):
        rewards, dones = rng.normal(1.0, 1.0, 4), rng.random(4) < 0.1
        assert np.array_equal(ours(rewards, dones), theirs(rewards, dones.copy()))


@pytest.mark.parametrize("module", [baseline, m], ids=["ppo_gru_baseline", "ppo_gru_astral"])
def test_unroll_equals_stepping_the_gru_module_with_resets(module):
    # unroll calls torch.gru_cell on the module's weights directly; it must equal nn.GRUCell step by step, with the
    # state zeroed exactly where starts = 1 (random biases, so swapped ih/hh weights or biases would show)
    torch.manual_seed(0)
    agent = module.Agent(4, 2, 3, 16)
    with torch.no_grad():
        for p in agent.gru.parameters():
            p.normal_()
    x, state = torch.randn(7, 3, agent.input_dim), torch.randn(3, 16)
    starts = torch.zeros(7, 3)
    starts[0, 1] = starts[3, 0] = starts[5, 2] = 1.0
    hidden, last = agent.unroll(x, state, starts)
    h, expected = state, []
    for t in range(7):
        h = agent.gru(agent.encoder(x[t]), h * (1 - starts[t]).unsqueeze(-1))
        expected.append(h)
    torch.testing.assert_close(hidden, torch.stack(expected), rtol=1e-5, atol=1e-6)  # encoder batching rounds differently
    torch.testing.assert_close(last, expected[-1], rtol=1e-5, atol=1e-6)
