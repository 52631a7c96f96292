"""The label-free figures and the truth of mcseg.statements.features against independent computations: volumes as
voxel counts x the file's spacing in mL (and the same structure at another spacing), the soft self-Dice, the
Poisson-binomial spread and the HD95 against MONAI's."""
from __future__ import annotations

import math

import numpy as np
import torch

from mcseg.statements.features import case_features, case_truth


def _sphere(spacing, radius=6.0, extent=16.0):
    axes = [np.arange(-extent, extent, s) + s / 2 for s in spacing]
    x, y, z = np.meshgrid(*axes, indexing="ij")
    return x ** 2 + y ** 2 + z ** 2 <= radius ** 2


def test_volume_is_a_voxel_count_times_the_spacing_in_ml():
    truth = np.zeros((3, 5, 6, 7), bool)
    truth[1, 1:4, 2:5, 1:3] = True  # 3 x 3 x 2 = 18 voxels
    truth[0] = ~truth[1]
    spacing = (0.5, 2.0, 3.0)
    t = case_truth(truth, truth, spacing, [1])
    assert t["volume_true_ml"][0] == 18 * 0.5 * 2.0 * 3.0 / 1000
    assert t["dice_true"][0] == 1.0 and t["hd95_true_mm"][0] == 0.0


def test_the_same_structure_at_another_spacing_has_the_same_volume():
    volumes = []
    for spacing in ((1.0, 1.0, 1.0), (0.5, 0.75, 1.5)):
        g = _sphere(spacing)
        stack = np.stack([~g, g])
        volumes.append(case_truth(stack, stack, spacing, [1])["volume_true_ml"][0])
    exact = 4 / 3 * math.pi * 6.0 ** 3 / 1000
    assert abs(volumes[0] - exact) / exact < 0.03 and abs(volumes[1] - exact) / exact < 0.03
    assert abs(volumes[0] - volumes[1]) / exact < 0.03


def test_label_free_figures_by_hand():
    rng = np.random.default_rng(0)
    p1 = rng.random((4, 5, 3))
    probs = torch.from_numpy(np.stack([1 - p1, p1])).float()
    pred = np.stack([p1 < 0.5, p1 >= 0.5])
    spacing = (2.0, 1.0, 1.5)
    f = case_features(probs, pred, spacing, [1])
    p = probs[1].double().numpy()
    v = 3.0 / 1000
    assert math.isclose(f["volume_mask_ml"][0], pred[1].sum() * v)
    assert math.isclose(f["volume_expected_ml"][0], p.sum() * v, rel_tol=1e-12)
    assert math.isclose(f["volume_sd_ml"][0], math.sqrt((p * (1 - p)).sum()) * v, rel_tol=1e-12)
    assert math.isclose(f["soft_dice"][0], 2 * p[pred[1]].sum() / (p.sum() + pred[1].sum()), rel_tol=1e-12)


def test_hd95_equals_monais_and_the_band_is_zero_for_a_sure_prediction():
    from monai.metrics import compute_hausdorff_distance

    g, m = _sphere((1.0, 1.0, 2.0), 6.0), _sphere((1.0, 1.0, 2.0), 8.0)
    t = case_truth(np.stack([~g, g]), np.stack([~m, m]), (1.0, 1.0, 2.0), [1])
    onehot = lambda a: torch.from_numpy(np.stack([~a, a])[None].astype(np.float32))  # noqa: E731
    monai = compute_hausdorff_distance(onehot(m), onehot(g), include_background=False, percentile=95,
                                       directed=False, spacing=(1.0, 1.0, 2.0))
    assert math.isclose(t["hd95_true_mm"][0], float(monai), rel_tol=1e-6)
    sure = torch.from_numpy(np.stack([~g, g]).astype(np.float32))
    assert case_features(sure, np.stack([~g, g]), (1.0, 1.0, 2.0), [1])["band_mm"][0] == 0.0
