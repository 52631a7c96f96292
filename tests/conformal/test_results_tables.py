"""scripts/conformal_results.py: the hippocampus tables rebuilt from committed pieces (hand-made, two runs)."""
from __future__ import annotations

import csv
import json
import math
import sys

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import conformal_results  # noqa: E402

VALIDITY = ("class", "alpha", "splits", "n_calibration", "n_test", "mean_test_risk", "mean_test_risk_se",
            "violation_rate", "mean_threshold", "uncontrolled_splits", "mean_set_over_prediction", "mean_outer_mm",
            "mean_covered", "mean_inner_mm", "mean_sure_inside")


def _record(threshold: float, set_ratio: float, outer: float) -> dict:
    fit = {"threshold": threshold, "controlled": True, "n_cases": 31, "margin": {"outer_mm": outer, "inner_mm": 2.0}}
    test = {"mean_loss": 0.05, "loss_above_alpha": 3, "n_cases_with_class": 31, "mean_set_over_prediction": set_ratio,
            "mean_possible_over_prediction": 4.0, "covered": 1.0, "sure_inside": 0.9}
    return {"alpha": 0.1, "classes": {"A": fit}, "test": {"A": test}}


def _run(root, name: str, threshold: float, raw_set: float, scaled_set: float, outer: float, se: float) -> None:
    run = root / name
    for source, ratio in (("raw", raw_set), ("temperature", scaled_set)):
        folder = run / "fixed" / "a0.1" / source
        folder.mkdir(parents=True)
        (folder / "conformal.json").write_text(json.dumps(_record(threshold, ratio, outer)))
        with (run / f"validity_{source}.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, VALIDITY)
            writer.writeheader()
            writer.writerow({"class": "A", "alpha": 0.1, "splits": 100, "n_calibration": 31, "n_test": 31,
                             "mean_test_risk": 0.07, "mean_test_risk_se": se, "violation_rate": 0.01,
                             "mean_threshold": threshold, "uncontrolled_splits": 0, "mean_set_over_prediction": ratio,
                             "mean_outer_mm": outer, "mean_covered": 0.92, "mean_inner_mm": 2.0,
                             "mean_sure_inside": 0.93})
    for file in ("run_calibration.json", "folder_calibration.json"):
        (run / file).write_text(json.dumps({"fits": {"sha": {"scalers": {"temperature": {"temperature": 1.5}}}}}))


def test_tables_range_over_seeds_and_count_smaller_sets_after_temperature(tmp_path):
    _run(tmp_path, "ce_s0", 0.2, raw_set=2.0, scaled_set=1.5, outer=3.0, se=0.001)
    _run(tmp_path, "ce_s1", 0.25, raw_set=1.0, scaled_set=1.25, outer=4.0, se=0.002)
    fixed, splits = conformal_results.fixed_rows(tmp_path), conformal_results.split_rows(tmp_path)
    assert [r["test_cases_above_alpha"] for r in fixed] == ["3/31"] * 4
    assert splits[0]["sd_over_splits"] == 0.001 * math.sqrt(100)
    raw = next(r for r in conformal_results.by_loss(fixed, splits) if r["source"] == "raw")
    assert (raw["seeds"], raw["threshold"], raw["fixed_outer_mm"]) == (2, "0.2–0.25", "3–4")
    assert raw["fixed_set_over_pred"] == 1.5 and raw["splits_sd_max"] == 0.002 * math.sqrt(100)
    change = conformal_results.smaller_after_temperature(fixed, "set_over_prediction")
    assert change == [{"alpha": "0.1", "class": "A", "runs": 2, "smaller": 1, "larger": 1, "mean_change": -0.125}]
    assert conformal_results.main([str(tmp_path)]) == 0
    assert "| ce_s1 | 1.5 | 1.5 |" in (tmp_path / "summary.md").read_text()


def _variant(root, name: str, variant: str, threshold: float, controlled: bool, set_ratio: float,
             uncontrolled: int) -> None:
    """Another method's pieces of a run, laid out as its CRC pieces under ``<run>/<variant>/`` (raw only)."""
    base = root / name / variant
    folder = base / "fixed" / "a0.1" / "raw"
    folder.mkdir(parents=True)
    record = _record(threshold, set_ratio, 3.0)
    record["loss"] = variant.rsplit("_", 1)[1]
    record["classes"]["A"].update(controlled=controlled, calibration_risk=0.01, bound=0.09)
    (folder / "conformal.json").write_text(json.dumps(record))
    with (base / "validity_raw.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, (*VALIDITY, "loss"))
        writer.writeheader()
        writer.writerow({"class": "A", "alpha": 0.1, "splits": 100, "n_calibration": 31, "n_test": 31,
                         "mean_test_risk": 0.02, "mean_test_risk_se": 0.001, "violation_rate": 0.0,
                         "mean_threshold": threshold, "uncontrolled_splits": uncontrolled,
                         "mean_set_over_prediction": set_ratio, "mean_outer_mm": 3.0, "mean_covered": 0.92,
                         "mean_inner_mm": 2.0, "mean_sure_inside": 0.93, "loss": variant.rsplit("_", 1)[1]})


def test_other_methods_tabulated_over_seeds_beside_crc_sets(tmp_path):
    _run(tmp_path, "ce_s0", 0.2, raw_set=2.0, scaled_set=1.5, outer=3.0, se=0.001)
    _run(tmp_path, "ce_s1", 0.25, raw_set=1.0, scaled_set=1.25, outer=4.0, se=0.002)
    _variant(tmp_path, "ce_s0", "rcps_fnr", 0.05, True, 3.0, uncontrolled=0)
    _variant(tmp_path, "ce_s1", "rcps_fnr", 0.0, False, 5.0, uncontrolled=40)
    _variant(tmp_path, "ce_s0", "ltt_fdr", 1.0, False, 0.0, uncontrolled=100)
    assert conformal_results.variants(tmp_path) == ["ltt_fdr", "rcps_fnr"]
    fdr = conformal_results.fixed_rows(tmp_path, "ltt_fdr")[0]
    assert (fdr["test_fdr"], fdr["calibration_risk"], fdr["bound"]) == (0.05, 0.01, 0.09)
    assert "bound" not in conformal_results.fixed_rows(tmp_path)[0]  # CRC's tables keep their columns
    rows = conformal_results.against_crc(tmp_path, "rcps_fnr")
    assert len(rows) == 1  # raw only: no temperature pieces of this method
    row = rows[0]
    assert (row["seeds"], row["threshold"], row["fixed_controlled"], row["splits_uncontrolled"]) == \
        (2, "0–0.05", "1/2", "0–40")
    assert (row["fixed_set_over_pred"], row["crc_fixed_set_over_pred"]) == (4.0, 1.5)
    assert (row["splits_set_over_pred"], row["crc_splits_set_over_pred"]) == (4.0, 1.5)
    assert row["splits_mean_fnr"] == "0.02" and row["splits_violation_max"] == 0.0
    assert conformal_results.main([str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "## ltt_fdr" in text and "## rcps_fnr" in text


def test_markdown_marks_a_figure_a_row_lacks():
    """A method measured over the random splits of a seed whose fixed split is not there yet: '–', not a crash."""
    assert conformal_results.markdown([{"a": 1, "b": 2.0}, {"a": 3}]).splitlines()[-1] == "| 3 | – |"
