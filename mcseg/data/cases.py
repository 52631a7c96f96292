"""Case records and the checks every loaded case passes before it reaches a network."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcseg.data.io import Volume, VolumeError, read_volume


@dataclass(frozen=True)
class CaseRef:
    """Where one case lives on disk: one file per channel (or one multi-channel file) and a label.

    A case labelled by several raters has no ``label_path`` but one file per rater in ``raters``, named
    by ``rater_names`` (``seg01``, ``annotation_2``...); its hard label is derived from them
    (:mod:`mcseg.data.raters`).
    """

    case_id: str
    image_paths: tuple[Path, ...]
    label_path: Path | None
    raters: tuple[Path, ...] = ()
    rater_names: tuple[str, ...] = ()

    @property
    def labelled(self) -> bool:
        return self.label_path is not None or bool(self.raters)

    def rater_tag(self, index: int) -> str:
        """What follows a rater file's path in errors: `` (case <id>, rater <name>)``."""
        name = self.rater_names[index] if index < len(self.rater_names) else str(index)
        return f" (case {self.case_id}, rater {name})"

    def rater_source(self, index: int) -> str:
        """How errors name rater ``index`` of this case: its file, the case and the rater."""
        return f"{self.raters[index]}{self.rater_tag(index)}"


@dataclass
class CaseData:
    """A loaded case: ``image`` C x *S float32, ``label`` *S integer (or R x *S {0,1} for multi-label).

    Labels read from files are int64; labels memory-mapped from the preprocessing cache keep
    the cache's compact integer type (uint8 below 256 classes). ``meta`` holds what the
    dataset needs to map predictions back (``geometry``), the ``ref`` and, from the cache,
    ``fg_points`` (foreground voxel coordinates per class, for sampling).
    ``raters`` (``K x *S``, integer) holds the label maps of a case's K raters, ``None`` for a case with one
    label (then ``label`` is a hard target derived from them, :mod:`mcseg.data.raters`).
    """

    case_id: str
    image: np.ndarray
    label: np.ndarray | None
    spacing: tuple[float, ...]
    affine: np.ndarray
    meta: dict = field(default_factory=dict)
    raters: np.ndarray | None = None

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(self.image.shape[1:])


def load_case(
    ref: CaseRef, num_classes: int, spatial_dims: int = 3, label_mapping: Mapping[int, int] | None = None
) -> CaseData:
    """Read a case's channels and label, check that they agree, and stack channels first.

    ``label_mapping`` (e.g. ``{4: 3}`` for BraTS) renames raw label values before the check.
    Raises :class:`VolumeError` naming the file when shapes disagree, a label is out of
    ``[0, num_classes)``, label values are not integers, or intensities are not finite.
    """
    image, first = read_channels(ref, spatial_dims)
    if not np.isfinite(image).all():
        raise VolumeError(f"{ref.image_paths[0]}: image of case {ref.case_id} contains NaN or inf values")
    label = None
    if ref.label_path is not None:
        lab = read_volume(ref.label_path, spatial_dims)
        check_same_grid(lab, first, ref.label_path, ref.image_paths[0], "label", exact_ndim=spatial_dims)
        label = read_label_array(lab.array, num_classes, ref.label_path, label_mapping)
    raters = None
    if ref.raters:
        maps = []
        for r, path in enumerate(ref.raters):
            source = ref.rater_source(r)
            lab = read_volume(path, spatial_dims)
            check_same_grid(lab, first, source, ref.image_paths[0], "rater label", exact_ndim=spatial_dims)
            maps.append(read_label_array(lab.array, num_classes, source, label_mapping))
        raters = np.stack(maps)
    return CaseData(ref.case_id, image, label, tuple(first.spacing), first.affine, raters=raters)


def read_channels(ref: CaseRef, spatial_dims: int = 3) -> tuple[np.ndarray, Volume]:
    """Read every channel file of ``ref`` into one ``C x *S`` float32 array; return it and the first volume."""
    if not ref.image_paths:
        raise VolumeError(f"case {ref.case_id}: no image files")
    channels, first = [], None
    for path in ref.image_paths:
        vol = read_volume(path, spatial_dims)
        if first is None:
            first = vol
        else:
            check_same_grid(vol, first, path, ref.image_paths[0], "channel")
        arr = vol.array
        arr = arr[..., None] if arr.ndim == spatial_dims else arr  # add a channel axis
        arr = arr.reshape(arr.shape[:spatial_dims] + (-1,))
        channels.append(np.moveaxis(arr, -1, 0))
    image = np.concatenate(channels, axis=0).astype(np.float32, copy=False)
    return image, first


def check_same_grid(vol: Volume, reference: Volume, path: Path, ref_path: Path, what: str,
                    exact_ndim: int | None = None) -> None:
    """Raise :class:`VolumeError` naming ``path`` when ``vol``'s voxel grid differs from ``reference``'s."""
    if vol.spatial_shape != reference.spatial_shape or (exact_ndim is not None and vol.array.ndim != exact_ndim):
        shown = vol.array.shape if exact_ndim is not None else vol.spatial_shape
        raise VolumeError(
            f"{path}: {what} shape {shown} does not match image shape {reference.spatial_shape} of {ref_path}"
        )


def apply_label_mapping(array: np.ndarray, mapping: Mapping[int, int] | None) -> np.ndarray:
    """Rename label values by ``mapping`` (values not in it are kept); ``array`` holds integers."""
    if not mapping or array.size == 0:
        return array
    lo, hi = int(array.min()), int(array.max())
    if lo < 0:  # out-of-range values are reported by the range check that follows
        out = array.copy()
        for raw, new in mapping.items():
            out[array == int(raw)] = int(new)
        return out
    lut = np.arange(max(hi, *(int(k) for k in mapping)) + 1, dtype=np.int64)
    for raw, new in mapping.items():
        lut[int(raw)] = int(new)
    return lut[array]


def read_label_array(array: np.ndarray, num_classes: int, source: object,
                     label_mapping: Mapping[int, int] | None = None) -> np.ndarray:
    """Integer check, ``label_mapping``, then the ``[0, num_classes)`` check; int64 result."""
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all() or not np.all(np.mod(array, 1) == 0):
            raise VolumeError(f"{source}: label map holds non-integer values")
    label = apply_label_mapping(np.asarray(array).astype(np.int64), label_mapping)
    return check_label(label, num_classes, source)


def to_regions(label: np.ndarray, regions: Sequence[Sequence[int]]) -> np.ndarray:
    """``*S`` integer label map to ``R x *S`` uint8 region masks (region r: label in ``regions[r]``)."""
    return np.stack([np.isin(label, list(values)) for values in regions]).astype(np.uint8)


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
