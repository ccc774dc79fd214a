"""The SSM's meta-iteration time as a multiple of the MLP's, under TRPO (maml_ssm.py --config paper) and under ProMP
(maml_ssm_promp.py --config paper), on point-nav-2d, for the scripts of one or more commits.

Paired and interleaved: each round runs, for every commit and both outer optimizers, an MLP run and an SSM run back to
back (their order alternating by round, the commits' order too), one run at a time, each --iterations meta-iterations
of seed 1 with one thread. A run's time per iteration is the median of its logged meta/iteration_time without the first
iteration (warm-up); a round's ratio is the SSM's over the MLP's of the same round. The scripts are taken from the
commit with `git show` into a temporary folder and run from there (each script is one self-contained file). Run it on
an otherwise idle machine: another job on the cores moves both runs of a pair, but not by the same amount.

Usage: python benchmark/maml_ssm_speed_ratio.py --commit 95652a5 --commit HEAD --rounds 3 --iterations 3
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmark"))
from report import read_scalars  # noqa: E402

SCRIPTS = {"trpo": "maml_ssm.py", "promp": "maml_ssm_promp.py"}
AIM = 1.5  # the SSM's meta-iteration at most this multiple of the MLP's


def export_scripts(commit, folder):
    """Writes the commit's maml_ssm.py and maml_ssm_promp.py into folder."""
    for script in SCRIPTS.values():
        text = subprocess.run(
            ["git", "show", f"{commit}:cleanrl_astral/{script}"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        with open(os.path.join(folder, script), "w") as f:
            f.write(text)


def run_command(folder, optimizer, policy, iterations, runs_dir):
    """The command of one timed run."""
    return [
        sys.executable,
        os.path.join(folder, SCRIPTS[optimizer]),
        "train",
        "--task",
        "point-nav-2d",
        "--config",
        "paper",
        "--policy",
        policy,
        "--seed",
        "1",
        "--outer-steps",
        str(iterations),
        "--log-every",
        "1",
        "--num-threads",
        "1",
        "--runs-dir",
        runs_dir,
    ]


def seconds_per_iteration(runs_dir):
    """The median logged meta/iteration_time of the one run under runs_dir, the first iteration left out."""
    (name,) = os.listdir(runs_dir)
    times = read_scalars(os.path.join(runs_dir, name))["meta/iteration_time"][1]
    if len(times) > 1:
        times = times[1:]
    return float(np.median(times))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", action="append", required=True, help="a commit whose scripts are timed (repeatable)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of paired runs")
    p.add_argument("--iterations", type=int, default=3, help="meta-iterations per run (the first is left out)")
    p.add_argument("--optimizer", nargs="+", default=["trpo", "promp"], choices=list(SCRIPTS), help="outer optimizers")
    p.add_argument("--dry-run", action="store_true", help="print the commands of the first round and stop")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.iterations < 1:
        p.error("--rounds and --iterations must be at least 1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ratios = {}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for commit in args.commit:
            folders[commit] = os.path.join(tmp, f"c{len(folders)}")
            os.makedirs(folders[commit])
            export_scripts(commit, folders[commit])
        for r in range(args.rounds):
            commits = args.commit if r % 2 == 0 else args.commit[::-1]
            policies = ("mlp", "ssm") if r % 2 == 0 else ("ssm", "mlp")
            for commit in commits:
                for optimizer in args.optimizer:
                    times = {}
                    for policy in policies:
                        runs_dir = os.path.join(tmp, f"runs_r{r}_{commit}_{optimizer}_{policy}")
                        cmd = run_command(folders[commit], optimizer, policy, args.iterations, runs_dir)
                        if args.dry_run:
                            print(" ".join(cmd))
                            continue
                        subprocess.run(cmd, env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL)
                        times[policy] = seconds_per_iteration(runs_dir)
                    if args.dry_run:
                        continue
                    ratio = times["ssm"] / times["mlp"]
                    ratios.setdefault((commit, optimizer), []).append((ratio, times["mlp"], times["ssm"]))
                    print(
                        f"round {r + 1} {commit} {optimizer}: MLP {times['mlp']:.2f} s/it, SSM {times['ssm']:.2f} s/it, "
                        f"SSM/MLP {ratio:.2f}",
                        flush=True,
                    )
            if args.dry_run:
                return 0
    print("\n| commit | outer optimizer | rounds | MLP s/it (median) | SSM s/it (median) | SSM/MLP, median (range) | aim |")
    print("|---|---|---|---|---|---|---|")
    for (commit, optimizer), rows in ratios.items():
        r = [row[0] for row in rows]
        print(
            f"| {commit} | {optimizer.upper()} | {len(rows)} | {np.median([row[1] for row in rows]):.2f} | "
            f"{np.median([row[2] for row in rows]):.2f} | {np.median(r):.2f} ({min(r):.2f}–{max(r):.2f}) | ≤ {AIM} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
