"""Every registered study whose per-run results are committed (docs/results/index.md, column "recomputed"): its report
code, run on those files in a temporary directory, reproduces the committed verdicts and tables. No study is rerun.

Each study has a check that takes the results folder (docs/results, or a copy). The test of a study runs its check on
the committed folder; `test_each_check_fails_on_a_copy_with_one_wrong_verdict` runs it on a copy of the folder with one
verdict changed, added or removed, and expects it to fail."""

import csv
import glob
import json
import os
import re
import shutil

import numpy as np
import pytest
from benchmark_helpers import load_benchmark_script
from helpers import REPO

RESULTS = os.path.join(REPO, "docs", "results")
ONE_CHANGE = os.path.join("ppo_gru_astral", "one_change")
STUDY = os.path.join("ppo_gru_astral", "study")
PART_B = os.path.join("ppo_gru_astral", "plan_design", "part_b")
POPGYM = os.path.join("ppo_gru_baseline", "popgym")
RECURRENTPPO = os.path.join("ppo_gru_baseline", "recurrentppo_side_by_side")


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


def corrupted(tmp_path, rel, old, new):
    """A copy of docs/results (every file a symlink to the committed one) whose file `rel` has its one `old` replaced by
    `new`."""
    root = str(tmp_path / "results")
    shutil.copytree(RESULTS, root, copy_function=os.symlink)
    path = os.path.join(root, rel)
    text = read(path)
    assert text.count(old) == 1, f"{rel} holds {old!r} {text.count(old)} times"
    os.unlink(path)
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    return root


# ------------------------------------------------------------------------------------------------ the checks
def check_astral_one_change(results, work, monkeypatch, capsys):
    """criteria.md, every line: the `report` part of benchmark/astral_one_change.sh run on the archived runs."""
    study = load_benchmark_script("astral_study_report")
    compare = load_benchmark_script("astral_one_change_compare")
    entropy = load_benchmark_script("astral_one_change_entropy")
    one_change = os.path.join(results, ONE_CHANGE)
    out = "benchmark/out/astral_one_change"
    for part in ("current_seed3", "single", "pair", "current_phase_c"):
        link(work, f"{out}/{part}", os.path.join(one_change, f"{part}_runs"))
    link(work, "docs/results/ppo_gru_astral/study/phase_C_runs", os.path.join(results, STUDY, "phase_C_runs"))
    for path in glob.glob(os.path.join(one_change, "tta", "*.json")):
        seed = os.path.basename(path).split("_s")[-1].split(".")[0]
        sweep, name = ("tta_clamp", "clamp.json") if path.endswith(".clamp.json") else ("tta_adapt_plan", "tta.json")
        link(work, f"{out}/{sweep}/runs/c0__g0_base__s{seed}/run/{name}", path)
    monkeypatch.chdir(work)

    def gate_table(part):
        return "\n".join(entropy.table(read_json(os.path.join(one_change, f"{part}_runs", "gate_entropy.json")))) + "\n"

    text = ""
    for part in ("current_seed3", "single", "pair"):
        text += printed(capsys, study.main, ["--phase", "C", "--sweep", f"{out}/{part}"])
        text += gate_table(part)
    archives = [os.path.join(one_change, f"{part}_runs") for part in ("current_seed3", "single", "pair")]
    text += printed(capsys, compare.main, archives)
    text += gate_table("current_phase_c")
    phase_c = [f"{out}/current_phase_c", "docs/results/ppo_gru_astral/study/phase_C_runs", "--seeds", "6", "7", "8", "9", "10"]
    text += printed(capsys, study.main, ["--phase", "C", "--sweep", *phase_c])
    text += printed(capsys, study.main, ["--phase", "T", "--sweep", f"{out}/tta_adapt_plan", f"{out}/tta_clamp"])
    assert text == read(os.path.join(one_change, "criteria.md"))


def check_astral_study_phase(results, work, monkeypatch, capsys, phase):
    """Phases A-C of the ASTRAL study (criteria 1 and 2, the wall-time bound, the controls, the screen and the frozen
    choice). phase_b.md and phase_c.md are the report's output on the archived runs, line for line below their heading
    (which names the sweep directory the runs were reported from). phase_a.md first reports the oracle runs and
    memoryless seeds 1-2 from their sweep directory (their eval.json files were not committed), then the part the
    archived runs print, which is the output line for line; its verdict lines are the oracle's two and the output's.
    Criteria 3 and 4 read tta.json files that were not committed; phase_c.md prints no verdict line for them."""
    study = load_benchmark_script("astral_study_report")
    text = printed(capsys, study.main, ["--phase", phase, "--sweep", os.path.join(results, STUDY, f"phase_{phase}_runs")])
    committed = read(os.path.join(results, STUDY, f"phase_{phase.lower()}.md"))
    output = text.splitlines()[1:]
    part = committed.splitlines()[1:]
    if phase == "A":
        start = committed.splitlines().index("### Phase A: docs/results/ppo_gru_astral/study/phase_A_runs") + 1
        part = committed.splitlines()[start : start + len(output)]
        oracle = [line for line in verdict_lines(committed) if line.split(" ", 1)[1].startswith("oracle")]
        assert len(oracle) == 2
        assert verdict_lines(committed) == oracle + verdict_lines(text)
    assert output and part == output


def check_astral_plan_design_part_b(results, work, monkeypatch, capsys):
    """Part b's criteria.md: criteria 3 and 4 recomputed from the committed tta files; criteria 1, 2 and the wall-time
    bound of the frozen configuration and the ceiling recomputed from the study's Phase C runs of seeds 6-10. The plan
    arm's three lines (its eval.json files were not committed) are the only verdict lines taken from the file."""
    study = load_benchmark_script("astral_study_report")
    committed = os.path.join(results, PART_B)
    sweeps = {"plan": "tta_plan_setting", "stud": "tta_study_setting", "clam": "tta_clamp"}
    for path in glob.glob(os.path.join(committed, "tta", "*.json")):
        name = os.path.basename(path)
        seed = name.split("_s")[-1].split(".")[0]
        target = "clamp.json" if name.endswith(".clamp.json") else "tta.json"
        link(work, f"benchmark/out/astral_plan_check/{sweeps[name[:4]]}/runs/c0__g0_base__s{seed}/run/{target}", path)
    monkeypatch.chdir(work)
    argv = ["--phase", "T", "--sweep"] + [f"benchmark/out/astral_plan_check/{s}" for s in sweeps.values()]
    tta = verdict_lines(printed(capsys, study.main, argv))
    seeds = ["--seeds", "6", "7", "8", "9", "10"]
    argv = ["--phase", "C", "--sweep", os.path.join(results, STUDY, "phase_C_runs"), *seeds]
    phase_c = verdict_lines(printed(capsys, study.main, argv))
    lines = verdict_lines(read(os.path.join(committed, "criteria.md")))
    plan = [line for line in lines if line.split(" ", 1)[1].startswith("plan (hidden velocity) ")]
    assert len(plan) == 3
    assert lines == plan + phase_c + tta


def popgym_runs(folder):
    """The runs of the committed runs.csv as popgym_check_report.read_runs returns them. Their MMER curves (TensorBoard
    events) were not committed: a curve is the final MMER, and, where the memoryless control ran fewer steps than the
    GRU, the GRU's mean MMER at the control's step that report.md prints ("GRU at its steps")."""
    report = read(os.path.join(folder, "report.md"))
    with open(os.path.join(folder, "runs.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    control_steps = {row["env_id"]: int(row["steps"]) for row in rows if row["agent"] == "memoryless"}
    runs = []
    for row in rows:
        steps = int(row["steps"])
        mmer = float(row["mmer"])
        curve = (np.array([steps]), np.array([mmer]))
        control = control_steps.get(row["env_id"], steps)
        if row["agent"] == "GRU" and control < steps:
            at_control = re.search(rf"^\| {row['env_id']} \|.*; GRU at its steps ([-0-9.]+) \|", report, re.M).group(1)
            curve = (np.array([control, steps]), np.array([float(at_control), mmer]))
        evaluation = {}
        for key in ("eval_deterministic", "eval_sampled"):
            evaluation[key] = None
            if row[key]:
                evaluation[key] = float(row[key])
        runs.append(
            {
                "env_id": row["env_id"],
                "agent": row["agent"],
                "seed": int(row["seed"]),
                "steps": steps,
                "mmer": mmer,
                "wall_time_s": float(row["wall_time_s"]),
                "curve": curve,
                **evaluation,
            }
        )
    return runs


def check_popgym(results, work, monkeypatch, capsys):
    """Every registered answer of the POPGym check (the verdict against the paper's GRU, and the side questions: needs
    memory, ASTRAL's cost in MMER and wall time), recomputed by the report code from the committed runs.csv and
    paper_mmer.csv: report.md, summary.json and runs.csv are its output, byte for byte (summary.json: value for value)."""
    popgym = load_benchmark_script("popgym_check_report")
    folder = os.path.join(results, POPGYM)
    runs = popgym_runs(folder)

    def committed_runs(sweeps):
        return runs

    monkeypatch.setattr(popgym, "read_runs", committed_runs)
    out = os.path.join(work, "popgym")
    argv = ["--sweeps", "committed", "--paper", os.path.join(folder, "paper_mmer.csv"), "--output", out]
    printed(capsys, popgym.main, argv)
    for name in ("report.md", "runs.csv"):
        assert read(os.path.join(out, name)) == read(os.path.join(folder, name)), name
    assert read_json(os.path.join(out, "summary.json")) == read_json(os.path.join(folder, "summary.json"))


def check_recurrentppo(results, work, monkeypatch, capsys):
    """The six registered verdicts, recomputed from the per-run returns in summary.json: summary.json's verdicts and the
    verdict lines of report.md."""
    side = load_benchmark_script("recurrentppo_side_by_side_report")
    summary = read_json(os.path.join(results, RECURRENTPPO, "summary.json"))
    groups = {}
    for key, values in summary.items():
        if key != "verdicts":
            agent, budget = key.rsplit(" @ ", 1)
            groups[(agent, int(budget))] = [{"deterministic": v} for v in values["deterministic"]]
    recomputed = side.verdicts(groups)
    assert {str(budget): pairs for budget, pairs in recomputed.items()} == summary["verdicts"]
    lines = [f"- {budget:,} steps, {pair}: {result}" for budget, pairs in recomputed.items() for pair, result in pairs.items()]
    report = read(os.path.join(results, RECURRENTPPO, "report.md"))
    assert [line for line in report.splitlines() if line.startswith("- ")] == lines


def run_from_eval_json(work, path, script, args, iterations):
    """(checkpoint path, checkpoint, eval.json) of one run rebuilt from its committed eval.json copy: the report reads
    eval.json beside the checkpoint; the iteration count, a column of the table only, comes from the committed JSON
    (the checkpoints that held it were not committed)."""
    run_dir = os.path.join(work, os.path.basename(path)[: -len(".json")])
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "eval.json"), "w") as f:
        f.write(read(path))
    checkpoint = {"script": script, "args": args, "outer_steps_done": iterations}
    return os.path.join(run_dir, f"{script}.cleanrl_model"), checkpoint, read_json(path)


def iterations_of(entry, seed):
    return dict(zip(entry["seeds"], entry["iterations"]))[seed]


def check_maml_promp(results, work, monkeypatch, capsys):
    report = load_benchmark_script("maml_ssm_report")
    folder = os.path.join(results, "maml_ssm", "promp_study")
    committed = read_json(os.path.join(folder, "promp_study.json"))
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "eval_*_s*.json"))):
        policy, seed = os.path.basename(path)[len("eval_") : -len(".json")].split("_s")
        seed = int(seed)
        iterations = iterations_of(committed[policy], seed)
        args = {"task": "point-nav-2d", "policy": policy, "seed": seed, "outer_steps": iterations}
        runs.append(run_from_eval_json(work, path, "maml_ssm_promp", args, iterations))
    out = os.path.join(work, "report")
    os.makedirs(out)
    text = report.promp_study(runs, out)
    assert text == read(os.path.join(folder, "promp_study_table.md"))
    assert read_json(os.path.join(out, "promp_study.json")) == committed


def check_maml_equal_cpu(results, work, monkeypatch, capsys):
    report = load_benchmark_script("maml_ssm_report")
    folder = os.path.join(results, "maml_ssm", "equal_cpu_study")
    committed = read_json(os.path.join(folder, "equal_cpu_study.json"))
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "eval_*_*_s*.json"))):
        optimizer, policy, seed = os.path.basename(path)[len("eval_") : -len(".json")].split("_")
        seed = int(seed[1:])
        iterations = iterations_of(committed[optimizer][policy], seed)
        script = "maml_ssm_promp" if optimizer == "promp" else "maml_ssm"
        args = {"task": "point-nav-2d", "policy": policy, "seed": seed, "outer_steps": 100000}
        runs.append(run_from_eval_json(work, path, script, args, iterations))
    out = os.path.join(work, "report")
    os.makedirs(out)
    text = report.equal_cpu_study(runs, out)
    assert text == read(os.path.join(folder, "equal_cpu_study_table.md"))
    assert read_json(os.path.join(out, "equal_cpu_study.json")) == committed


def check_maml_hybrid(results, work, monkeypatch, capsys, folder, objective):
    report = load_benchmark_script("maml_ssm_report")
    path = os.path.join(results, "maml_ssm", folder)
    committed = read_json(os.path.join(path, "hybrid.json"))
    lines = []
    summary = {}
    for task, entry in committed.items():
        summary[task], section = report.hybrid_section(task, entry["runs"], objective)
        lines += section
    lines.append("± is the 95% Student-t CI over seeds of the per-seed mean over the test tasks.")
    assert "\n".join(lines) + "\n" == read(os.path.join(path, "hybrid_table.md"))
    assert summary == committed


def check_maml_online(results, work, monkeypatch, capsys):
    online = load_benchmark_script("maml_ssm_online_report")
    path = os.path.join(results, "maml_ssm", "online_adapt")
    committed = read_json(os.path.join(path, "online.json"))
    lines = []
    summaries = {}
    for task, entry in committed.items():
        summaries[task], section = online.task_section(task, entry["runs"])
        lines += section
    lines.append("± is the 95% Student-t CI over seeds of the per-seed mean over the test tasks.")
    assert "\n".join(lines) + "\n" == read(os.path.join(path, "online_table.md"))
    assert summaries == committed


def check_reinforce_baby_curriculum(results, work, monkeypatch, capsys, name, registration):
    comparison = load_benchmark_script("reinforce_baby_curriculum_comparison")
    path = os.path.join(results, "reinforce_baby", name)
    committed = read_json(os.path.join(path, "report.json"))
    v = comparison.verdict(committed["runs"])
    assert v == committed["verdict"]
    text = comparison.report_md(committed["runs"], v, comparison.REGISTRATIONS[registration])
    assert text == read(os.path.join(path, "REPORT.md"))


def check_reinforce_baby_ppo_departures(results, work, monkeypatch, capsys):
    departures = load_benchmark_script("reinforce_baby_ppo_departures_report")
    path = os.path.join(results, "reinforce_baby", "ppo_departures")
    text = printed(capsys, departures.main, [os.path.join(path, "runs.csv")])
    assert text == read(os.path.join(path, "verdicts.md"))


def check_reinforce_baby_post_hoc(results, work, monkeypatch, capsys):
    """Not a registered study: the task-source and conditional-plan runs' post hoc Welch tests and tables, from their
    committed runs.csv and JSON."""
    post_hoc = load_benchmark_script("welch_post_hoc")
    task_source = load_benchmark_script("reinforce_baby_task_source_report")
    path = os.path.join(results, "reinforce_baby", "features")
    argv = ["--column", "eval_success_rate"]
    for name, folder in (
        ("MVP", "task_source_mvp"),
        ("curriculum", "task_source_curriculum"),
        ("conditional curriculum", "conditional_plan"),
    ):
        argv += ["--csv", f"{name}={os.path.join(path, folder, 'runs.csv')}"]
    text = printed(capsys, post_hoc.main, argv)
    assert text == read(os.path.join(path, "post_hoc.md"))
    assert task_source.report(read_json(os.path.join(path, "task_source.json"))) == read(os.path.join(path, "task_source.md"))


# ------------------------------------------------------------------------------------------------ the committed results
def test_astral_one_change_criteria_md_is_its_report_codes_output(tmp_path, monkeypatch, capsys):
    check_astral_one_change(RESULTS, str(tmp_path), monkeypatch, capsys)
    committed = read(os.path.join(RESULTS, ONE_CHANGE, "criteria.md"))
    # part `current`, scored by criteria 1 and 2 as registered
    assert "PASS script_plan_sign criterion 1: seeds per training mode >= 475: [5, 5, 5] of 5" in committed
    assert "FAIL script_plan_sign criterion 2: episode-level NMI >= 0.5 in 0 of 5 seeds" in committed
    assert (
        "FAIL frozen_plan_sign (hidden velocity) criterion 1: seeds per training mode >= 475: [3, 3, 3, 4] of 5" in committed
    )
    assert "FAIL frozen_plan_sign (hidden velocity) criterion 2: episode-level NMI >= 0.5 in 2 of 5 seeds" in committed


@pytest.mark.parametrize("phase", ["A", "B", "C"])
def test_astral_study_phase_verdicts_recompute_from_the_archived_runs(phase, tmp_path, monkeypatch, capsys):
    check_astral_study_phase(RESULTS, str(tmp_path), monkeypatch, capsys, phase)
    if phase == "C":
        committed = read(os.path.join(RESULTS, STUDY, "phase_c.md"))
        assert "FAIL frozen (hidden velocity) criterion 1: seeds per training mode >= 475: [6, 5, 7, 6] of 10" in committed


def test_astral_plan_design_part_b_verdicts_recompute_from_the_committed_files(tmp_path, monkeypatch, capsys):
    check_astral_plan_design_part_b(RESULTS, str(tmp_path), monkeypatch, capsys)
    committed = read(os.path.join(RESULTS, PART_B, "criteria.md"))
    assert "FAIL tta_clamp criterion 4: clamp specificity >= 200 in 0 of 5 seeds" in committed


def test_popgym_answers_recompute_from_the_per_run_file_and_the_papers_file(tmp_path, monkeypatch, capsys):
    check_popgym(RESULTS, str(tmp_path), monkeypatch, capsys)


def test_recurrentppo_verdicts_recompute_from_the_per_run_returns(tmp_path, monkeypatch, capsys):
    check_recurrentppo(RESULTS, str(tmp_path), monkeypatch, capsys)
    verdicts = read_json(os.path.join(RESULTS, RECURRENTPPO, "summary.json"))["verdicts"]
    assert verdicts["100000"]["RecurrentPPO (zoo) vs baseline, defaults"] == "RecurrentPPO (zoo) wins"
    assert verdicts["500000"]["RecurrentPPO (zoo) vs baseline, 32 envs"] == "RecurrentPPO (zoo) wins"


def test_maml_promp_study_recomputes_from_each_runs_eval_json(tmp_path, monkeypatch, capsys):
    check_maml_promp(RESULTS, str(tmp_path), monkeypatch, capsys)
    committed = read_json(os.path.join(RESULTS, "maml_ssm", "promp_study", "promp_study.json"))
    assert committed["criterion_1"]["pass"] is False and committed["criterion_2"]["pass"] is False


def test_maml_equal_cpu_study_recomputes_from_each_runs_eval_json(tmp_path, monkeypatch, capsys):
    check_maml_equal_cpu(RESULTS, str(tmp_path), monkeypatch, capsys)
    committed = read_json(os.path.join(RESULTS, "maml_ssm", "equal_cpu_study", "equal_cpu_study.json"))
    assert committed["trpo"]["criterion"]["pass"] is False and committed["promp"]["criterion"]["pass"] is False


@pytest.mark.parametrize(
    "folder, objective",
    [
        ("hybrid_benchmark", "pg"),
        ("hybrid_benchmark/dynamics_arm/dynamics", "dynamics"),
        ("hybrid_benchmark/dynamics_arm/pg", "pg"),
    ],
)
def test_maml_hybrid_study_recomputes_from_its_per_run_records(folder, objective, tmp_path, monkeypatch, capsys):
    check_maml_hybrid(RESULTS, str(tmp_path), monkeypatch, capsys, folder, objective)
    committed = read_json(os.path.join(RESULTS, "maml_ssm", folder, "hybrid.json"))
    assert {entry["verdict"] for entry in committed.values()} == {"no difference detected"}


def test_maml_online_study_recomputes_from_its_per_run_records(tmp_path, monkeypatch, capsys):
    check_maml_online(RESULTS, str(tmp_path), monkeypatch, capsys)
    committed = read_json(os.path.join(RESULTS, "maml_ssm", "online_adapt", "online.json"))
    assert committed["cartpole-physics"]["online_minus_between"]["verdict"] == "lower"
    assert committed["point-nav-2d"]["online_minus_between"]["verdict"] == "no difference detected"


@pytest.mark.parametrize(
    "name, registration", [("curriculum_comparison", "free"), ("curriculum_comparison_constrained", "constrained")]
)
def test_reinforce_baby_curriculum_comparisons_recompute_from_their_per_run_records(
    name, registration, tmp_path, monkeypatch, capsys
):
    check_reinforce_baby_curriculum(RESULTS, str(tmp_path), monkeypatch, capsys, name, registration)


def test_reinforce_baby_ppo_departures_verdicts_recompute_from_runs_csv(tmp_path, monkeypatch, capsys):
    check_reinforce_baby_ppo_departures(RESULTS, str(tmp_path), monkeypatch, capsys)
    path = os.path.join(RESULTS, "reinforce_baby", "ppo_departures")
    with open(os.path.join(path, "runs.csv"), newline="") as f:
        assert len(list(csv.DictReader(f))) == 20
    text = read(os.path.join(path, "verdicts.md"))
    assert "| `--bootstrap-time-limit` |" in text and "the script's setting is supported |" in text


def test_reinforce_baby_unregistered_runs_keep_their_post_hoc_statistics(tmp_path, monkeypatch, capsys):
    check_reinforce_baby_post_hoc(RESULTS, str(tmp_path), monkeypatch, capsys)
    text = read(os.path.join(RESULTS, "reinforce_baby", "features", "post_hoc.md"))
    assert [line.rsplit("|", 2)[1].strip() for line in text.splitlines()[-3:]] == ["0.03", "0.17", "0.23"]


# ------------------------------------------------------------------------------------------------ a wrong verdict fails
ORACLE_A = "PASS oracle (hidden velocity): every training mode >= 475 (per-mode means [500.0, 500.0, 500.0, 500.0])\n"
CRITERIA_C = "FAIL frozen (hidden velocity) criterion 1: seeds per training mode >= 475: [6, 5, 7, 6] of 10;"
WRONG_VERDICTS = [
    # (check, its parameters, the file, the committed text, the wrong text)
    pytest.param(
        check_astral_one_change,
        {},
        os.path.join(ONE_CHANGE, "criteria.md"),
        "FAIL script_plan_sign criterion 2",
        "PASS script_plan_sign criterion 2",
        id="one_change-changed",
    ),
    pytest.param(
        check_astral_study_phase,
        {"phase": "A"},
        os.path.join(STUDY, "phase_a.md"),
        ORACLE_A,
        ORACLE_A + "PASS gru (hidden velocity): every training mode >= 475 (per-mode means [476.0, 500.0, 475.0, 481.0])\n",
        id="phase_a-added",
    ),
    pytest.param(
        check_astral_study_phase,
        {"phase": "B"},
        os.path.join(STUDY, "phase_b.md"),
        "PASS stopping rule: configurations",
        "FAIL stopping rule: configurations",
        id="phase_b-changed",
    ),
    pytest.param(
        check_astral_study_phase,
        {"phase": "C"},
        os.path.join(STUDY, "phase_c.md"),
        CRITERIA_C,
        "PASS frozen (hidden velocity) criterion 1: seeds per training mode >= 475: [6, 5, 7, 6] of 10\n" + CRITERIA_C,
        id="phase_c-added",
    ),
    pytest.param(
        check_astral_plan_design_part_b,
        {},
        os.path.join(PART_B, "criteria.md"),
        "PASS ceiling (hidden velocity) criterion 2: episode-level NMI >= 0.5 in 5 of 5 seeds\n",
        "",
        id="part_b-removed",
    ),
    pytest.param(
        check_popgym,
        {},
        os.path.join(POPGYM, "summary.json"),
        '"needs_memory": "yes (GRU +0.228)"',
        '"needs_memory": "no (GRU +0.228)"',
        id="popgym-summary-needs-memory",
    ),
    pytest.param(
        check_popgym,
        {},
        os.path.join(POPGYM, "summary.json"),
        "0.3594000041484833",
        "0.0",
        id="popgym-summary-mmer",
    ),
    pytest.param(
        check_popgym,
        {},
        os.path.join(POPGYM, "report.md"),
        "| no paper value | no verdict | yes (GRU +0.320) | wall time 1.71× |",
        "| no paper value | no verdict | yes (GRU +0.320) | none (MMER +0.009, wall time 1.71×) |",
        id="popgym-report-cost",
    ),
    pytest.param(
        check_recurrentppo,
        {},
        os.path.join(RECURRENTPPO, "report.md"),
        "- 100,000 steps, RecurrentPPO (zoo) vs baseline, 32 envs: tie",
        "- 100,000 steps, RecurrentPPO (zoo) vs baseline, 32 envs: RecurrentPPO (zoo) wins",
        id="recurrentppo-report",
    ),
    pytest.param(
        check_recurrentppo,
        {},
        os.path.join(RECURRENTPPO, "summary.json"),
        '"RecurrentPPO (zoo) vs baseline, 32 envs": "tie"',
        '"RecurrentPPO (zoo) vs baseline, 32 envs": "RecurrentPPO (zoo) wins"',
        id="recurrentppo-summary",
    ),
    pytest.param(
        check_maml_promp,
        {},
        os.path.join("maml_ssm", "promp_study", "promp_study_table.md"),
        "(95% Welch t-interval): **fail**",
        "(95% Welch t-interval): **pass**",
        id="promp",
    ),
    pytest.param(
        check_maml_equal_cpu,
        {},
        os.path.join("maml_ssm", "equal_cpu_study", "equal_cpu_study_table.md"),
        "-1.53 / -14.19 / -16.86 after 1 / 2 / 3 steps: **fail**",
        "-1.53 / -14.19 / -16.86 after 1 / 2 / 3 steps: **pass**",
        id="equal-cpu-table",
    ),
    pytest.param(
        check_maml_equal_cpu,
        {},
        os.path.join("maml_ssm", "equal_cpu_study", "eval_promp_ssm_s2.json"),
        '"1": -17.82625961303711',
        '"1": 100.0',
        id="equal-cpu-one-run",
    ),
    pytest.param(
        check_maml_hybrid,
        {"folder": "hybrid_benchmark", "objective": "pg"},
        os.path.join("maml_ssm", "hybrid_benchmark", "hybrid_table.md"),
        "-0.73 ± 0.86: **no difference detected**",
        "-0.73 ± 0.86: **hybrid worse**",
        id="hybrid",
    ),
    pytest.param(
        check_maml_hybrid,
        {"folder": "hybrid_benchmark/dynamics_arm/dynamics", "objective": "dynamics"},
        os.path.join("maml_ssm", "hybrid_benchmark", "dynamics_arm", "dynamics", "hybrid_table.md"),
        "-0.59 ± 3.92: **no difference detected**",
        "-0.59 ± 3.92: **hybrid worse**",
        id="hybrid-dynamics",
    ),
    pytest.param(
        check_maml_hybrid,
        {"folder": "hybrid_benchmark/dynamics_arm/pg", "objective": "pg"},
        os.path.join("maml_ssm", "hybrid_benchmark", "dynamics_arm", "pg", "hybrid_table.md"),
        "0.54 ± 4.93: **no difference detected**",
        "0.54 ± 4.93: **hybrid better**",
        id="hybrid-dynamics-arm-pg",
    ),
    pytest.param(
        check_maml_online,
        {},
        os.path.join("maml_ssm", "online_adapt", "online_table.md"),
        "-48.89 ± 31.18: **lower**",
        "-48.89 ± 31.18: **no difference detected**",
        id="online",
    ),
    pytest.param(
        check_reinforce_baby_curriculum,
        {"name": "curriculum_comparison", "registration": "free"},
        os.path.join("reinforce_baby", "curriculum_comparison", "REPORT.md"),
        "**Verdict: undecided.**",
        "**Verdict: both.**",
        id="curriculum",
    ),
    pytest.param(
        check_reinforce_baby_curriculum,
        {"name": "curriculum_comparison_constrained", "registration": "constrained"},
        os.path.join("reinforce_baby", "curriculum_comparison_constrained", "report.json"),
        '"verdict": "both"',
        '"verdict": "undecided"',
        id="curriculum-constrained",
    ),
    pytest.param(
        check_reinforce_baby_ppo_departures,
        {},
        os.path.join("reinforce_baby", "ppo_departures", "verdicts.md"),
        "| 0.903 [0.835, 0.971] | no difference measured |",
        "| 0.903 [0.835, 0.971] | the script's setting is supported |",
        id="ppo_departures",
    ),
    pytest.param(
        check_reinforce_baby_post_hoc,
        {},
        os.path.join("reinforce_baby", "features", "post_hoc.md"),
        "| -0.460 ± 0.358 | 0.03 |",
        "| -0.460 ± 0.358 | 0.30 |",
        id="post_hoc",
    ),
]


@pytest.mark.parametrize("check, params, rel, old, new", WRONG_VERDICTS)
def test_each_check_fails_on_a_copy_with_one_wrong_verdict(check, params, rel, old, new, tmp_path, monkeypatch, capsys):
    results = corrupted(tmp_path, rel, old, new)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(AssertionError):
        check(results, str(work), monkeypatch, capsys, **params)
