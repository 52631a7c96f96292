"""Logit-margin losses: MbLS (margin), MbLS + Dice, CALS (class-adaptive margins by augmented Lagrangian), ACLS."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import (
    SegmentationLoss,
    check_bool,
    check_choice,
    check_float,
    check_int,
    masked_mean,
)
from .cross_entropy import nll, soft_nll
from .dice import SoftDice
from .lagrangian import AugmentedLagrangianLoss

__all__ = ["ACLSLoss", "CALSLoss", "MarginDiceLoss", "MarginLoss", "logit_distances", "margin_penalty"]


def logit_distances(logits: Tensor) -> Tensor:
    """``d_k = max_j z_j - z_k`` (``B x C x spatial``; 0 for the arg-max class)."""
    return logits.amax(dim=1, keepdim=True) - logits


def margin_penalty(logits: Tensor, margin: float) -> Tensor:
    """Per-voxel MbLS penalty ``mean_k ReLU(d_k - m)`` (``B x spatial``); ``m = inf`` gives 0."""
    return torch.relu(logit_distances(logits) - margin).mean(dim=1)


class MarginLoss(SegmentationLoss):
    """Margin-based label smoothing, MbLS (Liu et al., CVPR 2022; segmentation: Murugesan
    et al., MedIA 2023).

    ``CE + alpha * mean_k ReLU(max_j z_j - z_k - m)`` on the raw logits z, i.e. the penalty
    is averaged over the non-ignored voxels AND all K classes (as the official code,
    ``F.relu(diff - margin).mean()``). The distance is to the MAX logit (not the true-class
    logit), so the arg-max class contributes 0. ``m -> inf`` gives CE.

    Soft targets q (class probabilities per voxel, e.g. the rater mean of ``dataset.raters.target=mean``):
    ``-sum_k q_k log p_k + alpha * penalty``. The penalty does not depend on the target and CE is linear in
    it, so on the rater mean this is the mean of the raters' MbLS losses.

    Optional schedule of alpha (lambda), as the official ``schedule_alpha``, which the
    official trainer calls at the END of each epoch; here the trainer calls
    ``on_train_epoch_start(epoch)`` (0-based) and alpha is recomputed from the initial alpha
    as if ``schedule_alpha(e)`` had run at the end of every epoch ``e < epoch``:
    ``"add"``: ``alpha <- min(alpha + mu, max_alpha)`` every epoch; ``"multiply"``:
    ``alpha <- min(alpha * mu, max_alpha)`` every epoch; ``"step"``: the multiplication only
    when ``(e + 1) % step_size == 0``. The current value is the buffer ``current_alpha``
    (saved in ``state_dict``). The paper's results use no schedule.

    Args:
        margin: m >= 0 (``inf`` allowed); default 10 (paper; the segmentation README uses 5 on ACDC).
        alpha: lambda >= 0; default 0.1.
        schedule: None (default), ``"add"``, ``"multiply"`` or ``"step"``.
        mu: schedule increment / factor >= 0; default 0.
        max_alpha: cap of the schedule; default 100.
        step_size: epochs between ``"step"`` updates (>= 1); default 100.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(
        self,
        margin: float = 10.0,
        alpha: float = 0.1,
        schedule: str | None = None,
        mu: float = 0.0,
        max_alpha: float = 100.0,
        step_size: int = 100,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.margin = check_float("margin", margin, low=0.0, allow_inf=True)
        self.alpha = check_float("alpha", alpha, low=0.0)
        self.schedule = check_choice("schedule", schedule, (None, "add", "multiply", "step"))
        self.mu = check_float("mu", mu, low=0.0)
        self.max_alpha = check_float("max_alpha", max_alpha, low=0.0)
        self.step_size = check_int("step_size", step_size, low=1)
        self.register_buffer("current_alpha", torch.tensor(self.alpha, dtype=torch.float64))

    def scheduled_alpha(self, epoch: int) -> float:
        """alpha in effect during (0-based) ``epoch``."""
        epoch = check_int("epoch", epoch, low=0)
        a = self.alpha
        for e in range(epoch):
            if self.schedule == "add":
                a = min(a + self.mu, self.max_alpha)
            elif self.schedule == "multiply" or (self.schedule == "step" and (e + 1) % self.step_size == 0):
                a = min(a * self.mu, self.max_alpha)
        return a

    def on_train_epoch_start(self, epoch: int) -> None:
        self.current_alpha.fill_(self.scheduled_alpha(epoch))

    def per_voxel(self, logits: Tensor, log_probs: Tensor, target: Tensor, ce_weight: float = 1.0) -> Tensor:
        alpha = self.current_alpha.to(logits.dtype)
        return ce_weight * nll(log_probs, target) + alpha * margin_penalty(logits, self.margin)

    soft_targets = True

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        return self.reduce(self.per_voxel(logits, torch.log_softmax(logits, dim=1), target), valid)

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        alpha = self.current_alpha.to(logits.dtype)
        per_voxel = soft_nll(torch.log_softmax(logits, dim=1), q) + alpha * margin_penalty(logits, self.margin)
        return self.reduce(per_voxel, None)

    def extra_repr(self) -> str:
        s = f"margin={self.margin}, alpha={self.alpha}, "
        if self.schedule is not None:
            s += f"schedule={self.schedule!r}, mu={self.mu}, max_alpha={self.max_alpha}, step_size={self.step_size}, "
        return s + super().extra_repr()


class MarginDiceLoss(MarginLoss):
    """``lambda_ce * CE + lambda_dice * soft Dice + alpha * MbLS margin penalty``.

    CE and the penalty as in :class:`MarginLoss` (mean over non-ignored voxels, penalty
    also over the K classes); the Dice term as :class:`~mcseg.losses.dice.SoftDice`, by
    default WITHOUT the background, as the authors' ``LogitMarginDICEL1``
    (Bala93/MarginLoss, ``include_background=False`` since April 2022; unlike their plain
    CE + Dice, which includes it). Defaults m = 10, alpha = 0.1, 1:1 CE:Dice.

    Args:
        margin, alpha, schedule, mu, max_alpha, step_size: see :class:`MarginLoss`.
        lambda_ce, lambda_dice: weights of CE and Dice (default 1.0 and 1.0).
        include_background, batch, smooth_nr, smooth_dr: see :class:`~mcseg.losses.dice.SoftDice`.
        ignore_index: label excluded from all three terms (default None).
        reduction: ``"mean"`` only.
    """

    reductions = ("mean",)
    soft_targets = False  # its Dice term needs a hard label (the plain MarginLoss takes soft targets)

    def __init__(
        self,
        margin: float = 10.0,
        alpha: float = 0.1,
        lambda_ce: float = 1.0,
        lambda_dice: float = 1.0,
        include_background: bool = False,
        batch: bool = False,
        smooth_nr: float = 1e-5,
        smooth_dr: float = 1e-5,
        schedule: str | None = None,
        mu: float = 0.0,
        max_alpha: float = 100.0,
        step_size: int = 100,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(margin, alpha, schedule, mu, max_alpha, step_size, ignore_index, reduction)
        self.lambda_ce = check_float("lambda_ce", lambda_ce, low=0.0)
        self.lambda_dice = check_float("lambda_dice", lambda_dice, low=0.0)
        self.dice = SoftDice(include_background, batch, smooth_nr, smooth_dr)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        ce_and_margin = masked_mean(self.per_voxel(logits, log_probs, target, self.lambda_ce), valid)
        return ce_and_margin + self.lambda_dice * self.dice(log_probs.exp(), target, valid)

    def extra_repr(self) -> str:
        return f"lambda_ce={self.lambda_ce}, lambda_dice={self.lambda_dice}, {super().extra_repr()}"


class CALSLoss(AugmentedLagrangianLoss):
    """Class-adaptive label smoothing, CALS (Liu et al., CVPR 2023), with the PHR penalty.

    ``CE + mean_{voxels, k} P(h_k; lambda_k, rho_k)`` with the normalised margin constraint
    ``h_k = (max_j z_j - z_k - m) / m`` (``normalize=False``: not divided by m) and
    ``P(h; lambda, rho) = [max(0, lambda + rho h)^2 - lambda^2] / (2 rho)``; one multiplier
    lambda_k and one rho_k per class, constants for the gradient (buffers).

    Multipliers are updated once per epoch from the VALIDATION pass, as the official code
    (``AugLagrangianClass``); the rules, the trainer hooks and the checkpointed state are those of
    :mod:`mcseg.losses.lagrangian`: the trainer calls ``on_validation_start()``,
    ``on_validation_batch(logits, target)`` for every validation volume (non-ignored voxels pooled) and
    ``on_validation_end(epoch)`` (0-based epoch); ``lambda_k = clip(mean_voxels clip(P'(h_k), lambd_min,
    lambd_max), lambd_min, lambd_max)`` every ``lambd_step`` epochs, ``rho_k <- clip(gamma * rho_k, rho_min,
    rho_max)`` every ``rho_step`` epochs for the classes with ``c_k > tao * max(c_k_prev, 0)``.

    State in ``state_dict`` (buffers): ``lambd``, ``rho``, ``prev_constraint``,
    ``has_prev_constraint``. Initial: lambda = lambd_min, rho = rho_min.

    Args:
        num_classes: K (the multipliers are per class); use ``${dataset.num_classes}``.
        margin: m > 0; default 10 (README; the official config file has 20).
        lambd_min, lambd_max: multiplier bounds; default 1e-6 and 1e6.
        lambd_step: epochs between multiplier updates; default 1.
        rho_min, rho_max: rho bounds (rho starts at rho_min); default 1 and 10.
        rho_step: epochs between rho updates (0 disables them); default 10.
        gamma: rho growth factor > 1; default 1.2.
        tao: required constraint decrease ratio; default 0.9.
        normalize: divide the constraint by m; default True.
        ignore_index: label excluded from CE, penalty and the multiplier statistics.
        reduction: ``"mean"`` only.
    """

    def __init__(
        self,
        num_classes: int,
        margin: float = 10.0,
        lambd_min: float = 1e-6,
        lambd_max: float = 1e6,
        lambd_step: int = 1,
        rho_min: float = 1.0,
        rho_max: float = 10.0,
        rho_step: int = 10,
        gamma: float = 1.2,
        tao: float = 0.9,
        normalize: bool = True,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(num_classes, lambd_min, lambd_max, lambd_step, rho_min, rho_max, rho_step, gamma, tao,
                         ignore_index, reduction)
        self.margin = check_float("margin", margin, low=0.0, low_open=True)
        self.normalize = check_bool("normalize", normalize)

    @property
    def n_columns(self) -> int:
        return self.num_classes

    def constraints(self, logits: Tensor) -> Tensor:
        """``h`` (``B x C x spatial``)."""
        h = logit_distances(logits) - self.margin
        return h / self.margin if self.normalize else h

    def constraint_columns(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        return self.constraints(logits)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, normalize={self.normalize}, {super().extra_repr()}"


class ACLSLoss(SegmentationLoss):
    """Adaptive and conditional label smoothing, ACLS (Park et al., "ACLS: Adaptive and Conditional
    Label Smoothing for Network Calibration", ICCV 2023).

    ``CE + alpha * R`` with, per voxel, ``z* = max_k z_k``, the positives ``I_k = 1[z_k = z*]``
    (the ARG-MAX class, not the label; ties give several positives) and

    ``R_v = lambda_pos sum_k I_k ReLU(z* - m)^2 + lambda_neg / (K - 1) sum_k (1 - I_k) ReLU(sg(z*) - z_k - m)^2``,

    averaged over the non-ignored voxels, as the official code (``calibrate/losses/acls.py``),
    which flattens the voxels of all images into rows (so its normalisers N and N (K - 1) are
    these means, whatever the ties). Quirks kept from it: the positive term acts on the RAW max
    logit (not a gap), with gradient (through ``max(dim=1)``, so to one index at a tie); the
    negative term detaches z*; the indicator is computed on detached logits; the labels enter
    only the CE. Differences: the official ``ignore_index`` is stored but unused and its CE has
    none (here ``ignore_index`` masks both terms, as in every mcseg loss); ``forward`` returns
    the loss only (the official code returns ``(loss, loss_ce, loss_reg)``).

    Args:
        margin: m >= 0; default 10.
        alpha: weight of R >= 0; default 0.1.
        lambda_pos: weight of the positive term >= 0; default 1.
        lambda_neg: weight of the negative term >= 0; default 0.1.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(
        self,
        margin: float = 10.0,
        alpha: float = 0.1,
        lambda_pos: float = 1.0,
        lambda_neg: float = 0.1,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.margin = check_float("margin", margin, low=0.0)
        self.alpha = check_float("alpha", alpha, low=0.0)
        self.lambda_pos = check_float("lambda_pos", lambda_pos, low=0.0)
        self.lambda_neg = check_float("lambda_neg", lambda_neg, low=0.0)

    def regulariser(self, logits: Tensor) -> Tensor:
        """Per-voxel ``R_v`` (``B x spatial``) of ``B x C x spatial`` logits."""
        top = logits.max(dim=1, keepdim=True).values
        positive = (logits.detach() == top.detach()).to(logits.dtype)
        pos = (positive * torch.relu(top - self.margin).square()).sum(dim=1)
        neg = ((1.0 - positive) * torch.relu(top.detach() - logits - self.margin).square()).sum(dim=1)
        return self.lambda_pos * pos + self.lambda_neg / (logits.shape[1] - 1) * neg

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        ce = nll(torch.log_softmax(logits, dim=1), target)
        return self.reduce(ce + self.alpha * self.regulariser(logits), valid)

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, alpha={self.alpha}, lambda_pos={self.lambda_pos}, "
            f"lambda_neg={self.lambda_neg}, {super().extra_repr()}"
        )
