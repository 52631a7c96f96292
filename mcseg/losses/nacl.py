"""Neighbour-aware calibration loss (NACL)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import SegmentationLoss, check_choice, check_float
from .cross_entropy import nll
from .neighbourhood import PADDINGS, device_kernel, kernel_repr, make_kernel, smooth_labels

__all__ = ["NACLLoss"]


class NACLLoss(SegmentationLoss):
    """Neighbour-aware calibration loss (Murugesan et al., MICCAI 2023; arXiv 2401.14487).

    ``CE + alpha * mean_{voxels, k} |tau_k - z_k|`` (``distance="l2"``: squared), with z
    the RAW logits (as published, not probabilities) and ``tau_k`` the share of class k in
    the ``kernel_size^d`` window around the voxel (see :mod:`mcseg.losses.neighbourhood`).
    The penalty is averaged over non-ignored voxels AND the K classes, as the official
    ``.mean()``. 2D and 3D inputs.

    Windows: ``"mean"`` (published default), ``"gaussian"`` (sampled Gaussian, normalised),
    ``"svls"`` (the SVLS window, centre 1/2: what the official code's ``"gaussian"`` option
    builds). Borders: ``"background"`` (the official 2D code zero-pads the label map, so the
    outside counts as class 0), ``"replicate"`` (the official code's Gaussian option),
    ``"zeros"`` (outside counts for no class: MONAI's ``NACLLoss``, which equals this loss
    with ``kernel="mean", padding="zeros"``). Ignored voxels are left out of tau.

    Args:
        alpha: penalty weight >= 0; default 0.1.
        kernel: ``"mean"`` (default), ``"gaussian"`` or ``"svls"``.
        kernel_size: odd window size; default 3 (>= 3 for ``"svls"``).
        sigma: Gaussian sigma for ``"gaussian"``/``"svls"``; default 1.
        padding: ``"background"`` (default), ``"replicate"`` or ``"zeros"``.
        distance: ``"l1"`` (default) or ``"l2"``.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    spatial_dims = (2, 3)

    def __init__(
        self,
        alpha: float = 0.1,
        kernel: str = "mean",
        kernel_size: int = 3,
        sigma: float = 1.0,
        padding: str = "background",
        distance: str = "l1",
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.alpha = check_float("alpha", alpha, low=0.0)
        make_kernel(kernel, kernel_size, sigma, 2)  # validates kernel, kernel_size, sigma
        self.kernel, self.kernel_size, self.sigma = kernel, kernel_size, float(sigma)
        self.padding = check_choice("padding", padding, PADDINGS)
        self.distance = check_choice("distance", distance, ("l1", "l2"))

    def neighbour_target(self, target: Tensor, valid: Tensor | None, num_classes: int, dtype: torch.dtype) -> Tensor:
        kernel = device_kernel(self.kernel, self.kernel_size, self.sigma, target.ndim - 1, target.device, dtype)
        return smooth_labels(target, valid, num_classes, kernel, self.padding, dtype)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        tau = self.neighbour_target(target, valid, logits.shape[1], logits.dtype)
        gap = tau - logits
        penalty = (gap.abs() if self.distance == "l1" else gap.square()).mean(dim=1)
        return self.reduce(nll(torch.log_softmax(logits, dim=1), target) + self.alpha * penalty, valid)

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, {kernel_repr(self.kernel, self.kernel_size, self.sigma)}, "
            f"padding={self.padding!r}, distance={self.distance!r}, {super().extra_repr()}"
        )
