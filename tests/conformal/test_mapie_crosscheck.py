"""On a 2-D binary task the thresholds equal MAPIE 1.6.0's SemanticSegmentationController's, for CRC and RCPS on
the same grid (reference B6): the per-image FNR table equals its ``_risks`` exactly, and the thresholds its
``best_predict_param``; for Learn-then-Test, the end of the valid thresholds each loss takes is MAPIE's. MAPIE's sets
are {p > t}, mcseg's {p >= t}: equal here, where no p is a grid value."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from mcseg.conformal import CaseSummary, ConformalSettings, case_counts, control, fit_thresholds, loss_table
from mcseg.conformal.risks import CaseCounts

mapie = pytest.importorskip("mapie.risk_control")


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(11)
    n, h, w = 100, 16, 16
    logits = rng.normal(size=(n, 1, h, w)) * 2.5 + rng.normal(size=(n, 1, 1, 1))
    p = 1 / (1 + np.exp(-logits))
    y = (rng.random(p.shape) < p).astype(int)
    y[:, 0, 0, 0] = 1  # MAPIE requires a positive in every image
    grid = np.arange(0, 1, 0.01)
    assert not np.isin(p, grid).any()
    counts = CaseCounts.stack([case_counts(torch.from_numpy(p[i]), torch.from_numpy(y[i]).bool(),
                                           torch.from_numpy(grid)) for i in range(n)])
    table, _ = loss_table(counts, 0, "fnr")
    return p, y, grid, table


@pytest.mark.parametrize("method,bound", [("crc", None), ("rcps", "wsr"), ("rcps", "hoeffding"),
                                          ("rcps", "bernstein")])
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_thresholds_equal_mapies_semantic_segmentation_controller(images, method, bound, alpha):
    p, y, grid, table = images
    kw = {} if method == "crc" else {"confidence_level": 0.9, "rcps_bound": bound}
    controller = mapie.SemanticSegmentationController(predict_function=lambda x: x, risk="recall", method=method,
                                                      target_level=1 - alpha, predict_params=grid, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        controller.calibrate(p, y)
    mapie_controlled = not any("cannot be controlled" in str(w.message) for w in caught)
    np.testing.assert_array_equal(table, controller._risks)
    ours = control(table, grid, "fnr", method, alpha, delta=0.1 if method == "rcps" else None,
                   rcps_bound=bound or "wsr")
    assert ours.threshold == float(np.atleast_1d(controller.best_predict_param)[0])
    assert ours.controlled == mapie_controlled
    if bound in (None, "wsr") or alpha == 0.2:  # Hoeffding and Bernstein cannot control alpha = 0.1 with n = 100
        assert ours.controlled and 0.05 < ours.threshold < 0.95  # not an end of the grid: the comparison says something


@pytest.fixture(scope="module")
def images_with_sets():
    """The images above with one sure positive pixel each (p = 0.999), so that no set on the grid [0, 0.98] is
    empty and the FDR is MAPIE's 1 - precision at every threshold; the FNR and FDR tables of mcseg."""
    rng = np.random.default_rng(11)
    n, h, w = 100, 16, 16
    logits = rng.normal(size=(n, 1, h, w)) * 2.5 + rng.normal(size=(n, 1, 1, 1))
    p = 1 / (1 + np.exp(-logits))
    y = (rng.random(p.shape) < p).astype(int)
    y[:, 0, 0, 0], p[:, 0, 0, 0] = 1, 0.999
    grid = np.arange(0, 0.99, 0.01)
    assert not np.isin(p, grid).any()
    counts = CaseCounts.stack([case_counts(torch.from_numpy(p[i]), torch.from_numpy(y[i]).bool(),
                                           torch.from_numpy(grid)) for i in range(n)])
    summaries = CaseSummary([f"case_{i}" for i in range(n)], grid, counts, np.full((n, 1, 2), np.nan),
                            np.zeros((n, 1)))
    return p, y, grid, summaries


def _both_ways(summaries, loss: str, alpha: float, delta: float) -> float:
    """LTT's threshold by :func:`control` and by :func:`fit_thresholds` (the route of the evaluation): equal."""
    table, _ = loss_table(summaries.counts, 0, loss)
    direct = control(table, summaries.thresholds, loss, "ltt", alpha, delta=delta)
    fitted = fit_thresholds(summaries, ConformalSettings(alpha=alpha, delta=delta, method="ltt", loss=loss,
                                                         classes=[0]))[0]
    assert direct.controlled and fitted["threshold"] == direct.threshold
    return direct.threshold


@pytest.mark.parametrize("alpha", [0.2, 0.3])
def test_ltt_takes_the_end_of_the_valid_thresholds_that_mapie_takes(images_with_sets, alpha):
    """Learn-then-Test returns one end of MAPIE's valid thresholds: for the FDR the smallest valid one (the
    largest set), MAPIE's own choice for precision (SemanticSegmentationController, risk='precision', whose LTT
    takes the smallest valid lambda); for the FNR the largest valid one of MAPIE's ``ltt_procedure`` (the
    smallest set, the choice MAPIE's CRC and RCPS make for recall). On these tables both ends differ, so the
    wrong end (min for the FNR, max for the FDR) fails."""
    p, y, grid, summaries = images_with_sets
    delta = 0.1
    controller = mapie.SemanticSegmentationController(predict_function=lambda x: x, risk="precision",
                                                      method="ltt", target_level=1 - alpha,
                                                      confidence_level=1 - delta, predict_params=grid)
    controller.calibrate(p, y)
    fdr, _ = loss_table(summaries.counts, 0, "fdr")
    np.testing.assert_allclose(fdr, controller._risks, rtol=0, atol=1e-12)  # the same losses ...
    valid = controller.valid_index[0]
    assert grid[min(valid)] < grid[max(valid)]  # ... and ends that differ
    assert _both_ways(summaries, "fdr", alpha, delta) == float(np.atleast_1d(controller.best_predict_param)[0]) \
        == grid[min(valid)]

    from mapie.risk_control._base_controller import ltt_procedure

    fnr, _ = loss_table(summaries.counts, 0, "fnr")
    valid, _ = ltt_procedure(fnr.mean(0)[None], np.array([[alpha]]), delta, np.full((1, len(grid)), len(fnr)))
    assert grid[min(valid[0])] < grid[max(valid[0])]
    assert _both_ways(summaries, "fnr", alpha, delta) == grid[max(valid[0])]
