"""Every loss trains end to end: a tiny run each, softmax losses on the synthetic phantoms and
the multi-label losses on a BraTS region-view download, through the real trainer and evaluator."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mcseg.inference.build import load_checkpoint
from mcseg.train import train

from .conftest import CONFIG_DIR, TINY_2D, TINY_3D
from .regression import check_answers, observed
from .data.data_helpers import TINY_RUN, fake_download

LOSSES = sorted(p.stem for p in (Path(CONFIG_DIR) / "loss").glob("*.yaml"))
MULTILABEL = {"bce", "spa"}


# Pinned for the regression answers (tests/regression.py): deterministic, one torch thread.
EXACT = ["trainer.deterministic=true"]
# The 3D runs: one per family whose code differs in 3D (spatial kernels, Dice over a volume, the margin, the
# per-image binning of mL1-ACE, the boundary kernel of the Dice semimetric loss, AdaFocal's voxel subsample).
LOSSES_3D = ("ce", "ce_dice", "margin", "svls", "nacl", "hardl1ace_dice_ce", "softl1ace_ce", "ce_dml_boundary",
             "adafocal")
# a 3D answer's key -> its overrides (default: loss=<key>)
OVERRIDES_3D = {"ce_dml_boundary": ["loss=ce_dml", "loss.boundary_epsilon=0.1"]}


# The default run trains the field's baseline, the margin loss and a multi-label loss; every other loss trains in
# the slow run (CI runs both), which keeps the default run under 15 minutes on 2 cores.
QUICK = {"ce", "margin", "bce"}


@pytest.mark.parametrize("loss", [pytest.param(loss, marks=() if loss in QUICK else pytest.mark.slow)
                                  for loss in LOSSES])
def test_every_loss_trains_and_evaluates(make_cfg, tmp_path, loss, one_thread):
    """...and reproduces its regression answer (tests/answers/loss_runs.json)."""
    if loss in MULTILABEL:
        _, overrides = fake_download("brats_regions", tmp_path)
        overrides = [o for o in overrides if not o.startswith("loss=")] + TINY_RUN
    else:
        overrides = TINY_2D + ["trainer.max_epochs=2"]
    result = train(make_cfg(overrides + EXACT + [f"loss={loss}"]))
    run = tmp_path / "run"
    check_answers("loss_runs", f"{loss}_2d", observed(run))
    summary = json.loads((run / "eval/test/summary.json").read_text())
    assert math.isfinite(result["test/mean_foreground_dice"])
    assert 0 <= summary["mean_ece"] <= 1
    state = load_checkpoint(run / "checkpoints/last.pt")
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    if loss in MULTILABEL:  # per-region evaluation of the link's probabilities
        assert summary["multilabel"] is True
        assert set(summary["per_class"]) == {"WT", "TC", "ET"}
    if loss == "cals":  # the validation pass reached the multiplier update, and its state is checkpointed
        assert bool(state["loss"]["has_prev_constraint"])
        assert torch.all(state["loss"]["prev_constraint"] != 0)
        assert state["loss"]["lambd"].shape == (4,)
    if loss == "crac":  # multipliers per class and region (boundary first), updated and checkpointed
        assert state["loss"]["lambd"].shape == (8,) and bool(state["loss"]["has_prev_constraint"])
        assert torch.all(state["loss"]["lambd"] > 1e-6)
    if loss == "sdc":  # the SDC authors' metric is a figure of every evaluation
        assert summary["mean_pece"] >= 0
    if loss == "adafocal":  # every validation updated the gammas and bins, and they are checkpointed
        assert int(state["loss"]["updates"]) >= 1
        assert state["loss"]["gamma"].shape == (15,) and state["loss"]["edges"].shape == (16,)
        assert not torch.equal(state["loss"]["gamma"], torch.ones(15, dtype=torch.float64))


@pytest.mark.slow
@pytest.mark.parametrize("loss", LOSSES_3D)
def test_losses_in_3d_reproduce_their_answers(make_cfg, tmp_path, loss, one_thread):
    train(make_cfg(TINY_3D + EXACT + ["trainer.max_epochs=2", *OVERRIDES_3D.get(loss, [f"loss={loss}"])]))
    check_answers("loss_runs", f"{loss}_3d", observed(tmp_path / "run"))


def test_a_moved_answer_fails_naming_what_moved(monkeypatch, tmp_path):
    from tests import regression

    monkeypatch.setattr(regression, "ANSWERS_DIR", tmp_path)
    monkeypatch.setattr(regression, "UPDATE", False)
    answer = {"train_loss": [1.5, 1.2], "mean_foreground_dice": 0.5, "mean_ece": 0.2, "mean_classwise_ece": 0.1}
    (tmp_path / "book.json").write_text(json.dumps({"case": answer}))
    check_answers("book", "case", {**answer, "train_loss": [1.5, 1.2 * (1 + 1e-6)]})  # within the tolerance
    with pytest.raises(AssertionError, match="mean_ece 0.2 -> 0.21"):
        check_answers("book", "case", {**answer, "mean_ece": 0.21})
    with pytest.raises(AssertionError, match="train_loss"):
        check_answers("book", "case", {**answer, "train_loss": [1.5, 1.21]})
    with pytest.raises(AssertionError, match="no regression answer 'other'"):
        check_answers("book", "other", answer)
