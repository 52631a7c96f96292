"""Issue #58 item 3: the per-case path computes each thing once. The boundary band (a distance transform) of a
case was computed by the calibration scorer and again by failure detection (the same region by default)."""
from __future__ import annotations

import pytest

import mcseg.metrics.regions as regions
from mcseg.config import EvalProtocol
from mcseg.evaluate_folder import evaluate_folder
from tests.test_case_workers import folder  # noqa: F401  (the tiny MONAI folder fixture)


def test_the_boundary_band_of_a_case_is_computed_once(folder, tmp_path, monkeypatch):  # noqa: F811
    labels, pred = folder
    calls = []
    band = regions.boundary_band
    monkeypatch.setattr(regions, "boundary_band", lambda *a, **k: calls.append(1) or band(*a, **k))
    summary = evaluate_folder(pred, labels, protocol=EvalProtocol(region="boundary", bootstrap_samples=5,
                                                                  figures=False), output_dir=tmp_path / "out")
    assert summary["failure_detection"]["protocol"]["voxel_region"] == "boundary"
    assert len(calls) == summary["n_cases"]


def test_a_region_asked_for_other_maps_is_computed_for_them(folder, tmp_path):  # noqa: F811
    import torch

    from mcseg.evaluation.evaluator import Evaluator

    evaluator = Evaluator(3, ["bg", "a", "b"], EvalProtocol(region="boundary"))
    label = torch.zeros(8, 8, 4, dtype=torch.long)
    label[2:6, 2:6] = 1
    probs = torch.nn.functional.one_hot(label, 3).movedim(-1, 0).float()
    evaluator.add_case("c", probs, label, (1.0, 1.0, 1.0))
    other = torch.zeros_like(label)
    other[1:3, 1:3] = 2
    expected = regions.region_mask("boundary", other, other, (1.0, 1.0, 1.0), 2.0)
    assert torch.equal(evaluator.region_of(other, other, (1.0, 1.0, 1.0)), expected)
    assert torch.equal(evaluator.region_of(label, label, (1.0, 1.0, 1.0)),
                       regions.region_mask("boundary", label, label, (1.0, 1.0, 1.0), 2.0))
    assert not torch.equal(expected, evaluator.region_of(label, label, (1.0, 1.0, 1.0)))
