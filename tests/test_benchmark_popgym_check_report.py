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


def fake_run(sweep, key, env_id, exp_name, seed, mmers, wall_time_s=10.0):
    """A finished run as benchmark.py leaves it: its run dir with charts/mmer at 65,536-step samples, and its marker."""
    run_dir = os.path.join(sweep, "runs", key, f"{env_id}__{exp_name}__{seed}__1700000000")
    writer = SummaryWriter(run_dir)
    for i, value in enumerate(mmers):
        writer.add_scalar("charts/mmer", value, 65536 * (i + 1))
    writer.close()
    os.makedirs(os.path.join(sweep, "markers"), exist_ok=True)
    with open(os.path.join(sweep, "markers", f"{key}.json"), "w") as f:
        json.dump({"run_dirs": [run_dir], "seed": seed, "wall_time_s": wall_time_s}, f)


def test_report_reads_the_last_mmer_and_applies_the_criteria(tmp_path):
    gru = str(tmp_path / "gru")
    # paper 1.0: two of three seeds reach 0.95 -> pass (the max is what the run logged last, not a later dip)
    for seed, final in zip((1, 2, 3), (0.96, 0.99, 0.5)):
        fake_run(gru, f"rp{seed}", "popgym-RepeatPreviousEasy-v0", "ppo_gru_baseline", seed, [0.1, final])
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
