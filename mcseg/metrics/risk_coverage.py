"""Risk-coverage curves of cases and their areas, as fd-shifts computes them (Traub et al., "Overcoming common
flaws in the evaluation of selective classification systems", 2024; IML-DKFZ/fd-shifts at c4467ae,
``analysis/rc_stats.py``). A case has a risk (e.g. 1 - its Dice) and a confidence (e.g. minus its aggregated
uncertainty); n cases. All areas are **unscaled** (fd-shifts displays them x 1000).

* :func:`risk_coverage` — remove the least confident cases first; one point at coverage 1, one after each
  change of confidence (tied cases leave together), and a last point at coverage 0 that repeats the last
  selective risk (generalised risk: 0). Selective risk: the mean risk of the cases kept; generalised risk:
  their risk summed over all n cases.
* :func:`aurc` and :func:`augrc` — minus the trapezoid integral over coverage of those curves.
* :func:`eaurc` — AURC minus fd-shifts' optimum :func:`optimal_aurc`: for binary risks (all 0 or 1) the analytic
  :math:`\\hat r + (1 - \\hat r)\\ln(1 - \\hat r)` (Geifman et al., ICLR 2019), which a perfect order of few cases
  can beat (E-AURC slightly negative); otherwise the AURC of the risks sorted ascending, each case its own
  confidence. :func:`eaugrc` likewise with :func:`optimal_augrc` (binary: :math:`\\hat r^2 / 2`).
* :func:`achievable_aurc` — fd-shifts' ``aurc_achievable``: only the dominant points of the curve (binary risks:
  the vertices of the ROC convex hull of correct-versus-wrong, where a threshold could actually stop; otherwise
  every point but coverage 0), joined by the curve on which the kept error sum E and the kept count c both vary
  linearly, so each segment adds :math:`E_k - E_{k+1} + (E_{k+1} c_k - E_k c_{k+1}) \\ln(c_k / c_{k+1}) / (c_k -
  c_{k+1})` and the last one :math:`E_{last}`, all over n. With continuous risks it can exceed :func:`aurc`.
* :func:`area_ci` — percentile bootstrap interval of AURC or AUGRC over the cases (fd-shifts' ``aurc_ci_bs`` and
  ``augrc_ci_bs``: 10,000 resamples, 2.5 and 97.5 percentiles). fd-shifts draws from NumPy's unseeded global
  generator; mcseg draws the same way from ``numpy.random.RandomState(seed)``, so ``np.random.seed(seed)`` before
  fd-shifts' call gives the identical interval.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["risk_coverage", "aurc", "augrc", "optimal_aurc", "optimal_augrc", "eaurc", "eaugrc",
           "achievable_aurc", "area_ci", "area_cis"]


def risk_coverage(confidence: Sequence[float], risk: Sequence[float]) -> dict[str, np.ndarray]:
    """The risk-coverage curve of fd-shifts: ``coverage``, ``selective_risk`` and ``generalized_risk``
    from coverage 1 down to 0 (module docstring). Ties in confidence leave together."""
    kappa, r = np.asarray(confidence, dtype=np.float64), np.asarray(risk, dtype=np.float64)
    if kappa.shape != r.shape or kappa.ndim != 1 or kappa.size == 0:
        raise ValueError(f"confidence and risk: expected two equal-length non-empty lists, got {kappa.shape} "
                         f"and {r.shape}")
    if not (np.isfinite(kappa).all() and np.isfinite(r).all()):
        raise ValueError("confidence and risk must be finite (leave undefined cases out and say how many)")
    order = np.argsort(-kappa, kind="stable")  # most confident first
    kappa, r = kappa[order], r[order]
    n = r.size
    kept = np.cumsum(r)
    # a point where the next case (in falling confidence) is less confident: the kept set ends there
    ends = np.flatnonzero(np.append(kappa[1:] != kappa[:-1], True))  # indices of each group's last case
    counts = ends + 1
    coverage = counts[::-1] / n
    selective = (kept[ends] / counts)[::-1]
    generalized = (kept[ends] / n)[::-1]
    return {"coverage": np.append(coverage, 0.0), "selective_risk": np.append(selective, selective[-1]),
            "generalized_risk": np.append(generalized, 0.0)}


def _area(y: np.ndarray, x: np.ndarray) -> float:
    """Minus the trapezoid integral over a falling ``x`` (coverage 1 -> 0)."""
    return float(-np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def aurc(confidence: Sequence[float], risk: Sequence[float]) -> float:
    curve = risk_coverage(confidence, risk)
    return _area(curve["selective_risk"], curve["coverage"])


def augrc(confidence: Sequence[float], risk: Sequence[float]) -> float:
    curve = risk_coverage(confidence, risk)
    return _area(curve["generalized_risk"], curve["coverage"])


def optimal_aurc(risk: Sequence[float]) -> float:
    """The AURC of an optimal confidence, as fd-shifts' ``aurc_optimal`` (Traub et al. 2024).

    Binary risks (every one 0 or 1), with error rate :math:`\\hat r`: the analytic optimum of Geifman et al.
    (ICLR 2019), :math:`\\hat r + (1 - \\hat r)\\ln(1 - \\hat r)` (1 at :math:`\\hat r = 1`, its limit; fd-shifts
    adds float64 eps inside the log). Otherwise: the AURC of the risks sorted ascending, every case its own
    confidence, with the same trapezoid as :func:`aurc`."""
    r = np.asarray(risk, dtype=np.float64)
    if r.size and np.all((r == 0) | (r == 1)):
        err = float(r.mean())
        return 1.0 if err == 1.0 else err + (1.0 - err) * math.log1p(-err)
    curve = _sorted_risks_curve(r)
    return _area(curve["selective_risk"], curve["coverage"])


def eaurc(confidence: Sequence[float], risk: Sequence[float]) -> float:
    """E-AURC: :func:`aurc` minus :func:`optimal_aurc` (Geifman et al., ICLR 2019; fd-shifts)."""
    return aurc(confidence, risk) - optimal_aurc(risk)


def _is_binary(r: np.ndarray) -> bool:
    return bool(r.size) and bool(np.all((r == 0) | (r == 1)))


def _sorted_risks_curve(r: np.ndarray) -> dict[str, np.ndarray]:
    """The curve of an optimal confidence: the risks sorted ascending, every case its own (falling) confidence."""
    return risk_coverage(-np.arange(r.size, dtype=np.float64), np.sort(r))


def optimal_augrc(risk: Sequence[float]) -> float:
    """The AUGRC of an optimal confidence (fd-shifts' ``augrc_optimal``): :math:`\\hat r^2 / 2` for binary risks,
    otherwise the AUGRC of the risks sorted ascending."""
    r = np.asarray(risk, dtype=np.float64)
    if _is_binary(r):
        return 0.5 * float(r.mean()) ** 2
    curve = _sorted_risks_curve(r)
    return _area(curve["generalized_risk"], curve["coverage"])


def eaugrc(confidence: Sequence[float], risk: Sequence[float]) -> float:
    """E-AUGRC: :func:`augrc` minus :func:`optimal_augrc` (fd-shifts)."""
    return augrc(confidence, risk) - optimal_augrc(risk)


def _kept_counts(confidence: np.ndarray, risk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per point of :func:`risk_coverage` but the last (coverage 1 first): the number of cases kept and their
    summed risk."""
    curve = risk_coverage(confidence, risk)
    counts = np.rint(curve["coverage"][:-1] * risk.size)
    return counts, curve["selective_risk"][:-1] * counts


def _upper_hull(x: np.ndarray, y: np.ndarray) -> list[int]:
    """Indices of the vertices of the upper convex hull of points sorted by x (ties by y), collinear points
    left out (Andrew's monotone chain). Exact for integer coordinates."""
    hull: list[int] = []
    for i in range(x.size):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (x[b] - x[a]) * (y[i] - y[a]) - (y[b] - y[a]) * (x[i] - x[a]) < 0:
                break
            hull.pop()
        hull.append(i)
    return hull


def _dominant(counts: np.ndarray, errors: np.ndarray, binary: bool) -> np.ndarray:
    """Mask of the dominant points among the curve's points with coverage > 0 (coverage 1 first)."""
    if not binary:
        return np.ones(counts.size, dtype=bool)
    keep = np.zeros(counts.size, dtype=bool)
    n_wrong = errors[0]
    if n_wrong in (0, counts[0]):  # all right or all wrong: a flat curve, its one dominant point is coverage 1
        keep[0] = True
        return keep
    # ROC of "correct" against "wrong" along falling confidence, from (0, 0) (nothing kept) to the whole set, in
    # integer units: x = wrong kept, y = right kept. A point off the hull can be beaten by mixing two thresholds.
    wrong = np.append(0, errors[::-1]).astype(np.int64)
    right = np.append(0, (counts - errors)[::-1]).astype(np.int64)
    vertices = [v for v in _upper_hull(wrong, right) if v > 0]
    keep[counts.size - np.asarray(vertices)] = True
    return keep


def achievable_aurc(confidence: Sequence[float], risk: Sequence[float]) -> float:
    """fd-shifts' achievable AURC (module docstring), unscaled."""
    kappa, r = np.asarray(confidence, dtype=np.float64), np.asarray(risk, dtype=np.float64)
    counts, errors = _kept_counts(kappa, r)
    keep = _dominant(counts, np.rint(errors) if _is_binary(r) else errors, _is_binary(r))
    c, e = counts[keep], errors[keep]
    total = float(e[-1])
    if c.size > 1:
        c0, c1, e0, e1 = c[:-1], c[1:], e[:-1], e[1:]
        total += float(np.sum(e0 - e1 + (e1 * c0 - e0 * c1) * np.log(c0 / c1) / (c0 - c1)))
    return total / r.size


_AREAS = ("aurc", "augrc")


def _resampled_areas(kappa: np.ndarray, r: np.ndarray, draws: np.ndarray, generalized: bool) -> np.ndarray:
    """:func:`aurc` (or :func:`augrc`) of every row of case indices ``draws`` (B x n) at once
    (:func:`_resampled_both`)."""
    return _resampled_both(kappa, r, draws)["augrc" if generalized else "aurc"]


ROWS_ELEMENTS = 2**15  # resamples scored together: B x n float64 temporaries of at most 256 KB each stay in cache


def _resampled_both(kappa: np.ndarray, r: np.ndarray, draws: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`aurc` and :func:`augrc` of every row of case indices ``draws`` (B x n) at once: each row sorted by
    falling confidence, a point at the end of each group of equal confidence (a case drawn twice is tied with
    itself), the trapezoid between consecutive points and the last one down to coverage 0. The two areas share
    the sort and the groups (one pass: half the time of two, the same values). Rows are scored
    :data:`ROWS_ELEMENTS` entries at a time: every row's arithmetic is its own, so the values are those of all
    rows at once, and the temporaries stay in the cache (a thousand resamples of a thousand cases: 8 MB each)."""
    n = r.size
    order = np.argsort(-kappa, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    kappa, r = kappa[order], r[order]
    count = np.arange(1, n + 1, dtype=np.float64)
    areas = {area: np.empty(len(draws)) for area in _AREAS}
    rows = max(1, ROWS_ELEMENTS // max(n, 1))
    for start in range(0, len(draws), rows):
        sorted_pos = np.sort(rank[draws[start:start + rows]], axis=1)
        for area, values in _areas_of_sorted(kappa[sorted_pos], r[sorted_pos], count).items():
            areas[area][start:start + rows] = values
    return areas


def _areas_of_sorted(conf: np.ndarray, risk: np.ndarray, count: np.ndarray) -> dict[str, np.ndarray]:
    """AURC and AUGRC of each row of ``conf`` and ``risk``, every row's cases in order of falling confidence
    (:func:`_resampled_both`); ``count``: 1 .. n."""
    n = count.size
    kept = np.cumsum(risk, axis=1)
    is_end = np.ones_like(conf, dtype=bool)
    is_end[:, :-1] = conf[:, 1:] != conf[:, :-1]
    positions = np.where(is_end, np.arange(n), -1)
    previous = np.full_like(positions, -1)
    previous[:, 1:] = np.maximum.accumulate(positions, axis=1)[:, :-1]  # the last group end before each position
    has_previous = previous >= 0
    prev_index = np.where(has_previous, previous, 0)
    prev_count = np.where(has_previous, prev_index + 1, 0) / n
    areas = {}
    for area, generalized in (("aurc", False), ("augrc", True)):
        value = kept / n if generalized else kept / count
        prev_value = np.take_along_axis(value, prev_index, axis=1)
        step = (count / n - prev_count) * (value + prev_value) / 2
        last = count / n * (value / 2 if generalized else value)  # the first group's point down to coverage 0
        areas[area] = np.where(is_end, np.where(has_previous, step, last), 0.0).sum(axis=1)
    return areas


def area_ci(confidence: Sequence[float], risk: Sequence[float], area: str = "aurc", n_boot: int = 10_000,
            seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of :func:`aurc` (``area="aurc"``) or :func:`augrc` over resampled cases
    (module docstring); NaN when ``n_boot`` is 0."""
    if area not in _AREAS:
        raise ValueError(f"area={area!r}: expected one of {list(_AREAS)}")
    return area_cis(confidence, risk, n_boot, seed, level)[area]


def area_cis(confidence: Sequence[float], risk: Sequence[float], n_boot: int = 10_000, seed: int = 0,
             level: float = 0.95) -> dict[str, tuple[float, float]]:
    """:func:`area_ci` of AURC and of AUGRC from the same resamples (the intervals each gives alone)."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a value in (0, 1)")
    kappa, r = np.asarray(confidence, dtype=np.float64), np.asarray(risk, dtype=np.float64)
    risk_coverage(kappa, r)  # validates the inputs once
    if n_boot <= 0:
        return {area: (math.nan, math.nan) for area in _AREAS}
    draws = np.random.RandomState(seed).randint(0, r.size, size=(n_boot, r.size))
    tail = 100 * (1 - level) / 2
    out = {}
    for area, values in _resampled_both(kappa, r, draws).items():
        lo, hi = np.percentile(values, [tail, 100 - tail])
        out[area] = (float(lo), float(hi))
    return out
