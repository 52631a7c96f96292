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

__all__ = ["CHUNK", "PECE_BINS", "PECE_DESCRIPTION", "PECE_FP_WEIGHT", "pece"]

PECE_BINS = 10
PECE_FP_WEIGHT = 2.0


CHUNK = 1 << 18  # voxels binned at a time (about 12 MB of float64 and int64 temporaries); the per-bin sums accumulate


def pece(confidence: Tensor, foreground: Tensor, n_bins: int = PECE_BINS, fp_weight: float = PECE_FP_WEIGHT,
         of_background: bool = False) -> float:
    """pECE (module docstring) of foreground confidences and the matching foreground indicator (any shape);
    NaN for no voxel. ``of_background``: ``confidence`` is the background probability p_0 and ``foreground`` the
    label map, and p = 1 - p_0, y = label != 0 are taken chunk by chunk (no full-size copy of either). Computed in float64 against the edges ``numpy.linspace(0, 1, n_bins + 1)``, over chunks of
    :data:`CHUNK` voxels (a large volume's evaluation holds no float64 copy of it)."""
    confidence, foreground = confidence.detach(), foreground.detach()
    if confidence.dim() == 0:
        confidence, foreground = confidence.reshape(1), foreground.reshape(1)
    n = confidence.numel()
    if n == 0:
        return math.nan
    # slabs of the first axis, each at most CHUNK voxels (or one row): a strided view (a channel of a
    # channels-last volume) is flattened one slab at a time, never whole
    step = max(1, CHUNK // max(1, n // confidence.shape[0]))
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # per bin: voxels, background voxels, sum of p, sum of y, sum of p over the background voxels; NumPy's bincounts
    # (on the host, where the voxels are binned: each sum in voxel order, as torch's; fewer passes a call)
    sums = np.zeros((5, n_bins))
    for lo in range(0, confidence.shape[0], step):
        p = confidence[lo:lo + step].reshape(-1).to("cpu", torch.float64)
        y = foreground[lo:lo + step].reshape(-1)
        if of_background:
            p, y = 1.0 - p, y != 0
        p, y = p.numpy(), y.to("cpu").numpy()
        # slot 0: p <= 0 (in no bin); slot b + 1: bin b = (edges[b], edges[b + 1]] (torch.bucketize, right=False);
        # the foreground voxels' slots offset by n_bins + 1. Each per-bin sum adds the same voxels in the same order
        # as a bincount of the bin's voxels alone: slots that are dropped only receive other voxels
        slot = np.searchsorted(edges, p, side="left")
        joint = slot + (n_bins + 1) * (y != 0)
        counts = np.bincount(joint, minlength=2 * (n_bins + 1)).reshape(2, n_bins + 1)[:, 1:].astype(np.float64)
        p_background = np.bincount(joint, p, 2 * (n_bins + 1))[1:n_bins + 1]
        p_all = np.bincount(slot, p, n_bins + 1)[1:]
        y_all = counts[1] if y.dtype == bool else np.bincount(slot, y.astype(np.float64), n_bins + 1)[1:]
        sums += np.stack([counts.sum(0), counts[0], p_all, y_all, p_background])
    sums = torch.from_numpy(sums)
    count, n_background, sum_p, sum_y, sum_p_background = sums
    filled = count > 0
    gap = (sum_p - sum_y) / count.clamp(min=1)
    offset = fp_weight * sum_p_background / n_background.clamp(min=1)
    return float((count[filled] / n * (gap + offset)[filled].abs()).sum())


#: the definition, as the evaluation's summary.json states it (``protocol.pece``)
PECE_DESCRIPTION = (f"SDC authors' pECE (arXiv 2503.05107, Algorithm 1): over all voxels of the case, p = 1 - p_0 against "
                    f"y = label != 0, {PECE_BINS} equal-width bins (lo, hi] (p = 0 in no bin, counted in N), "
                    f"sum_b |B_b|/N |mean p - mean y + {PECE_FP_WEIGHT:g} x mean p over the bin's background voxels|")
