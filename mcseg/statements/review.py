"""The review flag: "flag a case for review when its label-free risk score u exceeds s", with s chosen so that
among the cases NOT flagged the failure rate is <= alpha with probability >= 1 - delta (selective prediction with
a guarantee: Geifman and El-Yaniv 2017; Learn-then-Test, Angelopoulos et al. 2021;
../shared/reference/new_case_statements.md, C3).

* Risk score u of a case: 1 - min_k D^_k, D^ the soft self-Dice of each structure (:mod:`~mcseg.statements.features`;
  higher = riskier). Failure: min_k Dice_k < ``floor`` (any structure below the clinical floor).
* For each s of a grid fixed before the labels are seen (0, 0.01, ..., 1): n_s calibration cases with u <= s (the
  accepted), f_s failures among them, and the p-value of H0_s: R(s) = P(failure | u <= s) > alpha,
  p_s = P(Binomial(n_s, alpha) <= f_s) (exact binomial tail; 1 when n_s = 0).
* ``fixed_sequence`` (default): the grid from strict to loose, starting at the first s that accepts at least m
  cases, m the smallest n with (1 - alpha)^n <= delta (below it no p-value can reach delta; the start depends on
  u only, not on the labels); each H0_s rejected (s certified) while p_s <= delta, stopping at the first that is
  not. ``bonferroni``: every s with p_s <= delta / (grid size). The loosest certified s is the rule:
  P(R(s) <= alpha) >= 1 - delta over the draw of the calibration cases. None certified: flag every case, and say why.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["PROCEDURES", "ReviewRule", "default_grid", "failures", "fit_review", "minimum_accepted", "risk_scores"]

PROCEDURES = ("fixed_sequence", "bonferroni")


def default_grid(size: int = 101) -> np.ndarray:
    return np.linspace(0.0, 1.0, size)


def risk_scores(soft_dice: np.ndarray) -> np.ndarray:
    """Per case (rows of an ``n x K`` soft self-Dice), u = 1 - min over the structures."""
    return 1.0 - np.asarray(soft_dice, np.float64).min(axis=1)


def failures(dice: np.ndarray, floor: float) -> np.ndarray:
    """Per case, whether any structure's Dice is below ``floor``."""
    return np.asarray(dice, np.float64).min(axis=1) < floor


def minimum_accepted(alpha: float, delta: float) -> int:
    """The smallest n with (1 - alpha)^n <= delta: fewer accepted cases cannot certify anything."""
    return math.ceil(math.log(delta) / math.log(1 - alpha) - 1e-12)


@dataclass
class ReviewRule:
    """The chosen rule and what it rests on (``threshold`` -inf: flag every case)."""

    threshold: float
    certified: bool
    procedure: str
    alpha: float
    delta: float
    floor: float
    n_cases: int
    n_accepted: int
    failures_accepted: int
    p_value: float
    flagged_share: float
    minimum_accepted: int
    reason: str

    def flags(self, u: np.ndarray) -> np.ndarray:
        return np.asarray(u, np.float64) > self.threshold

    def record(self) -> dict:
        out = asdict(self)
        out["threshold"] = None if math.isinf(self.threshold) else self.threshold
        return out


def p_values(u: np.ndarray, failed: np.ndarray, grid: np.ndarray, alpha: float) -> tuple[np.ndarray, ...]:
    """Per grid value: accepted count n_s, failures f_s and p_s = P(Bin(n_s, alpha) <= f_s)."""
    from scipy.stats import binom  # scipy.stats: seconds to import
    accepted = np.asarray(u)[None, :] <= np.asarray(grid)[:, None]
    n = accepted.sum(1)
    f = (accepted & np.asarray(failed, bool)[None, :]).sum(1)
    p = np.where(n > 0, binom.cdf(f, np.maximum(n, 1), alpha), 1.0)
    return n, f, p


def fit_review(u: np.ndarray, failed: np.ndarray, alpha: float, delta: float, floor: float,
               procedure: str = "fixed_sequence", grid: np.ndarray | None = None) -> ReviewRule:
    """The loosest certified rule on the calibration cases (module docstring)."""
    if procedure not in PROCEDURES:
        raise ValueError(f"review procedure {procedure!r}: expected one of {', '.join(PROCEDURES)}")
    for key, value in (("alpha", alpha), ("delta", delta)):
        if not 0 < value < 1:
            raise ValueError(f"{key} {value}: expected 0 < {key} < 1")
    u, failed = np.asarray(u, np.float64), np.asarray(failed, bool)
    grid = default_grid() if grid is None else np.sort(np.asarray(grid, np.float64))
    n, f, p = p_values(u, failed, grid, alpha)
    m = minimum_accepted(alpha, delta)
    if procedure == "fixed_sequence":
        start = np.nonzero(n >= m)[0]
        certified: list[int] = []
        for j in range(start[0] if start.size else len(grid), len(grid)):
            if p[j] > delta:
                break
            certified.append(j)
    else:
        certified = list(np.nonzero(p <= delta / len(grid))[0])
    base = dict(procedure=procedure, alpha=alpha, delta=delta, floor=floor, n_cases=len(u), minimum_accepted=m)
    if not certified:
        if len(u) < m:
            reason = (f"{len(u)} calibration case(s): at least {m} accepted cases are needed before a failure rate "
                      f"<= {alpha} can be certified with probability {1 - delta} ((1 - alpha)^n <= delta)")
        else:
            reason = (f"no threshold certified ({procedure}): the failures among the accepted calibration cases are "
                      f"too many for a failure rate <= {alpha} at delta {delta}")
        return ReviewRule(threshold=-math.inf, certified=False, n_accepted=0, failures_accepted=0, p_value=1.0,
                          flagged_share=1.0, reason=reason + "; every case is flagged", **base)
    j = certified[-1]
    return ReviewRule(threshold=float(grid[j]), certified=True, n_accepted=int(n[j]), failures_accepted=int(f[j]),
                      p_value=float(p[j]), flagged_share=float((u > grid[j]).mean()),
                      reason=f"the loosest of {len(certified)} certified threshold(s)", **base)
