"""Dice overlap per class and case, from voxel counts (one bincount, no one-hot).

Dice_k = 2 |P_k ∩ L_k| / (|P_k| + |L_k|)  (Dice 1945; Sørensen 1948). Empty structures follow
:mod:`mcseg.metrics.empty`: both empty -> NaN (0/0), a miss or a false alarm -> 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mcseg.metrics.base import CaseMetric
from mcseg.metrics.empty import StructureStatus, status_counts, structure_status

__all__ = ["OverlapCounts", "overlap_counts", "dice_score", "dice", "DiceMetric"]


@dataclass(frozen=True)
class OverlapCounts:
    """Per-class voxel counts of one case, shape (K,) each."""

    intersection: torch.Tensor
    n_label: torch.Tensor
    n_pred: torch.Tensor

    def status(self) -> list[StructureStatus]:
        return structure_status(self.n_label, self.n_pred)


_CHUNK_VOXELS = 1 << 22


def overlap_counts(
    pred: torch.Tensor, label: torch.Tensor, num_classes: int, multilabel: bool = False
) -> OverlapCounts:
    """Counts from integer maps (``*spatial``, values in [0, K)), or from binary region stacks
    (``R x *spatial``) when ``multilabel``."""
    if pred.shape != label.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} != label shape {tuple(label.shape)}")
    if multilabel:
        if pred.shape[0] != num_classes:
            raise ValueError(f"expected {num_classes} regions, got {pred.shape[0]}")
        p, y = pred.reshape(num_classes, -1).bool(), label.reshape(num_classes, -1).bool()
        return OverlapCounts((p & y).sum(1), y.sum(1), p.sum(1))
    for name, t in (("label", label), ("prediction", pred)):
        lo, hi = torch.aminmax(t)
        if lo < 0 or hi >= num_classes:
            raise ValueError(f"{name} values must lie in [0, {num_classes}), found [{int(lo)}, {int(hi)}]")
    # joint histogram of (label, prediction): row sums = |L_k|, column sums = |P_k|, diagonal = overlap;
    # in chunks, so the int64 index never covers a whole (e.g. 512 x 512 x 300) volume
    flat_label, flat_pred = label.reshape(-1), pred.reshape(-1)
    joint = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=label.device)
    for start in range(0, flat_label.numel(), _CHUNK_VOXELS):
        index = flat_label[start : start + _CHUNK_VOXELS].long() * num_classes
        index += flat_pred[start : start + _CHUNK_VOXELS]
        joint += torch.bincount(index, minlength=num_classes * num_classes)
    joint = joint.view(num_classes, num_classes)
    return OverlapCounts(joint.diagonal(), joint.sum(1), joint.sum(0))


def dice_score(counts: OverlapCounts) -> torch.Tensor:
    """Dice per class (float64): NaN when label and prediction are both empty."""
    denom = (counts.n_label + counts.n_pred).double()
    return torch.where(denom > 0, 2.0 * counts.intersection.double() / denom.clamp_min(1), torch.nan)


def dice(pred: torch.Tensor, label: torch.Tensor, num_classes: int, multilabel: bool = False) -> torch.Tensor:
    """Functional Dice per class (K,), background included at index 0 for integer maps."""
    return dice_score(overlap_counts(pred, label, num_classes, multilabel))


class DiceMetric(CaseMetric):
    """Dice per class and case. A call returns ``(dice (K,), statuses)``; ``aggregate()`` gives the
    per-class mean over cases (NaN excluded), the number of defined cases and the status counts."""

    def __init__(self, num_classes: int, multilabel: bool = False) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.multilabel = multilabel

    def compute(self, pred: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, list[StructureStatus]]:
        counts = overlap_counts(pred, label, self.num_classes, self.multilabel)
        return dice_score(counts), counts.status()

    def aggregate(self) -> dict:
        values = torch.stack([v for v, _ in self._buffer]) if self._buffer else torch.empty(0, self.num_classes)
        return {"mean": values.nanmean(0), "n_defined": (~values.isnan()).sum(0),
                "status_counts": status_counts([s for _, s in self._buffer], self.num_classes)}
