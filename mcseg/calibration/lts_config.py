"""The settings of local temperature scaling (the config node ``posthoc.lts``; :mod:`mcseg.calibration.lts` fits
it), torch-free so that ``train.py`` refuses a bad setting before torch is imported (docs/benchmarks.md,
"Start-up")."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LTSConfig", "LR_SCHEDULES"]


#: the learning-rate schedules of :class:`LTSConfig` (``lr_schedule``)
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class LTSConfig:
    """Fitting settings (the config node ``posthoc.lts``). Adam (the paper: at 1e-4); the rest is ours.

    ``patch_size``, ``steps_per_epoch`` and ``max_epochs`` left ``None`` are chosen from the fit cases' size and
    the device (:func:`mcseg.calibration.lts.resolve_config`): patches of ``lts.PATCH`` voxels a side cut to the
    largest case, epochs of 50 steps, and on a CPU as many epochs (at least 1, at most 200) as
    ``lts.CPU_VOXEL_BUDGET`` voxel passes allow; on a GPU 200. ``lr`` and ``lr_schedule`` left ``None``: 0.1 constant where the CPU budget sets the epochs
    (``lts.BUDGET_LR``), else 0.01 constant (``lts.LR``)."""

    dims: int = 3
    patch_size: list[int] | None = None
    batch_size: int = 2
    foreground_ratio: float = 0.33
    slice_axis: int = -1
    use_image: bool = False
    lr: float | None = None  # the paper (and its code) use 1e-4, which barely moves T on a small validation set
    lr_schedule: str | None = None  # constant, or cosine: lr (1 + cos(pi t / (max_epochs x steps_per_epoch))) / 2
    steps_per_epoch: int | None = None
    max_epochs: int | None = None
    patience: int = 10  # epochs without a better held-out NLL before stopping
    holdout: float = 0.2  # share of the validation cases held out for early stopping (at least one)
    floor: float = 0.05
    chunk: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dims not in (2, 3) or (self.patch_size is not None and len(self.patch_size) != self.dims):
            raise ValueError(f"LTS: patch_size={self.patch_size} does not match dims={self.dims}")
        for key in ("batch_size", "steps_per_epoch", "max_epochs", "patience", "chunk"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"LTS: {key}={getattr(self, key)}: expected >= 1")
        if self.lr_schedule is not None and self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"LTS: lr_schedule={self.lr_schedule!r}: expected one of {', '.join(LR_SCHEDULES)}")
        if not 0 < self.holdout < 1 or not (self.lr is None or self.lr > 0):
            raise ValueError(f"LTS: holdout={self.holdout} must lie in (0, 1) and lr={self.lr} be > 0")
