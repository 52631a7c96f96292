"""Choose one threshold from a per-case loss table (``n`` cases x ``T`` grid thresholds, ascending) so that the
loss of a new, exchangeable case is controlled (../shared/reference/posthoc_and_conformal.md, B2, B4, B5):

* :func:`crc`: conformal risk control (Angelopoulos et al., ICLR 2024), ``E[L_{n+1}] <= alpha``: the LARGEST grid
  threshold t with ``(n / (n + 1)) R_n(t) + B / (n + 1) <= alpha`` (non-strict, as the theorem). Written here, not
  MAPIE's ``get_r_hat_plus(method="crc")``: MAPIE fixes B = 1 and treats a bound equal to alpha as a violation.
* :func:`rcps`: risk-controlling prediction sets, ``P(risk <= alpha) >= 1 - delta``: MAPIE's upper confidence
  bound (``get_r_hat_plus(method="rcps")``: Hoeffding, Bernstein or its WSR, whose candidate bounds are the grid
  values themselves) and its selection ``find_best_predict_param`` (the last threshold before the first one whose
  bound is >= alpha).
* :func:`ltt`: Learn-then-Test, ``P(risk <= alpha) >= 1 - delta`` for every threshold it returns as valid, no
  monotonicity needed: MAPIE's ``ltt_procedure`` (Hoeffding-Bentkus p-values, Bonferroni-Holm by default); the
  threshold returned is the preferred end of the valid ones (:attr:`~mcseg.conformal.risks.Loss.prefer`).

CRC and RCPS refuse a loss that is not non-decreasing in the threshold (:class:`NotMonotone`): declared so, or
found decreasing on the table itself, for any case. When nothing controls the loss the most conservative grid
threshold is returned with ``controlled=False`` (for the FNR at t = 0 the set is the whole volume, loss 0).
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

from mcseg.conformal.risks import LOSSES, Loss

__all__ = ["METHODS", "NotMonotone", "ThresholdFit", "control", "controllable", "crc", "ltt", "rcps",
           "require_monotone"]

METHODS = ("crc", "rcps", "ltt")
RCPS_BOUNDS = ("wsr", "hoeffding", "bernstein")
FWER_METHODS = ("bonferroni_holm", "bonferroni", "fixed_sequence")
SIGMA_INIT = 0.25  # WSR's first variance, the RCPS paper's (and MAPIE's) value


class NotMonotone(ValueError):
    """CRC or RCPS asked to control a loss that is not non-decreasing in the threshold: no guarantee."""


@dataclass
class ThresholdFit:
    """The chosen threshold, its index in the grid, the calibration risk there (mean over the n cases), the
    quantity compared with alpha there (CRC's bound, RCPS's upper confidence bound, LTT's p-value) and whether
    the loss is controlled at all."""

    method: str
    threshold: float
    index: int
    n_cases: int
    risk: float
    bound: float
    controlled: bool

    def record(self) -> dict:
        return asdict(self)


def _checked(table: np.ndarray, thresholds: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    table, thresholds = np.asarray(table, np.float64), np.asarray(thresholds, np.float64)
    if table.ndim != 2 or table.shape[1] != thresholds.shape[0]:
        raise ValueError(f"loss table of shape {table.shape}: expected n cases x {thresholds.shape[0]} thresholds")
    if table.shape[0] == 0:
        raise ValueError("no calibration case: a threshold needs at least one case")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha}: expected 0 < alpha < 1")
    return table, thresholds


def controllable(loss: Loss | str, method: str) -> None:
    """Refuse, before any data is read, a loss declared not non-decreasing in the threshold for CRC or RCPS (whose
    guarantee needs that for every case): what the config alone decides (entry points check it at start)."""
    loss = LOSSES[loss] if isinstance(loss, str) else loss
    if method in ("crc", "rcps") and not loss.monotone:
        raise NotMonotone(f"{method}: the {loss.name} loss ({loss.text}) is not non-decreasing in the threshold, and "
                          f"{method.upper()}'s guarantee needs that for every case; use method 'ltt' (Learn-then-Test)")


def require_monotone(table: np.ndarray, loss: Loss, method: str, tolerance: float = 1e-12) -> None:
    """Refuse a loss CRC or RCPS cannot control: declared non-monotone (:func:`controllable`), or decreasing along
    the grid for a case."""
    controllable(loss, method)
    drops = np.diff(table, axis=1) < -tolerance
    if drops.any():
        case, j = (int(i) for i in np.argwhere(drops)[0])
        raise NotMonotone(f"{method}: the {loss.name} loss of calibration case {case} decreases from "
                          f"{table[case, j]:.6g} to {table[case, j + 1]:.6g} between grid thresholds {j} and {j + 1}: "
                          f"not non-decreasing in the threshold, no {method.upper()} guarantee; use method 'ltt'")


def _last_before_violation(bad: np.ndarray) -> int:
    """Index of the last grid threshold before the first violation (-1: the first one already violates)."""
    return int(np.argmax(bad)) - 1 if bad.any() else len(bad) - 1


def crc(table: np.ndarray, thresholds: np.ndarray, alpha: float, bound: float = 1.0) -> ThresholdFit:
    """Conformal risk control of a loss non-decreasing in the threshold (module docstring)."""
    table, thresholds = _checked(table, thresholds, alpha)
    n = table.shape[0]
    risk = table.mean(0)
    crc_bound = n / (n + 1) * risk + bound / (n + 1)
    index = _last_before_violation(crc_bound > alpha)
    controlled = index >= 0
    index = max(index, 0)
    return ThresholdFit("crc", float(thresholds[index]), index, n, float(risk[index]), float(crc_bound[index]),
                        controlled)


def rcps(table: np.ndarray, thresholds: np.ndarray, alpha: float, delta: float, bound: str = "wsr") -> ThresholdFit:
    """RCPS through MAPIE's upper confidence bound and selection (module docstring)."""
    from mapie.risk_control.methods import find_best_predict_param, get_r_hat_plus

    table, thresholds = _checked(table, thresholds, alpha)
    if bound not in RCPS_BOUNDS:
        raise ValueError(f"RCPS bound {bound!r}: expected one of {', '.join(RCPS_BOUNDS)}")
    if bound == "wsr" and (thresholds.min() < 0 or thresholds.max() > 1):
        raise ValueError("RCPS with MAPIE's WSR bound takes its candidate bounds from the grid: thresholds in [0, 1]")
    risk, ucb = get_r_hat_plus(table, thresholds, "rcps", bound, delta, SIGMA_INIT)
    bad = ucb >= alpha
    if bad.all() or not bad.any() or not ucb[0] < ucb[-1]:
        # MAPIE reads the scan direction from ucb[0] < ucb[-1]; a flat bound would be scanned the wrong way
        index = _last_before_violation(bad)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chosen = find_best_predict_param(thresholds, ucb, np.array([alpha]))
        index = int(np.flatnonzero(thresholds == np.atleast_1d(chosen)[0])[0])
    controlled = index >= 0 and not bad[max(index, 0)]
    index = max(index, 0)
    return ThresholdFit("rcps", float(thresholds[index]), index, table.shape[0], float(risk[index]),
                        float(ucb[index]), bool(controlled))


def ltt(table: np.ndarray, thresholds: np.ndarray, alpha: float, delta: float, prefer: str = "largest",
        fwer: str = "bonferroni_holm") -> ThresholdFit:
    """Learn-then-Test through MAPIE's ``ltt_procedure``; of the valid thresholds, the ``prefer`` end."""
    from mapie.risk_control._base_controller import ltt_procedure

    table, thresholds = _checked(table, thresholds, alpha)
    if fwer not in FWER_METHODS:
        raise ValueError(f"FWER method {fwer!r}: expected one of {', '.join(FWER_METHODS)}")
    n, size = table.shape
    risk = table.mean(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fixed_sequence warns on a non-monotone risk; the p-values say it all
        valid, p_values = ltt_procedure(risk[None], np.array([[alpha]]), delta, np.full((1, size), n),
                                        binary=False, fwer_method=fwer)
    valid = valid[0]
    if valid:
        index = max(valid) if prefer == "largest" else min(valid)
    else:
        index = 0 if prefer == "largest" else size - 1  # the safe end: the largest sets for the FNR
    return ThresholdFit("ltt", float(thresholds[index]), int(index), n, float(risk[index]),
                        float(p_values[index, 0]), bool(valid))


def control(table: np.ndarray, thresholds: np.ndarray, loss: Loss | str, method: str, alpha: float,
            delta: float | None = None, rcps_bound: str = "wsr", fwer: str = "bonferroni_holm") -> ThresholdFit:
    """The threshold of ``method`` for ``loss`` on a loss table; CRC and RCPS refuse a non-monotone loss."""
    loss = LOSSES[loss] if isinstance(loss, str) else loss
    if method not in METHODS:
        raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    if method != "crc" and (delta is None or not 0 < delta < 1):
        raise ValueError(f"method {method}: delta {delta}: expected 0 < delta < 1 (the failure probability)")
    if method == "ltt":
        return ltt(table, thresholds, alpha, delta, loss.prefer, fwer)
    require_monotone(np.asarray(table, np.float64), loss, method)
    if method == "crc":
        return crc(table, thresholds, alpha, loss.bound)
    return rcps(table, thresholds, alpha, delta, rcps_bound)
