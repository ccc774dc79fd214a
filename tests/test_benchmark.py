"""Tests of benchmark/: the runner (expansion, dry run, failures, retries, resume, Ray backend), the report on a
real tiny run, and the SB3 peers' copy of the NonStationaryCartPole environment."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(REPO, "benchmark", "benchmark.py")
REPORT = os.path.join(REPO, "benchmark", "report.py")
SB3_PEERS = os.path.join(REPO, "benchmark", "sb3_peers.py")
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def load(path):
    """benchmark/ is a folder of scripts, not a package: import one by path."""
    name = "_benchmark_" + os.path.splitext(os.path.basename(path))[0]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # inspect.getsource looks classes up here
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_benchmark(*args, cwd=REPO):
    return subprocess.run([sys.executable, BENCHMARK, "--no-progress", *args], cwd=cwd, capture_output=True, text=True)


def manifest(out):
    with open(os.path.join(out, "manifest.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def bench():
    return load(BENCHMARK)


def write_script(path, body):
    path.write_text(
        "import argparse, os, sys\n"
        "p = argparse.ArgumentParser(); p.add_argument('--seed', type=int); p.add_argument('--runs-dir')\n"
        "p.add_argument('--tag', default='')\n"
        "a = p.parse_args()\n" + body
    )
    return path


# RUNNER
def test_expand_command_grid_seeds(bench, tmp_path):
    specs = bench.expand(["python a.py --x 1", "python b.py"], ["--lr 1 2 3", "--hide | "], [5, 6], str(tmp_path), REPO)
    assert len(specs) == 2 * 3 * 2 * 2
    assert len({s.run_key for s in specs}) == len(specs)
    assert len({s.runs_dir for s in specs}) == len(specs)
    by_key = {(s.command_index, tuple(s.grid), s.seed): s for s in specs}
    s = by_key[(0, ("--lr", "2", "--hide"), 6)]
    assert s.argv == ["python", "a.py", "--x", "1", "--lr", "2", "--hide", "--seed", "6", "--runs-dir", s.runs_dir]
    assert s.runs_dir == os.path.join(str(tmp_path), "runs", s.run_key)
    assert by_key[(1, ("--lr", "3"), 5)].argv[:4] == ["python", "b.py", "--lr", "3"]
    assert bench.parse_grid_spec("--modes-preset seed3 inverted4") == [
        ["--modes-preset", "seed3"],
        ["--modes-preset", "inverted4"],
    ]
    with pytest.raises(ValueError):
        bench.parse_grid_spec("--hide-velocity")
    # a flag read as a value would silently launch a wrong command ("--modes-preset --hide-velocity")
    with pytest.raises(ValueError, match="puts a flag among the values"):
        bench.parse_grid_spec("--modes-preset seed3 --hide-velocity")


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    out = tmp_path / "sweep"
    r = run_benchmark(
        "--command",
        "python x.py --total-timesteps 10",
        "--grid",
        "--modes-preset seed3 inverted4",
        "--num-seeds",
        "2",
        "--start-seed",
        "7",
        "--dry-run",
        "--output",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4
    for preset in ("seed3", "inverted4"):
        for seed in (7, 8):
            assert sum(f"--modes-preset {preset} --seed {seed} --runs-dir" in line for line in lines) == 1
    assert all(line.startswith("python x.py --total-timesteps 10 ") for line in lines)
    assert not out.exists()


def test_bad_flags_exit_2_with_one_line():
    r = run_benchmark("--command", "python x.py", "--grid=--flag-without-values", "--dry-run")
    assert r.returncode == 2
    assert r.stderr.startswith("benchmark.py: error:") and len(r.stderr.strip().splitlines()) == 1


def test_failing_command_exits_nonzero_and_is_named(tmp_path):
    ok = write_script(tmp_path / "ok.py", "os.makedirs(os.path.join(a.runs_dir, f'run_{a.seed}'))\n")
    bad = write_script(tmp_path / "bad.py", "print('boom on seed', a.seed); sys.exit(3)\n")
    out = tmp_path / "sweep"
    r = run_benchmark("--command", f"python {ok}", f"python {bad}", "--num-seeds", "2", "--workers", "2", "--output", str(out))
    assert r.returncode == 1
    records = {rec["run_key"]: rec for rec in manifest(out)}
    failed = [rec for rec in records.values() if rec["exit_code"] != 0]
    assert sorted(rec["seed"] for rec in failed) == [1, 2] and all(rec["exit_code"] == 3 for rec in failed)
    for rec in failed:
        assert f"FAILED {rec['run_key']}" in r.stderr and rec["log_path"] in r.stderr
        with open(rec["log_path"]) as f:
            assert f"boom on seed {rec['seed']}" in f.read()
    succeeded = [rec for rec in records.values() if rec["exit_code"] == 0]
    assert len(succeeded) == 2
    for rec in succeeded:
        assert rec["run_dirs"] == [os.path.join(rec["runs_dir"], f"run_{rec['seed']}")]
        assert rec["wall_time_s"] >= 0 and rec["attempt"] == 1
        assert os.path.exists(out / "markers" / f"{rec['run_key']}.json")
    assert not any((out / "markers" / f"{rec['run_key']}.json").exists() for rec in failed)


def test_retries_rerun_a_failed_run(tmp_path):
    # fails on its first attempt, succeeds once the marker from that attempt exists
    flaky = write_script(
        tmp_path / "flaky.py",
        "m = os.path.join(os.path.dirname(os.path.abspath(__file__)), f'tried_{a.tag}')\n"
        "if not os.path.exists(m):\n    open(m, 'w').close(); sys.exit(1)\n",
    )
    r = run_benchmark("--command", f"python {flaky} --tag without", "--num-seeds", "1", "--output", str(tmp_path / "a"))
    assert r.returncode == 1
    r = run_benchmark(
        "--command", f"python {flaky} --tag with", "--num-seeds", "1", "--retries", "2", "--output", str(tmp_path / "b")
    )
    assert r.returncode == 0, r.stderr
    records = manifest(tmp_path / "b")
    assert [(rec["attempt"], rec["exit_code"]) for rec in records] == [(1, 1), (2, 0)]
    assert records[0]["log_path"] != records[1]["log_path"]
    assert all(os.path.exists(rec["log_path"]) for rec in records)


def test_resume_skips_completed_runs(tmp_path):
    # appends its seed to a ledger; seed 2 fails until the file `fixed` exists
    script = write_script(
        tmp_path / "ledger.py",
        "d = os.path.dirname(os.path.abspath(__file__))\n"
        "open(os.path.join(d, 'ledger'), 'a').write(f'{a.seed}{a.tag}\\n')\n"
        "sys.exit(1 if a.seed == 2 and not os.path.exists(os.path.join(d, 'fixed')) else 0)\n",
    )
    out = str(tmp_path / "sweep")
    ledger = tmp_path / "ledger"
    assert run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out).returncode == 1
    assert sorted(ledger.read_text().split()) == ["1", "2"]
    # a dry run with --resume tells which runs it would skip (seed 1 succeeded, seed 2 failed) and runs nothing
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out, "--resume", "--dry-run")
    marked = [line for line in r.stdout.splitlines() if "--resume skips it" in line]
    assert len(marked) == 1 and "--seed 1 " in marked[0] and "1 already complete" in r.stderr
    assert sorted(ledger.read_text().split()) == ["1", "2"]
    (tmp_path / "fixed").touch()
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out, "--resume")
    assert r.returncode == 0, r.stderr
    assert sorted(ledger.read_text().split()) == ["1", "2", "2"]
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "2", "--output", out, "--resume")
    assert r.returncode == 0 and "every run is complete" in r.stderr
    assert sorted(ledger.read_text().split()) == ["1", "2", "2"]
    # a changed command line is a different run: its old marker must not skip it
    r = run_benchmark("--command", f"python {script} --tag x", "--num-seeds", "2", "--output", out, "--resume")
    assert r.returncode == 0
    assert sorted(ledger.read_text().split()) == ["1", "1x", "2", "2", "2x"]


@pytest.mark.timeout(120)
def test_killed_sweep_stops_its_runs_and_resume_reruns_them(tmp_path):
    # the run reports its pid through a FIFO (so the test knows it started, without polling), then blocks
    script = write_script(
        tmp_path / "blocking.py",
        "d = os.path.dirname(os.path.abspath(__file__))\n"
        "if not os.path.exists(os.path.join(d, 'release')):\n"
        "    open(os.path.join(d, 'ready'), 'w').write(str(os.getpid()))\n"
        "    open(os.path.join(d, 'hold')).read()\n",
    )
    os.mkfifo(tmp_path / "ready")
    os.mkfifo(tmp_path / "hold")
    out = tmp_path / "sweep"
    args = [
        sys.executable,
        BENCHMARK,
        "--no-progress",
        "--command",
        f"python {script}",
        "--num-seeds",
        "1",
        "--output",
        str(out),
    ]
    runner = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(tmp_path / "ready") as f:
        pid = int(f.read())
    runner.terminate()
    runner.communicate(timeout=60)
    assert runner.returncode != 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not (out / "markers").exists() or not os.listdir(out / "markers")
    (tmp_path / "release").touch()
    r = run_benchmark(*args[3:], "--resume")
    assert r.returncode == 0, r.stderr
    (record,) = manifest(out)
    assert record["attempt"] == 2 and record["exit_code"] == 0
    assert sorted(os.listdir(out / "logs")) == [f"{record['run_key']}.attempt1.log", f"{record['run_key']}.attempt2.log"]


def test_ray_backend_runs_commands_and_reports_failures(tmp_path):
    ok = write_script(tmp_path / "ok.py", "print('ran seed', a.seed, 'in', os.getcwd())\n")
    bad = write_script(tmp_path / "bad.py", "sys.exit(4)\n")
    out = tmp_path / "sweep"
    r = run_benchmark(
        "--backend",
        "ray",
        "--ray-num-cpus",
        "2",
        "--command",
        f"python {ok}",
        f"python {bad}",
        "--num-seeds",
        "1",
        "--output",
        str(out),
        "--cwd",
        str(tmp_path),
    )
    if r.returncode == 3 and "could not start a local Ray instance" in r.stderr:
        pytest.skip(f"Ray cannot start on this machine: {r.stderr.strip()[-300:]}")
    assert r.returncode == 1, r.stderr
    records = {rec["command_index"]: rec for rec in manifest(out)}
    assert records[0]["exit_code"] == 0 and records[1]["exit_code"] == 4
    with open(records[0]["log_path"]) as f:
        assert f"ran seed 1 in {tmp_path}" in f.read()
    assert f"FAILED {records[1]['run_key']}" in r.stderr


# REPORT
def test_report_tables_ci_and_eval_flattening():
    report = load(REPORT)
    agg = report.aggregate([1.0, 2.0, 3.0])
    assert agg["mean"] == pytest.approx(2.0) and agg["std"] == pytest.approx(1.0)
    # t(0.975, 2 degrees of freedom) = 4.302652729911275
    assert agg["ci95_high"] - agg["mean"] == pytest.approx(4.302652729911275 / np.sqrt(3))
    assert report.aggregate([5.0])["n"] == 1 and np.isnan(report.aggregate([5.0])["std"])
    flat = report.flatten_eval(
        {"task": "sine", "returns_after_steps": {"0": 1.5, "1": 2.5}, "ci95": {"0": 0.1}, "num_tasks": 8, "success": True}
    )
    assert flat == {
        "eval_returns_after_steps.0": 1.5,
        "eval_returns_after_steps.1": 2.5,
        "eval_ci95.0": 0.1,
        "eval_num_tasks": 8.0,
        "eval_success": 1.0,
    }
    cartpole = {
        "per_mode": {
            "1": {"deterministic": {"mean": 3.0}, "sampled": {"mean": 1.0}},
            "0": {"deterministic": {"mean": 2.0}, "sampled": {"mean": 4.0}},
        },
        "deterministic_mean": 2.5,
        "sampled_mean": 2.5,
        "episodes_per_mode": 10,
        "mode_slot_nmi_deterministic": 0.25,
    }
    assert report.flatten_eval(cartpole) == {
        "eval_deterministic_mode0": 2.0,
        "eval_sampled_mode0": 4.0,
        "eval_deterministic_mode1": 3.0,
        "eval_sampled_mode1": 1.0,
        "eval_deterministic_mean": 2.5,
        "eval_sampled_mean": 2.5,
        "eval_deterministic_worst_mode": 2.0,
        "eval_sampled_worst_mode": 1.0,
        "eval_mode_slot_nmi_deterministic": 0.25,
    }


def raw_scalars(run_dir):
    """tag -> values of every scalar record in the run's own event files, in file order, decoded record by record:
    an independent check of the report's reader (for a run that was never resumed, where no purge applies)."""
    import glob

    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in LegacyEventFileLoader(path).Load():
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(value.simple_value)
    return out


def test_report_on_real_sb3_runs(tmp_path):
    out = tmp_path / "sweep"
    command = f"python {SB3_PEERS} --total-timesteps 1024 --save-model --eval-episodes 2"
    r = run_benchmark("--command", command, "--num-seeds", "2", "--workers", "2", "--output", str(out))
    assert r.returncode == 0, r.stderr + "".join(open(rec["log_path"]).read() for rec in manifest(out))
    rep = tmp_path / "report"
    r = subprocess.run(
        [sys.executable, REPORT, "--sweep", str(out), "--output", str(rep), "--labels", "0=sb3_ppo", "--title", "tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    text = (rep / "report.md").read_text()
    assert "| sb3_ppo | – | 2 |" in text and "## Per mode" in text and "![learning_curve.png](learning_curve.png)" in text
    with open(rep / "learning_curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert (rep / "learning_curve_mode0.png").exists()

    import pandas as pd

    runs = pd.read_csv(rep / "runs.csv")
    summary = pd.read_csv(rep / "summary.csv")
    assert len(runs) == 2 and len(summary) == 1
    finals = []
    for rec in manifest(out):
        (run_dir,) = rec["run_dirs"]
        # the report's numbers, recomputed from the raw event records and from eval.json
        raw = raw_scalars(run_dir)
        returns = raw["charts/episodic_return"]
        by_mode = sum(len(v) for t, v in raw.items() if t.startswith("charts/episodic_return_mode"))
        assert by_mode == len(returns) > 0
        row = runs[runs.run_key == rec["run_key"]].iloc[0]
        assert row["final_return"] == pytest.approx(np.mean(returns[-100:]), rel=1e-5)
        assert row["sps"] == pytest.approx(raw["charts/SPS"][-1])
        assert row["wall_time_s"] == pytest.approx(rec["wall_time_s"])
        with open(os.path.join(run_dir, "eval.json")) as f:
            assert row["eval_deterministic_mean"] == pytest.approx(json.load(f)["deterministic_mean"])
        finals.append(row["final_return"])
    assert summary["final_return__mean"][0] == pytest.approx(np.mean(finals))
    assert summary["final_return__std"][0] == pytest.approx(np.std(finals, ddof=1))


# SB3 PEERS
@pytest.fixture(scope="module")
def peers():
    return load(SB3_PEERS)


@pytest.mark.parametrize("preset,hide_velocity", [("seed3", False), ("inverted4", True)])
def test_peers_env_gives_the_baselines_trajectories(peers, preset, hide_velocity):
    """The peers' gymnasium env (one CartPole-v1 per env, as SB3 steps it) and ppo_gru_baseline's vectorised env,
    started from the same state in the same mode and given the same actions, return the same observations, rewards,
    terminations and modes, over episodes in every mode."""
    from cleanrl_astral import ppo_gru_baseline as original

    modes = original.MODE_PRESETS[preset]
    assert peers.resolve_modes(preset, None) == modes
    rng, episodes = np.random.default_rng(0), 0
    for k in range(len(modes)):
        ours = original.NonStationaryCartPole(1, modes, hide_velocity, fixed_mode=k)
        theirs = peers.make_env(modes, hide_velocity, fixed_mode=k)()
        obs_a, info_a = ours.reset(seed=k)
        for _ in range(400):
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
    assert episodes == 400 * len(modes) and obs_b.shape == ((2,) if hide_velocity else (4,))


def test_peers_use_the_baselines_mode_presets_and_never_train_on_a_held_out_mode(peers):
    from cleanrl_astral import ppo_gru_baseline as original

    assert peers.MODE_PRESETS == original.MODE_PRESETS and peers.HELD_OUT_MODES == original.HELD_OUT_MODES
    env = peers.make_env(peers.MODE_PRESETS["mirror4"], switch_prob=0.5, held_out=[4])()
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
def test_peers_callback_logs_each_episode_under_its_mode(peers, normalize):
    import gymnasium as gym

    class Spy(gym.Wrapper):
        """Ground truth: (return, mode) of every finished episode, seen from inside the env."""

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            self.ret, self.mode = 0.0, info["mode"]
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

    finished, writer = [], Writer()
    modes = peers.MODE_PRESETS["inverted4"]
    envs = peers.DummyVecEnv([lambda: Spy(peers.make_env(modes)()) for _ in range(3)])
    if normalize:  # as for recurrent_ppo: the wrapper has reset_infos of its own, which hold no mode
        envs = peers.VecNormalize(envs, norm_obs=True, norm_reward=False)
    args = peers.Args(num_envs=3, num_steps=64, minibatch_size=64, update_epochs=1, total_timesteps=192)
    model = peers.build_model(args, envs)
    model.set_logger(peers.configure(None, []))
    model.learn(args.total_timesteps, callback=peers.CleanRLLogger(writer, 10**9))
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
    r = subprocess.run([sys.executable, SB3_PEERS, "--algo", "a2c"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("sb3_peers.py: error: unknown --algo")


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
def test_peers_refuse_meaningless_values_before_any_work(peers, overrides, needle):
    """Found by a CLI fuzz: these trained silently with the value, or failed inside SB3 after the run dir existed."""
    with pytest.raises(ValueError) as err:
        peers.validate(dataclasses.replace(peers.Args(), **overrides))
    assert needle in str(err.value)
    peers.validate(peers.Args())


def test_peers_recurrent_ppo_smoke(tmp_path):
    subprocess.run(
        [
            sys.executable,
            SB3_PEERS,
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
            "16",
            "--save-model",
            "--eval-episodes",
            "2",
            "--runs-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    (run_dir,) = tmp_path.iterdir()
    with open(run_dir / "eval.json") as f:
        data = json.load(f)
    assert sorted(data["per_mode"]) == ["0", "1", "2"]
    assert all(len(m["deterministic"]["returns"]) == 2 for m in data["per_mode"].values())


def test_peers_recurrent_ppo_uses_the_zoo_policy_and_its_saved_obs_normalisation(peers, tmp_path):
    # rl-baselines3-zoo ppo_lstm.yml CartPoleNoVel-v1: ReLU, no orthogonal init, LSTM 64 with a critic LSTM,
    # pi/vf [64], observations normalised (rewards not)
    args = peers.Args(algo="recurrent_ppo", hide_velocity=True)
    model = peers.build_model(args, peers.make_sb3_env(2, peers.MODE_PRESETS["seed3"], True))
    pol = model.policy
    assert pol.lstm_actor.hidden_size == 64 and pol.lstm_critic is not None and not pol.ortho_init
    assert pol.activation_fn is torch.nn.ReLU and pol.net_arch == dict(pi=[64], vf=[64])
    assert peers.normalizes_obs("recurrent_ppo") and not peers.normalizes_obs("ppo")
    subprocess.run(
        [
            sys.executable,
            SB3_PEERS,
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
            "1",
            "--runs-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    (path,) = tmp_path.glob("*/*.cleanrl_model")
    rms = torch.load(path, weights_only=True)["obs_rms"]
    assert rms["mean"].shape == (2,) and rms["mean"].abs().sum() > 0  # statistics of real observations were saved
    _, _, _, prep = peers.load_policy(str(path))
    obs = np.array([[0.1, -0.05]], dtype=np.float32)
    expected = np.clip(
        (obs - rms["mean"].numpy()) / np.sqrt(rms["var"].numpy() + rms["epsilon"]), -rms["clip_obs"], rms["clip_obs"]
    )
    assert np.allclose(prep(obs), expected, atol=1e-6) and not np.allclose(prep(obs), obs)


def test_labels_by_index_or_command_text():
    report = load(REPORT)
    labels = report.parse_labels(["0=first", "--memory none=memoryless", "ppo_gru_baseline.py=gru"])
    assert report.label_for(labels, 0, "python x.py") == "first"
    assert report.label_for(labels, 3, "python ppo_gru_baseline.py --memory none") == "memoryless"
    assert report.label_for(labels, 4, "python ppo_gru_baseline.py --oracle") == "gru"
    assert report.label_for(labels, 5, "python other.py --x 1") == "other.py --x 1"
    with pytest.raises(ValueError):
        report.parse_labels(["=nothing"])


def test_report_reads_a_resumed_run_as_tensorboard_shows_it(tmp_path):
    """A killed run resumed from its checkpoint reopens its writer with purge_step; TensorBoard then drops what the
    killed run logged from that step on, for every tag. A sub-run's events in a sub-directory (reinforce_baby's
    baseline_{name}) belong to another curve. The report must read the run the same way: no step drawn twice, no
    purged tag left behind, no sub-run mixed in."""
    from torch.utils.tensorboard import SummaryWriter

    report = load(REPORT)
    run_dir = tmp_path / "sweep" / "runs" / "c0__g0_base__s1" / "run"
    killed = SummaryWriter(str(run_dir))
    for step in range(1, 11):
        killed.add_scalar("charts/episodic_return", step, step)
        killed.add_scalar("charts/SPS", 1000 + step, step)
    killed.close()
    resumed = SummaryWriter(str(run_dir), purge_step=6)  # checkpoint at step 5
    for step in range(6, 13):
        resumed.add_scalar("charts/episodic_return", 100 + step, step)
    resumed.close()
    sub = SummaryWriter(str(run_dir / "baseline_rl-only"))
    for step in range(1, 13):
        sub.add_scalar("charts/episodic_return", -1000.0, step)
    sub.close()

    scalars = report.read_scalars(str(run_dir))
    steps, values = scalars["charts/episodic_return"]
    assert steps.tolist() == list(range(1, 13))
    assert values.tolist() == [1, 2, 3, 4, 5, 106, 107, 108, 109, 110, 111, 112]
    # the resumed run never logged SPS: its purged steps are gone all the same
    assert scalars["charts/SPS"][0].tolist() == [1, 2, 3, 4, 5]
    assert report.read_scalars(str(tmp_path / "no_such_run")) == {}

    record = {
        "run_key": "c0__g0_base__s1",
        "command_index": 0,
        "command": "python x.py",
        "grid_index": 0,
        "grid": [],
        "seed": 1,
        "exit_code": 0,
        "wall_time_s": 1.0,
        "runs_dir": str(run_dir.parent),
        "run_dirs": [str(run_dir)],
    }
    (tmp_path / "sweep" / "manifest.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "report"
    report.build_report([str(tmp_path / "sweep")], str(out), {0: "m"}, last_n=100)
    import pandas as pd

    row = pd.read_csv(out / "runs.csv").iloc[0]
    assert row["final_return"] == pytest.approx(np.mean(values))
    assert row["sps"] == 1005


def test_report_copies_the_runs_own_figures(tmp_path):
    """Heatmaps and adaptation curves the runs drew are linked from the report through copies beside it, so a
    report committed under docs/ never points into an (ignored) sweep directory."""
    report = load(REPORT)
    run_dir = tmp_path / "sweep" / "runs" / "c0__g0_base__s1" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "slot_heatmap.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (run_dir / "eval.json").write_text(json.dumps({"per_mode": {"0": {"deterministic": {"mean": 9.0}}}}))
    record = {
        "run_key": "c0__g0_base__s1",
        "command_index": 0,
        "command": "python x.py",
        "grid_index": 0,
        "grid": [],
        "seed": 1,
        "exit_code": 0,
        "wall_time_s": 1.0,
        "runs_dir": str(run_dir.parent),
        "run_dirs": [str(run_dir)],
    }
    (tmp_path / "sweep" / "manifest.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "report"
    report.build_report([str(tmp_path / "sweep")], str(out), {0: "m"})
    copy = out / "figures" / "c0__g0_base__s1__slot_heatmap.png"
    assert copy.read_bytes() == b"\x89PNG\r\n\x1a\nfake"
    assert "(figures/c0__g0_base__s1__slot_heatmap.png)" in (out / "report.md").read_text()


def test_tta_summary_pairs_gains_per_adaptation_seed_and_pools_over_training_seeds(tmp_path):
    summary = load(os.path.join(REPO, "benchmark", "tta_summary.py"))

    def control(after):
        return {"during_per_seed": [[a, a] for a in after], "after_per_seed": {"sampled": after, "deterministic": after}}

    target = {"name": "mode3", "gravity": 9.8, "half_length": 0.5, "force_sign": -1.0}
    # training seed 1: gate gains +2 and +4 over none on the same evaluation episodes; seed 2: +0 and +2
    for seed, none, gate in ((1, [10.0, 20.0], [12.0, 24.0]), (2, [15.0, 15.0], [15.0, 17.0])):
        d = tmp_path / "adapt_inverted" / "runs" / f"c0__g0_base__s{seed}" / "run"
        d.mkdir(parents=True)
        ckpt = f"out/runs/c1__g2_modes-preset_inverted4__s{seed}/run/ppo_gru_astral.cleanrl_model"
        # seed 1 has a ceiling 7 above its before (headroom 6 for a gain of 3), seed 2 none (a run without one)
        ceiling = {"ceiling": {"best": "slot0", "sampled": {"mean": 7.0}}} if seed == 1 else {}
        (d / "tta.json").write_text(
            json.dumps(
                {
                    "checkpoint": ckpt,
                    "targets": [target],
                    "results": {
                        "mode3": {
                            "before": {"sampled": {"mean": 1.0, "ci95": 0.0}},
                            "controls": {"none": control(none), "gate": control(gate)},
                            **ceiling,
                        }
                    },
                }
            )
        )
    out = tmp_path / "tables.md"
    assert summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert (
        "| inverted4 `--hide-velocity` | 1 | mode3 (g 9.8, l 0.5, inverted) | gate | 1.0 ± 0.0 | 18.0 ± 76.2 | 18.0 ± 76.2 "
        "| 18.0 ± 76.2 | 3.0 ± 12.7 | 7.0 (slot0) | 0.50 |"
    ) in text
    assert "| gate | 1.0 ± 0.0 | 16.0 ± 12.7 | 16.0 ± 12.7 | 16.0 ± 12.7 | 1.0 ± 12.7 | — | — |" in text
    # pooled: per-seed mean gains 3 and 1 -> mean 2, t(1) CI 12.706 * 1.414 / 1.414 = 12.7; the fraction of seed 1 only
    assert (
        "| inverted4 `--hide-velocity` | mode3 (g 9.8, l 0.5, inverted) | gate | 2 | 2.0 ± 12.7 | 2/2 | 0.50 (1 seeds) |"
        in text
    )
    assert summary.main(["--root", str(tmp_path / "missing"), "--output", str(out)]) == 2


def test_tta_summary_one_seed_sweep_has_no_ci_and_every_clamp_sweep_gets_a_table(tmp_path):
    summary = load(os.path.join(REPO, "benchmark", "tta_summary.py"))
    target = {"name": "mode0", "gravity": 9.8, "half_length": 0.5, "force_sign": 1.0}
    ckpt = "out/runs/c1__g0_modes-preset_seed3__s3/run/ppo_gru_astral.cleanrl_model"
    d = tmp_path / "adapt_collapsed" / "runs" / "c0__g0_base__s3" / "run"
    d.mkdir(parents=True)

    def ctl(a):
        return {"during_per_seed": [[x] for x in a], "after_per_seed": {"sampled": a, "deterministic": a}}

    def cell(v):
        return {"deterministic": {"mean": v}, "sampled": {"mean": v}}

    (d / "tta.json").write_text(
        json.dumps(
            {
                "checkpoint": ckpt,
                "targets": [target],
                "results": {
                    "mode0": {
                        "before": {"sampled": {"mean": 1.0, "ci95": 0.0}},
                        "controls": {"none": ctl([10.0, 20.0]), "gate": ctl([13.0, 21.0])},
                    }
                },
            }
        )
    )
    for sweep, learned in (("clamp_all", 500.0), ("full", 250.0)):
        d = tmp_path / sweep / "runs" / "c1__g0_base__s3" / "run"
        d.mkdir(parents=True)
        specificity = (
            {"specificity": {"deterministic": {"score": 12.5}, "sampled": {"score": None}}} if sweep == "full" else {}
        )
        (d / "clamp.json").write_text(
            json.dumps(
                {
                    "checkpoint": ckpt,
                    "targets": [target],
                    "columns": ["slot0", "uniform", "learned"],
                    "results": {
                        "mode0": {
                            "slot0": cell(300.0),
                            "uniform": cell(learned),
                            "learned": cell(learned),
                            "learned_slot_weights": [1.0],
                        }
                    },
                    **specificity,
                }
            )
        )
    out = tmp_path / "tables.md"
    assert summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    # one training seed: the pooled gain is its mean paired gain (+3, +1 -> 2.0) with no CI
    assert "| seed3 | mode0 (g 9.8, l 0.5) | gate | 1 | 2.0 (one seed: no CI) | 1/1 |" in text
    # a table per clamp sweep, each from its own clamp.json (max |Δ| vs learned 200 in one, 50 in the other)
    assert "### clamp (`clamp_all`)" in text and "### clamp (`full`)" in text and "### clamp (`clamp_b`)" not in text
    assert (
        "| seed3 | 3 | mode0 (g 9.8, l 0.5) | 300.0 / 500.0 / 500.0 | 300.0 / 500.0 / 500.0 | 200.0 / 200.0 | [1.00] | — / — |"
        in text
    )
    assert (
        "| seed3 | 3 | mode0 (g 9.8, l 0.5) | 300.0 / 250.0 / 250.0 | 300.0 / 250.0 / 250.0 "
        "| 50.0 / 50.0 | [1.00] | 12.5 / — |" in text
    )


def test_tta_summary_reads_the_study_sweeps_and_labels_the_held_out_mode(tmp_path):
    """tta_gating.sh --study's sweeps get their tables, rows named by the study checkpoint (frozen, ceiling) and the
    held-out target labelled as such."""
    summary = load(os.path.join(REPO, "benchmark", "tta_summary.py"))
    target = {"name": "mode4", "gravity": 8.65, "half_length": 0.6, "force_sign": -1.0, "held_out": True}

    def ctl(a):
        return {"during_per_seed": [[x] for x in a], "after_per_seed": {"sampled": a, "deterministic": a}}

    d = tmp_path / "study_adapt_frozen" / "runs" / "c0__g0_base__s6" / "run"
    d.mkdir(parents=True)
    (d / "tta.json").write_text(
        json.dumps(
            {
                "checkpoint": "out/phase_C/runs/c0__g0_base__s6/run/frozen.cleanrl_model",
                "targets": [target],
                "results": {
                    "mode4": {
                        "before": {"sampled": {"mean": 1.0, "ci95": 0.0}},
                        "ceiling": {"best": "slot0", "sampled": {"mean": 9.0}},
                        "controls": {"none": ctl([10.0, 20.0]), "gate": ctl([13.0, 21.0])},
                    }
                },
            }
        )
    )
    out = tmp_path / "tables.md"
    assert summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "`study_adapt_frozen`: 1 runs, training seeds 6" in text
    assert "| frozen | mode4 (g 8.65, l 0.6, inverted, held out) | gate | 1 | 2.0 (one seed: no CI) | 1/1 |" in text


def test_tta_summary_scores_the_study_criteria_3_and_4_as_the_protocol_fixes_them(tmp_path):
    """Criterion 3: per target the t-CI of the mean paired gain over training seeds must lie above 0 and the gain reach
    half the mean gap (negative gaps count 0); `gate` or `context` must pass every target. Criterion 4: deterministic
    specificity >= 200 in >= 8/10 seeds. Fewer than ten training seeds give no verdict."""
    summary = load(os.path.join(REPO, "benchmark", "tta_summary.py"))
    targets = [{"name": f"mode{k}", "gravity": 9.8, "half_length": 0.5, "force_sign": 1.0} for k in (0, 4)]

    def ctl(a):
        return {"during_per_seed": [[x] for x in a], "after_per_seed": {"sampled": a, "deterministic": a}}

    def write(seeds, gate_gain_mode4):
        for s in seeds:
            d = tmp_path / "study_adapt_frozen" / "runs" / f"c0__g0_base__s{s}" / "run"
            d.mkdir(parents=True, exist_ok=True)
            jitter = (s % 2) * 2.0  # gains differ by seed so the CI has a width
            results = {
                # mode0: before 100, ceiling 200 (gap 100); gate gains 60 +- 1, context gains 40 +- 1 (below half the gap)
                "mode0": {
                    "before": {"sampled": {"mean": 100.0, "ci95": 0.0}},
                    "ceiling": {"best": "slot0", "sampled": {"mean": 200.0}},
                    "controls": {
                        "none": ctl([100.0, 100.0]),
                        "gate": ctl([159.0 + jitter, 159.0 + jitter]),
                        "context": ctl([139.0 + jitter, 139.0 + jitter]),
                    },
                },
                # mode4: ceiling below before (gap counted 0): any gain with a CI above 0 passes
                "mode4": {
                    "before": {"sampled": {"mean": 300.0, "ci95": 0.0}},
                    "ceiling": {"best": "slot1", "sampled": {"mean": 250.0}},
                    "controls": {
                        "none": ctl([300.0]),
                        "gate": ctl([300.0 + gate_gain_mode4 + jitter]),
                        "context": ctl([301.0 + jitter]),
                    },
                },
            }
            (d / "tta.json").write_text(
                json.dumps(
                    {"checkpoint": f"x/c0__g0_base__s{s}/run/frozen.cleanrl_model", "targets": targets, "results": results}
                )
            )
            d = tmp_path / "study_clamp_frozen" / "runs" / f"c0__g0_base__s{s}" / "run"
            d.mkdir(parents=True, exist_ok=True)
            cell = {"deterministic": {"mean": 500.0}, "sampled": {"mean": 500.0}}
            (d / "clamp.json").write_text(
                json.dumps(
                    {
                        "checkpoint": f"x/c0__g0_base__s{s}/run/frozen.cleanrl_model",
                        "targets": targets[:1],
                        "columns": ["slot0", "learned"],
                        "results": {"mode0": {"slot0": cell, "learned": cell, "learned_slot_weights": [1.0]}},
                        "specificity": {
                            "deterministic": {"score": 250.0 if s < 13 else 200.0 if s == 13 else 150.0},
                            "sampled": {"score": 10.0},
                        },
                    }
                )
            )

    out = tmp_path / "tables.md"
    write(range(6, 15), 4.0)  # nine of the ten seeds
    assert summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "**criterion 3, frozen: incomplete**" in text and "**criterion 4, frozen: incomplete** (8/9" in text
    write([15], 4.0)
    assert summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "| gate | mode0 (g 9.8, l 0.5) | 10 | 60.0 ± 0.8 | 100.00 | 0.60 | pass |" in text
    assert "| context | mode0 (g 9.8, l 0.5) | 10 | 40.0 ± 0.8 | 100.00 | 0.40 | fail |" in text
    assert "| context | mode4 (g 9.8, l 0.5) | 10 | 2.0 ± 0.8 | 0.00 | no headroom | pass |" in text
    assert "**criterion 3, frozen: PASS** (every target passes for `gate` or `context`; `gate` passes, `context` fails" in text
    assert "**criterion 4, frozen: PASS** (8/10 training seeds ≥ 200)" in text
    # the gate's gain on mode4 now straddles 0 (-0.5 or +1.5): its mean is positive and above half the gap (0), but its
    # CI does not exclude 0, so neither control passes everywhere
    write(range(6, 16), -0.5)
    assert summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "| gate | mode4 (g 9.8, l 0.5) | 10 | 0.5 ± 0.8 | 0.00 | no headroom | fail |" in text
    assert "**criterion 3, frozen: FAIL**" in text
    # a sweep run without the ceiling cannot be scored: one line, no traceback
    run = tmp_path / "study_adapt_frozen" / "runs" / "c0__g0_base__s6" / "run" / "tta.json"
    d = json.loads(run.read_text())
    del d["results"]["mode0"]["ceiling"]
    run.write_text(json.dumps(d))
    with pytest.raises(SystemExit, match="has no ceiling or no `none` control"):
        summary.main(["--root", str(tmp_path), "--output", str(out)])


def _fake_maml_run(root, sweep, seed, args, returns, cis=(1.0, 1.0, 1.0, 1.0), steps_done=None, version=None):
    """A finished maml_ssm run as the report finds it: checkpoint dict (no weights needed) and eval.json."""
    d = root / sweep / "runs" / f"c0__s{seed}" / f"run{seed}"
    d.mkdir(parents=True)
    maml = importlib.import_module("cleanrl_astral.maml_ssm")
    ckpt = {
        "args": dict(args, seed=seed),
        "param_count": 13193,
        "train_wall_time": 950.0,
        "train_cpu_time": 900.0,
        "task_version": maml.TASK_VERSIONS[args["task"]] if version is None else version,
    }
    if steps_done is not None:
        ckpt["outer_steps_done"] = steps_done
    torch.save(ckpt, d / "maml_ssm.cleanrl_model")
    (d / "eval.json").write_text(
        json.dumps(
            {
                "task": args["task"],
                "num_tasks": 40,
                "returns_after_steps": {str(k): v for k, v in enumerate(returns)},
                "ci95": {str(k): v for k, v in enumerate(cis)},
            }
        )
    )


def test_maml_ssm_report_keeps_the_goal_rules_apart_and_pools_seeds(tmp_path):
    """The TRPO arms with the paper code's goal square and with the Euclidean disc are separate rows (a checkpoint
    saved before the field existed counts as Euclidean); each row pools its seeds as mean ± std; a one-seed arm
    shows the CI over test tasks."""
    import dataclasses

    report = load(os.path.join(REPO, "benchmark", "maml_ssm_report.py"))
    maml = importlib.import_module("cleanrl_astral.maml_ssm")
    base = dataclasses.asdict(maml.Args())
    trpo = dict(base, policy="mlp", cpu_budget=900.0, outer_steps=1000, tasks_per_batch=20, fast_batch_size=20)
    old = {k: v for k, v in trpo.items() if k not in ("goal_box", "fill_steps")}  # saved before these fields existed
    out = tmp_path / "out"
    _fake_maml_run(out, "trpo", 1, dict(trpo, goal_box=True), [-40.0, -10.0, -4.0, -3.0], steps_done=96)
    _fake_maml_run(out, "trpo", 2, dict(trpo, goal_box=True), [-42.0, -12.0, -6.0, -5.0], steps_done=97)
    _fake_maml_run(out, "trpo_euclidean", 1, old, [-30.0, -7.0, -5.0, -5.0], steps_done=120)
    _fake_maml_run(out, "trpo_euclidean", 2, dict(trpo, goal_box=False), [-32.0, -9.0, -7.0, -7.0], steps_done=120)
    _fake_maml_run(
        out,
        "ssm",
        3,
        dict(base, outer_optimizer="adam", outer_steps=150),
        [-200.0, -29.0, -20.5, -22.0],
        cis=(5.0, 2.0, 1.5, 1.25),
    )
    rep = tmp_path / "report"
    assert report.main(["--out", str(out), "--report", str(rep)]) == 0
    rows = {
        line.split(" | ")[0][2:]: line
        for line in (rep / "point_nav_table.md").read_text().splitlines()
        if line.startswith("| MAML")
    }
    square = "MAML MLP, TRPO 20 x 20, 900 CPU-s budget, goal square"
    disc = "MAML MLP, TRPO 20 x 20, 900 CPU-s budget, Euclidean goal"
    assert (
        rows[square]
        == f"| {square} | 13193 | 1,2 | 96–97 | -41.00 ± 1.41 | -11.00 ± 1.41 | -5.00 ± 1.41 | -4.00 ± 1.41 | 950 | 900 |"
    )
    assert (
        rows[disc]
        == f"| {disc} | 13193 | 1,2 | 120 | -31.00 ± 1.41 | -8.00 ± 1.41 | -6.00 ± 1.41 | -6.00 ± 1.41 | 950 | 900 |"
    )
    assert rows["MAML SSM, 150 outer steps"].split(" | ")[4:8] == [
        "-200.00 ± 5.00",
        "-29.00 ± 2.00",
        "-20.50 ± 1.50",
        "-22.00 ± 1.25",
    ]
    assert "| -40.41 | -11.68 | -3.33 | -3.23 |" in rows["MAML paper, Table 4 (MLP, TRPO)"]
    runs = json.loads((rep / "point_nav_runs.json").read_text())
    assert sorted(r["seed"] for r in runs[square]) == [1, 2] and sorted(r["seed"] for r in runs[disc]) == [1, 2]
    assert (rep / "point_nav_adaptation.png").stat().st_size > 0 and (rep / "point_nav_training.png").stat().st_size > 0
    # the training curves come from the run's own TensorBoard events, as TensorBoard shows them (resume purged)
    from torch.utils.tensorboard import SummaryWriter

    run_dir = out / "trpo" / "runs" / "c0__s1" / "run1"
    for purge_step, values in ((None, [-70.0, -60.0, -50.0]), (2, [-55.0, -45.0])):
        w = SummaryWriter(str(run_dir), purge_step=purge_step)
        for i, v in enumerate(values, start=1 if purge_step is None else purge_step):
            w.add_scalar("meta/pre_adapt_return", v, i)
            w.add_scalar("meta/post_adapt_return", v / 10, i)
        w.close()
    drawn = report.training_curves(report.load_runs(str(out)), str(rep))
    assert drawn == {
        "mlp TRPO square s1": {"meta/pre_adapt_return": [-70.0, -55.0, -45.0], "meta/post_adapt_return": [-7.0, -5.5, -4.5]}
    }


def test_maml_ssm_report_tables_the_protocol_per_task_and_policy_with_t_intervals(tmp_path):
    """Sweeps named protocol_* give one row per task and policy: the mean over seeds with a 95% Student-t CI, and
    the TRPO iterations each seed got in its CPU budget; other sweeps stay out of that table."""
    import dataclasses

    report = load(os.path.join(REPO, "benchmark", "maml_ssm_report.py"))
    maml = importlib.import_module("cleanrl_astral.maml_ssm")
    paper = dict(dataclasses.asdict(maml.Args()), cpu_budget=900.0, goal_box=True, fill_steps=True)
    out = tmp_path / "out"
    for seed, (ret, steps) in enumerate([(-4.0, 90), (-5.0, 95), (-6.0, 100)], start=1):
        _fake_maml_run(out, "protocol_point_nav", seed, dict(paper, policy="mlp"), [-40.0, -10.0, ret, ret], steps_done=steps)
    _fake_maml_run(
        out,
        "protocol_cartpole",
        1,
        dict(paper, task="cartpole-physics", goal_box=False, policy="ssm"),
        [150.0, 180.0, 190.0, 195.0],
        steps_done=30,
    )
    _fake_maml_run(out, "trpo", 9, dict(paper, policy="mlp"), [-1.0] * 4, steps_done=1)
    assert report.main(["--out", str(out), "--report", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "protocol_table.md").read_text()
    half = 4.302653 * 1.0 / 3**0.5  # t(0.975, 2 dof) x sd 1 / sqrt(3)
    assert (
        f"| point-nav-2d | mlp | 3 | 95 (90–100) | -40.00 ± 0.00 | -10.00 ± 0.00 | -5.00 ± {half:.2f} | -5.00 ± {half:.2f} |"
        in table
    )
    assert "| cartpole-physics | ssm | 1 | 30 (30–30) | 150.00 ± 0.00 |" in table and "-1.00" not in table
    assert (tmp_path / "rep" / "protocol.png").stat().st_size > 0


def test_maml_ssm_report_refuses_runs_of_an_older_task_version(tmp_path, capsys):
    import dataclasses

    report = load(os.path.join(REPO, "benchmark", "maml_ssm_report.py"))
    maml = importlib.import_module("cleanrl_astral.maml_ssm")
    _fake_maml_run(tmp_path / "out", "ssm", 1, dataclasses.asdict(maml.Args()), [-1.0] * 4, version=1)
    assert report.main(["--out", str(tmp_path / "out"), "--report", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "older point-nav-2d (version 1)" in err and "delete its sweep directory" in err
    assert not (tmp_path / "rep").exists()  # nothing written from a mix of task versions
    assert report.main(["--out", str(tmp_path / "missing"), "--report", str(tmp_path / "rep")]) == 2


def _fake_baby_run(sweep, key, curves, ev=None, wall=None, exit_code=0):
    """A reinforce_baby run as benchmark.py leaves it: sweep/runs/<key>/<run_name>/ with TensorBoard events
    ({tag: [(step, value)]}), eval.json when the run finished, and a manifest record when it exited."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = sweep / "runs" / key / "run"
    w = SummaryWriter(str(run_dir))
    for tag, points in curves.items():
        for step, value in points:
            w.add_scalar(tag, value, step)
    w.close()
    if ev is not None:
        (run_dir / "eval.json").write_text(json.dumps(ev))
    if wall is not None:
        with open(sweep / "manifest.jsonl", "a") as f:
            f.write(json.dumps({"runs_dir": str(run_dir.parent), "exit_code": exit_code, "wall_time_s": wall}) + "\n")


def test_reinforce_baby_report_checks_the_mvp_criteria_per_seed_and_compares_methods_at_matched_steps(tmp_path):
    """The MVP table reads the success rate at step 5,000 as the last value logged at or before it, compares the
    first and last 10% of the entropy and world-model curves, and counts the target (> 90% by step 5,000 on >= 4 of
    5 seeds). The curriculum tables pool every curriculum* sweep; a run counts at the matched steps it reached and in
    the final evaluation only if it finished."""
    rep_mod = load(os.path.join(REPO, "benchmark", "reinforce_baby_report.py"))
    out = tmp_path / "out"
    steps = list(range(1000, 10001, 1000))
    good = {
        "charts/success_rate": [(s, 0.2 if s < 3000 else 0.95) for s in steps],
        "losses/entropy": [(s, 2.0 - s / 10000) for s in steps],
        "losses/world_model_mse": [(s, 1.0 - s / 20000) for s in steps],
    }
    ev = {"success_rate": 0.99, "train_time_s": 3.0}
    for seed in (1, 2, 3, 4):
        _fake_baby_run(out / "mvp", f"c0__g0_base__s{seed}", good, ev, wall=75.0 if seed == 3 else 8.0)
    # seed 5: 0.95 logged at step 5,001 only, so 0.6 at 5,000 (> 50%, not > 90%); its entropy rises
    slow = dict(
        good,
        **{
            "charts/success_rate": [(1000, 0.1), (5000, 0.6), (5001, 0.95), (10000, 0.97)],
            "losses/entropy": [(s, 1.0 + s / 10000) for s in steps],
        },
    )
    _fake_baby_run(out / "mvp", "c0__g0_base__s5", slow, ev, wall=9.0)

    TASKS = ["pattern-echo", "sequence-next", "conditional"]

    def curriculum(end, success, level):
        c = {"charts/success_rate": [(s, success) for s in range(10000, end + 1, 10000)]}
        c.update({f"curriculum/level_{t}": [(s, level) for s in range(10000, end + 1, 10000)] for t in TASKS})
        return c

    def final(success):
        return {
            "success_rate": success,
            "eval_levels": {t: 2 for t in TASKS},
            "world_model_mse": 0.5,
            "per_difficulty_success": {f"{t}/level{lvl}": success for t in TASKS for lvl in range(3)},
        }

    _fake_baby_run(out / "curriculum", "c0__g0_algorithm_reinforce__s1", curriculum(80000, 0.8, 2), final(0.9), 60.0)
    _fake_baby_run(out / "curriculum", "c0__g1_algorithm_ppo__s1", curriculum(80000, 0.4, 1), final(0.5), 50.0)
    # a second sweep: a killed REINFORCE run that reached 20k (no eval.json) and a KL-distill run still at 10k
    _fake_baby_run(out / "curriculum_more", "c0__g0_algorithm_reinforce__s2", curriculum(20000, 0.6, 1))
    _fake_baby_run(out / "curriculum_more", "c0__g3_kl-coef_1.0__s1", curriculum(10000, 0.3, 0))

    rep = tmp_path / "report"
    assert rep_mod.main(["--out", str(out), "--report", str(rep)]) == 0
    rows = {r["seed"]: r for r in json.loads((rep / "mvp_criteria.json").read_text())}
    assert rows[1]["success@5k"] == pytest.approx(0.95) and rows[1]["first_step_gt_90%"] == 3000
    assert rows[5]["success@5k"] == pytest.approx(0.6) and rows[5]["first_step_gt_90%"] == 5001
    assert rows[5]["c2_gt_50%@5k"] and not rows[5]["target_gt_90%@5k"] and not rows[5]["c3_entropy_down"]
    assert rows[1]["entropy_first"] == pytest.approx(1.9) and rows[1]["entropy_last"] == pytest.approx(1.0)
    assert all(rows[s]["c3_entropy_down"] and rows[s]["c4_wm_mse_down"] for s in (1, 2, 3, 4))
    assert [rows[s]["under_60s"] for s in range(1, 6)] == [True, True, False, True, True]
    md = (rep / "mvp_criteria.md").read_text()
    assert "Target > 90% by step 5,000: 4/5 seeds (met for >= 4/5). All four MVP criteria on every seed: False." in md
    table = (rep / "curriculum_table.md").read_text().splitlines()
    methods = [line.split(" | ")[0][2:] for line in table if line.startswith("| ") and not line.startswith("| method")]
    assert methods == ["REINFORCE", "PPO", "KL-distill"] * 2  # matched-step rows, then final-eval rows; no RL-only
    # REINFORCE: both runs at 10k and 20k, only the one that reached 80k from 40k on
    reinforce = [line for line in table if line.startswith("| REINFORCE |")]
    assert reinforce[0].split(" | ")[1:3] == ["0.70 ± 0.10 / 4.50 ± 1.50 (2)", "0.70 ± 0.10 / 4.50 ± 1.50 (2)"]
    assert reinforce[0].split(" | ")[3] == "0.80 ± 0.00 / 6.00 ± 0.00 (1)"
    kl = [line for line in table if line.startswith("| KL-distill |")]
    assert kl[0].split(" | ")[2] == "–"  # never reached 20k
    assert kl[1].startswith("| KL-distill | 0 | – |")  # no finished run
    assert reinforce[1].startswith("| REINFORCE | 1 | 0.90 ± 0.00 | 2/2/2 |") and reinforce[1].endswith("| 60.00 ± 0.00 |")
    for png in ("mvp_curves.png", "curriculum_curves.png"):
        assert (rep / png).stat().st_size > 0
    # no MVP runs: one line, exit 2, nothing written
    assert rep_mod.main(["--out", str(tmp_path / "empty"), "--report", str(tmp_path / "rep2")]) == 2
    assert not (tmp_path / "rep2").exists()


def test_a_rerun_that_fails_loses_its_old_marker_so_resume_runs_it_again(tmp_path):
    """A run re-made without --resume starts from an emptied directory; if it then fails, the marker of its earlier
    success must not make the next --resume skip it (the report would read the emptied directory)."""
    script = write_script(
        tmp_path / "flip.py",
        "d = os.path.dirname(os.path.abspath(__file__))\n"
        "open(os.path.join(d, 'ledger'), 'a').write(f'{a.seed}\\n')\n"
        "os.makedirs(os.path.join(a.runs_dir, 'run'))\n"
        "sys.exit(3 if os.path.exists(os.path.join(d, 'broken')) else 0)\n",
    )
    out = str(tmp_path / "sweep")
    assert run_benchmark("--command", f"python {script}", "--num-seeds", "1", "--output", out).returncode == 0
    (tmp_path / "broken").touch()
    assert run_benchmark("--command", f"python {script}", "--num-seeds", "1", "--output", out).returncode == 1
    (tmp_path / "broken").unlink()
    r = run_benchmark("--command", f"python {script}", "--num-seeds", "1", "--output", out, "--resume")
    assert r.returncode == 0 and "skipping" not in r.stderr, r.stderr
    assert (tmp_path / "ledger").read_text().split() == ["1", "1", "1"]


def test_the_same_command_line_twice_is_refused(tmp_path):
    """Two grid values or commands that expand to one command line would be pooled by the report as extra seeds."""
    for flags in (["--command", "python x.py", "--grid", "--lr 1 1"], ["--command", "python x.py", "python x.py"]):
        r = run_benchmark(*flags, "--output", str(tmp_path / "sweep"), "--dry-run")
        assert r.returncode == 2 and "duplicate runs" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "sweep").exists()


def test_bad_runner_flags_are_one_line_errors_before_any_run(tmp_path):
    """Each used to be a traceback (an --output that is a file, an unbalanced quote), a sweep of runs that all
    failed (--cwd missing, a negative seed the scripts refuse) or a Ray reservation of NaN CPUs."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = {
        ("--output", str(a_file)): "is a file",
        ("--cwd", str(tmp_path / "missing")): "is not a directory",
        ("--cpus-per-run", "nan"): "--cpus-per-run must be a finite number > 0, got nan",
        ("--start-seed", "-1"): "--start-seed must be >= 0, got -1",
        ("--command", "python x.py --tag 'open"): "check its quotes",
        ("--grid", "--tag 'a | b"): "check its quotes",
    }
    for flags, message in cases.items():
        command = [] if flags[0] == "--command" else ["--command", "python x.py"]
        output = [] if flags[0] == "--output" else ["--output", str(tmp_path / "sweep")]
        r = run_benchmark(*command, *flags, *output, "--num-seeds", "1")
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (flags, r.stderr)
    assert not (tmp_path / "sweep").exists() and a_file.read_text() == ""


def test_a_corrupt_or_empty_manifest_is_a_one_line_error_before_the_report_is_written(tmp_path):
    """Each used to be a traceback (JSONDecodeError, KeyError, IsADirectoryError) or, for an empty manifest, an
    empty report with exit 0."""
    good = {
        "run_key": "c0__g0_base__s1",
        "command_index": 0,
        "command": "python x.py",
        "grid_index": 0,
        "grid": "",
        "seed": 1,
        "exit_code": 0,
        "runs_dir": "r",
        "wall_time_s": 1.0,
    }
    cases = {
        json.dumps(good) + "\n{truncated": "line 2 is not a JSON object",
        json.dumps({k: v for k, v in good.items() if k != "seed"}): "line 1 lacks seed",
        "[1, 2]": "line 1 is not a JSON object",
        "\n": "no runs recorded",
        None: "is not a file",
    }
    for i, (text, message) in enumerate(cases.items()):
        sweep = tmp_path / f"sweep{i}"
        if text is None:
            (sweep / "manifest.jsonl").mkdir(parents=True)
        else:
            sweep.mkdir()
            (sweep / "manifest.jsonl").write_text(text)
        r = subprocess.run(
            [sys.executable, REPORT, "--sweep", str(sweep), "--output", str(tmp_path / "rep")],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (text, r.stderr)
    assert not (tmp_path / "rep").exists()


def test_labels_follow_the_command_index_and_a_missing_eval_json_is_a_warning(tmp_path):
    """--labels 1=... names command 1 even while command 0 has no finished run; a run without eval.json is listed
    under the warnings, and the eval cells, which average fewer seeds than the Seeds column, say how many."""
    from torch.utils.tensorboard import SummaryWriter

    report = load(REPORT)
    sweep = tmp_path / "sweep"
    records = []
    for seed in (1, 2, 3):
        run_dir = sweep / "runs" / f"c1__g0_base__s{seed}" / "run"
        w = SummaryWriter(str(run_dir))
        w.add_scalar("charts/episodic_return", 10.0 * seed, 1)
        w.close()
        if seed != 2:
            (run_dir / "eval.json").write_text(json.dumps({"deterministic_mean": 4.0 + seed}))
        records.append(
            {
                "run_key": f"c1__g0_base__s{seed}",
                "command_index": 1,
                "num_commands": 2,
                "command": "python fast.py",
                "grid_index": 0,
                "grid": "",
                "seed": seed,
                "exit_code": 0,
                "wall_time_s": 1.0,
                "runs_dir": str(run_dir.parent),
                "run_dirs": [str(run_dir)],
            }
        )
    (sweep / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = report.build_report([str(sweep)], str(tmp_path / "report"), {0: "slow_method", 1: "fast_method"})
    text = (tmp_path / "report" / "report.md").read_text()
    tables = text.split("## Warnings")[0]
    assert "fast_method" in tables and "slow_method" not in tables
    assert any("c1__g0_base__s2: no eval.json" in p for p in result["problems"])
    # a label that names nothing is most likely a typo: said, not silently ignored
    assert any(p.startswith("label 0=slow_method matches no command") for p in result["problems"])
    result = report.build_report([str(sweep)], str(tmp_path / "report2"), {"fats.py": "fast_method"})
    assert any(p.startswith("label fats.py=fast_method matches no command") for p in result["problems"])
    assert not any(
        p.startswith("label")
        for p in report.build_report([str(sweep)], str(tmp_path / "report3"), {"fast.py": "f"})["problems"]
    )
    # the same sweep given twice (here once through a trailing slash) would double its seeds: refused
    assert report.main(["--sweep", str(sweep), str(sweep) + "/", "--output", str(tmp_path / "twice")]) == 2
    assert not (tmp_path / "twice").exists()
    # final return over seeds 1-3 (10, 20, 30); deterministic eval over seeds 1 and 3 only (5, 7)
    assert "| fast_method | – | 3 | 20.0 ± 10.0 [-4.84, 44.8] | 6 ± 1.41 [-6.71, 18.7] (2 seeds) |" in text


def test_retries_means_that_many_more_attempts_and_no_more(tmp_path):
    """--retries 1 must give a run that fails once exactly one more attempt (which succeeds), and a run that always
    fails exactly two attempts in all; an off-by-one in the retry count gives the flaky run no second chance or the
    broken one a third."""
    flaky = write_script(
        tmp_path / "flaky.py",
        "m = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tried')\n"
        "if not os.path.exists(m):\n    open(m, 'w').close(); sys.exit(1)\n",
    )
    bad = write_script(tmp_path / "bad.py", "sys.exit(5)\n")
    out = tmp_path / "sweep"
    r = run_benchmark(
        "--command", f"python {flaky}", f"python {bad}", "--num-seeds", "1", "--retries", "1", "--output", str(out)
    )
    assert r.returncode == 1, r.stderr
    attempts = {}
    for rec in manifest(out):
        attempts.setdefault(rec["command_index"], []).append((rec["attempt"], rec["exit_code"]))
    assert attempts == {0: [(1, 1), (2, 0)], 1: [(1, 5), (2, 5)]}
    assert "FAILED c1__" in r.stderr and "FAILED c0__" not in r.stderr


def test_env_ids_add_a_grid_dimension_beside_the_grid(tmp_path):
    """--env-ids is one more grid dimension: with --grid it must form the Cartesian product, not replace it."""
    r = run_benchmark(
        "--command",
        "python x.py",
        "--env-ids",
        "EnvA",
        "EnvB",
        "--grid",
        "--lr 1 2",
        "--num-seeds",
        "1",
        "--output",
        str(tmp_path / "sweep"),
        "--dry-run",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4
    for env in ("EnvA", "EnvB"):
        for lr in ("1", "2"):
            assert sum(f"--env-id {env} --lr {lr} --seed 1 " in line for line in lines) == 1


def test_report_groups_seeds_per_method_and_grid_point_and_keeps_each_runs_last_attempt(tmp_path):
    """Seeds are pooled only within one method and one grid point; a failed run stays out of the tables even though
    its directory holds events; a retried run counts by its last attempt; the final return is the mean of the last
    N logged episodes. Pooled grid points or methods, a failed run in the tables, the first attempt kept, or all
    (or the first N) episodes averaged would each change a number checked here."""
    import pandas as pd
    from torch.utils.tensorboard import SummaryWriter

    report = load(REPORT)
    sweep = tmp_path / "sweep"
    records = []

    def run(ci, gi, seed, final, exit_code=0, attempt=1):
        key = f"c{ci}__g{gi}_lr_{gi + 1}__s{seed}"
        run_dir = sweep / "runs" / key / f"run_a{attempt}"
        w = SummaryWriter(str(run_dir))
        for step, value in enumerate([-500.0] * 5 + [final - 1, final, final + 1], 1):  # last 3 average to `final`
            w.add_scalar("charts/episodic_return", value, step)
        w.close()
        records.append(
            {
                "run_key": key,
                "command_index": ci,
                "num_commands": 2,
                "command": f"python m{ci}.py",
                "grid_index": gi,
                "grid": f"--lr {gi + 1}",
                "seed": seed,
                "exit_code": exit_code,
                "attempt": attempt,
                "wall_time_s": 1.0,
                "runs_dir": str(run_dir.parent),
                "run_dirs": [str(run_dir)],
            }
        )

    for ci in (0, 1):
        for gi in (0, 1):
            for seed in (1, 2):
                if (ci, gi, seed) == (1, 1, 2):
                    run(ci, gi, seed, 7000.0, exit_code=1, attempt=1)  # failed first attempt, then retried
                    run(ci, gi, seed, 100 * ci + 10 * gi + seed, attempt=2)
                else:
                    run(ci, gi, seed, 100 * ci + 10 * gi + seed)
    run(0, 0, 3, 9000.0, exit_code=2)  # a failed run whose directory holds events all the same
    (sweep / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = report.build_report([str(sweep)], str(tmp_path / "report"), {0: "m0", 1: "m1"}, last_n=3)
    assert [r["run_key"] for r in result["failed"]] == ["c0__g0_lr_1__s3"]
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    got = {(row.method, row.grid): (row.n_seeds, str(row.seeds), row.final_return__mean) for row in summary.itertuples()}
    assert got == {
        (f"m{ci}", f"--lr {gi + 1}"): (2, "1 2", pytest.approx(100 * ci + 10 * gi + 1.5)) for ci in (0, 1) for gi in (0, 1)
    }
    assert summary["final_return__std"].tolist() == pytest.approx([np.sqrt(0.5)] * 4)


def test_learning_curves_are_smoothed_over_the_given_window_and_stop_at_the_shortest_run():
    """The plotted curve of a seed is the running mean of `smooth` episodes; an unsmoothed (or wrongly smoothed)
    curve of returns alternating 0, 10 would not be flat at 5. The common grid must end at the shortest run's last
    step so that no seed is extrapolated."""
    report = load(REPORT)
    steps = np.arange(10, dtype=float)
    alternating = np.array([0.0, 10.0] * 5)
    grid, mean, std = report.mean_std_curve([(steps, alternating), (steps[:7], alternating[:7] + 2.0)], smooth=2, points=7)
    assert grid.tolist() == [0, 1, 2, 3, 4, 5, 6]
    # seed 1 smoothed: 0, 5, 5, ...; seed 2 (shifted by 2): 2, 7, 7, ...
    assert mean.tolist() == pytest.approx([1.0] + [6.0] * 6)
    assert std.tolist() == pytest.approx([1.0] * 7)


# ATTEMPT NUMBERING
def test_the_next_attempt_follows_the_highest_earlier_attempt_of_that_run_only(tmp_path):
    """Numbering continues after the highest attempt log of the same run key, even if an earlier log was deleted
    (counting logs would reuse attempt 3 and overwrite its log), and ignores other runs' logs: c11's keys begin
    with c1's text, and a renamed log (.bak) is not an attempt."""
    ok = write_script(tmp_path / "ok.py", "print('new attempt of', a.tag)\n")
    out = tmp_path / "sweep"
    logs = out / "logs"
    logs.mkdir(parents=True)
    earlier = {
        "c0__g0_base__s1.attempt2.log": "c0 attempt 2",
        "c1__g0_base__s1.attempt1.log": "c1 attempt 1",
        "c1__g0_base__s1.attempt3.log": "c1 attempt 3",
        "c11__g0_base__s1.attempt7.log": "another sweep's c11",
        "c1__g0_base__s1.attempt9.log.bak": "renamed",
        "xc1__g0_base__s1.attempt8.log": "not a run of this sweep",
    }
    for name, text in earlier.items():
        (logs / name).write_text(text)
    r = run_benchmark(
        "--command", f"python {ok} --tag zero", f"python {ok} --tag one", "--num-seeds", "1", "--output", str(out)
    )
    assert r.returncode == 0, r.stderr
    attempts = {rec["run_key"]: rec["attempt"] for rec in manifest(out)}
    assert attempts == {"c0__g0_base__s1": 3, "c1__g0_base__s1": 4}
    for name, text in earlier.items():
        assert (logs / name).read_text() == text, f"{name} was overwritten"
    assert "new attempt of one" in (logs / "c1__g0_base__s1.attempt4.log").read_text()
    assert "new attempt of zero" in (logs / "c0__g0_base__s1.attempt3.log").read_text()


def test_resume_continues_the_numbering_and_gives_each_invocation_its_own_retries(tmp_path):
    """--retries N is N more attempts per invocation: a run that failed attempts 1 and 2 in a first invocation and
    is resumed with --retries 1 gets attempt 3 and, when that fails, attempt 4 (which succeeds here). A budget
    read from the attempt number would give the resumed run no retry at all."""
    script = write_script(
        tmp_path / "fails_thrice.py",
        "c = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'count')\n"
        "n = int(open(c).read()) + 1 if os.path.exists(c) else 1\n"
        "open(c, 'w').write(str(n))\n"
        "sys.exit(1 if n <= 3 else 0)\n",
    )
    out = tmp_path / "sweep"
    args = ["--command", f"python {script}", "--num-seeds", "1", "--retries", "1", "--output", str(out)]
    r = run_benchmark(*args)
    assert r.returncode == 1 and "(exit code 1, attempt 2)" in r.stderr, r.stderr
    r = run_benchmark(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert [(rec["attempt"], rec["exit_code"]) for rec in manifest(out)] == [(1, 1), (2, 1), (3, 1), (4, 0)]
    key = manifest(out)[0]["run_key"]
    assert sorted(os.listdir(out / "logs")) == [f"{key}.attempt{k}.log" for k in (1, 2, 3, 4)]
    assert (tmp_path / "count").read_text() == "4"


# LEARNING-CURVE PLOTS
SMOOTH = 3
SERIES = {  # (command index, grid index) -> method label, grid
    (0, 0): ("m0", "--lr 1"),
    (0, 1): ("m0", "--lr 2"),
    (1, 0): ("m1", "--lr 1"),
}
STEPS = {1: np.arange(10, 210, dtype=float), 2: np.arange(0, 251, dtype=float)}  # seed -> steps of its episodes


def episode_values(tag, ci, gi, seed):
    """Integer returns (exact in float32) that differ per tag, method, grid point and seed, and jump around, so
    any other smoothing window gives another curve."""
    i = np.arange(len(STEPS[seed]))
    if tag == "charts/episodic_return":
        return 100 * ci + 30 * gi + 7 * seed + np.array([0, 12, 3, 9])[i % 4] + i // 4
    if tag == "charts/episodic_return_mode0":
        return 1000 + 100 * ci + 30 * gi + 7 * seed + np.array([5, 0, 9])[i % 3]
    return 2000 + np.array([4, 0])[i % 2] + i  # mode 1: logged by one run only


def running_mean(values, window):
    """Mean of the episode and the window - 1 before it (fewer at the start), by its definition."""
    return np.array([np.mean(values[max(0, k - window + 1) : k + 1]) for k in range(len(values))])


@pytest.fixture(scope="module")
def curve_sweep(tmp_path_factory):
    """Two methods, m0 at two grid points and m1 at one, two seeds each; seed 1 logs episodes at steps 10..209,
    seed 2 at 0..250, so the common grid is 10..209 (200 points: exactly the integers). Mode 1 is logged only by
    m0 --lr 1 seed 1."""
    from torch.utils.tensorboard import SummaryWriter

    sweep = tmp_path_factory.mktemp("curves") / "sweep"
    records = []
    for (ci, gi), (_, grid) in SERIES.items():
        for seed in (1, 2):
            key = f"c{ci}__g{gi}_lr_{gi + 1}__s{seed}"
            run_dir = sweep / "runs" / key / "run"
            w = SummaryWriter(str(run_dir))
            tags = ["charts/episodic_return", "charts/episodic_return_mode0"]
            if (ci, gi, seed) == (0, 0, 1):
                tags.append("charts/episodic_return_mode1")
            for tag in tags:
                for step, value in zip(STEPS[seed], episode_values(tag, ci, gi, seed)):
                    w.add_scalar(tag, float(value), int(step))
            w.close()
            records.append(
                {
                    "run_key": key,
                    "command_index": ci,
                    "num_commands": 2,
                    "command": f"python m{ci}.py",
                    "grid_index": gi,
                    "grid": grid,
                    "seed": seed,
                    "exit_code": 0,
                    "attempt": 1,
                    "wall_time_s": 1.0,
                    "runs_dir": str(run_dir.parent),
                    "run_dirs": [str(run_dir)],
                }
            )
    (sweep / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return sweep


def expected_series(tag):
    """label -> (x, mean, std) of every line the plot of `tag` should hold, computed from the logged episodes."""
    grid = np.arange(10, 210, dtype=float)
    out = {}
    for (ci, gi), (method, grid_flags) in SERIES.items():
        curves = []
        for seed in (1, 2):
            if tag == "charts/episodic_return_mode1" and (ci, gi, seed) != (0, 0, 1):
                continue
            smoothed = running_mean(episode_values(tag, ci, gi, seed), SMOOTH)
            index = {step: k for k, step in enumerate(STEPS[seed])}
            curves.append([smoothed[index[x]] for x in grid])
        if curves:
            curves = np.array(curves)
            out[f"{method} {grid_flags} (n={len(curves)})"] = (
                grid,
                curves.mean(0),
                np.sqrt(((curves - curves.mean(0)) ** 2).mean(0)),
            )
    return out


def test_learning_curves_plot_each_method_and_grid_point_smoothed_against_the_global_step(curve_sweep, tmp_path, monkeypatch):
    """The data in every learning-curve figure: one line per method x grid point (named with the runs that logged the
    tag), x = the common step grid from the latest first step to the earliest last step, y = the mean over seeds of
    each seed's running mean of --smooth episodes, every point to the last, a band of mean +- 1 population std, the
    mode-k figure drawn from the mode-k tag, and axis labels that say what is drawn."""
    import matplotlib.axes
    import matplotlib.figure

    report = load(REPORT)
    saved, bands = {}, {}
    real_savefig, real_fill_between = matplotlib.figure.Figure.savefig, matplotlib.axes.Axes.fill_between

    def savefig(self, path, *args, **kwargs):
        saved[os.path.basename(path)] = self
        return real_savefig(self, path, *args, **kwargs)

    def fill_between(self, x, y1, y2=0, **kwargs):
        bands.setdefault(id(self), []).append((np.asarray(x), np.asarray(y1), np.asarray(y2)))
        return real_fill_between(self, x, y1, y2, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", fill_between)
    result = report.build_report(
        [str(curve_sweep)], str(tmp_path / "report"), {0: "m0", 1: "m1"}, last_n=5, smooth=SMOOTH, title="T"
    )
    files = {
        "learning_curve.png": "charts/episodic_return",
        "learning_curve_mode0.png": "charts/episodic_return_mode0",
        "learning_curve_mode1.png": "charts/episodic_return_mode1",
    }
    assert result["plots"] == list(files) and sorted(saved) == sorted(files)
    for name, tag in files.items():
        (ax,) = saved[name].axes
        assert ax.get_title() == f"T: {tag}"
        assert ax.get_xlabel() == "global step"
        assert ax.get_ylabel() == f"episodic return (running mean of {SMOOTH} ep.)"
        expected = expected_series(tag)
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert sorted(lines) == sorted(expected), name
        assert [label for label in ax.get_legend_handles_labels()[1]] == list(lines)
        drawn_bands = bands[id(ax)]
        assert len(drawn_bands) == len(expected)
        for (label, (x, mean, std)), (bx, low, high) in zip(
            [(line.get_label(), expected[line.get_label()]) for line in ax.get_lines()], drawn_bands
        ):
            line = lines[label]
            np.testing.assert_allclose(line.get_xdata(), x, err_msg=f"{name} {label}: x")
            np.testing.assert_allclose(line.get_ydata(), mean, rtol=1e-9, err_msg=f"{name} {label}: y")
            np.testing.assert_allclose(bx, x, err_msg=f"{name} {label}: band x")
            np.testing.assert_allclose(low, mean - std, rtol=1e-9, atol=1e-9, err_msg=f"{name} {label}: band low")
            np.testing.assert_allclose(high, mean + std, rtol=1e-9, atol=1e-9, err_msg=f"{name} {label}: band high")
    # the seeds of a series do differ, so the band is not trivially the line
    assert np.all(expected_series("charts/episodic_return")["m0 --lr 1 (n=2)"][2] > 0)
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"Mean ± std over seeds of the running mean of {SMOOTH} episodes." in text
    assert all(f"![{name}]({name})" in text for name in files)
