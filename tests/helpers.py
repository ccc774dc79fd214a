"""What the test files share: running a script as a user would, and reading what a run wrote."""

import glob
import hashlib
import json
import os
import subprocess
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# one thread per run: the networks are tiny, and `pytest -n 2` must not oversubscribe 2 cores; wandb never goes online
SCRIPT_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
# What decides the last digits of a float on x86-64 besides the code: torch's kernel dispatch, MKL's code path and
# oneDNN's instruction set (torch runs GELU through oneDNN). Pinned to paths that every x86-64 CPU has, a run gives the
# same bits on AVX2 and AVX-512 machines, Intel or AMD; a test that compares with a recording runs its script so.
PINNED_ARITHMETIC = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}


def script_path(name):
    """The path of cleanrl_astral/{name}.py."""
    return os.path.join(REPO, "cleanrl_astral", f"{name}.py")


def run_script(name, *args, check=False, timeout=600, cwd=REPO, env=None):
    """Runs cleanrl_astral/{name}.py with `args` in a subprocess, as a user would; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, script_path(name), *map(str, args)],
        cwd=cwd,
        env=env or SCRIPT_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def logged_scalars(run_dir):
    """{tag: [(step, value), ...]} of a run's TensorBoard scalars, read with TensorBoard's own reader."""
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def only_run_dir(runs_dir):
    """The one run directory under runs_dir (fails if there are none or several)."""
    dirs = [d for d in os.listdir(runs_dir) if os.path.isdir(os.path.join(runs_dir, d))]
    assert len(dirs) == 1, dirs
    return os.path.join(runs_dir, dirs[0])


def load_json(pattern):
    """The JSON file that the glob `pattern` matches (fails unless exactly one does)."""
    (path,) = glob.glob(str(pattern))
    with open(path) as f:
        return json.load(f)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def assert_one_line_error(result, needle):
    """The run failed before any work with exit code 2 and one line on stderr that contains `needle`."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert needle in lines[0], lines[0]
