"""Tests for benchmark/recurrentppo_side_by_side_report.py: mode 0's evaluation per agent and budget, the first time the
mean of 100 training returns reaches 475, and the registered pairwise verdicts."""

import json
import os

import numpy as np
from benchmark_helpers import load_benchmark_script
from torch.utils.tensorboard import SummaryWriter

report = load_benchmark_script("recurrentppo_side_by_side_report")
TASK = "--modes-preset seed3 --fixed-mode 0 --hide-velocity --save-model"
COMMANDS = {
    "RecurrentPPO (zoo)": f"python benchmark/sb3_peers.py --algo recurrent_ppo {TASK}",
    "baseline, defaults": f"python cleanrl_astral/ppo_gru_baseline.py {TASK}",
    "baseline, 32 envs": f"python cleanrl_astral/ppo_gru_baseline.py {TASK} --num-envs 32",
}


def fake_run(sweep, agent, budget, seed, mode0, returns):
    """A finished run: eval.json with mode 0's deterministic return, one training episode per 100 steps and second."""
    key = f"{''.join(c for c in agent if c.isalnum())}_{budget}_{seed}"
    run_dir = os.path.join(sweep, "runs", key, "NonStationaryCartPole__x__1__1")
    writer = SummaryWriter(run_dir)
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, 100 * (i + 1), walltime=1000.0 + i)
    writer.close()
    with open(os.path.join(run_dir, "eval.json"), "w") as f:
        json.dump({"per_mode": {"0": {"deterministic": {"mean": mode0}, "sampled": {"mean": mode0 - 1}}}}, f)
    os.makedirs(os.path.join(sweep, "markers"), exist_ok=True)
    command = COMMANDS[agent]
    record = {
        "run_dirs": [run_dir],
        "seed": seed,
        "wall_time_s": 10.0,
        "command": command,
        "full_command": f"{command} --total-timesteps {budget} --seed {seed}",
    }
    with open(os.path.join(sweep, "markers", f"{key}.json"), "w") as f:
        json.dump(record, f)


def test_first_solved_is_where_the_mean_of_the_last_100_first_reaches_475():
    returns = np.array([100.0] * 100 + [500.0] * 200)
    steps = np.arange(1, 301) * 10.0
    # the mean of the 100 up to episode k (1-based) is (100 * (200 - k) + 500 * (k - 100)) / 100: 475 from k = 194
    assert report.first_solved(steps, steps / 10, returns) == (1940.0, 194.0)
    assert report.first_solved(steps, steps, np.full(300, 474.0)) == (None, None)


def test_pair_verdict_needs_the_margin_and_as_many_solved_seeds():
    def runs(values):
        return [{"deterministic": v} for v in values]

    assert report.pair_verdict("A", runs([500, 500, 500]), "B", runs([470, 480, 480])) == "tie"  # 23.3 < 25
    assert report.pair_verdict("A", runs([500, 500, 500]), "B", runs([450, 480, 480])) == "A wins"
    assert report.pair_verdict("A", runs([300, 300, 300]), "B", runs([476, 476, 200])) == "B wins"
    # a higher mean with fewer solved seeds is no win
    assert report.pair_verdict("A", runs([474, 474, 474]), "B", runs([500, 400, 400])) == "tie"


def test_report_tables_every_agent_and_budget(tmp_path):
    sweep = str(tmp_path / "sweep")
    for seed in (1, 2, 3):
        fake_run(sweep, "RecurrentPPO (zoo)", 100000, seed, 500.0, [100.0] * 50 + [500.0] * 200)
        fake_run(sweep, "baseline, defaults", 100000, seed, 200.0, [100.0] * 250)
        fake_run(sweep, "baseline, 32 envs", 100000, seed, 480.0, [480.0] * 250)
    out = tmp_path / "out"
    assert report.main(["--sweep", sweep, "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["RecurrentPPO (zoo) @ 100000"]["deterministic"] == [500.0] * 3
    verdicts = summary["verdicts"]["100000"]
    assert verdicts["RecurrentPPO (zoo) vs baseline, defaults"] == "RecurrentPPO (zoo) wins"
    assert verdicts["RecurrentPPO (zoo) vs baseline, 32 envs"] == "tie"
    assert verdicts["baseline, 32 envs vs baseline, defaults"] == "baseline, 32 envs wins"
    text = (out / "report.md").read_text()
    # RecurrentPPO: mean-100 reaches 475 at episode 144 (100 * 144 steps, 143 s after the first episode)
    assert "14,400 steps (3/3 reached)" in text and "143 s (3/3 reached)" in text and "not reached (0/3)" in text
    assert (out / "curves.png").stat().st_size > 0
