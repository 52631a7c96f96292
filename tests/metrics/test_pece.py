"""pECE (issue #49): values by hand (edges, the empty p = 0, the offset), against a re-derivation of the SDC
authors' ``metrics.pECE`` loop, and written by the evaluator in per_case.csv and summary.json."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from mcseg.config import EvalProtocol
from mcseg.evaluation.evaluator import Evaluator
from mcseg.metrics.pece import pece
from tests.metrics.reference import blobs


def test_by_hand():
    # p = 0 is in no bin but counts in N = 5; bin (0, .1]: 0.05 (background): |0.05 - 0 + 2 x 0.05| = 0.15;
    # bin (.1, .2]: 0.15 (foreground): |0.15 - 1| = 0.85; bin (.9, 1]: 0.95 (fg), 1.0 (bg): |0.975 - 0.5 + 2 x 1|
    p = torch.tensor([0.0, 0.05, 0.15, 0.95, 1.0], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 0]).bool()
    assert pece(p, y) == pytest.approx((0.15 + 0.85) / 5 + 2 * 2.475 / 5, rel=1e-12)
    assert pece(p, y, fp_weight=0.0) == pytest.approx((0.05 + 0.85) / 5 + 2 * 0.475 / 5, rel=1e-12)
    # an edge belongs to the bin below: 0.1 is in (0, 0.1], 0.2 in (0.1, 0.2]
    assert pece(torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([True, True])) == pytest.approx(
        (0.9 + 0.8) / 2, rel=1e-12)
    assert pece(torch.tensor([0.1, 0.2]), torch.tensor([True, True]), n_bins=1) == pytest.approx(
        abs(0.15 - 1.0), rel=1e-6)
    assert math.isnan(pece(torch.zeros(0), torch.zeros(0).bool()))


def authors_pece(probs: np.ndarray, labels: np.ndarray, bins: int = 10, fp_weight: float = 2.0) -> float:
    """``metrics.pECE``: foreground confidence 1 - p_0 (float32), loop over (lo, hi] bins of linspace(0, 1)."""
    p = (1.0 - probs[0]).reshape(-1)
    y = (labels != 0).astype(np.float32).reshape(-1)
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (p > lo) & (p <= hi)
        if not m.any():
            continue
        fp = m & (y == 0)
        offset = fp_weight * (float(p[fp].mean()) if fp.any() else 0.0)
        out += m.sum() / p.size * abs(float(p[m].mean()) - float(y[m].mean()) + offset)
    return float(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_the_authors_loop(seed):
    label = blobs((12, 10, 8), 3, seed=seed)
    g = torch.Generator().manual_seed(seed)
    logits = torch.nn.functional.one_hot(label, 3).movedim(-1, 0).float() * 2 + torch.randn(3, 12, 10, 8, generator=g)
    logits[0, :2] = 40.0  # saturated background: p_fg = 0 in no bin
    probs = torch.softmax(logits, 0)
    ours = pece(1.0 - probs[0], label != 0)
    theirs = authors_pece(probs.numpy(), label.numpy())
    assert ours == pytest.approx(theirs, rel=1e-5)  # their bin means are float32 sums
    assert ours != pytest.approx(authors_pece(probs.numpy(), label.numpy(), fp_weight=0.0), rel=1e-3)


@pytest.mark.parametrize("multilabel", [False, True])
def test_the_evaluator_writes_it_per_case_and_in_the_summary(tmp_path, multilabel):
    names = ["a", "b"] if multilabel else ["bg", "a", "b"]
    ev = Evaluator(len(names), names, EvalProtocol(bootstrap_samples=10, figures=False), multilabel=multilabel)
    expected = []
    for index in range(2):
        label = blobs((12, 10, 8), 3, seed=index)
        g = torch.Generator().manual_seed(index)
        if multilabel:
            label = torch.stack([label == 1, label >= 1]).long()
            probs = torch.rand(2, 12, 10, 8, generator=g)
            expected.append(np.mean([pece(probs[r], label[r] > 0) for r in range(2)]))
        else:
            probs = torch.softmax(torch.randn(3, 12, 10, 8, generator=g) * 2, 0)
            expected.append(authors_pece(probs.numpy(), label.numpy()))
        ev.add_case(f"c{index}", probs, label, (1.0, 1.0, 1.0))
    ev.write(tmp_path)
    with open(tmp_path / "per_case.csv") as fh:
        rows = list(csv.DictReader(fh))
    per_case = {row["case"]: float(row["pece"]) for row in rows}
    assert [per_case["c0"], per_case["c1"]] == pytest.approx(expected, rel=1e-5)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mean_pece"] == pytest.approx(np.mean(expected), rel=1e-5)
    assert summary["calibration"]["pece"]["mean"] == summary["mean_pece"]
    assert "bins" in summary["protocol"]["pece"] and "2" in summary["protocol"]["pece"]


def test_pece_of_the_background_probability_equals_pece_of_its_complement_across_chunks(monkeypatch):
    """The evaluation passes p_0 and the label map (no full-size copies); chunked sums equal one pass."""
    import torch

    from mcseg.metrics import pece as module

    gen = torch.Generator().manual_seed(3)
    p0 = torch.rand(7, 9, 11, generator=gen)
    label = torch.randint(0, 3, (7, 9, 11), generator=gen)
    whole = module.pece(1.0 - p0, label != 0)
    monkeypatch.setattr(module, "CHUNK", 200)  # 693 voxels in slabs of two rows (198 voxels)
    assert module.pece(p0, label, of_background=True) == pytest.approx(whole, abs=1e-12)
    assert module.pece(1.0 - p0, label != 0) == pytest.approx(whole, abs=1e-12)
