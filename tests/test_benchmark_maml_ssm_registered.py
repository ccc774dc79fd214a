"""Tests of the pre-registered maml_ssm studies' tools: benchmark/maml_ssm_online_report.py on hand-made runs, the
commands of benchmark/maml_ssm_online_adapt.sh and benchmark/maml_ssm_hybrid_dynamics.sh, and the `--objective` of
benchmark/maml_ssm_report.py --hybrid-benchmark."""

import json
import os
import subprocess

import pytest
import torch
from benchmark_helpers import load_benchmark_script
from helpers import REPO, SCRIPT_ENV
from torch.utils.tensorboard import SummaryWriter

online_report = load_benchmark_script("maml_ssm_online_report")
maml_ssm_report = load_benchmark_script("maml_ssm_report")


def adapt_report(curves, no_adaptation=0.0, steps=3):
    """An adapt.json holding `curves` ({"standard/pg": [returns after 0..K]}) and the no-adaptation return."""
    return {
        "adapt_steps": steps,
        "experience_weight": 0.1,
        "no_adaptation": {"return": no_adaptation, "ci95": 0.0},
        "results": {key: {"returns_after_steps": {str(k): v for k, v in enumerate(r)}} for key, r in curves.items()},
    }


def fake_checkpoint(out, sweep, seed, reports, args=None, returns=(1.0, 2.0, 3.0, 4.0)):
    d = out / sweep / "runs" / f"c0__g0_base__s{seed}" / f"run{seed}"
    d.mkdir(parents=True)
    torch.save({"args": {"seed": seed, **(args or {})}, "outer_steps_done": 4}, d / "maml_ssm.cleanrl_model")
    for name, report in reports.items():
        (d / name).write_text(json.dumps(report))
    writer = SummaryWriter(str(d))
    for step, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, step)
    writer.close()


def test_online_report_pairs_each_online_arm_with_between_batches_after_k_steps(tmp_path):
    out = tmp_path / "out"
    for seed, gain in ((1, 2.0), (2, 3.0), (3, 4.0)):
        between = [10.0, 11.0, 12.0, 13.0 + seed]
        reports = {
            "adapt.json": adapt_report({"standard/pg": between}, no_adaptation=10.0),
            "adapt_online.json": adapt_report({"standard/pg": between[:3] + [between[3] + gain]}),
            "adapt_online_during_only.json": adapt_report({"standard/pg": [10.0, 9.0, 8.0, between[3] - 1.0 + seed]}),
        }
        fake_checkpoint(out, "online_point_nav", seed, reports)
    # a checkpoint without all three reports is left out
    fake_checkpoint(out, "online_point_nav", 4, {"adapt.json": adapt_report({"standard/pg": [0.0] * 4})})
    report = tmp_path / "report"
    assert online_report.main(["--out", str(out), "--report", str(report)]) == 0
    summary = json.loads((report / "online.json").read_text())
    assert list(summary) == ["point-nav-2d"]
    task = summary["point-nav-2d"]
    assert [r["seed"] for r in task["runs"]] == [1, 2, 3]
    online = task["online_minus_between"]
    assert online["mean"] == pytest.approx(3.0) and online["ci95"] == pytest.approx(online_report.t_ci95_half_width([2, 3, 4]))
    assert online["verdict"] == "higher"  # 3 ± 2.48
    during = task["during_only_minus_between"]
    assert during["mean"] == pytest.approx(1.0) and during["verdict"] == "no difference detected"  # 1 ± 2.48
    table = (report / "online_table.md").read_text()
    assert "| online (plan) | 10.00 ± 0.00 | 11.00 ± 0.00 | 12.00 ± 0.00 | 18.00 ±" in table
    assert online_report.verdict(-3.0, 1.0) == "lower"
    assert online_report.main(["--out", str(tmp_path / "none"), "--report", str(report)]) == 2


def test_hybrid_report_tables_the_objective_it_is_given(tmp_path):
    out = tmp_path / "out"
    for sweep, buffer in (("hybrid_halfcheetah", 20000), ("hybrid_cartpole", 10000)):
        for seed in (1, 2, 3):
            curves = {
                "standard/pg": [0.0] * 6,
                "hybrid/pg": [0.0] * 6,
                "standard/dynamics": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0 + seed],
                "hybrid/dynamics": [1.0, 1.0, 1.0, 1.0, 1.0, 3.0 + 2 * seed],
            }
            fake_checkpoint(out, sweep, seed, {"adapt.json": adapt_report(curves, steps=5)}, {"buffer_size": buffer})
    maml_ssm_report.hybrid_benchmark(str(out), str(tmp_path / "dyn"), "dynamics")
    summary = json.loads((tmp_path / "dyn" / "hybrid.json").read_text())
    assert summary["cartpole-physics"]["difference_after_5"] == pytest.approx(4.0)  # mean of 3, 4, 5
    assert summary["cartpole-physics"]["verdict"] == "hybrid better"
    assert "buffer 10,000, experience weight 0.1, objective `dynamics`" in (tmp_path / "dyn" / "hybrid_table.md").read_text()
    maml_ssm_report.hybrid_benchmark(str(out), str(tmp_path / "pg"))
    assert json.loads((tmp_path / "pg" / "hybrid.json").read_text())["cartpole-physics"]["difference_after_5"] == 0.0


def dry_run(script):
    run = subprocess.run(
        ["bash", os.path.join("benchmark", script), "--dry-run"], cwd=REPO, env=SCRIPT_ENV, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_online_study_trains_the_full_flavours_ssm_checkpoints_and_adapts_three_ways():
    lines = dry_run("maml_ssm_online_adapt.sh")
    train = [line for line in lines if "maml_ssm.py train" in line]
    assert len(train) == 6 and all("--policy ssm" in line for line in train)
    assert sum("--task point-nav-2d" in line and "--outer-steps 150" in line for line in train) == 3
    assert sum("--task cartpole-physics" in line and "--outer-steps 50" in line for line in train) == 3
    adapt = [line.split("adapt ", 1)[1] for line in lines if line.startswith("then on each checkpoint")]
    assert len(adapt) == 3 and all("--adapt-steps 3 --adapt-lr 0.1 --adaptation-mode standard" in a for a in adapt)
    assert ["--online " in a for a in adapt] == [False, True, True]  # not --online-every
    assert ["--online-mode during-only" in a for a in adapt] == [False, False, True]


def test_dynamics_arm_runs_the_plans_loss_at_the_plans_settings():
    lines = dry_run("maml_ssm_hybrid_dynamics.sh")
    train = [line for line in lines if "maml_ssm.py train" in line]
    assert sum("--task halfcheetah-vel" in t and "--buffer-size 20000" in t and "--cpu-budget 540" in t for t in train) == 3
    assert sum("--task cartpole-physics" in t and "--buffer-size 10000" in t and "--cpu-budget 240" in t for t in train) == 3
    (adapt,) = [line for line in lines if line.startswith("then on each checkpoint")]
    for flag in ("--adapt-objective dynamics pg", "--experience-batch-size 32", "--experience-weight 0.1", "--adapt-steps 5"):
        assert flag in adapt
