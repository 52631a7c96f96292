"""Sampled segmentations against several raters: generalised energy distance and Hungarian-matched IoU.

For predictors that give samples (ensemble members, MC-dropout samples, TTA views), N sampled label maps
s_1..s_N against M raters y_1..y_M, as the LIDC studies compute them (PHiSeg, CCDM, CARSSS;
../shared/reference/multirater_and_interop.md, A4):

* d(a, b) = 1 - (1/(C-1)) sum_{c=1}^{C-1} IoU_c(a, b), foreground classes only; IoU of two masks that both
  lack the class is 1 (d = 0), of one empty and one not 0.
* GED (reported squared, as every code does): D^2 = (2/(N M)) sum_{i,j} d(s_i, y_j) - (1/N^2) sum_{i,i'}
  d(s_i, s_i') - (1/M^2) sum_{j,j'} d(y_j, y_j') (diagonal pairs included; they are 0). The "diversity" is the
  sample-sample term (1/N^2) sum d(s_i, s_i').
* Hungarian-matched IoU: raters and samples each replicated to L = lcm(N, M) (each rater L/M times, each
  sample L/N times), cost d(y_a, s_b), the assignment of least total cost
  (:func:`linear_assignment`, the Hungarian algorithm), HM-IoU = mean of 1 - cost over the matched pairs.

All pairwise overlaps come from one pass over the voxels (a Gram matrix of one-hot maps, in chunks).
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["pairwise_distance", "generalised_energy_distance", "hungarian_matched_iou", "linear_assignment"]

_CHUNK = 1 << 20  # voxels per step: counts stay exact in float32 (< 2^24)


def pairwise_distance(maps: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``L x L`` d(a, b) between every pair of ``L x *S`` integer label maps (float64; module docstring)."""
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes}: the distance needs a foreground class")
    flat = maps.reshape(maps.shape[0], -1)
    n = flat.shape[0]
    inter = torch.zeros(num_classes - 1, n, n, dtype=torch.float64, device=maps.device)
    for start in range(0, flat.shape[1], _CHUNK):
        chunk = flat[:, start:start + _CHUNK].long()
        onehot = torch.stack([(chunk == c) for c in range(1, num_classes)]).float()  # (C-1) x L x V
        inter += torch.bmm(onehot, onehot.transpose(1, 2)).double()
    size = inter.diagonal(dim1=1, dim2=2)  # (C-1) x L
    union = size[:, :, None] + size[:, None, :] - inter
    iou = torch.where(union > 0, inter / union.clamp_min(1), 1.0)
    return 1.0 - iou.mean(0)


def generalised_energy_distance(samples: torch.Tensor, raters: torch.Tensor, num_classes: int) -> dict[str, float]:
    """GED (squared) and diversity of ``N x *S`` samples against ``M x *S`` raters, and the sample count."""
    if samples.shape[1:] != raters.shape[1:]:
        raise ValueError(f"samples {tuple(samples.shape[1:])} and raters {tuple(raters.shape[1:])} do not match")
    n, m = samples.shape[0], raters.shape[0]
    d = pairwise_distance(torch.cat([samples, raters.to(samples.dtype)]), num_classes)
    cross, within_s, within_y = d[:n, n:].mean(), d[:n, :n].mean(), d[n:, n:].mean()
    return {"ged": float(2 * cross - within_s - within_y), "diversity": float(within_s), "n_samples": n}


def hungarian_matched_iou(samples: torch.Tensor, raters: torch.Tensor, num_classes: int) -> float:
    """HM-IoU of ``N x *S`` samples against ``M x *S`` raters (module docstring)."""
    n, m = samples.shape[0], raters.shape[0]
    d = pairwise_distance(torch.cat([samples, raters.to(samples.dtype)]), num_classes)[n:, :n].cpu().numpy()
    size = n * m // math.gcd(n, m)
    cost = np.repeat(np.repeat(d, size // m, axis=0), size // n, axis=1)  # rater a // (L/M), sample b // (L/N)
    rows = linear_assignment(cost)
    return float(np.mean(1.0 - cost[np.arange(size), rows]))


def linear_assignment(cost: np.ndarray) -> np.ndarray:
    """For a square cost matrix, the column assigned to each row in an assignment of least total cost.

    The Hungarian algorithm with potentials (Kuhn 1955, Munkres 1957; the O(n^3) shortest augmenting path
    form): rows are added one at a time, each by a shortest path in reduced costs, the inner scans over columns
    vectorised.
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or cost.shape[0] != cost.shape[1]:
        raise ValueError(f"linear_assignment needs a square matrix, got shape {cost.shape}")
    if not np.isfinite(cost).all():
        raise ValueError("linear_assignment: the cost matrix has NaN or inf entries")
    n = cost.shape[0]
    u, v = np.zeros(n + 1), np.zeros(n + 1)  # potentials of rows and columns (index 0: a virtual one)
    match = np.zeros(n + 1, dtype=np.int64)  # match[j]: the row (1-based) given column j; 0 free
    way = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):
        match[0] = i
        j0 = 0
        minv = np.full(n + 1, np.inf)
        used = np.zeros(n + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = match[j0]
            free = ~used[1:]
            reduced = cost[i0 - 1] - u[i0] - v[1:]
            better = free & (reduced < minv[1:])
            minv[1:][better] = reduced[better]
            way[1:][better] = j0
            candidates = np.where(free, minv[1:], np.inf)
            j1 = int(np.argmin(candidates)) + 1
            delta = candidates[j1 - 1]
            u[match[used]] += delta
            v[used] -= delta
            minv[1:][free] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:  # augment along the path
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    rows = np.empty(n, dtype=np.int64)
    rows[match[1:] - 1] = np.arange(n)
    return rows
