"""The table of figures (mcseg/evaluation/figures.py) is the one list: what the evaluator writes is exactly what it
declares, and each place that shows figures takes its selection from it."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from mcseg.evaluation import figures
from mcseg.evaluation.evaluator import EvalProtocol, Evaluator
from mcseg.evaluation.figures import FIGURES, Figure, case_keys, class_keys, shown_in, summary_value

from tests.metrics.reference import blobs

BOOKKEEPING = {"case", "class_index", "class_name", "status", "class_ece", "n_region_voxels", "region"}


def _written(tmp_path, multilabel=False):
    names = ["a", "b"] if multilabel else ["bg", "a", "b"]
    ev = Evaluator(len(names), names, EvalProtocol(bootstrap_samples=10), multilabel=multilabel)
    for seed in range(2):
        label = blobs((12, 10, 8), 3, seed=seed)
        if multilabel:
            label = torch.stack([label == 1, label >= 1]).long()
            probs = torch.rand(2, 12, 10, 8, generator=torch.Generator().manual_seed(seed))
        else:
            logits = torch.nn.functional.one_hot(label, 3).movedim(-1, 0).float() * 3
            probs = torch.softmax(logits + torch.randn(3, 12, 10, 8, generator=torch.Generator().manual_seed(seed)), 0)
        ev.add_case(f"c{seed}", probs, label, (1.0, 1.0, 2.0))
    ev.write(tmp_path)
    with open(tmp_path / "per_case.csv") as fh:
        columns = next(csv.reader(fh))
    return columns, json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.parametrize("multilabel", [False, True])
def test_the_evaluator_writes_exactly_the_declared_figures(tmp_path, multilabel):
    columns, summary = _written(tmp_path, multilabel)
    declared = set(class_keys()) | set(case_keys())
    assert set(columns) - BOOKKEEPING == declared, "a per_case.csv column without a table entry, or the reverse"
    means = {k for k in summary if k.startswith("mean_")}
    assert means == {f.summary_key for f in FIGURES if f.per in ("class", "case")}
    assert {f.key for f in FIGURES if f.pooled} <= set(summary["pooled"])
    assert set(summary["calibration"]) == set(case_keys()) and set(summary["foreground"]) == set(class_keys())
    for f in FIGURES:
        if f.per != "split":
            assert summary_value(summary, f) is not None, f"{f.key} declared but not written"


def test_each_place_takes_its_figures_from_the_table():
    from mcseg.evaluation.shift import FAILURE_METRICS, METRICS
    from mcseg.evaluation.split import POSTHOC_KEYS
    from mcseg.report.render import PREDICTOR_HEADERS
    from mcseg.report.table import METRICS as REPORT_METRICS, PREDICTOR_COLUMNS
    from mcseg.training.loggers.tensorboard import HPARAM_METRICS
    from mcseg.training.trainer import HEADLINE

    assert HEADLINE == tuple(f.summary_key for f in shown_in("headline"))
    assert HPARAM_METRICS == tuple(f.summary_key for f in shown_in("hparams"))
    assert POSTHOC_KEYS == tuple(f.summary_key for f in shown_in("posthoc"))
    shift = {f.key for f in shown_in("shift") if f.per != "split" and f.better}
    assert set(METRICS) == shift and set(FAILURE_METRICS) == {f"{f.key}_pe" for f in shown_in("shift") if f.per == "split"}
    assert [m[0] for m in REPORT_METRICS if m[3] == ""] == [f.key for f in shown_in("report")]
    assert list(PREDICTOR_COLUMNS) == list(PREDICTOR_HEADERS) == [f.key for f in shown_in("predictor")]
    # what mcseg showed before the table keeps its place and order
    assert [m[0] for m in REPORT_METRICS][:4] == ["dice", "hd95_mm", "ece", "classwise_ece"]
    assert list(PREDICTOR_COLUMNS)[:4] == ["dice", "hd95_mm", "ece", "classwise_ece"]
    assert HEADLINE == ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece")


def test_the_table_refuses_a_malformed_entry():
    with pytest.raises(ValueError, match="unknown places"):
        Figure("x", "X", "case", "calibration", -1, frozenset({"console"}))
    with pytest.raises(ValueError, match="summary path"):
        Figure("x", "X", "split", "failure", -1)
    with pytest.raises(ValueError, match="better"):
        Figure("x", "X", "case", "calibration", 2)
    with pytest.raises(KeyError, match="no figure"):
        figures.figure("dice_typo")
    assert len({f.key for f in FIGURES}) == len(FIGURES)
