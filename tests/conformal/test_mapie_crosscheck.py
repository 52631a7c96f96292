"""On a 2-D binary task the thresholds equal MAPIE 1.6.0's SemanticSegmentationController's, for CRC and RCPS on
the same grid (reference B6): the per-image FNR table equals its ``_risks`` exactly, and the thresholds its
``best_predict_param``. MAPIE's sets are {p > t}, mcseg's {p >= t}: equal here, where no p is a grid value."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from mcseg.conformal import case_counts, control, loss_table
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
