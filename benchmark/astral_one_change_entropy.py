"""The gate of each ASTRAL run of a sweep: its per-mode mean gate weights and their entropy, and its per-step gate entropy
at the end of training, into a small JSON file that can be committed and a markdown table.

Usage: python benchmark/astral_one_change_entropy.py SWEEP DEST
SWEEP is a benchmark.py output directory (markers/*.json name each run's directory); DEST/gate_entropy.json gets, per
run key, the run's --exp-name and seed, `slot_weights` (eval.json's `slot_weights_deterministic`: mode x slot mean gate
over the deterministic evaluation), `mean_gate_entropy` (nats, per mode: the entropy of that mean gate, an upper bound
of the mean per-step entropy) and `weight_entropy_last` (the last logged `slots/weight_entropy`, the per-step gate
entropy of the last update's rollout).
"""

import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import read_scalars  # noqa: E402  (benchmark/, this file's directory)

ENTROPY_TAG = "slots/weight_entropy"


def entropy(p):
    """Entropy in nats of a distribution p (zeros contribute 0)."""
    p = np.asarray(p, dtype=np.float64)
    nz = p > 0
    return float(-(p[nz] * np.log(p[nz])).sum())


def gate_record(marker):
    """The gate figures of the run that `marker` (a benchmark.py marker dict) names; None if it has no eval.json."""
    run_dir = marker["run_dirs"][0]
    path = os.path.join(run_dir, "eval.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        weights = json.load(f)["slot_weights_deterministic"]
    argv = marker["argv"]
    name = marker["command"]
    if "--exp-name" in argv:
        name = argv[argv.index("--exp-name") + 1]
    last = None
    scalars = read_scalars(run_dir)
    if ENTROPY_TAG in scalars:
        last = float(scalars[ENTROPY_TAG][1][-1])
    return {
        "exp_name": name,
        "seed": marker["seed"],
        "slot_weights": weights,
        "mean_gate_entropy": [entropy(row) for row in weights],
        "weight_entropy_last": last,
    }


def gate_records(sweep):
    records = {}
    for path in sorted(glob.glob(os.path.join(sweep, "markers", "*.json"))):
        with open(path) as f:
            marker = json.load(f)
        record = gate_record(marker)
        if record is not None:
            records[marker["run_key"]] = record
    return records


def table(records):
    lines = [
        "| run | seed | mean gate per mode (slot weights) | entropy of each mode's mean gate (nats) "
        "| per-step gate entropy, last update |",
        "|-|-|-|-|-|",
    ]
    for r in sorted(records.values(), key=lambda r: (r["exp_name"], r["seed"])):
        gates = "; ".join("[" + ", ".join(f"{w:.2f}" for w in row) + "]" for row in r["slot_weights"])
        entropies = " / ".join(f"{h:.3f}" for h in r["mean_gate_entropy"])
        last = "-" if r["weight_entropy_last"] is None else f"{r['weight_entropy_last']:.3f}"
        lines.append(f"| {r['exp_name']} | {r['seed']} | {gates} | {entropies} | {last} |")
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: astral_one_change_entropy.py SWEEP DEST", file=sys.stderr)
        return 2
    sweep, dest = argv
    records = gate_records(sweep)
    if not records:
        print(f"astral_one_change_entropy.py: error: no finished run with an eval.json in {sweep}", file=sys.stderr)
        return 2
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "gate_entropy.json"), "w") as f:
        json.dump(records, f, indent=1)
    print("\n".join(table(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
