"""reinforce_baby's trained baselines beside the agent, in one table: the same reinforce_baby command run three times with
one seed, as given (the agent), as RL-only (no world model: --world-model-coef 0 --pred-reward-weight 0 --kl-coef 0) and
as KL-distill (--kl-coef, the parent's oracle distilled into the policy). Each is its own run of the script, evaluated by
the script on the same episodes; this writes {runs_dir}/baselines.json with one row per policy (the agent, the random
policy of the agent's run, rl-only, kl-distill) and prints the table.

Usage: python benchmark/reinforce_baby_baselines.py --runs-dir runs/baselines -- --task all --curriculum --num-actions 8 \
    --total-timesteps 80000 --algorithm ppo

benchmark/reinforce_baby.sh's curriculum sweep runs the same three commands over seeds (the documented rows).
"""

import argparse
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cleanrl_astral", "reinforce_baby.py")


def variants(kl_distill_coef: float) -> dict:
    """The flags each baseline appends to the agent's command (the last occurrence of a flag wins)."""
    return {
        "agent": [],
        "rl-only": ["--world-model-coef", "0", "--pred-reward-weight", "0", "--kl-coef", "0", "--no-analysis"],
        "kl-distill": ["--kl-coef", str(kl_distill_coef), "--no-analysis"],
    }


def row(result: dict) -> dict:
    """One flat row of an evaluation: success, entropy, the world model's MSE where there is one, success per level."""
    out = {"success_rate": result["success_rate"], "policy_entropy": result["policy_entropy"]}
    if result.get("world_model_mse") is not None:
        out["world_model_mse"] = result["world_model_mse"]
    out.update({f"success_{k}": v for k, v in result["per_difficulty_success"].items()})
    return out


def run(flags: list[str], name: str, runs_dir: str) -> dict:
    """One run of the script under runs_dir/name; its eval.json."""
    where = os.path.join(runs_dir, name)
    subprocess.run([sys.executable, SCRIPT, *flags, "--runs-dir", where], check=True)
    (run_dir,) = [os.path.join(where, d) for d in os.listdir(where) if os.path.isdir(os.path.join(where, d))]
    with open(os.path.join(run_dir, "eval.json")) as f:
        return json.load(f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs-dir", required=True, help="one sub-directory per policy, and baselines.json")
    p.add_argument("--kl-distill-coef", type=float, default=1.0, help="--kl-coef of the kl-distill run")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the reinforce_baby flags of the agent's run")
    args = p.parse_args(argv)
    flags = args.flags
    if flags[:1] == ["--"]:
        flags = flags[1:]
    if "--runs-dir" in flags:
        p.error("--runs-dir goes before --: each policy's run gets its own sub-directory")
    if os.path.exists(args.runs_dir):
        p.error(f"--runs-dir {args.runs_dir} exists: pass a new directory")
    rows = {}
    for name, extra in variants(args.kl_distill_coef).items():
        print(f"training {name}: reinforce_baby.py {' '.join(flags + extra)}", flush=True)
        ev = run(flags + extra, name, args.runs_dir)
        rows[name] = row(ev)
        if name == "agent":
            rows.update(ev["baselines"])
    print(f"\n{'policy':<12} {'success':>8} {'wm_mse':>8} {'entropy':>8}")
    for name, r in rows.items():
        mse = "-"
        if "world_model_mse" in r:
            mse = f"{r['world_model_mse']:.3f}"
        print(f"{name:<12} {r['success_rate']:>8.3f} {mse:>8} {r['policy_entropy']:>8.3f}")
    with open(os.path.join(args.runs_dir, "baselines.json"), "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
