"""Tests of the pre-registered maml_ssm studies' tools: benchmark/maml_ssm_online_report.py on hand-made runs, the
refusal of benchmark/maml_ssm_online_adapt.sh, the commands of benchmark/maml_ssm_hybrid_dynamics.sh and benchmark/maml_ssm.sh
--equal-cpu-study, the `--objective` of benchmark/maml_ssm_report.py --hybrid-benchmark and its --equal-cpu-study
verdicts."""

import json
import os
import shutil
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
    """The lines benchmark/<script> (a file name, then any flags) prints with --dry-run."""
    name, *flags = script.split()
    run = subprocess.run(
        ["bash", os.path.join("benchmark", name), *flags, "--dry-run"],
        cwd=REPO,
        env=SCRIPT_ENV,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_the_finished_online_study_is_refused_in_one_line_naming_the_commit_where_it_runs():
    for flags in ([], ["--dry-run"], ["--tiny"], ["--report-only"]):
        run = subprocess.run(
            ["bash", "benchmark/maml_ssm_online_adapt.sh", *flags], cwd=REPO, env=SCRIPT_ENV, capture_output=True, text=True
        )
        assert run.returncode == 2 and run.stdout == "", run.stdout
        assert run.stderr.splitlines() == [
            "maml_ssm_online_adapt.sh: the online-adaptation study runs at commit a2ecf64: git checkout a2ecf64, then run "
            "this script"
        ]


def test_dynamics_arm_runs_the_plans_loss_at_the_plans_settings():
    lines = dry_run("maml_ssm_hybrid_dynamics.sh")
    train = [line for line in lines if "maml_ssm.py train" in line]
    assert sum("--task halfcheetah-vel" in t and "--buffer-size 20000" in t and "--cpu-budget 540" in t for t in train) == 3
    assert sum("--task cartpole-physics" in t and "--buffer-size 10000" in t and "--cpu-budget 240" in t for t in train) == 3
    (adapt,) = [line for line in lines if line.startswith("then on each checkpoint")]
    for flag in ("--adapt-objective dynamics pg", "--experience-batch-size 32", "--experience-weight 0.1", "--adapt-steps 5"):
        assert flag in adapt


def test_equal_cpu_study_runs_the_registered_twelve_runs_in_order():
    """benchmark/maml_ssm.sh --equal-cpu-study: what docs/results/maml_ssm/equal_cpu_study/PROTOCOL.md registers, TRPO's
    six runs (maml_ssm.py) before ProMP's six (maml_ssm_promp.py), MLP and SSM, seeds 1-3, --config paper on point-nav-2d,
    900 CPU-seconds each, evaluated on 40 test tasks after 0-3 steps; no other setting."""
    train = [line for line in dry_run("maml_ssm.sh --equal-cpu-study") if " train " in line]
    assert len(train) == 12
    scripts = ["maml_ssm_promp.py" if "maml_ssm_promp.py" in line else "maml_ssm.py" for line in train]
    assert scripts == ["maml_ssm.py"] * 6 + ["maml_ssm_promp.py"] * 6
    for half in (train[:6], train[6:]):
        arms = sorted((line.split("--policy ")[1].split()[0], line.split("--seed ")[1].split()[0]) for line in half)
        assert arms == [(p, s) for p in ("mlp", "ssm") for s in ("1", "2", "3")]
    for line in train:
        for flag in (
            "--task point-nav-2d",
            "--config paper",
            "--cpu-budget 900",
            "--save-model",
            "--eval-tasks 40",
            "--eval-steps 3",
        ):
            assert flag in line, (flag, line)
        assert "--tasks-per-batch" not in line and "--fast-batch-size" not in line and "--outer-optimizer" not in line
    protocol = open(os.path.join(REPO, "docs", "results", "maml_ssm", "equal_cpu_study", "PROTOCOL.md")).read()
    assert "bash benchmark/maml_ssm.sh --equal-cpu-study" in protocol and "--cpu-budget 900" in protocol


def fake_study_run(out, sweep, script, policy, seed, returns):
    """A finished --equal-cpu-study run as benchmark/maml_ssm_report.py finds it: checkpoint dict and eval.json."""
    d = out / sweep / "runs" / f"c0__{policy}__s{seed}" / f"run{seed}"
    d.mkdir(parents=True)
    args = {"task": "point-nav-2d", "policy": policy, "seed": seed, "outer_steps": 100000, "outer_optimizer": "trpo"}
    ckpt = {"args": args, "outer_steps_done": 10 * seed, "task_version": 2}
    if script == "maml_ssm_promp":
        ckpt["script"] = "maml_ssm_promp"
        args.pop("outer_optimizer")
    torch.save(ckpt, d / f"{script}.cleanrl_model")
    (d / "eval.json").write_text(json.dumps({"returns_after_steps": {str(k): r for k, r in enumerate(returns)}}))


@pytest.mark.parametrize("ssm_after_two, verdicts", [(0.5, ("pass", "fail")), (-0.5, ("fail", "fail"))])
def test_equal_cpu_study_report_judges_the_criterion_under_each_optimizer(ssm_after_two, verdicts, tmp_path):
    """Under TRPO the SSM is 1.0 above the MLP after 1 and 3 steps and ssm_after_two after 2; under ProMP it is 1.0 below
    after 1 step: the criterion passes only where all of 1, 2 and 3 steps hold."""
    out = tmp_path / "out"
    for seed in (1, 2, 3):
        mlp = [-20.0 - seed, -8.0 - seed, -6.0 - seed, -5.0 - seed]
        fake_study_run(out, "equal_cpu_trpo", "maml_ssm", "mlp", seed, mlp)
        ssm = [mlp[0], mlp[1] + 1.0, mlp[2] + ssm_after_two, mlp[3] + 1.0]
        fake_study_run(out, "equal_cpu_trpo", "maml_ssm", "ssm", seed, ssm)
        fake_study_run(out, "equal_cpu_promp", "maml_ssm_promp", "mlp", seed, mlp)
        fake_study_run(out, "equal_cpu_promp", "maml_ssm_promp", "ssm", seed, [mlp[0], mlp[1] - 1.0, mlp[2], mlp[3]])
    report = tmp_path / "report"
    assert maml_ssm_report.main(["--equal-cpu-study", "--out", str(out), "--report", str(report)]) == 0
    summary = json.loads((report / "equal_cpu_study.json").read_text())
    assert (summary["trpo"]["criterion"]["pass"], summary["promp"]["criterion"]["pass"]) == (verdicts[0] == "pass", False)
    assert summary["trpo"]["criterion"]["ssm_minus_mlp"] == pytest.approx([1.0, ssm_after_two, 1.0])
    assert summary["promp"]["ssm"]["iterations"] == [10, 20, 30]
    assert summary["trpo"]["mlp"]["mean"] == pytest.approx([-22.0, -10.0, -8.0, -7.0])
    table = (report / "equal_cpu_study_table.md").read_text()
    assert (
        f"- TRPO: the SSM's return after 1–3 steps at least the MLP's at equal CPU: SSM − MLP = 1.00 / {ssm_after_two:.2f}"
        in table
    )
    assert table.count(f"**{verdicts[0]}**") >= 1 and "- PROMP:" in table and table.rstrip().endswith("**fail**.")
    assert sorted(p.name for p in report.glob("eval_*.json")) == sorted(
        f"eval_{o}_{p}_s{s}.json" for o in ("trpo", "promp") for p in ("mlp", "ssm") for s in (1, 2, 3)
    )
    assert (report / "equal_cpu_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # an optimizer with one policy missing gives no verdict: a one-line error
    for d in (out / "equal_cpu_promp" / "runs").glob("c0__ssm__s*"):
        shutil.rmtree(d)
    assert maml_ssm_report.main(["--equal-cpu-study", "--out", str(out), "--report", str(report)]) == 2
