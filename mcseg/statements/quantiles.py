"""Conformal quantiles of calibration scores (../shared/reference/new_case_statements.md, C1 and C4).

* Split conformal (Vovk et al. 2005; Lei et al. 2018): with n calibration scores s_1..s_n, the k-th smallest,
  k = ceil((n + 1)(1 - alpha)), and +inf when k > n (n = 31 gives inf for alpha < 1/32). For a new case
  exchangeable with the calibration cases, P(s_new <= q) >= 1 - alpha, marginally over the draw of the n + 1
  cases (and <= 1 - alpha + 1/(n + 1) without ties). This is :func:`mcseg.conformal.margins.conformal_quantile`,
  used as it is.
* Weighted (Tibshirani, Barber, Candes, Ramdas, "Conformal prediction under covariate shift", NeurIPS 2019): with
  weights w_i = w(X_i) of the calibration cases and w = w(x) of the new case, p_i = w_i / (sum_j w_j + w) and the
  new case's mass w / (sum_j w_j + w) sits at +inf; q(x) is the smallest score t with sum_{i: s_i <= t} p_i
  >= 1 - alpha (+inf when the calibration mass never reaches it). Equal weights give the split quantile.
* Effective sample size of the CALIBRATION weights, n_eff = (sum w_i)^2 / sum w_i^2 (Kish); benolmbrt/wcp_miccai's
  code divides by the sum of the squared TEST weights instead, which is not Kish's formula.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mcseg.conformal.margins import conformal_quantile

__all__ = ["conformal_quantile", "effective_sample_size", "minimum_cases", "weighted_quantile"]


def minimum_cases(alpha: float) -> int:
    """The smallest n whose split quantile at ``alpha`` is finite: ceil((n + 1)(1 - alpha)) <= n."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha}: expected 0 < alpha < 1")
    return max(1, math.ceil((1 - alpha) / alpha - 1e-12))


def weighted_quantile(scores: Sequence[float], weights: Sequence[float], new_weight: float, alpha: float) -> float:
    """Tibshirani et al.'s weighted conformal quantile (module docstring); +inf when it is not reached."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha}: expected 0 < alpha < 1")
    scores, weights = np.asarray(scores, np.float64), np.asarray(weights, np.float64)
    if scores.shape != weights.shape:
        raise ValueError(f"{scores.size} scores but {weights.size} weights")
    if (weights < 0).any() or new_weight < 0 or not np.isfinite(weights).all() or not math.isfinite(new_weight):
        raise ValueError("weights must be finite and >= 0")
    total = weights.sum() + new_weight
    if total <= 0:
        return math.inf
    order = np.argsort(scores, kind="stable")
    mass = np.cumsum(weights[order]) / total
    reached = np.nonzero(mass >= 1 - alpha - 1e-12)[0]
    return float(scores[order][reached[0]]) if reached.size else math.inf


def effective_sample_size(weights: Sequence[float]) -> float:
    """Kish's n_eff = (sum w)^2 / sum w^2 of the calibration weights (0 when they are all 0)."""
    weights = np.asarray(weights, np.float64)
    squares = float((weights ** 2).sum())
    return float(weights.sum() ** 2 / squares) if squares > 0 else 0.0
