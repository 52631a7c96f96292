"""A structure's volume with an interval, a lower bound on its Dice and an upper bound on its HD95, for a new case,
by split conformal prediction per structure (Mondrian: each structure its own scores;
../shared/reference/new_case_statements.md, C1, C2, C4). Figures are those of :mod:`~mcseg.statements.features`.

* Volume, absolute score: s_i = |V_i - V^_i|, V^ the mask's volume; interval [V^ - q, V^ + q] (its lower end
  clipped at 0 mL, which keeps the coverage).
* Volume, normalised score (Lambert et al., "Robust conformal volume estimation in 3D medical images", MICCAI 2024;
  Lei et al. 2018): s_i = |V_i - V^_i| / sigma_i with sigma the Poisson-binomial standard deviation
  ``volume_sd_ml``, floored at one voxel's volume so that it is > 0; interval V^ +- q sigma.
* Volume, members' scale (``volume_members``; only where the prediction has members, ``volume_members_sd_ml`` in
  the tables): the same normalised score with sigma the standard deviation of the members' mask volumes (an
  ensemble's, TTA's or MC dropout's), floored at one voxel's volume.
* Dice, one-sided: s_i = D^_i - D_i with D^ the soft self-Dice; bound D >= D^ - q (clipped at 0).
* HD95, one-sided: s_i = H_i - H^_i with H^ the probability band's width ``band_mm``; bound H <= H^ + q.

q is the split quantile at 1 - alpha (:func:`~mcseg.statements.quantiles.conformal_quantile`; +inf when n is too
small for alpha) or, with weights, Tibshirani et al.'s weighted quantile, one per new case. The estimators are
fixed formulas, fitted on nothing, so every calibration case gives a score (no split of the calibration cases is
needed). Guarantee: P(truth in the statement) >= 1 - alpha for a new case exchangeable with the n calibration cases
(weighted: under covariate shift with the true density ratio), marginally over the draw of the cases, per
structure and per statement separately; not conditional on the case.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mcseg.registry import unique
from mcseg.statements.features import MEMBERS
from mcseg.statements.quantiles import conformal_quantile, weighted_quantile
from mcseg.statements.table import CaseTable

__all__ = ["STATEMENTS", "Statement", "available", "bounds", "covered", "quantiles", "scores", "statement"]


@dataclass(frozen=True)
class Statement:
    """One statement: its name, the truth it is about, how it bounds it (``side``), its text, its conformal score
    (``score(figures)``: ``n x K`` from a labelled table's figures) and its bounds given the quantile
    (``bounds(figures, q)``: ``(lower, upper)``, a one-sided statement's other end the range's end)."""

    name: str
    truth: str
    side: str  # "two-sided", "lower" or "upper"
    text: str
    score: Callable[[dict], np.ndarray]
    bounds: Callable[[dict, np.ndarray], tuple[np.ndarray, np.ndarray]]
    needs: tuple[str, ...] = ()  # label-free figures only some tables have (the members' spread)
    scale: str = ""  # the normalised score's sigma, in words (recorded in statements.json)


def _scale(f: dict, column: str = "volume_sd_ml") -> np.ndarray:
    """sigma of a normalised volume score: ``column`` (the Poisson-binomial standard deviation, or the members'),
    at least one voxel."""
    return np.maximum(f[column], f["voxel_ml"])


def _around_volume(f: dict, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    centre = f["volume_mask_ml"]
    return np.maximum(centre - width, 0.0), centre + width


STATEMENTS: dict[str, Statement] = unique((
    Statement("volume", "volume_true_ml", "two-sided",
              "true volume in [V - q, V + q] mL, V the mask's volume, s = |V_true - V|",
              lambda f: np.abs(f["volume_true_ml"] - f["volume_mask_ml"]),
              lambda f, q: _around_volume(f, q)),
    Statement("volume_normalised", "volume_true_ml", "two-sided",
              "true volume in V +- q sigma mL, sigma = sqrt(sum p(1-p)) x voxel volume (at least one voxel), "
              "s = |V_true - V| / sigma",
              lambda f: np.abs(f["volume_true_ml"] - f["volume_mask_ml"]) / _scale(f),
              lambda f, q: _around_volume(f, q * _scale(f)),
              scale="Poisson-binomial sd: sqrt(sum p(1-p)) x voxel volume, at least one voxel"),
    Statement("volume_members", "volume_true_ml", "two-sided",
              "true volume in V +- q sigma mL, sigma = the standard deviation of the members' mask volumes (at "
              "least one voxel), s = |V_true - V| / sigma",
              lambda f: np.abs(f["volume_true_ml"] - f["volume_mask_ml"]) / _scale(f, MEMBERS),
              lambda f, q: _around_volume(f, q * _scale(f, MEMBERS)), needs=(MEMBERS,),
              scale="members' sd: standard deviation (ddof 1) of the members' mask volumes, at least one voxel"),
    Statement("dice", "dice_true", "lower", "Dice >= D - q, D the soft self-Dice, s = D - Dice",
              lambda f: f["soft_dice"] - f["dice_true"],
              lambda f, q: (np.clip(f["soft_dice"] - q, 0.0, 1.0), np.ones_like(q))),
    Statement("hd95", "hd95_true_mm", "upper",
              "HD95 <= H + q mm, H the width of the probability band 0.25-0.75 (HD95 in mm), s = HD95 - H",
              lambda f: f["hd95_true_mm"] - f["band_mm"],
              lambda f, q: (np.zeros_like(q), f["band_mm"] + q)),
), lambda s: s.name, "statement")


def statement(name: str, figures: dict | None = None) -> Statement:
    """Statement ``name``; given a table's ``figures``, refused when they lack what it needs (no members)."""
    if name not in STATEMENTS:
        raise ValueError(f"statement {name!r}: expected one of {', '.join(STATEMENTS)}")
    missing = [n for n in STATEMENTS[name].needs if figures is not None and n not in figures]
    if missing:
        raise ValueError(f"statement {name!r} needs {', '.join(missing)}, which the cases' table lacks: the "
                         f"members' spread needs the members' predictions (mcseg-new-cases --fit-members and "
                         f"--apply-members)")
    return STATEMENTS[name]


def available(*tables: CaseTable) -> list[str]:
    """The statements every one of ``tables`` has the figures for (``volume_members`` only with members)."""
    return [name for name, s in STATEMENTS.items() if all(n in t.figures for t in tables for n in s.needs)]


def scores(table: CaseTable, name: str) -> np.ndarray:
    """``n x K`` conformal scores of statement ``name`` on a labelled table."""
    if not table.labelled:
        raise ValueError(f"scores of {name!r} need labelled cases")
    return statement(name, table.figures).score(table.figures)


def quantiles(calibration: CaseTable, name: str, alpha: float, weights: np.ndarray | None = None,
              new_weights: np.ndarray | None = None) -> np.ndarray:
    """Per structure the quantile of ``name``'s calibration scores: ``K`` values, or with ``weights`` (``n``) and
    ``new_weights`` (``m``) an ``m x K`` array (one weighted quantile per new case)."""
    s = scores(calibration, name)
    if weights is None:
        return np.array([conformal_quantile(s[:, k], alpha) for k in range(s.shape[1])])
    return np.array([[weighted_quantile(s[:, k], weights, w, alpha) for k in range(s.shape[1])]
                     for w in new_weights])


def bounds(new: CaseTable, name: str, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)``, ``m x K`` each, of statement ``name`` for the new cases given its quantile(s) ``q``
    (``K`` or ``m x K``)."""
    q = np.broadcast_to(np.asarray(q, np.float64), new.figures["volume_mask_ml"].shape)
    with np.errstate(invalid="ignore"):
        return statement(name, new.figures).bounds(new.figures, q)


def covered(table: CaseTable, name: str, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``m x K`` booleans: the labelled cases' truth inside the statement."""
    truth = table.figures[statement(name).truth]
    return (truth >= lower) & (truth <= upper)
