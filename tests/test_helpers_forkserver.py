"""tests/forkserver.py: a script run as a fork of the server behaves as the same run in a new interpreter."""

import subprocess
import sys

import pytest
from helpers import SCRIPT_ENV, run_python

PROBE = """
import atexit
import os
import random
import sys
import threading
import time

import numpy as np
import torch

print(os.getcwd(), sys.argv[1:], sys.path[0], __name__, __file__)
print("draws", random.random(), np.random.rand(), torch.rand(1).item())
print("to stderr", file=sys.stderr)
atexit.register(print, "atexit ran")
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
if sys.argv[1] == "raise":
    raise ValueError("boom")
if sys.argv[1] == "message":
    sys.exit("a message")
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def fresh(argv, cwd):
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=SCRIPT_ENV, capture_output=True, text=True)


@pytest.mark.parametrize("how", ["0", "3", "raise", "message"])
def test_a_forked_run_ends_as_a_new_interpreter_would(tmp_path, how):
    """Same stdout (but the generators' draws), stderr and exit code as `python probe.py`: argv, cwd, sys.path[0],
    __main__, non-daemon threads joined before the atexit handlers, SystemExit's code or message, a traceback."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    (tmp_path / "elsewhere").mkdir()
    argv = [str(probe), how]
    forked = run_python(argv, cwd=tmp_path / "elsewhere")
    new = fresh(argv, cwd=tmp_path / "elsewhere")
    assert forked.returncode == new.returncode == {"0": 0, "3": 3, "raise": 1, "message": 1}[how]
    assert forked.stderr == new.stderr
    assert "to stderr" in forked.stderr
    without_draws = [[line for line in r.stdout.splitlines() if not line.startswith("draws")] for r in (forked, new)]
    assert without_draws[0] == without_draws[1]
    assert without_draws[0][-2:] == ["thread joined", "atexit ran"]
    assert without_draws[0][0].startswith(f"{tmp_path / 'elsewhere'} ['{how}'] {tmp_path} __main__ {probe}")


def test_each_forked_run_draws_its_own_random_numbers(tmp_path):
    """Python's, NumPy's and torch's global generators are seeded afresh in every run, as in a new interpreter."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    draws = [
        next(line for line in run_python([str(probe), "0"]).stdout.splitlines() if line.startswith("draws")) for _ in "ab"
    ]
    python, numpy_, torch_ = zip(*(d.split()[1:] for d in draws))
    assert python[0] != python[1] and numpy_[0] != numpy_[1] and torch_[0] != torch_[1]


def test_a_run_past_its_timeout_is_killed_and_the_server_serves_the_next(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    with pytest.raises(subprocess.TimeoutExpired):
        run_python([str(probe), "sleep"], timeout=3)
    assert run_python([str(probe), "3"]).returncode == 3
    with pytest.raises(subprocess.CalledProcessError):
        run_python([str(probe), "3"], check=True)
