"""Criterion tables of the ASTRAL study (benchmark/astral_study.sh; protocol in docs/ppo_gru_astral.md).

Reads a sweep written by benchmark.py (its completion markers and every finished run's eval.json), groups the runs by
--exp-name and observation, and prints one markdown table (per training mode: mean deterministic return over seeds and
how many seeds reach 475; the held-out mode; episode-level NMI; wall time) and the phase's pass/fail lines.

Phase P scores part a of the plan-design check (benchmark/astral_plan_check.sh): the plan's expected results 1 and 2;
phase T criteria 3 and 4 from the tta.json and clamp.json files of tta_gating.py sweeps (one checkpoint per seed).

Usage: python benchmark/astral_study_report.py --phase C --sweep benchmark/out/astral_study/phase_C
       add --archive DIR to copy the sweep's markers and eval.json files (no models, no logs) into DIR, a directory that
       --sweep reads back: the docs keep the study's results that way, small enough to commit.
"""

import argparse
import glob
import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral.ppo_gru_baseline import HELD_OUT_MODES  # noqa: E402  (the baseline's eval.json does not name them)
from cleanrl_astral_utils.stats import t_ci95_half_width  # noqa: E402

SOLVED = 475.0  # criterion 1: the return of a solved mode
MARGIN = 25.0  # criterion 1: the loss to the baseline allowed in any training mode
SHARE = 0.8  # criteria 1 and 2: the share of seeds that must pass (8/10)
NMI_SCREEN = 0.3  # Phase B's stopping rule: episode-level NMI in 2/3 seeds
NMI_PASS = 0.5  # criterion 2 (Phase C): episode-level NMI in 8/10 seeds
GAIN_SHARE = 0.5  # criterion 3: the mean gain over `none` must reach this share of the mean gap to the best fixed gate
SPECIFICITY = 200.0  # criterion 4: the clamp specificity of a seed that passes
# the one-change study's question 1 (docs/results/ppo_gru_astral/one_change/PREREGISTRATION.md): the current defaults,
# scored by criteria 1 and 2 only; frozen_plan_sign against the baseline runs of the same seeds
QUESTION_1_ARMS = ("script_plan_sign", "frozen_plan_sign")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def load_runs(*sweeps, seeds=None):
    """{label: [run]} with run = {"seed", "train" (per training mode returns), "held_out", "nmi" (None for the
    baseline), "wall_time"}; label = the run's --exp-name, plus " (hidden velocity)" where it had --hide-velocity; only
    the runs of `seeds` when given."""
    groups = {}
    for marker in sorted(m for sweep in sweeps for m in glob.glob(os.path.join(sweep, "markers", "*.json"))):
        record = read_json(marker)
        if seeds is not None and record["seed"] not in seeds:
            continue
        path = eval_path(os.path.dirname(os.path.dirname(marker)), marker, record)
        if path is None:
            continue
        argv = record["argv"]
        report = read_json(path)
        preset = "seed3"
        if "--modes-preset" in argv:
            preset = argv[argv.index("--modes-preset") + 1]
        held_out = HELD_OUT_MODES[preset]
        returns = {int(k): v["deterministic"]["mean"] for k, v in report["per_mode"].items()}
        label = record["command"]
        if "--exp-name" in argv:
            label = argv[argv.index("--exp-name") + 1]
        if "--hide-velocity" in argv:
            label += " (hidden velocity)"
        groups.setdefault(label, []).append(
            {
                "seed": record["seed"],
                "train": [r for k, r in sorted(returns.items()) if k not in held_out],
                "held_out": [returns[k] for k in held_out],
                "wall_time": record["wall_time_s"],
                "nmi": report.get("slots_deterministic", {}).get("episode_nmi"),
            }
        )
    return groups


def eval_path(sweep, marker, record):
    """The run's eval.json: in its run directory, or in an archive's eval/<run_key>.json; None if it has none."""
    candidates = [os.path.join(d, "eval.json") for d in record["run_dirs"][:1]]
    candidates.append(os.path.join(sweep, "eval", os.path.basename(marker)))
    return next((c for c in candidates if os.path.isfile(c)), None)


def archive(sweeps, dest):
    """Copy every finished run's marker and eval.json into dest/markers and dest/eval; returns how many runs. Two
    sweeps holding one run key are refused before anything is copied."""
    runs = {}
    for sweep in sweeps:
        for marker in sorted(glob.glob(os.path.join(sweep, "markers", "*.json"))):
            report = eval_path(sweep, marker, read_json(marker))
            if report is not None:
                name = os.path.basename(marker)
                if name in runs:
                    sys.exit(f"astral_study_report.py: error: two sweeps hold run {name}: archive them one at a time")
                runs[name] = (marker, report)
    for name, sources in runs.items():
        for sub, source in zip(("markers", "eval"), sources):
            os.makedirs(os.path.join(dest, sub), exist_ok=True)
            shutil.copyfile(source, os.path.join(dest, sub, name))
    return len(runs)


def table(groups):
    lines = [
        "| run | seeds | per training mode: mean (seeds >= 475) | held-out mean "
        "| episode NMI: mean (seeds >= 0.5) | wall time s |",
        "|-|-|-|-|-|-|",
    ]
    for label, runs in groups.items():
        train = np.array([r["train"] for r in runs])
        modes = ", ".join(
            f"m{k} {train[:, k].mean():.0f} ({int((train[:, k] >= SOLVED).sum())})" for k in range(train.shape[1])
        )
        held = [v for r in runs for v in r["held_out"]]
        held_mean = float("nan")
        if held:
            held_mean = np.mean(held)
        nmi = [r["nmi"] for r in runs if r["nmi"] is not None]
        nmi_text = "-"
        if nmi:
            nmi_text = f"{np.mean(nmi):.2f} ({sum(v >= NMI_PASS for v in nmi)})"
        wall_time = np.mean([r["wall_time"] for r in runs])
        lines.append(f"| {label} | {len(runs)} | {modes} | {held_mean:.0f} | {nmi_text} | {wall_time:.0f} |")
    return lines


def seed_rows(groups):
    """One line per run: its per-mode returns (training, then held-out) and episode-level NMI."""
    lines = ["| run | seed | training modes | held-out | episode NMI |", "|-|-|-|-|-|"]
    for label, runs in groups.items():
        for r in sorted(runs, key=lambda r: r["seed"]):
            nmi = "-" if r["nmi"] is None else f"{r['nmi']:.2f}"
            lines.append(
                f"| {label} | {r['seed']} | {' / '.join(f'{v:.0f}' for v in r['train'])} | "
                f"{' / '.join(f'{v:.0f}' for v in r['held_out']) or '-'} | {nmi} |"
            )
    return lines


def mean_train(runs):
    return np.array([r["train"] for r in runs]).mean(0)


def choose_observation(groups):
    """Phase A's rule: the observation whose controls both pass (oracle >= 475 in every training mode, memoryless
    below half the oracle in every training mode); both pass: hidden velocity; neither: the one whose oracle
    solves more training modes (ties: hidden velocity)."""
    scores = {}
    for obs, name in (("", "full observation"), (" (hidden velocity)", "hidden velocity")):
        oracle = groups.get("oracle" + obs)
        memoryless = groups.get("memoryless" + obs)
        if not oracle or not memoryless:
            return f"undecided (no oracle or no memoryless runs with {name})"
        oracle_means = mean_train(oracle)
        memoryless_means = mean_train(memoryless)
        both_pass = bool(oracle_means.min() >= SOLVED and np.all(memoryless_means < 0.5 * oracle_means))
        # ranked by: both controls pass, then training modes the oracle solves, then hidden velocity
        scores[name] = (both_pass, int((oracle_means >= SOLVED).sum()), name == "hidden velocity")
    return max(scores, key=scores.get)


def freeze_key(runs):
    """Phase B's rule for the frozen configuration among those that pass the screen: most (seed, training mode) pairs
    >= 475, then the highest mean episode-level NMI."""
    return int((np.array([r["train"] for r in runs]) >= SOLVED).sum()), float(np.mean([r["nmi"] for r in runs]))


def phase_a_criteria(groups):
    """Phase A: the oracle solves every training mode, the memoryless control does not, and the observation chosen."""
    lines = []
    for obs in ("", " (hidden velocity)"):
        oracle = groups.get("oracle" + obs)
        memoryless = groups.get("memoryless" + obs)
        if not oracle:
            continue
        means = mean_train(oracle)
        lines.append(
            f"{'PASS' if means.min() >= SOLVED else 'FAIL'} oracle{obs}: every training mode >= {SOLVED:.0f} "
            f"(per-mode means {np.round(means).tolist()})"
        )
        if memoryless:
            below = [k for k, (n, o) in enumerate(zip(mean_train(memoryless), means)) if n < 0.5 * o]
            lines.append(
                f"memoryless{obs} is below half the oracle's return on training modes {below} "
                f"(means {np.round(mean_train(memoryless)).tolist()})"
            )
    lines.append(f"observation for phases B and C: {choose_observation(groups)}")
    return lines


def phase_b_criteria(groups):
    """Phase B: the stopping rule, and the configuration to freeze."""
    lines = []
    # the supervised gate is the diagnostic ceiling, not a candidate: it neither passes the screen nor is frozen
    screened = [
        label
        for label, runs in groups.items()
        if not label.startswith("ceiling")
        and sum(r["nmi"] is not None and r["nmi"] >= NMI_SCREEN for r in runs) >= 2 * len(runs) / 3
    ]
    lines.append(
        f"{'PASS' if screened else 'FAIL (stop: report the negative result)'} stopping rule: configurations "
        f"with episode-level NMI >= {NMI_SCREEN} in 2/3 of their seeds: {screened or 'none'}"
    )
    if screened:
        lines.append(f"configuration to freeze for phase C: {max(screened, key=lambda label: freeze_key(groups[label]))}")
    return lines


def phase_c_criteria(groups):
    """Phase C: criteria 1 and 2 and the wall time of the frozen configuration, of the ceiling and of the plan's design;
    criteria 1 and 2 only of the one-change study's question 1 arms (QUESTION_1_ARMS)."""
    lines = []
    for label in [g for g in groups if g.split(" (")[0] in ("frozen", "ceiling", "plan") + QUESTION_1_ARMS]:
        runs = groups[label]
        baseline = groups.get(label.replace(label.split(" (")[0], "baseline"))
        train = np.array([r["train"] for r in runs])
        need = SHARE * len(runs)
        solved = (train >= SOLVED).sum(0)
        close = baseline is None or bool(np.all(train.mean(0) >= mean_train(baseline) - MARGIN))
        lines.append(
            f"{'PASS' if solved.min() >= need and close else 'FAIL'} {label} criterion 1: seeds per training mode "
            f">= {SOLVED:.0f}: {solved.tolist()} of {len(runs)}; no mode below the baseline - {MARGIN:.0f}: {close}"
        )
        nmi = sum(r["nmi"] is not None and r["nmi"] >= NMI_PASS for r in runs)
        lines.append(
            f"{'PASS' if nmi >= need else 'FAIL'} {label} criterion 2: "
            f"episode-level NMI >= {NMI_PASS} in {nmi} of {len(runs)} seeds"
        )
        if label.split(" (")[0] in QUESTION_1_ARMS:
            continue
        lines.append(
            f"{label} criteria 3 and 4 (adaptation gain, clamp specificity) are measured by tta_gating.py on these checkpoints"
        )
        if baseline:
            ratio = np.mean([r["wall_time"] for r in runs]) / np.mean([r["wall_time"] for r in baseline])
            lines.append(f"{'PASS' if ratio <= 1.25 else 'FAIL'} {label} wall time {ratio:.2f}x the baseline's (<= 1.25x)")
    return lines


def plan_check_criteria(groups):
    """Part a of the plan-design check: expected result 1 (the plan's ASTRAL and its baseline both solve every mode, in
    >= 80% of the seeds each) and expected result 2 (different modes use different slots: episode-level NMI >= 0.5 in
    >= 80% of the plan's ASTRAL seeds)."""
    lines = []
    for label in ("plan", "baseline"):
        runs = groups.get(label)
        if not runs:
            lines.append(f"no {label} runs")
            continue
        solved = (np.array([r["train"] for r in runs]) >= SOLVED).sum(0)
        lines.append(
            f"{'PASS' if solved.min() >= SHARE * len(runs) else 'FAIL'} {label} expected result 1: seeds per mode "
            f">= {SOLVED:.0f}: {solved.tolist()} of {len(runs)}"
        )
    if groups.get("plan"):
        runs = groups["plan"]
        nmi = sum(r["nmi"] is not None and r["nmi"] >= NMI_PASS for r in runs)
        lines.append(
            f"{'PASS' if nmi >= SHARE * len(runs) else 'FAIL'} plan expected result 2: "
            f"episode-level NMI >= {NMI_PASS} in {nmi} of {len(runs)} seeds"
        )
    return lines


def adaptation_criterion(paths, name):
    """Criterion 3 from tta.json files (one per training seed): per control and target, a seed's gain is the mean over
    its adaptation seeds of the sampled return after adaptation minus `none`'s, its gap the best fixed gate's sampled
    return minus the unadapted one (0 when negative); a target passes when the Student-t 95% CI of the mean gain lies
    above 0 and the mean gain is >= half the mean gap; the criterion passes when one control passes every target."""
    pairs = {}  # (control, target) -> [(gain, gap)] over training seeds
    for path in paths:
        results = read_json(path)["results"]
        for target, result in results.items():
            none = np.array(result["controls"]["none"]["after_per_seed"]["sampled"])
            gap = max(result["ceiling"]["sampled"]["mean"] - result["before"]["sampled"]["mean"], 0.0)
            for control, adapted in result["controls"].items():
                if control != "none":
                    gain = float(np.mean(np.array(adapted["after_per_seed"]["sampled"]) - none))
                    pairs.setdefault((control, target), []).append((gain, gap))
    lines = []
    passed = {}
    for (control, target), values in pairs.items():
        gain, gap = np.array(values).T
        half = math.inf  # one seed has no CI: it cannot exclude 0
        if len(gain) > 1:
            half = t_ci95_half_width(gain)
        ok = bool(gain.mean() - half > 0 and gain.mean() >= GAIN_SHARE * gap.mean())
        passed.setdefault(control, []).append(ok)
        lines.append(
            f"{'pass' if ok else 'fail'} {name} {control} target {target}: gain {gain.mean():.1f} ± {half:.1f} "
            f"over {len(gain)} seeds, mean gap {gap.mean():.1f}"
        )
    winners = [control for control, verdicts in passed.items() if all(verdicts)]
    lines.append(f"{'PASS' if winners else 'FAIL'} {name} criterion 3: controls passing every target: {winners or 'none'}")
    return lines


def clamp_criterion(paths, name):
    """Criterion 4 from clamp.json files (one per training seed): deterministic clamp specificity >= 200 in >= 80% of them."""
    scores = [read_json(path)["specificity"]["deterministic"]["score"] for path in paths]
    hits = sum(score is not None and score >= SPECIFICITY for score in scores)
    verdict = "FAIL"
    if hits >= SHARE * len(scores):
        verdict = "PASS"
    return [f"{verdict} {name} criterion 4: clamp specificity >= {SPECIFICITY:.0f} in {hits} of {len(scores)} seeds"]


def tta_criteria(sweeps):
    """Phase T: criterion 3 for each sweep holding tta.json files, criterion 4 for each holding clamp.json files."""
    lines = []
    for sweep in sweeps:
        name = os.path.basename(os.path.normpath(sweep))
        adapted = sorted(glob.glob(os.path.join(sweep, "runs", "*", "*", "tta.json")))
        clamped = sorted(glob.glob(os.path.join(sweep, "runs", "*", "*", "clamp.json")))
        if adapted:
            lines += adaptation_criterion(adapted, name)
        if clamped:
            lines += clamp_criterion(clamped, name)
    return lines


def criteria(phase, groups):
    """The phase's verdict lines, each starting PASS, FAIL or a plain statement."""
    if phase == "A":
        return phase_a_criteria(groups)
    if phase == "B":
        return phase_b_criteria(groups)
    if phase == "C":
        return phase_c_criteria(groups)
    if phase == "P":
        return plan_check_criteria(groups)
    return []


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--phase",
        choices=["A", "B", "C", "P", "T"],
        required=True,
        help="P: part a of the plan-design check; T: criteria 3, 4",
    )
    parser.add_argument("--sweep", required=True, nargs="+", help="sweep directories written by benchmark.py (read together)")
    parser.add_argument("--archive", help="also copy the finished runs' markers and eval.json files into this directory")
    parser.add_argument("--seeds", type=int, nargs="+", help="read only the runs of these seeds")
    args = parser.parse_args(argv)
    if args.phase == "T":
        lines = tta_criteria(args.sweep)
        if not lines:
            print(f"astral_study_report.py: error: no tta.json or clamp.json in {' '.join(args.sweep)}", file=sys.stderr)
            return 2
        print("\n".join(lines))
        return 0
    groups = load_runs(*args.sweep, seeds=args.seeds)
    if not groups:
        print(f"astral_study_report.py: error: no finished run with an eval.json in {' '.join(args.sweep)}", file=sys.stderr)
        return 2
    if args.archive:
        print(f"archived {archive(args.sweep, args.archive)} runs in {args.archive}", file=sys.stderr)
    print(f"## Phase {args.phase}: {' '.join(args.sweep)}\n")
    print("\n".join(table(groups) + [""] + criteria(args.phase, groups) + ["", "Per seed:", ""] + seed_rows(groups)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
