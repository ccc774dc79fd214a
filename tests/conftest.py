import os
import time

import pytest
import torch

# The networks under test are tiny: one thread is fastest and keeps `pytest -n 2` from oversubscribing 2 cores.
torch.set_num_threads(1)


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
