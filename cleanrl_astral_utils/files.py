"""Files written so that a killed run never leaves a half-written one: a temporary file beside the target, then
os.replace, which is atomic on one file system."""

import json
import os

import torch


def atomic_torch_save(obj, path):
    """torch.save(obj, path), atomically."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_json(obj, path, indent=2):
    """json.dump(obj) to path, atomically."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
