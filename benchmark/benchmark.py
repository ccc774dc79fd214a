"""Benchmark runner: runs every command x grid point x seed, locally or on a Ray cluster, and never loses a failure.

Each run gets its own runs dir (<output>/runs/<run_key>/, passed as `--runs-dir`), its own log file
(<output>/logs/<run_key>.attempt<k>.log), one JSON line per attempt in <output>/manifest.jsonl and, once it
exits 0, a completion marker (<output>/markers/<run_key>.json) that `--resume` uses to skip it.

Usage:
    python benchmark/benchmark.py --command "python cleanrl_astral/ppo_gru_baseline.py --total-timesteps 500000" \
        --grid "--modes-preset seed3 inverted4" --num-seeds 3 --workers 2 --output benchmark/out/ppo_gru_baseline
"""

import argparse
import concurrent.futures
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm


@dataclass
class RunSpec:
    """One expanded run: what to execute and where its files go."""

    run_key: str
    command_index: int
    command: str
    grid_index: int
    grid: list
    seed: int
    argv: list
    cwd: str
    runs_dir: str
    log_dir: str
    threads: int
    num_commands: int = 1  # how many --command values the sweep has: the report numbers commands across sweeps


def parse_grid_spec(spec: str) -> list[list[str]]:
    """One grid dimension -> its points, each a list of extra argv tokens.

    "--flag v1 v2" gives [[--flag, v1], [--flag, v2]]; "A | B | C" gives the three flag strings as
    alternatives (for boolean flags or several flags at once; an empty alternative adds nothing).
    """
    try:
        alternatives = [shlex.split(alt) for alt in spec.split("|")]
    except ValueError as e:  # shlex: "No closing quotation" and the like
        raise ValueError(f"grid spec {spec!r} cannot be split into arguments ({e}); check its quotes") from e
    if "|" in spec:
        return alternatives
    tokens = alternatives[0]
    if len(tokens) < 2 or not tokens[0].startswith("-"):
        raise ValueError(f"grid spec {spec!r} must be '--flag value1 value2 ...' or 'alternative1 | alternative2 | ...'")
    if any(value.startswith("--") for value in tokens[1:]):
        # "--modes-preset seed3 --hide-velocity" would otherwise run "--modes-preset --hide-velocity" as a value
        raise ValueError(
            f"grid spec {spec!r} puts a flag among the values of {tokens[0]}; give several flags of one grid point as "
            "alternatives ('--a 1 --b | --a 2 --b') or put fixed flags in --command"
        )
    return [[tokens[0], value] for value in tokens[1:]]


def slug(tokens: list[str], max_len: int = 60) -> str:
    text = "_".join(t.lstrip("-") for t in tokens) or "base"
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", text)[:max_len]


def expand(
    commands: list[str],
    grid_specs: list[str],
    seeds: list[int],
    output: str,
    cwd: str,
    threads: int = 1,
) -> list[RunSpec]:
    """Command x grid x seed, in that nesting order; the grid is the Cartesian product of all grid specs."""
    dimensions = [parse_grid_spec(spec) for spec in grid_specs]
    grid_points = [sum(combo, []) for combo in itertools.product(*dimensions)]
    specs = []
    for ci, command in enumerate(commands):
        for gi, point in enumerate(grid_points):
            for seed in seeds:
                run_key = f"c{ci}__g{gi}_{slug(point)}__s{seed}"
                runs_dir = os.path.join(output, "runs", run_key)
                argv = shlex.split(command) + point + ["--seed", str(seed), "--runs-dir", runs_dir]
                specs.append(
                    RunSpec(
                        run_key=run_key,
                        command_index=ci,
                        command=command,
                        grid_index=gi,
                        grid=point,
                        seed=seed,
                        argv=argv,
                        cwd=cwd,
                        runs_dir=runs_dir,
                        log_dir=os.path.join(output, "logs"),
                        threads=threads,
                        num_commands=len(commands),
                    )
                )
    return specs


def command_hash(spec: RunSpec) -> str:
    return hashlib.sha256(json.dumps(spec.argv).encode()).hexdigest()[:16]


# the runs this process is waiting on, so a killed runner can stop them instead of leaving orphans behind
RUNNING: set = set()


def execute(spec: RunSpec, attempt: int) -> dict:
    """Run one attempt in a subprocess (locally or inside a Ray task) and return its manifest record."""
    # a retried or resumed run starts from an empty runs dir, so exactly one run subdirectory is left behind
    shutil.rmtree(spec.runs_dir, ignore_errors=True)
    os.makedirs(spec.runs_dir, exist_ok=True)
    os.makedirs(spec.log_dir, exist_ok=True)
    log_path = log_path_of(spec, attempt)
    env = dict(os.environ, OMP_NUM_THREADS=str(spec.threads), MKL_NUM_THREADS=str(spec.threads))
    started = time.time()
    with open(log_path, "w") as log:
        log.write(f"# {shlex.join(spec.argv)}\n# cwd: {spec.cwd}\n# host: {socket.gethostname()}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                spec.argv, cwd=spec.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            RUNNING.add(proc)
            try:
                exit_code = proc.wait()
            finally:
                RUNNING.discard(proc)
        except OSError as e:
            log.write(f"benchmark.py: could not start the command: {e}\n")
            exit_code = 127
    wall_time = time.time() - started
    run_subdirs = sorted(d for d in os.listdir(spec.runs_dir) if os.path.isdir(os.path.join(spec.runs_dir, d)))
    return attempt_record(
        spec,
        attempt,
        run_dirs=[os.path.join(spec.runs_dir, d) for d in run_subdirs],
        exit_code=exit_code,
        wall_time_s=round(wall_time, 3),
        started_at=started,
        host=socket.gethostname(),
    )


def log_path_of(spec: RunSpec, attempt: int) -> str:
    return os.path.join(spec.log_dir, f"{spec.run_key}.attempt{attempt}.log")


def attempt_record(spec: RunSpec, attempt: int, run_dirs: list, exit_code: int, wall_time_s, started_at, host) -> dict:
    """The manifest record of one attempt of `spec`."""
    return {
        "run_key": spec.run_key,
        "command_index": spec.command_index,
        "num_commands": spec.num_commands,
        "command": spec.command,
        "grid_index": spec.grid_index,
        "grid": shlex.join(spec.grid),
        "seed": spec.seed,
        "argv": spec.argv,
        "full_command": shlex.join(spec.argv),
        "command_hash": command_hash(spec),
        "cwd": spec.cwd,
        "runs_dir": spec.runs_dir,
        "run_dirs": run_dirs,
        "log_path": log_path_of(spec, attempt),
        "attempt": attempt,
        "exit_code": exit_code,
        "wall_time_s": wall_time_s,
        "started_at": started_at,
        "host": host,
    }


def failed_record(spec: RunSpec, attempt: int, error: str) -> dict:
    """Manifest record of an attempt whose task raised instead of returning (no exit code, no wall time)."""
    record = attempt_record(spec, attempt, run_dirs=[], exit_code=-1, wall_time_s=None, started_at=None, host=None)
    record["error"] = error
    return record


def marker_path(output: str, run_key: str) -> str:
    return os.path.join(output, "markers", f"{run_key}.json")


def is_complete(output: str, spec: RunSpec) -> bool:
    """A run counts as done only if its marker exists and was written for exactly this command line."""
    try:
        with open(marker_path(output, spec.run_key)) as f:
            return json.load(f).get("command_hash") == command_hash(spec)
    except (OSError, json.JSONDecodeError):
        return False


def write_atomic(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class LocalBackend:
    """A pool of worker threads, each waiting on one subprocess at a time: at most `workers` runs at once."""

    def __init__(self, workers: int):
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)

    def submit(self, spec: RunSpec, attempt: int) -> concurrent.futures.Future:
        return self.pool.submit(execute, spec, attempt)

    def shutdown(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(RUNNING):
            proc.terminate()
        for proc in list(RUNNING):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


class RayUnavailable(RuntimeError):
    pass


class RayBackend:
    """Each run is a Ray task reserving `cpus_per_run` CPUs; Ray's scheduler spreads them over the cluster."""

    def __init__(self, address: str | None, cpus_per_run: float, local_num_cpus: int | None):
        try:
            import ray
        except ImportError as e:
            raise RayUnavailable(f"ray is not installed ({e}); pip install ray, or use --backend local") from e
        self.ray = ray
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(num_cpus=local_num_cpus, include_dashboard=False, log_to_driver=False)
            except Exception as e:
                where = f"connect to the Ray cluster at {address}" if address else "start a local Ray instance"
                raise RayUnavailable(f"could not {where}: {type(e).__name__}: {e}") from e
        # a failing command is a result, not a crash: Ray must not silently re-run it
        self.remote_execute = ray.remote(num_cpus=cpus_per_run, max_retries=0)(execute)

    def submit(self, spec: RunSpec, attempt: int) -> concurrent.futures.Future:
        return self.remote_execute.remote(spec, attempt).future()

    def shutdown(self):
        self.ray.shutdown()


def recorded_attempts(manifest: str) -> dict:
    """run key -> highest attempt number in the manifest (unreadable lines are skipped: report.py names them)."""
    highest = {}
    if os.path.isfile(manifest):
        with open(manifest) as f:
            for line in f:
                try:
                    record = json.loads(line)
                    key = record["run_key"]
                    attempt = int(record["attempt"])
                except (ValueError, KeyError, TypeError):
                    continue
                highest[key] = max(highest.get(key, 0), attempt)
    return highest


def previous_attempts(spec: RunSpec, recorded: dict) -> int:
    """Attempts an earlier invocation made, so numbering continues after them: the highest of the run's attempt logs
    (killed attempts leave one too) and of its manifest records (a Ray task that died wrote no log)."""
    pattern = re.compile(re.escape(spec.run_key) + r"\.attempt(\d+)\.log$")
    from_logs = 0
    if os.path.isdir(spec.log_dir):
        for name in os.listdir(spec.log_dir):
            match = pattern.match(name)
            if match:
                from_logs = max(from_logs, int(match.group(1)))
    return max(from_logs, recorded.get(spec.run_key, 0))


def run_sweep(specs: list[RunSpec], backend, output: str, retries: int, show_progress: bool = True) -> list[dict]:
    """Run all specs, re-submitting failures up to `retries` times; returns the final record of every run."""
    manifest = os.path.join(output, "manifest.jsonl")
    final = {}
    pending = {}  # future -> its spec
    attempt_of = {}  # future -> its attempt number
    tries = {}  # run key -> attempts submitted by this invocation

    def submit(spec, attempt):
        # the attempt empties the run's directory, so a marker left by an earlier success must go with it: if this
        # attempt fails or is killed, --resume has to run it again
        try:
            os.remove(marker_path(output, spec.run_key))
        except FileNotFoundError:
            pass
        future = backend.submit(spec, attempt)
        pending[future] = spec
        attempt_of[future] = attempt
        tries[spec.run_key] = tries.get(spec.run_key, 0) + 1

    recorded = recorded_attempts(manifest)
    for spec in specs:
        submit(spec, previous_attempts(spec, recorded) + 1)
    progress = tqdm(total=len(specs), desc="runs", unit="run", disable=not show_progress, file=sys.stderr)
    try:
        while pending:
            done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                spec = pending.pop(future)
                attempt = attempt_of.pop(future)
                try:
                    record = future.result()
                except Exception as e:
                    # the task itself broke (e.g. a Ray worker or node died): a failed attempt, not a crash
                    record = failed_record(spec, attempt, f"{type(e).__name__}: {e}")
                with open(manifest, "a") as f:
                    f.write(json.dumps(record) + "\n")
                if record["exit_code"] == 0:
                    write_atomic(marker_path(output, spec.run_key), json.dumps(record))
                elif tries[spec.run_key] <= retries:
                    progress.write(
                        f"benchmark.py: {spec.run_key} failed (exit code {record['exit_code']}, log {record['log_path']}); "
                        f"retry {tries[spec.run_key]}/{retries}"
                    )
                    submit(spec, attempt + 1)
                    continue
                final[spec.run_key] = record
                progress.update(1)
                progress.set_postfix(failed=sum(r["exit_code"] != 0 for r in final.values()))
    finally:
        progress.close()
    return [final[spec.run_key] for spec in specs]


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="benchmark.py",
        description="Run commands x grid points x seeds and record every run (see docs/benchmark.md).",
    )
    p.add_argument(
        "--command",
        nargs="+",
        action="extend",
        required=True,
        help="command(s) to benchmark; each is run with '--seed N --runs-dir DIR' and the grid flags appended",
    )
    p.add_argument(
        "--env-ids", nargs="+", default=[], help="shorthand for a grid dimension over --env-id (CleanRL compatible)"
    )
    p.add_argument(
        "--grid",
        nargs="+",
        action="extend",
        default=[],
        help="grid dimension(s): '--flag v1 v2' or 'alt1 | alt2' (several specs form a Cartesian product; "
        "write --grid=--flag when a spec has no space)",
    )
    p.add_argument("--num-seeds", type=int, default=3, help="number of seeds per command and grid point")
    p.add_argument("--start-seed", type=int, default=1, help="first seed; seeds are start-seed .. start-seed+num-seeds-1")
    p.add_argument("--workers", type=int, default=1, help="local backend: runs at the same time")
    p.add_argument("--threads-per-run", type=int, default=1, help="OMP_NUM_THREADS/MKL_NUM_THREADS set for every run")
    p.add_argument("--retries", type=int, default=0, help="re-run a failed run up to this many more times")
    p.add_argument("--resume", action="store_true", help="skip runs whose completion marker exists for the same command line")
    p.add_argument("--dry-run", action="store_true", help="print the expanded commands and exit")
    p.add_argument(
        "--output", default="benchmark/out/sweep", help="sweep directory: runs/, logs/, markers/ and manifest.jsonl go here"
    )
    p.add_argument(
        "--cwd", default=os.getcwd(), help="working directory of every run (on a Ray cluster it must exist on every node)"
    )
    p.add_argument("--backend", choices=["local", "ray"], default="local", help="where runs execute")
    p.add_argument(
        "--ray-address",
        default=None,
        help="ray backend: 'auto' or HOST:PORT of a running cluster; unset starts a local Ray instance",
    )
    p.add_argument("--cpus-per-run", type=float, default=1.0, help="ray backend: CPUs reserved by each run")
    p.add_argument(
        "--ray-num-cpus",
        type=int,
        default=None,
        help="ray backend without --ray-address: CPUs of the local Ray instance (default: all)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = p.parse_args(argv)
    if args.env_ids:
        args.grid = ["--env-id " + " ".join(shlex.quote(e) for e in args.env_ids)] + args.grid
    try:
        validate(args)
    except ValueError as e:
        print(f"benchmark.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    return args


def validate(args):
    """Every check of the flags that can fail before any run starts."""
    if args.num_seeds < 1:
        raise ValueError("--num-seeds must be >= 1")
    if args.workers < 1:
        raise ValueError("--workers must be >= 1")
    if args.retries < 0:
        raise ValueError("--retries must be >= 0")
    if args.threads_per_run < 1:
        raise ValueError("--threads-per-run must be >= 1")
    if args.start_seed < 0:
        raise ValueError(f"--start-seed must be >= 0, got {args.start_seed}")
    if not math.isfinite(args.cpus_per_run) or args.cpus_per_run <= 0:
        raise ValueError(f"--cpus-per-run must be a finite number > 0, got {args.cpus_per_run}")
    if args.ray_num_cpus is not None and args.ray_num_cpus < 1:
        raise ValueError(f"--ray-num-cpus must be >= 1, got {args.ray_num_cpus}")
    local_cpus = args.ray_num_cpus or os.cpu_count()
    # Ray would keep every run pending forever, silently; a cluster's size is not known here
    if args.backend == "ray" and not args.ray_address and args.cpus_per_run > local_cpus:
        raise ValueError(
            f"--cpus-per-run {args.cpus_per_run} is more than the {local_cpus} CPUs of "
            "the local Ray instance (--ray-num-cpus, default all of this machine's): no run could start"
        )
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise ValueError(f"--output {args.output} is a file; give a directory (it is created if missing)")
    # a missing working directory would make every run fail with exit code 127; a Ray cluster's nodes are not ours
    if not args.ray_address and not os.path.isdir(args.cwd):
        raise ValueError(f"--cwd {args.cwd} is not a directory")
    if args.ray_address and args.backend != "ray":
        raise ValueError("--ray-address needs --backend ray")
    for command in args.command:
        try:
            tokens = shlex.split(command)
        except ValueError as e:  # shlex: "No closing quotation" and the like
            raise ValueError(f"--command {command!r} cannot be split into arguments ({e}); check its quotes") from e
        if not tokens:
            raise ValueError("--command must not be empty")
    for spec in args.grid:
        parse_grid_spec(spec)


def print_dry_run(specs: list[RunSpec], output: str, resume: bool, num_commands: int, num_seeds: int) -> None:
    """Every expanded command line on stdout (marking the runs --resume would skip), a count on stderr."""
    complete = 0
    for spec in specs:
        note = ""
        if resume and is_complete(output, spec):
            complete += 1
            note = " (complete: --resume skips it)"
        print(f"{shlex.join(spec.argv)}  # {spec.run_key}{note}")
    grid_points = len(specs) // num_commands // num_seeds
    summary = f"{len(specs)} runs ({num_commands} commands x {grid_points} grid points x {num_seeds} seeds)"
    if resume:
        summary += f", {complete} already complete"
    print(summary, file=sys.stderr)


def exit_on_sigterm(signum, frame):
    """A killed runner (SIGTERM) unwinds like Ctrl-C: running commands are stopped and get no completion marker."""
    sys.exit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    output = os.path.abspath(args.output)
    seeds = list(range(args.start_seed, args.start_seed + args.num_seeds))
    specs = expand(args.command, args.grid, seeds, output, os.path.abspath(args.cwd), args.threads_per_run)
    # the same command line twice (a repeated --command or grid value) would be pooled by the report as extra seeds
    runs = [(s.command, tuple(s.grid), s.seed) for s in specs]
    if len(set(runs)) != len(runs):
        print(
            "benchmark.py: error: the commands and grid expand to duplicate runs; remove repeated --command or grid values",
            file=sys.stderr,
        )
        return 2

    if args.dry_run:
        print_dry_run(specs, output, args.resume, len(args.command), len(seeds))
        return 0

    os.makedirs(output, exist_ok=True)
    todo = [s for s in specs if not (args.resume and is_complete(output, s))]
    if len(todo) < len(specs):
        print(f"benchmark.py: --resume: skipping {len(specs) - len(todo)} completed runs", file=sys.stderr)
    if not todo:
        print("benchmark.py: nothing to do: every run is complete", file=sys.stderr)
        return 0

    if args.backend == "ray":
        try:
            backend = RayBackend(args.ray_address, args.cpus_per_run, args.ray_num_cpus)
        except RayUnavailable as e:
            print(f"benchmark.py: error: {e}", file=sys.stderr)
            return 3
    else:
        backend = LocalBackend(args.workers)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        records = run_sweep(todo, backend, output, args.retries, show_progress=not args.no_progress)
    finally:
        backend.shutdown()

    failed = [r for r in records if r["exit_code"] != 0]
    print(
        f"benchmark.py: {len(records) - len(failed)} of {len(records)} runs succeeded; "
        f"manifest: {os.path.join(output, 'manifest.jsonl')}",
        file=sys.stderr,
    )
    for r in failed:
        message = (
            f"benchmark.py: FAILED {r['run_key']} (exit code {r['exit_code']}, attempt {r['attempt']}): {r['full_command']}"
        )
        message += f"\n    log: {r['log_path']}"
        if r.get("error"):
            message += f"\n    error: {r['error']}"
        print(message, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
