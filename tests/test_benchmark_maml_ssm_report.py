"""Tests of benchmark/maml_ssm_report.py on hand-made maml_ssm runs (checkpoint dicts and eval.json files)."""

import dataclasses
import json
import subprocess

import numpy as np
import pytest
import torch
from benchmark_helpers import load_benchmark_script
from helpers import REPO, SCRIPT_ENV
from torch.utils.tensorboard import SummaryWriter

import cleanrl_astral.maml_ssm as maml_ssm

maml_ssm_report = load_benchmark_script("maml_ssm_report")


def _fake_maml_run(root, sweep, seed, args, returns, cis=(1.0, 1.0, 1.0, 1.0), steps_done=None, version=None):
    """A finished maml_ssm run as the report finds it: checkpoint dict (no weights needed) and eval.json."""
    d = root / sweep / "runs" / f"c0__s{seed}" / f"run{seed}"
    d.mkdir(parents=True)
    ckpt = {
        "args": dict(args, seed=seed),
        "param_count": 13193,
        "train_wall_time": 950.0,
        "train_cpu_time": 900.0,
        "task_version": maml_ssm.TASK_VERSIONS[args["task"]] if version is None else version,
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
    without the field counts as Euclidean); each row pools its seeds as mean ± std; a one-seed arm
    shows the CI over test tasks."""
    base = dataclasses.asdict(maml_ssm.Args())
    trpo = dict(base, policy="mlp", cpu_budget=900.0, outer_steps=1000, tasks_per_batch=20, fast_batch_size=20)
    old = {k: v for k, v in trpo.items() if k not in ("goal_box", "fill_steps")}  # a checkpoint written without these fields
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
    assert maml_ssm_report.main(["--out", str(out), "--report", str(rep)]) == 0
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
    run_dir = out / "trpo" / "runs" / "c0__s1" / "run1"
    for purge_step, values in ((None, [-70.0, -60.0, -50.0]), (2, [-55.0, -45.0])):
        w = SummaryWriter(str(run_dir), purge_step=purge_step)
        for i, v in enumerate(values, start=1 if purge_step is None else purge_step):
            w.add_scalar("meta/pre_adapt_return", v, i)
            w.add_scalar("meta/post_adapt_return", v / 10, i)
        w.close()
    drawn = maml_ssm_report.training_curves(maml_ssm_report.load_runs(str(out)), str(rep))
    assert drawn == {
        "mlp TRPO square s1": {"meta/pre_adapt_return": [-70.0, -55.0, -45.0], "meta/post_adapt_return": [-7.0, -5.5, -4.5]}
    }


def test_maml_ssm_report_tables_the_protocol_per_task_and_policy_with_t_intervals(tmp_path):
    """Sweeps named protocol_* give one row per task and policy: the mean over seeds with a 95% Student-t CI, and
    the TRPO iterations each seed got in its CPU budget; other sweeps stay out of that table."""
    paper = dict(dataclasses.asdict(maml_ssm.Args()), cpu_budget=900.0, goal_box=True, fill_steps=True)
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
    assert maml_ssm_report.main(["--out", str(out), "--report", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "protocol_table.md").read_text()
    half = 4.302653 * 1.0 / 3**0.5  # t(0.975, 2 dof) x sd 1 / sqrt(3)
    assert (
        f"| point-nav-2d | mlp | 3 | 95 (90–100) | -40.00 ± 0.00 | -10.00 ± 0.00 | -5.00 ± {half:.2f} | -5.00 ± {half:.2f} |"
        in table
    )
    assert "| cartpole-physics | ssm | 1 | 30 (30–30) | 150.00 ± 0.00 |" in table and "-1.00" not in table
    assert (tmp_path / "rep" / "protocol.png").stat().st_size > 0


def test_maml_ssm_report_refuses_runs_of_an_older_task_version(tmp_path, capsys):
    _fake_maml_run(tmp_path / "out", "ssm", 1, dataclasses.asdict(maml_ssm.Args()), [-1.0] * 4, version=1)
    assert maml_ssm_report.main(["--out", str(tmp_path / "out"), "--report", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "older point-nav-2d (version 1)" in err and "delete its sweep directory" in err
    assert not (tmp_path / "rep").exists()  # nothing written from a mix of task versions
    assert maml_ssm_report.main(["--out", str(tmp_path / "missing"), "--report", str(tmp_path / "rep")]) == 2


def test_hybrid_verdict_reads_the_paired_ci_as_preregistered():
    assert maml_ssm_report.hybrid_verdict(0.1, 2.0) == "hybrid better"
    assert maml_ssm_report.hybrid_verdict(-2.0, -0.1) == "hybrid worse"
    assert maml_ssm_report.hybrid_verdict(-0.1, 2.0) == "no difference detected"
    assert maml_ssm_report.t_ci95_half_width([1.0, 2.0, 3.0]) == pytest.approx(4.302652729911275 / np.sqrt(3))
    assert maml_ssm_report.learned([0.0, 0.0, 1.0, 1.0]) and not maml_ssm_report.learned([1.0, 1.0, 0.0, 0.0])


def test_hybrid_benchmark_dry_run_lists_the_preregistered_grid(tmp_path):
    """--dry-run prints the study's commands: SSM on halfcheetah-vel (buffer 20,000, 540 CPU-s) and cartpole-physics
    (buffer 5,000, 240 CPU-s), seeds 1-3, then adapt with both adapters at experience weights 0.1 and 0.15."""
    env = {**SCRIPT_ENV, "HYBRID_OUT": str(tmp_path / "out"), "HYBRID_REPORT": str(tmp_path / "report")}
    run = subprocess.run(
        ["bash", "benchmark/maml_ssm.sh", "--hybrid-benchmark", "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    train = [line for line in run.stdout.splitlines() if "maml_ssm.py train" in line]
    assert len(train) == 6
    for line in train:
        assert "--policy ssm" in line and "--save-model" in line
    hc = [line for line in train if "--task halfcheetah-vel" in line]
    cp = [line for line in train if "--task cartpole-physics" in line]
    assert sorted(line.split("--seed ")[1].split()[0] for line in hc) == ["1", "2", "3"]
    assert all("--buffer-size 20000" in line and "--cpu-budget 540" in line for line in hc)
    assert sorted(line.split("--seed ")[1].split()[0] for line in cp) == ["1", "2", "3"]
    assert all("--buffer-size 5000" in line and "--cpu-budget 240" in line for line in cp)
    adapt = [line for line in run.stdout.splitlines() if "maml_ssm.py adapt" in line]
    assert len(adapt) == 2 and all("--adaptation-mode standard hybrid" in line for line in adapt)
    assert "--experience-weight 0.1" in adapt[0] and "--experience-weight 0.15" in adapt[1]
    assert not (tmp_path / "report").exists()


def test_hybrid_benchmark_tiny_runs_the_whole_study_and_its_report(tmp_path):
    """--tiny runs the study's pipeline at a few outer steps: six trained checkpoints, adapt.json with both adapters
    beside each, and the report's table, JSON and learning-curve PNG."""
    env = {**SCRIPT_ENV, "HYBRID_OUT": str(tmp_path / "out"), "HYBRID_REPORT": str(tmp_path / "report")}
    run = subprocess.run(
        ["bash", "benchmark/maml_ssm.sh", "--hybrid-benchmark", "--tiny"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((tmp_path / "report" / "hybrid.json").read_text())
    assert set(summary) == {"halfcheetah-vel", "cartpole-physics"}
    for task, weight, buffer in (("halfcheetah-vel", 0.1, 20000), ("cartpole-physics", 0.15, 5000)):
        runs = summary[task]["runs"]
        assert [r["seed"] for r in runs] == [1, 2, 3]
        assert all(r["experience_weight"] == weight and r["buffer_size"] == buffer for r in runs)
        assert all(len(r["standard"]) == 6 and len(r["hybrid"]) == 6 for r in runs)
        diff = np.mean([r["hybrid"][5] - r["standard"][5] for r in runs])
        assert summary[task]["difference_after_5"] == pytest.approx(diff)
    table = (tmp_path / "report" / "hybrid_table.md").read_text()
    assert "| no adaptation (θ₀) |" in table and "| hybrid |" in table and "Hybrid − standard after 5 steps" in table
    assert (tmp_path / "report" / "hybrid_curves.png").stat().st_size > 10_000


def test_every_study_table_is_written_beside_its_json(tmp_path):
    """The speed, ProMP and hybrid reports write <stem>_table.md (the lines, one per row) and <stem>.json (the summary)."""
    text = maml_ssm_report.write_table_and_json(str(tmp_path), "speed", ["| a |", "| b |"], {"ratios": [1.5]})
    assert text == "| a |\n| b |\n"
    assert (tmp_path / "speed_table.md").read_text() == text
    assert json.loads((tmp_path / "speed.json").read_text()) == {"ratios": [1.5]}


def test_speed_ratio_pairs_mlp_and_ssm_of_each_commit_and_optimizer_at_the_paper_config(tmp_path):
    """benchmark/maml_ssm_speed_ratio.py --dry-run: the first round's commands, per commit and outer optimizer an MLP run
    and an SSM run back to back, from the commit's own copy of the script, --config paper on point-nav-2d, seed 1."""
    speed_ratio = load_benchmark_script("maml_ssm_speed_ratio")
    run = subprocess.run(
        [
            "python",
            "benchmark/maml_ssm_speed_ratio.py",
            "--commit",
            "HEAD",
            "--commit",
            "HEAD~1",
            "--iterations",
            "4",
            "--dry-run",
        ],
        cwd=REPO,
        env=SCRIPT_ENV,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 8
    folders = [line.split()[1].rsplit("/", 1) for line in lines]
    assert [f[1] for f in folders] == ["maml_ssm.py"] * 2 + ["maml_ssm_promp.py"] * 2 + ["maml_ssm.py"] * 2 + [
        "maml_ssm_promp.py"
    ] * 2
    assert len({f[0] for f in folders[:4]}) == 1 and folders[0][0] != folders[4][0]  # one folder per commit
    assert [line.split("--policy ")[1].split()[0] for line in lines] == ["mlp", "ssm"] * 4
    for line in lines:
        for flag in (" train ", "--task point-nav-2d", "--config paper", "--seed 1", "--outer-steps 4", "--num-threads 1"):
            assert flag in line
    # the time of a run: the median logged iteration time without the first (warm-up) iteration
    d = tmp_path / "runs" / "run"
    writer = SummaryWriter(str(d))
    for step, value in enumerate([50.0, 2.0, 4.0, 3.0]):
        writer.add_scalar("meta/iteration_time", value, step)
    writer.close()
    assert speed_ratio.seconds_per_iteration(str(tmp_path / "runs")) == 3.0
    speed_ratio.export_scripts("HEAD", str(tmp_path))
    shown = subprocess.run(["git", "show", "HEAD:cleanrl_astral/maml_ssm_promp.py"], cwd=REPO, capture_output=True, text=True)
    assert (tmp_path / "maml_ssm_promp.py").read_text() == shown.stdout
