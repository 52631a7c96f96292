"""CRaC: class- and region-adaptive constraints, penalty weights learned by an augmented Lagrangian."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import check_choice, check_float, check_int, one_hot
from .lagrangian import AugmentedLagrangianLoss
from .neighbourhood import device_kernel, smooth_labels

__all__ = ["CRaCLoss", "several_labels"]

#: the authors' window: 3 voxels a side (their ``nn.Unfold(kernel_size=(3, 3), padding=1)``)
WINDOW = 3


def several_labels(target: Tensor, valid: Tensor | None) -> Tensor:
    """``B x 1 x spatial`` bool: the voxel's 3^d window holds more than one label. The label map is padded with
    the background (0), as the authors' zero-padded unfold; ignored voxels (``valid`` False) are left out."""
    x = target.unsqueeze(1).to(torch.float32)  # labels < 2^24 are exact
    high, low = x, x
    if valid is not None:
        keep = valid.unsqueeze(1)
        high, low = x.masked_fill(~keep, -torch.inf), x.masked_fill(~keep, torch.inf)
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[x.ndim - 3]
    pad = (WINDOW // 2,) * (2 * (x.ndim - 2))
    top = pool(F.pad(high, pad, value=0.0), WINDOW, stride=1)
    bottom = -pool(F.pad(-low, pad, value=0.0), WINDOW, stride=1)
    return top != bottom


class CRaCLoss(AugmentedLagrangianLoss):
    """Class- and region-adaptive constraints, CRaC (Murugesan, Silva-Rodriguez, Ben Ayed, Dolz, MICCAI 2024,
    arXiv 2403.12364; code Bala93/CRac, ``calibrate/lagrangian/aug_lagrangian_spatial_cls_bndry.py``).

    ``CE + mean_{voxels} (1 / 2K) sum_{r, k} P(h_{r,k}; lambda_{r,k}, rho_{r,k})`` with the PHR penalty P and its
    multipliers learned per class k AND per region r (boundary, interior) by the augmented Lagrangian of
    :mod:`mcseg.losses.lagrangian` (2K multipliers, updated from the validation pass as CALS's). Per voxel, with
    ``s_k`` the share of class k in the voxel's 3^d window (the label map zero-padded: outside voxels count as
    background):

    * boundary voxel (its window holds more than one label): ``h_k = abs(s_k - z_k)``;
    * interior voxel: ``h_k = abs(m e_yk - z_k)`` (the window is one class, so ``m s_k = m e_yk``);

    and the voxel's h fills its own region's K columns, the other region's columns are 0 (P(0) = 0, but they
    count in the mean over 2K columns, as the authors' ``torch.cat([h * b, h * (1 - b)]).mean()``). z are the raw
    logits. Kept from the authors' code: a multiplier's update averages ``clip(lambda + rho h)`` over EVERY
    validation voxel, so the voxels of the other region (h = 0 there) pull it towards its previous value; the
    rho update compares the mean constraint over every voxel likewise.

    One difference, deliberate: the authors mark a boundary voxel by ``sum_i (mean_j u_j - u_i) != 0`` over the
    window's labels u, which is 0 in exact arithmetic for every window; it is non-zero only through float32
    rounding, for most mixed windows but not all (measured on random 3 x 3 windows of 2 / 3 / 4 classes: 98.7 /
    80 / 87 % of the mixed windows; the others get the interior target m s_k instead of s_k). Here a window is a boundary when it
    holds more than one label, which is what the rounding approximates (tests/losses/test_loss_crac.py shows a
    mixed window their test calls interior). Also: the authors' code is 2D (3 x 3 windows); 3D uses 3 x 3 x 3
    windows; ``ignore_index`` (theirs has none in the penalty) masks CE, the penalty, the multiplier statistics
    and the windows (an ignored voxel counts for no class; shares renormalised as in NACL).

    Args:
        num_classes: K; use ``${dataset.num_classes}``.
        margin: m > 0, the interior target logit of the true class; default 5 (the authors' README commands,
            ``lag.margin=5``; the class default of their config file is 1).
        lambd_min, lambd_max: multiplier bounds; default 1e-6 and 1e6.
        lambd_step: epochs between multiplier updates; default 1.
        rho_min, rho_max: rho bounds (rho starts at rho_min); default 0.1 (the README's ``lag.rho=0.1``) and 10.
        rho_step: epochs between rho updates (0 disables them); default 10.
        gamma: rho growth factor >= 1; default 1.2.
        tao: required constraint decrease ratio; default 0.9.
        dims: the spatial dims of the training patches (``${dataset.sampling.dims}``); None: as they come. A 2D
            network is validated on volumes (the trainer's hook gets ``1 x C x X x Y x Z``): then the volume's slices
            along ``slice_axis`` are the validation batch, as the authors validate slice by slice, so the regions
            and shares are those the training penalises.
        slice_axis: the volume's spatial axis a 2D network is applied across (``${dataset.sampling.slice_axis}``);
            default -1.
        ignore_index: see above.
        reduction: ``"mean"`` only.
    """

    def __init__(
        self,
        num_classes: int,
        margin: float = 5.0,
        lambd_min: float = 1e-6,
        lambd_max: float = 1e6,
        lambd_step: int = 1,
        rho_min: float = 0.1,
        rho_max: float = 10.0,
        rho_step: int = 10,
        gamma: float = 1.2,
        tao: float = 0.9,
        dims: int | None = None,
        slice_axis: int = -1,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(num_classes, lambd_min, lambd_max, lambd_step, rho_min, rho_max, rho_step, gamma, tao,
                         ignore_index, reduction)
        self.margin = check_float("margin", margin, low=0.0, low_open=True)
        self.dims = None if dims is None else check_choice("dims", dims, (1, 2, 3))
        self.slice_axis = check_int("slice_axis", slice_axis)

    @property
    def n_columns(self) -> int:
        """2K: the boundary columns of every class, then the interior ones."""
        return 2 * self.num_classes

    def constraints(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
        """``h`` (``B x K x spatial``) and the boundary indicator (``B x 1 x spatial`` bool)."""
        k, dtype = logits.shape[1], logits.dtype
        kernel = device_kernel("mean", WINDOW, 1.0, logits.ndim - 2, logits.device, dtype)
        shares = smooth_labels(target, valid, k, kernel, "background", dtype)
        boundary = several_labels(target, valid)
        goal = torch.where(boundary, shares, self.margin * one_hot(target, k, dtype))
        return (goal - logits).abs(), boundary

    def constraint_columns(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        h, boundary = self.constraints(logits, target, valid)
        b = boundary.to(h.dtype)
        return torch.cat([h * b, h * (1.0 - b)], dim=1)

    def on_validation_batch(self, logits: Tensor, target: Tensor) -> None:
        """The base's statistics; a volume of a network trained on slices (one spatial dim more than ``dims``)
        enters as the batch of its slices along ``slice_axis``."""
        if self.dims is not None and logits.ndim - 2 == self.dims + 1:
            axis = self.slice_axis % (logits.ndim - 2)
            if target.ndim == logits.ndim:  # B x 1 x spatial
                target = target.squeeze(1)
            logits = logits.movedim(2 + axis, 1).flatten(0, 1)
            target = target.movedim(1 + axis, 1).flatten(0, 1)
        super().on_validation_batch(logits, target)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, dims={self.dims}, slice_axis={self.slice_axis}, {super().extra_repr()}"
