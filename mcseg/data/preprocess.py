"""Preprocessing into the network's space, recorded per case as an invertible :class:`Geometry`.

The steps, in order (each optional, set by the dataset's ``preprocess`` node):

1. **orientation**: reorder and flip voxel axes to a canonical frame read from the file's
   affine (nibabel's axis codes: ``RAS`` means increasing indices point to the patient's
   Right, Anterior and Superior); no interpolation.
2. **crop to the non-zero region**: the bounding box of voxels where some channel is non-zero
   (skull-stripped MRI); the box is recorded.
3. **resampling** to ``target_spacing`` (mm per axis; ``null`` keeps an axis): images with a
   spline of ``image_order`` (1: linear), labels nearest-neighbour. Voxel centres follow the
   half-voxel convention of ``torch.nn.functional.interpolate(align_corners=False)``, which
   maps probabilities back.
4. **intensity normalisation** per channel (see :mod:`mcseg.data.normalize`).
5. **centre crop or pad** to ``crop_size`` (voxels per axis; ``null`` keeps an axis), e.g. the
   192 x 192 in-plane crop of the ACDC segmentation studies; padding is 0 in the image and
   background in the label.

:func:`invert` undoes 5, 3, 2 and 1 on probabilities (``C x *S`` torch tensors on any device):
pad back / crop back with background probability, linear interpolation to the original grid,
then the inverse axis reordering. Crops, pads and reorientation are exact; resampling is
the only lossy step.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from mcseg.data.normalize import normalize_image

ORIENTATION_LETTERS = ("LR", "PA", "IS")


@dataclass
class PreprocessConfig:
    """The ``dataset.preprocess`` node. All steps off (the default) reads cases as they are."""

    orientation: str | None = None  # e.g. RAS; null keeps the file's voxel order
    target_spacing: list[float | None] | None = None  # mm per axis; null (or a null entry) keeps
    crop_to_nonzero: bool = False
    crop_size: list[int | None] | None = None  # centre crop/pad, voxels per axis
    image_order: int = 1  # spline order for resampling images (0, 1 or 3)
    cache: bool = True  # keep preprocessed cases as memory-mapped .npy files
    cache_dir: str | None = None  # null: $MCSEG_CACHE_DIR, else $XDG_CACHE_HOME/mcseg or ~/.cache/mcseg
    workers: int | None = None  # processes that fill the cache; null: CPU cores - 1, at most 8

    @property
    def identity(self) -> bool:
        """True when no step changes the arrays (the case is used as read)."""
        return (
            self.orientation is None
            and not any(s is not None for s in (self.target_spacing or []))
            and not self.crop_to_nonzero
            and not any(s is not None for s in (self.crop_size or []))
        )

    def settings(self) -> dict:
        """What determines the preprocessed arrays (the cache fingerprint); not where they go."""
        return {k: v for k, v in asdict(self).items() if k not in ("cache", "cache_dir", "workers")}


def preprocess_config(node: Mapping | PreprocessConfig | None, spatial_dims: int) -> PreprocessConfig:
    """Check a ``dataset.preprocess`` node; errors name the key."""
    from mcseg.config import typed

    cfg = node if isinstance(node, PreprocessConfig) else typed(node, PreprocessConfig, "dataset.preprocess")
    if cfg.orientation is not None:
        code = str(cfg.orientation).upper()
        if spatial_dims != 3:
            raise ValueError(f"dataset.preprocess.orientation={cfg.orientation!r}: only 3D volumes are reoriented")
        if len(code) != 3 or sorted(_axis_of(c) for c in code) != [0, 1, 2]:
            raise ValueError(
                f"dataset.preprocess.orientation={cfg.orientation!r}: expected three letters, one of L/R, "
                "P/A and I/S each (e.g. RAS, LPS)"
            )
        cfg.orientation = code
    for key in ("target_spacing", "crop_size"):
        value = getattr(cfg, key)
        if value is None:
            continue
        if len(value) != spatial_dims:
            raise ValueError(f"dataset.preprocess.{key}={list(value)}: expected {spatial_dims} values (null keeps an axis)")
        if any(v is not None and not v > 0 for v in value):
            raise ValueError(f"dataset.preprocess.{key}={list(value)}: values must be positive")
    if cfg.image_order not in (0, 1, 3):
        raise ValueError(f"dataset.preprocess.image_order={cfg.image_order}: expected 0, 1 or 3")
    if cfg.workers is not None and cfg.workers < 0:
        raise ValueError(f"dataset.preprocess.workers={cfg.workers}: expected >= 0")
    return cfg


def _axis_of(letter: str) -> int:
    for axis, pair in enumerate(ORIENTATION_LETTERS):
        if letter in pair:
            return axis
    return -1


@dataclass
class Geometry:
    """How one case went from its file grid to the network's grid, to go back exactly.

    Shapes are spatial. ``ornt`` is nibabel's orientation transform (file axes to oriented
    axes) or ``None``; ``bbox`` the non-zero crop in the oriented grid; ``resampled_shape`` the
    crop's shape after resampling; ``pad_start`` the centre crop/pad offsets
    (``out[i] = in[i + pad_start]``); ``shape``/``spacing``/``affine`` the network's grid.
    """

    original_shape: tuple[int, ...]
    original_spacing: tuple[float, ...]
    original_affine: list[list[float]]
    ornt: list[list[float]] | None
    oriented_shape: tuple[int, ...]
    bbox: list[list[int]]
    resampled_shape: tuple[int, ...]
    pad_start: list[int]
    shape: tuple[int, ...]
    spacing: tuple[float, ...]
    affine: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Geometry:
        data = dict(data)
        for key in ("original_shape", "oriented_shape", "resampled_shape", "shape"):
            data[key] = tuple(int(v) for v in data[key])
        for key in ("original_spacing", "spacing"):
            data[key] = tuple(float(v) for v in data[key])
        return cls(**data)


# ------------------------------------------------------------------------------ forward steps
def _orient(image: np.ndarray, label: np.ndarray | None, affine: np.ndarray, code: str):
    import nibabel.orientations as nio

    shape = image.shape[1:]
    ornt = nio.ornt_transform(nio.io_orientation(affine), nio.axcodes2ornt(tuple(code)))
    if np.array_equal(ornt, [[0, 1], [1, 1], [2, 1]]):
        return image, label, affine, None
    image = np.moveaxis(nio.apply_orientation(np.moveaxis(image, 0, -1), ornt), -1, 0)
    if label is not None and label.ndim == image.ndim:  # K x *S: one map per rater
        label = np.moveaxis(nio.apply_orientation(np.moveaxis(label, 0, -1), ornt), -1, 0)
    elif label is not None:
        label = nio.apply_orientation(label, ornt)
    affine = affine @ nio.inv_ornt_aff(ornt, shape)
    return image, label, affine, ornt


def _nonzero_bbox(image: np.ndarray) -> list[list[int]]:
    mask = (image != 0).any(axis=0)
    if not mask.any():
        return [[0, n] for n in mask.shape]
    box = []
    for axis in range(mask.ndim):
        hits = np.flatnonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis)))
        box.append([int(hits[0]), int(hits[-1]) + 1])
    return box


def resampled_shape(shape: Sequence[int], spacing: Sequence[float], target: Sequence[float | None] | None):
    if target is None:
        return tuple(shape)
    return tuple(
        n if t is None else max(1, int(round(n * s / float(t)))) for n, s, t in zip(shape, spacing, target)
    )


def _resample(array: np.ndarray, new_shape: Sequence[int], order: int, lead: int) -> np.ndarray:
    """Resample the trailing axes of ``array`` (``lead`` leading axes kept) to ``new_shape``."""
    from scipy.ndimage import affine_transform

    old = np.asarray(array.shape[lead:], dtype=np.float64)
    ratio = old / np.asarray(new_shape, dtype=np.float64)
    offset = (ratio - 1) / 2  # input coordinate of output voxel i is (i + 0.5) * ratio - 0.5
    if array.ndim == len(new_shape):
        return affine_transform(array, ratio, offset, output_shape=tuple(new_shape), order=order, mode="nearest",
                                prefilter=order > 1)
    out = np.empty(array.shape[:lead] + tuple(new_shape), dtype=array.dtype)
    for idx in np.ndindex(*array.shape[:lead]):
        affine_transform(array[idx], ratio, offset, output_shape=tuple(new_shape), output=out[idx], order=order,
                         mode="nearest", prefilter=order > 1)
    return out


def _scale_affine(ratio: np.ndarray) -> np.ndarray:
    n = len(ratio)
    t = np.eye(4)
    t[range(n), range(n)] = ratio
    t[:n, 3] = (ratio - 1) / 2
    return t


def _translate(offset: Sequence[int]) -> np.ndarray:
    t = np.eye(4)
    t[: len(offset), 3] = offset
    return t


def centre_start(shape: Sequence[int], size: Sequence[int | None] | None) -> list[int]:
    """Offsets of a centre crop (positive) or pad (negative) of ``shape`` to ``size``."""
    if size is None:
        return [0] * len(shape)
    return [0 if s is None else (n - int(s)) // 2 for n, s in zip(shape, size)]


def forward(
    image: np.ndarray, label: np.ndarray | None, spacing: Sequence[float], affine: np.ndarray,
    cfg: PreprocessConfig, normalization,
) -> tuple[np.ndarray, np.ndarray | None, Geometry]:
    """Preprocess a raw case (``image`` C x *S, ``label`` *S, or K x *S for K raters' maps) into the
    network's grid; return its geometry."""
    from mcseg.data.sampling import crop_or_pad

    spatial = image.ndim - 1
    lead = 0 if label is None else label.ndim - spatial  # 1 for a stack of raters' maps
    affine = np.asarray(affine, dtype=np.float64)
    geometry = dict(original_shape=tuple(int(n) for n in image.shape[1:]),
                    original_spacing=tuple(float(s) for s in spacing), original_affine=affine.tolist())
    ornt = None
    if cfg.orientation is not None and spatial == 3:
        image, label, affine, ornt = _orient(image, label, affine, cfg.orientation)
        if ornt is not None:
            spacing = [spacing[int(i)] for i in np.argsort(ornt[:, 0])]
    geometry["ornt"] = None if ornt is None else ornt.tolist()
    geometry["oriented_shape"] = tuple(int(n) for n in image.shape[1:])
    bbox = _nonzero_bbox(image) if cfg.crop_to_nonzero else [[0, int(n)] for n in image.shape[1:]]
    if cfg.crop_to_nonzero:
        box = (slice(None),) + tuple(slice(lo, hi) for lo, hi in bbox)
        image = image[box]
        label = label[(slice(None),) * lead + box[1:]] if label is not None else None
        affine = affine @ _translate([lo for lo, _ in bbox])
    geometry["bbox"] = bbox
    new_shape = resampled_shape(image.shape[1:], spacing, cfg.target_spacing)
    if new_shape != tuple(image.shape[1:]):
        ratio = np.asarray(image.shape[1:], dtype=np.float64) / np.asarray(new_shape, dtype=np.float64)
        image = _resample(np.ascontiguousarray(image, dtype=np.float32), new_shape, cfg.image_order, lead=1)
        if label is not None:
            label = _resample(np.ascontiguousarray(label), new_shape, 0, lead=lead)
        affine = affine @ _scale_affine(ratio)
        spacing = [float(s * r) for s, r in zip(spacing, ratio)]
    geometry["resampled_shape"] = tuple(int(n) for n in new_shape)
    image = normalize_image(np.ascontiguousarray(image, dtype=np.float32), normalization)
    start = centre_start(image.shape[1:], cfg.crop_size)
    if any(start) or (cfg.crop_size and any(s is not None and s != n for s, n in zip(cfg.crop_size, image.shape[1:]))):
        size = [n if s is None else int(s) for n, s in zip(image.shape[1:], cfg.crop_size)]
        image = crop_or_pad(image, start, size)
        label = crop_or_pad(label, start, size) if label is not None else None
        affine = affine @ _translate(start)
    geometry["pad_start"] = [int(s) for s in start]
    geometry["shape"] = tuple(int(n) for n in image.shape[1:])
    geometry["spacing"] = tuple(float(s) for s in spacing)
    geometry["affine"] = affine.tolist()
    image = np.ascontiguousarray(image, dtype=np.float32)
    label = np.ascontiguousarray(label) if label is not None else None
    return image, label, Geometry(**geometry)


# ------------------------------------------------------------------------------ inverse
def _paste(x, start: Sequence[int], size: Sequence[int], fill):
    """Torch twin of :func:`mcseg.data.sampling.crop_or_pad` over the trailing axes, with a per-channel fill."""
    import torch

    lead = x.ndim - len(size)
    out = fill.reshape(fill.shape + (1,) * len(size)).expand(*x.shape[:lead], *size).clone()
    from mcseg.data.sampling import crop_slices

    src, dst = crop_slices(start, size, x.shape, lead)
    out[dst] = x[src]
    return out if isinstance(out, torch.Tensor) else torch.as_tensor(out)


def background_fill(channels: int, multilabel: bool, like):
    """Probabilities outside the network's field of view: background for softmax, 0 for sigmoids."""
    import torch

    fill = torch.zeros(channels, dtype=like.dtype, device=like.device)
    if not multilabel:
        fill[0] = 1
    return fill


def invert(probs, geometry: Geometry, multilabel: bool = False):
    """Map ``C x *S`` probabilities (torch) from the network's grid back to the file's grid."""
    import torch
    import torch.nn.functional as F

    if not probs.is_floating_point():
        probs = probs.float()
    fill = background_fill(probs.shape[0], multilabel, probs)
    resampled = geometry.resampled_shape
    x = probs
    if any(geometry.pad_start) or tuple(probs.shape[1:]) != tuple(resampled):  # undo the centre crop/pad
        x = _paste(probs, [-s for s in geometry.pad_start], resampled, fill)
    bbox = geometry.bbox
    box_shape = tuple(hi - lo for lo, hi in bbox)
    if tuple(resampled) != box_shape:
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(box_shape)]
        x = F.interpolate(x[None], size=box_shape, mode=mode, align_corners=False)[0]
    if box_shape != tuple(geometry.oriented_shape):  # undo the non-zero crop
        x = _paste(x, [-lo for lo, _ in bbox], geometry.oriented_shape, fill)
    if geometry.ornt is not None:
        x = reorient_tensor(x, inverse_ornt(np.asarray(geometry.ornt)))
    if tuple(x.shape[1:]) != tuple(geometry.original_shape):
        raise RuntimeError(f"restored shape {tuple(x.shape[1:])} != original {geometry.original_shape}")
    return x.contiguous() if isinstance(x, torch.Tensor) else x


def inverse_ornt(ornt: np.ndarray) -> np.ndarray:
    """The orientation transform that undoes ``ornt`` (nibabel convention)."""
    inv = np.zeros_like(ornt)
    for axis, (target, flip) in enumerate(ornt):
        inv[int(target)] = (axis, flip)
    return inv


def reorient_tensor(x, ornt: np.ndarray):
    """``nibabel.orientations.apply_orientation`` on the trailing spatial axes of a ``C x *S`` tensor."""
    lead = x.ndim - len(ornt)
    flips = [lead + axis for axis, (_, flip) in enumerate(ornt) if flip == -1]
    if flips:
        x = x.flip(flips)
    order = list(range(lead)) + [lead + int(a) for a in np.argsort(ornt[:, 0])]
    return x.permute(order)
