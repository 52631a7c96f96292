"""Regression answers, kept as MONAI's integration tests keep theirs: the figures of tiny deterministic CPU
runs (training loss per epoch, test Dice, ECE and classwise ECE) stored in ``tests/answers/*.json``.

A change that moves them fails the test until the answers are updated **in the same commit**, whose
message says why the numbers moved::

    MCSEG_UPDATE_ANSWERS=1 .venv/bin/python -m pytest tests/test_losses_train.py

Runs are pinned to one torch thread (the thread count orders float reductions). The tolerances cover
another CPU's kernels (measured: see ``TOLERANCE``) and nothing a change of code would move: a changed
default, sample, augmentation or metric moves these figures by far more.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from mcseg.inference.build import load_checkpoint

ANSWERS_DIR = Path(__file__).resolve().parent / "answers"
UPDATE = os.environ.get("MCSEG_UPDATE_ANSWERS") == "1"
# Relative tolerance of the training losses, absolute of the test figures. Measured: the same runs on two
# threads instead of one moved the losses by at most 8e-8 (relative) and the figures by 5e-9.
TOLERANCE = {"train_loss": 1e-5, "figures": 1e-5}
FIGURES = ("mean_foreground_dice", "mean_ece", "mean_classwise_ece")


def observed(run: Path) -> dict:
    """What a finished run measured: its mean training loss per epoch and its test split's figures."""
    history = load_checkpoint(run / "checkpoints" / "last.pt")["history"]
    summary = json.loads((run / "eval" / "test" / "summary.json").read_text())
    return {"train_loss": [h["train/loss"] for h in history], **{k: summary[k] for k in FIGURES}}


def _close(expected: float | None, actual: float | None, tol: float, relative: bool) -> bool:
    if expected is None or actual is None or (isinstance(expected, float) and math.isnan(expected)):
        return expected is actual or (expected is not None and actual is not None and math.isnan(actual))
    return abs(actual - expected) <= tol * (max(abs(expected), 1e-12) if relative else 1.0)


def check_answers(book: str, key: str, values: dict) -> None:
    """Compare ``values`` with the stored answer ``key`` of ``tests/answers/<book>.json`` (or store it
    under MCSEG_UPDATE_ANSWERS=1)."""
    path = ANSWERS_DIR / f"{book}.json"
    answers = json.loads(path.read_text()) if path.is_file() else {}
    if UPDATE:
        answers[key] = values
        path.write_text(json.dumps(dict(sorted(answers.items())), indent=1) + "\n")
        return
    assert key in answers, (f"no regression answer {key!r} in {path}: run with MCSEG_UPDATE_ANSWERS=1 and commit "
                            "the answers")
    expected = answers[key]
    moved = []
    losses_e, losses_a = expected["train_loss"], values["train_loss"]
    if len(losses_e) != len(losses_a) or not all(
            _close(e, a, TOLERANCE["train_loss"], True) for e, a in zip(losses_e, losses_a)):
        moved.append(f"train_loss {losses_e} -> {losses_a}")
    for name in FIGURES:
        if not _close(expected[name], values[name], TOLERANCE["figures"], False):
            moved.append(f"{name} {expected[name]} -> {values[name]}")
    assert not moved, (f"{key}: the numbers moved ({'; '.join(moved)}). If the change meant to move them, update the "
                       f"answers in the same commit (MCSEG_UPDATE_ANSWERS=1, tests/regression.py) and say why in "
                       f"its message")
