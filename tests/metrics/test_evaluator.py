"""The Evaluator: the contract the trainer relies on, the files it writes, the policies it counts."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from mcseg.evaluation.evaluator import Evaluator, entropy_map, reliability_figure
from mcseg.config import EvalProtocol
from mcseg.errors import ConfigError
from mcseg.metrics.calibration import case_calibration

from .reference import blobs

NAMES = ["background", "liver", "kidney", "spleen"]


def _case(seed: int, shape=(20, 18, 12), k: int = 4, sharpness: float = 4.0):
    """A label map of blobs and probabilities that mostly agree with it."""
    label = blobs(shape, k, seed=seed)
    g = torch.Generator().manual_seed(seed)
    logits = torch.nn.functional.one_hot(label, k).movedim(-1, 0).float() * sharpness
    probs = torch.softmax(logits + torch.randn(k, *shape, generator=g) * 1.5, 0)
    return probs, label


def _evaluator(**protocol) -> Evaluator:
    return Evaluator(4, NAMES, EvalProtocol(bootstrap_samples=200, **protocol))


def test_summary_and_rows_follow_the_contract(tmp_path):
    ev = _evaluator()
    cases = [_case(s) for s in range(3)]
    flats = [ev.add_case(f"case_{s}", p, y, (1.0, 1.2, 2.0)) for s, (p, y) in enumerate(cases)]
    assert {"ece", "mce", "classwise_ece", "adaptive_ece", "nll", "brier", "mean_foreground_dice",
            "dice/liver", "hd95_mm/spleen", "assd_mm/kidney", "status/liver", "class_ece/liver"} <= set(flats[0])
    summary = ev.write(tmp_path)
    for key in ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece"):
        assert isinstance(summary[key], float) and math.isfinite(summary[key]), key
    assert summary["n_cases"] == 3 and summary["classes"] == NAMES[1:]
    assert set(summary["per_class"]) == set(NAMES[1:])
    assert set(summary["per_class"]["liver"]["dice"]) == {"mean", "std", "median", "ci95", "n", "n_undefined"}
    for key in ("region", "n_bins", "boundary_width_mm", "hd_percentile", "hd_definition", "empty_policy"):
        assert key in summary["protocol"], key
    assert {"ece", "mce", "classwise_ece", "adaptive_ece", "adaptive_ece_max_error", "nll", "brier",
            "n_voxels", "class_ece"} <= set(summary["pooled"])
    # means over cases of the per-case values (foreground: per-case mean over classes first)
    assert summary["mean_foreground_dice"] == pytest.approx(np.mean([f["mean_foreground_dice"] for f in flats]))
    assert summary["mean_ece"] == pytest.approx(np.mean([f["ece"] for f in flats]))
    # files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["per_case.csv", "reliability.csv", "reliability.png",
                                                          "reliability_histogram.csv", "reliability_histogram.png",
                                                          "summary.json"]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    with open(tmp_path / "per_case.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == ev.columns
    assert len(rows) == 3 * 3 and {r["region"] for r in rows} == {"union_foreground"}
    assert float(rows[0]["dice"]) == pytest.approx(flats[0]["dice/liver"])
    with open(tmp_path / "reliability.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == (1 + 4) * 15 and table[0]["panel"] == "top-label"


def test_pooled_values_come_from_all_voxels_of_all_cases():
    ev = _evaluator(region="label_foreground")
    cases = [_case(s) for s in range(3)]
    for s, (p, y) in enumerate(cases):
        ev.add_case(str(s), p, y, (1.0, 1.0, 1.0))
    all_p = torch.cat([p[:, y > 0] for p, y in cases], 1)
    all_y = torch.cat([y[y > 0] for _, y in cases])
    direct = case_calibration(all_p, all_y).values
    pooled = ev.summary()["pooled"]
    for key in ("ece", "mce", "classwise_ece", "nll", "brier", "n_voxels"):
        assert pooled[key] == pytest.approx(direct[key], abs=1e-12), key


def test_empty_structures_are_counted_and_excluded():
    ev = _evaluator()
    probs, label = _case(0)
    label = label.clone()
    label[label == 3] = 0  # spleen absent from the label...
    probs = probs.clone()
    probs[3] = 0
    probs = probs / probs.sum(0)  # ...and from the prediction: both empty
    flat = ev.add_case("a", probs, label, (1.0, 1.0, 1.0))
    assert flat["status/spleen"] == "both_empty" and math.isnan(flat["dice/spleen"])
    miss = torch.zeros(4, *label.shape)
    miss[0] = 1.0  # predicts background everywhere: every present class missed
    ev.add_case("b", miss, label, (1.0, 1.0, 1.0))
    s = ev.summary()
    assert s["per_class"]["spleen"]["counts"] == {"ok": 0, "both_empty": 2, "missed": 0, "false_alarm": 0}
    assert s["per_class"]["liver"]["counts"]["missed"] == 1
    assert s["per_class"]["spleen"]["dice"]["mean"] is None and s["per_class"]["spleen"]["dice"]["n_undefined"] == 2
    diagonal = math.sqrt(20**2 + 18**2 + 12**2)
    assert s["per_class"]["liver"]["hd95_mm"]["median"] >= 0 and ev._cases[1]["hd95_mm"][1] == pytest.approx(diagonal)
    assert s["counts"]["missed"] == 2 and s["counts"]["both_empty"] == 2


def test_region_choice_is_applied_and_written():
    probs, label = _case(1)
    n_label = int((label > 0).sum())
    pred = probs.argmax(0)
    n_union = int(((label > 0) | (pred > 0)).sum())
    for region, expected in (("label_foreground", n_label), ("union_foreground", n_union), ("all", label.numel())):
        flat = _evaluator(region=region).add_case("x", probs, label, (1.0, 1.0, 1.0))
        assert flat["n_region_voxels"] == expected and flat["region"] == region
    band = _evaluator(region="boundary", boundary_width_mm=1.0).add_case("x", probs, label, (1.0, 1.0, 1.0))
    assert 0 < band["n_region_voxels"] < label.numel()


def test_multilabel_regions_use_binary_calibration():
    from torchmetrics.functional.classification import binary_calibration_error

    g = torch.Generator().manual_seed(3)
    label = torch.stack([blobs((16, 16, 10), 2, seed=4), blobs((16, 16, 10), 2, seed=5)]).bool()
    probs = torch.sigmoid((label.double() * 2 - 1) * 2 + torch.randn(2, 16, 16, 10, generator=g, dtype=torch.float64))
    ev = Evaluator(2, ["WT", "TC"], EvalProtocol(region="all", bootstrap_samples=0), multilabel=True)
    flat = ev.add_case("m", probs, label, (1.0, 1.0, 1.0))
    binary = [binary_calibration_error(probs[r].reshape(-1), label[r].reshape(-1).long(), n_bins=15).item()
              for r in range(2)]
    assert flat["class_ece/WT"] == pytest.approx(binary[0], abs=1e-6)
    assert flat["classwise_ece"] == pytest.approx(np.mean(binary), abs=1e-6)
    brier = [((probs[r] - label[r].double()) ** 2).mean().item() for r in range(2)]
    assert flat["brier"] == pytest.approx(np.mean(brier), abs=1e-9)
    top = [case_calibration(torch.stack([1 - probs[r], probs[r]]), label[r].long()).values["ece"] for r in range(2)]
    assert flat["ece"] == pytest.approx(np.mean(top), abs=1e-12)
    pred = probs[0] > 0.5
    assert flat["dice/WT"] == pytest.approx(2 * (pred & label[0]).sum().item() / (pred.sum() + label[0].sum()).item())
    s = ev.summary()
    assert s["multilabel"] and set(s["per_class"]) == {"WT", "TC"}


def test_label_maps_without_probabilities():
    probs, label = _case(2)
    ev = _evaluator()
    flat = ev.add_case("p", None, label, (1.0, 1.0, 1.0), prediction=probs.argmax(0))
    assert math.isnan(flat["ece"]) and flat["dice/liver"] > 0.5
    assert ev.summary()["mean_ece"] is None


def test_two_dimensional_cases_and_entropy():
    probs, label = _case(3, shape=(40, 32))
    flat = _evaluator().add_case("slice", probs, label, (0.8, 0.8))
    assert flat["hd95_mm/liver"] >= 0 and 0 <= flat["ece"] <= 1
    uniform = torch.full((4, 3, 3), 0.25)
    torch.testing.assert_close(entropy_map(uniform), torch.full((3, 3), math.log(4)))
    assert entropy_map(torch.nn.functional.one_hot(label, 4).movedim(-1, 0).float()).abs().max() == 0
    torch.testing.assert_close(entropy_map(torch.full((3, 2, 2), 0.5), multilabel=True),
                               torch.full((2, 2), 3 * math.log(2)))


def test_reliability_figure_from_the_evaluator():
    ev = _evaluator()
    ev.add_case("f", *_case(4), (1.0, 1.0, 1.0))
    fig = reliability_figure(ev)
    assert isinstance(fig, Figure)
    assert sum(1 for ax in fig.axes if "ECE" in ax.get_title()) == 1 + 4


def test_bad_input_is_refused_with_the_case_named():
    ev = _evaluator()
    probs, label = _case(5)
    with pytest.raises(ValueError, match="case c: probabilities of shape"):
        ev.add_case("c", probs[:3], label, (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="logits"):
        ev.add_case("c", probs * 3 - 1, label, (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="spacing"):
        ev.add_case("c", probs, label, (1.0, 1.0))
    with pytest.raises(ValueError, match=r"case c: label values must lie in \[0, 4\)"):
        ev.add_case("c", probs, label + 3, (1.0, 1.0, 1.0))
    ev.add_case("c", probs, label, (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="already added"):
        ev.add_case("c", probs, label, (1.0, 1.0, 1.0))
    with pytest.raises(ConfigError, match="evaluation.region"):
        EvalProtocol(region="foreground")
    with pytest.raises(ConfigError, match="evaluation.failure_risk"):
        EvalProtocol(failure_risk="dice")
    with pytest.raises(ConfigError, match="evaluation.failure_region"):
        EvalProtocol(failure_region="foreground")
    assert EvalProtocol(failure_region="all").failure_region == "all" and EvalProtocol().failure_region is None
    with pytest.raises(ValueError, match="class names"):
        Evaluator(3, NAMES, EvalProtocol())


def test_outputs_are_reproducible(tmp_path):
    texts = []
    for run in ("a", "b"):
        ev = _evaluator()
        for s in range(2):
            ev.add_case(f"c{s}", *_case(s), (1.0, 1.0, 1.0))
        ev.write(tmp_path / run)
        texts.append([(tmp_path / run / f).read_text() for f in ("per_case.csv", "summary.json", "reliability.csv")])
    assert texts[0] == texts[1]
    ev.reset()
    assert ev.n_cases == 0 and ev.summary()["n_cases"] == 0


def test_an_empty_label_map_is_evaluated_with_a_warning():
    probs, label = _case(6)
    with pytest.warns(UserWarning, match="no foreground"):
        flat = _evaluator().add_case("empty", probs, torch.zeros_like(label), (1.0, 1.0, 1.0))
    assert flat["status/liver"] == "false_alarm" and flat["dice/liver"] == 0.0


# Two cases of 4 voxels, 3 classes, 4 bins (lo, hi]: the dataset reliability histogram counted by hand.
HIST_CASES = [
    (torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.7, 0.2], [0.2, 0.2, 0.6]]), [0, 1, 2, 2]),
    (torch.tensor([[0.4, 0.6, 0.0], [0.3, 0.6, 0.1], [0.9, 0.05, 0.05], [0.0, 0.0, 1.0]]), [1, 0, 0, 2]),
]


def _hist_evaluator(cases) -> Evaluator:
    ev = Evaluator(3, ["background", "a", "b"], EvalProtocol(region="all", n_bins=4, bootstrap_samples=0))
    for i, (p, y) in enumerate(cases):
        ev.add_case(f"c{i}", p.T.reshape(3, 2, 2), torch.tensor(y).reshape(2, 2), (1.0, 1.0))
    return ev


def test_dataset_reliability_histogram_counts_cases_per_cell_by_hand(tmp_path):
    """Class a, case 0: p_a = .1 .8 .7 .2 (y = a only at voxel 1): bin 0 holds 2 voxels, frequency 0 ->
    cell (f0, k0); bin 2: 1 voxel, 0 -> (f0, k2); bin 3: 1 voxel, 1 -> (f3, k3). Case 1: p_a = .6 .6 .05 0,
    y = a at voxel 0: bin 2, frequency 1/2 -> (f1, k2) (0.5 lies in (1/4, 2/4]); bin 0: 0 -> (f0, k0).
    Class b, case 0: p_b = .1 .1 .2 .6, y = b at voxels 2, 3: bin 0, 1/3 -> (f1, k0); bin 2, 1 -> (f3, k2).
    Case 1: p_b = 0 .1 .05 1, y = b at voxel 3: bin 0, 0 -> (f0, k0); bin 3, 1 -> (f3, k3)."""
    ev = _hist_evaluator(HIST_CASES)
    hist, names, voxels = ev.histogram_panels()
    assert names == ["a", "b"] and hist.shape == (2, 4, 4)  # background left out, as in the authors' plots
    want = np.zeros((2, 4, 4), dtype=np.int64)  # [class, frequency bin, confidence bin]
    for (c, f, k), n in {(0, 0, 0): 2, (0, 0, 2): 1, (0, 3, 3): 1, (0, 1, 2): 1,
                         (1, 1, 0): 1, (1, 3, 2): 1, (1, 0, 0): 1, (1, 3, 3): 1}.items():
        want[c, f, k] = n
    np.testing.assert_array_equal(hist, want)
    np.testing.assert_array_equal(voxels, [[4, 0, 3, 1], [6, 0, 1, 1]])  # pooled voxels per confidence bin
    # cells are sums over cases: two evaluators of one case each add up to the evaluator of both
    parts = [_hist_evaluator([case]).histogram_panels()[0] for case in HIST_CASES]
    np.testing.assert_array_equal(parts[0] + parts[1], hist)
    assert parts[0].sum() == 3 + 2  # one point per non-empty bin of the case's diagram, empty bins none

    ev.write(tmp_path)
    with open(tmp_path / "reliability_histogram.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 4 * 4
    from mcseg.metrics.reliability import read_histogram_table
    table, table_names = read_histogram_table(rows)
    assert table_names == ["a", "b"]
    np.testing.assert_array_equal(table, want)
    cell = next(r for r in rows if r["panel"] == "b" and r["confidence_bin"] == "0" and r["frequency_bin"] == "1")
    assert (cell["cases"], float(cell["frequency_lo"]), float(cell["frequency_hi"])) == ("1", 0.25, 0.5)
    assert (tmp_path / "reliability_histogram.png").stat().st_size > 1000


def test_dataset_reliability_histogram_of_a_multilabel_task_is_per_region(tmp_path):
    ev = Evaluator(2, ["WT", "TC"], EvalProtocol(region="all", n_bins=4, bootstrap_samples=0), multilabel=True)
    probs = torch.tensor([[0.9, 0.2, 0.6, 0.1], [0.3, 0.3, 0.8, 0.0]]).reshape(2, 2, 2)
    label = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 0]]).reshape(2, 2, 2)
    ev.add_case("c0", probs, label, (1.0, 1.0))
    hist, names, _ = ev.histogram_panels()
    assert names == ["WT", "TC"]
    # WT: p .9 .2 .6 .1 -> bins 3 (y 1), 0 (0, 0), 2 (0); TC: .3 .3 -> bin 1 (1/2), .8 -> 3 (1), 0 -> 0 (0)
    assert {(int(c), int(f), int(k)) for c, f, k in zip(*hist.nonzero())} == {
        (0, 3, 3), (0, 0, 0), (0, 0, 2), (1, 1, 1), (1, 3, 3), (1, 0, 0)}
    assert hist.sum() == 6
    ev.write(tmp_path)
    assert (tmp_path / "reliability_histogram.png").is_file()
