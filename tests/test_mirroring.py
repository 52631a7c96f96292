"""Test-time mirroring (``inference.mirror_axes``): the averaged logits, the checks, and where it applies."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from mcseg.inference import volume as inference
from mcseg.inference.volume import mirror_combinations, predict_logits
from mcseg.config import InferenceConfig
from mcseg.inference.predict import SegmentationPredictor
from mcseg.errors import ConfigError
from mcseg.evaluate import evaluate
from mcseg.train import train
from tests.conftest import TINY_3D, compose_config


def test_mirror_combinations_are_every_non_empty_subset_as_batch_dims():
    assert mirror_combinations([]) == []
    assert mirror_combinations([1]) == [(3,)]
    assert sorted(mirror_combinations([0, 1, 2])) == sorted(
        [(2,), (3,), (4,), (2, 3), (2, 4), (3, 4), (2, 3, 4)])


@pytest.mark.parametrize("axes", [[0], [0, 2], [0, 1, 2]])
def test_3d_logits_are_the_mean_over_flipped_passes(axes):
    torch.manual_seed(0)
    net = torch.nn.Conv3d(1, 3, kernel_size=3, padding=1).eval()  # a random, asymmetric kernel
    image = torch.randn(1, 16, 16, 16)
    cfg = InferenceConfig(mirror_axes=axes, overlap=0.0)
    got = predict_logits(net, image, 3, 1, cfg, roi_size=[16, 16, 16])
    # the mean written out by hand over the 2^n subsets (the empty one included)
    subsets = [[]] + [list(c) for c in mirror_combinations(axes)]
    with torch.no_grad():
        want = sum(net(image[None].flip(s)).flip(s) if s else net(image[None]) for s in subsets)[0] / len(subsets)
    assert len(subsets) == 2 ** len(axes)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = predict_logits(net, image, 3, 1, InferenceConfig(overlap=0.0), roi_size=[16, 16, 16])
    assert not torch.allclose(got, plain, atol=1e-3)  # the flips change the result of an asymmetric kernel


def test_2d_slices_are_mirrored_in_plane():
    torch.manual_seed(0)
    net = torch.nn.Conv2d(1, 2, kernel_size=3, padding=1).eval()
    image = torch.randn(1, 6, 16, 16)  # 6 slices across axis 0
    got = predict_logits(net, image, 2, 1, InferenceConfig(mirror_axes=[1]), roi_size=[16, 16], slice_axis=0)
    with torch.no_grad():
        slices = image.movedim(1, 0)  # 6 x 1 x 16 x 16
        want = ((net(slices) + net(slices.flip(3)).flip(3)) / 2).movedim(0, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axes", [[3], [0, 0], [-1]])
def test_mirror_axes_outside_the_network_are_refused(make_cfg, tmp_path, axes):
    cfg = make_cfg([*TINY_3D, f"inference.mirror_axes={axes}"], output_dir=tmp_path / "run")
    with pytest.raises(ValueError, match=r"inference\.mirror_axes=.*each in \[0, 3\)"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.fixture(scope="module")
def mirrored_run(tmp_path_factory):
    """One tiny 3D run with test-time mirroring over axes 0 and 1 (and the default post-hoc temperature),
    with the mirror axes of every predict_logits call recorded in order."""
    run = tmp_path_factory.mktemp("mirroring") / "run"
    seen = []
    real = inference.predict_logits

    def spy(model, image, dims, divisor, cfg, *args, **kwargs):
        seen.append(list(cfg.mirror_axes))
        return real(model, image, dims, divisor, cfg, *args, **kwargs)

    cfg = compose_config("train", [*TINY_3D, "inference.mirror_axes=[0,1]"], run)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("mcseg.inference.predict.predict_logits", spy)
        train(cfg)
    return SimpleNamespace(path=run, seen=seen, epochs=int(cfg.trainer.max_epochs),
                           split=json.loads((run / "split.json").read_text()))


def test_validation_runs_unmirrored_and_the_posthoc_fit_and_test_mirrored(mirrored_run):
    """best.pt is selected on plain validation predictions (nnU-Net's habit, and 1/2^n of the cost);
    the post-hoc fit sees the logits the test is scored on, and the test's provenance says so."""
    val_cases, test_cases = len(mirrored_run.split["val"]), len(mirrored_run.split["test"])
    during_training = mirrored_run.epochs * val_cases
    assert mirrored_run.seen[:during_training] == [[]] * during_training
    assert mirrored_run.seen[during_training:] == [[0, 1]] * (val_cases + test_cases)
    summary = json.loads((mirrored_run.path / "eval" / "test" / "summary.json").read_text())
    assert summary["provenance"]["inference"]["mirror_axes"] == [0, 1]


def test_plain_is_the_same_predictor_without_flips():
    cfg = InferenceConfig(mirror_axes=[0, 2])
    predictor = SegmentationPredictor(torch.nn.Identity(), 3, 1, lambda z: z.softmax(1), False, cfg, None, "32",
                                      torch.device("cpu"))
    plain = predictor.plain()
    assert plain.cfg.mirror_axes == [] and plain.model is predictor.model and predictor.cfg.mirror_axes == [0, 2]
    assert plain.plain() is plain


@pytest.mark.slow
def test_evaluate_mirrors_a_saved_checkpoint_as_asked(mirrored_run, make_cfg, tmp_path):
    """evaluate.py mirror_axes=[...]: another mirroring than the run's, without the run's scalers
    (fitted on the run's own mirroring), refused in one line if they are asked for."""
    run = mirrored_run.path

    def evaluate_with(*extra):
        cfg = make_cfg([f"ckpt={run}/checkpoints/best.pt", "split=val", *extra], config_name="evaluate",
                       output_dir=tmp_path / "evaluate")
        return evaluate(cfg)

    with pytest.raises(ConfigError, match=r"config key 'mirror_axes'=\[0, 2\].*posthoc\.apply=\[\]"):
        evaluate_with("mirror_axes=[0,2]", f"eval_dir={tmp_path}/refused")
    assert not (tmp_path / "refused").exists()
    own = evaluate_with(f"eval_dir={tmp_path}/own", "posthoc.apply=[]")
    plain = evaluate_with("mirror_axes=[]", "posthoc.apply=[]", f"eval_dir={tmp_path}/plain")
    mirrored = evaluate_with("mirror_axes=[0,2]", "posthoc.apply=[]", f"eval_dir={tmp_path}/mirrored")
    assert own["provenance"]["inference"]["mirror_axes"] == [0, 1]
    assert plain["provenance"]["inference"]["mirror_axes"] == []
    assert mirrored["provenance"]["inference"]["mirror_axes"] == [0, 2]
    assert len({own["mean_nll"], plain["mean_nll"], mirrored["mean_nll"]}) == 3


@pytest.mark.parametrize("overrides, unseen", [
    (["inference.tta=[flips]", "dataset.sampling.flip_axes=[]"], "[0, 1, 2] (tta=[flips])"),
    (["inference.mirror_axes=[0,1]", "dataset.sampling.flip_axes=[0]"], "[1] (inference.mirror_axes=[0, 1])"),
    (["inference.tta=[flips]", "dataset.sampling.flip_axes=[0,1,2]"], None),
    (["inference.tta=[noise]", "dataset.sampling.flip_axes=[]"], None),
])
def test_flips_that_training_never_made_are_warned_of(make_cfg, tmp_path, caplog, overrides, unseen):
    """A network trained without flips sees its TTA or mirrored views for the first time at test time (on the
    hippocampus study's networks every flipped view lost the structure): say so when the predictor is built."""
    from mcseg.inference.build import build_predictor

    cfg = make_cfg([*TINY_3D, *overrides], output_dir=tmp_path / "run")
    model = torch.nn.Conv3d(1, 2, 1)
    loss = SimpleNamespace(probabilities=lambda z: torch.softmax(z, 1), multilabel=False)
    inference_cfg = InferenceConfig(**{k: cfg.inference[k] for k in ("tta", "mirror_axes")})
    with caplog.at_level("WARNING", logger="mcseg.inference.build"):
        build_predictor(cfg, model, loss, torch.device("cpu"), inference_cfg, "32")
    if unseen is None:
        assert "never flipped" not in caplog.text
    else:
        assert f"flips the network's axes {unseen}, which training never flipped" in caplog.text
