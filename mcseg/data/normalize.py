"""Intensity normalisation, per case and per channel (modality)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

SCHEMES = ("zscore", "none")
_KEYS = ("scheme", "clip", "nonzero")


def normalize(
    image: np.ndarray, scheme: str = "zscore", clip: Sequence[float] | None = None, nonzero: bool = False,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Normalise a ``C x *S`` image.

    ``clip=(lo, hi)`` first clips intensities (CT: Hounsfield units, e.g. ``(-160, 240)``
    for abdominal soft tissue); ``scheme="zscore"`` then maps each channel to zero mean
    and unit variance over the case's voxels (nnU-Net's scheme for MRI). ``nonzero=True``
    takes the statistics over the voxels where some channel is non-zero (skull-stripped
    brain MRI such as BraTS) and sets the other voxels to 0; ``mask`` gives that region instead.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"dataset.normalization.scheme={scheme!r}: expected one of {SCHEMES}")
    image = image.astype(np.float32, copy=True)
    if nonzero and mask is None:
        mask = (image != 0).any(axis=0)
    if not nonzero:
        mask = None
    if mask is not None and not mask.any():
        mask = None
    if clip is not None:
        lo, hi = (float(v) for v in clip)
        if not lo < hi:
            raise ValueError(f"dataset.normalization.clip={list(clip)}: expected [low, high] with low < high")
        np.clip(image, lo, hi, out=image)
    if scheme == "zscore":
        if mask is None:
            axes = tuple(range(1, image.ndim))
            mean = image.mean(axis=axes, keepdims=True, dtype=np.float64)
            std = image.std(axis=axes, keepdims=True, dtype=np.float64)
            image = ((image - mean) / np.maximum(std, 1e-8)).astype(np.float32)
        else:
            for c in range(image.shape[0]):
                values = image[c][mask]
                mean, std = float(values.mean(dtype=np.float64)), float(values.std(dtype=np.float64))
                image[c] = (image[c] - mean) / max(std, 1e-8)
    if mask is not None:
        image[:, ~mask] = 0
    return image


def check_normalization(spec: Mapping | Sequence[Mapping] | None, in_channels: int | None = None) -> list[dict] | dict:
    """Validate a ``dataset.normalization`` node: one ``{scheme, clip, nonzero}`` dict for every
    channel, or a list with one dict per channel (e.g. a CT and an MR channel)."""
    if spec is None:
        return {"scheme": "zscore", "clip": None}
    specs = list(spec) if isinstance(spec, Sequence) and not isinstance(spec, (str, Mapping)) else [spec]
    for i, item in enumerate(specs):
        where = "dataset.normalization" + (f"[{i}]" if len(specs) > 1 or not isinstance(spec, Mapping) else "")
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}={item!r}: expected a mapping with keys {_KEYS}")
        unknown = sorted(set(item) - set(_KEYS))
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: unknown key (expected {', '.join(_KEYS)})")
        if item.get("scheme", "zscore") not in SCHEMES:
            raise ValueError(f"{where}.scheme={item.get('scheme')!r}: expected one of {SCHEMES}")
        clip = item.get("clip")
        if clip is not None and (len(clip) != 2 or not float(clip[0]) < float(clip[1])):
            raise ValueError(f"{where}.clip={list(clip)}: expected [low, high] with low < high")
    if isinstance(spec, Mapping):
        return dict(spec)
    if in_channels is not None and len(specs) != in_channels:
        raise ValueError(f"dataset.normalization lists {len(specs)} channels, dataset.in_channels={in_channels}")
    return [dict(s) for s in specs]


def normalize_image(image: np.ndarray, spec: Mapping | Sequence[Mapping] | None) -> np.ndarray:
    """Apply a checked normalisation spec (one dict for all channels, or one per channel)."""
    if spec is None:
        return normalize(image)
    if isinstance(spec, Mapping):
        return normalize(image, **spec)
    if len(spec) != image.shape[0]:
        raise ValueError(f"dataset.normalization lists {len(spec)} channels, the image has {image.shape[0]}")
    mask = (image != 0).any(axis=0) if any(s.get("nonzero") for s in spec) else None  # shared over channels
    return np.stack([normalize(image[c : c + 1], **s, mask=mask)[0] for c, s in enumerate(spec)])
