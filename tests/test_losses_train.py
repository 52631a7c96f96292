"""Every loss trains end to end: a tiny run each, softmax losses on the synthetic phantoms and
the multi-label losses on a BraTS region-view download, through the real trainer and evaluator."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mcseg.engine.checkpoint import load_checkpoint
from mcseg.train import train

from .conftest import CONFIG_DIR, TINY_2D
from .data.data_helpers import TINY_RUN, fake_download

LOSSES = sorted(p.stem for p in (Path(CONFIG_DIR) / "loss").glob("*.yaml"))
MULTILABEL = {"bce", "spa"}


@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_trains_and_evaluates(make_cfg, tmp_path, loss):
    if loss in MULTILABEL:
        _, overrides = fake_download("brats_regions", tmp_path)
        overrides = [o for o in overrides if not o.startswith("loss=")] + TINY_RUN
    else:
        overrides = TINY_2D + ["trainer.max_epochs=2"]
    result = train(make_cfg(overrides + [f"loss={loss}"]))
    run = tmp_path / "run"
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
