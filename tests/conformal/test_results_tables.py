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
