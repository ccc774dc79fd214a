"""Where the return of an adapted point-nav-2d policy goes: a diagnostic of maml_ssm checkpoints (docs/maml_ssm.md,
"Where the return goes after adaptation").

For each checkpoint it samples exactly what `maml_ssm.py eval` samples (same test tasks, seeds, step sizes alpha then
alpha/2), so its returns equal eval.json's, and reports after 0..K inner steps: mean and median return over test
tasks, mean episode length, the fraction of episodes that end at the goal before the horizon, the policy's action
std, and the same task's adapted parameters acting with their mean action (no sampling noise): return, the distance
to the goal where that noise-free policy ends up (median over tasks), and how often it reaches the goal. For scale,
it also reports the return of a controller that steps straight at the goal with the same action noise. Run-away
episodes are counted too: the share that end more than RUNAWAY_DISTANCE from their goal, how many of those passed
within PASS_DISTANCE of it first (overshoots), and the test tasks that have such an episode.

Usage: python benchmark/probes/maml_point_nav_homing.py CHECKPOINT [CHECKPOINT ...] [--num-tasks 40] [--num-steps 3]
       [--episodes N]  (N episodes per task and step, counted in episodes, instead of the checkpoint's eval batch)
       [--script PATH] (a patched copy of maml_ssm.py, for checkpoints trained with a probe patch)
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
RUNAWAY_DISTANCE = 0.5  # an episode that ends this far from its goal left it (goals lie in [-0.5, 0.5]^2)
PASS_DISTANCE = 0.05  # ... and overshot it if it came this close first (half an action step)


def episode_distances(batch, goal):
    """Per episode of one task's batch: (final distance to the goal, smallest distance to it on the way)."""
    masks = batch["masks"]
    dist = torch.linalg.vector_norm(batch["next_obs"] - torch.as_tensor(goal, dtype=batch["next_obs"].dtype), dim=-1)
    last = masks.sum(0).long() - 1
    final = dist[last, torch.arange(dist.shape[1])]
    closest = torch.where(masks > 0, dist, torch.full_like(dist, float("inf"))).min(0).values
    return final.numpy(), closest.numpy()


def count_runaways(batches, goals):
    """Over one step's task batches: the share of episodes that end more than RUNAWAY_DISTANCE from their goal,
    how many of those overshot (came within PASS_DISTANCE first), how many there are, and the tasks that have one."""
    away, overshot = [], []
    for b, g in zip(batches, goals):
        final, closest = episode_distances(b, g)
        away.append(final > RUNAWAY_DISTANCE)
        overshot.append(away[-1] & (closest < PASS_DISTANCE))
    every = np.concatenate(away)
    return {"ran_away": float(every.mean()), "ran_away_overshot": int(np.concatenate(overshot).sum()),
            "ran_away_episodes": int(every.sum()), "runaway_tasks": [i for i, a in enumerate(away) if a.any()]}


@torch.no_grad()
def mean_action_rollout(model, params, goal, horizon, goal_box):
    """One episode of the policy's mean action from the origin (recurrent state carried, in-context inputs as in
    `rollout`). Returns (return, steps, final distance to the goal, reached)."""
    env = m.PointNav2D(torch.tensor(goal[None]), None, goal_box)
    obs, prev_a, prev_r, state = env.reset(), torch.zeros(1, 2), torch.zeros(1, 1), model.initial_state(1)
    ret = 0.0
    for t in range(horizon):
        out = m.functional_call(model, params, (model.make_input(obs, prev_a, prev_r)[None], torch.tensor([[t == 0]]), state),
                                {"scan": False})
        state, action = out["state"], out["pi"][0]
        obs, reward, done = env.step(action)
        ret += float(reward[0])
        prev_a, prev_r = action, reward[:, None]
        if bool(done[0]):
            return ret, t + 1, float(-reward[0]), True
    return ret, horizon, float(-reward[0]), False


@torch.no_grad()
def oracle_return(goals, std, horizon, goal_box, episodes=40, seed=0):
    """Mean return of the controller that steps straight at the goal (mean action (goal - position) / 0.1, clipped
    to [-1, 1]) with Gaussian action noise of the given std: what that much noise costs a perfect mean."""
    gen = torch.Generator().manual_seed(seed)
    env = m.PointNav2D(torch.as_tensor(goals).repeat_interleave(episodes, 0), gen, goal_box)
    pos, alive, ret = env.reset(), torch.ones(env.n, dtype=torch.bool), torch.zeros(env.n)
    for _ in range(horizon):
        mean = ((env.goals - pos) / env.max_step).clamp(-1.0, 1.0)
        pos, reward, done = env.step(mean + std * torch.randn(mean.shape, generator=gen))
        ret += reward * alive
        alive &= ~done
        if not alive.any():
            break
    return float(ret.mean())


def diagnose(checkpoint, num_tasks=40, num_steps=3, episodes=None):
    model, args, _ = m.load_checkpoint(checkpoint)
    if args.task != "point-nav-2d":
        raise ValueError(f"{checkpoint!r} is a {args.task} checkpoint; this diagnostic is for point-nav-2d")
    if episodes is not None:
        args.fast_batch_size, args.fill_steps = episodes, False
    else:
        args.fast_batch_size = args.eval_episodes or args.fast_batch_size
    # the sampling of evaluate(): same seeds, same test tasks, same step sizes
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    _, test_rng = m.task_streams(args.seed)
    tasks = m.sample_tasks(args.task, test_rng, num_tasks, "test")
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    lrs = [args.inner_lr] + [args.inner_lr * args.eval_later_lr_scale] * max(num_steps - 1, 0)
    data, returns = m.sample_task_batches(model, theta, tasks, args, gen, num_steps, lrs)
    rows = []
    params = [dict(theta) for _ in tasks]
    for k in range(num_steps + 1):
        batches = [d["train"][k] if k < num_steps else d["val"] for d in data]
        lengths = np.concatenate([b["masks"].sum(0).numpy() for b in batches])
        det = [mean_action_rollout(model, p, g, args.max_episode_steps, args.goal_box) for p, g in zip(params, tasks)]
        r = returns[k].numpy()
        rows.append({"step": k, "return_mean": float(r.mean()), "return_median": float(np.median(r)),
                     "episode_length": float(lengths.mean()), "ended_at_goal": float((lengths < args.max_episode_steps).mean()),
                     "action_std": float(np.mean([torch.exp(p["log_std"]).mean().item() for p in params])),
                     "mean_action_return": float(np.mean([d[0] for d in det])),
                     "mean_action_final_distance_median": float(np.median([d[2] for d in det])),
                     "mean_action_reached": float(np.mean([d[3] for d in det])), **count_runaways(batches, tasks)})
        if k < num_steps:  # the adapted parameters evaluate() reached: the same inner step on the same batch
            for i, b in enumerate(batches):
                with torch.enable_grad():
                    p = {n: v.detach().requires_grad_(True) for n, v in params[i].items()}
                    params[i] = {n: v.detach() for n, v in m.inner_step(model, p, b, lrs[k], False).items()}
    oracle = oracle_return(tasks, rows[-1]["action_std"], args.max_episode_steps, args.goal_box)
    return {"checkpoint": checkpoint, "seed": args.seed, "policy": args.policy, "num_tasks": num_tasks,
            "episodes": args.fast_batch_size, "fill_steps": args.fill_steps, "goal_box": args.goal_box, "rows": rows,
            "oracle_return_at_final_std": oracle, "goals": np.asarray(tasks).tolist(),
            "task_returns": [r.numpy().tolist() for r in returns]}


def table(res):
    head = ("| steps | return (mean) | return (median) | episode length | ended at goal | action std | "
            "mean action: return | mean action: final distance (median) | mean action: reached | "
            f"ended > {RUNAWAY_DISTANCE} from goal (overshot / episodes) | tasks with one |\n" + "|---" * 11 + "|\n")
    return head + "".join(
        f"| {r['step']} | {r['return_mean']:.2f} | {r['return_median']:.2f} | {r['episode_length']:.1f} | "
        f"{r['ended_at_goal']:.2f} | {r['action_std']:.3f} | {r['mean_action_return']:.2f} | "
        f"{r['mean_action_final_distance_median']:.3f} | {r['mean_action_reached']:.2f} | "
        f"{r['ran_away']:.3f} ({r['ran_away_overshot']} / {r['ran_away_episodes']}) | {len(r['runaway_tasks'])} |\n"
        for r in res["rows"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--num-tasks", type=int, default=40)
    p.add_argument("--num-steps", type=int, default=3)
    p.add_argument("--episodes", type=int, default=None)
    p.add_argument("--script", default=SCRIPT, help="maml_ssm.py or a patched copy (benchmark/probes/*.patch)")
    a = p.parse_args(argv)
    if a.num_tasks < 1 or a.num_steps < 0 or (a.episodes is not None and a.episodes < 1):
        print("maml_point_nav_homing: --num-tasks and --episodes must be positive, --num-steps >= 0", file=sys.stderr)
        return 2
    if not os.path.isfile(a.script):
        print(f"maml_point_nav_homing: --script {a.script!r} does not exist", file=sys.stderr)
        return 2
    global m
    if os.path.abspath(a.script) != SCRIPT:
        m = load_script(a.script)
    torch.set_num_threads(1)
    for ckpt in a.checkpoints:
        try:
            res = diagnose(ckpt, a.num_tasks, a.num_steps, a.episodes)
        except ValueError as e:
            print(f"maml_point_nav_homing: {e}", file=sys.stderr)
            return 2
        print(f"\n{ckpt} ({res['policy']}, seed {res['seed']}, {res['num_tasks']} test tasks, "
              f"{res['episodes']} episodes per task and step{', counted in steps' if res['fill_steps'] else ''})\n")
        print(table(res))
        print(f"a controller stepping straight at the goal with the same action std ({res['rows'][-1]['action_std']:.3f}): "
              f"{res['oracle_return_at_final_std']:.2f}")
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
