"""What a prediction says about each structure without a label, and the truth those statements are about.

Per case and structure k (probabilities p_k of a ``C x *S`` array on the case's file grid, the predicted mask
P_k: the tool's label map, else the arg-max or p > 0.5 for regions, as the evaluator scores it; voxel volume
v = prod(spacing) / 1000 mL with the file's spacing in mm):

* ``volume_mask_ml`` = |P_k| v: the volume a reader measures on the mask (the estimate the intervals are about);
* ``volume_expected_ml`` = sum_v p_k(v) v: the expected volume, if p were calibrated and the voxels independent;
* ``volume_sd_ml`` = sqrt(sum_v p_k(v)(1 - p_k(v))) v: the standard deviation of the Poisson-binomial volume under
  the same assumption (the label-free scale of the normalised volume score; Lambert et al., MICCAI 2024);
* ``soft_dice`` = 2 sum_v p_k(v) 1[v in P_k] / (sum_v p_k(v) + |P_k|): the soft Dice of the probabilities against
  their own mask, a label-free estimate of the Dice (its expectation only approximately, for calibrated p; 1 when
  both sums are 0);
* ``band_mm``: the width of the probability band in mm, the 95th-percentile Hausdorff distance (mcseg's
  ``max_directed`` definition, :func:`mcseg.metrics.surface.surface_distances`) between {p_k >= 0.75} and
  {p_k >= 0.25}; 0 when both are empty, the image diagonal when one is (the evaluator's worst case).

Where the prediction has members (an ensemble's networks, TTA views, MC-dropout samples, each saved as its own
prediction folder), also ``volume_members_sd_ml`` (:func:`members_volume_sd`): the sample standard deviation
(ddof = 1) over the M >= 2 members of each member's mask volume |P_k^(m)| v, the members' spread as the scale of
the normalised volume score (Lambert et al., MICCAI 2024, use an ensemble's spread the same way).

Given the label G_k (:func:`case_truth`): ``volume_true_ml`` = |G_k| v (0 for an absent structure: kept, it is
part of the population), ``dice_true`` = 2|P ∩ G| / (|P| + |G|) (1 when both are empty), ``hd95_true_mm`` (the
evaluator's HD95; 0 when both are empty, the image diagonal when one is).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from mcseg.metrics.surface import surface_distances

__all__ = ["BAND", "FEATURES", "MEMBERS", "TRUTH", "case_features", "case_row", "case_truth", "members_volume_sd",
           "voxel_ml"]

FEATURES = ("volume_mask_ml", "volume_expected_ml", "volume_sd_ml", "soft_dice", "band_mm")
MEMBERS = "volume_members_sd_ml"  # only where the prediction has members
TRUTH = ("volume_true_ml", "dice_true", "hd95_true_mm")
BAND = (0.25, 0.75)  # the probability band whose width is band_mm


def voxel_ml(spacing: Sequence[float]) -> float:
    """One voxel's volume in mL from the spacing in mm."""
    return float(math.prod(float(s) for s in spacing)) / 1000.0


def _hd95(first: np.ndarray, second: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """Per structure (rows of two ``K x *S`` boolean stacks): HD95 in mm, 0 where both are empty."""
    distances = surface_distances(torch.from_numpy(first), torch.from_numpy(second), first.shape[0], spacing,
                                  multilabel=True)
    return np.nan_to_num(distances.hd.numpy(), nan=0.0)


def case_features(probs: torch.Tensor, pred: np.ndarray, spacing: Sequence[float],
                  classes: Sequence[int]) -> dict[str, np.ndarray]:
    """The label-free figures (module docstring) of ``classes``, each an array over them."""
    p = probs[list(classes)].double().reshape(len(classes), -1).numpy()
    mask = np.asarray(pred)[list(classes)].reshape(len(classes), -1)
    v = voxel_ml(spacing)
    size, mass = mask.sum(1).astype(np.float64), p.sum(1)
    overlap = (p * mask).sum(1)
    denominator = mass + size
    soft_dice = np.where(denominator > 0, 2 * overlap / np.where(denominator > 0, denominator, 1), 1.0)
    shape = (len(classes), *probs.shape[1:])
    low, high = (p >= BAND[0]).reshape(shape), (p >= BAND[1]).reshape(shape)
    return {"volume_mask_ml": size * v, "volume_expected_ml": mass * v,
            "volume_sd_ml": np.sqrt((p * (1 - p)).sum(1)) * v, "soft_dice": soft_dice,
            "band_mm": _hd95(high, low, spacing)}


def members_volume_sd(member_masks: Sequence[np.ndarray], spacing: Sequence[float],
                      classes: Sequence[int]) -> np.ndarray:
    """Per structure of ``classes``: the standard deviation (ddof = 1) over the members of their mask volumes in
    mL, from each member's ``C x *S`` boolean predicted masks (module docstring); at least two members."""
    if len(member_masks) < 2:
        raise ValueError(f"{len(member_masks)} member(s): the members' spread needs at least two")
    volumes = np.stack([np.asarray(m, bool)[list(classes)].reshape(len(classes), -1).sum(1) for m in member_masks])
    return volumes.astype(np.float64).std(0, ddof=1) * voxel_ml(spacing)


def case_truth(truth: np.ndarray, pred: np.ndarray, spacing: Sequence[float],
               classes: Sequence[int]) -> dict[str, np.ndarray]:
    """The labelled figures (module docstring) of ``classes`` from ``C x *S`` boolean truth and prediction."""
    g = np.asarray(truth, bool)[list(classes)]
    m = np.asarray(pred, bool)[list(classes)]
    flat_g, flat_m = g.reshape(len(classes), -1), m.reshape(len(classes), -1)
    sizes = flat_g.sum(1) + flat_m.sum(1)
    both = (flat_g & flat_m).sum(1)
    dice = np.where(sizes > 0, 2 * both / np.where(sizes > 0, sizes, 1), 1.0)
    return {"volume_true_ml": flat_g.sum(1) * voxel_ml(spacing), "dice_true": dice.astype(np.float64),
            "hd95_true_mm": _hd95(m, g, spacing)}


def case_row(probs: torch.Tensor, pred: np.ndarray, spacing: Sequence[float], classes: Sequence[int],
             truth: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One case's row of the per-case table (:class:`mcseg.statements.table.CaseTable`): the voxel volume, the
    label-free figures and, given the ``C x *S`` boolean ``truth``, the truth."""
    row = {"voxel_ml": np.full(len(classes), voxel_ml(spacing)), **case_features(probs, pred, spacing, classes)}
    if truth is not None:
        row.update(case_truth(truth, pred, spacing, classes))
    return row
