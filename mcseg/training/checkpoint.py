"""Checkpoints: written atomically, read without unpickling code (:mod:`mcseg.inference.build` reads them).

A checkpoint is a dict of tensors, numbers, strings and containers only, so
``torch.load(weights_only=True)`` reads it: a file shared between labs cannot run code.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from mcseg.files import atomic_write, torch_save


def rng_states() -> dict:
    """Python, NumPy and torch RNG states in a ``weights_only``-loadable form.

    CUDA: the state of this process's current device only (``cuda_device``), so a run saved
    with N visible GPUs resumes with any number (each torchrun rank uses one device).
    """
    np_state = np.random.get_state()
    states = {
        "python": list(random.getstate()[1]) + [random.getstate()[2] or 0],
        "python_version": random.getstate()[0],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda_device"] = torch.cuda.get_rng_state()
    return states


def restore_rng_states(states: dict) -> None:
    """Restore :func:`rng_states`; also reads older checkpoints holding every GPU's state (``cuda``)."""
    py = states["python"]
    random.setstate((states["python_version"], tuple(py[:-1]), py[-1] or None))
    keys = states["numpy"]["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, states["numpy"]["pos"], 0, 0.0))
    torch.set_rng_state(states["torch"].cpu())  # torch accepts CPU ByteTensors only
    if not torch.cuda.is_available():
        return
    cuda = states.get("cuda_device")
    if cuda is None and states.get("cuda"):  # the former format: one state per GPU visible at save time
        saved = states["cuda"]
        cuda = saved[min(torch.cuda.current_device(), len(saved) - 1)]
    if cuda is not None:
        torch.cuda.set_rng_state(cuda.cpu())


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write ``state`` to ``path`` through a temporary file and a rename."""
    atomic_write(Path(path), lambda tmp: torch_save(state, tmp))
