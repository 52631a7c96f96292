"""Multi-label (one sigmoid per region) losses: BCE and the strictly proper asymmetric loss (SPA).

Layout: logits ``B x R x spatial`` (one channel per region, e.g. BraTS WT/TC/ET) and a
target of the SAME shape holding 0/1 (soft targets in [0, 1] are accepted). There is no
``ignore_index``: pass ``mask`` (bool, broadcastable to the logits, e.g. ``B x 1 x spatial``
or ``B x R x spatial``) to ``forward`` to restrict the loss to some voxels/regions. The
reduction is the mean over all (unmasked) voxel-region elements. ``probabilities(logits)``
is the inverse link that turns logits into per-region probabilities.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import check_choice, check_float, compute_dtype, masked_mean, masked_sum, no_autocast

__all__ = ["MultiLabelLoss", "SPALoss", "SigmoidBCELoss"]


class MultiLabelLoss(nn.Module):
    """Base of the sigmoid losses: checks, float32 computation, mask, reduction."""

    multilabel = True
    #: check that targets lie in [0, 1] (a host read; see :func:`~mcseg.losses.base.target_checks`)
    check_target_range = True

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = check_choice("reduction", reduction, ("mean", "sum"))

    def forward(self, logits: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
        with no_autocast(logits.device.type):
            if not logits.is_floating_point() or logits.ndim < 3:
                raise ValueError(
                    f"logits must be a floating-point B x R x spatial tensor, got {logits.dtype} {tuple(logits.shape)}."
                )
            if tuple(target.shape) != tuple(logits.shape):
                raise ValueError(
                    f"multi-label target must have the logits' shape {tuple(logits.shape)} (B x R x spatial, "
                    f"one channel per region), got {tuple(target.shape)}."
                )
            dtype = compute_dtype(logits.dtype)
            logits, target = logits.to(dtype), target.to(dtype)
            if self.check_target_range and target.numel() > 0:
                lo, hi = torch.stack([target.min(), target.max()]).tolist()
                if lo < 0 or hi > 1:
                    raise ValueError(f"multi-label target must lie in [0, 1], got values in [{lo}, {hi}].")
            valid = None
            if mask is not None:
                try:
                    valid = torch.broadcast_to(mask.bool(), logits.shape)
                except RuntimeError as err:
                    raise ValueError(
                        f"mask shape {tuple(mask.shape)} does not broadcast to the logits' shape {tuple(logits.shape)}."
                    ) from err
            per_element = self.per_element(logits, target)
            return masked_sum(per_element, valid) if self.reduction == "sum" else masked_mean(per_element, valid)

    def per_element(self, logits: Tensor, target: Tensor) -> Tensor:
        raise NotImplementedError

    def probabilities(self, logits: Tensor) -> Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class SigmoidBCELoss(MultiLabelLoss):
    """Binary cross-entropy per region on sigmoid outputs:
    ``-[y log sigmoid(z) + (1 - y) log sigmoid(-z)]``, mean over voxels and regions
    (or the unmasked ones). ``probabilities`` is ``sigmoid(z)``. No hyperparameter.

    Args:
        reduction: ``"mean"`` (default) or ``"sum"``.
    """

    def per_element(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits, target, reduction="none")

    def probabilities(self, logits: Tensor) -> Tensor:
        with no_autocast(logits.device.type):
            return torch.sigmoid(logits.to(compute_dtype(logits.dtype)))


class SPALoss(MultiLabelLoss):
    """Strictly proper asymmetric loss, SPA (Cheng & Vasconcelos, CVPR 2024), per region.

    ``y l+(z) + (1 - y) l-(z)``, ``l+(z) = -(1/zeta_pos) log sigmoid(k_pos (z - b_pos))``,
    ``l-(z) = -(1/zeta_neg) log sigmoid(-k_neg (z - b_neg))``; mean over voxels and regions
    (or the unmasked ones). Its minimiser for a true probability eta is the z with
    ``eta(z) = eta``, where the inverse link (``probabilities``, used at evaluation) is
    ``eta(z) = 1 / (1 + k_pos zeta_neg sigmoid(-k_pos (z - b_pos)) / (k_neg zeta_pos sigmoid(k_neg (z - b_neg))))``,
    computed in log space. With all zeta = k = 1 and b = 0 it is BCE and eta = sigmoid.
    The label-pair regulariser (LPR) is not implemented.

    Defaults zeta_pos = 1, k_pos = 1, b_pos = 0, zeta_neg = 5, k_neg = 3, b_neg = 1 come from
    a third-party implementation, not confirmed from the authors.

    Args:
        zeta_pos, zeta_neg: > 0. k_pos, k_neg: > 0. b_pos, b_neg: real.
        reduction: ``"mean"`` (default) or ``"sum"``.
    """

    def __init__(
        self,
        zeta_pos: float = 1.0,
        k_pos: float = 1.0,
        b_pos: float = 0.0,
        zeta_neg: float = 5.0,
        k_neg: float = 3.0,
        b_neg: float = 1.0,
        reduction: str = "mean",
    ) -> None:
        super().__init__(reduction=reduction)
        positive = {"low": 0.0, "low_open": True}
        self.zeta_pos = check_float("zeta_pos", zeta_pos, **positive)
        self.k_pos = check_float("k_pos", k_pos, **positive)
        self.b_pos = check_float("b_pos", b_pos)
        self.zeta_neg = check_float("zeta_neg", zeta_neg, **positive)
        self.k_neg = check_float("k_neg", k_neg, **positive)
        self.b_neg = check_float("b_neg", b_neg)

    def per_element(self, logits: Tensor, target: Tensor) -> Tensor:
        loss_pos = -F.logsigmoid(self.k_pos * (logits - self.b_pos)) / self.zeta_pos
        loss_neg = -F.logsigmoid(-self.k_neg * (logits - self.b_neg)) / self.zeta_neg
        return target * loss_pos + (1.0 - target) * loss_neg

    def probabilities(self, logits: Tensor) -> Tensor:
        """Inverse link ``eta(z)`` in float32, as ``sigmoid(-log_ratio)`` with ``log_ratio =
        log(k_pos zeta_neg / (k_neg zeta_pos)) + logsigmoid(-k_pos (z - b_pos)) - logsigmoid(k_neg (z - b_neg))``.
        """
        with no_autocast(logits.device.type):
            z = logits.to(compute_dtype(logits.dtype))
            log_ratio = (
                math.log(self.k_pos * self.zeta_neg / (self.k_neg * self.zeta_pos))
                + F.logsigmoid(-self.k_pos * (z - self.b_pos))
                - F.logsigmoid(self.k_neg * (z - self.b_neg))
            )
            return torch.sigmoid(-log_ratio)

    def extra_repr(self) -> str:
        return (
            f"zeta_pos={self.zeta_pos}, k_pos={self.k_pos}, b_pos={self.b_pos}, zeta_neg={self.zeta_neg}, "
            f"k_neg={self.k_neg}, b_neg={self.b_neg}, {super().extra_repr()}"
        )
