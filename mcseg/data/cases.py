"""Case records and the checks every loaded case passes before it reaches a network."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcseg.data.io import VolumeError, read_volume


@dataclass(frozen=True)
class CaseRef:
    """Where one case lives on disk: one file per channel (or one multi-channel file) and a label."""

    case_id: str
    image_paths: tuple[Path, ...]
    label_path: Path | None


@dataclass
class CaseData:
    """A loaded case: ``image`` C x *S float32, ``label`` *S int64 (or R x *S for multi-label)."""

    case_id: str
    image: np.ndarray
    label: np.ndarray | None
    spacing: tuple[float, ...]
    affine: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(self.image.shape[1:])


def load_case(ref: CaseRef, num_classes: int, spatial_dims: int = 3) -> CaseData:
    """Read a case's channels and label, check that they agree, and stack channels first.

    Raises :class:`VolumeError` naming the file when shapes disagree, a label is out of
    ``[0, num_classes)``, label values are not integers, or intensities are not finite.
    """
    channels = []
    spacing = affine = None
    for path in ref.image_paths:
        vol = read_volume(path, spatial_dims)
        arr = vol.array
        arr = arr[..., None] if arr.ndim == spatial_dims else arr  # add a channel axis
        arr = arr.reshape(arr.shape[:spatial_dims] + (-1,))
        if spacing is None:
            spacing, affine, shape = vol.spacing, vol.affine, vol.spatial_shape
        elif vol.spatial_shape != shape:
            raise VolumeError(
                f"{path}: channel shape {vol.spatial_shape} differs from {ref.image_paths[0]} shape {shape}"
            )
        channels.append(np.moveaxis(arr, -1, 0))
    image = np.concatenate(channels, axis=0).astype(np.float32, copy=False)
    if not np.isfinite(image).all():
        raise VolumeError(f"{ref.image_paths[0]}: image of case {ref.case_id} contains NaN or inf values")
    label = None
    if ref.label_path is not None:
        lab = read_volume(ref.label_path, spatial_dims)
        if lab.spatial_shape != shape or lab.array.ndim != spatial_dims:
            raise VolumeError(
                f"{ref.label_path}: label shape {lab.array.shape} does not match image shape {shape} "
                f"of {ref.image_paths[0]}"
            )
        label = check_label(lab.array, num_classes, ref.label_path)
    return CaseData(ref.case_id, image, label, tuple(spacing), affine)


def check_label(array: np.ndarray, num_classes: int, source: object) -> np.ndarray:
    """Return ``array`` as int64 after checking values are integers in ``[0, num_classes)``."""
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all() or not np.all(np.mod(array, 1) == 0):
            raise VolumeError(f"{source}: label map holds non-integer values")
    label = array.astype(np.int64)
    lo, hi = int(label.min()), int(label.max())
    if lo < 0 or hi >= num_classes:
        bad = sorted(int(v) for v in np.unique(label) if v < 0 or v >= num_classes)
        raise VolumeError(
            f"{source}: label values {bad} outside [0, {num_classes - 1}] "
            f"(the task has num_classes={num_classes})"
        )
    return label
