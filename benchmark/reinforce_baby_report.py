"""Tables and plots of the reinforce_baby benchmark (`benchmark/reinforce_baby.sh`). The MVP criteria and the
success curves come from the runs' TensorBoard logs (charts/success_rate against environment steps) and eval.json
files; report.py's tables are about returns, not these criteria. Reads --out/mvp and every sweep directory named
curriculum* under --out (runs that have not finished count by their curves only) and writes into --report:
mvp_criteria.md / .json, mvp_curves.png, curriculum_table.md and curriculum_curves.png. With --llm it reads the
LLM-parent experiment instead (agreement/, mvp/ and curriculum/ under --out, from benchmark/reinforce_baby_llm.sh) and
writes llm_parent.md / .json.

Usage: python benchmark/reinforce_baby_report.py --out benchmark/out/reinforce_baby --report docs/results/reinforce_baby
       python benchmark/reinforce_baby_report.py --llm --out benchmark/out/reinforce_baby_llm \
           --report docs/results/reinforce_baby
"""

import argparse
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import read_scalars  # noqa: E402  TensorBoard's own reader: the run's own events, purges applied

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import population_sd  # noqa: E402

TASKS = ["pattern-echo", "sequence-next", "conditional"]
MATCHED_STEPS = [10000, 20000, 40000, 60000, 80000]


def load(run_key_dir):
    """(scalars by tag, eval.json or None for a run that has not finished)."""
    run_dir = [d for d in glob.glob(os.path.join(run_key_dir, "*")) if os.path.isdir(d)][0]
    series = read_scalars(run_dir)
    path = os.path.join(run_dir, "eval.json")
    if not os.path.isfile(path):
        return series, None
    with open(path) as f:
        return series, json.load(f)


def logged_runs(sweep):
    """(run key, scalars, eval.json or None, wall s) of every run of the sweep that has logged a success rate."""
    walls = wall_times(sweep)
    for key_dir in sorted(glob.glob(os.path.join(sweep, "runs", "*"))):
        key = os.path.basename(key_dir)
        try:
            series, ev = load(key_dir)
        except (IndexError, KeyError):
            continue  # a run that has not started
        if "charts/success_rate" in series:
            yield key, series, ev, walls.get(key, float("nan"))


def wall_times(sweep):
    """Wall time of every run of the sweep that exited 0, by run key (benchmark.py's manifest)."""
    times = {}
    if os.path.isfile(os.path.join(sweep, "manifest.jsonl")):
        with open(os.path.join(sweep, "manifest.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                if r["exit_code"] == 0:
                    times[r["runs_dir"].rstrip("/").split("/")[-1]] = r["wall_time_s"]
    return times


def at_step(series, tag, step):
    """The last value logged at or before step."""
    s, v = series[tag]
    return float(v[s <= step][-1])


def first_last_mean(series, tag, frac=0.1):
    v = series[tag][1]
    k = max(1, int(len(v) * frac))
    return float(v[:k].mean()), float(v[-k:].mean())


def first_step_above(series, tag, threshold):
    s, v = series[tag]
    return int(s[v > threshold][0]) if (v > threshold).any() else None


def yn(b):
    return "yes" if b else "**no**"


def ms(xs):
    return f"{np.mean(xs):.2f} ± {population_sd(xs):.2f}" if len(xs) else "–"


# ------------------------------------------------------------------------------------------------ MVP
def mvp_rows(mvp_sweep):
    """One row per MVP seed: the plan's four success criteria and the target, from the curves and eval.json.
    Returns (rows, curves by seed)."""
    walls = wall_times(mvp_sweep)
    rows, curves = [], {}
    for key_dir in sorted(glob.glob(os.path.join(mvp_sweep, "runs", "*"))):
        key = os.path.basename(key_dir)
        seed = int(key.rsplit("__s", 1)[1])
        series, ev = load(key_dir)
        curves[seed] = series
        s5k = at_step(series, "charts/success_rate", 5000)
        ent0, ent1 = first_last_mean(series, "losses/entropy")
        mse0, mse1 = first_last_mean(series, "losses/world_model_mse")
        final = float(series["charts/success_rate"][1][-1])
        wall = walls.get(key, float("nan"))
        rows.append(
            {
                "seed": seed,
                "success@5k": s5k,
                "first_step_gt_50%": first_step_above(series, "charts/success_rate", 0.5),
                "first_step_gt_90%": first_step_above(series, "charts/success_rate", 0.9),
                "final_success": final,
                "eval_success": ev["success_rate"],
                "entropy_first": ent0,
                "entropy_last": ent1,
                "wm_mse_first": mse0,
                "wm_mse_last": mse1,
                "train_s": ev["train_time_s"],
                "wall_s": wall,
                "c1_gt_12.5%": final > 0.125 and ev["success_rate"] > 0.125,
                "c2_gt_50%@5k": s5k > 0.5,
                "c3_entropy_down": ent1 < ent0,
                "c4_wm_mse_down": mse1 < mse0,
                "target_gt_90%@5k": s5k > 0.9,
                "under_60s": wall < 60,
            }
        )
    return rows, curves


def mvp_table(rows):
    lines = [
        "| seed | success@5k | first step >50% | first step >90% | final success (100 ep) | eval success (greedy) "
        "| entropy first→last 10% | WM MSE first→last 10% | train s | wall s | >12.5% | >50%@5k | entropy ↓ "
        "| WM MSE ↓ | >90%@5k | <60 s |",
        "|" + "---|" * 16,
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {r['success@5k']:.3f} | {r['first_step_gt_50%']} | {r['first_step_gt_90%']} | "
            f"{r['final_success']:.3f} | {r['eval_success']:.3f} | "
            f"{r['entropy_first']:.3f} → {r['entropy_last']:.3f} | "
            f"{r['wm_mse_first']:.3f} → {r['wm_mse_last']:.3f} | "
            f"{r['train_s']:.1f} | {r['wall_s']:.1f} | {yn(r['c1_gt_12.5%'])} | {yn(r['c2_gt_50%@5k'])} | "
            f"{yn(r['c3_entropy_down'])} | {yn(r['c4_wm_mse_down'])} | {yn(r['target_gt_90%@5k'])} | "
            f"{yn(r['under_60s'])} |"
        )
    n90 = sum(r["target_gt_90%@5k"] for r in rows)
    all4 = all(r["c1_gt_12.5%"] and r["c2_gt_50%@5k"] and r["c3_entropy_down"] and r["c4_wm_mse_down"] for r in rows)
    lines.append(
        f"\nTarget > 90% by step 5,000: {n90}/{len(rows)} seeds "
        f"({'met' if n90 >= 4 and len(rows) >= 5 else 'not met'} for >= 4/5). "
        f"All four MVP criteria on every seed: {all4}."
    )
    return "\n".join(lines)


def mvp_curves(curves, path):
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for seed, series in sorted(curves.items()):
        for ax, tag in zip(axes, ["charts/success_rate", "losses/entropy", "losses/world_model_mse"]):
            ax.plot(*series[tag], label=f"seed {seed}", lw=1.2)
    for ax, tag in zip(axes, ["success rate (last 100 episodes)", "policy entropy", "world-model MSE (raw next state)"]):
        ax.set_title(tag, fontsize=10)
        ax.set_xlabel("environment steps")
        ax.axvline(5000, color="grey", ls=":", lw=1)
    axes[0].axhline(0.9, color="green", ls="--", lw=0.8)
    axes[0].axhline(0.125, color="red", ls="--", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle("MVP: pattern-echo, 8 actions, REINFORCE, deterministic parent", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ CURRICULUM
def method_of(key):
    for needle, name in [
        ("algorithm_ppo", "PPO"),
        ("world-model-coef_0", "RL-only"),
        ("kl-coef", "KL-distill"),
        ("algorithm_reinforce", "REINFORCE"),
    ]:
        if needle in key:
            return name
    raise ValueError(f"run {key!r} is none of the curriculum sweep's four methods")


def curriculum_runs(out):
    """{method: [(run key, scalars, eval.json or None, wall s)]} over every sweep named curriculum* under out;
    runs that have not logged a success rate yet are left out."""
    by_method = {}
    for sweep in sorted(glob.glob(os.path.join(out, "curriculum*"))):
        for key, series, ev, wall in logged_runs(sweep):
            by_method.setdefault(method_of(key), []).append((key, series, ev, wall))
    return {m: by_method[m] for m in ["REINFORCE", "PPO", "RL-only", "KL-distill"] if m in by_method}


def curriculum_table(by_method):
    # matched-step comparison from the curves: every run counts at the steps it reached
    mt = [
        "| method | " + " | ".join(f"{c // 1000}k: success / levels (runs)" for c in MATCHED_STEPS) + " |",
        "|" + "---|" * (len(MATCHED_STEPS) + 1),
    ]
    for method, runs in by_method.items():
        cells = []
        for c in MATCHED_STEPS:
            reached = [s for _, s, _, _ in runs if s["charts/success_rate"][0][-1] >= c]
            succ = [at_step(s, "charts/success_rate", c) for s in reached]
            lv = [sum(at_step(s, f"curriculum/level_{t}", c) for t in TASKS) for s in reached]
            cells.append(f"{ms(succ)} / {ms(lv)} ({len(reached)})" if reached else "–")
        mt.append(f"| {method} | " + " | ".join(cells) + " |")
    # final evaluation of the finished runs
    ft = [
        "| method | finished runs | eval success at final levels | final levels (PE/SN/C) | "
        + " | ".join(f"{t[:3]}/L{lvl}" for t in TASKS for lvl in range(3))
        + " | WM MSE | wall s |",
        "|" + "---|" * 15,
    ]
    for method, runs in by_method.items():
        done = [(k, ev, w) for k, _, ev, w in runs if ev is not None]
        if not done:
            ft.append(f"| {method} | 0 | – | – | " + " | ".join("–" for _ in range(9)) + " | – | – |")
            continue
        evs = [ev for _, ev, _ in done]
        levels = ["/".join(str(ev["eval_levels"][t]) for t in TASKS) for ev in evs]
        per = [ms([ev["per_difficulty_success"][f"{t}/level{lvl}"] for ev in evs]) for t in TASKS for lvl in range(3)]
        ft.append(
            f"| {method} | {len(done)} | {ms([ev['success_rate'] for ev in evs])} | {', '.join(levels)} | "
            + " | ".join(per)
            + f" | {ms([ev['world_model_mse'] for ev in evs])} | {ms([w for _, _, w in done])} |"
        )
    return (
        "Matched steps (from the training curves; `levels` = sum of the three tasks' levels, max 6; each cell mean ± "
        "population sd, ddof 0, over runs):\n\n"
        + "\n".join(mt)
        + "\n\nFinal greedy evaluation (200 episodes per task and level) of the runs that finished, mean ± population sd:"
        "\n\n" + "\n".join(ft) + "\n"
    )


def curriculum_curves(by_method, path):
    """Mean ± std over seeds on a common grid that ends where the shortest run of the method ends."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for method, runs in by_method.items():
        end = min(s["charts/success_rate"][0][-1] for _, s, _, _ in runs)
        grid = np.linspace(0, end, 200)
        succ = np.array([np.interp(grid, *s["charts/success_rate"]) for _, s, _, _ in runs])
        lvl = np.array([sum(np.interp(grid, *s[f"curriculum/level_{t}"]) for t in TASKS) for _, s, _, _ in runs])
        for ax, y in zip(axes, [succ, lvl]):
            ax.plot(grid, y.mean(0), label=f"{method} ({len(runs)} seeds)")
            ax.fill_between(grid, y.mean(0) - population_sd(y, axis=0), y.mean(0) + population_sd(y, axis=0), alpha=0.2)
    axes[0].set_title("success rate (last 100 episodes, at the levels being trained)", fontsize=10)
    axes[1].set_title("curriculum progress: sum of the three tasks' levels (max 6)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("environment steps")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ LLM PARENT
def exp_name_of(run_dir):
    return os.path.basename(run_dir).split("__")[1]  # runs are named {task}__{exp_name}__{seed}__{time}


def agreement_checks(out):
    """{(model, role): llm_agreement_check} of the runs under out/agreement, named agreement_{model}_{role}."""
    checks = {}
    for path in sorted(glob.glob(os.path.join(out, "agreement", "*", "eval.json"))):
        name = exp_name_of(os.path.dirname(path))
        model, role = name[len("agreement_") :].rsplit("_", 1)
        with open(path) as f:
            checks[(model, role)] = json.load(f)["llm_agreement_check"]
    return checks


def agreement_table(checks):
    """Per task and level: the answer role's accuracy against the rule, and each role's agreement with the rule's
    reward on the same balanced pairs (half answered right: 0.5 is chance), with the share the judge rewarded."""
    if not checks:
        return ""
    models = sorted({m for m, _ in checks}, key=lambda m: (not m.startswith("smollm2"), m))  # SmolLM2, the parent, first
    head = ["task / level"]
    for m in models:
        head += [f"{m}: answer accuracy", f"{m}: answer agreement", f"{m}: judge agreement", f"{m}: judge rewarded"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    wheres = sorted({w for c in checks.values() for w in c["per_level"]})
    for where in wheres:
        cells = [where]
        for m in models:
            answer = checks.get((m, "answer"), {}).get("per_level", {}).get(where)
            judge = checks.get((m, "judge"), {}).get("per_level", {}).get(where)
            cells += [fmt(answer and answer["accuracy"], ".2f"), fmt(answer and answer["agreement"], ".2f")]
            cells += [fmt(judge and judge["agreement"], ".2f"), fmt(judge and judge["rewarded"], ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["all"]
    for m in models:
        answer = checks.get((m, "answer"), {})
        judge = checks.get((m, "judge"), {})
        cells += [
            fmt(answer.get("accuracy"), ".3f"),
            fmt(answer.get("agreement"), ".3f"),
            fmt(judge.get("agreement"), ".3f"),
            "–",
        ]
    lines.append("| " + " | ".join(cells) + " |")
    foot = []
    for (m, role), c in sorted(checks.items()):
        foot.append(
            f"{m} {role}: {c['queries']} pairs, {c['judged']} rewards from the LLM, {c['fallbacks']} fallbacks, "
            f"{c.get('invalid_answers', 0)} invalid replies, {c['latency_ms']:.0f} ms per request"
        )
    return "\n".join(lines) + "\n\n" + "; ".join(foot) + ".\n"


def parent_of(key):
    if "parent_llm" in key:
        return "LLM"
    return "deterministic"


def llm_run_rows(out, sweep):
    """One row per run of a sweep (mvp or curriculum): success, the parent's statistics and wall time."""
    rows = []
    for key, series, ev, wall in logged_runs(os.path.join(out, sweep)):
        steps = series["charts/success_rate"][0]
        row = {"parent": parent_of(key), "seed": int(key.rsplit("__s", 1)[1]), "steps": int(steps[-1])}
        row["wall_s"] = wall
        for c in (5000, 10000, 40000, 80000):
            # success by step c: none for a run that stopped more than one update before c
            reached = steps[0] <= c < steps[-1] + (steps[1] - steps[0] if len(steps) > 1 else 1)
            row[f"success@{c // 1000}k"] = at_step(series, "charts/success_rate", c) if reached else None
        row["eval_success"] = ev["success_rate"] if ev else None
        row["eval_levels"] = "/".join(str(ev["eval_levels"][t]) for t in TASKS if t in ev["eval_levels"]) if ev else None
        row["eval_per_level"] = ev.get("per_difficulty_success") if ev else None
        parent = (ev or {}).get("parent")
        if parent:
            for k in ("queries", "judged", "fallbacks", "invalid_answers", "cache_hits", "latency_ms", "accuracy"):
                row[k] = parent.get(k)
            if not parent["judged"]:  # no answer was valid: there is no accuracy nor latency to speak of
                row["accuracy"] = None
                row["latency_ms"] = None
            row["per_level_accuracy"] = {w: v.get("accuracy") for w, v in parent["per_level"].items()}
        rows.append(row)
    return rows


def fmt(v, spec=".3f"):
    return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def llm_runs_table(rows, successes):
    head = ["parent", "seed", "steps", *[f"success@{c}" for c in successes], "eval success", "final levels (PE/SN/C)"]
    head += ["LLM queries", "cache hits", "fallbacks", "invalid replies", "accuracy (training)", "latency ms/request"]
    head += ["wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["parent"], str(r["seed"]), str(r["steps"]), *[fmt(r[f"success@{c}"]) for c in successes]]
        cells += [fmt(r["eval_success"]), r["eval_levels"] or "–"]
        cells += [fmt(r.get("queries"), "d"), fmt(r.get("cache_hits"), "d"), fmt(r.get("fallbacks"), "d")]
        cells += [fmt(r.get("invalid_answers"), "d"), fmt(r.get("accuracy")), fmt(r.get("latency_ms"), ".0f")]
        cells += [fmt(r["wall_s"], ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def per_level_table(rows):
    """Per task and level (mean ± population sd over seeds): the LLM parent's accuracy in training, and the baby's greedy
    eval success, which every run measures at every task and level, with the rule and with the LLM as parent. Where the
    parent's accuracy falls, the LLM-taught baby's success falls with it: where the small parent's knowledge ends."""
    accuracy = {}
    success = {"deterministic": {}, "LLM": {}}
    for r in rows:
        for where, acc in (r.get("per_level_accuracy") or {}).items():
            if acc is not None:
                accuracy.setdefault(where, []).append(acc)
        for where, value in (r.get("eval_per_level") or {}).items():
            success[r["parent"]].setdefault(where, []).append(value)
    cells = set(accuracy) | set(success["deterministic"]) | set(success["LLM"])
    if not cells:
        return ""

    def order(where):
        task, level = where.split("/level")
        return TASKS.index(task) if task in TASKS else len(TASKS), task, int(level)

    head = "| task / level | LLM's accuracy in training (runs) | eval success, rule parent | eval success, LLM parent |"
    lines = ["Mean ± population sd (ddof 0) over runs.", "", head, "|---|---|---|---|"]
    for where in sorted(cells, key=order):
        acc = accuracy.get(where, [])
        acc_cell = f"{ms(acc)} ({len(acc)})" if acc else "– (0)"
        lines.append(
            f"| {where} | {acc_cell} | {ms(success['deterministic'].get(where, []))} | {ms(success['LLM'].get(where, []))} |"
        )
    return "\n".join(lines) + "\n"


def llm_curriculum_curves(out, path):
    """The curriculum sweep's success and level curves, the rule parent's runs against the LLM parent's; False when no
    run has logged yet."""
    by_parent = {}
    for run in logged_runs(os.path.join(out, "curriculum")):
        by_parent.setdefault(f"{parent_of(run[0])} parent", []).append(run)
    if not by_parent:
        return False
    curriculum_curves(by_parent, path)
    return True


def llm_main(out, report):
    checks = agreement_checks(out)
    mvp = llm_run_rows(out, "mvp")
    curriculum = llm_run_rows(out, "curriculum")
    if not (checks or mvp or curriculum):
        print(
            f"reinforce_baby_report: no LLM-parent runs under {out!r}; run benchmark/reinforce_baby_llm.sh first",
            file=sys.stderr,
        )
        return 2
    text = (
        "# reinforce_baby with a real LLM parent (llama.cpp's server)\n\n"
        "## Agreement with the rule, per role, task and level\n\n"
        + agreement_table(checks)
        + "\n## The MVP command, 10k steps\n\n"
        + llm_runs_table(mvp, ["5k", "10k"])
        + "\n## The curriculum on all three tasks, 80k steps\n\n"
        + llm_runs_table(curriculum, ["10k", "40k", "80k"])
        + "\n"
        + per_level_table(curriculum)
    )
    os.makedirs(report, exist_ok=True)
    if llm_curriculum_curves(out, os.path.join(report, "llm_curriculum.png")):
        text += "\n![success and levels over training, rule parent against LLM parent](llm_curriculum.png)\n"
    with open(os.path.join(report, "llm_parent.md"), "w") as f:
        f.write(text)
    with open(os.path.join(report, "llm_parent.json"), "w") as f:
        json.dump(
            {"agreement_check": {f"{m}/{r}": c for (m, r), c in checks.items()}, "mvp": mvp, "curriculum": curriculum},
            f,
            indent=2,
        )
    print(text)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the sweeps' output directory (benchmark/out/reinforce_baby)")
    p.add_argument("--report", required=True, help="where the tables, JSON and PNGs go")
    p.add_argument("--llm", action="store_true", help="the LLM-parent experiment (benchmark/reinforce_baby_llm.sh)")
    args = p.parse_args(argv)
    if args.llm:
        return llm_main(args.out, args.report)
    mvp = os.path.join(args.out, "mvp")
    if not glob.glob(os.path.join(mvp, "runs", "*")):
        print(f"reinforce_baby_report: no MVP runs under {mvp!r}; run benchmark/reinforce_baby.sh first", file=sys.stderr)
        return 2
    os.makedirs(args.report, exist_ok=True)
    rows, curves = mvp_rows(mvp)
    text = mvp_table(rows)
    with open(os.path.join(args.report, "mvp_criteria.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.report, "mvp_criteria.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print(text)
    mvp_curves(curves, os.path.join(args.report, "mvp_curves.png"))

    by_method = curriculum_runs(args.out)
    text = curriculum_table(by_method)
    curriculum_curves(by_method, os.path.join(args.report, "curriculum_curves.png"))
    with open(os.path.join(args.report, "curriculum_table.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
