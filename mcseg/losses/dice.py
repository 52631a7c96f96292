"""Soft Dice term and CE + Dice."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import SegmentationLoss, check_bool, check_float, masked_mean, one_hot
from .cross_entropy import nll

__all__ = ["CEDiceLoss", "SoftDice"]


class SoftDice(nn.Module):
    """Soft Dice loss ``1 - (2 sum p g + smooth_nr) / (sum p + sum g + smooth_dr)``
    (``squared_pred=True``: ``sum p^2 + sum g^2`` in the denominator).

    Sums run over the spatial dims of each sample (``batch=False``, one Dice per sample and
    class) or over the batch too (``batch=True``); the result is the mean over samples and
    classes. Ignored voxels are removed from both p and the one-hot g. Same definition and
    defaults as MONAI's ``DiceLoss(softmax=True, to_onehot_y=True)``.

    Args:
        include_background: keep class 0 in the mean (default True, as MONAI, and as the
            margin-segmentation code's plain CE + Dice actually ran: its wrapper meant to drop it
            but did not; its margin + Dice does drop it, see :class:`~mcseg.losses.MarginDiceLoss`).
        batch: pool the sums over the batch before the ratio (default False).
        smooth_nr, smooth_dr: numerator / denominator smoothing (default 1e-5).
        squared_pred: square p and g in the denominator, as MONAI's ``squared_pred`` (default False).
    """

    def __init__(
        self,
        include_background: bool = True,
        batch: bool = False,
        smooth_nr: float = 1e-5,
        smooth_dr: float = 1e-5,
        squared_pred: bool = False,
    ) -> None:
        super().__init__()
        self.include_background = check_bool("include_background", include_background)
        self.batch = check_bool("batch", batch)
        self.smooth_nr = check_float("smooth_nr", smooth_nr, low=0.0)
        self.smooth_dr = check_float("smooth_dr", smooth_dr, low=0.0, low_open=True)
        self.squared_pred = check_bool("squared_pred", squared_pred)

    def forward(self, probs: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        """``probs`` ``B x C x spatial``; ``target`` ``B x spatial`` (ignored voxels hold any valid label)."""
        truth = one_hot(target, probs.shape[1], probs.dtype)
        if valid is not None:
            weight = valid.unsqueeze(1).to(probs.dtype)
            probs, truth = probs * weight, truth * weight
        if not self.include_background:
            probs, truth = probs[:, 1:], truth[:, 1:]
        dims = tuple(range(2, probs.ndim))
        if self.batch:
            dims = (0, *dims)
        intersection = (probs * truth).sum(dims)
        if self.squared_pred:
            denominator = probs.square().sum(dims) + truth.square().sum(dims)
        else:
            denominator = probs.sum(dims) + truth.sum(dims)
        return (1.0 - (2.0 * intersection + self.smooth_nr) / (denominator + self.smooth_dr)).mean()

    def extra_repr(self) -> str:
        return (
            f"include_background={self.include_background}, batch={self.batch}, "
            f"smooth_nr={self.smooth_nr}, smooth_dr={self.smooth_dr}, squared_pred={self.squared_pred}"
        )


class CEDiceLoss(SegmentationLoss):
    """``lambda_ce * CE + lambda_dice * soft Dice`` (1:1 by default).

    CE is the mean over non-ignored voxels; the Dice term is :class:`SoftDice` (mean over
    samples and classes, background included by default: set ``include_background=False``
    to exclude it). With no ignored voxels this equals MONAI's
    ``DiceCELoss(to_onehot_y=True, softmax=True)`` at the same settings.

    Args:
        lambda_ce, lambda_dice: weights (default 1.0 and 1.0).
        include_background, batch, smooth_nr, smooth_dr: see :class:`SoftDice`.
        ignore_index: label excluded from both terms (default None).
        reduction: ``"mean"`` only.
    """

    reductions = ("mean",)

    def __init__(
        self,
        lambda_ce: float = 1.0,
        lambda_dice: float = 1.0,
        include_background: bool = True,
        batch: bool = False,
        smooth_nr: float = 1e-5,
        smooth_dr: float = 1e-5,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.lambda_ce = check_float("lambda_ce", lambda_ce, low=0.0)
        self.lambda_dice = check_float("lambda_dice", lambda_dice, low=0.0)
        self.dice = SoftDice(include_background, batch, smooth_nr, smooth_dr)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        ce = masked_mean(nll(log_probs, target), valid)
        return self.lambda_ce * ce + self.lambda_dice * self.dice(log_probs.exp(), target, valid)

    def extra_repr(self) -> str:
        return f"lambda_ce={self.lambda_ce}, lambda_dice={self.lambda_dice}, {super().extra_repr()}"
