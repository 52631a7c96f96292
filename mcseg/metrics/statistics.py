"""Summary statistics over cases: mean, standard deviation, median and a bootstrap confidence
interval, with undefined (NaN) values excluded and counted.

The interval is the percentile bootstrap (Efron & Tibshirani 1993, ch. 13) of the mean over
cases: ``n_boot`` resamples of the defined values with replacement, the 2.5th and 97.5th
percentiles of their means. Every call draws from ``numpy.random.default_rng(seed)``, so two
statistics over the same number of cases use the same resamples (a paired bootstrap), and the
figures do not depend on the order in which statistics are computed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["bootstrap_ci", "describe"]


def bootstrap_ci(values: np.ndarray, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (all finite); NaN if empty or
    ``n_boot`` is 0."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or n_boot <= 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def nanmean(values: Iterable[float]) -> float:
    """Mean of the non-NaN values; NaN when there are none."""
    v = np.asarray(list(values), dtype=np.float64)
    return float(v[~np.isnan(v)].mean()) if (~np.isnan(v)).any() else math.nan


def describe(values: Iterable[float], n_boot: int = 1000, seed: int = 0) -> dict:
    """``{mean, std (ddof=1), median, ci95: [lo, hi], n, n_undefined}`` over the non-NaN values."""
    v = np.asarray(list(values), dtype=np.float64)
    defined = v[~np.isnan(v)]
    n = int(defined.size)
    return {
        "mean": float(defined.mean()) if n else math.nan,
        "std": float(defined.std(ddof=1)) if n > 1 else math.nan,
        "median": float(np.median(defined)) if n else math.nan,
        "ci95": list(bootstrap_ci(defined, n_boot, seed)),
        "n": n,
        "n_undefined": int(v.size - n),
    }
