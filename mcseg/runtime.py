"""Device choice, seeding and determinism switches."""
from __future__ import annotations

import random

import numpy as np
import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present, else CPU; an unavailable CUDA device is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"trainer.device={name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but no CUDA device is available")
    return device


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = not deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def use_channels_last(setting: str | bool, device: torch.device, spatial_dims: int) -> bool:
    """``trainer.channels_last``: ``auto`` is on for 2D networks on CUDA only.

    cuDNN's convolutions run faster in NHWC with bf16 on tensor cores; its 3D (NDHWC)
    kernels gain less and some are slower, and the CPU gains nothing, so ``auto`` leaves
    those in the default layout. ``true`` forces it (2D and 3D), ``false`` disables it.
    """
    value = str(setting).lower()
    if value not in ("auto", "true", "false"):
        raise ValueError(f"trainer.channels_last={setting!r}: expected auto, true or false")
    if value == "auto":
        return device.type == "cuda" and spatial_dims == 2
    return value == "true"


def to_channels_last(module: torch.nn.Module, spatial_dims: int) -> torch.nn.Module:
    """Put ``module``'s 4D/5D parameters in the channels-last layout (in place)."""
    return module.to(memory_format=torch.channels_last if spatial_dims == 2 else torch.channels_last_3d)
