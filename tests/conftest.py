import torch

# The networks under test are tiny: one thread is fastest and keeps `pytest -n 2` from oversubscribing 2 cores.
torch.set_num_threads(1)
