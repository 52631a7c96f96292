"""The challenge metrics (mcseg/metrics/challenge.py) on hand-derived cases, and against re-derivations of their
authors' formulas written here as plain loops (one fraction, threshold or lesion at a time), in 2D and 3D, with
absent structures and empty predictions.

The re-derivations follow, line for line in meaning (not copied): Shifts-Project/shifts 81b8094
``mswml/metrics.py`` (``dice_norm_metric``, ``ndsc_aac_metric``, ``lesion_f1_score``); RagMeh11/QU-BraTS f174e55
``BraTS_Seg_Uncertainty.py`` (``make``, the AUCs of ``evaluate``); SYCAI-Technologies/curvas-challenge 86cfbeb
``CURVAS-PDACVI_2025/evaluation_metrics/metrics_evaluation.py`` (``merged_dice_score``, its thresholded Dice).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage
from sklearn.metrics import auc

from mcseg.metrics.challenge import (
    SHIFTS_FRACTIONS, curvas_thresholded_dice, lesion_f1, ndsc_aac, ndsc_retention_curve, normalised_dice,
    qubrats_curves, uncertainty_0_100,
)
from tests.metrics.reference import blobs

# ------------------------------------------------------------------ re-derivations of the authors' formulas


def shifts_ndsc(gt, seg, r=0.001):
    """``dice_norm_metric``: 1 if both empty; k = 1 without reference, else (1-r)|G| / (r (N - |G|))."""
    gt, seg = gt.astype(np.float32), seg.astype(np.float32)
    if seg.sum() + gt.sum() == 0:
        return 1.0
    k = 1.0 if gt.sum() == 0 else (1 - r) * gt.sum() / (r * (gt.size - gt.sum()))
    tp, fp, fn = seg[gt == 1].sum(), seg[gt == 0].sum(), gt[seg == 0].sum()
    return 2.0 * tp / (k * fp + 2.0 * tp + fn)


def shifts_aac(gt, seg, unc, fractions=SHIFTS_FRACTIONS):
    """``ndsc_aac_metric``: order by uncertainty, keep the first int(N f) predictions, the rest the reference."""
    order = unc.argsort()
    gts, preds = gt[order], seg[order]
    n = len(gts)
    curve = []
    for f in fractions:
        pos = int(n * f)
        current = preds if pos == n else np.concatenate((preds[:pos], gts[pos:]))
        curve.append(shifts_ndsc(gts, current))
    return 1.0 - auc(fractions, np.asarray(curve)), np.asarray(curve)


def shifts_f1(gt, seg, threshold):
    """``lesion_f1_score``: per predicted lesion TP/FP by its best IoU, per reference lesion FN."""
    mp, _ = ndimage.label(seg)
    mg, _ = ndimage.label(gt)

    def iou(a, b):
        return np.sum(a * b) / np.sum(a + b - a * b)

    tp = fp = fn = 0
    for lp in np.unique(mp):
        if lp == 0:
            continue
        mask = (mp == lp).astype(int)
        best = max([0.0] + [iou(mask, (mg == lg).astype(int)) for lg in np.unique(mg * mask) if lg != 0])
        tp, fp = (tp + 1, fp) if best >= threshold else (tp, fp + 1)
    for lg in np.unique(mg):
        if lg == 0:
            continue
        mask = (mg == lg).astype(int)
        best = max([0.0] + [iou((mp == lp).astype(int), mask) for lp in np.unique(mp * mask) if lp != 0])
        fn += best < threshold
    return 1.0 if tp + 0.5 * (fp + fn) == 0 else tp / (tp + 0.5 * (fp + fn))


def qubrats(gt, pred, unc, brain, n_points=40):
    """``make`` + the AUCs of ``evaluate``: thresholds 100 .. 0; Dice of the retained voxels; FTP, FTN."""
    eps = np.finfo(np.float32).eps
    # the code's arange(0, 100 + EPS, 100 / n) as NumPy 1.x evaluated it in 2020 (a float64 stop: 100 included);
    # under NumPy 2 the stop is float32, equal to 100, and 100 drops out of the thresholds
    thresholds = np.arange(0.0, 100.0 + float(eps), 100.0 / n_points).tolist()[::-1]
    dice, ftp, ftn = [], [], []
    tp_all = (pred * gt * brain).astype(np.float32)
    tn_all = ((1 - pred) * (1 - gt) * brain).astype(np.float32)
    for th in thresholds:
        keep = np.ones_like(unc, dtype=np.float32)
        keep[unc > th] = 0.0
        g, p = gt * keep, pred * keep
        inter, union = np.sum(g * p), np.sum(g) + np.sum(p)
        dice.append(1.0 if inter == 0 and union == 0 else 2.0 * inter / union)
        ftp.append((tp_all.sum() - (tp_all * keep).sum()) / (tp_all.sum() + eps))
        ftn.append((tn_all.sum() - (tn_all * keep).sum()) / (tn_all.sum() + eps))
    aucs = [auc(thresholds, c) / 100.0 for c in (dice, ftp, ftn)]
    return aucs, (aucs[0] + (1 - aucs[1]) + (1 - aucs[2])) / 3


def curvas_tdice(prob, raters):
    """``merged_dice_score``'s thresholded Dice: rater mean, linspace(0.1, 0.8, 6), eps 1e-6, both empty -> 1."""
    mean = np.mean(np.stack(raters), 0).reshape(-1)
    prob = prob.reshape(-1)
    values = []
    for t in np.linspace(0.1, 0.8, 6):
        a, g = prob > t, mean > t
        values.append(1 if not a.any() and not g.any() else 2.0 * np.sum(a * g) / (a.sum() + g.sum() + 1e-6))
    return float(np.mean(values))


# ------------------------------------------------------------------ fixtures: 2D and 3D, absent, empty

SHAPES = [(24, 20), (12, 10, 8)]


def _case(shape, seed):
    """A reference with several lesions, a prediction that overlaps it imperfectly, an uncertainty map."""
    rng = np.random.default_rng(seed)
    gt = (blobs(shape, 2, seed, n_blobs=3).numpy() > 0).astype(np.uint8)
    pred = (blobs(shape, 2, seed + 100, n_blobs=2).numpy() > 0) | (gt.astype(bool) & (rng.random(shape) < 0.8))
    unc = rng.random(shape)  # no ties: the order is the same whatever the sort
    return gt, pred.astype(np.uint8), unc


def _variants(shape, seed):
    gt, pred, unc = _case(shape, seed)
    empty = np.zeros_like(gt)
    return {"case": (gt, pred, unc), "absent structure": (empty, pred, unc),
            "empty prediction": (gt, empty, unc), "both empty": (empty, empty, unc)}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["case", "absent structure", "empty prediction", "both empty"])
def test_ndsc_its_curve_and_lesion_f1_equal_the_shifts_formulas(shape, variant):
    gt, pred, unc = _variants(shape, 0)[variant]
    assert normalised_dice(pred, gt) == pytest.approx(shifts_ndsc(gt, pred), abs=1e-6)
    expected_aac, expected_curve = shifts_aac(gt.reshape(-1), pred.reshape(-1), unc.reshape(-1))
    np.testing.assert_allclose(ndsc_retention_curve(pred, gt, unc), expected_curve, atol=1e-6)
    assert ndsc_aac(pred, gt, unc) == pytest.approx(expected_aac, abs=1e-6)
    for threshold in (0.25, 0.5):
        assert lesion_f1(pred, gt, threshold) == pytest.approx(shifts_f1(gt, pred, threshold))


def test_ndsc_by_hand():
    gt = np.zeros(10, dtype=np.uint8)
    gt[:2] = 1
    pred = np.zeros(10, dtype=np.uint8)
    pred[[1, 5]] = 1  # TP 1, FP 1, FN 1; k = 0.999 * 2 / (0.001 * 8) = 249.75
    assert normalised_dice(pred, gt) == pytest.approx(2 / (249.75 + 2 + 1))
    assert normalised_dice(np.zeros(10), np.zeros(10)) == 1.0  # both empty
    assert normalised_dice(pred, np.zeros(10)) == 0.0  # absent structure, predicted
    assert normalised_dice(np.zeros(10), gt) == 0.0  # missed
    assert normalised_dice(np.ones(4), np.ones(4)) == 1.0  # every voxel reference: the authors' NaN, stated


def test_retention_curve_by_hand():
    gt, pred = np.array([1, 1, 0, 0]), np.array([1, 0, 1, 0])
    unc = np.array([0.1, 0.9, 0.5, 0.2])  # most certain first: voxels 0, 3, 2, 1
    curve = ndsc_retention_curve(pred, gt, unc, fractions=[0.0, 0.5, 0.75, 1.0])
    # k = 0.999 * 2 / (0.001 * 2) = 999; 0 and 0.5 retained: the map equals the reference
    np.testing.assert_allclose(curve, [1.0, 1.0, 4 / (999 + 4), 2 / (999 + 2 + 1)])
    assert ndsc_aac(pred, gt, unc, fractions=[0.0, 1.0]) == pytest.approx(1 - (1 + 2 / 1002) / 2)
    assert SHIFTS_FRACTIONS[0] == 0.0 and SHIFTS_FRACTIONS[-1] == 1.0 and len(SHIFTS_FRACTIONS) == 200


def test_lesion_f1_by_hand():
    gt, pred = np.zeros((8, 8), dtype=np.uint8), np.zeros((8, 8), dtype=np.uint8)
    gt[0:2, 0:2] = 1  # lesion A, 4 voxels
    gt[5:7, 5:7] = 1  # lesion B, missed
    pred[0:2, 0] = 1  # IoU with A = 2 / 4
    pred[4, 0] = 1  # a false positive lesion
    assert lesion_f1(pred, gt, 0.5) == pytest.approx(1 / (1 + 0.5 * 2))  # TP 1, FP 1, FN 1
    assert lesion_f1(pred, gt, 0.6) == 0.0  # TP 0, FP 2, FN 2
    assert lesion_f1(np.zeros((4, 4)), np.zeros((4, 4))) == 1.0
    assert lesion_f1(np.zeros((4, 4)), gt[:4, :4]) == 0.0
    diagonal = np.eye(3, dtype=np.uint8)  # face connectivity: three lesions, not one
    assert lesion_f1(diagonal, diagonal) == 1.0 and lesion_f1(diagonal, np.ones((3, 3))) == 0.0


def test_qubrats_by_hand():
    # voxels: TP u=10, TP u=80, FP u=60, TN u=0, TN u=90; thresholds 100, 50, 0
    gt, pred = np.array([1, 1, 0, 0, 0]), np.array([1, 1, 1, 0, 0])
    unc = np.array([10.0, 80.0, 60.0, 0.0, 90.0])
    curves = qubrats_curves(pred, gt, unc, n_points=2)
    np.testing.assert_allclose(curves.thresholds, [100, 50, 0])
    np.testing.assert_allclose(curves.dice, [0.8, 1.0, 1.0])  # tau=0: nothing predicted or referenced kept
    np.testing.assert_allclose(curves.ftp, [0.0, 0.5, 1.0], atol=1e-6)
    np.testing.assert_allclose(curves.ftn, [0.0, 0.5, 0.5], atol=1e-6)
    assert curves.dice_auc == pytest.approx(0.95)
    assert curves.ftp_auc == pytest.approx(0.5, abs=1e-6) and curves.ftn_auc == pytest.approx(0.375, abs=1e-6)
    assert curves.score == pytest.approx((0.95 + 0.5 + 0.625) / 3, abs=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["case", "absent structure", "empty prediction", "both empty"])
def test_qubrats_equals_its_authors_formula(shape, variant):
    gt, pred, unc = _variants(shape, 1)[variant]
    unc = np.round(100 * unc, 1)  # ties on and around the thresholds
    brain = np.ones_like(gt)
    brain[..., :2] = 0
    for n_points in (40, 7):
        curves = qubrats_curves(pred, gt, unc, brain, n_points)
        aucs, score = qubrats(gt.astype(np.float64), pred.astype(np.float64), unc, brain, n_points)
        assert [curves.dice_auc, curves.ftp_auc, curves.ftn_auc] == pytest.approx(aucs, abs=1e-6)
        assert curves.score == pytest.approx(score, abs=1e-6)


def test_uncertainty_map_is_entropy_in_percent():
    u = uncertainty_0_100(torch.tensor([0.0, 0.5, 1.0, 0.11]))
    assert u[:3].tolist() == [0.0, 100.0, 0.0]
    assert float(u[3]) == pytest.approx(100 * -(0.11 * np.log2(0.11) + 0.89 * np.log2(0.89)))


@pytest.mark.parametrize("shape", SHAPES)
def test_curvas_thresholded_dice_equals_its_authors_formula(shape):
    rng = np.random.default_rng(2)
    gt, pred, unc = _case(shape, 2)
    raters = np.stack([gt if r < 3 else (gt.astype(bool) ^ (rng.random(shape) < 0.1)) for r in range(5)])
    prob = np.clip(0.7 * gt + 0.3 * rng.random(shape), 0, 1)
    empty = np.zeros_like(raters)
    for p, r in ((prob, raters), (np.zeros(shape), raters), (prob, empty), (np.zeros(shape), empty)):
        assert curvas_thresholded_dice(p, r) == pytest.approx(curvas_tdice(p, list(r)), rel=1e-12, abs=0)
    assert curvas_thresholded_dice(np.zeros(shape), empty) == 1.0  # both empty at every threshold


@pytest.mark.parametrize("shape", SHAPES)
def test_curvas_thresholded_dice_is_a_figure_of_an_evaluation_against_raters(shape, tmp_path):
    """One entry of the table of figures (CurvasRatersScorer): per_case.csv and summary.json hold, per
    foreground class c, the authors' value of p_c against the masks [y_r = c]; class 2 is absent from every
    rater and never predicted (1), the second case predicts nothing of class 1 (an empty prediction), and an
    evaluator of cases with one label has no such column."""
    import csv
    import json

    from mcseg.config import EvalProtocol
    from mcseg.evaluation.evaluator import Evaluator

    rng = np.random.default_rng(3)
    evaluator = Evaluator(3, ["background", "a", "b"], EvalProtocol(bootstrap_samples=0, figures=False), raters=True)
    expected = {}
    for index in range(2):
        gt, _, _ = _case(shape, index)
        raters = np.stack([gt if r < 2 else (gt.astype(bool) ^ (rng.random(shape) < 0.1)) for r in range(5)])
        fg = np.clip(0.8 * gt + 0.3 * rng.random(shape), 0, 0.95) * (index == 0)  # case 1: an empty prediction
        probs = np.stack([1 - fg - 0.01, fg, np.full(shape, 0.01)]).astype(np.float32)  # b below every threshold
        expected[f"c{index}"] = [curvas_tdice(probs[c], list(raters == c)) for c in (1, 2)]
        evaluator.add_case(f"c{index}", torch.from_numpy(probs), torch.from_numpy(raters[0]).long(),
                           (1.0,) * len(shape), raters=torch.from_numpy(raters).long())
    assert [row[1] for row in expected.values()] == [1.0, 1.0] and expected["c1"][0] < 1  # absent; predicted empty
    summary = evaluator.write(tmp_path)
    with open(tmp_path / "per_case.csv") as fh:
        rows = list(csv.DictReader(fh))
    # the re-derivation was given the same float32 probabilities as the evaluator
    got = {(r["case"], r["class_name"]): float(r["curvas_thresholded_dice"]) for r in rows}
    for case, values in expected.items():
        assert [got[case, "a"], got[case, "b"]] == pytest.approx(values, rel=1e-12, abs=0)
    mean = np.mean([np.mean(v) for v in expected.values()])
    assert summary["mean_foreground_curvas_thresholded_dice"] == pytest.approx(mean, rel=1e-12)
    assert json.loads((tmp_path / "summary.json").read_text())["per_class"]["a"]["curvas_thresholded_dice"]["n"] == 2
    single = Evaluator(3, ["background", "a", "b"], EvalProtocol(bootstrap_samples=0, figures=False))
    assert "curvas_thresholded_dice" not in single.columns
    with pytest.raises(ValueError, match="raters' maps given to an evaluator built without them"):
        single.add_case("c", torch.from_numpy(probs).float(), torch.from_numpy(raters[0]).long(),
                        (1.0,) * len(shape), raters=torch.from_numpy(raters).long())


def test_curvas_thresholded_dice_by_hand():
    raters = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]])  # mean 1, 0.2, 0
    prob = np.array([0.9, 0.3, 0.0])
    # t = 0.10: {0,1} vs {0,1} -> 1; 0.24: {0,1} vs {0} -> 2/3; 0.38 .. 0.80: {0} vs {0} -> 1
    assert curvas_thresholded_dice(prob, raters) == pytest.approx((1 + 2 / 3 + 4) / 6)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="binary mask"):
        normalised_dice(np.array([0, 2]), np.array([0, 1]))
    with pytest.raises(ValueError, match=r"uncertainty: expected values in \[0, 100\]"):
        qubrats_curves(np.array([0, 1]), np.array([0, 1]), np.array([0.0, 101.0]))
    with pytest.raises(ValueError, match="uncertainty: 3 voxels"):
        ndsc_aac(np.array([0, 1]), np.array([0, 1]), np.zeros(3))
    with pytest.raises(ValueError, match="raters"):
        curvas_thresholded_dice(np.zeros((2, 2)), np.zeros((5, 3, 2)))


def test_lesion_f1_holds_many_lesions_in_little_memory():
    """A checkerboard is one lesion per voxel (face connectivity): 16000 lesions a side, whose dense lesion-by-
    lesion table would take 2 GB; the overlapping pairs alone are 16000."""
    board = (np.indices((32, 32, 32)).sum(0) % 2).astype(np.uint8)
    assert lesion_f1(board, board) == 1.0
    assert lesion_f1(board, 1 - board) == 0.0  # every lesion disjoint from every other


@pytest.mark.skipif(int(np.__version__.split(".")[0]) < 2, reason="the quirk is NumPy 2's")
def test_the_qubrats_code_loses_threshold_100_under_numpy_2():
    """Why the docstring's 41 thresholds: the authors' float32 EPS keeps arange's stop at 100.0 under NumPy 2."""
    eps = np.finfo(np.float32).eps
    assert np.arange(0.0, 100.0 + eps, 2.5).max() == 97.5  # the code as written, today
    assert np.arange(0.0, 100.0 + float(eps), 2.5).max() == 100.0  # as NumPy 1.x read it (float64 stop)
    assert len(qubrats_curves(np.zeros(2), np.zeros(2), np.zeros(2)).thresholds) == 41
