"""Tests for cleanrl_astral/tta_gating.py: it reads ppo_gru_astral.py's checkpoints with identical copies of the
environment and agent, each control updates exactly the parameters it promises, the REINFORCE loss reaches the
gate, clamping sets z = A_k, and both subcommands run end to end and refuse bad input."""
import copy
import dataclasses
import glob
import hashlib
import inspect
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_astral import ppo_gru_astral as astral
from cleanrl_astral import tta_gating as m

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "cleanrl_astral", "tta_gating.py")
TINY_TRAIN = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1", "--hidden-size", "16",
              "--slot-dim", "8", "--total-timesteps", "64", "--save-model", "--eval-episodes", "1"]


def run(args, **kwargs):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, **kwargs)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint written by a tiny ppo_gru_astral.py run (the real producer, not a hand-made dict)."""
    runs = tmp_path_factory.mktemp("astral_runs")
    subprocess.run([sys.executable, "cleanrl_astral/ppo_gru_astral.py", *TINY_TRAIN, "--runs-dir", str(runs)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    (path,) = glob.glob(str(runs / "*" / "ppo_gru_astral.cleanrl_model"))
    return path


def sharpened(path, tmp_path):
    """The tiny checkpoint with large, distinct slots, so the gate has leverage over the policy."""
    ckpt = torch.load(path, weights_only=True)
    g = torch.Generator().manual_seed(0)
    ckpt["state_dict"]["bank.slots"] = torch.randn(ckpt["state_dict"]["bank.slots"].shape, generator=g) * 3.0
    out = str(tmp_path / "sharp.cleanrl_model")
    torch.save(ckpt, out)
    return out


def adapt_args(path, **overrides):
    defaults = dict(checkpoint=path, episodes=2, num_seeds=1, eval_episodes=2, adapt_lr=0.05)
    return m.AdaptArgs(**{**defaults, **overrides})


# --- the two files cannot drift apart ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["parse_modes", "resolve_modes", "NonStationaryCartPole", "make_env", "make_vector_env",
                                  "layer_init", "AbstractionBank", "FiLM", "Agent"])
def test_env_and_model_sections_are_verbatim_copies(name):
    assert inspect.getsource(getattr(m, name)) == inspect.getsource(getattr(astral, name))


def test_mode_presets_are_equal():
    assert m.MODE_PRESETS == astral.MODE_PRESETS


@pytest.mark.parametrize("preset,hide_velocity,switch_prob", [("seed3", False, 0.0), ("inverted4", True, 0.05)])
def test_env_copies_give_identical_seeded_trajectories(preset, hide_velocity, switch_prob):
    modes = astral.MODE_PRESETS[preset]
    a = astral.make_vector_env(4, modes, hide_velocity, switch_prob=switch_prob)
    b = m.make_vector_env(4, modes, hide_velocity, switch_prob=switch_prob)
    obs_a, info_a = a.reset(seed=3)
    obs_b, info_b = b.reset(seed=3)
    assert np.array_equal(obs_a, obs_b) and np.array_equal(info_a["mode"], info_b["mode"])
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(300):
        action = rng.integers(0, 2, size=4)
        out_a, out_b = a.step(action), b.step(action)
        for x, y in zip(out_a[:4], out_b[:4]):
            assert np.array_equal(x, y)
        assert np.array_equal(out_a[4]["mode"], out_b[4]["mode"])
        ended += int((out_a[2] | out_a[3]).sum())
    assert ended > 4  # the comparison spans several auto-resets


def test_agents_give_identical_outputs_for_the_same_state_dict(checkpoint):
    ckpt, agent = m.load_astral_checkpoint(checkpoint)
    reference = astral.agent_from_args(astral.Args(**ckpt["args"]), len(ckpt["modes"]))
    reference.load_state_dict(ckpt["state_dict"])
    assert set(agent.state_dict()) == set(reference.state_dict())
    torch.manual_seed(0)
    x = torch.randn(12, 5, agent.input_dim)
    starts = (torch.rand(12, 5) < 0.2).float()
    state = torch.randn(5, agent.hidden_size)
    actions = torch.randint(0, 2, (12, 5))
    for kwargs in ({"action": actions}, {"deterministic": True}, {"action": actions, "weights": torch.softmax(torch.randn(12, 5, 3), -1)}):
        out_m = agent.get_action_and_value(x, state, starts, **kwargs)
        out_a = reference.get_action_and_value(x, state, starts, **kwargs)
        for u, v in zip(out_m, out_a):
            assert torch.equal(u, v)


def test_evaluation_reproduces_the_training_scripts_evaluate(checkpoint):
    """Batched evaluation (and, via one episode, the step-by-step policy_step) act exactly as ppo_gru_astral.evaluate."""
    ckpt, agent = m.load_astral_checkpoint(checkpoint)
    reference = astral.evaluate(checkpoint, episodes_per_mode=3, deterministic=True, seed=7)
    targets = m.resolve_targets(None, None, ckpt)
    for k, target in enumerate(targets):
        returns, weights = m.evaluate_target(agent, target, False, 3, True, 7 + 1000 * k)
        assert np.array_equal(returns, reference["returns"][k])
        assert np.allclose(weights, reference["slot_weights"][k])
        # one episode step by step with policy_step, inputs built as in the rollout
        env = m.make_env(target["modes"], False, fixed_mode=k)()
        obs, info = env.reset(seed=7 + 1000 * k)
        state, prev_action, prev_reward, start, done, total = agent.initial_state(1), -1, 0.0, 1.0, False, 0.0
        while not done:
            with torch.no_grad():
                dist, _, state, _ = m.policy_step(agent, obs, prev_action, prev_reward, info["mode"], state, start)
            prev_action = int(dist.logits.argmax(-1))
            obs, prev_reward, terminated, truncated, info = env.step(prev_action)
            total, start, done = total + prev_reward, 0.0, terminated or truncated
        assert total == reference["returns"][k][0]


# --- what each control updates -------------------------------------------------------------------------


def changed_parameters(ckpt, agent):
    return {name for name, value in agent.state_dict().items() if not torch.equal(value, ckpt["state_dict"][name])}


GATE_KEYS = {"bank.gate.0.weight", "bank.gate.0.bias", "bank.gate.2.weight", "bank.gate.2.bias"}


@pytest.mark.parametrize("online", [False, True])
def test_each_control_updates_only_its_parameters(checkpoint, online):
    ckpt, _ = m.load_astral_checkpoint(checkpoint)
    target = m.resolve_targets([1], None, ckpt)[0]
    args = adapt_args(checkpoint, online=online, online_every=4)
    scale = 1.0
    curves = {}
    for control in m.CONTROLS:
        agent, curves[control], updates = m.adapt(ckpt, target, control, 3, args, scale)
        changed = changed_parameters(ckpt, agent)
        if control == "none":
            assert changed == set() and updates == 0
        elif control in ("gate", "tent"):
            assert changed == GATE_KEYS and updates >= 2
        else:
            # all: every parameter the REINFORCE loss reaches moves (GRU, slot bank, FiLM, actor, encoder, gate);
            # only the critic stays, because the adaptation loss has no value term
            params = {name for name, _ in agent.named_parameters()}
            assert changed == {name for name in params if not name.startswith("critic.")} and updates >= 2
    if not online:
        # identical episodes until the parameters differ: the first episode is the same for every control
        assert len({c[0] for c in curves.values()}) == 1


def test_reinforce_loss_reaches_the_gate_after_one_episode_and_ascends_the_objective(checkpoint, tmp_path):
    ckpt, agent = m.load_astral_checkpoint(sharpened(checkpoint, tmp_path))
    params = m.adapted_parameters(agent, "gate")
    env = m.make_env(ckpt["modes"], False, fixed_mode=0)()
    obs, info = env.reset(seed=0)
    torch.manual_seed(0)
    state, prev_action, prev_reward, start, done = agent.initial_state(1), -1, 0.0, 1.0, False
    inputs, starts, actions, logprobs, rewards = [], [], [], [], []
    while not done:
        x = agent.build_input(torch.as_tensor(obs[None]), torch.tensor([prev_action]), torch.tensor([prev_reward]), torch.tensor([0]))
        inputs.append(x)
        starts.append(start)
        dist, _, state, _ = m.policy_step(agent, obs, prev_action, prev_reward, info["mode"], state, start)
        action = dist.sample()
        logprobs.append(dist.log_prob(action))
        actions.append(int(action))
        prev_action = int(action)
        obs, prev_reward, terminated, truncated, info = env.step(prev_action)
        rewards.append(prev_reward)
        start, done = 0.0, terminated or truncated
    assert len(rewards) > 2
    loss = m.reinforce_loss(torch.cat(logprobs), rewards, 0.99)
    loss.backward()
    for name, param in agent.named_parameters():
        if name.startswith("bank.gate."):
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.grad is None, name
    # acting under no_grad (the plan's sketch) leaves nothing to differentiate
    with torch.no_grad():
        detached = m.policy_step(agent, obs, -1, 0.0, 0, agent.initial_state(1), 1.0)[0].log_prob(torch.tensor([0]))
    assert not m.reinforce_loss(detached, [1.0], 0.99).requires_grad

    # one gradient step raises sum_t G_t log pi(a_t) on the replayed episode (a sign error would lower it)
    def objective():
        with torch.no_grad():
            _, lp, _, _, _, _ = agent.get_action_and_value(torch.stack(inputs), agent.initial_state(1),
                                                           torch.tensor(starts)[:, None], torch.tensor(actions)[:, None])
        return -m.reinforce_loss(lp[:, 0], rewards, 0.99).item()

    before = objective()
    assert before == pytest.approx(-loss.item(), abs=1e-6)  # the replay reproduces the acted log-probs
    torch.optim.SGD(params, lr=0.05).step()
    assert objective() > before


def test_discounted_returns_and_losses():
    assert np.allclose(m.discounted_returns([1.0, 1.0, 1.0], 0.5), [1.75, 1.5, 1.0])
    assert np.allclose(m.discounted_returns([1.0, 1.0], 0.5, bootstrap=4.0), [2.5, 3.0])
    # actor-critic advantages are the n-step targets minus the (detached) values, in the critic's reward units
    logprobs = torch.zeros(2, requires_grad=True)
    loss = m.actor_critic_loss(logprobs, torch.tensor([1.0, 0.5]), [2.0, 2.0], 4.0, 0.5, reward_scale=2.0)
    loss.backward()
    assert torch.allclose(logprobs.grad, -torch.tensor([2.5 - 1.0, 3.0 - 0.5]) / 2)
    # tent: with the anchor equal to the policy the KL term vanishes, leaving the two entropies
    logits, weights = torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    p = torch.softmax(logits, -1)
    entropies = (-(p * p.log()).sum(-1)).mean() + np.log(2) / 2
    assert m.tent_loss(logits, logits, weights, 1.0).item() == pytest.approx(entropies.item(), abs=1e-5)
    assert m.tent_loss(logits, logits.flip(-1), weights, 1.0) > m.tent_loss(logits, logits, weights, 1.0)


def test_clamping_slot_k_makes_z_equal_slot_k_exactly(checkpoint, tmp_path):
    ckpt, agent = m.load_astral_checkpoint(sharpened(checkpoint, tmp_path))
    hidden = torch.randn(7, 4, agent.hidden_size)
    K = agent.bank.slots.shape[0]
    outputs = []
    for k in range(K):
        z, w = agent.bank(hidden, torch.eye(K)[k].expand(7, 4, K))
        assert torch.equal(z, agent.bank.slots[k].expand_as(z)) and torch.equal(w, torch.eye(K)[k].expand(7, 4, K))
        outputs.append(agent.actor(agent.modulate(hidden, torch.eye(K)[k].expand(7, 4, K))[0]))
    assert not torch.allclose(outputs[0], outputs[1])  # distinct slots give distinct policies
    target = m.resolve_targets([0], None, ckpt)[0]
    _, weights = m.evaluate_target(agent, target, False, 2, True, 0, torch.eye(K)[1])
    assert np.array_equal(weights, np.eye(K)[1])


# --- end to end ---------------------------------------------------------------------------------------


def test_adapt_smoke_all_controls(checkpoint, tmp_path):
    digest = sha256(checkpoint)
    result = run(["adapt", "--checkpoint", checkpoint, "--mode-indices", "0", "2", "--episodes", "2", "--num-seeds", "2",
                  "--eval-episodes", "2", "--save-model", "--runs-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert sha256(checkpoint) == digest
    (run_dir,) = glob.glob(str(tmp_path / "NonStationaryCartPole__tta_gating_adapt__1__*"))
    with open(os.path.join(run_dir, "tta.json")) as f:
        report = json.load(f)
    assert report["controls"] == list(m.CONTROLS) and report["seeds"] == [1, 2] and list(report["results"]) == ["mode0", "mode2"]
    for res in report["results"].values():
        none = res["controls"]["none"]
        # no updates: the evaluation after is the same paired evaluation as before
        assert none["after_per_seed"]["sampled"] == res["before"]["sampled"]["per_seed"]
        for control, entry in res["controls"].items():
            assert np.asarray(entry["during_per_seed"]).shape == (2, 2)
            assert [c[0] for c in entry["during_per_seed"]] == [c[0] for c in none["during_per_seed"]]
            assert (control == "none") == ("gain_over_none" not in entry)
    for name in ("adaptation_curves.png", "eval.json", "tta_gating_adapt.cleanrl_model"):
        assert os.path.getsize(os.path.join(run_dir, name)) > 0
    with open(os.path.join(run_dir, "eval.json")) as f:
        headline = json.load(f)
    assert set(headline["gain_over_none_after_sampled"]) == {"gate", "all", "tent"} and set(headline["after_sampled"]) == set(m.CONTROLS)
    gate_gains = [res["controls"]["gate"]["gain_over_none"]["after_sampled"]["mean"] for res in report["results"].values()]
    assert headline["gain_over_none_after_sampled"]["gate"] == pytest.approx(np.mean(gate_gains))
    saved = torch.load(os.path.join(run_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)
    assert len(saved["adapted"]) == 2 * 2 * 4
    acc = EventAccumulator(run_dir)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "tta/episodic_return_mode0_gate" in tags and "tta/gain_over_none_mode2_tent" in tags


def test_adapt_online_on_unseen_physics(checkpoint, tmp_path):
    result = run(["adapt", "--checkpoint", checkpoint, "--modes", "5.0,0.9 15.0,0.3", "--online", "--online-every", "4",
                  "--controls", "none", "gate", "tent", "--episodes", "2", "--num-seeds", "1", "--eval-episodes", "2",
                  "--runs-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    (path,) = glob.glob(str(tmp_path / "*" / "tta.json"))
    with open(path) as f:
        report = json.load(f)
    assert report["online"] and report["reward_scale"] > 0  # read from the run's checkpoint.pt
    assert [t["gravity"] for t in report["targets"]] == [5.0, 15.0]
    # online updates happen inside episodes: more updates than episodes whenever an episode is longer than 4 steps
    lengths = sum(sum(c) for c in report["results"]["custom0"]["controls"]["none"]["during_per_seed"])
    assert report["results"]["custom0"]["controls"]["gate"]["updates"] >= lengths // 4 > 2


def test_clamp_smoke(checkpoint, tmp_path):
    digest = sha256(checkpoint)
    result = run(["clamp", "--checkpoint", checkpoint, "--eval-episodes", "1", "--runs-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert sha256(checkpoint) == digest
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    with open(os.path.join(run_dir, "clamp.json")) as f:
        report = json.load(f)
    assert report["columns"] == ["slot0", "slot1", "slot2", "uniform", "learned"]
    assert np.asarray(report["matrix"]["deterministic"]).shape == (3, 5)
    # the "learned" column is the training run's own deterministic evaluation (same seeds, same protocol)
    with open(os.path.join(os.path.dirname(checkpoint), "eval.json")) as f:
        train_eval = json.load(f)
    for k in range(3):
        assert report["results"][f"mode{k}"]["learned"]["deterministic"]["returns"] == train_eval["per_mode"][str(k)]["deterministic"]["returns"]
    assert os.path.getsize(os.path.join(run_dir, "clamp_heatmap.png")) > 0
    with open(os.path.join(run_dir, "eval.json")) as f:
        headline = json.load(f)
    spreads = [max(r[f"slot{k}"]["sampled"]["mean"] for k in range(3)) - min(r[f"slot{k}"]["sampled"]["mean"] for k in range(3))
               for r in report["results"].values()]
    assert headline["slot_spread"]["sampled"] == pytest.approx(np.mean(spreads))
    assert set(headline["clamp_deterministic"]) == {"uniform", "learned"}
    acc = EventAccumulator(run_dir)
    acc.Reload()
    assert "tta/clamp_return_mode0_slot1_sampled" in acc.Tags()["scalars"]


def test_runs_started_in_the_same_second_get_directories_of_their_own(checkpoint, tmp_path, occupied_run_names):
    """Runs of one command and seed started in the same second (a shell loop over flags) used to share
    runs/{run_name}: their TensorBoard events mixed, and the later run's files replaced the earlier run's."""
    check = occupied_run_names(str(tmp_path), "NonStationaryCartPole__collide__7__")
    result = run(["clamp", "--checkpoint", checkpoint, "--eval-episodes", "1", "--runs-dir", str(tmp_path),
                  "--exp-name", "collide", "--seed", "7"])
    assert result.returncode == 0, result.stderr
    assert os.path.isfile(os.path.join(check(), "clamp.json"))


def test_a_runs_dir_that_is_a_file_is_a_one_line_error(checkpoint, tmp_path):
    (tmp_path / "runs").write_text("")
    result = run(["clamp", "--checkpoint", checkpoint, "--eval-episodes", "1", "--runs-dir", str(tmp_path / "runs")])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("tta_gating.py: error: ") and \
        "--runs-dir" in lines[0] and "not a directory" in lines[0], result.stderr
    assert result.stdout == ""


# --- bad input ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline_checkpoint(tmp_path_factory):
    runs = tmp_path_factory.mktemp("baseline_runs")
    subprocess.run([sys.executable, "cleanrl_astral/ppo_gru_baseline.py", *[a for a in TINY_TRAIN if a not in ("--slot-dim", "8")],
                    "--runs-dir", str(runs)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    (path,) = glob.glob(str(runs / "*" / "ppo_gru_baseline.cleanrl_model"))
    return path


def inconsistent_checkpoint(path, tmp_path):
    ckpt = torch.load(path, weights_only=True)
    ckpt["args"]["num_abstractions"] = 4
    out = str(tmp_path / "bad_k.cleanrl_model")
    torch.save(ckpt, out)
    return out


@pytest.mark.parametrize("case,expected", [
    ("missing", "does not exist"),
    ("baseline", "written by ppo_gru_baseline"),
    ("mode_index", "--mode-indices 7 is out of range"),
])
def test_bad_input_fails_with_one_line_before_any_work(case, expected, checkpoint, baseline_checkpoint, tmp_path):
    path = {"missing": str(tmp_path / "nope.cleanrl_model"), "baseline": baseline_checkpoint}.get(case, checkpoint)
    extra = ["--mode-indices", "0", "7"] if case == "mode_index" else []
    runs = tmp_path / "runs"
    result = run(["adapt" if case != "mode_index" else "clamp", "--checkpoint", path, *extra, "--runs-dir", str(runs)])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tta_gating.py: error: ") and expected in lines[0], result.stderr
    assert not runs.exists()


@pytest.mark.parametrize("overrides,expected", [
    (dict(controls=["gate", "bogus"]), "--controls"),
    (dict(mode_indices=[0], modes="9.8,0.5"), "not both"),
    (dict(episodes=0), "--episodes"),
    (dict(online=True, reward_scale=-1.0), "--reward-scale -1.0 must be positive"),
    (dict(reward_scale=-5.0), "--reward-scale -5.0 must be positive"),
    (dict(online=True, reward_scale=float("inf")), "--reward-scale inf must be a finite number"),
    (dict(adapt_lr=float("nan")), "--adapt-lr nan must be a finite number"),
    (dict(seed=-1), "--seed -1 must be in"),
    (dict(mode_indices=[0, 0]), "--mode-indices needs distinct"),
    (dict(mode_indices=[]), "--mode-indices needs distinct"),
])
def test_validate_rejects_bad_adapt_settings(checkpoint, overrides, expected):
    with pytest.raises(ValueError, match=expected):
        m.validate(adapt_args(checkpoint, **overrides))


def test_online_with_a_corrupt_training_checkpoint_is_a_clear_error(checkpoint, tmp_path):
    """--online reads the critic's reward scale from checkpoint.pt beside the model; a truncated file was an EOFError
    traceback. An intact copy of the same files is accepted, so the error comes from the corruption."""
    import shutil

    for corrupt in (False, True):
        run = tmp_path / f"run_{corrupt}"
        run.mkdir()
        model = run / os.path.basename(checkpoint)
        older = torch.load(checkpoint, weights_only=True)
        del older["reward_scaler"]  # a model saved before session 17: the scale comes from checkpoint.pt
        torch.save(older, model)
        train_ckpt = os.path.join(os.path.dirname(checkpoint), "checkpoint.pt")
        if corrupt:
            (run / "checkpoint.pt").write_bytes(open(train_ckpt, "rb").read()[:100])
        else:
            shutil.copyfile(train_ckpt, run / "checkpoint.pt")
        args = adapt_args(str(model), online=True, controls=["none", "gate"])
        if corrupt:
            with pytest.raises(ValueError, match="checkpoint.pt is not a readable ppo_gru_astral checkpoint .*--reward-scale"):
                m.validate(args)
        else:
            assert m.validate(args)[-1] > 0


def test_online_reads_the_reward_scale_saved_with_the_model(checkpoint, tmp_path):
    """Since session 17 the model carries its reward normaliser, so --online works on a model copied without the
    run's checkpoint.pt (the committed sweep models had none, so their online results could not be re-run). The
    scale is the one checkpoint.pt holds for the same final update."""
    import shutil

    model = tmp_path / os.path.basename(checkpoint)
    shutil.copyfile(checkpoint, model)
    train_ckpt = torch.load(os.path.join(os.path.dirname(checkpoint), "checkpoint.pt"), weights_only=True)
    expected = float(np.sqrt(train_ckpt["reward_scaler"]["var"] + 1e-8))
    assert expected != 1.0
    assert m.validate(adapt_args(str(model), online=True, controls=["none", "gate"]))[-1] == expected
    older = torch.load(checkpoint, weights_only=True)
    del older["reward_scaler"]
    torch.save(older, model)
    with pytest.raises(ValueError, match="--online needs the reward scale"):
        m.validate(adapt_args(str(model), online=True, controls=["none", "gate"]))


def test_validate_rejects_inconsistent_checkpoints_and_malformed_modes(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="K=4 slots of dimension d=8 but its state dict holds slots of shape \\(3, 8\\)"):
        m.validate(m.ClampArgs(checkpoint=inconsistent_checkpoint(checkpoint, tmp_path)))
    ckpt = torch.load(checkpoint, weights_only=True)
    ckpt["args"]["hidden_size"] = 32
    torch.save(ckpt, tmp_path / "bad_h.cleanrl_model")
    with pytest.raises(ValueError, match="does not fit the agent"):
        m.validate(m.ClampArgs(checkpoint=str(tmp_path / "bad_h.cleanrl_model")))
    for spec in ("9.8", "9.8,0.5,2", "a,b"):
        with pytest.raises(ValueError, match="--modes"):
            m.validate(m.ClampArgs(checkpoint=checkpoint, modes=spec))


def test_checkpoint_path_pattern_picks_the_seeds_file(checkpoint):
    pattern = os.path.join(os.path.dirname(os.path.dirname(checkpoint)), "*", "ppo_gru_astral.cleanrl_model")
    assert m.resolve_checkpoint_path(pattern, 1) == checkpoint
    assert m.resolve_checkpoint_path(checkpoint.replace("__1__", "__{seed}__"), 1) == checkpoint
    with pytest.raises(ValueError, match="matches 0 files"):
        m.resolve_checkpoint_path(checkpoint.replace("__1__", "__{seed}__*"), 2)
    assert dataclasses.asdict(m.ClampArgs(checkpoint="x"))["exp_name"] == "tta_gating_clamp"


# --- what the losses, the reports and the figures are made of ---------------------------------------------------


def test_tent_kl_term_is_kl_of_the_policy_from_the_anchor_not_the_reverse():
    """tent_loss's anchor term is KL(pi || pi_unadapted) = sum_a p(a) log(p(a) / q(a)), as its docstring says. If
    this failed, the KL were taken the other way, KL(q || p), which weighs actions by the anchor's probabilities and
    differs on asymmetric distributions (here 0.368 against 0.511)."""
    logits, anchor = torch.log(torch.tensor([[0.9, 0.1]])), torch.log(torch.tensor([[0.5, 0.5]]))
    weights = torch.tensor([[1.0, 0.0]])  # a one-hot gate: no gate entropy
    forward = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    reverse = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert abs(forward - reverse) > 0.1
    kl = m.tent_loss(logits, anchor, weights, 1.0) - m.tent_loss(logits, anchor, weights, 0.0)
    assert kl.item() == pytest.approx(forward, abs=1e-5)
    policy_entropy = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert m.tent_loss(logits, anchor, weights, 2.0).item() == pytest.approx(policy_entropy + 2 * forward, abs=1e-5)


def test_online_actor_critic_does_not_bootstrap_past_the_pole_falling(checkpoint, monkeypatch):
    """--online: a segment cut by --online-every continues, so its n-step target bootstraps from the critic's value of
    the next observation; the segment that ends with the pole falling (terminated) has no future. If this failed, the
    last target of an episode added gamma * V(s_terminal), value that is never earned."""
    ckpt, agent = m.load_astral_checkpoint(checkpoint)
    anchor = copy.deepcopy(agent).requires_grad_(False)
    optimizer = torch.optim.Adam(m.adapted_parameters(agent, "gate"), lr=0.05)
    target = m.resolve_targets([0], None, ckpt)[0]
    env = m.make_env(target["modes"], ckpt["args"]["hide_velocity"], fixed_mode=target["index"])()
    ends, bootstraps = [], []
    real_step, real_loss = env.step, m.actor_critic_loss

    def step(action):
        out = real_step(action)
        ends.append(out[2:4])
        return out

    def loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale):
        bootstraps.append(bootstrap_value)
        return real_loss(logprobs, values, rewards, bootstrap_value, gamma, reward_scale)

    env.step = step
    monkeypatch.setattr(m, "actor_critic_loss", loss)
    torch.manual_seed(0)
    _, updates = m.adaptation_episode(agent, anchor, env, 3, "gate", optimizer,
                                      adapt_args(checkpoint, online=True, online_every=4), 1.0)
    assert ends[-1] == (True, False), "the episode must end with the pole falling for this test to mean anything"
    assert updates == len(bootstraps) >= 3 and len(ends) > 8
    assert all(b != 0.0 for b in bootstraps[:-1])  # the cut segments do bootstrap
    assert bootstraps[-1] == 0.0


def test_tent_anchor_is_the_unadapted_policy_on_the_same_inputs(checkpoint, monkeypatch):
    """tent's KL term holds the adapted policy near the checkpoint's: its anchor logits must be the unadapted agent's,
    fed the observations, actions and rewards of the episode. If this failed, the anchor were the adapted agent itself,
    the KL term were 0 (and without gradient) whatever the adaptation did, and entropy minimisation collapsed the
    policy unchecked."""
    ckpt, anchor = m.load_astral_checkpoint(checkpoint)
    anchor.requires_grad_(False)
    agent = copy.deepcopy(anchor)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an agent that has moved away from its anchor, as after some adaptation
        for p in agent.actor.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    optimizer = torch.optim.Adam(m.adapted_parameters(agent, "tent"), lr=0.05)
    target = m.resolve_targets([0], None, ckpt)[0]
    hide_velocity = ckpt["args"]["hide_velocity"]
    env = m.make_env(target["modes"], hide_velocity, fixed_mode=target["index"])()
    actions, calls = [], []
    real_step, real_loss = env.step, m.tent_loss

    def step(action):
        actions.append(action)
        return real_step(action)

    def loss(logits, anchor_logits, gate_weights, kl_coef):
        calls.append((logits.detach().clone(), anchor_logits.detach().clone()))
        return real_loss(logits, anchor_logits, gate_weights, kl_coef)

    env.step = step
    monkeypatch.setattr(m, "tent_loss", loss)
    torch.manual_seed(0)
    m.adaptation_episode(agent, anchor, env, 5, "tent", optimizer, adapt_args(checkpoint), 1.0)
    ((logits, anchor_logits),) = calls
    assert len(actions) == len(anchor_logits) > 3
    # the unadapted agent replayed on the episode
    replay = m.make_env(target["modes"], hide_velocity, fixed_mode=target["index"])()
    obs, info = replay.reset(seed=5)
    state, prev_action, prev_reward, start, expected = anchor.initial_state(1), -1, 0.0, 1.0, []
    with torch.no_grad():
        for action in actions:
            dist, _, state, _ = m.policy_step(anchor, obs, prev_action, prev_reward, info["mode"], state, start)
            expected.append(dist.logits)
            obs, prev_reward, _, _, info = replay.step(action)
            prev_action, prev_reward, start = action, float(prev_reward), 0.0
    assert torch.allclose(anchor_logits, torch.cat(expected), atol=1e-6)
    assert (logits - anchor_logits).abs().max() > 0.1  # the adapted policy is not its anchor
    assert all(torch.equal(v, ckpt["state_dict"][k]) for k, v in anchor.state_dict().items())


def test_adapt_after_numbers_evaluate_each_controls_adapted_agent(checkpoint, tmp_path):
    """A control's "after" evaluation (returns and the gate weights acted with) is that of its own adapted agent, on
    the seeds of "before". If this failed, the unadapted agent were evaluated after adaptation: every control would
    report the same "after" as `none`, and a real gain of adapting would read as zero."""
    result = run(["adapt", "--checkpoint", checkpoint, "--mode-indices", "1", "--controls", "none", "gate",
                  "--episodes", "2", "--num-seeds", "1", "--eval-episodes", "3", "--adapt-lr", "0.05", "--save-model",
                  "--runs-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    (run_dir,) = glob.glob(str(tmp_path / "*"))
    with open(os.path.join(run_dir, "tta.json")) as f:
        controls = json.load(f)["results"]["mode1"]["controls"]
    saved = torch.load(os.path.join(run_dir, "tta_gating_adapt.cleanrl_model"), weights_only=True)["adapted"]
    assert [s["control"] for s in saved] == ["none", "gate"]
    ckpt, agent = m.load_astral_checkpoint(checkpoint)
    target = m.resolve_targets([1], None, ckpt)[0]
    eval_seed = 100_000 + 10_000 * 1  # seed 1, first target
    for entry in saved:
        agent.load_state_dict(entry["state_dict"])
        reported = controls[entry["control"]]
        for kind, deterministic in (("deterministic", True), ("sampled", False)):
            torch.manual_seed(eval_seed)
            returns, weights = m.evaluate_target(agent, target, ckpt["args"]["hide_velocity"], 3, deterministic,
                                                 eval_seed)
            assert reported["after_per_seed"][kind] == [float(returns.mean())], (entry["control"], kind)
            if deterministic:
                assert reported["slot_weights_after_per_seed"] == [weights.tolist()], entry["control"]
    # the gate's adaptation changed how it gates, so evaluating the wrong agent could not match both
    assert controls["gate"]["slot_weights_after_per_seed"] != controls["none"]["slot_weights_after_per_seed"]


@pytest.fixture(scope="module")
def sharp_clamp(checkpoint, tmp_path_factory):
    """(model path, clamp.json) of a clamp run on the tiny checkpoint made into three clearly different policies, one
    per slot: slots 10u, -10u and 0 (FiLM's beta pushes h far one way, the other way, or not at all) and a 1000x
    actor output layer, so each slot's returns differ from the others' on the evaluation seeds."""
    tmp = tmp_path_factory.mktemp("sharp_clamp")
    ckpt = torch.load(checkpoint, weights_only=True)
    state = ckpt["state_dict"]
    u = torch.randn(state["bank.slots"].shape[1], generator=torch.Generator().manual_seed(0))
    state["bank.slots"] = torch.stack([10 * u, -10 * u, torch.zeros_like(u)])
    state["actor.2.weight"] = state["actor.2.weight"] * 1000
    path = str(tmp / "slot_policies.cleanrl_model")
    torch.save(ckpt, path)
    result = run(["clamp", "--checkpoint", path, "--eval-episodes", "3", "--runs-dir", str(tmp / "runs")])
    assert result.returncode == 0, result.stderr
    (report,) = glob.glob(str(tmp / "runs" / "*" / "clamp.json"))
    with open(report) as f:
        return path, json.load(f)


def test_clamp_column_slot_k_is_the_return_with_the_gate_clamped_to_slot_k(sharp_clamp):
    """Column slot{k} of the clamp report holds the returns of the agent with its gate clamped to the one-hot e_k,
    on the run's evaluation seeds. If this failed, a column showed another slot's returns (an off-by-one in the
    clamp settings), and every conclusion about what slot k does would be about a different slot."""
    path, report = sharp_clamp
    ckpt, agent = m.load_astral_checkpoint(path)
    K = ckpt["args"]["num_abstractions"]
    per_slot = {k: [] for k in range(K)}
    for ti, target in enumerate(m.resolve_targets(None, None, ckpt)):
        eval_seed = 100_000 + 1 + 1000 * ti  # --seed 1
        for k in range(K):
            for kind, deterministic in (("deterministic", True), ("sampled", False)):
                torch.manual_seed(eval_seed)
                returns, weights = m.evaluate_target(agent, target, ckpt["args"]["hide_velocity"], 3, deterministic,
                                                     eval_seed, torch.eye(K)[k])
                assert np.array_equal(weights, np.eye(K)[k])
                assert report["results"][target["name"]][f"slot{k}"][kind]["returns"] == returns.tolist(), (ti, k)
                per_slot[k].append(returns.tolist())
    # the slots act differently, so a column holding another slot's returns cannot match
    assert all(per_slot[j] != per_slot[k] for j in range(K) for k in range(j + 1, K))


def test_clamp_preferred_slot_is_the_one_the_learned_gate_weighs_most(sharp_clamp):
    """Each mode's preferred slot is the argmax of the learned gate's mean weights there. If this failed, it were
    another slot (the argmin), and "preferred minus other slots" compared the wrong slot with the rest."""
    _, report = sharp_clamp
    for name, res in report["results"].items():
        weights = res["learned_slot_weights"]
        assert np.argmax(weights) != np.argmin(weights), name  # a gate with a favourite, not a uniform one
        assert res["preferred_slot"] == int(np.argmax(weights)), name
        k = res["preferred_slot"]
        for kind in ("deterministic", "sampled"):
            others = [res[f"slot{j}"][kind]["mean"] for j in range(len(weights)) if j != k]
            assert res[f"preferred_minus_other_slots_{kind}"] == pytest.approx(res[f"slot{k}"][kind]["mean"]
                                                                               - np.mean(others))


def test_clamp_heatmap_draws_targets_as_rows_and_gate_settings_as_columns(tmp_path, monkeypatch):
    """plot_clamp_heatmap shows matrix[kind] as it is (row i = target i, column j = gate setting j, labelled so) and
    writes each cell's value on that cell. If this failed, the matrix were drawn transposed: targets under the
    column labels and settings under the row labels, every cell misread."""
    import matplotlib.axes

    images, texts = [], []
    real_imshow, real_text = matplotlib.axes.Axes.imshow, matplotlib.axes.Axes.text

    def imshow(self, X, *args, **kwargs):
        images.append(np.array(X))
        return real_imshow(self, X, *args, **kwargs)

    def text(self, x, y, s, *args, **kwargs):
        texts.append((x, y, s))
        return real_text(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", imshow)
    monkeypatch.setattr(matplotlib.axes.Axes, "text", text)
    matrix = {"deterministic": np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]]),
              "sampled": np.array([[110.0, 120.0, 130.0], [140.0, 150.0, 160.0]])}
    path = tmp_path / "heatmap.png"
    m.plot_clamp_heatmap(matrix, ["mode0", "mode1"], ["slot0", "slot1", "uniform"], str(path), "title")
    assert path.stat().st_size > 0
    assert len(images) == 2 and all(np.array_equal(image, matrix[kind]) for image, kind in zip(images, matrix))
    assert texts == [(j, i, f"{v:.0f}") for kind in matrix for (i, j), v in np.ndenumerate(matrix[kind])]
