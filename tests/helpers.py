"""What the test files share: running a script as a user would, and reading what a run wrote."""

import atexit
import glob
import hashlib
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# one thread per run: the networks are tiny, and `pytest -n 2` must not oversubscribe 2 cores; wandb never goes online
SCRIPT_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
# What decides the last digits of a float on x86-64 besides the code: torch's kernel dispatch, MKL's code path and
# oneDNN's instruction set (torch runs GELU through oneDNN). Pinned to paths that every x86-64 CPU has, a run narrows
# its dependence on the CPU but does not remove it: torch's `default` kernels give other last digits on an AMD EPYC
# than on an Intel Xeon. A test that compares with a recording runs its script so, and compares bit for bit only with a
# recording made on its own machine kind (`machine_kind()`), with a tolerance otherwise.
PINNED_ARITHMETIC = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}


def machine_kind(cpuinfo=None):
    """The CPU's vendor, its widest vector extension and AMX, e.g. "GenuineIntel avx512 amx" or "AuthenticAMD avx2":
    what tells two x86-64 machines whose pinned runs may differ in the last digits. Read from `cpuinfo` (the text of
    /proc/cpuinfo; this machine's when None). Off Linux, the platform's name."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return platform.machine()
    lines = cpuinfo.splitlines()
    vendor = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), platform.machine())
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    kind = [vendor]
    if "avx512f" in flags:
        kind.append("avx512")
    elif "avx2" in flags:
        kind.append("avx2")
    if "amx_tile" in flags:
        kind.append("amx")
    return " ".join(kind)


def script_path(name):
    """The path of cleanrl_astral/{name}.py."""
    return os.path.join(REPO, "cleanrl_astral", f"{name}.py")


def run_script(name, *args, check=False, timeout=600, cwd=REPO, env=None):
    """Runs cleanrl_astral/{name}.py with `args` in a process of its own, as a user would; returns the
    CompletedProcess."""
    return run_python([script_path(name), *map(str, args)], check=check, timeout=timeout, cwd=cwd, env=env)


def run_python(argv, check=False, timeout=600, cwd=REPO, env=None):
    """`python *argv` with stdout and stderr captured as text; returns the CompletedProcess. In the scripts' test
    environment (env None or SCRIPT_ENV) the run is a fork of tests/forkserver.py, which has imported torch and the
    rest once for all runs of this test process; any other environment, or TESTS_NO_FORKSERVER=1, starts a new
    interpreter."""
    if env not in (None, SCRIPT_ENV) or os.environ.get("TESTS_NO_FORKSERVER") == "1":
        command = [sys.executable, *argv]
        return subprocess.run(
            command, cwd=cwd, env=env or SCRIPT_ENV, capture_output=True, text=True, timeout=timeout, check=check
        )
    return ForkServer.get().run(argv, cwd=cwd, timeout=timeout, check=check)


class ForkServer:
    """The client of tests/forkserver.py: one server per test process, started on first use."""

    _server = None

    @classmethod
    def get(cls):
        if cls._server is None or cls._server.proc.poll() is not None:
            cls._server = cls()
        return cls._server

    def __init__(self):
        server = os.path.join(REPO, "tests", "forkserver.py")
        self.proc = subprocess.Popen(
            [sys.executable, server], cwd=REPO, env=SCRIPT_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.pending = b""
        self.lock = threading.Lock()
        self.tmp = tempfile.mkdtemp(prefix="forkserver_")
        atexit.register(self.close)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def read_message(self, deadline):
        """The server's next JSON line; None if `deadline` (time.monotonic()) passes first."""
        while b"\n" not in self.pending:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"tests/forkserver.py ended (exit code {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv, cwd, timeout, check):
        with self.lock:
            return self.run_one(argv, cwd, timeout, check)

    def run_one(self, argv, cwd, timeout, check):
        out = os.path.join(self.tmp, "stdout")
        err = os.path.join(self.tmp, "stderr")
        request = {"argv": [os.fspath(a) for a in argv], "cwd": os.fspath(cwd), "stdout": out, "stderr": err}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        pid = self.read_message(None)["pid"]
        deadline = None if timeout is None else time.monotonic() + timeout
        ended = self.read_message(deadline)
        if ended is None:
            os.kill(pid, signal.SIGKILL)
            self.read_message(None)
        with open(out) as f:
            stdout = f.read()
        with open(err) as f:
            stderr = f.read()
        command = [sys.executable, *request["argv"]]
        if ended is None:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        result = subprocess.CompletedProcess(command, ended["returncode"], stdout, stderr)
        if check:
            result.check_returncode()
        return result


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
