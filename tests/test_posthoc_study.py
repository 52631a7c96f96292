"""scripts/posthoc_study.py: every post-hoc variant scored on a run's test split, the run left untouched."""
from __future__ import annotations

import csv
import sys

import pytest

from mcseg.train import train
from tests.conftest import ROOT, TINY_2D
from tests.test_rundir import snapshot

sys.path.insert(0, str(ROOT / "scripts"))
import posthoc_study  # noqa: E402


def test_study_scores_each_variant_in_one_pass_and_writes_nothing_into_the_run(make_cfg, tmp_path):
    run = tmp_path / "run"
    train(make_cfg(TINY_2D + ["posthoc.fit=[temperature]", "posthoc.apply=[temperature]"], output_dir=run))
    before = snapshot(run)
    variants = ["temperature-balanced", "temperature-region-ece", "vector-balanced"]
    assert posthoc_study.main([str(run), "--out", str(tmp_path / "study"), "--variants", *variants]) == 0
    assert snapshot(run) == before
    with open(tmp_path / "study/per_run.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["raw (pre_T)", *variants]
    assert rows["temperature-region-ece"]["label"] == "temperature (region, ece)"
    for name in ("temperature-balanced", "temperature-region-ece"):  # TS keeps the arg-max: Dice as raw
        assert float(rows[name]["mean_foreground_dice"]) == pytest.approx(float(rows["raw (pre_T)"]["mean_foreground_dice"]))
        assert float(rows[name]["temperature"]) > 0
    # the fits are kept beside the study, one calibration.json per (voxels, objective)
    assert (tmp_path / "study/runs/run/fits/balanced-nll/calibration.json").is_file()
    table = (tmp_path / "study/table.md").read_text()
    assert "**all 1 runs**" in table and "temperature-region-ece" in table
    head, _, *body = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("|")]
    kept = {row[1]: row[head.index("segmentation kept")] for row in body if row[0] == "run"}
    assert kept["temperature-balanced"] == "1/1" and kept["temperature-region-ece"] == "1/1"
    seg_same = all(rows["vector-balanced"][m] == rows["raw (pre_T)"][m]
                   for m in ("mean_foreground_dice", "mean_foreground_hd95_mm"))
    assert kept["vector-balanced"] == ("1/1" if seg_same else "0/1")
    # a second study of the same run reads the first one's results instead of fitting again
    first = (tmp_path / "study/runs/run/summary.json").stat().st_mtime_ns
    assert posthoc_study.main([str(run), "--out", str(tmp_path / "study"), "--variants", variants[0]]) == 0
    assert (tmp_path / "study/runs/run/summary.json").stat().st_mtime_ns == first
    with open(tmp_path / "study/per_run.csv") as f:
        assert [r["variant"] for r in csv.DictReader(f)] == ["raw (pre_T)", variants[0]]


def test_the_table_is_rebuilt_from_committed_pieces_without_the_runs(make_cfg, tmp_path):
    """A piece folder (runs/<job>/summary.json and timing.json, as committed) gives the same table as the study."""
    import shutil

    run = tmp_path / "sweep" / "3_loss=ce,seed=2"
    train(make_cfg(TINY_2D + ["posthoc.fit=[temperature]", "posthoc.apply=[temperature]"], output_dir=run))
    variants = ["temperature-region", "histogram"]
    assert posthoc_study.main([str(run), "--out", str(tmp_path / "study"), "--variants", *variants]) == 0
    piece = tmp_path / "piece" / "runs" / run.name
    piece.mkdir(parents=True)
    for name in ("summary.json", "timing.json"):
        shutil.copy(tmp_path / "study" / "runs" / run.name / name, piece / name)
    shutil.rmtree(tmp_path / "sweep")
    assert posthoc_study.main([str(tmp_path / "piece"), "--pieces", "--out", str(tmp_path / "table")]) == 0
    with open(tmp_path / "table/per_run.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == ["raw (pre_T)", *variants]
    assert {(r["configuration"], r["seed"]) for r in rows} == {("loss=ce", "2")}
    assert all(float(r["fit_s"]) >= 0 and 0 <= float(r["voxels_changed"]) <= 1 for r in rows[1:])  # both recorded
    with open(tmp_path / "study/per_run.csv") as f:
        study_rows = list(csv.DictReader(f))
    assert [r["mean_ece"] for r in rows] == [r["mean_ece"] for r in study_rows]
