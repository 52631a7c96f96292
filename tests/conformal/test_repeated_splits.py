"""Validity shown over random re-splits in every conformal path (issue #46, items 4 and 5): a checkpoint's
evaluation (``conformal.repeats``) and ``mcseg-conformal-folder`` (``--repeats``) pool the calibration and the
labelled test cases, each summarised as a calibration case is, split them again at random ``repeats`` times at
each of ``alphas`` and alpha, as many calibration cases as the fit had, and write validity.csv, coverage.png and
conformal.json's ``validity`` block; the evaluation also logs the figure (``conformal/<source>/coverage``). The
rows are recomputed here from the cases' own probabilities, and equal scripts/conformal_validity.py's on the same
pool."""
from __future__ import annotations

import csv
import json
import math
import sys

import pytest
import torch

from mcseg.conformal import ConformalSettings, default_thresholds, predicted_masks, summarise
from mcseg.conformal.fit import CaseSummary
from mcseg.conformal.risks import class_masks
from mcseg.conformal.validity import validity_rows
from mcseg.data.synthetic import SyntheticDataset
from mcseg.evaluation.conformal import ConformalConfig, conformal_of_predictor
from tests.conformal.synthetic import Oracle, mcseg_folder

NUMBERS = ("mean_test_risk", "mean_test_risk_se", "violation_rate", "violation_rate_se", "mean_threshold",
           "uncontrolled_splits", "mean_set_over_prediction", "mean_covered", "mean_sure_inside")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    dataset = SyntheticDataset(shape=(20, 20), n_cases=16, seed=0)
    refs = dataset.case_refs()
    logged = []
    out = tmp_path_factory.mktemp("repeated") / "conformal"
    config = ConformalConfig(enabled=True, alpha=0.3, repeats=20, alphas=[0.2], masks=False, posthoc=False)
    records = conformal_of_predictor(config, Oracle(), dataset, refs[:10], dataset, refs[10:], {}, out, {},
                                     lambda tag, figure: logged.append((tag, figure)))
    return dataset, refs, out, records, logged


def _same(rows: list[dict], expected: list[dict]) -> None:
    assert [(r["class"], float(r["alpha"])) for r in rows] == [(r["class"], r["alpha"]) for r in expected]
    for row, want in zip(rows, expected):
        for key in NUMBERS:
            value = row[key]
            value = math.nan if value in ("", None) else float(value)
            assert value == pytest.approx(want[key], nan_ok=True), (row["class"], row["alpha"], key)


def test_evaluation_splits_the_pooled_validation_and_test_cases_again(evaluated):
    dataset, refs, out, records, logged = evaluated
    predictor, grid = Oracle(), default_thresholds()
    summaries = []
    for ref in refs:  # the validation cases, then the test cases
        case = dataset.load(ref)
        probs = predictor.probabilities(predictor.predict(case)[0])
        label = torch.as_tensor(case.label)
        summaries.append(summarise(ref.case_id, probs, class_masks(label, 4, False), predicted_masks(probs, False),
                                   case.spacing, grid, classes=[1, 2, 3]))
    pool = CaseSummary.stack(summaries)
    expected = [row for alpha in (0.2, 0.3) for row in validity_rows(
        pool, ConformalSettings(alpha=alpha, classes=[1, 2, 3]), dataset.class_names, 10, 20, seed=0)]
    folder = out / "raw"
    _same(list(csv.DictReader((folder / "validity.csv").open())), expected)
    record = json.loads((folder / "conformal.json").read_text())
    assert record == json.loads(json.dumps(records["raw"]))
    validity = record["validity"]
    assert (validity["n_cases"], validity["n_calibration"], validity["n_test"], validity["repeats"]) == (16, 10, 6, 20)
    assert validity["alphas"] == [0.2, 0.3] and "dependent" in validity["what"] and "fixed split" in validity["what"]
    _same(validity["rows"], expected)
    assert (folder / "coverage.png").read_bytes()[:4] == b"\x89PNG"
    assert validity["files"] == ["validity.csv", "coverage.png"]
    assert [tag for tag, _ in logged] == ["conformal/raw/coverage"]
    assert logged[0][1].axes[0].get_xlabel() == "alpha"


def test_no_re_splits_with_repeats_0_and_bad_values_refused(tmp_path):
    from mcseg.config import typed
    from mcseg.errors import ConfigError

    dataset = SyntheticDataset(shape=(16, 16), n_cases=6, seed=1)
    refs = dataset.case_refs()
    records = conformal_of_predictor(ConformalConfig(enabled=True, alpha=0.4, repeats=0, masks=False, posthoc=False),
                                     Oracle(), dataset, refs[:3], dataset, refs[3:], {}, tmp_path, {})
    assert "validity" not in records["raw"] and not (tmp_path / "raw/validity.csv").exists()
    assert ConformalConfig().repeats == 200 and ConformalConfig().alphas == [0.05, 0.1, 0.2]
    with pytest.raises(ConfigError, match="conformal.alphas"):
        typed({"alphas": [0.1, 1.5]}, ConformalConfig, "conformal")
    with pytest.raises(ConfigError, match="conformal.repeats"):
        typed({"repeats": -1}, ConformalConfig, "conformal")


def test_folder_command_and_the_script_split_the_same_pool(tmp_path):
    from mcseg.conformal_folder import main as conformal
    from tests.conftest import ROOT

    labels = tmp_path / "labels"
    mcseg_folder(tmp_path / "fit", labels, [f"a{i:02d}" for i in range(10)], 1)  # sorted before the test cases
    mcseg_folder(tmp_path / "test", labels, [f"b{i:02d}" for i in range(5)], 2)
    out = tmp_path / "out"
    assert conformal(["--fit", str(tmp_path / "fit"), "--reference", str(labels), "--apply", str(tmp_path / "test"),
                      "-o", str(out), "--alpha", "0.3", "--repeats", "15", "--alphas", "0.2"]) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert (record["validity"]["n_calibration"], record["validity"]["n_test"]) == (10, 5)
    assert (out / "coverage.png").read_bytes()[:4] == b"\x89PNG"
    sys.path.insert(0, str(ROOT / "scripts"))
    from conformal_validity import main as validity

    table = tmp_path / "script.csv"
    assert validity(["--predictions", str(tmp_path / "fit"), str(tmp_path / "test"), "--reference", str(labels),
                     "--alpha", "0.2", "0.3", "--calibration", "10", "--repeats", "15", "-o", str(table)]) == 0
    expected = list(csv.DictReader(table.open()))
    for row in expected:
        row["alpha"] = float(row["alpha"])
        for key in NUMBERS:
            row[key] = math.nan if row[key] == "" else float(row[key])
    _same(list(csv.DictReader((out / "validity.csv").open())), expected)
    _same(record["validity"]["rows"], expected)
    # replaced with --overwrite: no re-splits asked, none left from the earlier fit
    assert conformal(["--fit", str(tmp_path / "fit"), "--reference", str(labels), "--apply", str(tmp_path / "test"),
                      "-o", str(out), "--alpha", "0.3", "--repeats", "0", "--overwrite"]) == 0
    assert "validity" not in json.loads((out / "conformal.json").read_text())
    assert not (out / "validity.csv").exists() and not (out / "coverage.png").exists()


def test_a_split_whose_calibration_cases_lack_a_class_counts_it_as_not_controlled():
    """A class in few cases of the pool (absent='skip'): a random split may leave it out of every calibration case,
    where no threshold can be fitted. That split counts the class as not controlled, instead of stopping the
    evaluation whose fixed split was fitted."""
    import numpy as np

    from mcseg.conformal.validity import over_splits, summarise_splits
    from tests.conformal.synthetic import synthetic_summaries

    rng = np.random.default_rng(4)
    pool = CaseSummary.join([synthetic_summaries(rng, 1), synthetic_summaries(rng, 9, absent_every=1)])
    assert (pool.counts.positives[:, 2] > 0).tolist() == [True] + [False] * 9  # class 2 in the first case only
    settings = ConformalSettings(classes=[1, 2], alpha=0.4)
    rows = over_splits(pool, settings, 3, repeats=30, seed=1)
    lacking = [not (r["threshold"] == r["threshold"]) for r in rows[2]]  # NaN: no calibration case had class 2
    assert 0 < sum(lacking) < 30
    summary = summarise_splits(rows[2], 0.4)
    assert summary["uncontrolled_splits"] >= sum(lacking) and np.isfinite(summary["mean_threshold"])
    assert all(r["controlled"] for r in rows[1]) and summarise_splits(rows[1], 0.4)["splits"] == 30
