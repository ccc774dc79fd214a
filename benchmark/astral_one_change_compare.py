"""Criteria 1, 3 and 4 of the one-change study and its pair rule
(docs/results/ppo_gru_astral/one_change/PREREGISTRATION.md), from the archives that `astral_one_change.sh report` writes.

Usage: python benchmark/astral_one_change_compare.py ARCHIVE [ARCHIVE ...]
Each ARCHIVE holds markers/<run key>.json (benchmark.py's marker: the run's argv) and eval/<run key>.json (its
eval.json). Runs are grouped by --exp-name. Per arm: the seeds >= 475 per training mode (criterion 1: every mode in at
least 4 of 5 seeds), the seeds with every mode >= 475 at once (no verdict), and, per seed, the mean deterministic return
over the training modes; the arm minus the `plan` arm (criterion 3) and minus `script_plan_sign` (criterion 4) with a
95% Welch t-interval. Then the pair rule over the single arms, and the registered verdict.
"""

import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import welch_diff_ci95  # noqa: E402

SOLVED = 475.0
PLAN = "plan"
SCRIPT = "script_plan_sign"
# the single arms in the registration's table order (the last tie-break of the pair rule), with the flags each adds
SINGLE_ARMS = {
    "film_identity": "--film-design script",
    "tanh_gate": "--gate-design script",
    "slots_32": "--slot-dim 32",
    "orthogonal_init": "--init orthogonal",
    "script_config": "--hidden-size 128 --num-envs 32 --learning-rate 1e-3 --adam-eps 1e-5 --anneal-lr --norm-reward "
    "--clip-vloss",
}


def training_mode_returns(evaluation):
    """The deterministic mean return of each training mode (held-out modes left out), in mode order."""
    held_out = {str(k) for k in evaluation["held_out_modes"]}
    per_mode = evaluation["per_mode"]
    return [per_mode[k]["deterministic"]["mean"] for k in sorted(per_mode, key=int) if k not in held_out]


def read_archives(archives):
    """{exp_name: {seed: [return per training mode]}} over every run of the archives."""
    arms = {}
    for archive in archives:
        for marker_path in sorted(glob.glob(os.path.join(archive, "markers", "*.json"))):
            with open(marker_path) as f:
                marker = json.load(f)
            eval_path = os.path.join(archive, "eval", os.path.basename(marker_path))
            if not os.path.isfile(eval_path):
                continue  # a run that did not finish: reported as missing by its seed count
            with open(eval_path) as f:
                evaluation = json.load(f)
            argv = marker["argv"]
            name = argv[argv.index("--exp-name") + 1]
            arms.setdefault(name, {})[marker["seed"]] = training_mode_returns(evaluation)
    return arms


def arm_summary(runs):
    """Criterion 1's counts and the per-seed mean over modes of one arm's {seed: returns}."""
    returns = np.array([runs[s] for s in sorted(runs)], dtype=np.float64)
    solved = returns >= SOLVED
    per_mode = [int(n) for n in solved.sum(0)]
    return {
        "seeds": len(runs),
        "mode_means": [float(m) for m in returns.mean(0)],
        "seeds_solved_per_mode": per_mode,
        "criterion_1": all(n >= 4 for n in per_mode),
        "seeds_all_modes": int(solved.all(1).sum()),
        "per_seed_mean": [float(m) for m in returns.mean(1)],
        "mean": float(returns.mean()),
        "cells_solved": int(solved.sum()),
    }


def difference(arm, reference):
    """(text, verdict) of arm - reference in per-seed means over modes, with its 95% Welch t-interval."""
    a = np.asarray(arm["per_seed_mean"])
    b = np.asarray(reference["per_seed_mean"])
    if len(a) < 2 or len(b) < 2:
        return "–", "too few seeds"
    if a.std() == 0 and b.std() == 0:  # no spread on either side: the interval is the point
        diff = float(a.mean() - b.mean())
        half = 0.0
    else:
        diff, half = welch_diff_ci95(a, b)
    verdict = "no difference detected"
    if diff - half > 0:
        verdict = "better"
    elif diff + half < 0:
        verdict = "worse"
    return f"{diff:+.1f} ± {half:.1f}", verdict


def pair_choice(summaries):
    """The two single arms with the highest mean over modes and seeds; ties: more cells >= 475, then table order."""
    ran = [name for name in SINGLE_ARMS if name in summaries]
    order = {name: i for i, name in enumerate(SINGLE_ARMS)}
    ranked = sorted(ran, key=lambda name: (-summaries[name]["mean"], -summaries[name]["cells_solved"], order[name]))
    return ranked[:2]


def verdict_text(summaries):
    """The registered verdict, from the single arms (and the pair arm where it ran)."""
    if not any(name in summaries for name in SINGLE_ARMS):
        return "no single arm has run"
    repairing = [name for name in SINGLE_ARMS if name in summaries and summaries[name]["criterion_1"]]
    if repairing:
        return f"the plan's design fails because of the choices of {', '.join(repairing)}; each alone repairs it"
    if "pair" not in summaries:
        return "no single choice repairs the plan's design on seed3; the pair arm has not run"
    if summaries["pair"]["criterion_1"]:
        return "the pair repairs it; neither alone does"
    return (
        "no single choice, nor the pair the single arms point to, repairs the plan's design on seed3; the remaining "
        "differences (activations and widths of encoder and heads, three or more choices together) are not measured"
    )


def report(arms):
    """The markdown report of the arms ({exp_name: {seed: returns}})."""
    summaries = {name: arm_summary(runs) for name, runs in arms.items()}
    lines = [
        "| arm | seeds | per training mode: mean (seeds >= 475) | all modes >= 475 at once | criterion 1 | "
        "mean over modes | arm − plan (criterion 3) | arm − script_plan_sign (criterion 4) |",
        "|-|-|-|-|-|-|-|-|",
    ]
    for name, s in summaries.items():
        modes = ", ".join(f"m{k} {m:.0f} ({n})" for k, (m, n) in enumerate(zip(s["mode_means"], s["seeds_solved_per_mode"])))
        against = []
        for reference in (PLAN, SCRIPT):
            if reference in summaries and reference != name:
                text, verdict = difference(s, summaries[reference])
                against.append(f"{text}: {verdict}")
            else:
                against.append("–")
        passed = "pass" if s["criterion_1"] else "fail"
        lines.append(
            f"| {name} | {s['seeds']} | {modes} | {s['seeds_all_modes']} | {passed} | {s['mean']:.1f} | "
            f"{against[0]} | {against[1]} |"
        )
    lines.append("")
    lines.append("± is the half-width of the 95% Welch t-interval over seeds of the per-seed mean deterministic return over")
    lines.append("the training modes (20 evaluation episodes per mode).")
    if PLAN in summaries and summaries[PLAN]["criterion_1"]:
        lines.append("")
        lines.append("The `plan` arm passes criterion 1 in this run: part (a)'s failure did not replicate, and the arms are")
        lines.append("read by criterion 3 only.")
    pair = pair_choice(summaries)
    if len(pair) == 2:
        flags = " ".join(SINGLE_ARMS[name] for name in pair)
        lines.append("")
        lines.append(f'Pair rule: {pair[0]} and {pair[1]}, ASTRAL_PAIR="{flags}".')
    lines.append("")
    lines.append(f"Verdict: {verdict_text(summaries)}.")
    return "\n".join(lines)


def main(argv=None):
    archives = sys.argv[1:] if argv is None else argv
    arms = read_archives(archives)
    if not arms:
        print(f"astral_one_change_compare.py: error: no finished run in {' '.join(archives)}", file=sys.stderr)
        return 2
    print(report(arms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
