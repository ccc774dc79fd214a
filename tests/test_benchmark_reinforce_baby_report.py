"""Tests of benchmark/reinforce_baby_report.py on hand-made reinforce_baby runs (TensorBoard events, eval.json and
manifest records), and of the pre-registered curriculum comparison's verdict and runner."""

import json
import os
import subprocess

import pytest
from benchmark_helpers import load_benchmark_script
from helpers import REPO, SCRIPT_ENV
from test_reinforce_baby_llm import llm_server  # noqa: F401 (the stand-in LLM server's fixture, by name below)
from torch.utils.tensorboard import SummaryWriter

reinforce_baby_report = load_benchmark_script("reinforce_baby_report")
comparison = load_benchmark_script("reinforce_baby_curriculum_comparison")
task_source = load_benchmark_script("reinforce_baby_task_source_report")


def _fake_baby_run(sweep, key, curves, ev=None, wall=None, exit_code=0):
    """A reinforce_baby run as benchmark.py leaves it: sweep/runs/<key>/<run_name>/ with TensorBoard events
    ({tag: [(step, value)]}), eval.json when the run finished, and a manifest record when it exited."""
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
    assert reinforce_baby_report.main(["--out", str(out), "--report", str(rep)]) == 0
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
    assert reinforce_baby_report.main(["--out", str(tmp_path / "empty"), "--report", str(tmp_path / "rep2")]) == 2
    assert not (tmp_path / "rep2").exists()


# ----------------------------------------------------------------------- the pre-registered curriculum comparison


def comparison_row(parent, rule, seed, levels, success=None, accuracy=None, fallback_share=0.0):
    return {
        "parent": parent,
        "rule": rule,
        "seed": seed,
        "levels": dict(zip(comparison.TASKS, levels)),
        "success": success or {},
        "accuracy": accuracy,
        "fallback_share": fallback_share,
        "counted": fallback_share <= comparison.MAX_FALLBACK_SHARE,
    }


def test_the_comparisons_verdict_applies_the_preregistered_criteria():
    """T: the plan's curriculum gains the LLM parent at least one level (summed over tasks) more than the rule parent;
    W: where the parent's accuracy is below 0.95, the baby's success is at most that accuracy + 0.05."""
    capped = {"sequence-next/level0": 0.84, "pattern-echo/level0": 1.0}
    accuracy = {"sequence-next/level0": 0.84, "pattern-echo/level0": 1.0}
    rows = []
    for seed in (1, 2):
        rows.append(comparison_row("rule", "mastery", seed, [2, 2, 1]))
        rows.append(comparison_row("rule", "plan", seed, [2, 2, 1]))
        rows.append(comparison_row("LLM", "mastery", seed, [2, 0, 1], capped, accuracy))
        rows.append(comparison_row("LLM", "plan", seed, [2, 1, 1], capped, accuracy))
    v = comparison.verdict(rows)
    assert (v["G_LLM"], v["G_rule"], v["T"], v["W"], v["verdict"]) == (1.0, 0.0, True, True, "both")
    # the baby better than its parent where the parent errs: not the teaching
    better = {"sequence-next/level0": 0.95, "pattern-echo/level0": 1.0}
    for r in rows:
        if r["parent"] == "LLM":
            r["success"] = better
    assert comparison.verdict(rows)["verdict"] == "the threshold"
    # the rule parent gains as much from the plan's curriculum: not the threshold
    for r in rows:
        if (r["parent"], r["rule"]) == ("rule", "plan"):
            r["levels"]["conditional"] = 2
    assert comparison.verdict(rows)["verdict"] == "neither"
    # a run with more than 5% fallbacks is left out; a cell with one counted seed leaves the verdict undecided
    rows[2]["fallback_share"] = 0.2
    rows[2]["counted"] = False
    assert comparison.verdict(rows)["verdict"] == "undecided"


def test_the_comparisons_runner_runs_its_tiny_grid_and_reports(tmp_path, request):
    """bash benchmark/reinforce_baby_curriculum_comparison.sh --tiny against the stand-in LLM server: the four cells'
    runs (rule and LLM parent x mastery and plan curriculum) and REPORT.md with a verdict line."""
    srv = request.getfixturevalue("llm_server")
    script = os.path.join(REPO, "benchmark", "reinforce_baby_curriculum_comparison.sh")
    out = tmp_path / "out"
    cmd = ["bash", script, "--tiny", "--llm-base-url", srv.url, "--llm-model", "test-model", "--out", str(out)]
    subprocess.run(cmd, check=True, env=SCRIPT_ENV, capture_output=True)
    with open(out / "report" / "report.json") as f:
        report = json.load(f)
    cells = sorted((r["parent"], r["rule"]) for r in report["runs"])
    assert cells == [("LLM", "mastery"), ("LLM", "plan"), ("rule", "mastery"), ("rule", "plan")]
    assert all(r["levels"] and r["counted"] for r in report["runs"])
    assert [r["accuracy"] is None for r in report["runs"]].count(True) == 2
    assert report["verdict"]["verdict"] == "undecided"  # one seed per cell
    assert "**Verdict: undecided.**" in (out / "report" / "REPORT.md").read_text()
    assert (out / "report" / "levels.png").stat().st_size > 0


def test_w_pairs_are_the_played_levels_where_the_parent_errs():
    """W's pairs: every level up to the run's final one, where the parent's accuracy is known and below 0.95."""
    success = {"sequence-next/level0": 0.7, "sequence-next/level1": 0.2, "pattern-echo/level0": 1.0, "conditional/level0": 0.5}
    accuracy = {
        "sequence-next/level0": 0.84,
        "sequence-next/level1": 0.2,
        "pattern-echo/level0": 1.0,
        "conditional/level0": 0.55,
    }
    row = comparison_row("LLM", "plan", 1, [0, 0, 0], success, accuracy)
    assert sorted(comparison.played_pairs([row])) == [(0.5, 0.55), (0.7, 0.84)]  # sequence-next level 1 not played
    row["levels"]["sequence-next"] = 1
    assert sorted(comparison.played_pairs([row])) == [(0.2, 0.2), (0.5, 0.55), (0.7, 0.84)]


# ----------------------------------------------------------------------- the task-source runs


def test_task_source_report_sets_the_rule_drawn_runs_beside_the_parent_drawn_ones_with_their_pools(tmp_path):
    """Each run's source from its run key, success as mean ± sd over seeds, and every pool a parent-drawn run built,
    per seed, in the order of the seeds; a run without eval.json (unfinished) is left out."""
    sweep = tmp_path / "curriculum"
    curves = {"charts/success_rate": [(100, 0.5)]}
    levels = {"pattern-echo": 2, "sequence-next": 1, "conditional": 0}
    pool = {"asked": 32, "valid": 16, "valid_share": 0.5, "distinct": 3, "target_entropy_bits": 1.5}
    for seed, success in ((1, 0.6), (2, 0.8)):
        ev = {"success_rate": success, "eval_levels": levels, "parent": {"accuracy": 0.9, "queries": 100, "fallbacks": 0}}
        _fake_baby_run(sweep, f"c0__g0_task-source_rule__s{seed}", curves, ev, wall=10.0)
        parent = dict(ev["parent"], task_generation={"sequence-next/level1": dict(pool, valid_share=0.25 * seed)})
        if seed == 2:
            parent["task_generation"]["pattern-echo/level0"] = pool
            parent["fallbacks"] = 3
        _fake_baby_run(
            sweep, f"c0__g1_task-source_parent__s{seed}", curves, dict(ev, success_rate=success / 2, parent=parent), wall=20.0
        )
    _fake_baby_run(sweep, "c0__g1_task-source_parent__s3", curves)  # not finished
    out = tmp_path / "report" / "task_source.md"
    task_source.main(["--sweep", f"curriculum={sweep}", "--output", str(out)])
    text = out.read_text()
    assert "| curriculum | rule | 1, 2 | 0.700 ± 0.100 | 3, 3 | 0.900 ± 0.000 | 0.0% at most | 10 |" in text
    assert "| curriculum | parent | 1, 2 | 0.350 ± 0.050 | 3, 3 | 0.900 ± 0.000 | 3.0% at most | 20 |" in text
    pools = [line for line in text.splitlines() if line.startswith("| curriculum | pattern-echo") or "sequence-next/" in line]
    assert pools == [
        "| curriculum | pattern-echo/level0 | 1 | 0.50 | 3 | 1.50 |",
        "| curriculum | sequence-next/level1 | 2 | 0.25, 0.50 | 3, 3 | 1.50, 1.50 |",
    ]
    saved = json.loads((tmp_path / "report" / "task_source.json").read_text())
    assert [r["seed"] for r in saved["curriculum"]] == [1, 2, 1, 2]
    assert "curve" not in saved["curriculum"][0]  # the curves go into the plot only
    assert (tmp_path / "report" / "task_source.png").stat().st_size > 0


def test_task_source_report_refuses_a_bad_sweep_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="no --task-source"):
        task_source.source_of("c0__g0_base__s1")
    out = str(tmp_path / "report.md")
    with pytest.raises(SystemExit, match="must be NAME=DIR") as refused:
        task_source.main(["--sweep", str(tmp_path), "--output", out])
    assert "\n" not in str(refused.value)
    with pytest.raises(SystemExit, match="must be NAME=DIR"):
        task_source.main(["--sweep", f"MVP={tmp_path / 'missing'}", "--output", out])
    other = tmp_path / "other"
    _fake_baby_run(other, "c0__g0_base__s1", {"charts/success_rate": [(100, 0.5)]}, {"success_rate": 0.5}, wall=1.0)
    with pytest.raises(SystemExit, match="no --task-source in the run key") as refused:
        task_source.main(["--sweep", f"MVP={other}", "--output", out])
    assert "\n" not in str(refused.value) and not os.path.exists(out)


def write_runs_csv(path, groups, column="eval_success_rate"):
    """A report.py runs.csv with one row per (grid point, seed) and the one metric column."""
    lines = [f"method,grid,seed,{column}"]
    for grid, values in groups.items():
        lines += [f"m,{grid},{seed},{value}" for seed, value in enumerate(values, start=1)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_ppo_departures_verdicts_follow_the_registered_rule(tmp_path, capsys):
    """Supported: the script's mean higher by >= 0.05 with disjoint 95% Student-t CIs; the reverse: the plan's is better;
    disjoint CIs less than 0.05 apart, or overlapping ones: no difference measured."""
    departures = load_benchmark_script("reinforce_baby_ppo_departures_report")
    script = [0.80, 0.81, 0.79, 0.80, 0.80]
    assert departures.verdict(script, [0.30, 0.31, 0.29, 0.30, 0.30]) == "the script's setting is supported"
    assert departures.verdict(script, [0.90, 0.91, 0.89, 0.90, 0.90]) == "the plan's setting is better"
    assert departures.verdict(script, [0.76, 0.761, 0.759, 0.76, 0.76]) == "no difference measured"  # 0.04 apart
    assert departures.verdict(script, [0.50, 1.00, 0.60, 0.95, 0.70]) == "no difference measured"  # CIs overlap
    csv_path = write_runs_csv(tmp_path / "runs.csv", {"–": script, "--plan-flag": [0.30, 0.31, 0.29, 0.30, 0.30]})
    assert departures.main([csv_path]) == 0
    assert "| `--plan-flag` | 0.300, 0.310, 0.290, 0.300, 0.300 |" in capsys.readouterr().out
    no_defaults = write_runs_csv(tmp_path / "other.csv", {"--plan-flag": script})
    assert departures.main([no_defaults]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_welch_post_hoc_compares_each_grid_point_with_the_first(tmp_path, capsys):
    from scipy import stats

    post_hoc = load_benchmark_script("welch_post_hoc")
    a = [1.0, 0.9, 0.95]
    b = [0.5, 0.7, 0.45]
    csv_path = write_runs_csv(tmp_path / "runs.csv", {"--source rule": a, "--source parent": b})
    (comparison,) = post_hoc.compare("MVP", csv_path, "eval_success_rate")
    assert (comparison.reference, comparison.other) == ("--source rule", "--source parent")
    assert comparison.p == pytest.approx(stats.ttest_ind(b, a, equal_var=False).pvalue)
    assert comparison.difference == pytest.approx(sum(b) / 3 - sum(a) / 3)
    assert post_hoc.main(["--column", "eval_success_rate", "--csv", f"MVP={csv_path}"]) == 0
    assert "Post hoc, not registered" in capsys.readouterr().out
    one_grid = write_runs_csv(tmp_path / "one.csv", {"--source rule": a})
    with pytest.raises(SystemExit, match="fewer than two grid points"):
        post_hoc.main(["--column", "eval_success_rate", "--csv", f"MVP={one_grid}"])
