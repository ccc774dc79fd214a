"""How often SmolLM2's answers parse, free against constrained (--llm-answer-format free | grammar): the answer role on
the agreement states of reinforce_baby (--llm-check-pairs 16 per task and level, seed 1, as
benchmark/reinforce_baby_llm.sh asks them), one request per distinct state, greedy, no retries. Writes the share of
states and of queries whose answer did not parse, the accuracy, and every unparsed state with its reply, as JSON and
markdown; --test-states also writes the states the free format left unparsed (the real-server test's states).

Usage (a running OpenAI-compatible server; benchmark/reinforce_baby_answer_format.sh starts one):
    python benchmark/reinforce_baby_answer_format.py --llm-base-url http://127.0.0.1:8000/v1 --llm-model smollm2-135m \
        --out docs/results/reinforce_baby/answer_format
"""

import argparse
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cleanrl_astral.reinforce_baby as reinforce_baby  # noqa: E402

FORMATS = ["free", "grammar"]


def measure(url: str, model: str, answer_format: str, pairs: int, seed: int, cache: str) -> dict:
    """Every distinct agreement state asked once: per (task, level) and in all, states and queries unparsed, accuracy."""
    args = reinforce_baby.Args(
        task="all",
        curriculum=True,
        num_actions=8,
        parent="llm",
        llm_base_url=url,
        llm_model=model,
        llm_answer_format=answer_format,
        llm_retries=0,
        llm_concurrency=1,
        llm_timeout=120.0,
        llm_cache=cache,
        seed=seed,
    )
    parent = reinforce_baby.make_parent(args)
    levels = reinforce_baby.playable(reinforce_baby.TASKS, args.num_actions)
    counts = collections.Counter()
    unparsed = []
    replies = {}
    for (task, level), (states, _) in zip(levels, parent.agreement_pairs(levels, pairs, seed)):
        where = f"{task}/level{level}"
        for s in states:
            if s not in replies:
                replies[s] = parent.ask(s, 0)
                text = replies[s].text
                if text is None and replies[s].invalid:
                    text = replies[s].invalid[0]
                answer = parent.parse_answer(text)
                counts.update([f"{where}/states"] + [f"{where}/states_unparsed"] * (answer is None))
                counts.update([f"{where}/states_right"] * (answer == parent.oracle_action(s)))
                if answer is None:
                    unparsed.append({"where": where, "state": s.as_list(), "reply": text})
            counts.update([f"{where}/queries"] + [f"{where}/queries_unparsed"] * (replies[s].text is None))
    rows = {}
    for task, level in levels:
        where = f"{task}/level{level}"
        rows[where] = {
            k: counts[f"{where}/{k}"] for k in ("states", "states_unparsed", "states_right", "queries", "queries_unparsed")
        }
    total = {k: sum(r[k] for r in rows.values()) for k in next(iter(rows.values()))}
    total["unparsed_share_states"] = total["states_unparsed"] / total["states"]
    total["unparsed_share_queries"] = total["queries_unparsed"] / total["queries"]
    total["accuracy_states"] = total["states_right"] / total["states"]
    return {"answer_format": answer_format, "total": total, "per_level": rows, "unparsed": unparsed}


def report_md(result: dict) -> str:
    lines = [
        "# reinforce_baby: SmolLM2's answers, free against constrained",
        "",
        f"`{result['command']}`: {result['model']} behind llama.cpp's server (one thread) in the answer role, on the",
        f"agreement states ({result['pairs']} per task and level, seed {result['seed']}), each distinct state asked once,",
        "greedy, no retries. Unparsed: the reply holds no action's number (a run falls back to the rule's reward).",
        "",
        "| answer format | states | unparsed states | queries | unparsed queries | right answers (of the states) |",
        "|---|---|---|---|---|---|",
    ]
    for fmt in FORMATS:
        t = result[fmt]["total"]
        lines.append(
            f"| {fmt} | {t['states']} | {t['states_unparsed']} ({t['unparsed_share_states']:.1%}) | {t['queries']} | "
            f"{t['queries_unparsed']} ({t['unparsed_share_queries']:.1%}) | {t['accuracy_states']:.1%} |"
        )
    lines += ["", "Per task and level (unparsed states / states, right answers / states):", ""]
    lines += ["| task/level | " + " | ".join(FORMATS) + " |", "|---|" + "---|" * len(FORMATS)]
    for where in result["free"]["per_level"]:
        cells = []
        for fmt in FORMATS:
            r = result[fmt]["per_level"][where]
            cells.append(f"{r['states_unparsed']}/{r['states']} unparsed, {r['states_right']}/{r['states']} right")
        lines.append(f"| {where} | " + " | ".join(cells) + " |")
    for fmt in FORMATS:
        lines += [
            "",
            f"Unparsed replies, {fmt}: " + (", ".join(f"`{u['reply']!r}`" for u in result[fmt]["unparsed"]) or "none"),
        ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llm-base-url", required=True)
    p.add_argument("--llm-model", default="smollm2-135m")
    p.add_argument("--pairs", type=int, default=16, help="agreement pairs per task and level")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="path without extension: writes OUT.json and OUT.md")
    p.add_argument("--test-states", help="also write the states the free format left unparsed to this JSON file")
    args = p.parse_args(argv)
    command = "bash benchmark/reinforce_baby_answer_format.sh"
    result = {"command": command, "model": args.llm_model, "pairs": args.pairs, "seed": args.seed}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:  # a cache of its own per format: every answer is asked
            result[fmt] = measure(
                args.llm_base_url, args.llm_model, fmt, args.pairs, args.seed, os.path.join(tmp, f"{fmt}.sqlite")
            )
            t = result[fmt]["total"]
            print(f"{fmt}: {t['states_unparsed']}/{t['states']} states unparsed, accuracy {t['accuracy_states']:.3f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(f"{args.out}.json", "w") as f:
        json.dump(result, f, indent=2)
    with open(f"{args.out}.md", "w") as f:
        f.write(report_md(result))
    if args.test_states:
        with open(args.test_states, "w") as f:
            json.dump([u["state"] for u in result["free"]["unparsed"]], f)
            f.write("\n")


if __name__ == "__main__":
    main()
