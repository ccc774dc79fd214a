"""Tables of the tta_gating benchmark (`benchmark/tta_gating.sh --budget`): one row per training seed x control for
every adapt sweep, a pooled row per control (gain over `none`, mean and 95% Student-t CI over training seeds; with a
ceiling, the gain as a fraction of the ceiling's headroom), and the clamp matrix per checkpoint x target (with the run's clamp
specificity when it has one); for the ASTRAL study's sweeps (`--study`), the verdicts of its criteria 3 and 4. Reads
the tta.json / clamp.json files of the sweeps; writes markdown.

With --phase-c-swap, instead: one row per Phase C checkpoint of the `swap` sweeps (`benchmark/tta_gating.sh --swap`):
the learned gate's argmax slot per mode, sign split, episode-level NMI against sign and mode, held-out routing and the
swap effects, and what the GRU baseline's eval.json files hold for a sign probe from h.

Usage: python benchmark/tta_summary.py --root benchmark/out/tta_gating --output docs/results/tta_gating/budget_tables.md
       python benchmark/tta_summary.py --phase-c-swap --output docs/results/tta_gating/phase_C_swap.md
"""

import argparse
import glob
import json
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cleanrl_astral_utils.stats import t_ci95_half_width  # noqa: E402

ADAPT_SWEEPS = [
    ("adapt_inverted", "inverted force (mode 3) of the inverted4 --hide-velocity agents, episodic"),
    ("adapt_inverted_online", "inverted force (mode 3) of the inverted4 --hide-velocity agents, --online --online-every 8"),
    ("adapt_unseen_inverted", "unseen inverted force (g 9.8, l 0.5, -1) for the seed3 agents"),
    ("adapt_collapsed", "upright modes 0-2 of the inverted4 --hide-velocity agent whose training collapsed (seed 3)"),
    ("adapt_unseen_upright", "unseen upright physics g 15.0, l 0.3 for the one seed3 agent below 500 there"),
    ("full", "full flavour: every training mode of every setting, and the seed3 agents on unseen physics"),
    ("study_adapt_frozen", "ASTRAL study, Phase C frozen configuration: every mode of mirror4, held-out mode 4 included"),
    ("study_adapt_ceiling", "ASTRAL study, Phase C supervised-gate ceiling: every mode of mirror4, held-out mode 4 included"),
]
CLAMP_SWEEPS = ["clamp_b", "clamp_all", "full", "study_clamp_frozen", "study_clamp_ceiling"]
STUDY_CONFIGS, STUDY_SEEDS = ("frozen", "ceiling"), range(6, 16)  # the ASTRAL study's Phase C checkpoints
SETTINGS = {"g0": "seed3", "g1": "seed3 `--hide-velocity`", "g2": "inverted4 `--hide-velocity`"}


def mean_t_ci(x):
    """The text "mean ± half-width of the 95% Student-t CI of the mean" of x (± 0.0 for a single value)."""
    return fmt(np.mean(x), t_ci95_half_width(x, below_two=0.0))


def fmt(m, h=None):
    return f"{m:.1f}" if h is None else f"{m:.1f} ± {h:.1f}"


def target_labels(d):
    """target name -> 'name (g, l[, inverted])' from a tta.json / clamp.json."""
    out = {}
    for t in d["targets"]:
        sign = (", inverted" if t["force_sign"] < 0 else "") + (", held out" if t.get("held_out") else "")
        out[t["name"]] = f"{t['name']} (g {t['gravity']:g}, l {t['half_length']:g}{sign})"
    return out


def setting_of(d):
    """The training setting of the checkpoint a tta.json / clamp.json was made from."""
    m = re.search(r"c1__(g\d)_", d["checkpoint"])  # a study checkpoint: its file name (frozen, ceiling)
    return SETTINGS.get(m.group(1), m.group(1)) if m else os.path.basename(d["checkpoint"]).split(".")[0]


def training_seed(path):
    m = re.search(r"__s(\d+)/", path)
    return int(m.group(1)) if m else -1


def adapt_tables(root):
    lines = []
    for sweep, title in ADAPT_SWEEPS:
        files = sorted(glob.glob(os.path.join(root, sweep, "runs", "*", "*", "tta.json")), key=training_seed)
        if not files:
            continue
        seeds = sorted({training_seed(f) for f in files})
        lines += [
            f"\n### {title}\n",
            f"`{sweep}`: {len(files)} runs, training seeds "
            f"{', '.join(str(x) for x in seeds)}; per row mean ± 95% Student-t CI over the adaptation seeds.\n",
            "| checkpoint | training seed | target | control | before (sampled) | during (mean of episodes) | after (sampled) "
            "| after (deterministic) | gain over `none`, after (sampled) | ceiling (sampled) | gain / (ceiling − before) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        pooled = {}
        for f in files:
            d = json.load(open(f))
            s, labels, setting = training_seed(f), target_labels(d), setting_of(d)
            for target, res in d["results"].items():
                before = res["before"]["sampled"]
                none_after = np.array(res["controls"]["none"]["after_per_seed"]["sampled"])
                for control, c in res["controls"].items():
                    during = np.array([np.mean(ep) for ep in c["during_per_seed"]])
                    after_s = np.array(c["after_per_seed"]["sampled"])
                    after_d = np.array(c["after_per_seed"]["deterministic"])
                    gain = after_s - none_after  # paired: same evaluation episodes per adaptation seed
                    g = "—" if control == "none" else mean_t_ci(gain)
                    ceiling = res.get("ceiling")
                    # the headroom of the same evaluation episodes: the best fixed gate minus the unadapted agent
                    gap = ceiling["sampled"]["mean"] - before["mean"] if ceiling else None
                    fraction = gain.mean() / gap if gap and gap > 0 and control != "none" else None
                    lines.append(
                        f"| {setting} | {s} | {labels[target]} | {control} | {fmt(before['mean'], before['ci95'])} | "
                        f"{mean_t_ci(during)} | {mean_t_ci(after_s)} | "
                        f"{mean_t_ci(after_d)} | {g} | "
                        f"{'—' if not ceiling else fmt(ceiling['sampled']['mean']) + ' (' + ceiling['best'] + ')'} | "
                        f"{'—' if fraction is None else f'{fraction:.2f}'} |"
                    )
                    pooled.setdefault((setting, labels[target], control), []).append((gain.mean(), fraction))
        lines += [
            "",
            "Pooled over training seeds (each seed's mean paired gain; 95% Student-t CI over training seeds):",
            "",
            "| checkpoint | target | control | training seeds | gain over `none`, after (sampled) | seeds with gain > 0 "
            "| gain / headroom (mean over seeds with headroom) |",
            "|---|---|---|---|---|---|---|",
        ]
        for (setting, target, control), rows in pooled.items():
            if control == "none":
                continue
            gains, fractions = np.array([g for g, _ in rows]), [f for _, f in rows if f is not None]
            pooled_gain = (
                fmt(gains.mean(), t_ci95_half_width(gains)) if len(gains) > 1 else f"{gains.mean():.1f} (one seed: no CI)"
            )
            fraction = f"{np.mean(fractions):.2f} ({len(fractions)} seeds)" if fractions else "—"
            lines.append(
                f"| {setting} | {target} | {control} | {len(gains)} | {pooled_gain} | "
                f"{int((gains > 0).sum())}/{len(gains)} | {fraction} |"
            )
    return lines


def clamp_table(root, sweep):
    files = sorted(glob.glob(os.path.join(root, sweep, "runs", "*", "*", "clamp.json")))
    if not files:
        return []
    lines = [
        f"\n### clamp (`{sweep}`)\n",
        "Mean return per cell over the cell's evaluation episodes; `slot k` = gate forced "
        "to one-hot k, `uniform` = 1/K each, `learned` = the gate itself. Max |Δ| = largest difference between a "
        "clamp column and `learned`.\n",
        "| checkpoint | training seed | target | deterministic: slots / uniform / learned "
        "| sampled: slots / uniform / learned "
        "| max \\|Δ\\| vs learned (det / sampled) | learned gate weights | run's clamp specificity (det / sampled) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for f in files:
        d = json.load(open(f))
        rows.append((setting_of(d), training_seed(f), f, d))
    for g, s, _f, d in sorted(rows, key=lambda r: (r[0], r[1])):
        labels = target_labels(d)
        spec = d.get("specificity", {})
        specificity = " / ".join(
            "—" if spec.get(k, {}).get("score") is None else f"{spec[k]['score']:.1f}" for k in ("deterministic", "sampled")
        )
        for target, res in d["results"].items():
            cols = d["columns"]  # slot0..slotK-1, uniform, learned (learned last)
            det = [res[c]["deterministic"]["mean"] for c in cols]
            smp = [res[c]["sampled"]["mean"] for c in cols]
            dd = max(abs(v - det[-1]) for v in det[:-1])
            ds = max(abs(v - smp[-1]) for v in smp[:-1])
            w = "[" + ", ".join(f"{x:.2f}" for x in res["learned_slot_weights"]) + "]"
            lines.append(
                f"| {g} | {s} | {labels[target]} | {' / '.join(f'{v:.1f}' for v in det)} | "
                f"{' / '.join(f'{v:.1f}' for v in smp)} | {dd:.1f} / {ds:.1f} | {w} | {specificity} |"
            )
    return lines


def study_criteria(root):
    """Criteria 3 and 4 of the ASTRAL study, for each configuration whose study sweeps exist under `root`, scored as
    docs/results/ppo_gru_astral/study/README.md#scoring-of-criteria-3-and-4 fixes them."""
    lines = []
    for name in STUDY_CONFIGS:
        adapt = sorted(glob.glob(os.path.join(root, f"study_adapt_{name}", "runs", "*", "*", "tta.json")), key=training_seed)
        clamp = sorted(glob.glob(os.path.join(root, f"study_clamp_{name}", "runs", "*", "*", "clamp.json")), key=training_seed)
        if not adapt and not clamp:
            continue
        lines.append(f"\n### ASTRAL study, criteria 3 and 4: {name}\n")
        per_target, targets = {}, {}  # control -> target -> [(training seed's mean paired gain, its gap)]
        for f in adapt:
            d = json.load(open(f))
            labels = target_labels(d)
            for target, res in d["results"].items():
                if not res.get("ceiling") or "none" not in res["controls"]:
                    sys.exit(
                        f"tta_summary.py: error: {f} has no ceiling or no `none` control; criterion 3 needs both "
                        "(run tta_gating.sh --study's command)"
                    )
                none = np.array(res["controls"]["none"]["after_per_seed"]["sampled"])
                gap = max(res["ceiling"]["sampled"]["mean"] - res["before"]["sampled"]["mean"], 0.0)
                targets[labels[target]] = None
                for control, c in res["controls"].items():
                    if control != "none":
                        gain = float(np.mean(np.array(c["after_per_seed"]["sampled"]) - none))
                        per_target.setdefault(control, {}).setdefault(labels[target], []).append((gain, gap))
        if adapt:
            lines += [
                "Criterion 3: per target, each training seed's gain over `none` (sampled, mean over its adaptation seeds) "
                "and its gap (ceiling − unadapted, 0 when negative); a target passes when the 95% Student-t CI of the mean "
                "gain lies above 0 and the mean gain is ≥ 50% of the mean gap.\n",
                "| control | target | training seeds | gain over `none` | mean gap | gain / gap | target |",
                "|---|---|---|---|---|---|---|",
            ]
            passed, complete = {}, {"gate", "context"} <= set(per_target)
            for control, by_target in per_target.items():
                verdicts = []
                for target in targets:
                    gains, gaps = np.array(by_target.get(target, [(math.nan, math.nan)])).T
                    complete &= len(gains) >= len(STUDY_SEEDS)  # every target of every control has every training seed
                    half = t_ci95_half_width(gains) if len(gains) > 1 else math.inf  # one seed has no CI: it cannot exclude 0
                    ok = bool(gains.mean() - half > 0 and gains.mean() >= 0.5 * gaps.mean())  # NaN (missing): False
                    verdicts.append(ok)
                    fraction = f"{gains.mean() / gaps.mean():.2f}" if gaps.mean() > 0 else "no headroom"
                    gain = fmt(gains.mean(), half if math.isfinite(half) else None)
                    lines.append(
                        f"| {control} | {target} | {len(gains)} | {gain} | {gaps.mean():.2f} | {fraction} | "
                        f"{'pass' if ok else 'fail'} |"
                    )
                passed[control] = all(verdicts)
            seeds = {training_seed(f) for f in adapt}
            verdict = "PASS" if any(passed.get(c, False) for c in ("gate", "context")) else "FAIL"
            lines += [
                "",
                f"**criterion 3, {name}: {verdict if complete else 'incomplete'}** (every target passes for `gate` or "
                f"`context`; `gate` {'passes' if passed.get('gate') else 'fails'}, `context` "
                f"{'passes' if passed.get('context') else 'fails'}; training seeds {len(seeds)}/{len(STUDY_SEEDS)})\n",
            ]
        if clamp:
            lines += [
                "Criterion 4: the run's clamp specificity on the training modes (≥ 200 in ≥ 8 of 10 training seeds, "
                "deterministic actions).\n",
                "| training seed | deterministic | sampled |",
                "|---|---|---|",
            ]
            scores = []
            for f in clamp:
                spec = json.load(open(f))["specificity"]
                det, smp = (spec[k]["score"] for k in ("deterministic", "sampled"))
                scores.append(det)
                lines.append(
                    f"| {training_seed(f)} | {'—' if det is None else fmt(det)} | {'—' if smp is None else fmt(smp)} |"
                )
            hits = sum(s is not None and s >= 200 for s in scores)
            complete = {training_seed(f) for f in clamp} >= set(STUDY_SEEDS)
            verdict = ("PASS" if hits >= 8 else "FAIL") if complete else "incomplete"
            lines += ["", f"**criterion 4, {name}: {verdict}** ({hits}/{len(scores)} training seeds ≥ 200)\n"]
    return lines


def phase_c_swap(root, baseline_eval):
    """The Phase C swap table: one row per configuration x seed, then a count / mean row per configuration."""
    lines = [
        "# Gate swap and sign-level routing on the Phase C checkpoints",
        "",
        "An analysis of existing runs, found after looking at them; not a pre-registered criterion of the ASTRAL study.",
        "Made by `benchmark/tta_gating.sh --swap` (`tta_gating.py swap --eval-episodes 20 --seed {seed}`, seeds 6-15: the",
        "learned-gate column replays each checkpoint's own deterministic evaluation). Slots: argmax of the mean learned",
        "gate (deterministic episodes) of modes 0-3 (force +1, -1, +1, -1) and of held-out mode 4 (force -1); mode 4 can",
        "go to a slot of its sign only where the two signs use disjoint slots. NMI: one",
        "sample per episode (argmax of its mean gate) against its force sign, and against its mode (0.5 for a clean sign",
        "split). Swap effect: return with the own sign's mean gate minus the other sign's, mean over modes 0-3; by mode: own",
        "mode's mean gate minus the mean of the other three modes'.",
        "",
        "| config | seed | slots, modes 0-3 / 4 | signs on disjoint slots | NMI sign / mode | mode 4 to a slot of its sign | "
        "swap effect, sign: det / sampled | swap effect, mode: det / sampled | learned return, modes 0-4 (det) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    totals = []
    for name, label in (("frozen", "c0 frozen"), ("ceiling", "c2 ceiling")):
        files = sorted(glob.glob(os.path.join(root, f"phase_C_swap_{name}", "runs", "*", "*", "swap.json")), key=training_seed)
        rows = []
        for path in files:
            with open(path) as f:
                d = json.load(f)
            routing = d["routing"]
            slots = routing["slot_of_mode"]
            held = routing["held_out"].get("mode4", {})
            routed = {True: "yes", False: "no", None: "no sign slots"}[held.get("to_sign_slot")]
            disjoint = "no"
            if routing["sign_split"]:
                disjoint = "yes, one each"
            elif routing["signs_on_disjoint_slots"]:
                disjoint = "yes"
            effect = d["swap_effect"]
            learned = [d["results"][f"mode{k}"]["learned"]["deterministic"]["mean"] for k in range(5)]
            seed = re.search(r"__s(\d+)", d["checkpoint"]).group(1)
            rows.append((routing, held, effect))
            lines.append(
                f"| {label} | {seed} | {' '.join(str(slots[f'mode{k}']) for k in range(4))} / {slots['mode4']} | "
                f"{disjoint} | "
                f"{routing['episode_nmi_sign']:.2f} / {routing['episode_nmi_mode']:.2f} | {routed} | "
                f"{effect['deterministic']['sign']['value']:.1f} / {effect['sampled']['sign']['value']:.1f} | "
                f"{effect['deterministic']['mode']['value']:.1f} / {effect['sampled']['mode']['value']:.1f} | "
                f"{' / '.join(f'{v:.0f}' for v in learned)} |"
            )
        if rows:
            splits = sum(r["sign_split"] for r, _, _ in rows)
            disjoint = sum(r["signs_on_disjoint_slots"] for r, _, _ in rows)
            routed = sum(bool(h.get("to_sign_slot")) for _, h, _ in rows)
            nmi = [r["episode_nmi_sign"] for r, _, _ in rows]
            sign_det = [e["deterministic"]["sign"]["value"] for _, _, e in rows]
            sign_sampled = [e["sampled"]["sign"]["value"] for _, _, e in rows]
            totals.append(
                f"- {label}, {len(rows)} seeds: the signs on disjoint slots in {disjoint} (one slot each in {splits}), mode 4 "
                f"to a slot of its sign in {routed}; episode NMI "
                f"against the sign {mean_t_ci(nmi)} (mean ± 95% Student-t CI over seeds); swap effect by sign "
                f"{mean_t_ci(sign_det)} deterministic, {mean_t_ci(sign_sampled)} "
                "sampled."
            )
    lines += ["", *totals, "", "GRU baseline (c1), sign probe from h:"]
    files = sorted(glob.glob(os.path.join(baseline_eval, "c1__*.json")), key=lambda p: training_seed(p.replace(".json", "/")))
    keys = set()
    for path in files:
        with open(path) as f:
            keys |= set(json.load(f))
    probes = sorted(k for k in keys if "probe" in k or k.startswith("slots"))
    if not files:
        lines.append(f"- no c1 eval.json under {baseline_eval}.")
    elif probes:
        lines.append(f"- the {len(files)} c1 eval.json files hold {', '.join(probes)}.")
    else:
        lines.append(
            f"- cannot be given: the {len(files)} c1 eval.json files under `{baseline_eval}` hold only "
            f"{', '.join(sorted(keys))} (returns; no probe of h), and the c1 checkpoints are not in the repository."
        )
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="benchmark/out/tta_gating", help="directory holding the budget sweeps")
    p.add_argument("--output", required=True, help="markdown file to write")
    p.add_argument("--phase-c-swap", action="store_true", help="write only the Phase C swap table (tta_gating.sh --swap)")
    p.add_argument(
        "--baseline-eval",
        default="docs/results/ppo_gru_astral/study/phase_C_runs/eval",
        help="directory of the Phase C eval.json copies (the GRU baseline's are c1__*.json)",
    )
    a = p.parse_args(argv)
    if not os.path.isdir(a.root):
        print(
            f"tta_summary.py: error: {a.root!r} is not a directory; run benchmark/tta_gating.sh --budget first",
            file=sys.stderr,
        )
        return 2
    if a.phase_c_swap:
        lines = phase_c_swap(a.root, a.baseline_eval)
    else:
        lines = ["# tta_gating sweeps", ""] + adapt_tables(a.root)
        for sweep in CLAMP_SWEEPS:
            lines += clamp_table(a.root, sweep)
        lines += study_criteria(a.root)
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    tmp = a.output + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, a.output)
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
