"""Tables and plots of the maml_ssm benchmark (`benchmark/maml_ssm.sh`). Reads every finished run under --out
(`<sweep>/runs/<run>/<run_name>/maml_ssm.cleanrl_model`, or maml_ssm_promp.cleanrl_model, with its eval.json and
adapt.json) and writes into --report: point_nav_table.md (point-nav arms next to the MAML paper's Table 4, then
cartpole-physics / halfcheetah-vel, then the `adapt` tables), the JSON behind them, point_nav_adaptation.png,
point_nav_training.png and the adapt figures.

With --speed it tables the cost of a meta-iteration instead (benchmark/maml_ssm.sh --speed), with --promp-study the
pre-registered ProMP comparison and its verdicts (benchmark/maml_ssm.sh --promp-study), with --equal-cpu-study the
pre-registered SSM-against-MLP comparison under TRPO and ProMP (benchmark/maml_ssm.sh --equal-cpu-study).

Usage: python benchmark/maml_ssm_report.py --out benchmark/out/maml_ssm_full --report docs/results/maml_ssm
       python benchmark/maml_ssm_report.py --speed --out benchmark/out/maml_ssm_speed --report docs/results/maml_ssm/speed
       python benchmark/maml_ssm_report.py --promp-study --out benchmark/out/maml_ssm_promp_study \
           --report docs/results/maml_ssm/promp_study
       python benchmark/maml_ssm_report.py --equal-cpu-study --out benchmark/out/maml_ssm_equal_cpu \
           --report docs/results/maml_ssm/equal_cpu_study
"""

import argparse
import glob
import json
import os
import shutil
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "cleanrl_astral"))
sys.path.insert(0, os.path.join(REPO, "benchmark"))
from maml_ssm import TASK_VERSIONS  # noqa: E402
from report import read_scalars  # noqa: E402

from cleanrl_astral_utils.stats import t_ci95_half_width, welch_diff_ci95  # noqa: E402

welch_ci95 = welch_diff_ci95  # the name tests/test_maml_ssm.py reads

PAPER = [-40.41, -11.68, -3.33, -3.23]  # MAML paper, Table 4: 2D navigation after 0 / 1 / 2 / 3 steps
# the documented TRPO MLP rows (docs/maml_ssm.md, --config paper, 900 CPU-s, seeds 1-5): return after one step per seed,
# the comparator of the ProMP study's criterion 1, fixed before the study ran
TRPO_MLP_STEP1 = [-6.49, -6.86, -7.04, -6.91, -6.58]


def save_figure(fig, path):
    """Writes a finished figure to path and frees it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_table_and_json(report, stem, lines, summary):
    """Writes <stem>_table.md from the table's lines and <stem>.json from summary; returns the table's text."""
    text = "\n".join(lines) + "\n"
    with open(os.path.join(report, f"{stem}_table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(report, f"{stem}.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return text


def arm_of(a):
    """The row a run belongs to, from its saved config: runs of one arm differ only in the seed."""
    if a["outer_steps"] == 0:
        return "random init + fine-tune"
    if a["num_inner_steps"] == 0:
        return "pretrained multi-task + fine-tune"
    if a.get("cpu_budget"):
        goal = "goal square" if a.get("goal_box") else "Euclidean goal"  # checkpoints without the field: Euclidean
        return (
            f"MAML {a['policy'].upper()}, {a['outer_optimizer'].upper()} {a['tasks_per_batch']} x "
            f"{a['fast_batch_size']}, {a['cpu_budget']:g} CPU-s budget, {goal}"
        )
    return f"MAML {a['policy'].upper()}, {a['outer_steps']} outer steps"


def load_runs(out):
    """[(checkpoint path, checkpoint dict, eval.json dict)]; refuses runs of an older version of a task."""
    runs = []
    for ckpt in sorted(glob.glob(os.path.join(out, "*", "runs", "*", "*", "maml_ssm*.cleanrl_model"))):
        c = torch.load(ckpt, map_location="cpu", weights_only=False)
        if c.get("task_version", 1) != TASK_VERSIONS[c["args"]["task"]]:  # never pool old dynamics with current
            raise ValueError(
                f"{ckpt} was trained on an older {c['args']['task']} (version "
                f"{c.get('task_version', 1)}); delete its sweep directory and rerun"
            )
        with open(os.path.join(os.path.dirname(ckpt), "eval.json")) as f:
            runs.append((ckpt, c, json.load(f)))
    return runs


def mean_cells(R, cis):
    """mean ± std across seeds of the per-seed means (several seeds), or ± 95% CI over test tasks (one seed)."""
    if len(R) > 1:
        return [f"{m:.2f} ± {s:.2f}" for m, s in zip(R.mean(0), R.std(0, ddof=1))]
    return [f"{m:.2f} ± {c:.2f}" for m, c in zip(R[0], cis[0])]


def arm_summary(rs, below_two=float("nan")):
    """One arm's runs [(seed, returns after 0..3 steps, iterations)] in seed order: its JSON entry (the per-seed returns,
    their mean and 95% Student-t half-widths over seeds, the iterations) and its table cells from the seed count on."""
    rs = sorted(rs)
    R = np.array([r[1] for r in rs])
    its = [r[2] for r in rs]
    half = t_ci95_half_width(R, axis=0, below_two=below_two)
    entry = {
        "seeds": [r[0] for r in rs],
        "per_seed": R.tolist(),
        "mean": R.mean(0).tolist(),
        "ci95": half.tolist(),
        "iterations": its,
    }
    cells = f"{len(rs)} | {np.mean(its):.0f} ({min(its)}–{max(its)}) | " + " | ".join(
        f"{m:.2f} ± {h:.2f}" for m, h in zip(R.mean(0), half)
    )
    return entry, cells


def point_nav(runs, report):
    arms = {}
    for _ckpt, c, ev in runs:
        a = c["args"]
        if a["task"] != "point-nav-2d":
            continue
        arms.setdefault(arm_of(a), []).append(
            {
                "seed": a["seed"],
                "ret": [ev["returns_after_steps"][k] for k in "0123"],
                "ci": [ev["ci95"][k] for k in "0123"],
                "wall": c.get("train_wall_time", float("nan")),
                "cpu": c.get("train_cpu_time", float("nan")),
                "params": c["param_count"],
                "steps": c.get("outer_steps_done", a["outer_steps"]),
                "tasks": ev["num_tasks"],
            }
        )
    lines = [
        "| method | params | seeds | outer steps | 0 steps | 1 step | 2 steps | 3 steps "
        "| meta-train wall s | meta-train CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| MAML paper, Table 4 (MLP, TRPO) | | | | " + " | ".join(f"{v:.2f}" for v in PAPER) + " | | |",
    ]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(4), PAPER, "k--", marker="s", label="MAML paper (Table 4)")
    for arm, rs in arms.items():
        R = np.array([r["ret"] for r in rs])
        steps = sorted({r["steps"] for r in rs})  # a --cpu-budget run stops after a seed-dependent number of steps
        steps = str(steps[0]) if len(steps) == 1 else f"{steps[0]}–{steps[-1]}"
        lines.append(
            f"| {arm} | {rs[0]['params']} | {','.join(str(r['seed']) for r in rs)} | {steps} | "
            + " | ".join(mean_cells(R, [r["ci"] for r in rs]))
            + f" | {np.mean([r['wall'] for r in rs]):.0f} | {np.mean([r['cpu'] for r in rs]):.0f} |"
        )
        ax.errorbar(
            range(4), R.mean(0), yerr=R.std(0, ddof=1) if len(rs) > 1 else rs[0]["ci"], marker="o", capsize=3, label=arm
        )
    ax.set_xticks(range(4))
    ax.set_xlabel("inner policy-gradient steps on the test task")
    ax.set_ylabel("return (40 fresh test tasks)")
    ax.set_title("point-nav-2d: return after k adaptation steps")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(report, "point_nav_adaptation.png"))
    caption = (
        "± is the sample std across seeds (several seeds) or the normal 95% CI, 1.96 sample sd / √n, over test tasks "
        "(one seed).\n"
    )
    return arms, "\n".join(lines) + "\n\n" + caption


def training_curves(runs, report):
    """Pre- and post-adaptation return of the training meta-batches, from each run's TensorBoard log.
    Returns what it drew: {label: {tag: values}}."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    drawn = {}
    for ckpt, c, _ in runs:
        a = c["args"]
        if a["task"] != "point-nav-2d" or a["outer_steps"] == 0:
            continue
        scalars = read_scalars(os.path.dirname(ckpt))
        if not scalars:
            continue
        budget = f" TRPO {'square' if a.get('goal_box') else 'disc'}" if a.get("cpu_budget") else ""
        label = f"{a['policy']}{budget}{' (no inner step)' if a['num_inner_steps'] == 0 else ''} s{a['seed']}"
        for ax, tag in zip(axes, ["meta/pre_adapt_return", "meta/post_adapt_return"]):
            if tag in scalars:
                values = scalars[tag][1]
                ax.plot(np.arange(1, len(values) + 1), values, label=label, lw=1.2)
                drawn.setdefault(label, {})[tag] = values.tolist()
    for ax, t in zip(axes, ["before adaptation (theta)", "after one inner step (theta')"]):
        ax.set_title(f"point-nav-2d training meta-batches: {t}", fontsize=9)
        ax.set_xlabel("outer iteration")
    axes[0].set_ylabel("mean return")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=7)
    save_figure(fig, os.path.join(report, "point_nav_training.png"))
    return drawn


def other_tasks(runs):
    """cartpole-physics (test tasks from held-out physics ranges) and halfcheetah-vel: eval returns after 0..3
    inner steps, mean ± std over seeds of the per-seed means, then every seed with its 95% CI over test tasks."""
    others, text = {}, ""
    for _ckpt, c, ev in runs:
        a = c["args"]
        if a["task"] == "point-nav-2d":
            continue
        others.setdefault(a["task"], {}).setdefault(arm_of(a), []).append(
            {
                "seed": a["seed"],
                "ret": ev["returns_after_steps"],
                "ci": ev["ci95"],
                "tasks": ev["num_tasks"],
                "wall": c.get("train_wall_time", float("nan")),
                "cpu": c.get("train_cpu_time", float("nan")),
                "params": c["param_count"],
                "steps": a["outer_steps"],
                "batch": f"{a['tasks_per_batch']} x {a['fast_batch_size']}",
                "horizon": a["max_episode_steps"],
            }
        )
    for task in sorted(others):
        for arm, rs in others[task].items():
            rs.sort(key=lambda r: r["seed"])
            ks = sorted(rs[0]["ret"], key=int)
            R = np.array([[r["ret"][k] for k in ks] for r in rs])
            r0 = rs[0]
            text += (
                f"\n### {task}: {arm}, eval returns after k inner steps ({r0['tasks']} fresh test tasks per seed)\n\n"
                f"{r0['params']} parameters, outer steps: {r0['steps']} of {r0['batch']} episodes (tasks x episodes), "
                f"horizon {r0['horizon']}.\n\n"
                "| seeds | "
                + " | ".join(f"{k} steps" for k in ks)
                + " | meta-train wall s | meta-train CPU s |\n|---|"
                + "---|" * (len(ks) + 2)
                + "\n"
            )
            cells = (
                [f"{m:.2f} ± {s:.2f}" for m, s in zip(R.mean(0), R.std(0, ddof=1))]
                if len(rs) > 1
                else [f"{m:.2f}" for m in R[0]]
            )
            text += (
                f"| mean over {len(rs)} seed(s) ({','.join(str(r['seed']) for r in rs)}) | "
                + " | ".join(cells)
                + f" | {np.mean([r['wall'] for r in rs]):.0f} | {np.mean([r['cpu'] for r in rs]):.0f} |\n"
            )
            for r in rs:
                text += (
                    f"| seed {r['seed']} | "
                    + " | ".join(f"{r['ret'][k]:.2f} ± {r['ci'][k]:.2f}" for k in ks)
                    + f" | {r['wall']:.0f} | {r['cpu']:.0f} |\n"
                )
            text += (
                "\nFirst row: mean ± std across seeds (no ± with one seed); seed rows: ± the normal 95% CI, 1.96 sample "
                "sd / √n, over test tasks.\n"
            )
    return others, text


def protocol(runs, report):
    """The policy comparison under one fixed protocol (sweeps named protocol_*): per task and policy, the returns
    after 0..3 steps as the mean over seeds with a 95% Student-t CI, and the TRPO iterations each seed got in its CPU
    budget; protocol_table.md and protocol.png. Returns {task: {policy: {...}}}."""
    rows = {}
    for ckpt, c, ev in runs:
        if os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(ckpt))))).startswith("protocol"):
            a = c["args"]
            rows.setdefault(a["task"], {}).setdefault(a["policy"], []).append(
                (a["seed"], [ev["returns_after_steps"][k] for k in "0123"], c.get("outer_steps_done", a["outer_steps"]))
            )
    if not rows:
        return {}, ""
    lines = [
        "| task | policy | seeds | TRPO iterations, mean (range) | 0 steps | 1 step | 2 steps | 3 steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.6), squeeze=False)
    summary = {}
    for ax, task in zip(axes[0], sorted(rows)):
        for policy, rs in sorted(rows[task].items()):
            entry, cells = arm_summary(rs, below_two=0.0)
            summary.setdefault(task, {})[policy] = entry
            lines.append(f"| {task} | {policy} | {cells} |")
            label = f"{policy} ({np.mean(entry['iterations']):.0f} it.)"
            ax.errorbar(range(4), entry["mean"], yerr=entry["ci95"], marker="o", capsize=3, label=label)
        ax.set(
            title=task, xticks=range(4), xlabel="inner gradient steps on the test task", ylabel="return (95% CI over seeds)"
        )
        ax.legend(fontsize=7)
    save_figure(fig, os.path.join(report, "protocol.png"))
    text = "\n".join(lines) + "\n\n± is the 95% Student-t CI over seeds of the per-seed mean over test tasks.\n"
    with open(os.path.join(report, "protocol_table.md"), "w") as f:
        f.write(text)
    return summary, text


def adapt_tables(out, report):
    """Test-time adaptation (adapt.json): a summary per task and arm over seeds, then one table per checkpoint."""
    adapts = []
    for path in sorted(glob.glob(os.path.join(out, "*", "runs", "*", "*", "adapt.json"))):
        with open(path) as f:
            res = json.load(f)
        a = torch.load(os.path.join(os.path.dirname(path), "maml_ssm.cleanrl_model"), map_location="cpu", weights_only=False)[
            "args"
        ]
        adapts.append((path, res, a))
    groups = {}
    for _path, res, a in adapts:
        groups.setdefault((res["task"], arm_of(a)), []).append((a["seed"], res))
    summary, text = {}, ""
    for (task, arm), items in sorted(groups.items()):
        items.sort(key=lambda t: t[0])
        seeds = [s for s, _ in items]
        res0 = items[0][1]
        ks = sorted(next(iter(res0["results"].values()))["returns_after_steps"], key=int)
        text += (
            f"\n### adapt summary: {task}, {arm}, seeds {','.join(map(str, seeds))} ({res0['num_tasks']} test tasks "
            f"per seed, lr {res0['adapt_lr']})\n\nmean ± std across seeds of the per-seed mean return over test tasks "
            "(no ± with one seed); 0 steps is the unadapted policy (no-adaptation level).\n\n"
            "| adapter/objective | seeds | "
            + " | ".join(f"{k} steps" for k in ks)
            + " | guard fired | final drift |\n|---|---|"
            + "---|" * (len(ks) + 2)
            + "\n"
        )
        fig, ax = plt.subplots(figsize=(6.5, 4))
        names = [n for n in res0["results"] if all(n in r["results"] for _, r in items)]
        summary[f"{task} / {arm}"] = {"seeds": seeds, "results": {}}
        for i, name in enumerate(names):
            R = np.array([[r["results"][name]["returns_after_steps"][k] for k in ks] for _, r in items])
            sd = R.std(0, ddof=1) if len(items) > 1 else np.zeros(len(ks))
            guard = np.mean([r["results"][name]["guard_fired_frac"] for _, r in items])
            drift = np.mean([r["results"][name]["final_drift"] for _, r in items])
            text += (
                f"| {name} | {len(items)} | "
                + " | ".join(f"{m:.2f}" + (f" ± {s:.2f}" if len(items) > 1 else "") for m, s in zip(R.mean(0), sd))
                + f" | {guard:.2f} | {drift:.3f} |\n"
            )
            summary[f"{task} / {arm}"]["results"][name] = {
                "mean": R.mean(0).tolist(),
                "std": sd.tolist(),
                "per_seed": R.tolist(),
            }
            # small x offsets so the error bars of the 6 lines do not hide each other
            x = np.array([int(k) for k in ks]) + (i - (len(names) - 1) / 2) * 0.03
            ax.errorbar(x, R.mean(0), yerr=sd, marker="o", capsize=3, label=name)
        # theta_0's level (an adapt.json without it: offline, every run's entry 0 is that level)
        base = np.mean(
            [
                r["no_adaptation"]["return"] if "no_adaptation" in r else r["results"][names[0]]["returns_after_steps"]["0"]
                for _, r in items
            ]
        )
        ax.axhline(base, color="k", ls="--", lw=1, label=f"no adaptation (theta_0): {base:.2f}")
        ax.set_xticks([int(k) for k in ks])
        ax.set_xlabel("adaptation steps on the test task")
        ax.set_ylabel(f"return ({res0['num_tasks']} test tasks per seed)")
        ax.set_title(f"{task}, {arm}: adapt, {len(items)} seed(s), bars = std across seeds", fontsize=9)
        ax.legend(fontsize=7)
        slug = "".join(ch if ch.isalnum() else "_" for ch in arm.lower())
        save_figure(fig, os.path.join(report, f"adapt_summary_{task}_{slug}.png"))
    # one table per adapt.json: returns after 0..K steps, mean ± 95% CI over test tasks
    for path, res, a in adapts:
        seed = a["seed"]
        with open(os.path.join(os.path.dirname(path), "eval.json")) as f:
            ev = json.load(f)
        ks = sorted(next(iter(res["results"].values()))["returns_after_steps"], key=int)
        text += (
            f"\n### adapt: {res['task']}, {arm_of(a)}, seed {seed}, {res['num_tasks']} test tasks, lr {res['adapt_lr']}\n\n"
            f"eval (meta-learned rule, alpha then alpha/2) on {ev['num_tasks']} tasks: "
            + ", ".join(f"{k}: {v:.2f} ± {ev['ci95'][k]:.2f}" for k, v in ev["returns_after_steps"].items())
            + "\n\n"
            "| adapter/objective | "
            + " | ".join(f"{k} steps" for k in ks)
            + " | guard fired | final drift |\n|---|"
            + "---|" * (len(ks) + 2)
            + "\n"
        )
        for name, r in res["results"].items():
            text += (
                f"| {name} | "
                + " | ".join(f"{r['returns_after_steps'][k]:.2f} ± {r['ci95'][k]:.2f}" for k in ks)
                + f" | {r['guard_fired_frac']:.2f} | {r['final_drift']:.3f} |\n"
            )
        figure = os.path.join(os.path.dirname(path), "adapt.png")
        if os.path.exists(figure):
            shutil.copy(figure, os.path.join(report, f"adapt_{res['task']}_seed{seed}.png"))
    return summary, text


def speed(out, report):
    """Cost of a meta-iteration per arm ({mlp, ssm} x {trpo, promp}) from the runs of benchmark/maml_ssm.sh --speed
    (<out>/<policy>_<optimizer>/r<round>/<run>): CPU-seconds per iteration (meta/train_cpu_time over
    meta/outer_steps_done) and the ratios the pairs of one round give; speed_table.md and speed.json."""
    arms = {}
    for run_dir in sorted(glob.glob(os.path.join(out, "*_*", "r*", "*"))):
        scalars = read_scalars(run_dir)
        if "meta/train_cpu_time" not in scalars:
            continue
        arm = os.path.basename(os.path.dirname(os.path.dirname(run_dir)))
        round_id = int(os.path.basename(os.path.dirname(run_dir))[1:])
        cpu = float(scalars["meta/train_cpu_time"][1][-1])
        steps = float(scalars["meta/outer_steps_done"][1][-1])
        wall = float(np.median(scalars["meta/iteration_time"][1]))
        arms.setdefault(arm, {})[round_id] = {"cpu_s_per_it": cpu / steps, "median_wall_s_per_it": wall, "iterations": steps}
    if not arms:
        raise ValueError(f"no finished --speed runs under {out!r}")
    lines = ["| policy | outer optimizer | rounds | CPU s/it, mean (range) | median wall s/it |", "|---|---|---|---|---|"]
    for arm in sorted(arms):
        policy, optimizer = arm.split("_")
        cpu = [r["cpu_s_per_it"] for r in arms[arm].values()]
        wall = [r["median_wall_s_per_it"] for r in arms[arm].values()]
        lines.append(
            f"| {policy.upper()} | {optimizer.upper()} | {len(cpu)} | {np.mean(cpu):.2f} ({min(cpu):.2f}–{max(cpu):.2f}) | "
            f"{np.median(wall):.2f} |"
        )
    ratios = {}
    for name, num, den, aim in (
        ("MLP: ProMP / TRPO", "mlp_promp", "mlp_trpo", None),
        ("SSM: ProMP / TRPO", "ssm_promp", "ssm_trpo", 0.35),
        ("ProMP: SSM / MLP", "ssm_promp", "mlp_promp", 1.5),
        ("TRPO: SSM / MLP", "ssm_trpo", "mlp_trpo", None),
    ):
        rounds = sorted(set(arms.get(num, {})) & set(arms.get(den, {})))
        r = [arms[num][k]["cpu_s_per_it"] / arms[den][k]["cpu_s_per_it"] for k in rounds]
        if r:
            ratios[name] = {"per_round": r, "aim": aim}
    lines += ["", "| ratio of CPU s/it, paired by round | mean (range) | aim |", "|---|---|---|"]
    for name, r in ratios.items():
        aim = "" if r["aim"] is None else f"≤ {r['aim']}"
        lines.append(
            f"| {name} | {np.mean(r['per_round']):.2f} ({min(r['per_round']):.2f}–{max(r['per_round']):.2f}) | {aim} |"
        )
    os.makedirs(report, exist_ok=True)
    return write_table_and_json(report, "speed", lines, {"arms": arms, "ratios": ratios})


def promp_study(runs, report):
    """The pre-registered ProMP comparison (docs/maml_ssm.md): per policy, the returns after 0..3 steps over seeds with
    95% Student-t CIs, and the verdict of each criterion; promp_study_table.md, promp_study.json, promp_study.png, and a
    copy of every run's eval.json (eval_{policy}_s{seed}.json)."""
    rows = {}
    for ckpt, c, ev in runs:
        a = c["args"]
        promp = c.get("script") == "maml_ssm_promp" or a.get("outer_optimizer") == "promp"
        if not promp or a["task"] != "point-nav-2d":
            continue
        # every run's eval.json beside the table, to be committed with it
        shutil.copy(
            os.path.join(os.path.dirname(ckpt), "eval.json"), os.path.join(report, f"eval_{a['policy']}_s{a['seed']}.json")
        )
        returns = [ev["returns_after_steps"][k] for k in "0123"]
        rows.setdefault(a["policy"], []).append((a["seed"], returns, c.get("outer_steps_done", a["outer_steps"])))
    if set(rows) != {"mlp", "ssm"} or min(len(r) for r in rows.values()) < 2:
        raise ValueError(f"the ProMP study needs MLP and SSM runs of >= 2 seeds each; found {sorted(rows)}")
    summary = {}
    lines = [
        "| policy, ProMP | seeds | iterations, mean (range) | 0 steps | 1 step | 2 steps | 3 steps |",
        "|---|---|---|---|---|---|---|",
    ]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for policy in ("mlp", "ssm"):
        summary[policy], cells = arm_summary(rows[policy])
        lines.append(f"| {policy.upper()} | {cells} |")
        entry = summary[policy]
        ax.errorbar(range(4), entry["mean"], yerr=entry["ci95"], marker="o", capsize=3, label=f"{policy.upper()}, ProMP")
    trpo = np.array(TRPO_MLP_STEP1)
    trpo_half = t_ci95_half_width(trpo)
    lines.append(f"| MLP, TRPO (documented rows) | {len(trpo)} | | | {trpo.mean():.2f} ± {trpo_half:.2f} | | |")
    ax.errorbar([1], [trpo.mean()], yerr=[trpo_half], marker="s", capsize=3, color="grey", label="MLP, TRPO (documented)")
    ax.set(xticks=range(4), xlabel="inner gradient steps on the test task", ylabel="return (95% CI over seeds)")
    ax.set_title("point-nav-2d, 15 CPU-minutes per run")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(report, "promp_study.png"))
    diff, diff_half = welch_diff_ci95([r[1] for r in summary["mlp"]["per_seed"]], trpo)
    c1 = diff + diff_half >= 0
    mlp = np.array(summary["mlp"]["mean"])
    ssm = np.array(summary["ssm"]["mean"])
    c2 = bool(all(ssm[k] >= mlp[k] for k in (1, 2, 3)))
    summary["criterion_1"] = {"difference": diff, "ci95": diff_half, "pass": bool(c1)}
    summary["criterion_2"] = {"ssm_minus_mlp": (ssm - mlp)[1:].tolist(), "pass": c2}
    lines += [
        "",
        "± is the 95% Student-t CI over seeds of the per-seed mean over 40 test tasks.",
        "",
        f"- Criterion 1 (ProMP's MLP no worse than TRPO's MLP after one step, within the CI): ProMP − TRPO = "
        f"{diff:.2f} ± {diff_half:.2f} (95% Welch t-interval): **{'pass' if c1 else 'fail'}**.",
        "- Criterion 2 (the SSM's return after 1–3 steps at least the MLP's, ProMP, same budget): SSM − MLP = "
        + " / ".join(f"{d:.2f}" for d in (ssm - mlp)[1:])
        + f" after 1 / 2 / 3 steps: **{'pass' if c2 else 'fail'}**.",
    ]
    return write_table_and_json(report, "promp_study", lines, summary)


OPTIMIZER_NAMES = {"trpo": "TRPO", "promp": "ProMP"}


def equal_cpu_study(runs, report):
    """The pre-registered equal-CPU comparison (docs/results/maml_ssm/equal_cpu_study/PROTOCOL.md): per outer optimizer
    (TRPO: maml_ssm.py, ProMP: maml_ssm_promp.py) and policy, the returns after 0..3 steps over seeds with 95% Student-t
    CIs, and per optimizer the verdict of the criterion (the SSM's mean return after 1, 2 and 3 steps each at least the
    MLP's); equal_cpu_study_table.md, equal_cpu_study.json, equal_cpu_study.png and a copy of every run's eval.json
    (eval_{optimizer}_{policy}_s{seed}.json)."""
    rows = {}
    for ckpt, c, ev in runs:
        a = c["args"]
        optimizer = a.get("outer_optimizer", "trpo")
        if c.get("script") == "maml_ssm_promp":
            optimizer = "promp"
        if a["task"] != "point-nav-2d" or optimizer not in ("trpo", "promp"):
            continue
        name = f"eval_{optimizer}_{a['policy']}_s{a['seed']}.json"
        shutil.copy(os.path.join(os.path.dirname(ckpt), "eval.json"), os.path.join(report, name))
        returns = [ev["returns_after_steps"][k] for k in "0123"]
        its = c.get("outer_steps_done", a["outer_steps"])
        rows.setdefault(optimizer, {}).setdefault(a["policy"], []).append((a["seed"], returns, its))
    for optimizer in ("trpo", "promp"):
        found = rows.get(optimizer, {})
        if set(found) != {"mlp", "ssm"} or min(len(r) for r in found.values()) < 2:
            raise ValueError(f"the study needs {optimizer} runs of MLP and SSM of >= 2 seeds each; found {sorted(found)}")
    summary = {}
    lines = [
        "| outer optimizer | policy | seeds | iterations, mean (range) | 0 steps | 1 step | 2 steps | 3 steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for optimizer in ("trpo", "promp"):
        summary[optimizer] = {}
        for policy in ("mlp", "ssm"):
            summary[optimizer][policy], cells = arm_summary(rows[optimizer][policy])
            lines.append(f"| {optimizer.upper()} | {policy.upper()} | {cells} |")
    lines += ["", "± is the 95% Student-t CI over seeds of the per-seed mean over 40 test tasks.", ""]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, optimizer in zip(axes, ("trpo", "promp")):
        for policy in ("mlp", "ssm"):
            entry = summary[optimizer][policy]
            label = f"{policy.upper()} ({np.mean(entry['iterations']):.0f} iterations)"
            ax.errorbar(range(4), entry["mean"], yerr=entry["ci95"], marker="o", capsize=3, label=label)
        title = f"{OPTIMIZER_NAMES[optimizer]}, 15 CPU-minutes"
        ax.set(xticks=range(4), xlabel="inner gradient steps on the test task", title=title)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("return (95% CI over seeds)")
    save_figure(fig, os.path.join(report, "equal_cpu_study.png"))
    for optimizer in ("trpo", "promp"):
        mlp = np.array(summary[optimizer]["mlp"]["mean"])
        ssm = np.array(summary[optimizer]["ssm"]["mean"])
        ok = bool(all(ssm[k] >= mlp[k] for k in (1, 2, 3)))
        summary[optimizer]["criterion"] = {"ssm_minus_mlp": (ssm - mlp)[1:].tolist(), "pass": ok}
        lines.append(
            f"- {optimizer.upper()}: the SSM's return after 1–3 steps at least the MLP's at equal CPU: SSM − MLP = "
            + " / ".join(f"{d:.2f}" for d in (ssm - mlp)[1:])
            + f" after 1 / 2 / 3 steps: **{'pass' if ok else 'fail'}**."
        )
    return write_table_and_json(report, "equal_cpu_study", lines, summary)


HYBRID_TASKS = {"hybrid_halfcheetah": "halfcheetah-vel", "hybrid_cartpole": "cartpole-physics"}
HYBRID_STEPS = 5  # the pre-registered comparison is after 5 adaptation steps


def hybrid_verdict(low, high):
    """The pre-registered reading of the paired 95% CI of hybrid - standard."""
    if low > 0:
        return "hybrid better"
    if high < 0:
        return "hybrid worse"
    if np.isnan(low):
        return "undetermined (fewer than two seeds)"
    return "no difference detected"


def learned(returns):
    """The pre-registered learning check of one run: mean post-adaptation meta-batch return over its last quarter of
    outer steps above that over its first quarter."""
    q = max(len(returns) // 4, 1)
    return bool(np.mean(returns[-q:]) > np.mean(returns[:q]))


def hybrid_section(task, seeds, objective):
    """One task's part of the standard-vs-hybrid study from its runs (sorted by seed): the summary entry (runs, the
    paired hybrid - standard difference after HYBRID_STEPS steps with its 95% Student-t CI and verdict, whether every
    seed learned) and the table's lines."""
    none = np.array([r["no_adaptation"] for r in seeds])
    std = np.array([r["standard"] for r in seeds])
    hyb = np.array([r["hybrid"] for r in seeds])
    diff = hyb[:, HYBRID_STEPS] - std[:, HYBRID_STEPS]
    half = t_ci95_half_width(diff)
    verdict = hybrid_verdict(diff.mean() - half, diff.mean() + half)
    its = [r["outer_steps_done"] for r in seeds]
    entry = {
        "runs": seeds,
        "difference_after_5": float(diff.mean()),
        "difference_ci95": half,
        "verdict": verdict,
        "learned_all_seeds": all(r["learned"] for r in seeds),
    }

    def cells(R):
        return " | ".join(f"{R[:, k].mean():.2f} ± {t_ci95_half_width(R[:, k]):.2f}" for k in range(6))

    title = f"### {task}: SSM, buffer {seeds[0]['buffer_size']:,}, experience weight {seeds[0]['experience_weight']}"
    if objective != "pg":
        title += f", objective `{objective}`"
    lines = [
        title,
        "",
        f"{len(seeds)} seeds ({', '.join(str(r['seed']) for r in seeds)}), outer steps done {min(its)}–{max(its)}.",
        "",
        "| adapter | 0 steps | 1 | 2 | 3 | 4 | 5 |",
        "|---|---|---|---|---|---|---|",
        f"| no adaptation (θ₀) | {none.mean():.2f} ± {t_ci95_half_width(none):.2f} | | | | | |",
        f"| standard | {cells(std)} |",
        f"| hybrid | {cells(hyb)} |",
        "",
        f"Hybrid − standard after {HYBRID_STEPS} steps (paired over seeds): {diff.mean():.2f} ± {half:.2f}: "
        f"**{verdict}**. Meta-training learned (last quarter above first quarter) in "
        f"{sum(r['learned'] for r in seeds)} of {len(seeds)} seeds.",
        "",
    ]
    return entry, lines


def hybrid_benchmark(out, report, objective="pg"):
    """The pre-registered standard-vs-hybrid study (PREREGISTRATION.md beside the table): per task, the no-adaptation
    row and the returns after 0..5 adaptation steps of both adapters with `objective`, mean over seeds with 95%
    Student-t CIs, the paired hybrid - standard difference after 5 steps with its verdict, and whether meta-training
    learned; hybrid_table.md, hybrid.json and hybrid_curves.png (the meta-training curves)."""
    os.makedirs(report, exist_ok=True)
    summary = {}
    lines = []
    fig, axes = plt.subplots(1, len(HYBRID_TASKS), figsize=(10, 3.6))
    for ax, (sweep_name, task) in zip(axes, HYBRID_TASKS.items()):
        seeds = []
        for ckpt in sorted(glob.glob(os.path.join(out, sweep_name, "runs", "*", "*", "maml_ssm.cleanrl_model"))):
            adapt_path = os.path.join(os.path.dirname(ckpt), "adapt.json")
            if not os.path.isfile(adapt_path):
                continue
            with open(adapt_path) as f:
                res = json.load(f)
            c = torch.load(ckpt, map_location="cpu", weights_only=False)
            steps, returns = read_scalars(os.path.dirname(ckpt))["charts/episodic_return"]
            ax.plot(steps, returns, label=f"seed {c['args']['seed']}")
            seeds.append(
                {
                    "seed": c["args"]["seed"],
                    "outer_steps_done": c["outer_steps_done"],
                    "buffer_size": c["args"]["buffer_size"],
                    "experience_weight": res["experience_weight"],
                    "no_adaptation": res["no_adaptation"]["return"],
                    "standard": [res["results"][f"standard/{objective}"]["returns_after_steps"][str(k)] for k in range(6)],
                    "hybrid": [res["results"][f"hybrid/{objective}"]["returns_after_steps"][str(k)] for k in range(6)],
                    "learned": learned(returns),
                }
            )
        ax.set(title=f"{task}, SSM", xlabel="environment steps", ylabel="post-adaptation return (meta-batch)")
        ax.legend(fontsize=7)
        if not seeds:
            raise ValueError(f"no adapted checkpoint under {os.path.join(out, sweep_name)}; run the study first")
        seeds.sort(key=lambda r: r["seed"])
        summary[task], section = hybrid_section(task, seeds, objective)
        lines += section
    lines.append("± is the 95% Student-t CI over seeds of the per-seed mean over the test tasks.")
    save_figure(fig, os.path.join(report, "hybrid_curves.png"))
    return write_table_and_json(report, "hybrid", lines, summary)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the sweeps' output directory (benchmark/out/maml_ssm_full)")
    p.add_argument("--report", required=True, help="where the tables, JSON and PNGs go")
    p.add_argument("--speed", action="store_true", help="table the cost runs of benchmark/maml_ssm.sh --speed")
    p.add_argument("--promp-study", action="store_true", help="table the runs of benchmark/maml_ssm.sh --promp-study")
    p.add_argument("--hybrid-benchmark", action="store_true", help="table benchmark/maml_ssm.sh --hybrid-benchmark")
    p.add_argument("--equal-cpu-study", action="store_true", help="table benchmark/maml_ssm.sh --equal-cpu-study")
    p.add_argument("--objective", default="pg", help="--hybrid-benchmark: the adapt objective to table (pg, dynamics)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.out):
        print(f"maml_ssm_report: --out {args.out!r} is not a directory; run benchmark/maml_ssm.sh first", file=sys.stderr)
        return 2
    if args.speed or args.promp_study or args.hybrid_benchmark or args.equal_cpu_study:
        try:
            if args.speed:
                text = speed(args.out, args.report)
            elif args.hybrid_benchmark:
                text = hybrid_benchmark(args.out, args.report, args.objective)
            elif args.equal_cpu_study:
                os.makedirs(args.report, exist_ok=True)
                text = equal_cpu_study(load_runs(args.out), args.report)
            else:
                os.makedirs(args.report, exist_ok=True)
                text = promp_study(load_runs(args.out), args.report)
        except (ValueError, FileNotFoundError) as e:
            print(f"maml_ssm_report: {e}", file=sys.stderr)
            return 2
        print(text)
        return 0
    try:
        runs = load_runs(args.out)
    except (ValueError, FileNotFoundError) as e:
        print(f"maml_ssm_report: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.report, exist_ok=True)
    arms, text = point_nav(runs, args.report)
    training_curves(runs, args.report)
    others, more = other_tasks(runs)
    summary, adapt_text = adapt_tables(args.out, args.report)
    compared, protocol_text = protocol(runs, args.report)
    text += more + adapt_text + protocol_text
    for name, obj in (
        ("point_nav_runs.json", arms),
        ("other_tasks_runs.json", others),
        ("adapt_summary.json", summary),
        ("protocol_runs.json", compared),
    ):
        with open(os.path.join(args.report, name), "w") as f:
            json.dump(obj, f, indent=2)
    with open(os.path.join(args.report, "point_nav_table.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
