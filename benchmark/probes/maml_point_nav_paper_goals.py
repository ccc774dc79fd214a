"""maml_ssm point-nav-2d checkpoints measured four ways: on `eval`'s test goals and on the MAML paper test
script's own 40 goals, each under `eval`'s sampler and under the paper's (docs/maml_ssm.md, "The paper's goals and
sampler after the TRPO fix").

The paper's test script (`test_maml_point.py`) draws its test goals once, `np.random.seed(1)` then
`np.random.uniform(-0.5, 0.5, size=(40, 2))`, and adapts every method on those 40 goals. `maml_ssm.py eval` draws 40
fresh goals per checkpoint from the seed's test stream instead. On each goal set this probe adapts as `eval` does
(the checkpoint's seed, alpha then alpha * eval_later_lr_scale, its batch per task and step; on eval's goals this is
eval exactly) and, with `maml_paper_sampler_eval.py`'s stand-in, as the paper's sampler does (episodes still running
when the step count is reached are dropped, which favours short, successful ones). Per goal set, rule and step it
reports the mean and the median return over the goals and the number of goals below THRESHOLD (a run-away task).
With --plot it draws every checkpoint's means and the means and medians over checkpoints next to the paper's Table 4.

Usage: python benchmark/probes/maml_point_nav_paper_goals.py CHECKPOINT [CHECKPOINT ...] [--num-steps 3]
       [--plot PATH.png] [--script PATH] (a patched copy of maml_ssm.py, for checkpoints trained with a probe patch)
       python benchmark/probes/maml_point_nav_paper_goals.py --from-output OUT.txt [OUT.txt ...] --plot PATH.png
       (draws the figure from what earlier runs of the probe printed, without sampling again)
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from maml_paper_sampler_eval import paper_sampler_eval  # noqa: E402
from probe_common import SCRIPT, load_script  # noqa: E402

THRESHOLD = -15.0
GOAL_SETS = ("eval_goals", "paper_goals")
RULES = ("eval_rule", "paper_sampler")
PAPER_TABLE_4 = (-40.41, -11.68, -3.33, -3.23)  # returns after 0 / 1 / 2 / 3 steps


def paper_goals():
    """The 40 goals of the paper's test script, drawn as it draws them (numpy's legacy global generator, seed 1)."""
    return np.random.RandomState(1).uniform(-0.5, 0.5, size=(40, 2))


def summary(task_returns):
    r = np.asarray(task_returns, dtype=np.float64)
    return {"mean": float(r.mean()), "median": float(np.median(r)), "below_threshold": int((r < THRESHOLD).sum())}


def eval_rule(m, checkpoint, goals, num_steps):
    """What `maml_ssm.py eval` samples, with `goals` as the test tasks: per step, each goal's mean return."""
    model, args, _ = m.load_checkpoint(checkpoint)
    args.fast_batch_size = args.eval_episodes or args.fast_batch_size
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    lrs = [args.inner_lr] + [args.inner_lr * args.eval_later_lr_scale] * max(num_steps - 1, 0)
    _, returns = m.sample_task_batches(model, theta, goals, args, gen, num_steps, lrs)
    return [r.numpy() for r in returns]


def probe(m, checkpoint, num_steps=3):
    _, args, _ = m.load_checkpoint(checkpoint)
    if args.task != "point-nav-2d":
        raise ValueError(f"{checkpoint!r} is a {args.task} checkpoint; this probe is for point-nav-2d")
    goal_sets = {"eval_goals": m.sample_tasks(args.task, m.task_streams(args.seed)[1], args.eval_tasks, "test"),
                 "paper_goals": paper_goals()}
    res = {"checkpoint": checkpoint, "seed": args.seed}
    for name, goals in goal_sets.items():
        ours = eval_rule(m, checkpoint, goals, num_steps)
        rows = paper_sampler_eval(m, checkpoint, num_steps=num_steps, tasks=goals)["rows"]
        res[name] = {"eval_rule": [summary(r) for r in ours], "paper_sampler": [summary(r["task_returns"]) for r in rows]}
    return res


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # from the first inner step on: before adaptation every checkpoint is near -40, off this scale (see the table)
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6), sharey=True)
    for ax, (name, rule) in zip(axes, [(g, r) for g in GOAL_SETS for r in RULES]):
        per_seed = np.array([[x["mean"] for x in res[name][rule]] for res in results])[:, 1:]
        steps = np.arange(1, per_seed.shape[1] + 1)
        for i, row in enumerate(per_seed):
            ax.plot(steps, row, color="0.7", lw=0.8, label="one checkpoint" if i == 0 else None)
        ax.plot(steps, per_seed.mean(0), "o-", color="C0", label=f"mean over {len(results)} checkpoints")
        ax.plot(steps, np.median(per_seed, 0), "s-", color="C1", label="median over checkpoints")
        k = min(len(steps), len(PAPER_TABLE_4) - 1)
        ax.plot(steps[:k], PAPER_TABLE_4[1 : k + 1], "k--", marker="x", label="MAML paper, Table 4")
        ax.set_title(f"{name.replace('_', ' ')}, {rule.replace('_', ' ')}", fontsize=10)
        ax.set_xlabel("inner gradient steps")
        ax.set_xticks(steps)
        ax.set_ylim(-25, 0)
    axes[0].set_ylabel("mean return over the goals")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(results):
    """Markdown: each checkpoint's mean over goals after 0.. steps under each goal set and rule, then the mean and
    the median of those over checkpoints, and the paper's Table 4."""
    cols = [(g, r) for g in GOAL_SETS for r in RULES]
    head = " | ".join(f"{g.replace('_', ' ')}, {r.replace('_', ' ')}" for g, r in cols)
    lines = [f"| seed | {head} |", "|---" * (len(cols) + 1) + "|"]
    fmt = lambda values: " / ".join(f"{v:.2f}" for v in values)
    per_seed = {c: np.array([[x["mean"] for x in res[c[0]][c[1]]] for res in results]) for c in cols}
    for i, res in enumerate(results):
        lines.append(f"| {res['seed']} | " + " | ".join(fmt(per_seed[c][i]) for c in cols) + " |")
    for name, f in (("mean", np.mean), ("median", np.median)):
        lines.append(f"| {name} over {len(results)} | " + " | ".join(fmt(f(per_seed[c], 0)) for c in cols) + " |")
    lines.append("| MAML paper, Table 4 | " + " | ".join(fmt(PAPER_TABLE_4) for _ in cols) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="*")
    p.add_argument("--num-steps", type=int, default=3)
    p.add_argument("--plot", default=None, help="write a PNG of every checkpoint's means next to the paper's")
    p.add_argument("--from-output", nargs="+", default=None, help="files holding earlier runs' printed output")
    p.add_argument("--script", default=SCRIPT, help="maml_ssm.py or a patched copy (benchmark/probes/*.patch)")
    a = p.parse_args(argv)
    if (a.from_output is None) == (not a.checkpoints) or (a.from_output is not None and a.plot is None):
        print("maml_point_nav_paper_goals: give checkpoints, or --from-output files with --plot", file=sys.stderr)
        return 2
    if a.plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(a.plot))):
        print(f"maml_point_nav_paper_goals: the folder of --plot {a.plot!r} does not exist", file=sys.stderr)
        return 2
    if a.from_output is not None:
        results = []
        for path in a.from_output:
            if not os.path.isfile(path):
                print(f"maml_point_nav_paper_goals: {path!r} does not exist", file=sys.stderr)
                return 2
            with open(path) as f:
                results += [json.loads(line) for line in f if line.startswith('{"checkpoint"')]
        results.sort(key=lambda res: res["seed"])
        if not results:
            print("maml_point_nav_paper_goals: the --from-output files hold no results of this probe", file=sys.stderr)
            return 2
        print(table(results))
        plot(results, a.plot)
        print(f"wrote {a.plot} from {len(results)} checkpoints")
        return 0
    if a.num_steps < 0 or (a.plot is not None and a.num_steps < 1):
        print("maml_point_nav_paper_goals: --num-steps must be >= 0, and >= 1 with --plot (it draws steps 1..)",
              file=sys.stderr)
        return 2
    for ckpt in a.checkpoints:
        if not os.path.isfile(ckpt):
            print(f"maml_point_nav_paper_goals: {ckpt!r} does not exist", file=sys.stderr)
            return 2
    if not os.path.isfile(a.script):
        print(f"maml_point_nav_paper_goals: --script {a.script!r} does not exist", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    m = load_script(a.script)
    results = []
    for ckpt in a.checkpoints:
        try:
            res = probe(m, ckpt, a.num_steps)
        except ValueError as e:
            print(f"maml_point_nav_paper_goals: {e}", file=sys.stderr)
            return 2
        results.append(res)
        print(f"\n{ckpt} (seed {res['seed']})\n\n| goals | rule | mean after 0.. steps | median | goals below "
              f"{THRESHOLD:g} |\n|---|---|---|---|---|")
        for name in GOAL_SETS:
            for rule in RULES:
                rows = res[name][rule]
                cols = [" / ".join(f"{r[key]:.2f}" for r in rows) for key in ("mean", "median")]
                below = " / ".join(str(r["below_threshold"]) for r in rows)
                print(f"| {name} | {rule} | {cols[0]} | {cols[1]} | {below} |")
        print(json.dumps(res), flush=True)
    print("\n" + table(results))
    if a.plot is not None:
        plot(results, a.plot)
        print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
