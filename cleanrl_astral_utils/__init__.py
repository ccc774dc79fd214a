"""What is not the method: run bookkeeping, checkpoints, evaluation reports, plots, video and the LLM client.

The scripts in cleanrl_astral/ import from here only where a run needs it (saving a model, writing a report, asking an
LLM), as CleanRL imports cleanrl_utils; a training run with default flags needs nothing but its own file."""
