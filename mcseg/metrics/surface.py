"""Surface distances in mm: percentile Hausdorff distance (HD95) and average symmetric surface
distance (ASSD), per class, every class from one boundary pass over the label map.

Surface of class k: voxels of class k with a face neighbour (2*ndim connectivity) of another
class or on the image border; this is MONAI's ``get_mask_edges`` (mask XOR its erosion by a
cross, zero border) and DeepMind's surface-distance voxel surface without surfel areas.
With ``d(A -> B)`` the distances in mm from each surface voxel of A to the nearest one of B:

* ``max_directed`` (default; MONAI ``compute_hausdorff_distance``, DeepMind surface-distance):
  HD_q = max(P_q d(P -> L), P_q d(L -> P));
* ``pooled`` (medpy ``hd95``): HD_q = P_q of d(P -> L) and d(L -> P) pooled;
* ASSD = (sum d(P -> L) + sum d(L -> P)) / (|dP| + |dL|)  (MONAI ``SurfaceDistanceMetric``
  with ``symmetric=True``).

P_q is the q-th percentile with linear interpolation (numpy/torch default). Empty structures
follow :mod:`mcseg.metrics.empty` (worst case: the image diagonal in mm).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mcseg.config import HD_DEFINITIONS
from mcseg.metrics.base import CaseMetric
from mcseg.metrics.empty import StructureStatus, status_counts, worst_case_distance

__all__ = [
    "HD_DEFINITIONS",
    "boundary_mask",
    "surface_points",
    "directed_distances",
    "nearest_direct",
    "SurfaceDistances",
    "surface_distances",
    "SurfaceDistanceMetric",
]



def boundary_mask(label_map: torch.Tensor | np.ndarray, image_border: bool = True) -> torch.Tensor | np.ndarray:
    """Voxels with a face neighbour of a different value (both sides of every interface);
    with ``image_border`` also every voxel on the image border. A tensor gives a boolean tensor on its device, a
    NumPy array a boolean array (the same slicing on either)."""
    tensor = isinstance(label_map, torch.Tensor)
    small = _compact(label_map)
    mask = torch.zeros(small.shape, dtype=torch.bool, device=small.device) if tensor else np.zeros(small.shape, bool)
    every = (slice(None),) * small.ndim
    for axis, n in enumerate(small.shape):
        lower = every[:axis] + (slice(0, n - 1),)
        upper = every[:axis] + (slice(1, n),)
        if n > 1:
            differs = small[lower] != small[upper]
            mask[lower] |= differs
            mask[upper] |= differs
        if image_border:
            mask[every[:axis] + (0,)] = True
            mask[every[:axis] + (n - 1,)] = True
    return mask


def _compact(label_map: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """The map as uint8 where its values fit (fewer bytes to compare), else as it is."""
    if label_map.dtype in (torch.uint8, np.uint8):
        return label_map
    if isinstance(label_map, torch.Tensor):
        return label_map.to(torch.uint8) if label_map.max() < 256 else label_map
    return label_map.astype(np.uint8) if label_map.max() < 256 else label_map


def surface_points(label_map: torch.Tensor, num_classes: int, spacing: Sequence[float],
                   background: bool = True) -> list[np.ndarray]:
    """Surface voxel coordinates in mm of every class, ``[(n_k, ndim) float64 for k in range(K)]``, each class's
    in row-major order; without ``background`` class 0's is left empty (its surface, the image border included,
    is most surface voxels of a small case and no figure uses it). Computed with NumPy on the host (on a small
    case, the overhead of a few torch operations was most of the time)."""
    return _surfaces(label_map, num_classes, spacing, background)[0]


def _surfaces(label_map: torch.Tensor, num_classes: int, spacing: Sequence[float],
              background: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """:func:`surface_points`, and the flat (row-major) voxel index of each point, ascending within a class."""
    small = _compact(label_map)
    values_map = small.cpu().numpy() if isinstance(small, torch.Tensor) else np.asarray(small)
    edge = boundary_mask(values_map)
    if not background:
        edge &= values_map != 0
    flat = np.flatnonzero(edge)  # row-major order, as boolean indexing below
    values = values_map[edge]
    if values.size and (values.min() < 0 or values.max() >= num_classes):
        raise ValueError(f"label map values must lie in [0, {num_classes}), found [{values.min()}, {values.max()}]")
    order = np.argsort(values, kind="stable")
    split = np.cumsum(np.bincount(values, minlength=num_classes)[:num_classes])[:-1]
    flat = flat[order]
    mm = np.stack(np.unravel_index(flat, values_map.shape), axis=1) * np.asarray(spacing, dtype=np.float64)
    return np.split(mm, split), np.split(flat, split)


def directed_distances(source: np.ndarray, target: np.ndarray, on_target: np.ndarray | None = None) -> np.ndarray:
    """Distance from each source point to the nearest target point (exact Euclidean, mm).

    A k-d tree over the surface points, as MONAI 1.6 does on CPU: surfaces are sparse, so this
    beats a dense ``scipy.ndimage.distance_transform_edt(~surface, sampling=spacing)`` over the
    (cropped) volume, and both give the same exact Euclidean distances (checked in the tests).
    ``on_target`` (boolean, per source point): the points that are also target points, whose distance is
    exactly 0 without a query (where a prediction's surface follows the label's, most of them).
    Small queries are answered by :func:`nearest_direct` (the same bits) while :data:`DIRECT_BUDGET` lasts and
    scipy.spatial is not imported.
    """
    if on_target is not None:
        distances = np.zeros(len(source))
        rest = ~on_target
        if rest.any():
            distances[rest] = directed_distances(source[rest], target)
        return distances
    global _direct_left
    pairs = len(source) * len(target)
    if pairs <= DIRECT_MAX_PAIRS and pairs <= _direct_left and not _tree_imported():
        _direct_left -= pairs
        return nearest_direct(source, target)
    from scipy.spatial import cKDTree  # here: importing scipy.spatial costs 0.5-0.9 s (docs/benchmarks.md)

    workers = -1 if len(source) > 20_000 else 1  # threads cost more than they save on small surfaces
    return cKDTree(target, leafsize=32).query(source, k=1, workers=workers)[0]


# Why a second way to the same distances: importing scipy.spatial (it imports scipy.sparse) costs a process 0.5-0.9 s,
# more than every surface distance of a folder of 31 hippocampus cases (0.1 s by k-d tree, 0.25 s directly). So a
# process that has not imported it answers small queries directly until it has spent about that import on them,
# then imports the k-d tree; once imported (by this or by anything else), the tree answers every query.
DIRECT_MAX_PAIRS = 1 << 21  # source x target points: a larger query always goes to the k-d tree
DIRECT_BUDGET = 1 << 26  # pairs answered directly in a process (about 0.3 s here) before the k-d tree is imported
_direct_left = DIRECT_BUDGET
_DIRECT_CHUNK = 1 << 16  # pairs a step: the squared distances of a step stay in the cache (512 KiB)


def _tree_imported() -> bool:
    return "scipy.spatial" in sys.modules


def nearest_direct(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Distance from each source point (n, d) to the nearest target point (m, d), every pair computed:
    sqrt(min_j sum_a (s_a - t_ja)^2), the axes summed in order from 0.0 as scipy's k-d tree does
    (``sqeuclidean_distance_double``) and the square root taken of the minimum, so the result has its bits
    (``tests/metrics/test_surface.py``)."""
    out = np.empty(len(source))
    rows = max(1, _DIRECT_CHUNK // max(1, len(target)))
    for start in range(0, len(source), rows):
        part = source[start:start + rows]
        squared = np.zeros((len(part), len(target)))
        for axis in range(source.shape[1]):
            step = np.subtract.outer(part[:, axis], target[:, axis])
            step *= step
            squared += step
        out[start:start + rows] = np.sqrt(squared.min(axis=1))
    return out


@dataclass(frozen=True)
class SurfaceDistances:
    """Per class (K,) float64: HD at the chosen percentile and ASSD in mm, and the status."""

    hd: torch.Tensor
    assd: torch.Tensor
    status: list[StructureStatus | None]  # None: class not evaluated (background of a label map)


def _hd_assd(d_pl: np.ndarray, d_lp: np.ndarray, percentile: float, definition: str) -> tuple[float, float]:
    if definition == "max_directed":
        hd = max(np.percentile(d_pl, percentile), np.percentile(d_lp, percentile))
    else:
        hd = np.percentile(np.concatenate([d_pl, d_lp]), percentile)
    return float(hd), float((d_pl.sum() + d_lp.sum()) / (d_pl.size + d_lp.size))


def _class_pair(pred: tuple[list, list], label: tuple[list, list], k: int):
    """Class k's surface points of the prediction and of the label (:func:`_surfaces`), and which of each are also
    on the other (the same voxel)."""
    (p_mm, p_flat), (y_mm, y_flat) = pred, label
    return (p_mm[k], y_mm[k], np.isin(p_flat[k], y_flat[k], assume_unique=True),
            np.isin(y_flat[k], p_flat[k], assume_unique=True))


def surface_distances(
    pred: torch.Tensor,
    label: torch.Tensor,
    num_classes: int,
    spacing: Sequence[float],
    percentile: float = 95.0,
    definition: str = "max_directed",
    multilabel: bool = False,
) -> SurfaceDistances:
    """HD and ASSD per class. ``pred``/``label``: integer maps (``*spatial``; background 0 is not
    evaluated) or binary region stacks (``R x *spatial``) when ``multilabel``. ``spacing`` in mm per
    spatial axis, same order as the array axes."""
    if definition not in HD_DEFINITIONS:
        raise ValueError(f"hd_definition must be one of {HD_DEFINITIONS}, got {definition!r}")
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"hd_percentile must lie in [0, 100], got {percentile}")
    if pred.shape != label.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} != label shape {tuple(label.shape)}")
    spatial = pred.shape[1:] if multilabel else pred.shape
    if len(spacing) != len(spatial):
        raise ValueError(f"spacing {tuple(spacing)} does not match the {len(spatial)} spatial axes")
    if multilabel:  # one binary map per region; class 1 of each is the region
        pairs = [_class_pair(_surfaces(p.to(torch.uint8), 2, spacing, background=False),
                             _surfaces(y.to(torch.uint8), 2, spacing, background=False), 1)
                 for p, y in zip(pred, label)]
        classes = range(num_classes)
    else:
        surf_pred = _surfaces(pred, num_classes, spacing, background=False)
        surf_label = _surfaces(label, num_classes, spacing, background=False)
        pairs = [_class_pair(surf_pred, surf_label, k) for k in range(num_classes)]
        classes = range(1, num_classes)
    worst = worst_case_distance(tuple(spatial), spacing)
    hd = torch.full((num_classes,), torch.nan, dtype=torch.float64)
    assd = hd.clone()
    status: list[StructureStatus | None] = [None] * num_classes
    for k in classes:
        p, y, p_on_y, y_on_p = pairs[k]
        if len(p) and len(y):
            status[k] = StructureStatus.OK
            hd[k], assd[k] = _hd_assd(directed_distances(p, y, p_on_y), directed_distances(y, p, y_on_p), percentile,
                                      definition)
        elif len(p) or len(y):
            status[k] = StructureStatus.MISSED if len(y) else StructureStatus.FALSE_ALARM
            hd[k] = assd[k] = worst
        else:
            status[k] = StructureStatus.BOTH_EMPTY
    return SurfaceDistances(hd, assd, status)


class SurfaceDistanceMetric(CaseMetric):
    """HD and ASSD per class and case (``surface_distances``); ``aggregate()`` gives per-class
    means over cases (NaN excluded) and the status counts."""

    def __init__(self, num_classes: int, percentile: float = 95.0, definition: str = "max_directed",
                 multilabel: bool = False) -> None:
        super().__init__()
        self.num_classes, self.percentile, self.definition, self.multilabel = (
            num_classes, percentile, definition, multilabel)

    def compute(self, pred: torch.Tensor, label: torch.Tensor, spacing: Sequence[float]) -> SurfaceDistances:
        return surface_distances(pred, label, self.num_classes, spacing, self.percentile, self.definition,
                                 self.multilabel)

    def aggregate(self) -> dict:
        if not self._buffer:
            empty = torch.full((self.num_classes,), torch.nan, dtype=torch.float64)
            return {"hd": empty, "assd": empty.clone(), "status_counts": {}}
        hd = torch.stack([r.hd for r in self._buffer])
        assd = torch.stack([r.assd for r in self._buffer])
        return {"hd": hd.nanmean(0), "assd": assd.nanmean(0),
                "status_counts": status_counts([r.status for r in self._buffer], self.num_classes)}
