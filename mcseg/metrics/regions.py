"""Voxel regions over which calibration is measured, named and chosen in the config.

* ``label_foreground``: voxels whose label is not background (the published segmentation
  protocol, e.g. the margin-seg code; it ignores false positives on background and flatters);
* ``union_foreground`` (mcseg's default): label foreground OR predicted foreground;
* ``all``: every voxel (MONAI ``CalibrationErrorMetric``; dominated by easy background);
* ``boundary``: voxels whose centre lies within ``boundary_width_mm`` (Euclidean, in mm with the
  voxel spacing) of a label boundary voxel, i.e. a voxel with a face neighbour of another label
  (both sides of every interface; the image border is not a boundary).

For multilabel tasks each region r uses its own binary maps (label_r, prediction_r).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from mcseg.config import REGIONS
from mcseg.metrics.surface import boundary_mask

__all__ = ["REGIONS", "region_mask", "boundary_band"]



def boundary_band(label_map: torch.Tensor, spacing: Sequence[float], width_mm: float) -> torch.Tensor:
    """Voxels within ``width_mm`` of a label boundary voxel (exact Euclidean distance in mm).

    The distance transform (scipy, CPU) runs on the bounding box of the boundary voxels grown by
    the width; voxels outside it are farther than ``width_mm`` from every boundary voxel.
    """
    from scipy.ndimage import distance_transform_edt  # here: scipy.ndimage takes ~1 s to import (docs/benchmarks.md)

    if width_mm < 0:
        raise ValueError(f"boundary_width_mm must be >= 0, got {width_mm}")
    edges = boundary_mask(label_map, image_border=False)
    band = torch.zeros_like(edges)
    coords = edges.nonzero()
    if coords.numel() == 0:
        return band
    radius = [math.floor(width_mm / s) + 1 for s in spacing]
    lo = [max(int(c) - r, 0) for c, r in zip(coords.min(0).values, radius)]
    hi = [min(int(c) + r + 1, n) for c, r, n in zip(coords.max(0).values, radius, edges.shape)]
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    dist = distance_transform_edt(~edges[box].cpu().numpy(), sampling=[float(s) for s in spacing])
    band[box] = torch.from_numpy(np.asarray(dist <= width_mm)).to(band.device)
    return band


def region_mask(
    region: str,
    label_map: torch.Tensor,
    pred_map: torch.Tensor,
    spacing: Sequence[float] | None = None,
    boundary_width_mm: float = 2.0,
) -> torch.Tensor | None:
    """Boolean mask of the region's voxels, or ``None`` for ``all`` (no copy needed).

    ``label_map``/``pred_map``: integer maps with background 0, or binary maps of one region.
    """
    if region == "all":
        return None
    if region == "label_foreground":
        return label_map != 0
    if region == "union_foreground":
        return (label_map != 0) | (pred_map != 0)
    if region == "boundary":
        if spacing is None:
            raise ValueError("region 'boundary' needs the voxel spacing")
        return boundary_band(label_map, spacing, boundary_width_mm)
    raise ValueError(f"region must be one of {REGIONS}, got {region!r}")
