"""Density-ratio weights between calibration and new cases, for weighted conformal prediction under covariate
shift (Tibshirani, Barber, Candes, Ramdas 2019; Lambert et al., MICCAI 2024, code benolmbrt/wcp_miccai;
../shared/reference/new_case_statements.md, C4).

A probabilistic classifier c(x) = P(new | x) is trained on the label-free case features x of the calibration
(class 0) and the new cases (class 1): a logistic regression on standardised features (scikit-learn), CROSS-FITTED
(each case's c comes from a model fitted on the other folds, stratified, ``folds`` of them), c clipped to
[0.01, 0.99] as wcp_miccai does, and w(x) = c / (1 - c) x n_cal / n_new. Case features (:func:`case_vector`): per
structure the log of the mask's and the expected volume (+1 mL), the relative Poisson-binomial spread, the soft
self-Dice and the band width, and, where images are given, the image's intensity mean, standard deviation and 1st
and 99th percentiles. The weights are estimates: the guarantee holds for the true ratio, so the effective sample
size (Kish, over the calibration weights) is reported, and a weighted quantile that is not reached is infinite.
"""
from __future__ import annotations

import numpy as np

from mcseg.statements.table import CaseTable

__all__ = ["CLIP", "MIN_NEW_CASES", "case_vector", "density_ratio_weights", "image_statistics"]

CLIP = (0.01, 0.99)
MIN_NEW_CASES = 10  # a classifier between the two groups needs some of each; fewer: refused


def image_statistics(image: np.ndarray) -> np.ndarray:
    """Intensity mean, standard deviation and 1st / 99th percentiles of an image (every voxel)."""
    values = np.asarray(image, np.float64).reshape(-1)
    return np.array([values.mean(), values.std(), *np.percentile(values, [1, 99])])


def case_vector(table: CaseTable, images: np.ndarray | None = None) -> np.ndarray:
    """``n x F`` label-free case features (module docstring)."""
    f = table.figures
    parts = [np.log1p(f["volume_mask_ml"]), np.log1p(f["volume_expected_ml"]),
             f["volume_sd_ml"] / (f["volume_expected_ml"] + f["voxel_ml"]), f["soft_dice"], f["band_mm"]]
    x = np.concatenate(parts, axis=1)
    return np.concatenate([x, images], axis=1) if images is not None else x


def density_ratio_weights(calibration: np.ndarray, new: np.ndarray, folds: int = 5,
                          seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Cross-fitted weights ``(w of the calibration cases, w of the new cases)`` (module docstring)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    calibration, new = np.asarray(calibration, np.float64), np.asarray(new, np.float64)
    if len(new) < MIN_NEW_CASES:
        raise ValueError(f"{len(new)} new case(s): weights under shift need at least {MIN_NEW_CASES} new cases to "
                         f"learn the shift from (use the plain statements for fewer)")
    x = np.concatenate([calibration, new])
    y = np.r_[np.zeros(len(calibration), int), np.ones(len(new), int)]
    folds = min(folds, len(calibration), len(new))
    c = np.empty(len(x))
    for train, held in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y):
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
        model.fit(x[train], y[train])
        c[held] = model.predict_proba(x[held])[:, 1]
    c = np.clip(c, *CLIP)
    w = c / (1 - c) * len(calibration) / len(new)
    return w[: len(calibration)], w[len(calibration):]
