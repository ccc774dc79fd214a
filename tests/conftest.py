import pytest
import torch

# The networks under test are tiny: one thread is fastest and keeps `pytest -n 2` from oversubscribing 2 cores.
torch.set_num_threads(1)


@pytest.fixture
def die_after_third_checkpoint():
    """Python code for `python -c CODE SCRIPT ARGS...`: runs SCRIPT and dies like SIGKILL (os._exit: no atexit, no
    writer close) right after its third checkpoint.pt is written. TensorBoard's writer thread is slowed down (a slow
    disk), so events still queued at the kill are lost unless the script flushed them before the checkpoint."""
    return """
import os, runpy, sys, time
from tensorboard.summary.writer import record_writer
real_write = record_writer.RecordWriter.write
def slow_write(self, data):
    time.sleep(0.02)
    real_write(self, data)
record_writer.RecordWriter.write = slow_write
real_replace, saved = os.replace, []
def replace(src, dst):
    real_replace(src, dst)
    if str(dst).endswith("checkpoint.pt"):
        saved.append(dst)
        if len(saved) == 3:
            os._exit(0)
os.replace = replace
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
