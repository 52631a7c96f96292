"""The statements over random splits of synthetic exchangeable cases, where every guarantee must hold on average,
and scripts/statements_validity.py on the tables mcseg-new-cases writes."""
from __future__ import annotations

import csv

import numpy as np

from mcseg.statements.table import CaseTable
from mcseg.statements.validity import split_rows, summarise_rows


def synthetic_table(n: int, seed: int = 0) -> CaseTable:
    """n exchangeable cases, one structure: truth = estimate + heteroscedastic noise."""
    rng = np.random.default_rng(seed)
    volume = rng.uniform(2, 4, (n, 1))
    sd = rng.uniform(0.05, 0.3, (n, 1))
    soft = rng.uniform(0.6, 0.95, (n, 1))
    band = rng.uniform(1, 5, (n, 1))
    return CaseTable([f"c{i}" for i in range(n)], ["s"], {
        "voxel_ml": np.full((n, 1), 0.001), "volume_mask_ml": volume, "volume_expected_ml": volume,
        "volume_sd_ml": sd, "soft_dice": soft, "band_mm": band,
        "volume_true_ml": volume + sd * rng.normal(size=(n, 1)),
        "dice_true": np.clip(soft - rng.exponential(0.05, (n, 1)) + 0.02, 0, 1),
        "hd95_true_mm": band * rng.uniform(0.5, 2.0, (n, 1))})


def test_every_statement_covers_on_average_over_splits():
    table = synthetic_table(400)
    rows = split_rows(table, 100, [0.1, 0.2], repeats=60, seed=0)
    for entry in summarise_rows(rows):
        if entry["statement"] == "review":
            assert entry["violation_rate"] <= 0.1 + 0.12
            continue
        assert entry["mean_coverage"] >= 1 - entry["alpha"] - 3 * entry["se"] - 0.01, entry


def test_the_splits_are_drawn_afresh_and_seeded():
    table = synthetic_table(40)
    rows = split_rows(table, 20, [0.1], repeats=5, seed=3)
    widths = {r["mean_width"] for r in rows if r["statement"] == "volume"}
    assert len(widths) > 1  # one split repeated would give one width
    assert rows == split_rows(table, 20, [0.1], repeats=5, seed=3)


def test_the_script_on_written_tables(tmp_path, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from statements_validity import main

    table = synthetic_table(60)
    table.take(range(30)).write(tmp_path / "calibration_cases.csv")
    table.take(range(30, 60)).write(tmp_path / "new_cases.csv")
    assert main([str(tmp_path / "calibration_cases.csv"), str(tmp_path / "new_cases.csv"), "-o",
                 str(tmp_path / "v"), "--repeats", "3", "--alpha", "0.1"]) == 0
    with (tmp_path / "v" / "validity.csv").open() as f:
        summary = list(csv.DictReader(f))
    assert {r["statement"] for r in summary} == {"volume", "volume_normalised", "dice", "hd95", "review"}
    assert "Spearman" in capsys.readouterr().out


def test_the_study_summary_from_committed_pieces(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from statements_results import main as results
    from statements_validity import main as validity

    for run, seed in (("a", 0), ("b", 1)):
        table = synthetic_table(40, seed)
        piece = tmp_path / run / "raw"
        table.take(range(20)).write(piece / "calibration_cases.csv")
        table.take(range(20, 40)).write(piece / "new_cases.csv")
        assert validity([str(piece / "calibration_cases.csv"), str(piece / "new_cases.csv"), "-o", str(piece),
                         "--repeats", "4", "--alpha", "0.1", "0.2"]) == 0
    assert results([str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "Runs: a, b." in text and "| raw | 0.1 | dice | s |" in text and "| raw | 0.2 |" in text
