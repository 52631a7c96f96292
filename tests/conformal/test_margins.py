"""Conformal margins in mm against hand-derived cases with anisotropic spacing."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mcseg.conformal.margins import conformal_quantile, depth, grown, inner_score, outer_score, shrunk

SPACING = (2.0, 1.0, 0.5)


def point(shape, *where):
    mask = np.zeros(shape, bool)
    for w in where:
        mask[w] = True
    return mask


@pytest.mark.parametrize("tau,expected", [(1.0, 2.0), (0.75, 2.0), (0.6, 1.5), (0.5, 1.5), (0.3, 0.0)])
def test_outer_margin_is_the_tau_quantile_of_the_truths_distances_in_mm(tau, expected):
    shape = (11, 11, 11)
    pred = point(shape, (5, 5, 5))
    # ground truth: the predicted voxel (0 mm), 3 voxels along z (1.5 mm), 1 along x (2.0 mm)
    truth = point(shape, (5, 5, 5), (5, 5, 8), (6, 5, 5))
    assert outer_score(pred, truth, SPACING, tau) == expected


def test_outer_margin_diagonal_empty_prediction_and_empty_truth():
    shape = (11, 11, 11)
    pred = point(shape, (5, 5, 5))
    assert outer_score(pred, point(shape, (6, 6, 5)), SPACING) == pytest.approx(math.sqrt(2.0 ** 2 + 1.0 ** 2))
    assert outer_score(np.zeros(shape, bool), point(shape, (1, 1, 1)), SPACING) == math.inf
    assert outer_score(pred, np.zeros(shape, bool), SPACING) == 0.0


def test_inner_margin_is_the_depth_of_the_deepest_predicted_voxel_outside_the_truth():
    shape = (11, 11, 15)
    pred = np.zeros(shape, bool)
    pred[2:9, 2:9, 1:14] = True
    truth = pred.copy()
    truth[5, 5, 4] = False  # 4 voxels (8 mm) from outside along x, 4 (4 mm) along y, 4 (2 mm) along z
    assert inner_score(pred, truth, SPACING) == 2.0
    sure = shrunk(pred, SPACING, 2.0)
    assert not (sure & ~truth).any() and sure[5, 5, 7]  # the centre is 3.5 mm deep (7 voxels along z)
    assert shrunk(pred, SPACING, 1.9)[5, 5, 4]
    assert inner_score(pred, pred, SPACING) == 0.0  # inside the truth: nothing to shrink
    truth[2, 5, 7] = False  # a face voxel: 2 mm from outside along x
    assert inner_score(pred, truth, SPACING) == 2.0
    truth[5, 5, 7] = False  # the deepest voxel of the prediction: nothing is sure
    assert inner_score(pred, truth, SPACING) == 3.5 and not shrunk(pred, SPACING, 3.5).any()


def test_the_volume_border_counts_as_outside():
    pred = np.ones((5, 1), bool)
    np.testing.assert_allclose(depth(pred, (1.5, 1.0))[:, 0], [1.0, 1.0, 1.0, 1.0, 1.0])  # 1 mm along the short axis
    pred = np.ones((5, 3), bool)
    np.testing.assert_allclose(depth(pred, (1.5, 4.0))[:, 1], [1.5, 3.0, 4.5, 3.0, 1.5])


def test_grown_mask_holds_the_voxels_within_the_margin_in_mm():
    shape = (11, 11, 15)
    pred = point(shape, (5, 5, 7))
    mask = grown(pred, SPACING, 2.0)
    # x: +-1 (2 mm); y: +-1, +-2; z: +-1..+-4; (y, z): |dy| = 1 with |dz| <= 3 (1 + 2.25 <= 4): 12 more
    assert mask.sum() == 1 + 2 + 4 + 8 + 12
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    brute = np.sqrt((((grid - np.array([5, 5, 7])) * np.array(SPACING)) ** 2).sum(-1)) <= 2.0
    np.testing.assert_array_equal(mask, brute)
    assert grown(pred, SPACING, math.inf).all() and not shrunk(pred, SPACING, math.inf).any()


def test_conformal_quantile_order_statistic():
    scores = np.arange(9, 0, -1.0)  # 9 scores 1..9, unsorted
    assert conformal_quantile(scores, 0.1) == 9.0  # k = ceil(10 * 0.9) = 9
    assert conformal_quantile(scores, 0.2) == 8.0  # k = 8
    assert conformal_quantile(scores, 0.05) == math.inf  # k = 10 > n: no finite margin
    assert conformal_quantile(np.arange(1, 20.0), 0.1) == 18.0  # k = ceil(20 * 0.9) = 18, not 19 from rounding
    assert conformal_quantile([], 0.1) == math.inf
