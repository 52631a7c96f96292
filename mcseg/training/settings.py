"""What a :class:`~mcseg.training.trainer.Trainer` is given: its settings and its parts, two typed records.

:class:`TrainerSettings` holds the values read from the config (``trainer``, ``evaluation``, ``logger.images``,
the run directory, the dataset's classes and the resolved configuration stored in every checkpoint);
:class:`TrainingParts` holds the objects built from it (model, loss, optimiser, scheduler, loader, predictor,
validation cases, trackers, the distributed context). Both are frozen: a trainer reads them, and
:func:`mcseg.training.build.build_run` is where they are made (``build.trainer_settings`` from the config).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcseg.config import EvalProtocol, TrainerConfig
from mcseg.inference.predict import SegmentationPredictor
from mcseg.trackers import Trackers
from mcseg.training.distributed import DistContext

__all__ = ["TrainerSettings", "TrainingParts"]


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer's settings: ``trainer`` (the ``trainer`` config node, typed), where the run writes, the task's
    classes, the validation protocol (``evaluation``), the resolved configuration (``config`` of every
    checkpoint; a resume must match it) and how many validation cases are logged as images (``logger.images``)."""

    trainer: TrainerConfig
    run_dir: Path
    num_classes: int
    class_names: tuple[str, ...]
    protocol: EvalProtocol
    config_container: dict
    images: int = 2

    def __post_init__(self) -> None:
        t = self.trainer
        if t.monitor_mode not in ("min", "max"):
            raise ValueError(f"trainer.monitor_mode={t.monitor_mode!r}: expected 'min' or 'max'")
        if t.nonfinite not in ("stop", "skip"):
            raise ValueError(f"trainer.nonfinite={t.nonfinite!r}: expected 'stop' or 'skip'")
        if t.max_epochs < 1 or t.val_every < 1 or t.log_every_n_steps < 1:
            raise ValueError("trainer.max_epochs, trainer.val_every and trainer.log_every_n_steps must be >= 1")
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class names for num_classes={self.num_classes}")


@dataclass(frozen=True)
class TrainingParts:
    """The objects a trainer drives: built from the config by :func:`mcseg.training.build.build_run`.
    ``val_cases``: every validation case, or the first ``trainer.val_max_cases`` when capped (no
    ``full_val_every``); ``restore(case, probs)`` maps probabilities back to a case's original grid."""

    model: Any
    loss_fn: Any
    optimizer: Any
    scheduler: Any
    loader: Any
    sampler: Any
    predictor: SegmentationPredictor
    val_cases: list
    restore: Callable
    trackers: Trackers
    dist: DistContext = field(default_factory=DistContext)
