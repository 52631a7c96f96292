"""The trainer's settings are one typed, frozen record (mcseg.training.settings), checked when made."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mcseg.config import EvalProtocol, TrainerConfig
from mcseg.training.settings import TrainerSettings


def _settings(**trainer) -> TrainerSettings:
    return TrainerSettings(trainer=TrainerConfig(**trainer), run_dir=Path("run"), num_classes=2,
                           class_names=("background", "a"), protocol=EvalProtocol(), config_container={})


@pytest.mark.parametrize(("key", "value", "message"), [
    ("monitor_mode", "up", r"trainer.monitor_mode='up': expected 'min' or 'max'"),
    ("nonfinite", "ignore", r"trainer.nonfinite='ignore': expected 'stop' or 'skip'"),
    ("max_epochs", 0, r"trainer.max_epochs, trainer.val_every and trainer.log_every_n_steps must be >= 1"),
])
def test_bad_trainer_settings_are_refused_with_their_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        _settings(**{key: value})


def test_settings_are_frozen_and_name_their_classes():
    settings = _settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.images = 5
    with pytest.raises(ValueError, match="1 class names for num_classes=2"):
        dataclasses.replace(settings, class_names=("background",))
