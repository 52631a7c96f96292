"""Intensity normalisation, per case and per channel."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SCHEMES = ("zscore", "none")


def normalize(image: np.ndarray, scheme: str = "zscore", clip: Sequence[float] | None = None) -> np.ndarray:
    """Normalise a ``C x *S`` image.

    ``clip=(lo, hi)`` first clips intensities (CT: Hounsfield units, e.g. ``(-160, 240)``
    for abdominal soft tissue); ``scheme="zscore"`` then maps each channel to zero mean
    and unit variance over the case's voxels (nnU-Net's scheme for MRI).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"dataset.normalization.scheme={scheme!r}: expected one of {SCHEMES}")
    image = image.astype(np.float32, copy=True)
    if clip is not None:
        lo, hi = (float(v) for v in clip)
        if not lo < hi:
            raise ValueError(f"dataset.normalization.clip={list(clip)}: expected [low, high] with low < high")
        np.clip(image, lo, hi, out=image)
    if scheme == "zscore":
        axes = tuple(range(1, image.ndim))
        mean = image.mean(axis=axes, keepdims=True)
        std = image.std(axis=axes, keepdims=True)
        image = (image - mean) / np.maximum(std, 1e-8)
    return image
