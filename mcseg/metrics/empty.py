"""Empty-structure policy shared by overlap and distance metrics.

For each class (or region) of a case, the label and the prediction are each empty or not:

=============  =========  ==========  =====================================================
status         label      prediction  Dice / HD / ASSD
=============  =========  ==========  =====================================================
ok             present    present     computed
both_empty     empty      empty       undefined: NaN, excluded from means, counted
missed         present    empty       Dice 0; HD and ASSD = worst case (image diagonal, mm)
false_alarm    empty      present     Dice 0; HD and ASSD = worst case (image diagonal, mm)
=============  =========  ==========  =====================================================

The published margin-seg evaluation scored an absent class Dice 1 / HD 0 even with false
positives, and a missed structure HD 0; both flatter a model and are not reproduced here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import torch

__all__ = ["StructureStatus", "structure_status", "status_counts", "worst_case_distance"]


class StructureStatus(str, Enum):
    OK = "ok"
    BOTH_EMPTY = "both_empty"
    MISSED = "missed"
    FALSE_ALARM = "false_alarm"


def structure_status(n_label: torch.Tensor, n_pred: torch.Tensor) -> list[StructureStatus]:
    """Status of each class from its voxel counts in the label and the prediction."""
    table = {
        (True, True): StructureStatus.OK,
        (False, False): StructureStatus.BOTH_EMPTY,
        (True, False): StructureStatus.MISSED,
        (False, True): StructureStatus.FALSE_ALARM,
    }
    return [table[(bool(a > 0), bool(b > 0))] for a, b in zip(n_label.tolist(), n_pred.tolist())]


def status_counts(cases: list[list[StructureStatus | None]], num_classes: int) -> dict[str, list[int]]:
    """For each status, the number of cases per class having it."""
    return {s.value: [sum(case[k] is s for case in cases) for k in range(num_classes)] for s in StructureStatus}


def worst_case_distance(shape: Sequence[int], spacing: Sequence[float]) -> float:
    """Image diagonal in mm, sqrt(sum_i (n_i * s_i)^2): an upper bound on any distance in the image."""
    if len(shape) != len(spacing):
        raise ValueError(f"shape {tuple(shape)} and spacing {tuple(spacing)} have different lengths")
    return math.sqrt(sum((n * s) ** 2 for n, s in zip(shape, spacing)))
