"""What the tests of benchmark/ share: importing and running its scripts, fake commands for the runner, the manifest.

benchmark/ is a folder of scripts, not a package; the rest (REPO, the environment of a run) comes from helpers.py."""

import importlib.util
import json
import os
import sys

from helpers import REPO, run_python

BENCHMARK_DIR = os.path.join(REPO, "benchmark")


def benchmark_path(name):
    """The path of benchmark/{name}.py."""
    return os.path.join(BENCHMARK_DIR, f"{name}.py")


def load_benchmark_script(name):
    """benchmark/{name}.py imported by path, once per process (as module `_benchmark_{name}`)."""
    module_name = f"_benchmark_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, benchmark_path(name))
        module = importlib.util.module_from_spec(spec)
        # registered before it runs: dataclasses and inspect look a module's classes up in sys.modules
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def run_benchmark_script(name, *args, check=False, timeout=600, cwd=REPO, env=None):
    """Runs benchmark/{name}.py with `args` in a process of its own, as a user would; returns the CompletedProcess."""
    return run_python([benchmark_path(name), *map(str, args)], check=check, timeout=timeout, cwd=cwd, env=env)


def run_benchmark(*args, env=None, cwd=REPO):
    """Runs the runner, benchmark/benchmark.py, without its progress bar."""
    return run_benchmark_script("benchmark", "--no-progress", *args, env=env, cwd=cwd)


def manifest(out):
    """Every record of the sweep's manifest.jsonl, in the order written."""
    with open(os.path.join(out, "manifest.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_script(path, body):
    """A fake command for the runner: a Python script that takes --seed, --runs-dir and --tag (as `a`), then runs
    `body`."""
    path.write_text(
        "import argparse, os, sys\n"
        "p = argparse.ArgumentParser(); p.add_argument('--seed', type=int); p.add_argument('--runs-dir')\n"
        "p.add_argument('--tag', default='')\n"
        "a = p.parse_args()\n" + body
    )
    return path
