"""Per-case losses of thresholded sets, on a grid of thresholds, computed from one pass over a case's voxels.

Class k's set at threshold t is ``{v : p_k(v) >= t}`` (non-strict; MAPIE's segmentation controller uses ``p > t``,
the same sets wherever no probability equals a grid value). For each case, one pass counts per class and per grid
threshold the voxels of the set and those of the set inside the ground truth G_k (:func:`case_counts`); the losses
are then ratios of those counts, so a case is read once whatever the number of thresholds or splits:

* **FNR** (false-negative rate) ``1 - |set ∩ G_k| / |G_k|``: non-decreasing in t for every case (the set shrinks),
  bounded by 1. Undefined for a case without class k: the policy is a stated choice (:data:`ABSENT_POLICIES`).
* **FDR** (false-discovery rate) ``|set \\ G_k| / |set|``, 0 for an empty set (nothing discovered, nothing false;
  a case without class k has FDR 1 as soon as its set is not empty): bounded by 1 but NOT monotone in t, so only
  Learn-then-Test controls it (:mod:`mcseg.conformal.control` refuses it for CRC and RCPS).

The exchangeable units are cases, never voxels (../shared/reference/posthoc_and_conformal.md, B0): each row of a
loss table is one case.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mcseg.registry import unique

if TYPE_CHECKING:
    import torch

__all__ = ["ABSENT_POLICIES", "CaseCounts", "LOSSES", "Loss", "case_counts", "class_masks", "default_thresholds",
           "loss_table"]

ABSENT_POLICIES = {
    "skip": "a case without the class is left out of that class's calibration (class-conditional, Mondrian: the "
            "guarantee holds for cases that contain the class; n_cases counts the others)",
    "zero": "a case without the class counts with loss 0 (nothing to miss; the guarantee holds over all cases, "
            "MONAI PR #8939's choice), which lets the threshold rise on the cases that do contain it",
}


@dataclass(frozen=True)
class Loss:
    """A per-case loss of thresholded sets, everything about it in one entry: its name, whether it is
    non-decreasing in the threshold for every case (what CRC and RCPS need), which end of the valid thresholds is
    preferred (``largest``: the smallest set that controls it; ``smallest``: the largest set), its bound B, its
    text, and its formula: ``formula(hits, selected, positives)`` -> the losses from a case's counts (arrays of
    any shape; ``hits = |set ∩ G|``, ``selected = |set|``, ``positives = |G|``). ``needs_class``: undefined for a
    case without the class (the absent policy applies; NaN as a test value), else defined for every case."""

    name: str
    monotone: bool
    prefer: str
    bound: float
    text: str
    formula: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    needs_class: bool = True

    def of_counts(self, hits, selected, positives) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(self.formula(np.asarray(hits, np.float64), np.asarray(selected, np.float64),
                                           np.asarray(positives, np.float64)), np.float64)


def _fnr(hits: np.ndarray, selected: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """1 - |set ∩ G| / |G|; 0 where G is empty (nothing to miss: the ``zero`` policy's value)."""
    return 1.0 - np.divide(hits, positives, out=np.ones(np.broadcast(hits, positives).shape), where=positives > 0)


def _fdr(hits: np.ndarray, selected: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """|set \\ G| / |set|; 0 for an empty set."""
    return np.divide(selected - hits, selected, out=np.zeros(np.broadcast(hits, selected).shape), where=selected > 0)


LOSSES: dict[str, Loss] = unique((
    Loss("fnr", True, "largest", 1.0, "false-negative rate of the class, 1 - |set ∩ G| / |G|", _fnr),
    Loss("fdr", False, "smallest", 1.0, "false-discovery rate of the class, |set \\ G| / |set| (0 for an empty set)",
         _fdr, needs_class=False),
), lambda loss: loss.name, "conformal loss")


def default_thresholds(size: int = 101) -> torch.Tensor:
    """``size`` equally spaced thresholds 0, ..., 1 (float64); at t = 0 every set is the whole volume."""
    if size < 2:
        raise ValueError(f"grid size {size}: at least 2 thresholds")
    import torch  # here, not at the top: the losses and policies are read by the config checks before torch

    return torch.linspace(0.0, 1.0, size, dtype=torch.float64)


def class_masks(label: torch.Tensor, channels: int, multilabel: bool) -> torch.Tensor:
    """``C x *S`` boolean ground truth per channel: one-hot of an integer label map, or the region masks."""
    import torch

    if multilabel:
        return label.bool()
    return torch.nn.functional.one_hot(label.long(), channels).movedim(-1, 0).bool()


@dataclass
class CaseCounts:
    """Counts of one case (or of n cases, stacked on a leading axis by :meth:`stack`): ``positives[k] = |G_k|``,
    and per grid threshold ``selected[k, j] = |set|`` and ``hits[k, j] = |set ∩ G_k|`` (int64 arrays)."""

    positives: np.ndarray
    selected: np.ndarray
    hits: np.ndarray

    @staticmethod
    def stack(counts: list[CaseCounts]) -> CaseCounts:
        return CaseCounts(*(np.stack([getattr(c, f) for c in counts]) for f in ("positives", "selected", "hits")))

    def take(self, cases: np.ndarray) -> CaseCounts:
        """The stacked counts of ``cases`` (indices)."""
        return CaseCounts(self.positives[cases], self.selected[cases], self.hits[cases])


CHUNK = 1 << 22  # voxels binned at a time: a case's extra memory stays ~CHUNK x 16 bytes whatever its size


def case_counts(probs: torch.Tensor, truth: torch.Tensor, thresholds: torch.Tensor) -> CaseCounts:
    """Counts of one case for every class and grid threshold in one pass over its voxels: each voxel's bin (how
    many thresholds are <= p_k, in float64, so a float32 p is compared exactly) is counted once, and
    ``|{p_k >= t_j}|`` is the number of voxels in bins above j."""
    import torch

    t = torch.as_tensor(thresholds, dtype=torch.float64)
    if t.ndim != 1 or (t.numel() > 1 and not bool((t[1:] > t[:-1]).all())):
        raise ValueError("thresholds must be a 1-D strictly increasing grid")
    if probs.shape != truth.shape:
        raise ValueError(f"probabilities {tuple(probs.shape)} and ground truth {tuple(truth.shape)} differ in shape")
    c, size = probs.shape[0], t.numel() + 1
    t = t.to(probs.device)
    every = torch.zeros(c, size, dtype=torch.int64, device=probs.device)
    inside = torch.zeros_like(every)
    for k in range(c):
        p, g = probs[k].reshape(-1), truth[k].reshape(-1).bool()
        for start in range(0, p.numel(), CHUNK):
            bins = torch.bucketize(p[start:start + CHUNK].double(), t, right=True)  # = #{j : t_j <= p}
            every[k] += torch.bincount(bins, minlength=size)
            inside[k] += torch.bincount(bins[g[start:start + CHUNK]], minlength=size)

    def above(hist: torch.Tensor) -> np.ndarray:
        return hist.flip(1).cumsum(1).flip(1)[:, 1:].cpu().numpy()  # voxels whose bin is > j, i.e. p >= t_j

    return CaseCounts(truth.reshape(c, -1).sum(1).long().cpu().numpy(), above(every), above(inside))


def loss_table(counts: CaseCounts, k: int, loss: Loss | str, absent: str = "skip") -> tuple[np.ndarray, list[int]]:
    """The ``n x T`` table of class ``k``'s per-case losses from stacked ``counts`` (one row per case kept) and
    the indices of the cases without class k (left out under ``absent="skip"``, rows of 0 under ``"zero"``; FDR
    keeps every case)."""
    loss = LOSSES[loss] if isinstance(loss, str) else loss
    if absent not in ABSENT_POLICIES:
        raise ValueError(f"absent-class policy {absent!r}: expected one of {', '.join(ABSENT_POLICIES)}")
    positives = counts.positives[:, k]
    without = [int(i) for i in np.flatnonzero(positives == 0)]
    table = loss.of_counts(counts.hits[:, k], counts.selected[:, k], positives[:, None])
    if not loss.needs_class:
        return table, without
    if absent == "zero":
        table[positives == 0] = 0.0  # a case without the class: nothing to miss, loss 0
        return table, without
    return table[positives > 0], without
