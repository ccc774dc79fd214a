"""Tests for benchmark/popgym_check_report.py: each run's MMER is its last charts/mmer, and the registered criteria."""

import json
import os

import pytest
from benchmark_helpers import load_benchmark_script
from torch.utils.tensorboard import SummaryWriter

report = load_benchmark_script("popgym_check_report")

PAPER = """# a comment line
env_id,paper_gru_mmer,paper_best_mmer,paper_best_model,source
popgym-RepeatPreviousEasy-v0,1.0,1.0,GRU,Table X
popgym-PositionOnlyCartPoleMedium-v0,0.80,0.95,LMU,Table X
popgym-MultiarmedBanditEasy-v0,,,,
"""


def fake_run(sweep, key, env_id, exp_name, seed, mmers, wall_time_s=10.0, evaluation=None):
    """A finished run as benchmark.py leaves it: its run dir with charts/mmer at 65,536-step samples, and its marker;
    `evaluation` = (deterministic mean, sampled mean) writes an eval.json."""
    run_dir = os.path.join(sweep, "runs", key, f"{env_id}__{exp_name}__{seed}__1700000000")
    writer = SummaryWriter(run_dir)
    for i, value in enumerate(mmers):
        writer.add_scalar("charts/mmer", value, 65536 * (i + 1))
    writer.close()
    if evaluation is not None:
        with open(os.path.join(run_dir, "eval.json"), "w") as f:
            json.dump({"deterministic": {"mean": evaluation[0]}, "sampled": {"mean": evaluation[1]}}, f)
    os.makedirs(os.path.join(sweep, "markers"), exist_ok=True)
    with open(os.path.join(sweep, "markers", f"{key}.json"), "w") as f:
        json.dump({"run_dirs": [run_dir], "seed": seed, "wall_time_s": wall_time_s}, f)


def test_report_reads_the_last_mmer_and_applies_the_criteria(tmp_path):
    gru = str(tmp_path / "gru")
    # paper 1.0: two of three seeds reach 0.95 -> pass (the max is what the run logged last, not a later dip)
    for seed, final in zip((1, 2, 3), (0.96, 0.99, 0.5)):
        evaluation = (final, final - 0.1 * seed)
        fake_run(gru, f"rp{seed}", "popgym-RepeatPreviousEasy-v0", "ppo_gru_baseline", seed, [0.1, final], 10.0, evaluation)
    # paper 0.80: mean 0.74 < 0.75 -> fail
    for seed, final in zip((1, 2, 3), (0.70, 0.76, 0.76)):
        fake_run(gru, f"pc{seed}", "popgym-PositionOnlyCartPoleMedium-v0", "ppo_gru_baseline", seed, [0.2, final])
    fake_run(gru, "mab1", "popgym-MultiarmedBanditEasy-v0", "ppo_gru_baseline", 1, [0.3])
    none = str(tmp_path / "none")
    fake_run(none, "pc1", "popgym-PositionOnlyCartPoleMedium-v0", "ppo_gru_baseline_memory_none", 1, [0.1])
    paper = tmp_path / "paper.csv"
    paper.write_text(PAPER)
    out = tmp_path / "report"
    assert report.main(["--sweeps", gru, none, "--paper", str(paper), "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["popgym-RepeatPreviousEasy-v0"]["GRU"] == pytest.approx([0.96, 0.99, 0.5])
    assert summary["popgym-RepeatPreviousEasy-v0"]["verdict"] == "pass (2/3)"
    assert summary["popgym-PositionOnlyCartPoleMedium-v0"]["verdict"].startswith("fail (mean 0.740")
    assert summary["popgym-PositionOnlyCartPoleMedium-v0"]["memoryless"] == pytest.approx([0.1])
    assert summary["popgym-MultiarmedBanditEasy-v0"]["verdict"] == "no verdict"
    text = (out / "report.md").read_text()
    assert "0.740 [" in text and "0.100 (1 seed); GRU at its steps 0.200" in text  # the GRU's first sample, mean 0.2
    assert "| 0.817 / 0.617 |" in text  # the evaluation's means over seeds: (0.96 + 0.99 + 0.5) / 3, minus 0.2
    assert "(3 seeds) | – |" in text  # PositionOnlyCartPole's runs have no eval.json
    assert (out / "mmer_curves.png").stat().st_size > 0
    assert len((out / "runs.csv").read_text().splitlines()) == 1 + 8


@pytest.mark.parametrize(
    "mmers, paper_gru, expected",
    [
        ([0.95, 0.95, 0.0], 1.0, "pass (2/3)"),
        ([0.949, 0.99, 0.0], 1.0, "fail (1/3)"),
        ([0.75, 0.75, 0.75], 0.80, "pass"),
        ([0.74, 0.75, 0.75], 0.80, "fail"),
    ],
)
def test_criteria_thresholds(mmers, paper_gru, expected):
    assert report.verdict(mmers, paper_gru)[1].startswith(expected)


@pytest.mark.parametrize(
    "memoryless, gru, expected",
    [(0.3, 0.401, "yes"), (0.3, 0.4, "no"), (0.3, 0.399, "no"), (-0.5, 1.0, "yes"), (0.6, 0.6, "no")],
)
def test_needs_memory_is_a_gap_of_more_than_0_1_at_the_same_step(memoryless, gru, expected):
    assert report.needs_memory(memoryless, gru).startswith(expected)


def runs_of(mmers, wall_time_s):
    return [{"mmer": m, "wall_time_s": wall_time_s} for m in mmers]


@pytest.mark.parametrize(
    "astral, astral_wall, expected",
    [
        ([0.5, 0.5], 12.5, "none"),  # MMER -0.05 and 1.25x are both at the limit: no cost
        ([0.49, 0.5], 10.0, "MMER -0.055"),
        ([0.6, 0.6], 12.6, "wall time 1.26×"),
        ([0.4, 0.4], 20.0, "MMER -0.150, wall time 2.00×"),
    ],
)
def test_bank_cost_names_each_registered_cost(astral, astral_wall, expected):
    gru = runs_of([0.55, 0.55], 10.0)
    assert report.bank_cost(runs_of(astral, astral_wall), gru).startswith(expected)


def test_report_answers_the_side_questions_from_the_runs(tmp_path):
    gru = str(tmp_path / "gru")
    # the GRU's MMER is 0.2 at 65,536 steps and 0.9 at the end: the memoryless run (one sample) compares with 0.2
    for seed in (1, 2):
        fake_run(gru, f"pc{seed}", "popgym-PositionOnlyCartPoleMedium-v0", "ppo_gru_baseline", seed, [0.2, 0.9], 10.0)
    none = str(tmp_path / "none")
    fake_run(none, "pc1", "popgym-PositionOnlyCartPoleMedium-v0", "ppo_gru_baseline_memory_none", 1, [0.15])
    astral = str(tmp_path / "astral")
    for seed in (1, 2):
        fake_run(astral, f"pc{seed}", "popgym-PositionOnlyCartPoleMedium-v0", "ppo_gru_astral", seed, [0.3, 0.8], 20.0)
    paper = tmp_path / "paper.csv"
    paper.write_text(PAPER)
    out = tmp_path / "report"
    assert report.main(["--sweeps", gru, none, astral, "--paper", str(paper), "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())["popgym-PositionOnlyCartPoleMedium-v0"]
    assert summary["needs_memory"].startswith("no (GRU +0.050)")  # against 0.9 it would read yes
    assert summary["astral_cost"] == "MMER -0.100, wall time 2.00×"
    assert "| no (GRU +0.050) | MMER -0.100, wall time 2.00× |" in (out / "report.md").read_text()
