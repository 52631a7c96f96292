"""Shared machinery of the mcseg losses: argument checks, input checks, masking, reductions.

Every softmax loss derives from :class:`SegmentationLoss` and implements
``compute(logits, target, valid)``; ``forward`` does the rest:

* autocast is switched off and the logits are cast to float32 (float64 stays float64,
  so ``torch.autograd.gradcheck`` works), so a loss is never computed in half precision;
* the input layout is checked: logits ``B x C x spatial`` (1 to 3 spatial dims), target
  ``B x spatial`` integer labels (a ``B x 1 x spatial`` target is accepted and squeezed);
* labels equal to ``ignore_index`` are replaced by 0 in the target handed to ``compute``
  and flagged in ``valid`` (``B x spatial`` bool, ``None`` when nothing is ignored), so a
  loss gathers/one-hots safely and masks BOTH its data term and its penalty with ``valid``;
* labels outside ``[0, C - 1]`` raise ``ValueError``. This range check reads the target's
  minimum and maximum back to the host (on a GPU, a synchronisation per call);
  :func:`target_checks` switches it off for a block, as the trainer does after a run's first
  step (the datasets check label values when they load a case).

Reductions: ``"mean"`` is the mean over non-ignored voxels; per-voxel losses also accept
``"sum"`` (sum over non-ignored voxels). If every voxel is ignored the mean is 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "SegmentationLoss",
    "check_bool",
    "check_choice",
    "check_float",
    "check_ignore_index",
    "check_int",
    "check_layout",
    "compute_dtype",
    "masked_mean",
    "masked_sum",
    "no_autocast",
    "one_hot",
    "hard_label_only",
    "is_soft_target",
    "target_checks",
]


# ---------------------------------------------------------------- argument validation
def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> float:
    """Return ``value`` as a float or raise ``ValueError`` naming ``name`` and ``value``.

    ``low``/``high`` bound the value, closed unless ``low_open``/``high_open``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__}).")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}.")
    if high is not None and (v > high or (high_open and v == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value!r}.")
    return v


def check_int(name: str, value: Any, *, low: int | None = None, odd: bool = False) -> int:
    """Return ``value`` as an int (bools rejected) or raise ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}.")
    if odd and value % 2 == 0:
        raise ValueError(f"{name} must be odd, got {value!r}.")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r} ({type(value).__name__}).")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
    return value


def check_ignore_index(value: Any) -> int | None:
    if value is None:
        return None
    return check_int("ignore_index", value)


# ---------------------------------------------------------------- tensor helpers
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64 (gradcheck); every other dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """A context that disables autocast on ``device_type`` (a no-op where unsupported)."""
    try:
        return torch.autocast(device_type=device_type, enabled=False)
    except RuntimeError:
        return contextlib.nullcontext()


def one_hot(target: Tensor, num_classes: int, dtype: torch.dtype) -> Tensor:
    """``B x spatial`` labels -> ``B x C x spatial`` one-hot of ``dtype``."""
    return F.one_hot(target, num_classes).movedim(-1, 1).to(dtype)


def masked_mean(values: Tensor, valid: Tensor | None) -> Tensor:
    """Mean of ``values`` (``B x spatial``) over the voxels where ``valid`` is True (0 if none)."""
    if valid is None:
        return values.mean()
    total = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
    return total / valid.sum().clamp(min=1).to(values.dtype)


def masked_sum(values: Tensor, valid: Tensor | None) -> Tensor:
    if valid is None:
        return values.sum()
    return torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()


def check_layout(logits: Tensor, target: Tensor, spatial_dims: tuple[int, ...] | None = None) -> Tensor:
    """Check ``B x C x spatial`` logits against the target; return the target as ``B x spatial``.

    ``spatial_dims`` restricts the number of spatial dimensions (e.g. ``(2, 3)``).
    """
    if not isinstance(logits, Tensor) or not isinstance(target, Tensor):
        raise TypeError(
            f"logits and target must be tensors, got {type(logits).__name__} and {type(target).__name__}."
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}.")
    n_spatial = logits.ndim - 2
    allowed = spatial_dims if spatial_dims is not None else (1, 2, 3)
    if n_spatial not in allowed:
        raise ValueError(
            f"logits must be B x C x spatial with {' or '.join(map(str, allowed))} spatial dims, "
            f"got shape {tuple(logits.shape)}."
        )
    if target.ndim == logits.ndim and target.shape[1] == 1:
        target = target.squeeze(1)
    if tuple(target.shape) != (logits.shape[0], *logits.shape[2:]):
        raise ValueError(
            f"target shape {tuple(target.shape)} does not match logits shape {tuple(logits.shape)}: "
            f"expected {(logits.shape[0], *logits.shape[2:])} (B x spatial) or B x 1 x spatial."
        )
    return target


@contextlib.contextmanager
def target_checks(loss: nn.Module, enabled: bool):
    """Within the block, the target value-range check of ``loss`` and of its sub-losses is
    on (``enabled``) or off; previous settings are restored afterwards."""
    modules = [m for m in loss.modules() if hasattr(m, "check_target_range")]
    previous = [m.check_target_range for m in modules]
    for m in modules:
        m.check_target_range = enabled
    try:
        yield
    finally:
        for m, value in zip(modules, previous):
            m.check_target_range = value


# ---------------------------------------------------------------- soft targets
def is_soft_target(logits: Tensor, target: Tensor) -> bool:
    """A ``B x C x spatial`` floating target of the logits' shape: class probabilities per voxel (the rater
    mean of ``dataset.raters.target=mean``), not labels."""
    return target.is_floating_point() and target.shape == logits.shape and logits.shape[1] > 1


def hard_label_only(loss) -> str:
    """The one-line refusal of soft targets by a loss (class or instance) that needs a hard label."""
    name = loss.__name__ if isinstance(loss, type) else type(loss).__name__
    reason = "" if isinstance(loss, type) else getattr(loss, "hard_label_reason", "")
    return (f"loss {name}{reason} needs a hard label per voxel and refuses dataset.raters.target=mean (the soft rater "
            "mean); it accepts dataset.raters.target=majority, staple, random or a rater's name")


# ---------------------------------------------------------------- base class
class SegmentationLoss(nn.Module):
    """Base of the softmax (mutually exclusive classes) losses.

    Subclasses implement ``compute(logits, target, valid)`` with float32 (or float64) logits
    ``B x C x spatial``, int64 labels ``B x spatial`` where ignored voxels hold 0, and
    ``valid`` (``B x spatial`` bool or None). Per-voxel losses return
    ``self.reduce(per_voxel, valid)``. A loss defined for soft targets (``soft_targets = True``) also
    implements ``compute_soft(logits, q)`` for ``B x C x spatial`` class probabilities q (the rater mean:
    ``dataset.raters.target=mean``); the others refuse them in one line (:func:`hard_label_only`).

    Args:
        ignore_index: label excluded from the data term AND the penalty (None: none).
        reduction: ``"mean"`` (over non-ignored voxels) or, for per-voxel losses, ``"sum"``.
    """

    multilabel = False
    #: check that target labels lie in [0, C - 1] (a host read; see :func:`target_checks`)
    check_target_range = True
    #: the reductions this loss supports
    reductions: tuple[str, ...] = ("mean", "sum")
    #: the numbers of spatial dimensions this loss supports
    spatial_dims: tuple[int, ...] = (1, 2, 3)
    #: the loss is defined for soft targets and implements :meth:`compute_soft`
    soft_targets = False

    def __init__(self, ignore_index: int | None = None, reduction: str = "mean") -> None:
        super().__init__()
        self.ignore_index = check_ignore_index(ignore_index)
        self.reduction = check_choice("reduction", reduction, self.reductions)

    # -- public API -------------------------------------------------------------------
    def probabilities(self, logits: Tensor) -> Tensor:
        """Class probabilities ``softmax(logits, dim=1)`` in float32."""
        with no_autocast(logits.device.type):
            return torch.softmax(logits.to(compute_dtype(logits.dtype)), dim=1)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        with no_autocast(logits.device.type):
            if isinstance(target, Tensor) and isinstance(logits, Tensor) and is_soft_target(logits, target):
                if not self.soft_targets:
                    raise ValueError(hard_label_only(self))
                return self.compute_soft(*self.prepare_soft(logits, target))
            logits, target, valid = self.prepare(logits, target)
            return self.compute(logits, target, valid)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        raise NotImplementedError

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        """The loss against ``B x C x spatial`` class probabilities ``q`` (every voxel counts)."""
        raise NotImplementedError

    def prepare_soft(self, logits: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
        """Soft targets in the logits' compute type; with the range check on, q must be finite, in [0, 1] and
        sum to 1 over the classes (a host read, like the label check)."""
        dtype = compute_dtype(logits.dtype)
        logits, q = logits.to(dtype), q.to(dtype)
        if self.check_target_range and q.numel() > 0:
            lo, hi, gap = torch.stack([q.min(), q.max(), (q.sum(1) - 1).abs().max()]).tolist()
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0 or hi > 1 or gap > 1e-4:
                raise ValueError(f"soft target must hold class probabilities (in [0, 1], summing to 1 over the "
                                 f"classes); found values in [{lo:g}, {hi:g}], sums off by up to {gap:g}")
        return logits, q

    # -- helpers for subclasses -------------------------------------------------------
    def prepare(self, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Check and convert the inputs; see the module docstring."""
        target = check_layout(logits, target, self.spatial_dims)
        num_classes = logits.shape[1]
        if num_classes < 2:
            raise ValueError(f"softmax losses need at least 2 classes (channels), got C={num_classes}.")
        if target.is_floating_point():
            if not torch.equal(target, target.round()):
                raise ValueError("target must hold integer class labels; got non-integral floating values.")
        elif target.dtype == torch.bool or target.is_complex():
            raise TypeError(f"target must hold integer class labels, got dtype {target.dtype}.")
        target = target.long()
        logits = logits.to(compute_dtype(logits.dtype))

        valid = None if self.ignore_index is None else target != self.ignore_index
        safe = target if valid is None else torch.where(valid, target, torch.zeros_like(target))
        if self.check_target_range and safe.numel() > 0:
            lo, hi = torch.stack([safe.min(), safe.max()]).tolist()
            if lo < 0 or hi >= num_classes:
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"target holds label {bad} outside [0, {num_classes - 1}] (maximum label {hi}, "
                    f"minimum {lo}, C={num_classes} classes, ignore_index={self.ignore_index})."
                )
        return logits, safe, valid

    def reduce(self, per_voxel: Tensor, valid: Tensor | None) -> Tensor:
        """Reduce a ``B x spatial`` per-voxel loss over the non-ignored voxels."""
        if self.reduction == "sum":
            return masked_sum(per_voxel, valid)
        return masked_mean(per_voxel, valid)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"
