import os
import time

import pytest
import torch

# The networks under test are tiny: one thread is fastest and keeps `pytest -n 2` from oversubscribing 2 cores.
torch.set_num_threads(1)


@pytest.fixture
def die_at_checkpoint():
    """`die_at_checkpoint(n, written=True)` is Python code for `python -c CODE SCRIPT ARGS...`: it runs SCRIPT and
    dies like SIGKILL (os._exit: no atexit, no writer close) right after its n-th checkpoint.pt is written, or, with
    written=False, right before (after everything the script does first, such as logging and flushing that
    update). TensorBoard's writer thread is slowed down (a slow disk), so events still queued at the kill are lost
    unless the script flushed them before the checkpoint."""
    def code(n, written=True):
        return f"""
import os, runpy, sys, time
from tensorboard.summary.writer import record_writer
real_write = record_writer.RecordWriter.write
def slow_write(self, data):
    time.sleep(0.02)
    real_write(self, data)
record_writer.RecordWriter.write = slow_write
real_replace, saved = os.replace, []
def replace(src, dst):
    is_checkpoint = str(dst).endswith("checkpoint.pt")
    if is_checkpoint:
        saved.append(dst)
    nth = is_checkpoint and len(saved) == {n}
    if nth and not {written}:
        os._exit(0)
    real_replace(src, dst)
    if nth:
        os._exit(0)
os.replace = replace
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    return code


@pytest.fixture
def logged_scalars():
    """`logged_scalars(run_dir)`: {tag: [(step, wall_time), ...]} as TensorBoard shows the run (resumes purged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def read(run_dir):
        acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        acc.Reload()
        return {tag: [(e.step, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return read


@pytest.fixture
def occupied_run_names():
    """`occupied_run_names(runs_dir, prefix)` takes every run name `{prefix}{t}` a run started now could pick (t =
    int(time.time()) over the next ten minutes), as runs of the same command and seed started in the same second
    would, and returns `check()`. After the run, `check()` asserts that no taken directory was written into and
    returns the one directory the run created for itself."""
    def occupy(runs_dir, prefix):
        now = int(time.time())
        taken = [os.path.join(runs_dir, f"{prefix}{t}") for t in range(now - 1, now + 600)]
        for d in taken:
            os.makedirs(d)
            with open(os.path.join(d, "another_run.txt"), "w") as f:
                f.write("not yours")

        def check():
            for d in taken:
                assert os.listdir(d) == ["another_run.txt"], f"the run wrote into {d}, which another run holds"
            new = sorted(set(os.path.join(runs_dir, n) for n in os.listdir(runs_dir)) - set(taken))
            assert len(new) == 1 and new[0].endswith("__2") and new[0][: -len("__2")] in taken, new
            assert any(f.startswith("events.out.tfevents.") for f in os.listdir(new[0])), os.listdir(new[0])
            return new[0]
        return check
    return occupy


@pytest.fixture
def forward_gae():
    """`forward_gae(rewards, values, continues, gamma, lam)`: GAE of one sequence by its definition, summed forwards,
    A_t = sum_k (gamma lam)^k delta_{t+k} up to the last step of t's episode, delta_s = r_s + gamma c_s V_{s+1} - V_s,
    where c_s = continues[s] is 1 when step s+1 belongs to the same episode (values has T+1 entries; V_T is the
    bootstrap value). An independent check of the scripts' backward recursions."""
    def gae(rewards, values, continues, gamma, lam):
        T = len(rewards)
        deltas = [rewards[s] + gamma * continues[s] * values[s + 1] - values[s] for s in range(T)]
        advantages = []
        for t in range(T):
            total, s = 0.0, t
            while s < T:
                total += (gamma * lam) ** (s - t) * deltas[s]
                if not continues[s]:
                    break
                s += 1
            advantages.append(total)
        return advantages
    return gae
