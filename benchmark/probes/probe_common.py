"""What the maml_ssm probes in this folder share: where the script is, and loading it (or a patched copy)."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "cleanrl_astral", "maml_ssm.py")


def load_script(path):
    """maml_ssm.py, or a probe's patched copy of it: its model class is what a probe checkpoint must act with."""
    spec = importlib.util.spec_from_file_location("maml_ssm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
