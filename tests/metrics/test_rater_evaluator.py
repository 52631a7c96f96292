"""The evaluator with several raters: every figure in the case row, summary.json and the two CSVs, equal to
the functional metrics; and (slow) a run on a QUBIQ-layout fixture reporting them with members."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from mcseg.config import EvalProtocol
from mcseg.evaluation.evaluator import Evaluator
from mcseg.metrics.rater_calibration import curvas_ece, soft_calibration
from mcseg.metrics.raters import consensus_dice, curvas_row_dice, per_rater_dice, thresholded_dice
from mcseg.metrics.samples import generalised_energy_distance, hungarian_matched_iou
from mcseg.metrics.volume import volume_crps


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 3, (8, 7, 5), generator=g)
    raters = torch.stack([torch.where(torch.rand(base.shape, generator=g) < 0.2, 0, base) for _ in range(3)])
    probs = torch.softmax(torch.nn.functional.one_hot(base, 3).movedim(-1, 0) * 2.0
                          + torch.randn((3, *base.shape), generator=g), 0)
    samples = torch.stack([torch.where(torch.rand(base.shape, generator=g) < 0.1, 1, base) for _ in range(2)])
    return probs, raters, samples


def test_every_rater_figure_reaches_the_summary_and_the_csvs(tmp_path):
    protocol = EvalProtocol(bootstrap_samples=0, figures=False, rater_thresholds="curvas2025")
    evaluator = Evaluator(3, ["background", "a", "b"], protocol, raters=True)
    spacing = (1.0, 2.0, 2.5)
    for i in range(2):
        probs, raters, samples = _case(i)
        row = evaluator.add_case(f"c{i}", probs, raters[0], spacing, raters=raters,
                                 rater_names=["r1", "r2", "r3"], samples=samples if i == 0 else None)
        pred = probs.argmax(0)
        assert row["raters/dice_rater_mean/a"] == pytest.approx(float(per_rater_dice(pred, raters, 3)[:, 1].mean()))
        assert row["raters/consensus_dice/b"] == pytest.approx(float(consensus_dice(pred, raters, 3)[2]))
        assert row["raters/curvas2024_row_dice/a"] == pytest.approx(float(curvas_row_dice(pred, raters, 3)[1]))
        assert row["raters/thresholded_dice/a"] == pytest.approx(
            float(thresholded_dice(probs, raters, 3, "curvas2025")[1]))
        voxel_ml = 1.0 * 2.0 * 2.5 / 1000
        assert row["raters/volume_crps/b"] == pytest.approx(volume_crps(probs, raters, voxel_ml)["volume_crps"][2])
        assert row["raters/ece_mean"] == pytest.approx(soft_calibration(probs, raters).values()["ece_mean"])
        assert row["raters/ece_curvas_rater_mean"] == pytest.approx(curvas_ece(probs, raters)["ece_rater_mean"])
        if i == 0:
            assert row["raters/n_samples"] == 2
            assert row["raters/ged"] == pytest.approx(generalised_energy_distance(samples, raters, 3)["ged"])
            assert row["raters/hm_iou"] == pytest.approx(hungarian_matched_iou(samples, raters, 3))
        else:
            assert math.isnan(row["raters/ged"]) and row["raters/n_samples"] == 0
    summary = evaluator.write(tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    raters = on_disk["raters"]
    assert raters["n_cases"] == 2 and raters["raters_per_case"] == {"min": 3, "max": 3}
    assert raters["n_samples"] == [0, 2] and raters["case"]["ged"]["n"] == 1
    assert set(raters["per_rater"]) == {"r1", "r2", "r3"}
    assert "thresholded_dice" in raters["protocol"] and "0.24" in raters["protocol"]["thresholded_dice"]
    assert raters["per_class"]["a"]["consensus_dice"]["n"] == 2
    assert set(raters["foreground"]) == {"dice_rater_mean", "hd95_rater_mean_mm", "consensus_dice",
                                         "curvas2024_row_dice", "staple_dice", "thresholded_dice", "volume_crps"}
    assert raters["foreground"]["dice_rater_mean"]["n"] == 2
    from mcseg.evaluation.split import format_summary

    text = format_summary(on_disk, ["background", "a", "b"], "t")
    assert "against 3-3 raters: Dice per rater 0." in text and "samples [0, 2]: GED" in text
    assert summary["raters"]["pooled"]["n_voxels"] == 2 * 8 * 7 * 5
    with open(tmp_path / "per_case_raters.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {r["class_name"] for r in rows} == {"a", "b"}
    with open(tmp_path / "per_rater.csv") as f:
        assert len(list(csv.DictReader(f))) == 2 * 3 * 2


def _read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_reliability_against_the_rater_mean_and_each_rater_by_hand(tmp_path):
    """reliability_raters.csv equals numpy's binning of the voxels of both cases (rater r3 only labelled the
    first), and each rater's panel equals the single-label reliability.csv with that rater's map as the label."""
    n_bins = 5
    evaluator = Evaluator(3, ["background", "a", "b"], EvalProtocol(bootstrap_samples=0, figures=False,
                                                                    n_bins=n_bins, region="all"), raters=True)
    cases = [(probs, raters if i == 0 else raters[:2]) for i, (probs, raters, _) in enumerate(map(_case, (0, 1)))]
    for i, (probs, raters) in enumerate(cases):  # the label is rater r1's map
        evaluator.add_case(f"c{i}", probs, raters[0], (1.0, 1.0, 1.0), raters=raters,
                           rater_names=["r1", "r2", "r3"][:len(raters)])
    summary = evaluator.write(tmp_path)
    rows = _read_csv(tmp_path / "reliability_raters.csv")
    assert [r["panel"] for r in rows[::n_bins]] == ["rater mean", "rater r1", "rater r2", "rater r3"]
    assert [r["rater"] for r in rows[::n_bins]] == ["", "r1", "r2", "r3"]

    def by_hand(which):  # per bin (lo, hi]: count, mean confidence, mean observed frequency
        conf, observed = [], []
        for probs, raters in cases:
            p, y = probs.reshape(3, -1).double().numpy(), raters.reshape(len(raters), -1).numpy()
            hit = y == p.argmax(0)  # K x N: rater k gave the predicted class
            if which == "mean" or which < len(raters):
                conf.append(p.max(0))
                observed.append(hit.mean(0) if which == "mean" else hit[which])
        conf, observed = np.concatenate(conf), np.concatenate(observed)
        bins = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
        count = np.bincount(bins, minlength=n_bins)
        with np.errstate(invalid="ignore"):
            return (count, np.bincount(bins, conf, n_bins) / count, np.bincount(bins, observed, n_bins) / count)

    for k, which in enumerate(["mean", 0, 1, 2]):
        panel = rows[k * n_bins:(k + 1) * n_bins]
        count, conf, observed = by_hand(which)
        np.testing.assert_array_equal([int(r["count"]) for r in panel], count)
        np.testing.assert_allclose([float(r["mean_confidence"]) for r in panel], conf, rtol=1e-6)
        np.testing.assert_allclose([float(r["accuracy"]) for r in panel], observed, rtol=1e-6)  # m in fp32
    assert sum(int(r["count"]) for r in rows[3 * n_bins:]) == 8 * 7 * 5  # r3: the first case's voxels only
    top = [r for r in _read_csv(tmp_path / "reliability.csv") if r["panel"] == "top-label"]
    for key in ("count", "mean_confidence", "accuracy"):
        assert [r[key] for r in rows[n_bins:2 * n_bins]] == [r[key] for r in top], key
    mean = rows[:n_bins]
    ece = sum(int(r["count"]) * abs(float(r["gap"])) for r in mean if int(r["count"])) / (2 * 8 * 7 * 5)
    assert ece == pytest.approx(summary["raters"]["pooled"]["ece_mean"])
    assert "reliability_raters.csv" in summary["raters"]["protocol"]["reliability"]


def test_curvas2024_crop_takes_the_ct(tmp_path):
    from mcseg.metrics.rater_calibration import curvas2024_crop

    probs, raters, _ = _case(3)
    ct = torch.full(raters.shape[1:], -1000.0)
    ct[1:6, 2:6, :] = 50.0
    evaluator = Evaluator(3, ["background", "a", "b"], EvalProtocol(bootstrap_samples=0, rater_crop="curvas2024"),
                          raters=True)
    with pytest.raises(ValueError, match="rater_crop=curvas2024 needs the case's CT"):
        evaluator.add_case("c", probs, raters[0], (1.0, 1.0, 1.0), raters=raters)
    row = evaluator.add_case("c", probs, raters[0], (1.0, 1.0, 1.0), raters=raters, image=ct)
    box = curvas2024_crop(ct)
    assert box == (slice(1, 6), slice(2, 6), slice(None))
    cropped = (slice(None), *box)
    assert row["raters/ece_curvas_rater_mean"] == pytest.approx(curvas_ece(probs, raters, crop=box)["ece_rater_mean"])
    assert row["raters/volume_crps/a"] == pytest.approx(
        volume_crps(probs[cropped], raters[cropped], 1e-3)["volume_crps"][1])
    assert row["raters/volume_crps/a"] != pytest.approx(volume_crps(probs, raters, 1e-3)["volume_crps"][1])


def test_curvas2025_crop_is_the_raters_box_widened_by_20_voxels():
    """A binary case whose raters mark a 3-voxel box in a 60-voxel axis: CURVAS 2025 scores (min - 20):(max + 20)
    of it: along that axis 19:61, voxels 19 to 59; across it -19:21, every voxel (a start of -19 counts from the
    end of 3 and stops at 0)."""
    g = torch.Generator().manual_seed(4)
    raters = torch.zeros(3, 60, 3, 3, dtype=torch.long)
    raters[:, 39:42, 1, 1] = 1
    raters[1, 40, 1, 1] = 0
    probs = torch.softmax(torch.randn(2, 60, 3, 3, generator=g) * 2, 0)
    evaluator = Evaluator(2, ["background", "a"], EvalProtocol(bootstrap_samples=0, rater_crop="curvas2025"), raters=True)
    row = evaluator.add_case("c", probs, raters[0], (1.0, 1.0, 1.0), raters=raters)
    box = (slice(19, 61), slice(-19, 21), slice(-19, 21))
    assert probs[(slice(None), *box)].shape == (2, 41, 3, 3)
    expected = curvas_ece(probs, raters, edition=2025, crop=box)["ece_rater_mean"]
    assert row["raters/ece_curvas_rater_mean"] == pytest.approx(expected, rel=1e-12)
    for other in (10, 30):  # another margin would score other voxels
        widened = (slice(39 - other, 41 + other), *[slice(1 - other, 1 + other)] * 2)
        assert expected != pytest.approx(curvas_ece(probs, raters, edition=2025, crop=widened)["ece_rater_mean"])


def test_bad_thresholds_and_multilabel_are_refused():
    probs, raters, _ = _case(0)
    evaluator = Evaluator(3, ["background", "a", "b"], EvalProtocol(bootstrap_samples=0, rater_thresholds=[0.0]),
                          raters=True)
    with pytest.raises(ValueError, match=r"evaluation.rater_thresholds=\[0.0\]"):
        evaluator.add_case("c", probs, raters[0], (1.0, 1.0, 1.0), raters=raters)
    assert evaluator.n_cases == 0
    # a multi-label (region) task: sigmoids per region, not one softmax the raters' classes can be read from
    regions = torch.stack([raters[0] > 0, raters[0] == 2]).long()
    multilabel = Evaluator(2, ["whole", "b"], EvalProtocol(bootstrap_samples=0), multilabel=True)
    with pytest.raises(ValueError, match="^case m: figures against several raters need softmax probabilities$"):
        multilabel.add_case("m", probs[1:], regions, (1.0, 1.0, 1.0), raters=raters)
    assert multilabel.n_cases == 0
    multilabel.add_case("m", probs[1:], regions, (1.0, 1.0, 1.0))  # the same case without raters is scored
    assert multilabel.n_cases == 1


@pytest.mark.slow
def test_a_run_trained_on_the_rater_mean_reports_the_figures_with_members(make_cfg, tmp_path, one_thread):
    from mcseg.train import train
    from tests import fake_datasets as fd
    from tests.data.data_helpers import TINY_RUN

    root = fd.write_qubiq(tmp_path / "qubiq", n_train=6, n_val=2)
    cfg = make_cfg([f"dataset=qubiq", f"dataset.root={root}", "dataset.preprocess.workers=1",
                    "dataset.sampling.patch_size=[32,32]", "inference.tta=[flips]", "dataset.raters.target=mean",
                    "loss=ce", "evaluation.rater_crop=curvas2024", *TINY_RUN])  # trained on the soft rater mean
    train(cfg)
    summary = json.loads((tmp_path / "run/eval/test/summary.json").read_text())
    raters = summary["raters"]
    assert raters["n_cases"] == 2 and raters["n_samples"] == [4]  # four flip views of a 2D network
    assert raters["case"]["ged"]["n"] == 2 and raters["case"]["hm_iou"]["n"] == 2
    assert raters["per_class"]["task01"]["thresholded_dice"]["n"] == 2
    assert set(raters["per_rater"]) == {f"task01_seg{r:02d}" for r in range(1, 7)}
    assert raters["protocol"]["crop"].startswith("CURVAS 2024") and raters["case"]["ece_curvas_rater_mean"]["n"] == 2
    scaled = sorted((tmp_path / "run/eval/test").glob("*/summary.json"))  # post-hoc calibrated evaluations
    assert scaled and all(json.loads(p.read_text())["raters"]["n_cases"] == 2 for p in scaled)
