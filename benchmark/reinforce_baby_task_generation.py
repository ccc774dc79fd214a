"""How valid and diverse are the task instances an LLM parent proposes (reinforce_baby --task-source parent)? Fills one
pool per (task, level) against an OpenAI-compatible endpoint, as a run would, and prints each pool's validity and
diversity (the numbers a run logs under tasks/).

Usage: python benchmark/reinforce_baby_task_generation.py --llm-base-url http://127.0.0.1:8000/v1 --llm-model smollm2-135m \
    --seeds 1 2 3 [--pool-size 32] [--levels pattern-echo:0 sequence-next:1] [--output task_generation.json]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cleanrl_astral.reinforce_baby as reinforce_baby  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llm-base-url", required=True)
    p.add_argument("--llm-model", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--pool-size", type=int, default=32)
    p.add_argument("--levels", nargs="+", default=None, help="task:level pairs (default: every playable one)")
    p.add_argument("--cache", default="benchmark/out/reinforce_baby_task_generation.sqlite")
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    levels = reinforce_baby.playable(reinforce_baby.TASKS, 8)
    if args.levels:
        levels = [(t, int(lv)) for t, lv in (x.split(":") for x in args.levels)]
    rows = []
    for seed in args.seeds:
        run_args = reinforce_baby.Args(
            task="all",
            num_actions=8,
            seed=seed,
            parent="llm",
            llm_base_url=args.llm_base_url,
            llm_model=args.llm_model,
            llm_timeout=120.0,
            llm_concurrency=1,
            llm_cache=args.cache,
            task_source="parent",
            task_pool_size=args.pool_size,
        )
        parent = reinforce_baby.make_parent(run_args)
        for task, level in levels:
            parent.fill_pool(task, level)
            rows.append({"seed": seed, "level": f"{task}/level{level}", **parent.task_stats[f"{task}/level{level}"]})
    if args.output:
        with open(args.output, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
