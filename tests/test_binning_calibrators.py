"""Classwise histogram binning and isotonic regression (mcseg/calibration/binning.py) against hand-derived cases."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mcseg.calibration.binning import HistogramBinning, IsotonicCalibration

# two classes, four fit voxels: p_1 = 0.2, 0.4, 0.7, 0.9 with labels 0, 1, 1, 1
P1 = np.array([0.2, 0.4, 0.7, 0.9])
FIT = np.stack([1 - P1, P1], axis=1)
LABELS = np.array([0, 1, 1, 1])


def test_histogram_binning_by_hand():
    hb = HistogramBinning(n_bins=2).fit(FIT, LABELS)
    # class 1: bin (0, 0.5] holds 0.2, 0.4 (one of two is class 1) -> 0.5; bin (0.5, 1] holds 0.7, 0.9 -> 1
    # class 0: bin (0, 0.5] holds p_0 = 0.3, 0.1 (none is class 0) -> 0; bin (0.5, 1] holds 0.8, 0.6 -> 0.5
    assert hb.values[1].tolist() == [0.5, 1.0] and hb.values[0].tolist() == [0.0, 0.5]
    out = hb.transform(np.array([[0.8, 0.2], [0.3, 0.7], [0.5, 0.5]]))
    # [0.8, 0.2] -> (0.5, 0.5); [0.3, 0.7] -> (0, 1); an edge value 0.5 is in the lower bin: (0, 0.5) -> (0, 1)
    np.testing.assert_allclose(out, [[0.5, 0.5], [0.0, 1.0], [0.0, 1.0]])
    assert hb.argmax_changes(np.array([[0.8, 0.2], [0.3, 0.7], [0.5, 0.5]])) == 1  # the tie (first maximum 0) -> 1


def test_an_empty_bin_keeps_its_centre_an_absent_class_maps_to_zero_and_an_all_zero_voxel_is_uniform():
    probs = np.array([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.1, 0.85, 0.05]])
    hb = HistogramBinning(n_bins=4).fit(probs, np.array([0, 0, 1]))  # class 2 never in the labels
    assert hb.values[0].tolist() == [0.0, 0.375, 0.625, 1.0]  # bins of class 0: 0.1 (not class 0) -> 0, 0.8 and
    # 0.9 (both class 0) -> 1; the two empty middle bins keep their centres
    out = hb.transform(np.array([[0.3, 0.3, 0.4], [0.05, 0.05, 0.9]]))
    # row 1: h_0(0.3) and h_1(0.3) are the empty second bin's centre 0.375, h_2 = 0 (absent) -> (0.5, 0.5, 0);
    # row 2: h_0(0.05) = h_1(0.05) = 0 (first bins: no hit) and h_2 = 0 -> every map 0 -> uniform
    np.testing.assert_allclose(out, [[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    iso = IsotonicCalibration().fit(np.array([[0.9, 0.1], [0.8, 0.2]]), np.array([1, 1]))  # class 0 never right
    # p_0 always maps to 0 (fitted on no class-0 voxel) and class 1 is fitted on hits only: row of zeros -> uniform
    np.testing.assert_allclose(iso.transform(np.array([[0.85, 0.15]])), [[0.0, 1.0]])
    # a network that is always wrong: the maps learn it and flip the decision (no arg-max guarantee)
    wrong = np.array([[0.9, 0.1], [0.2, 0.8]])
    hb = HistogramBinning(n_bins=2).fit(wrong, np.array([1, 0]))
    np.testing.assert_allclose(hb.transform(wrong), [[0.0, 1.0], [1.0, 0.0]])
    assert hb.argmax_changes(wrong) == 2


def test_isotonic_regression_by_hand_pool_adjacent_violators():
    # labels 1, 0, 1, 1: class 1 pairs (0.2, 1) (0.4, 0) (0.7, 1) (0.9, 1): 1 then 0 violate, pooled to 0.5, 0.5;
    # class 0 pairs (p_0 = 1 - p_1) (0.1, 0) (0.3, 0) (0.6, 1) (0.8, 0): pooled to 0.5, 0.5 at 0.6 and 0.8.
    # Between fit points the map is linear, outside it is clipped to the end values.
    iso = IsotonicCalibration().fit(FIT, np.array([1, 0, 1, 1]))
    np.testing.assert_allclose(iso.map(1, np.array([0.2, 0.3, 0.4, 0.7, 0.95])), [0.5, 0.5, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(iso.map(0, np.array([0.1, 0.3, 0.6, 0.8, 0.05])), [0.0, 0.0, 0.5, 0.5, 0.0])
    # a voxel (0.7, 0.3): h_0(0.7) = 0.5 (between the pooled 0.5s), h_1(0.3) = 0.5 -> (0.5, 0.5)
    np.testing.assert_allclose(iso.transform(np.array([[0.7, 0.3]])), [[0.5, 0.5]])
    # (0.35, 0.65): h_0(0.35) = 0 + (0.35 - 0.3) / 0.3 * 0.5, h_1(0.65) = 0.5 + (0.65 - 0.4) / 0.3 * 0.5
    h0, h1 = 0.05 / 0.3 * 0.5, 0.5 + 0.25 / 0.3 * 0.5
    np.testing.assert_allclose(iso.transform(np.array([[0.35, 0.65]])), [[h0 / (h0 + h1), h1 / (h0 + h1)]])


def test_calibrated_rows_are_distributions_and_argmax_changes_are_counted():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2000, 3)) * 3
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = np.array([rng.choice(3, p=p ** 0.5 / (p ** 0.5).sum()) for p in probs])  # over-confident probabilities
    for calibrator in (HistogramBinning(15), IsotonicCalibration()):
        out = calibrator.fit(probs, labels).transform(probs)
        np.testing.assert_allclose(out.sum(axis=1), 1.0)
        assert (out >= 0).all() and (out <= 1).all()
        assert calibrator.argmax_changes(probs) == int((out.argmax(1) != probs.argmax(1)).sum())
        # fitted on over-confident voxels: the top-label confidence falls on average
        assert out.max(1).mean() < probs.max(1).mean()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="n_bins"):
        HistogramBinning(0)
    with pytest.raises(ValueError, match="C >= 2"):
        HistogramBinning().fit(np.ones((3, 1)), np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        HistogramBinning().fit(FIT, np.array([0, 1, 2, 1]))
    with pytest.raises(ValueError, match="finite and in"):
        IsotonicCalibration().fit(FIT * 2, LABELS)
    with pytest.raises(ValueError, match="fitted on 2"):
        HistogramBinning().fit(FIT, LABELS).transform(np.full((1, 3), 1 / 3))
    with pytest.raises(ValueError, match="not fitted"):
        IsotonicCalibration().transform(FIT)


# top-label: three classes; voxels predicted 0 have confidences 0.9 (right), 0.6 (wrong), 0.7 (right); the one
# predicted 1 has 0.45 (wrong); class 2 is never predicted
TOP_FIT = np.array([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [0.2, 0.45, 0.35]])
TOP_LABELS = np.array([0, 1, 0, 2])


def test_top_label_histogram_binning_by_hand():
    hb = HistogramBinning(n_bins=2, mode="top_label").fit(TOP_FIT, TOP_LABELS)
    # class 0: bin (0.5, 1] holds 0.9, 0.6, 0.7 (two right) -> 2/3, bin [0, 0.5] empty -> centre 0.25;
    # class 1: bin [0, 0.5] holds 0.45 (wrong) -> 0, bin (0.5, 1] empty -> centre 0.75; class 2: no map (identity)
    assert hb.values[0].tolist() == [0.25, 2 / 3] and hb.values[1].tolist() == [0.0, 0.75] and hb.values[2] is None
    probs = np.array([[0.8, 0.15, 0.05], [0.3, 0.4, 0.3], [0.1, 0.2, 0.7], [0.0, 1.0, 0.0]])
    expected = [[2 / 3, 1 / 3 * 0.75, 1 / 3 * 0.25],  # q_0 = 2/3, the other two share 1/3 as 0.15 : 0.05
                [0.5, 0.0, 0.5],                      # q_1 = 0: the arg-max moves to class 0 (first maximum)
                [0.1, 0.2, 0.7],                      # predicted 2: never predicted in the fit, kept
                [0.125, 0.75, 0.125]]                 # the others hold nothing: they share 1 - 0.75 equally
    np.testing.assert_allclose(hb.transform(probs), expected)
    assert hb.argmax_changes(probs) == 1


def test_top_label_isotonic_regression_by_hand():
    iso = IsotonicCalibration(mode="top_label").fit(TOP_FIT, TOP_LABELS)
    # class 0: (0.6, 0) (0.7, 1) (0.9, 1) is already increasing: linear between, clipped outside
    np.testing.assert_allclose(iso.map(0, np.array([0.5, 0.6, 0.65, 0.8, 0.95])), [0.0, 0.0, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(iso.map(1, np.array([0.4, 0.9])), [0.0, 0.0])  # one wrong voxel: 0 everywhere
    np.testing.assert_allclose(iso.transform(np.array([[0.65, 0.25, 0.1], [0.1, 0.15, 0.75]])),
                               [[0.5, 0.5 * 0.25 / 0.35, 0.5 * 0.1 / 0.35], [0.1, 0.15, 0.75]])


@pytest.mark.parametrize("mode", ["classwise", "top_label"])
@pytest.mark.parametrize("kind", [HistogramBinning, IsotonicCalibration])
def test_state_survives_json_and_gives_the_same_map(kind, mode):
    rng = np.random.default_rng(1)
    probs = rng.dirichlet([0.3, 0.3, 0.3, 0.3], size=500)
    labels = rng.integers(0, 3, size=500)  # class 3 is never a label
    fitted = kind(mode=mode).fit(probs, labels)
    read = kind.from_state(json.loads(json.dumps(fitted.state())))
    fresh = rng.dirichlet([0.3, 0.3, 0.3, 0.3], size=300)
    np.testing.assert_array_equal(read.transform(fresh), fitted.transform(fresh))
    with pytest.raises(ValueError, match="record"):
        kind.from_state({**fitted.state(), "maps": fitted.state()["maps"][:2]})
    other = IsotonicCalibration if kind is HistogramBinning else HistogramBinning
    with pytest.raises(ValueError, match="not"):
        other.from_state(fitted.state())


def test_isotonic_maps_are_scikit_learns_predictions():
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(2)
    probs = rng.dirichlet([0.5, 0.5, 0.5], size=400)
    labels = np.array([rng.choice(3, p=p) for p in probs])
    iso = IsotonicCalibration().fit(probs, labels)
    fresh = np.concatenate([rng.uniform(size=200), [0.0, 1.0]])
    for c in range(3):
        theirs = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(probs[:, c], labels == c)
        np.testing.assert_allclose(iso.map(c, fresh), theirs.predict(fresh), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="mode='top'"):
        IsotonicCalibration(mode="top")
