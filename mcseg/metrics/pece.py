"""pECE, the foreground calibration error with a false-positive offset of the SDC authors (arXiv 2503.05107,
Algorithm 1; code EagleAdelaide/SDC-Loss, ``src/sdc/metrics.py::pECE``).

Over the N voxels of a case, with p the foreground confidence (1 - p_background) and y the foreground indicator,
M equal-width bins B_b = (b/M, (b+1)/M] (a voxel with p = 0 is in no bin but counts in N, as the authors'
``(p > lo) & (p <= hi)``):

    pECE = sum_b |B_b| / N * | mean_{B_b} p - mean_{B_b} y + w * mean_{B_b, y = 0} p |

the last mean 0 where the bin holds no background voxel. The authors' evaluation: M = 10, w = 2 (their
``CalibConfig`` and ``eval.py`` defaults), computed per case over the whole image, then averaged over cases.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = ["PECE_BINS", "PECE_DESCRIPTION", "PECE_FP_WEIGHT", "pece"]

PECE_BINS = 10
PECE_FP_WEIGHT = 2.0


def pece(confidence: Tensor, foreground: Tensor, n_bins: int = PECE_BINS, fp_weight: float = PECE_FP_WEIGHT) -> float:
    """pECE (module docstring) of foreground confidences and the matching foreground indicator (any shape);
    NaN for no voxel. Computed in float64 against the edges ``numpy.linspace(0, 1, n_bins + 1)``."""
    p = confidence.detach().reshape(-1).to("cpu", torch.float64)
    y = foreground.detach().reshape(-1).to("cpu", torch.float64)
    if p.numel() == 0:
        return math.nan
    edges = torch.from_numpy(np.linspace(0.0, 1.0, n_bins + 1))
    index = torch.bucketize(p, edges, right=False) - 1  # bin b holds (edges[b], edges[b + 1]]; -1: p <= 0
    binned = index >= 0
    background = binned & (y == 0)

    def per_bin(where: Tensor, weights: Tensor | None = None) -> Tensor:
        w = None if weights is None else weights[where]
        return torch.bincount(index[where], weights=w, minlength=n_bins).to(torch.float64)

    count, n_background = per_bin(binned), per_bin(background)
    filled = count > 0
    gap = (per_bin(binned, p) - per_bin(binned, y)) / count.clamp(min=1)
    offset = fp_weight * per_bin(background, p) / n_background.clamp(min=1)
    return float((count[filled] / p.numel() * (gap + offset)[filled].abs()).sum())

#: the definition, as the evaluation's summary.json states it (``protocol.pece``)
PECE_DESCRIPTION = (f"SDC authors' pECE (arXiv 2503.05107, Algorithm 1): over all voxels of the case, p = 1 - p_0 against "
                    f"y = label != 0, {PECE_BINS} equal-width bins (lo, hi] (p = 0 in no bin, counted in N), "
                    f"sum_b |B_b|/N |mean p - mean y + {PECE_FP_WEIGHT:g} x mean p over the bin's background voxels|")
