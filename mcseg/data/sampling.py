"""Training samples: random 2D slices or 3D patches with foreground oversampling.

Each sample is a pure function of ``(seed, epoch, index)``: the same run draws the same
samples whatever the number of workers, and a resumed run continues the same stream.
Labels are ``*S`` class maps or, for multi-label datasets, ``R x *S`` region masks; a
share ``foreground_ratio`` of samples is centred on a voxel of a random foreground class
(region). Augmentation (:mod:`mcseg.data.augment`) is drawn from the same per-sample seed.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from mcseg.data.augment import AugmentConfig, Augmenter, augment_config
from mcseg.data.cases import CaseData
from mcseg.data.raters import soft_target

_MAX_FG_POINTS = 4096  # foreground voxels kept per class and case to draw centres from


def crop_slices(start: Sequence[int], size: Sequence[int], shape: Sequence[int], lead: int):
    """Index tuples ``(src, dst)`` copying the window ``start:start+size`` of an array of ``shape``
    (trailing axes; ``lead`` leading axes kept whole) into a ``size`` array; outside parts are skipped."""
    src, dst = [slice(None)] * lead, [slice(None)] * lead
    for s0, n, dim in zip(start, size, shape[lead:]):
        lo, hi = max(s0, 0), min(s0 + n, dim)
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(lo - s0, lo - s0 + max(0, hi - lo)))
    return tuple(src), tuple(dst)


def crop_or_pad(array, start: Sequence[int], size: Sequence[int], fill: float = 0.0):
    """Cut ``array[..., start:start+size]`` over its last ``len(size)`` axes, padding with ``fill`` (a numpy
    array or a torch tensor, on its device)."""
    lead = array.ndim - len(size)
    shape = tuple(array.shape[:lead]) + tuple(size)
    if isinstance(array, np.ndarray):
        out = np.full(shape, fill, dtype=array.dtype)
    else:
        out = torch.full(shape, fill, dtype=array.dtype, device=array.device)
    src, dst = crop_slices(start, size, array.shape, lead)
    out[dst] = array[src]
    return out


class PatchDataset(Dataset):
    """Random training samples from loaded (in-memory or memory-mapped) cases.

    Args:
        cases: loaded training cases (``image`` C x *S, ``label`` *S, or R x *S region masks).
        dims: 2 for slices (of 3D volumes, along ``slice_axis``; 2D cases are used whole), 3 for patches.
        patch_size: spatial size of a sample (2 or 3 values); volumes are padded when smaller.
        samples_per_epoch: samples drawn per epoch.
        foreground_ratio: share of samples centred on a voxel of a random foreground class.
        flip_axes: sample axes that are randomly flipped.
        intensity: amplitude of random intensity scale (1 +- a) and shift (+- a); 0 disables.
        augment: MONAI rotation/scaling/gamma/noise (:class:`~mcseg.data.augment.AugmentConfig`
            or its mapping); ``None`` disables.
        rater_target: ``dataset.raters.target``; with ``random`` a sample of a case with several raters takes
            the map of one rater, drawn from the sample's own seed; with ``mean`` its label is the soft rater
            mean, ``num_classes x *patch`` float32 (:mod:`mcseg.data.raters`).
        num_classes: the task's classes (for ``rater_target=mean``).
    """

    def __init__(
        self, cases: list[CaseData], dims: int, patch_size: Sequence[int], samples_per_epoch: int,
        foreground_ratio: float = 0.33, flip_axes: Sequence[int] = (), intensity: float = 0.0,
        slice_axis: int = -1, seed: int = 0, augment: AugmentConfig | dict | None = None,
        rater_target: str = "majority", num_classes: int | None = None,
    ) -> None:
        if dims not in (2, 3) or len(patch_size) != dims:
            raise ValueError(f"dataset.sampling: patch_size={list(patch_size)} does not match dims={dims}")
        if not 0 <= foreground_ratio <= 1:
            raise ValueError(f"dataset.sampling.foreground_ratio={foreground_ratio}: expected a value in [0, 1]")
        if any(not 0 <= a < dims for a in flip_axes):
            raise ValueError(f"dataset.sampling.flip_axes={list(flip_axes)}: axes must lie in [0, {dims})")
        if dims == 3 and any(c.image.ndim != 4 for c in cases):
            raise ValueError("dataset.sampling.dims=3 needs 3D volumes; this dataset is 2D")
        self.cases, self.dims, self.patch_size = cases, dims, tuple(int(p) for p in patch_size)
        self.samples_per_epoch, self.foreground_ratio = int(samples_per_epoch), float(foreground_ratio)
        self.flip_axes, self.intensity, self.seed = tuple(flip_axes), float(intensity), int(seed)
        self.slice_axis = slice_axis
        self.random_rater, self.mean_rater = rater_target == "random", rater_target == "mean"
        if self.mean_rater and num_classes is None:
            raise ValueError("PatchDataset: rater_target=mean needs num_classes")
        self.num_classes = num_classes
        cfg = augment_config(augment)
        self.augmenter = Augmenter(cfg, dims) if cfg is not None else None
        self.label_dtype = travel_dtype(cases)
        rng = np.random.default_rng(seed)
        # Per case and foreground class: a subsample of voxel coordinates to centre samples on.
        self.fg_points = [self._foreground_points(case, rng) for case in cases]

    @staticmethod
    def _foreground_points(case: CaseData, rng: np.random.Generator) -> dict[int, np.ndarray]:
        cached = case.meta.get("fg_points") if case.meta else None
        if cached is not None:  # computed once by preprocessing
            return cached
        label = case.label
        points = {}
        if _has_channels(case):  # multi-label: one entry per region
            for r in range(label.shape[0]):
                idx = np.flatnonzero(label[r].ravel())
                if len(idx):
                    if len(idx) > _MAX_FG_POINTS:
                        idx = rng.choice(idx, _MAX_FG_POINTS, replace=False)
                    points[r + 1] = np.stack(np.unravel_index(idx, label.shape[1:]), axis=1)
            return points
        for k in np.unique(label):
            if k == 0:
                continue
            idx = np.flatnonzero(label.ravel() == k)
            if len(idx) > _MAX_FG_POINTS:
                idx = rng.choice(idx, _MAX_FG_POINTS, replace=False)
            points[int(k)] = np.stack(np.unravel_index(idx, label.shape), axis=1)
        return points

    def __len__(self) -> int:
        return self.samples_per_epoch

    def __getitem__(self, index: int) -> dict:
        return self.sample(index, self.cases)

    def draw(self, index: int) -> Draw:
        """Every random choice of sample ``index``, drawn from its own generator before any voxel is read."""
        epoch, i = divmod(int(index), self.samples_per_epoch)
        rng = np.random.default_rng([self.seed, epoch, i])
        c = int(rng.integers(len(self.cases)))
        case, points = self.cases[c], self.fg_points[c]
        rater = None
        if self.random_rater and case.raters is not None:  # one rater per sample and iteration
            rater = int(rng.integers(len(case.raters)))
        soft = self.mean_rater and case.raters is not None
        lead = 1 if soft or _has_channels(case) else 0  # label axes before the spatial ones
        shape = (case.raters if soft else case.label).shape[lead:]
        centre, plane = None, None
        if points and rng.random() < self.foreground_ratio:
            cls = list(points)[int(rng.integers(len(points)))]
            centre = points[cls][int(rng.integers(len(points[cls])))]
        if self.dims == 2 and len(shape) == 3:  # a slice of a volume
            axis = self.slice_axis % 3
            plane = (axis, int(centre[axis]) if centre is not None else int(rng.integers(shape[axis])))
            shape = shape[:axis] + shape[axis + 1:]
            if centre is not None:
                centre = np.delete(centre, axis)
        start = []
        for d, (n, p) in enumerate(zip(shape, self.patch_size)):
            lo, hi = min(0, n - p), max(0, n - p)
            s = int(centre[d]) - p // 2 if centre is not None else int(rng.integers(lo, hi + 1))
            start.append(int(np.clip(s, lo, hi)))
        angles = zoom = intensity_seeds = None
        if self.augmenter is not None:
            angles, zoom = self.augmenter.draw_spatial(rng)
        flips = [axis for axis in self.flip_axes if rng.random() < 0.5]
        if self.augmenter is not None:
            intensity_seeds = self.augmenter.draw_intensity(rng)
        scale = shift = None
        if self.intensity > 0:
            scale = 1 + rng.uniform(-self.intensity, self.intensity)
            shift = rng.uniform(-self.intensity, self.intensity)
        return Draw(c, rater, soft, lead, plane, start, angles, zoom, flips, intensity_seeds, scale, shift)

    def sample(self, index: int, sources: Sequence) -> dict:
        """Sample ``index`` cut from ``sources`` (per case: ``image``, ``label``, ``raters``), the cases themselves
        (numpy arrays, :meth:`__getitem__`) or their copies on a device (torch tensors,
        :mod:`mcseg.training.device_cache`): the same draw, the same operations, the same values."""
        d = self.draw(index)
        source = sources[d.case]
        label = source.label
        if d.rater is not None:
            label = source.raters[d.rater]
        if d.soft:  # every rater's map travels with the sample; their mean is taken at the end
            label = source.raters
        image, label = self._cut(d, source.image, label)
        if d.soft:
            target = soft_target(label, self.num_classes)
        else:
            target = _contiguous(label, self.label_dtype)
        return {"image": _contiguous(image, np.float32), "label": _contiguous(target, target.dtype),
                "case_index": d.case, "case_id": self.cases[d.case].case_id}

    def _cut(self, d: Draw, image, label):
        """The drawn patch of ``image`` and ``label``: plane, crop or warp, flips, intensity."""
        lead = d.lead
        if d.plane is not None:
            axis, z = d.plane
            image, label = _plane(image, z, axis + 1), _plane(label, z, axis + lead)
        if d.angles is not None or d.zoom is not None:
            size = self.augmenter.source_size(self.patch_size, d.angles, d.zoom)
            region = [s + (p - q) // 2 for s, p, q in zip(d.start, self.patch_size, size)]
            image, label = self.augmenter.warp(
                crop_or_pad(image, region, size), crop_or_pad(label, region, size), self.patch_size, d.angles, d.zoom,
                label_has_channels=bool(lead),
            )
        else:
            image = crop_or_pad(image, d.start, self.patch_size)
            label = crop_or_pad(label, d.start, self.patch_size)
        for axis in d.flips:
            image, label = _flip(image, axis + 1), _flip(label, axis + lead)
        if d.intensity_seeds is not None:
            image = self.augmenter.intensity(image, *d.intensity_seeds)
        if d.scale is not None:
            image = image * d.scale + d.shift
        return image, label


@dataclass
class Draw:
    """The random choices of one sample: its case, rater, plane and crop, spatial and intensity augmentation."""

    case: int
    rater: int | None  # dataset.raters.target=random: the rater whose map is the label
    soft: bool  # dataset.raters.target=mean: the label is every rater's map, averaged at the end
    lead: int  # label axes before the spatial ones (1 for region masks and rater stacks)
    plane: tuple[int, int] | None  # (axis, index) of a 2D sample's slice of a volume
    start: list[int]  # the patch's first voxel (negative or beyond the volume: padded)
    angles: list[float] | None
    zoom: float | None
    flips: list[int]  # sample axes flipped
    intensity_seeds: tuple[int | None, int | None] | None  # MONAI gamma and noise seeds (Augmenter.draw_intensity)
    scale: float | None  # dataset.sampling.intensity: image * scale + shift
    shift: float | None


def _contiguous(array, dtype):
    """A contiguous torch tensor of ``array`` (numpy or torch) in ``dtype`` (copied only when needed)."""
    if isinstance(array, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(array, dtype=dtype))
    return array.to(_torch_dtype(dtype)).contiguous()


def _torch_dtype(dtype) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype)).dtype


def _flip(array, axis: int):
    return np.flip(array, axis) if isinstance(array, np.ndarray) else torch.flip(array, (axis,))


def travel_dtype(cases: list[CaseData]) -> np.dtype:
    """The integer type every sample's labels travel in: the stored one when the cases share one of at most 16 bits
    (the cache keeps uint8 below 257 classes); else uint8 when every label value (and every rater's) lies in
    [0, 255], as labels read from files (int64) mostly do; else int64. Labels are widened to int64 on the device
    (``to_device``), so a 3D batch of 32 x 48 x 64 x 48 moves 4.7 MB of labels through shared and pinned memory
    instead of 38 MB. One type for the run: every batch of a worker fills the same buffers
    (:mod:`mcseg.training.ring`)."""
    arrays = [a for c in cases for a in (c.label, c.raters) if a is not None]
    if not arrays:
        return np.dtype(np.int64)
    stored = np.result_type(*[a.dtype for a in arrays])
    if stored.kind in "ui" and stored.itemsize <= 2:
        return stored
    if stored.kind in "uib" and all(a.size == 0 or (a.min() >= 0 and a.max() <= 255) for a in arrays):
        return np.dtype(np.uint8)
    return np.dtype(np.int64)


def _plane(array: np.ndarray, index: int, axis: int) -> np.ndarray:
    """``array``'s plane ``index`` along ``axis`` as a view (``np.take`` copies, several times slower)."""
    return array[(slice(None),) * axis + (index,)]


def _has_channels(case: CaseData) -> bool:
    """Multi-label cases carry ``R x *S`` labels: as many axes as the ``C x *S`` image."""
    return case.label is not None and case.label.ndim == case.image.ndim


class EpochSampler(Sampler[int]):
    """Yields ``epoch * n + i``: sample identity depends on the epoch, not on worker state.

    With several processes (``world_size > 1``, DDP) rank ``r`` takes the indices
    ``r::world_size`` of the epoch's list, cut to the same length on every rank
    (``n // world_size``), so the ranks draw disjoint samples and take equally many steps.
    ``samples_per_epoch`` stays the number of samples per epoch over all ranks.
    """

    def __init__(self, samples_per_epoch: int, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a world of size {world_size}")
        if samples_per_epoch < world_size:
            raise ValueError(f"dataset.sampling.samples_per_epoch={samples_per_epoch} is smaller than the "
                             f"{world_size} processes sharing each epoch")
        self.n, self.epoch, self.skip = int(samples_per_epoch), 0, 0
        self.rank, self.world_size = int(rank), int(world_size)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Draw the samples of ``epoch``, leaving out this rank's first ``skip`` (a resumed epoch)."""
        self.epoch, self.skip = int(epoch), int(skip)

    def __iter__(self) -> Iterator[int]:
        first = self.epoch * self.n
        share = range(first + self.rank, first + self.world_size * (self.n // self.world_size), self.world_size)
        return iter(share[self.skip:])

    def __len__(self) -> int:
        return max(0, self.n // self.world_size - self.skip)
