"""The plain and the weighted statements over random calibration draws under shift
(:mod:`mcseg.statements.shift_validity`): no drawn case is stated about, both cover without a shift, and under a
synthetic covariate shift the plain volume interval loses its coverage where the weighted one keeps it."""
from __future__ import annotations

import numpy as np
import pytest

from mcseg.statements.shift_validity import shift_split_rows, summarise_shift_rows
from mcseg.statements.table import CaseTable
from tests.statements.test_validity import synthetic_table


def shifted(table: CaseTable, seed: int) -> CaseTable:
    """The same cases with a larger spread, seen in a label-free feature (the relative sd) and in the error: the
    truth given the features is unchanged (covariate shift)."""
    rng = np.random.default_rng(seed)
    f = dict(table.figures)
    f["volume_sd_ml"] = f["volume_sd_ml"] * 4
    f["volume_true_ml"] = f["volume_mask_ml"] + f["volume_sd_ml"] * rng.normal(size=f["volume_sd_ml"].shape)
    return CaseTable(table.cases, table.structures, f)


def test_draws_state_only_about_cases_not_drawn_and_cover_without_shift():
    pool = synthetic_table(60, seed=3)
    rows = shift_split_rows(pool, {("clean", 0): pool}, 30, 0.2, repeats=6, seed=0)
    assert {r["n_new"] for r in rows} == {30}  # the 30 cases not drawn, never a calibration case
    for entry in summarise_shift_rows(rows):
        for key in ("coverage_plain", "coverage_weighted"):
            assert entry[key] >= 0.8 - 3 * entry[f"{key}_se"] - 0.02, (key, entry)
        assert entry["draws"] == 6 and 0 < entry["n_eff"] <= 30


def test_weighted_keeps_the_coverage_the_plain_interval_loses_under_shift():
    pool = synthetic_table(120, seed=4)
    new = shifted(pool.take(range(60, 120)), seed=5)
    half = CaseTable.join([pool.take(range(60)), new])  # the new condition: the second half, shifted
    conditions = {("spread", 1): half.take(range(60, 120))}
    rows = shift_split_rows(pool, conditions, 60, 0.1, repeats=4, seed=1)
    entry = next(e for e in summarise_shift_rows(rows) if e["statement"] == "volume")
    assert entry["coverage_plain"] < 0.6  # about 0.4: the shifted errors are 4 times larger
    assert entry["coverage_weighted"] > 0.8


def test_condition_cases_outside_the_pool_are_refused():
    pool = synthetic_table(30)
    other = CaseTable(["x"] * 30, pool.structures, pool.figures)
    with pytest.raises(ValueError, match="outside the pool"):
        shift_split_rows(pool, {("other", 1): other}, 15, 0.1, repeats=1)
