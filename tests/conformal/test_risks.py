"""Per-case losses from one pass of counts, against a direct count per threshold."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mcseg.conformal import case_counts, default_thresholds, loss_table
from mcseg.conformal.risks import CaseCounts, class_masks
from tests.conformal.synthetic import synthetic_case


def test_counts_equal_a_direct_count_at_every_threshold_including_ties():
    rng = np.random.default_rng(0)
    probs, label = synthetic_case(rng, shape=(6, 7, 5))
    probs[:, 0, 0, 0] = torch.tensor([0.5, 0.25, 0.25])  # values equal to grid thresholds: p >= t includes them
    thresholds = default_thresholds(21)
    truth = class_masks(label, 3, False)
    counts = case_counts(probs, truth, thresholds)
    for k in range(3):
        p, g = probs[k].double(), truth[k]
        for j, t in enumerate(thresholds):
            assert int(counts.selected[k, j]) == int((p >= t).sum())
            assert int(counts.hits[k, j]) == int(((p >= t) & g).sum())
        assert int(counts.positives[k]) == int(g.sum())


def test_fnr_fdr_tables_and_the_absent_class_policies():
    thresholds = torch.tensor([0.0, 0.3, 0.6, 0.9], dtype=torch.float64)
    # case a: class 1 on 4 voxels with p = 0.2, 0.5, 0.7, 0.95, and 2 background voxels with p_1 = 0.65, 0.1
    p1 = torch.tensor([0.2, 0.5, 0.7, 0.95, 0.65, 0.1])
    label_a = torch.tensor([1, 1, 1, 1, 0, 0])
    probs_a = torch.stack([1 - p1, p1])
    # case b: no class 1 at all; p_1 = 0.4 on one voxel
    probs_b = torch.stack([torch.tensor([0.6, 0.9]), torch.tensor([0.4, 0.1])])
    label_b = torch.tensor([0, 0])
    counts = CaseCounts.stack([case_counts(p, class_masks(y, 2, False), thresholds)
                             for p, y in ((probs_a, label_a), (probs_b, label_b))])
    fnr, without = loss_table(counts, 1, "fnr", "skip")
    assert without == [1]
    np.testing.assert_allclose(fnr, [[0.0, 0.25, 0.5, 0.75]])
    zero, _ = loss_table(counts, 1, "fnr", "zero")
    np.testing.assert_allclose(zero, [[0.0, 0.25, 0.5, 0.75], [0, 0, 0, 0]])
    fdr, _ = loss_table(counts, 1, "fdr")
    # case a: sets of 6, 4 (0.5, 0.7, 0.95, 0.65), 3 (0.7, 0.95, 0.65), 1 (0.95) voxels; one background voxel in
    # each but the last
    # case b: every selected voxel is a false discovery; an empty set discovers nothing: 0
    np.testing.assert_allclose(fdr, [[2 / 6, 1 / 4, 1 / 3, 0.0], [1.0, 1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="absent-class policy 'drop'"):
        loss_table(counts, 1, "fnr", "drop")


def test_regions_and_a_bad_grid():
    rng = np.random.default_rng(1)
    probs = torch.from_numpy(rng.random((2, 5, 5))).float()
    regions = torch.from_numpy(rng.random((2, 5, 5)) > 0.5).to(torch.uint8)
    counts = case_counts(probs, class_masks(regions, 2, True), default_thresholds(11))
    assert counts.positives.tolist() == regions.reshape(2, -1).sum(1).tolist()
    with pytest.raises(ValueError, match="strictly increasing"):
        case_counts(probs, regions.bool(), torch.tensor([0.5, 0.2]))


def test_counts_do_not_depend_on_the_chunk_of_voxels_binned_at_a_time(monkeypatch):
    from mcseg.conformal import risks

    rng = np.random.default_rng(2)
    probs, label = synthetic_case(rng, shape=(7, 9, 5))
    truth, grid = class_masks(label, 3, False), default_thresholds(11)
    whole = case_counts(probs, truth, grid)
    monkeypatch.setattr(risks, "CHUNK", 17)  # 315 voxels in 19 chunks, the last one short
    chunked = case_counts(probs, truth, grid)
    for field in ("positives", "selected", "hits"):
        np.testing.assert_array_equal(getattr(whole, field), getattr(chunked, field))
