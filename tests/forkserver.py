"""A Python process that imports what the scripts import once, then starts each script run as a fork of itself.

`python script.py ...` spends 2-5 CPU-seconds importing torch (with torch._dynamo, which the first optimizer pulls
in), TensorBoard, gymnasium, tyro and matplotlib, and the suite starts a few hundred such runs. `tests/helpers.py`
starts this server once per test process and sends it every run made in the scripts' test environment (`SCRIPT_ENV`,
which this process was started with). Each run is a fork that does what a new interpreter would do with `python
<argv>`: it changes to the run's directory, reads stdin from /dev/null, writes stdout and stderr to the caller's
files, seeds Python's, NumPy's and torch's global generators afresh, puts the script's directory first on sys.path,
runs the script as `__main__` and exits as the interpreter does (SystemExit's code, 1 and a traceback on an uncaught
exception, non-daemon threads joined, atexit handlers run, streams flushed).

Protocol, one JSON line each way: the request {"argv": [script, *args], "cwd": dir, "stdout": path, "stderr": path};
the answers {"pid": pid} once the run has started and {"returncode": code} once it has ended (-N: killed by signal N).
"""

import atexit
import json
import os
import random
import runpy
import sys
import threading
import traceback

import gymnasium  # noqa: F401
import gymnasium.wrappers.utils  # noqa: F401
import matplotlib
import numpy as np
import torch
import torch._dynamo  # noqa: F401  (imported by the first optimizer a run builds: ~2 CPU-s)
import torch.distributions.categorical  # noqa: F401
import torch.func  # noqa: F401
import torch.nn  # noqa: F401
import tyro  # noqa: F401
from torch.utils.tensorboard import SummaryWriter  # noqa: F401

try:
    import openai  # noqa: F401  (the LLM parent's client, from requirements-llm.txt)
except ImportError:
    pass
matplotlib.use("Agg")  # what the scripts' plots choose, and what matplotlib picks itself without a display
import matplotlib.pyplot  # noqa: E402, F401


def exit_code(code):
    """The exit status of `raise SystemExit(code)`, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run(request):
    """The forked child: one script run; never returns."""
    os.chdir(request["cwd"])
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    random.seed()
    np.random.seed()
    torch.seed()
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = exit_code(e.code)
    except BaseException as e:
        shown = e.__traceback__
        while shown is not None and shown.tb_frame.f_code.co_filename != script:
            shown = shown.tb_next  # from the script's own frame on, as the interpreter prints it
        traceback.print_exception(type(e), e, shown or e.__traceback__)
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def answer(message):
    os.write(1, (json.dumps(message) + "\n").encode())


def serve():
    threads = len(os.listdir("/proc/self/task"))
    assert threads == 1, f"{threads} threads after the imports: forking would copy only the one that forks"
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                run(request)
            finally:
                os._exit(70)
        answer({"pid": pid})
        _, status = os.waitpid(pid, 0)
        answer({"returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
