"""Checkpoints: written atomically, read without unpickling code.

A checkpoint is a dict of tensors, numbers, strings and containers only, so
``torch.load(weights_only=True)`` reads it: a file shared between labs cannot run code.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from mcseg.data.io import atomic_write, torch_save

REQUIRED_KEYS = ("model", "optimizer", "epoch", "config")


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


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with ``weights_only=True`` and check its structure."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: not an mcseg checkpoint (a file train.py writes to <run>/checkpoints/); "
                         f"torch.load(weights_only=True) refused it: {_load_error(exc)}") from exc
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path}: checkpoint lacks keys {missing}")
    return state


def _load_error(exc: Exception) -> str:
    """The reason in torch.load's error, without its advice to retry with ``weights_only=False`` (which
    would run whatever code the file holds)."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def load_model_weights(model: torch.nn.Module, weights: dict, source: str | Path) -> None:
    """Load ``weights`` into ``model`` strictly, naming mismatched keys and shapes on failure."""
    own = model.state_dict()
    bad = [k for k, v in weights.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if bad or missing or unexpected:
        details = [f"shape mismatch {k}: {tuple(weights[k].shape)} vs model {tuple(own[k].shape)}" for k in bad[:3]]
        details += [f"missing {missing[:3]}"] if missing else []
        details += [f"unexpected {unexpected[:3]}"] if unexpected else []
        raise ValueError(f"{source}: weights do not fit the configured model: " + "; ".join(details))
    model.load_state_dict(weights)
