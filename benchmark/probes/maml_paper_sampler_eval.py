"""Evaluate maml_ssm checkpoints with the MAML paper code's test sampler (docs/maml_ssm.md, "The paper's test
sampler").

The paper's test script (`test_maml_point.py`, rllab `VPG` with `batch_size=4000`, horizon 100) samples with a
vectorised sampler: batch / horizon = 40 copies of the task's env step in lockstep, each starting a new episode as
soon as one ends, and sampling stops at the first step after which the *finished* episodes hold at least 4,000
steps. The episodes still running then are dropped. Those are more often long ones (an env that is in the middle of
an episode at that moment is more likely to be in a long one), so the finished episodes over-represent short ones,
and in point-nav a short episode is one that reached its goal quickly. The batch's `AverageReturn`, the figure
the paper's table averages over tasks, and the gradient step are both computed from the finished episodes only.

`maml_ssm.py eval` (with `--fill-steps`) instead keeps every episode it starts, in order, until they hold 4,000
steps. This probe swaps in the paper's rule, `lockstep_keep`, and otherwise samples what `eval` samples (same test
tasks, seeds and step sizes alpha then alpha/2). For each step it reports the mean return over tasks under the
paper's rule (what the paper's table would show) and, from the same episodes, the mean return of the first episode
of each of the 40 envs, which no stopping rule selects (an unbiased estimate), so their difference is the rule's
bias on the reported figure. Mean episode lengths of both sets come with them.

Usage: python benchmark/probes/maml_paper_sampler_eval.py CHECKPOINT [CHECKPOINT ...] [--num-tasks 40]
       [--num-steps 3] [--script PATH] (a patched copy of maml_ssm.py, for checkpoints trained with a probe patch)
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_common import SCRIPT, load_script  # noqa: E402


def lockstep_keep(lengths, budget):
    """The paper code's stopping rule. lengths[w, j] is the length of the w-th episode of env j (envs run their
    episodes back to back, all envs stepping together). Sampling stops after the first step at which the finished
    episodes hold >= budget steps; every episode that finished at or before that step is kept (all envs' episodes
    ending on that step included), the rest are dropped. Needs every env's episodes to cover at least 2 x the
    longest episode, so that the stopping step is known. Returns a boolean mask like `lengths`."""
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    done_at = lengths.cumsum(0)  # the step at which each episode finishes
    order = torch.argsort(done_at.reshape(-1), stable=True)
    finished = torch.cumsum(lengths.reshape(-1)[order], 0)
    reached = int((finished < budget).sum())
    if reached == finished.numel():
        raise ValueError(f"the episodes hold {int(finished[-1])} steps, fewer than the budget {budget}")
    stop = done_at.reshape(-1)[order][reached]
    if (done_at[-1] < stop).any():
        raise ValueError("some env's episodes end before the stopping step: sample more of them")
    return done_at <= stop


def make_fill(m, record):
    """A stand-in for maml_ssm.fill_to_steps that applies the paper's rule to each task: the batch it gets is the
    first episode of each of its n envs; it samples further episodes per env (with the task's own parameters)
    until every env's episodes cover 2 x horizon steps, keeps those `lockstep_keep` keeps, and appends to `record`
    for each task: the first episodes' mean return and length, and the kept episodes' mean length, count and
    steps (their mean return is what the script computes from the batch this returns)."""

    def fill(model, batches, plist, task_params, args, gen):
        n, horizon = batches[0]["masks"].shape[1], args.max_episode_steps
        waves = [[b] for b in batches]
        covered = lambda i: sum(w["masks"].sum(0) for w in waves[i])
        while True:
            need = [i for i in range(len(batches)) if covered(i).min() < 2 * horizon]
            if not need:
                break
            env = m.make_env(args, task_params[need], n, gen)
            for i, b in zip(need, m.split_batch(m.rollout(model, [plist[i] for i in need], env, horizon), len(need))):
                waves[i].append(b)
        out = []
        for i in range(len(batches)):
            lengths = torch.stack([w["masks"].sum(0) for w in waves[i]])
            keep = lockstep_keep(lengths, n * horizon)
            returns = torch.stack([m.episode_returns(w) for w in waves[i]])
            kept = [{k: v[:, keep[w]] for k, v in wave.items()} for w, wave in enumerate(waves[i]) if keep[w].any()]
            out.append(m.concat_episodes(kept))
            record.append({"first_return": float(returns[0].mean()),
                           "kept_length": float(lengths[keep].mean()), "first_length": float(lengths[0].mean()),
                           "kept_episodes": int(keep.sum()), "kept_steps": int(lengths[keep].sum())})
        return out

    return fill


def paper_sampler_eval(m, checkpoint, num_tasks=40, num_steps=3, tasks=None):
    """eval's sampling (test tasks, seeds, alpha then alpha/2, eval batch of n episodes' worth of steps) with the
    paper's rule in place of --fill-steps. Per step: the reported return (mean over tasks of the kept episodes'
    mean, which equals the script's returns for that batch), each task's reported return, and the first-episode
    estimate from the same data. `tasks` (one row per task) replaces eval's test tasks when given."""
    model, args, ckpt = m.load_checkpoint(checkpoint)
    args.fast_batch_size = args.eval_episodes or args.fast_batch_size
    args.fill_steps = True  # the paper's sampler counts steps; the stand-in is called where --fill-steps is
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if tasks is None:
        tasks = m.sample_tasks(args.task, m.task_streams(args.seed)[1], num_tasks, "test")
    num_tasks = len(tasks)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    lrs = [args.inner_lr] + [args.inner_lr * 0.5] * max(num_steps - 1, 0)
    record, original = [], m.fill_to_steps
    m.fill_to_steps = make_fill(m, record)
    try:
        _, returns = m.sample_task_batches(model, theta, tasks, args, gen, num_steps, lrs)
    finally:
        m.fill_to_steps = original
    rows = []
    for j, r in enumerate(returns):
        per_task = record[j * num_tasks : (j + 1) * num_tasks]
        mean = lambda key: float(np.mean([t[key] for t in per_task]))
        rows.append({"steps": j, "return": float(r.mean()), "task_returns": r.tolist(),
                     "first_episode_return": mean("first_return"),
                     "kept_length": mean("kept_length"), "first_episode_length": mean("first_length"),
                     "kept_episodes": mean("kept_episodes"), "kept_steps": mean("kept_steps")})
    return {"checkpoint": checkpoint, "seed": args.seed, "rows": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--num-tasks", type=int, default=40)
    p.add_argument("--num-steps", type=int, default=3)
    p.add_argument("--script", default=SCRIPT, help="maml_ssm.py or a patched copy (benchmark/probes/*.patch)")
    a = p.parse_args(argv)
    if a.num_tasks < 1 or a.num_steps < 0:
        print("error: --num-tasks must be >= 1 and --num-steps >= 0", file=sys.stderr)
        return 2
    if not os.path.isfile(a.script):
        print(f"error: --script {a.script!r} does not exist", file=sys.stderr)
        return 2
    m = load_script(a.script)
    for c in a.checkpoints:
        try:
            m.load_checkpoint(c)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    for c in a.checkpoints:
        print(json.dumps(paper_sampler_eval(m, c, a.num_tasks, a.num_steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
