"""Which corners of the goal square a maml_ssm point-nav-2d checkpoint runs away in (docs/maml_ssm.md, "Run-aways sit
on the side of the square opposite the unadapted policy's drift").

For each checkpoint: the unadapted policy's mean action at the first step (from the origin, every input zero: the
direction it walks before it has seen a reward), then, for each corner of the goal square, NUM_GOALS goals drawn
uniformly in [LOW, 0.5]^2 with that corner's signs (the same draws mirrored into every corner), adapted and sampled
as `maml_ssm.py eval` does (alpha, then alpha * eval_later_lr_scale; the checkpoint's batch per task and step). It
prints the mean and median return after 0..K steps and the number of tasks whose return is below THRESHOLD after
each step (a run-away task: the noise-free straight walk to the farthest goal costs about -30).

Usage: python benchmark/probes/maml_point_nav_corners.py CHECKPOINT [CHECKPOINT ...] [--num-goals 40] [--num-steps 3]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_common import SCRIPT, load_script  # noqa: E402

m = load_script(SCRIPT)
LOW = 0.25  # corner regions: [LOW, 0.5]^2 with signs
THRESHOLD = -15.0
CORNERS = ((1, 1), (-1, 1), (-1, -1), (1, -1))


@torch.no_grad()
def first_mean_action(model, params):
    """The mean action of the unadapted policy at the first step of an episode (position, previous action and
    previous reward all zero), clipped to the action box as the environment clips it."""
    obs, prev_a, prev_r = torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 1)
    out = m.functional_call(model, params, (model.make_input(obs, prev_a, prev_r)[None], torch.tensor([[True]]),
                                            model.initial_state(1)), {"scan": False})
    return out["pi"][0, 0].clamp(-1.0, 1.0).tolist()


def corners(checkpoint, num_goals=40, num_steps=3, seed=123):
    model, args, _ = m.load_checkpoint(checkpoint)
    if args.task != "point-nav-2d":
        raise ValueError(f"{checkpoint!r} is a {args.task} checkpoint; this probe is for point-nav-2d")
    args.fast_batch_size = args.eval_episodes or args.fast_batch_size
    lrs = [args.inner_lr] + [args.inner_lr * args.eval_later_lr_scale] * max(num_steps - 1, 0)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    base = np.random.default_rng(seed).uniform(LOW, 0.5, size=(num_goals, 2))
    rows = []
    for sx, sy in CORNERS:
        torch.manual_seed(args.seed)
        gen = torch.Generator().manual_seed(args.seed)
        _, returns = m.sample_task_batches(model, theta, base * np.array([sx, sy]), args, gen, num_steps, lrs)
        r = [x.numpy() for x in returns]
        rows.append({"corner": [sx, sy], "mean": [float(x.mean()) for x in r], "median": [float(np.median(x)) for x in r],
                     "tasks_below_threshold": [int((x < THRESHOLD).sum()) for x in r]})
    return {"checkpoint": checkpoint, "seed": args.seed, "num_goals": num_goals,
            "first_mean_action": first_mean_action(model, theta), "rows": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--num-goals", type=int, default=40)
    p.add_argument("--num-steps", type=int, default=3)
    a = p.parse_args(argv)
    if a.num_goals < 1 or a.num_steps < 0:
        print("maml_point_nav_corners: --num-goals must be positive and --num-steps >= 0", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for ckpt in a.checkpoints:
        if not os.path.isfile(ckpt):
            print(f"maml_point_nav_corners: {ckpt!r} does not exist", file=sys.stderr)
            return 2
        try:
            res = corners(ckpt, a.num_goals, a.num_steps)
        except ValueError as e:
            print(f"maml_point_nav_corners: {e}", file=sys.stderr)
            return 2
        x, y = res["first_mean_action"]
        print(f"\n{ckpt} (seed {res['seed']}): unadapted mean action at the first step ({x:.2f}, {y:.2f})\n")
        print("| corner | mean return after 0.. steps | median | tasks below " + f"{THRESHOLD:g} |\n|---|---|---|---|")
        for r in res["rows"]:
            sx, sy = ("+" if s > 0 else "−" for s in r["corner"])
            print(f"| ({sx}x, {sy}y) | {' / '.join(f'{v:.2f}' for v in r['mean'])} | "
                  f"{' / '.join(f'{v:.2f}' for v in r['median'])} | {' / '.join(map(str, r['tasks_below_threshold']))} |")
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
