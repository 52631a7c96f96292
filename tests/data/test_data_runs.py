"""One-epoch runs on every dataset's download layout, and evaluation in the original geometry."""
from __future__ import annotations

import json
import math

import nibabel as nib
import numpy as np
import pytest
import torch
from .data_helpers import TINY_RUN, build, fake_download


@pytest.mark.parametrize("name", ["acdc", "flare", "brats_regions", "prostate", "mrbrains2018", "nnunet"])
def test_one_epoch_run_writes_predictions_in_the_original_geometry(make_cfg, tmp_path, name):
    from mcseg.train import train

    root, overrides = fake_download(name, tmp_path)
    cfg = make_cfg(overrides + TINY_RUN)
    result = train(cfg)
    run = tmp_path / "run"
    split = json.loads((run / "split.json").read_text())
    summary = json.loads((run / "eval/test/summary.json").read_text())
    assert math.isfinite(result["test/mean_foreground_dice"]) and summary["n_cases"] == len(split["test"])
    dataset, _ = build(make_cfg, overrides)
    refs = {r.case_id: r for r in dataset.case_refs()}
    for case_id in split["test"]:
        pred = nib.load(str(run / "eval/test/predictions" / f"{case_id}.nii.gz"))
        image = nib.load(str(refs[case_id].image_paths[0]))
        assert pred.shape[:3] == image.shape[:3]
        np.testing.assert_allclose(pred.affine, image.affine, atol=1e-5)


def _perfect_predictor(dataset, cfg):
    """A predictor whose logits are the case's own (network-space) label."""
    from mcseg.config import InferenceConfig
    from mcseg.inference.predict import SegmentationPredictor

    link = torch.sigmoid if dataset.multilabel else (lambda x: torch.softmax(x, 1))
    predictor = SegmentationPredictor(torch.nn.Identity(), cfg.dataset.sampling.dims, 1, link, dataset.multilabel,
                                      InferenceConfig(), list(cfg.dataset.sampling.patch_size), "32",
                                      torch.device("cpu"))

    def logits(case):
        label = torch.from_numpy(np.asarray(case.label).astype(np.int64))
        if dataset.multilabel:
            return (2.0 * label - 1) * 30
        return torch.nn.functional.one_hot(label, dataset.num_classes).movedim(-1, 0).float() * 30

    predictor.logits = logits
    return predictor


@pytest.mark.parametrize("name", ["acdc", "flare", "brats", "brats_regions", "prostate", "mrbrains", "nnunet"])
def test_evaluation_of_a_perfect_prediction_gives_dice_1_and_hd95_0(make_cfg, tmp_path, name):
    """Through the evaluator: restore() maps probabilities and labels back to each file's grid exactly."""
    from mcseg.config import typed
    from mcseg.config import EvalProtocol
    from mcseg.evaluation.split import evaluate_split

    root, overrides = fake_download(name, tmp_path)
    dataset, cfg = build(make_cfg, overrides + ["dataset.preprocess.target_spacing=null"])
    protocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    refs = dataset.case_refs()[:3]
    summary = evaluate_split(_perfect_predictor(dataset, cfg), dataset, refs, protocol, tmp_path / "eval", True, False)
    assert summary["mean_foreground_dice"] == pytest.approx(1.0, abs=1e-9)
    assert summary["mean_foreground_hd95_mm"] == pytest.approx(0.0, abs=1e-9)
    for ref in refs:
        pred = nib.load(str(tmp_path / "eval/predictions" / f"{ref.case_id}.nii.gz"))
        np.testing.assert_allclose(pred.affine, nib.load(str(ref.image_paths[0])).affine, atol=1e-5)


@pytest.mark.slow
def test_a_second_run_reuses_the_cache(make_cfg, tmp_path, monkeypatch):
    import mcseg.data.base as base
    from mcseg.train import train

    root, overrides = fake_download("acdc", tmp_path)
    calls = []
    original = base.forward
    monkeypatch.setattr(base, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    train(make_cfg(overrides + TINY_RUN, output_dir=tmp_path / "first"))
    first = len(calls)
    assert first >= 20  # train, validation and test cases
    train(make_cfg(overrides + TINY_RUN, output_dir=tmp_path / "second"))
    assert len(calls) == first
    train(make_cfg(overrides + TINY_RUN + ["dataset.preprocess.target_spacing=[1.4,1.4,null]"],
                   output_dir=tmp_path / "third"))
    assert len(calls) == 2 * first


def test_acdc_run_tests_on_the_testing_patients_and_validates_by_patient(make_cfg, tmp_path):
    from mcseg.data.build import resolve_split

    root, overrides = fake_download("acdc", tmp_path)
    dataset, cfg = build(make_cfg, overrides)
    split = resolve_split(dataset, cfg.dataset, tmp_path / "run").refs
    test = [r.case_id for r in split["test"]]
    assert test == [f"patient{p}_{f}" for p in (101, 102, 103, 104) for f in ("ED", "ES")]
    val_patients = {r.case_id[:10] for r in split["val"]}
    train_patients = {r.case_id[:10] for r in split["train"]}
    assert len(val_patients) == 2 and not val_patients & train_patients
    assert len(split["val"]) == 4 and len(split["train"]) == 16


@pytest.mark.slow
def test_a_region_based_nnunet_run_is_evaluated_again(make_cfg, tmp_path):
    """Issue #34 section 3, region-based nnU-Net: training evaluated its test split, but evaluate.py refused the
    run ("the model takes 2 input channel(s) and predicts 3 classes, but dataset nnunet has 2 channel(s) and 3
    classes (multi-label)"): its stored config says multilabel: null (read from dataset.json), taken for false."""
    from mcseg.evaluate import evaluate
    from mcseg.train import train

    _, overrides = fake_download("nnunet_regions", tmp_path)
    train(make_cfg(overrides + TINY_RUN + ["evaluation.bootstrap_samples=10"]))
    run = tmp_path / "run"
    summary = evaluate(make_cfg(["evaluation.bootstrap_samples=10", "save_predictions=false", f"ckpt={run}",
                                 "split=val", "posthoc.apply=[]"], config_name="evaluate", output_dir=tmp_path / "job"))
    assert summary["provenance"]["output_dir"] == str(run / "eval" / "val")
    assert "whole" in summary["per_class"] and math.isfinite(summary["mean_ece"])
