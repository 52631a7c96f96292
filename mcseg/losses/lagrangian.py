"""Augmented-Lagrangian penalties with learned multipliers (the margin-loss group's CALS and CRaC).

A loss of this family is ``CE + mean_{voxels, j} P(h_j; lambda_j, rho_j)`` over K' constraint columns h_j
(``B x K' x spatial``, one multiplier lambda_j and one rho_j per column, constants for the gradient) with the PHR
penalty ``P(h; lambda, rho) = [max(0, lambda + rho h)^2 - lambda^2] / (2 rho)``. A subclass says what its
columns are (:meth:`AugmentedLagrangianLoss.constraint_columns`); this base keeps the multipliers and updates
them from the VALIDATION pass, as the authors' ``AugLagrangian*`` classes: the trainer calls
``on_validation_start()``, ``on_validation_batch(logits, target)`` on every validation volume (non-ignored
voxels pooled) and ``on_validation_end(epoch)`` (0-based). Then, when ``(epoch + 1) % lambd_step == 0``,
``lambda_j = clip(mean_voxels clip(P'(h_j), lambd_min, lambd_max), lambd_min, lambd_max)`` with
``P' = max(0, lambda + rho h)`` evaluated with the multipliers in effect during the pass (the authors clip per
voxel before the mean too). With ``rho_step > 0`` the mean constraint ``c_j = mean h_j`` is computed every epoch
and, when ``(epoch + 1) % rho_step == 0`` and a previous value exists, ``rho_j <- clip(gamma rho_j, rho_min,
rho_max)`` for the columns with ``c_j > tao max(c_j_prev, 0)``; ``c_prev`` is the previous epoch's value.

State in ``state_dict`` (buffers, so a checkpoint resumes exactly): ``lambd``, ``rho``, ``prev_constraint``,
``has_prev_constraint``. Initial: lambda = lambd_min, rho = rho_min. The CRaC authors' checkpoints hold no such
state (Bala93/CRac ``calibrate/utils/checkpoint.py``: epoch, model, optimiser, scheduler): their resumed run starts
its multipliers again from the initial values.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from .base import SegmentationLoss, check_float, check_int, masked_mean, no_autocast
from .cross_entropy import nll

__all__ = ["AugmentedLagrangianLoss", "phr_penalty"]


def phr_penalty(h: Tensor, lambd: Tensor, rho: Tensor) -> Tensor:
    """PHR penalty ``[max(0, lambda + rho h)^2 - lambda^2] / (2 rho)``; lambda, rho broadcast over h."""
    return (torch.relu(lambd + rho * h).square() - lambd.square()) / (2.0 * rho)


class AugmentedLagrangianLoss(SegmentationLoss):
    """Base of CALS and CRaC (module docstring). Subclasses implement :meth:`constraint_columns` and
    :attr:`n_columns`; ``reduction="mean"`` only."""

    reductions = ("mean",)

    def __init__(
        self,
        num_classes: int,
        lambd_min: float,
        lambd_max: float,
        lambd_step: int,
        rho_min: float,
        rho_max: float,
        rho_step: int,
        gamma: float,
        tao: float,
        ignore_index: int | None,
        reduction: str,
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.num_classes = check_int("num_classes", num_classes, low=2)
        self.lambd_min = check_float("lambd_min", lambd_min, low=0.0)
        self.lambd_max = check_float("lambd_max", lambd_max, low=self.lambd_min)
        self.lambd_step = check_int("lambd_step", lambd_step, low=1)
        self.rho_min = check_float("rho_min", rho_min, low=0.0, low_open=True)
        self.rho_max = check_float("rho_max", rho_max, low=self.rho_min)
        self.rho_step = check_int("rho_step", rho_step, low=0)
        self.gamma = check_float("gamma", gamma, low=1.0)
        self.tao = check_float("tao", tao, low=0.0)
        k = self.n_columns
        f64 = torch.float64
        self.register_buffer("lambd", torch.full((k,), self.lambd_min, dtype=f64))
        self.register_buffer("rho", torch.full((k,), self.rho_min, dtype=f64))
        self.register_buffer("prev_constraint", torch.zeros(k, dtype=f64))
        self.register_buffer("has_prev_constraint", torch.tensor(False))
        # statistics of the running validation pass (not checkpointed)
        self.register_buffer("_grad_sum", torch.zeros(k, dtype=f64), persistent=False)
        self.register_buffer("_constraint_sum", torch.zeros(k, dtype=f64), persistent=False)
        self.register_buffer("_count", torch.zeros((), dtype=f64), persistent=False)

    @property
    def n_columns(self) -> int:
        """K', the number of constraint columns (and of multipliers)."""
        raise NotImplementedError

    def constraint_columns(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        """``h`` (``B x K' x spatial``) of float logits ``B x C x spatial`` and their labels."""
        raise NotImplementedError

    def _per_column(self, t: Tensor, like: Tensor) -> Tensor:
        return t.to(like.dtype).view(1, -1, *([1] * (like.ndim - 2)))

    def _check_classes(self, logits: Tensor) -> None:
        if logits.shape[1] != self.num_classes:
            raise ValueError(
                f"{type(self).__name__} has num_classes={self.num_classes} but logits have C={logits.shape[1]}.")

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        self._check_classes(logits)
        h = self.constraint_columns(logits, target, valid)
        penalty = phr_penalty(h, self._per_column(self.lambd, h), self._per_column(self.rho, h)).mean(dim=1)
        return masked_mean(nll(torch.log_softmax(logits, dim=1), target) + penalty, valid)

    # -- trainer hooks ----------------------------------------------------------------
    def on_validation_start(self) -> None:
        self._grad_sum.zero_()
        self._constraint_sum.zero_()
        self._count.zero_()

    @torch.no_grad()
    def on_validation_batch(self, logits: Tensor, target: Tensor) -> None:
        with no_autocast(logits.device.type):
            logits, target, valid = self.prepare(logits, target)
            self._check_classes(logits)
            h = self.constraint_columns(logits.double(), target, valid)
            grad = torch.relu(self._per_column(self.lambd, h) + self._per_column(self.rho, h) * h)
            grad = grad.clamp(self.lambd_min, self.lambd_max)
            k = self.n_columns
            h, grad = h.movedim(1, -1).reshape(-1, k), grad.movedim(1, -1).reshape(-1, k)
            if valid is not None:
                keep = valid.reshape(-1)
                h, grad = h[keep], grad[keep]
            self._grad_sum += grad.sum(dim=0)
            self._constraint_sum += h.sum(dim=0)
            self._count += h.shape[0]

    @torch.no_grad()
    def on_validation_end(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, low=0)
        if self._count.item() == 0:
            warnings.warn(f"{type(self).__name__}: no validation voxels were seen; multipliers left unchanged.",
                          stacklevel=2)
            return
        if (epoch + 1) % self.lambd_step == 0:
            self.lambd.copy_((self._grad_sum / self._count).clamp(self.lambd_min, self.lambd_max))
        if self.rho_step > 0:
            current = self._constraint_sum / self._count
            if (epoch + 1) % self.rho_step == 0 and bool(self.has_prev_constraint):
                grow = current > self.prev_constraint.clamp(min=0) * self.tao
                self.rho.copy_(torch.where(grow, self.gamma * self.rho, self.rho).clamp(self.rho_min, self.rho_max))
            self.prev_constraint.copy_(current)
            self.has_prev_constraint.fill_(True)

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, lambd=[{self.lambd_min}, {self.lambd_max}] step {self.lambd_step}, "
            f"rho=[{self.rho_min}, {self.rho_max}] step {self.rho_step}, gamma={self.gamma}, tao={self.tao}, "
            f"{super().extra_repr()}"
        )
