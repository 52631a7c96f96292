"""The table of figures (mcseg/evaluation/figure_table.py) is the one list: what the evaluator writes is exactly what it
declares (and docs/protocol.md lists), and each place that shows figures takes its selection from it."""
from __future__ import annotations

import csv
import json
import re

import pytest
import torch

from mcseg.evaluation import figure_table as figures
from mcseg.evaluation.evaluator import Evaluator
from mcseg.config import EvalProtocol
from mcseg.evaluation.figure_declaration import Figure, shows
from mcseg.evaluation.scorers import Scorer
from mcseg.evaluation.figure_table import case_keys, class_keys, summary_value, table

from tests.conftest import ROOT
from tests.metrics.reference import blobs

BOOKKEEPING = {"case", "class_index", "class_name", "status", "class_ece", "n_region_voxels", "region"}


def _written(tmp_path, multilabel=False, seed=0):
    names = ["a", "b"] if multilabel else ["bg", "a", "b"]
    ev = Evaluator(len(names), names, EvalProtocol(bootstrap_samples=10), multilabel=multilabel)
    for index, seed in enumerate(range(seed, seed + 2)):
        label = blobs((12, 10, 8), 3, seed=seed)
        if multilabel:
            label = torch.stack([label == 1, label >= 1]).long()
            probs = torch.rand(2, 12, 10, 8, generator=torch.Generator().manual_seed(seed))
        else:
            logits = torch.nn.functional.one_hot(label, 3).movedim(-1, 0).float() * 3
            probs = torch.softmax(logits + torch.randn(3, 12, 10, 8, generator=torch.Generator().manual_seed(seed)), 0)
        ev.add_case(f"c{index}", probs, label, (1.0, 1.0, 2.0))
    ev.write(tmp_path)
    with open(tmp_path / "per_case.csv") as fh:
        columns = next(csv.reader(fh))
    return columns, json.loads((tmp_path / "summary.json").read_text())


def _documented_per_case_columns() -> list[str]:
    """The per_case.csv columns docs/protocol.md's table of files lists, in its order (the back-quoted names)."""
    rows = [line for line in (ROOT / "docs" / "protocol.md").read_text().splitlines()
            if line.startswith("| `per_case.csv` |")]
    assert len(rows) == 1, "docs/protocol.md: expected one row for per_case.csv in its table of files"
    names = re.findall(r"`([^`]+)`", rows[0].split("|")[2])
    return [name.strip() for part in names[:2] for name in part.split(",")]


def _active(multilabel: bool, num_classes: int) -> tuple[Figure, ...]:
    """The per-case figures of the scorers that score this kind of task."""
    return tuple(f for scorer in figures.active_scorers(num_classes, multilabel) for f in scorer.figures)


@pytest.mark.parametrize("multilabel", [False, True])
def test_the_evaluator_writes_exactly_the_declared_figures_and_docs_list_them(tmp_path, multilabel):
    columns, summary = _written(tmp_path, multilabel)
    active = _active(multilabel, 2 if multilabel else 3)
    declared = {f.key for f in active}
    assert set(columns) - BOOKKEEPING == declared, "a per_case.csv column without a table entry, or the reverse"
    # docs/protocol.md names every column written, in order (it once lacked pece); region tasks add QU-BraTS's
    documented = _documented_per_case_columns()
    assert [c for c in columns if not c.startswith("qubrats_")] == documented, \
        "docs/protocol.md's per_case.csv columns are not those written"
    means = {k for k in summary if k.startswith("mean_")}
    assert means == {f.summary_key for f in active}
    assert {f.key for f in active if f.pooled} <= set(summary["pooled"])
    assert set(summary["calibration"]) == {f.key for f in active if f.per == "case"}
    assert set(summary["foreground"]) == {f.key for f in active if f.per == "class"}
    for f in active:
        assert summary_value(summary, f) is not None, f"{f.key} declared but not written"
    # every task writes the figures of the scorers for every task; the challenge ones only on theirs
    assert {"dice", "ece", "pece"} <= declared and set(case_keys()) | set(class_keys()) >= declared
    assert ("qubrats_score" in declared) == multilabel and "ndsc" not in declared


def test_the_challenge_figures_reach_per_case_csv_and_the_summary(tmp_path):
    """Binary task: the Shifts figures; region task: QU-BraTS; each the value of mcseg.metrics.challenge."""
    from mcseg.metrics.challenge import lesion_f1, ndsc_aac, normalised_dice, qubrats_curves, uncertainty_0_100

    binary, regions = Evaluator(2, ["bg", "lesion"], EvalProtocol(bootstrap_samples=0, figures=False)), Evaluator(
        2, ["WT", "TC"], EvalProtocol(bootstrap_samples=0, figures=False), multilabel=True)
    expected = {}
    for index in range(2):
        label = (blobs((12, 10, 8), 2, seed=index) > 0).long()
        noise = torch.randn(2, 12, 10, 8, generator=torch.Generator().manual_seed(index))
        probs = torch.softmax(torch.stack([-3.0 * label, 3.0 * label]).float() + noise, 0)
        pred, unc = probs.argmax(0) == 1, uncertainty_0_100(probs[1])
        expected[f"c{index}"] = (normalised_dice(pred, label), ndsc_aac(pred, label, unc),
                                 lesion_f1(pred, label, 0.5))
        binary.add_case(f"c{index}", probs, label, (1.0, 1.0, 1.0))
        region_label = torch.stack([label, label * (noise[0] > 0)])
        region_probs = torch.sigmoid(3.0 * region_label - 1.5 + noise)
        regions.add_case(f"c{index}", region_probs, region_label, (1.0, 1.0, 1.0))
        expected[f"r{index}"] = qubrats_curves(region_probs[1] > 0.5, region_label[1],
                                               uncertainty_0_100(region_probs[1])).score
    binary.write(tmp_path / "binary")
    regions.write(tmp_path / "regions")
    with open(tmp_path / "binary" / "per_case.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["class_name"] == "lesion"]
    assert "qubrats_score" not in rows[0]
    for row in rows:
        assert [float(row[k]) for k in ("ndsc", "ndsc_aac", "lesion_f1")] == pytest.approx(expected[row["case"]])
    summary = json.loads((tmp_path / "binary" / "summary.json").read_text())
    assert summary["mean_foreground_ndsc"] == pytest.approx((expected["c0"][0] + expected["c1"][0]) / 2)
    with open(tmp_path / "regions" / "per_case.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["class_name"] == "TC"]
    assert "ndsc" not in rows[0]
    assert [float(r["qubrats_score"]) for r in rows] == pytest.approx([expected["r0"], expected["r1"]])
    summary = json.loads((tmp_path / "regions" / "summary.json").read_text())
    assert summary["per_class"]["TC"]["qubrats_score"]["n"] == 2


def test_each_place_keeps_what_it_showed_before_the_table():
    from mcseg.evaluation.shift import failure_metrics, shift_metrics
    from mcseg.report.table import metrics, predictor_columns

    assert figures.summary_keys("headline") == ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece",
                                                "mean_classwise_ece")
    assert figures.summary_keys("hparams") == figures.summary_keys("headline")
    assert figures.summary_keys("posthoc")[:4] == figures.summary_keys("headline")
    assert list(shift_metrics())[:4] == ["dice", "hd95_mm", "ece", "classwise_ece"]
    assert list(failure_metrics()) == ["voxel_auroc_pe", "aurc_pe"]
    # the challenge figures (issue #56) joined, each where its task is scored (mcseg-report leaves out the others)
    assert [m[0] for m in metrics()] == ["dice", "hd95_mm", "ece", "classwise_ece", "smooth_ece", "ndsc", "ndsc_aac",
                                         "lesion_f1", "qubrats_score", "curvas_thresholded_dice", "ece_post_T",
                                         "classwise_ece_post_T",
                                         "smooth_ece_post_T"]
    assert list(predictor_columns())[:4] == ["dice", "hd95_mm", "ece", "classwise_ece"]
    assert "signed_ece" not in shift_metrics()  # no robustness score for a figure whose best value is zero


def test_the_table_refuses_a_malformed_entry():
    with pytest.raises(ValueError, match="unknown places"):
        Figure("x", "X", "case", "calibration", -1, frozenset({"console"}))
    with pytest.raises(ValueError, match="summary path"):
        Figure("x", "X", "split", "failure", -1)
    with pytest.raises(ValueError, match="better"):
        Figure("x", "X", "case", "calibration", 2)
    with pytest.raises(KeyError, match="no figure"):
        figures.figure("dice_typo")
    assert len({f.key for f in table()}) == len(table())


TOY_PROTOCOL = "the fraction of the case's voxels predicted foreground"


class ToyScorer(Scorer):
    """Figures added by one class and one entry: the fraction of the case's voxels predicted foreground
    (directional: higher is better, as declared) and its distance to 0.5 signed (best at zero: not directional)."""

    figures = (Figure("toy_fraction", "toy fraction", "case", "segmentation", +1,
                      shows("report", "predictor", "shift"), protocol=TOY_PROTOCOL),
               Figure("toy_offset", "toy offset", "case", "segmentation", 0, shows("report", "shift"),
                      protocol=lambda protocol, multilabel: f"toy fraction - 0.5 ({protocol.n_bins} bins unused)"))

    def score(self, case):
        foreground = case.prediction > 0 if not self.multilabel else case.prediction.any(0)
        fraction = float(foreground.float().mean())
        return {"toy_fraction": fraction, "toy_offset": fraction - 0.5}


def _run_dir(run, loss: str, seed: int, monkeypatch):
    """A run directory whose test evaluation the evaluator wrote, as mcseg-report reads it."""
    (run / "eval" / "test").mkdir(parents=True)
    identity = {"configuration": f"loss={loss}", "overrides": [f"loss={loss}"], "loss_name": loss, "loss": {},
                "dataset": "toyset", "seed": seed}
    (run / "result.json").write_text(json.dumps({"score": 0.5, "run": identity}))
    (run / "status.json").write_text(json.dumps({"status": "completed"}))
    _written(run / "eval" / "test", seed=seed)


def test_a_toy_figure_added_by_one_class_and_one_entry_shows_everywhere(tmp_path, monkeypatch):
    from mcseg.report import cli
    from mcseg.trackers import summary_metrics

    monkeypatch.setattr(figures, "SCORERS", [*figures.SCORERS, ToyScorer])  # the one entry
    columns, summary = _written(tmp_path / "one")
    assert "toy_fraction" in columns
    assert 0 < summary["mean_toy_fraction"] < 1 and "toy_fraction" in summary["calibration"]
    assert summary_metrics(summary)["mean_toy_fraction"] == summary["mean_toy_fraction"]  # the trackers' figures
    for loss, seed in (("ce", 0), ("ce", 1), ("margin", 0), ("margin", 1)):
        _run_dir(tmp_path / "runs" / f"{loss}{seed}", loss, seed, monkeypatch)
    assert cli.main([str(tmp_path / "runs"), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| loss"))
    assert "| toy fraction |" in header and "nDSC" not in header  # a 3-class task: no binary-task figure
    with open(tmp_path / "report" / "report.csv") as fh:
        rows = {r["loss"]: r for r in csv.DictReader(fh)}
    # its declaration says it is tested: an interval over the cases' values (read from per_case.csv) and a paired
    # Wilcoxon test of the margin configuration against the baseline (ce)
    for name in ("toy_fraction", "toy_offset"):
        assert int(rows["margin"][f"{name}_n_cases"]) == 2
        assert float(rows["margin"][f"{name}_ci95_lo"]) <= float(rows["margin"][f"{name}_ci95_hi"])
        assert 0 <= float(rows["margin"][f"{name}_p_vs_baseline"]) <= 1 and rows["ce"][f"{name}_p_vs_baseline"] == ""
    # its protocol text goes where the evaluator states its figures
    assert summary["protocol"]["toy_fraction"] == TOY_PROTOCOL
    assert summary["protocol"]["toy_offset"] == "toy fraction - 0.5 (15 bins unused)"


def test_a_toy_figure_reaches_the_shift_tables_where_it_is_directional(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from mcseg.data.shift import shift_config
    from mcseg.evaluation.shift import shift_metrics, shift_summary, shift_table

    monkeypatch.setattr(figures, "SCORERS", [*figures.SCORERS, ToyScorer])
    assert shift_metrics()["toy_fraction"] == ("mean_toy_fraction", True) and "toy_offset" not in shift_metrics()
    clean, corrupted = _written(tmp_path / "clean")[1], _written(tmp_path / "level1", seed=5)[1]
    suite = shift_config(OmegaConf.load(ROOT / "configs" / "shift" / "rood_mri.yaml"))
    result = shift_summary(suite, {"ghosting": {0: clean, 1: corrupted}})
    toy = result["predictors"]["raw"]["toy_fraction"]
    assert toy["values"]["ghosting"] == {"0": clean["mean_toy_fraction"], "1": corrupted["mean_toy_fraction"]}
    assert toy["higher_is_better"] is True and "toy_offset" not in result["predictors"]["raw"]
    assert "## raw: toy_fraction (higher is better)" in shift_table({**result, "output_dir": str(tmp_path)})


@pytest.mark.slow
def test_an_untested_figure_gets_no_interval_nor_test_in_the_report(tmp_path, monkeypatch):
    from mcseg.report import cli

    class Untested(Scorer):
        figures = (Figure("toy_size", "toy size", "case", "segmentation", +1, shows("report"), tested=False),)

        def score(self, case):
            return {"toy_size": float(case.prediction.numel())}

    monkeypatch.setattr(figures, "SCORERS", [*figures.SCORERS, Untested])
    for loss, seed in (("ce", 0), ("ce", 1), ("margin", 0), ("margin", 1)):
        _run_dir(tmp_path / "runs" / f"{loss}{seed}", loss, seed, monkeypatch)
    assert cli.main([str(tmp_path / "runs"), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    with open(tmp_path / "report" / "report.csv") as fh:
        margin = next(r for r in csv.DictReader(fh) if r["loss"] == "margin")
    assert margin["toy_size_p_vs_baseline"] == "" and margin["toy_size_ci95_lo"] == "nan"
    assert margin["dice_p_vs_baseline"] != ""  # the declared-tested figures beside it still are


def _binary_run(run, loss: str, seed: int) -> None:
    """A run of a binary lesion task whose test evaluation (three cases) the evaluator wrote."""
    (run / "eval" / "test").mkdir(parents=True)
    identity = {"configuration": f"loss={loss}", "overrides": [f"loss={loss}"], "loss_name": loss, "loss": {},
                "dataset": "lesions", "seed": seed}
    (run / "result.json").write_text(json.dumps({"score": 0.5, "run": identity}))
    (run / "status.json").write_text(json.dumps({"status": "completed"}))
    ev = Evaluator(2, ["bg", "lesion"], EvalProtocol(bootstrap_samples=10, figures=False))
    for index in range(3):
        label = (blobs((12, 10, 8), 2, seed=index) > 0).long()
        noise = torch.randn(2, 12, 10, 8, generator=torch.Generator().manual_seed(100 * seed + index + len(loss)))
        ev.add_case(f"c{index}", torch.softmax(torch.stack([-2.0 * label, 2.0 * label]).float() + noise, 0), label,
                    (1.0, 1.0, 1.0))
    ev.write(run / "eval" / "test")


def test_the_challenge_figures_reach_the_report_with_intervals_and_tests(tmp_path):
    """nDSC, its R-AAC and lesion F1 of a binary task: columns of mcseg-report with the cases' interval and a paired
    test against the baseline, as their declarations say; QU-BraTS (region tasks) is left out there."""
    from mcseg.report import cli

    for loss, seed in (("ce", 0), ("ce", 1), ("margin", 0), ("margin", 1)):
        _binary_run(tmp_path / "runs" / f"{loss}{seed}", loss, seed)
    assert cli.main([str(tmp_path / "runs"), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    with open(tmp_path / "report" / "report.csv") as fh:
        reader = csv.DictReader(fh)
        rows = {r["loss"]: r for r in reader}
    assert not any(c.startswith("qubrats") for c in reader.fieldnames)
    for name in ("ndsc", "ndsc_aac", "lesion_f1"):
        assert int(rows["margin"][f"{name}_n_cases"]) == 3
        assert float(rows["margin"][f"{name}_ci95_lo"]) <= float(rows["margin"][f"{name}_ci95_hi"])
        assert 0 <= float(rows["margin"][f"{name}_p_vs_baseline"]) <= 1
    summary = json.loads((tmp_path / "runs" / "ce0" / "eval" / "test" / "summary.json").read_text())
    assert summary["protocol"]["ndsc"].startswith("normalised Dice") and "qubrats_score" not in summary["protocol"]
