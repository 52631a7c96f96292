"""The CRPS of a structure's volume against the raters' volume distribution (CURVAS 2024/2025).

Per class c: the raters' volumes V_r = |y_r = c| * voxel volume, mu their mean and sigma their population
standard deviation (ddof 0); the predicted volume is the expected one, V_hat = sum_v p_c(v) * voxel volume
(a number, not a distribution). The score is the continuous ranked probability score of the Normal(mu, sigma)
the raters define, for the outcome V_hat:

    CRPS = integral over y of (F(y) - H(y - V_hat))^2 dy,   F the Normal CDF, H the step (H(0) = 1/2)
         = sigma [z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)],  z = (V_hat - mu) / sigma   (Gneiting & Raftery 2007)

and |V_hat - mu| when sigma = 0. ``curvas_code=True`` computes it as CURVAS's code does
(../shared/reference/multirater_and_interop.md, A1): F is the Normal CDF sampled at 100 equispaced points of
[ppf(0.01), ppf(0.99)] and linearly interpolated, 0 below and 1 above (jumps of 0.01 at both ends), and the
integral is TRUNCATED to [mu - 3 sigma, mu + 3 sigma]: a prediction far outside saturates, and sigma = 0 gives
0 whatever the prediction. That integral is computed exactly (the integrand is piecewise quadratic).
Units: those of ``voxel_volume`` (the evaluator passes mL).
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["rater_volumes", "crps_normal", "crps_curvas_code", "volume_crps"]

CURVAS_GRID = 100


def rater_volumes(raters: torch.Tensor, num_classes: int, voxel_volume: float = 1.0) -> torch.Tensor:
    """``K x C`` volumes of each class in each rater's map (0 for an absent class)."""
    counts = torch.stack([torch.bincount(r.reshape(-1).long(), minlength=num_classes) for r in raters])
    return counts.double() * voxel_volume


def crps_normal(mu: float, sigma: float, value: float) -> float:
    """CRPS of Normal(mu, sigma) for the outcome ``value`` (closed form; sigma 0: |value - mu|)."""
    from scipy.stats import norm  # scipy.stats: seconds to import, only for raters
    if sigma <= 0:
        return abs(value - mu)
    z = (value - mu) / sigma
    return float(sigma * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi)))


def crps_curvas_code(mu: float, sigma: float, value: float) -> float:
    """CRPS as CURVAS's code integrates it (module docstring): interpolated CDF, truncated to mu +- 3 sigma."""
    from scipy.stats import norm  # scipy.stats: seconds to import, only for raters
    lo, hi = mu - 3 * sigma, mu + 3 * sigma
    if not hi > lo:
        return 0.0
    grid = np.linspace(norm.ppf(0.01, mu, sigma), norm.ppf(0.99, mu, sigma), CURVAS_GRID)
    cdf = norm.cdf(grid, mu, sigma)
    knots = np.unique(np.concatenate([[lo, hi], grid[(grid > lo) & (grid < hi)],
                                      [value] if lo < value < hi else []]))
    a, b = knots[:-1], knots[1:]
    mid = (a + b) / 2

    def inside(x: np.ndarray, seg: np.ndarray) -> np.ndarray:
        """F on the open segment containing ``mid``, extended linearly to ``x``."""
        i = np.clip(np.searchsorted(grid, seg, side="right") - 1, 0, CURVAS_GRID - 2)
        slope = (cdf[i + 1] - cdf[i]) / (grid[i + 1] - grid[i])
        linear = cdf[i] + slope * (x - grid[i])
        return np.where(seg < grid[0], 0.0, np.where(seg > grid[-1], 1.0, linear))

    step = (mid > value).astype(np.float64)
    ua, ub = inside(a, mid) - step, inside(b, mid) - step
    return float(np.sum((b - a) / 3 * (ua * ua + ua * ub + ub * ub)))


def volume_crps(probs: torch.Tensor, raters: torch.Tensor, voxel_volume: float = 1.0,
                curvas_code: bool = False) -> dict[str, list[float]]:
    """Per class (index 0, background, NaN): the CRPS of the expected volume of ``C x *S`` probabilities
    against the volumes of ``K x *S`` raters, with the predicted and the raters' mean and std volumes."""
    num_classes = probs.shape[0]
    volumes = rater_volumes(raters, num_classes, voxel_volume)
    mu, sigma = volumes.mean(0), volumes.std(0, unbiased=False)
    predicted = probs.reshape(num_classes, -1).double().sum(1) * voxel_volume
    score = crps_curvas_code if curvas_code else crps_normal
    crps = [math.nan] + [score(float(mu[c]), float(sigma[c]), float(predicted[c])) for c in range(1, num_classes)]
    nan = [math.nan]
    return {"volume_crps": crps, "volume_predicted": nan + predicted[1:].tolist(),
            "volume_rater_mean": nan + mu[1:].tolist(), "volume_rater_std": nan + sigma[1:].tolist()}
