"""fd-shifts' risk-coverage statistics (IML-DKFZ/fd-shifts at c4467ae, ``analysis/rc_stats.py`` and
``rc_stats_utils.py``), re-derived from reading that code as an oracle for :mod:`mcseg.metrics.risk_coverage`:
its loops, its ROC convex hull (scikit-learn's ``roc_curve`` and scipy's ``ConvexHull``), its interpolations,
its bootstrap from NumPy's global generator. Scaled by 1000, as fd-shifts reports."""
from __future__ import annotations

import numpy as np
from scipy.spatial import ConvexHull
from sklearn.metrics import roc_curve

SCALE = 1000


def rc_points(confids, residuals, generalized=False):
    """Coverage (descending) and risk of each RC point, as ``selective_risk_stats`` / ``generalized_risk_stats``."""
    n = len(residuals)
    order = np.argsort(confids)
    res, conf = residuals[order], confids[order]
    kept, error = n, res.sum()
    covs, risks = [1.0], [error / (n if generalized else kept)]
    for i in range(n - 1):
        kept -= 1
        error -= res[i]
        if conf[i] != conf[i + 1]:
            covs.append(kept / n)
            risks.append(error / (n if generalized else kept))
    covs.append(0.0)
    risks.append(0.0 if generalized else risks[-1])
    return np.array(covs), np.array(risks)


def is_binary(residuals):
    return np.all((residuals == 0) | (residuals == 1))


def dominant_mask(confids, residuals):
    covs, _ = rc_points(confids, residuals)
    m = len(covs)
    if not is_binary(residuals):
        mask = np.ones(m, dtype=bool)
        mask[-1] = False
        return mask
    if residuals.sum() in (0, len(residuals)):
        idx = np.array([-1])
    else:
        fpr, tpr, _ = roc_curve(1 - residuals, confids, drop_intermediate=False)
        if m == 2:
            return np.array([True, False])
        pts = np.column_stack([np.append(fpr, 2.0), np.append(tpr, -1.0)])
        idx = ConvexHull(pts).vertices
        idx = idx[(idx != 0) & (idx != m)]
    mask = np.zeros(m, dtype=bool)
    mask[idx] = True
    return mask[::-1]


def linear_auc(covs, risks):
    return -np.sum(np.diff(covs) * (risks[1:] + risks[:-1]) / 2) * SCALE


def aurc(confids, residuals):
    return linear_auc(*rc_points(confids, residuals))


def augrc(confids, residuals):
    return linear_auc(*rc_points(confids, residuals, generalized=True))


def aurc_achievable(confids, residuals):
    covs, risks = rc_points(confids, residuals)
    mask = dominant_mask(confids, residuals)
    covs, risks = covs[mask], risks[mask]
    if covs[-1] == 0:
        covs, risks = covs[:-1], risks[:-1]
    n = len(residuals)
    cov = covs * n
    err = risks * cov
    total = 0.0
    if len(cov) > 1:
        total += np.sum(err[:-1] - err[1:] + (err[1:] * cov[:-1] - err[:-1] * cov[1:]) * np.log(cov[:-1] / cov[1:])
                        / -np.diff(cov))
    total += err[-1]
    return total / n * SCALE


def _optimal(residuals, generalized):
    n = len(residuals)
    return linear_auc(*rc_points(np.linspace(1, 0, n), np.sort(residuals), generalized))


def aurc_optimal(residuals):
    if is_binary(residuals):
        err = np.mean(residuals)
        return SCALE * (err + (1 - err) * np.log(1 - err + np.finfo(err.dtype).eps))
    return _optimal(residuals, False)


def augrc_optimal(residuals):
    if is_binary(residuals):
        return 0.5 * np.mean(residuals) ** 2 * SCALE
    return _optimal(residuals, True)


def ci_bs(confids, residuals, generalized=False, n_bs=10_000):
    """``evaluate_ci``: resamples from NumPy's global generator (the caller seeds it)."""
    n = len(confids)
    values = np.empty(n_bs)
    for i in range(n_bs):
        idx = np.random.choice(np.arange(n), size=n, replace=True)
        values[i] = linear_auc(*rc_points(confids[idx], residuals[idx], generalized))
    return np.percentile(values, [2.5, 97.5])
