"""Every registered study whose per-run results are committed (docs/results/index.md, column "recomputed"): its report
code, run on those files in a temporary directory, reproduces the committed verdicts and tables. No study is rerun."""

import csv
import glob
import json
import os

import pytest
from benchmark_helpers import load_benchmark_script
from helpers import REPO

RESULTS = os.path.join(REPO, "docs", "results")
ONE_CHANGE = os.path.join(RESULTS, "ppo_gru_astral", "one_change")
STUDY = os.path.join(RESULTS, "ppo_gru_astral", "study")


def read(path):
    with open(path) as f:
        return f.read()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def link(root, rel, target):
    """A symlink root/rel -> target, so a report prints the sweep path the committed output names."""
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def printed(capsys, main, argv):
    assert main(argv) == 0
    return capsys.readouterr().out


def verdict_lines(text):
    return [line for line in text.splitlines() if line.startswith(("PASS", "FAIL", "pass ", "fail "))]


def test_astral_one_change_criteria_md_is_its_report_codes_output(tmp_path, monkeypatch, capsys):
    """criteria.md, every line: the `report` part of benchmark/astral_one_change.sh run on the archived runs."""
    study = load_benchmark_script("astral_study_report")
    compare = load_benchmark_script("astral_one_change_compare")
    entropy = load_benchmark_script("astral_one_change_entropy")
    out = "benchmark/out/astral_one_change"
    for part in ("current_seed3", "single", "pair", "current_phase_c"):
        link(tmp_path, f"{out}/{part}", os.path.join(ONE_CHANGE, f"{part}_runs"))
    link(tmp_path, "docs/results/ppo_gru_astral/study/phase_C_runs", os.path.join(STUDY, "phase_C_runs"))
    for path in glob.glob(os.path.join(ONE_CHANGE, "tta", "*.json")):
        seed = os.path.basename(path).split("_s")[-1].split(".")[0]
        sweep, name = ("tta_clamp", "clamp.json") if path.endswith(".clamp.json") else ("tta_adapt_plan", "tta.json")
        link(tmp_path, f"{out}/{sweep}/runs/c0__g0_base__s{seed}/run/{name}", path)
    monkeypatch.chdir(tmp_path)

    def gate_table(part):
        return "\n".join(entropy.table(read_json(os.path.join(ONE_CHANGE, f"{part}_runs", "gate_entropy.json")))) + "\n"

    text = ""
    for part in ("current_seed3", "single", "pair"):
        text += printed(capsys, study.main, ["--phase", "C", "--sweep", f"{out}/{part}"])
        text += gate_table(part)
    archives = [os.path.join(ONE_CHANGE, f"{part}_runs") for part in ("current_seed3", "single", "pair")]
    text += printed(capsys, compare.main, archives)
    text += gate_table("current_phase_c")
    phase_c = [f"{out}/current_phase_c", "docs/results/ppo_gru_astral/study/phase_C_runs", "--seeds", "6", "7", "8", "9", "10"]
    text += printed(capsys, study.main, ["--phase", "C", "--sweep", *phase_c])
    text += printed(capsys, study.main, ["--phase", "T", "--sweep", f"{out}/tta_adapt_plan", f"{out}/tta_clamp"])
    committed = read(os.path.join(ONE_CHANGE, "criteria.md"))
    assert text == committed
    # part `current`, scored by criteria 1 and 2 as registered
    assert "PASS script_plan_sign criterion 1: seeds per training mode >= 475: [5, 5, 5] of 5" in committed
    assert "FAIL script_plan_sign criterion 2: episode-level NMI >= 0.5 in 0 of 5 seeds" in committed
    assert (
        "FAIL frozen_plan_sign (hidden velocity) criterion 1: seeds per training mode >= 475: [3, 3, 3, 4] of 5" in committed
    )
    assert "FAIL frozen_plan_sign (hidden velocity) criterion 2: episode-level NMI >= 0.5 in 2 of 5 seeds" in committed


@pytest.mark.parametrize("phase", ["A", "B", "C"])
def test_astral_study_phase_verdicts_recompute_from_the_archived_runs(phase, capsys):
    """Phases A-C of the ASTRAL study (criteria 1 and 2, the wall-time bound, the screen and the frozen choice): the
    verdict lines and per-seed rows of phase_{a,b,c}.md. Criteria 3 and 4 read tta.json files that were not committed."""
    study = load_benchmark_script("astral_study_report")
    text = printed(capsys, study.main, ["--phase", phase, "--sweep", os.path.join(STUDY, f"phase_{phase}_runs")])
    committed = read(os.path.join(STUDY, f"phase_{phase.lower()}.md"))
    lines = [line for line in text.splitlines()[1:] if line.strip()]
    assert lines and all(line in committed.splitlines() for line in lines)
    if phase == "C":
        assert "FAIL frozen (hidden velocity) criterion 1: seeds per training mode >= 475: [6, 5, 7, 6] of 10" in text


def test_astral_plan_design_criteria_3_and_4_recompute_from_the_committed_tta_files(tmp_path, monkeypatch, capsys):
    study = load_benchmark_script("astral_study_report")
    committed = os.path.join(RESULTS, "ppo_gru_astral", "plan_design", "part_b")
    sweeps = {"plan": "tta_plan_setting", "stud": "tta_study_setting", "clam": "tta_clamp"}
    for path in glob.glob(os.path.join(committed, "tta", "*.json")):
        name = os.path.basename(path)
        seed = name.split("_s")[-1].split(".")[0]
        target = "clamp.json" if name.endswith(".clamp.json") else "tta.json"
        link(tmp_path, f"benchmark/out/astral_plan_check/{sweeps[name[:4]]}/runs/c0__g0_base__s{seed}/run/{target}", path)
    monkeypatch.chdir(tmp_path)
    argv = ["--phase", "T", "--sweep"] + [f"benchmark/out/astral_plan_check/{s}" for s in sweeps.values()]
    text = printed(capsys, study.main, argv)
    tta_lines = [line for line in verdict_lines(read(os.path.join(committed, "criteria.md"))) if " tta_" in line]
    assert text.splitlines() == tta_lines
    assert "FAIL tta_clamp criterion 4: clamp specificity >= 200 in 0 of 5 seeds" in text


def test_popgym_verdicts_recompute_from_the_summary_and_the_papers_file():
    popgym = load_benchmark_script("popgym_check_report")
    folder = os.path.join(RESULTS, "ppo_gru_baseline", "popgym")
    paper = popgym.read_paper(os.path.join(folder, "paper_mmer.csv"))
    summary = read_json(os.path.join(folder, "summary.json"))
    for env_id, row in summary.items():
        assert popgym.verdict(row["GRU"], paper[env_id]["paper_gru_mmer"])[1] == row["verdict"] == "no verdict"


def test_recurrentppo_verdicts_recompute_from_the_per_run_returns():
    side = load_benchmark_script("recurrentppo_side_by_side_report")
    summary = read_json(os.path.join(RESULTS, "ppo_gru_baseline", "recurrentppo_side_by_side", "summary.json"))
    groups = {}
    for key, values in summary.items():
        if key != "verdicts":
            agent, budget = key.rsplit(" @ ", 1)
            groups[(agent, int(budget))] = [{"deterministic": v} for v in values["deterministic"]]
    recomputed = {str(budget): pairs for budget, pairs in side.verdicts(groups).items()}
    assert recomputed == summary["verdicts"]
    assert recomputed["100000"]["RecurrentPPO (zoo) vs baseline, defaults"] == "RecurrentPPO (zoo) wins"
    assert recomputed["500000"]["RecurrentPPO (zoo) vs baseline, 32 envs"] == "RecurrentPPO (zoo) wins"


def test_maml_promp_study_recomputes_from_each_runs_eval_json(tmp_path):
    report = load_benchmark_script("maml_ssm_report")
    folder = os.path.join(RESULTS, "maml_ssm", "promp_study")
    committed = read_json(os.path.join(folder, "promp_study.json"))
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "eval_*_s*.json"))):
        policy, seed = os.path.basename(path)[len("eval_") : -len(".json")].split("_s")
        seed = int(seed)
        run_dir = tmp_path / f"{policy}_{seed}"
        run_dir.mkdir()
        (run_dir / "eval.json").write_text(read(path))
        # the iteration count is a column of the table only; the checkpoints that held it were not committed
        iterations = dict(zip(committed[policy]["seeds"], committed[policy]["iterations"]))[seed]
        args = {"outer_optimizer": "promp", "task": "point-nav-2d", "policy": policy, "seed": seed, "outer_steps": iterations}
        runs.append((str(run_dir / "maml_ssm.cleanrl_model"), {"args": args, "outer_steps_done": iterations}, read_json(path)))
    out = tmp_path / "report"
    out.mkdir()
    text = report.promp_study(runs, str(out))
    assert text == read(os.path.join(folder, "promp_study_table.md"))
    assert read_json(out / "promp_study.json") == committed
    assert committed["criterion_1"]["pass"] is False and committed["criterion_2"]["pass"] is False


@pytest.mark.parametrize(
    "folder, objective",
    [
        ("hybrid_benchmark", "pg"),
        ("hybrid_benchmark/dynamics_arm/dynamics", "dynamics"),
        ("hybrid_benchmark/dynamics_arm/pg", "pg"),
    ],
)
def test_maml_hybrid_study_recomputes_from_its_per_run_records(folder, objective):
    report = load_benchmark_script("maml_ssm_report")
    path = os.path.join(RESULTS, "maml_ssm", folder)
    committed = read_json(os.path.join(path, "hybrid.json"))
    lines = []
    summary = {}
    for task, entry in committed.items():
        summary[task], section = report.hybrid_section(task, entry["runs"], objective)
        lines += section
    lines.append("± is the 95% Student-t CI over seeds of the per-seed mean over the test tasks.")
    assert "\n".join(lines) + "\n" == read(os.path.join(path, "hybrid_table.md"))
    assert summary == committed
    assert {entry["verdict"] for entry in summary.values()} == {"no difference detected"}


def test_maml_online_study_recomputes_from_its_per_run_records():
    online = load_benchmark_script("maml_ssm_online_report")
    path = os.path.join(RESULTS, "maml_ssm", "online_adapt")
    committed = read_json(os.path.join(path, "online.json"))
    lines = []
    for task, entry in committed.items():
        summary, section = online.task_section(task, entry["runs"])
        assert summary == entry
        lines += section
    lines.append("± is the 95% Student-t CI over seeds of the per-seed mean over the test tasks.")
    assert "\n".join(lines) + "\n" == read(os.path.join(path, "online_table.md"))
    assert committed["cartpole-physics"]["online_minus_between"]["verdict"] == "lower"
    assert committed["point-nav-2d"]["online_minus_between"]["verdict"] == "no difference detected"


@pytest.mark.parametrize(
    "name, registration", [("curriculum_comparison", "free"), ("curriculum_comparison_constrained", "constrained")]
)
def test_reinforce_baby_curriculum_comparisons_recompute_from_their_per_run_records(name, registration):
    comparison = load_benchmark_script("reinforce_baby_curriculum_comparison")
    path = os.path.join(RESULTS, "reinforce_baby", name)
    committed = read_json(os.path.join(path, "report.json"))
    v = comparison.verdict(committed["runs"])
    assert v == committed["verdict"]
    text = comparison.report_md(committed["runs"], v, comparison.REGISTRATIONS[registration])
    assert text == read(os.path.join(path, "REPORT.md"))


def test_reinforce_baby_ppo_departures_verdicts_recompute_from_runs_csv(capsys):
    departures = load_benchmark_script("reinforce_baby_ppo_departures_report")
    path = os.path.join(RESULTS, "reinforce_baby", "ppo_departures")
    text = printed(capsys, departures.main, [os.path.join(path, "runs.csv")])
    assert text == read(os.path.join(path, "verdicts.md"))
    with open(os.path.join(path, "runs.csv"), newline="") as f:
        assert len(list(csv.DictReader(f))) == 20
    assert "| `--bootstrap-time-limit` |" in text and "the script's setting is supported |" in text


def test_reinforce_baby_unregistered_runs_keep_their_post_hoc_statistics(capsys):
    """Not a registered study: the task-source and conditional-plan runs' post hoc Welch tests and tables, from their
    committed runs.csv and JSON."""
    post_hoc = load_benchmark_script("welch_post_hoc")
    task_source = load_benchmark_script("reinforce_baby_task_source_report")
    path = os.path.join(RESULTS, "reinforce_baby", "features")
    argv = ["--column", "eval_success_rate"]
    for name, folder in (
        ("MVP", "task_source_mvp"),
        ("curriculum", "task_source_curriculum"),
        ("conditional curriculum", "conditional_plan"),
    ):
        argv += ["--csv", f"{name}={os.path.join(path, folder, 'runs.csv')}"]
    text = printed(capsys, post_hoc.main, argv)
    assert text == read(os.path.join(path, "post_hoc.md"))
    assert [line.rsplit("|", 2)[1].strip() for line in text.splitlines()[-3:]] == ["0.03", "0.17", "0.23"]
    assert task_source.report(read_json(os.path.join(path, "task_source.json"))) == read(os.path.join(path, "task_source.md"))
