"""SDC: the signed-distance calibration loss (CE + a morphologically adapted local target + a signed-distance term)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import SegmentationLoss, check_choice, check_float, one_hot
from .cross_entropy import nll

__all__ = ["SDCLoss", "MORPHOLOGIES", "adapted_target", "distance_to", "signed_distance_targets"]

MORPHOLOGIES = ("erosion", "dilation", "opening", "closing", "internal_boundary", "external_boundary", "gradient")
KERNELS = ("mean", "max", "min")
#: the authors' structuring element and aggregation window: 3 x 3 (2D, slice by slice in 3D)
WINDOW = 3


def _dilate(x: Tensor) -> Tensor:
    """3 x 3 binary dilation of ``N x C x H x W``; outside voxels are neutral (OpenCV's default border)."""
    return F.max_pool2d(x, WINDOW, stride=1, padding=WINDOW // 2)


def _erode(x: Tensor) -> Tensor:
    return -_dilate(-x)


def morphology(x: Tensor, op: str) -> Tensor:
    """A 0/1 map ``N x C x H x W`` after the 3 x 3 morphological operation ``op`` (one of :data:`MORPHOLOGIES`)."""
    if op == "erosion":
        return _erode(x)
    if op == "dilation":
        return _dilate(x)
    if op == "opening":
        return _dilate(_erode(x))
    if op == "closing":
        return _erode(_dilate(x))
    if op == "internal_boundary":
        return x - _erode(x)
    if op == "external_boundary":
        return _dilate(x) - x
    return _dilate(x) - _erode(x)  # gradient


def _reflect_101(x: Tensor, dim: int) -> Tensor:
    """Pad one spatial dim by 1 mirrored about the edge voxel (OpenCV's BORDER_REFLECT_101; a single voxel
    mirrors to itself)."""
    n = x.shape[dim]
    lo, hi = (1, n - 2) if n > 1 else (0, 0)
    return torch.cat([x.narrow(dim, lo, 1), x, x.narrow(dim, hi, 1)], dim=dim)


def aggregate(x: Tensor, kernel: str) -> Tensor:
    """3 x 3 local aggregation of ``N x C x H x W``: box mean (OpenCV ``blur``, reflect-101 border), or the max /
    min (``dilate`` / ``erode``)."""
    if kernel == "max":
        return _dilate(x)
    if kernel == "min":
        return _erode(x)
    return F.avg_pool2d(_reflect_101(_reflect_101(x, 2), 3), WINDOW, stride=1)


def _as_slices(x: Tensor) -> tuple[Tensor, tuple[int, ...] | None]:
    """``B x C x H x W [x D]`` -> 2D images ``N x C x H x W`` (the D slices of a volume as images)."""
    if x.ndim == 4:
        return x, None
    b, c, h, w, d = x.shape
    return x.movedim(-1, 1).reshape(b * d, c, h, w), (b, d)


def _from_slices(x: Tensor, shape: tuple[int, ...] | None) -> Tensor:
    if shape is None:
        return x
    b, d = shape
    return x.reshape(b, d, *x.shape[1:]).movedim(1, -1)


def adapted_target(masks: Tensor, morph: str = "gradient", kernel: str = "mean") -> Tensor:
    """The spatially adaptive target ``B x C x spatial`` of class masks (``B x C x spatial`` 0/1): per class the
    3 x 3 ``morph`` of its mask, aggregated by ``kernel``, then divided by its sum over the classes (clamped to
    1e-6, so a voxel no map reaches gets 0 for every class). 2D; a volume slice by slice along its last axis."""
    slices, shape = _as_slices(masks)
    adapted = aggregate(morphology(slices, morph), kernel)
    return _from_slices(adapted / adapted.sum(dim=1, keepdim=True).clamp(min=1e-6), shape)


#: elements of one chunk of the 1D distance transform (a chunk of lines x n x n candidates)
_CHUNK = 1 << 24


def _lower_envelope(f: Tensor, dim: int) -> Tensor:
    """``g(q) = min_p f(p) + (q - p)^2`` along ``dim`` (one pass of the exact squared Euclidean distance transform,
    Saito & Toriwaki 1994), by brute force over the n candidates of each line, in chunks of lines."""
    moved = f.movedim(dim, -1)
    n = moved.shape[-1]
    lines = moved.reshape(-1, n)
    step = torch.arange(n, device=f.device, dtype=f.dtype)
    cost = (step[:, None] - step[None, :]).square()  # [q, p]
    rows = max(1, _CHUNK // (n * n))
    out = torch.cat([(chunk.unsqueeze(1) + cost).amin(dim=-1) for chunk in lines.split(rows)])
    return out.reshape(moved.shape).movedim(-1, dim)


def distance_to(feature: Tensor, dtype: torch.dtype) -> Tensor:
    """Euclidean distance (voxels) from every voxel to the nearest True voxel of ``feature`` (``B x C x spatial``
    bool), per image and class, in ``dtype`` on the tensor's device; 0 where ``feature`` holds no True voxel (the caller
    decides what that means). Exact: the squared distance is separable over the axes."""
    squared = torch.zeros(feature.shape, dtype=dtype, device=feature.device).masked_fill(~feature, torch.inf)
    for dim in range(2, feature.ndim):
        squared = _lower_envelope(squared, dim)
    return torch.where(torch.isinf(squared), 0.0, squared).sqrt()


def signed_distance_targets(masks: Tensor) -> Tensor:
    """Normalised signed distances ``phi`` of ``B x C x spatial`` 0/1 class masks, per image and class: distance to
    the class minus distance to its complement (voxels; positive outside, negative inside), divided by its largest
    magnitude + 1e-6; a class absent from the image is +1 everywhere, one filling it -1."""
    inside = masks > 0.5
    sdf = distance_to(inside, masks.dtype) - distance_to(~inside, masks.dtype)
    spatial = tuple(range(2, masks.ndim))
    phi = sdf / (sdf.abs().amax(dim=spatial, keepdim=True) + 1e-6)
    absent, full = ~inside.any(dim=spatial, keepdim=True), inside.all(dim=spatial, keepdim=True)
    return torch.where(absent, 1.0, torch.where(full, -1.0, phi))


class SDCLoss(SegmentationLoss):
    """Signed-distance calibration loss, SDC (arXiv 2503.05107, 2025; code EagleAdelaide/SDC-Loss,
    ``src/sdc/losses.py::sdc_loss``, ``sam.py``, ``sdf.py``).

    ``CE + alpha mean_{voxels, k} D(t_k, p_k) + lambda_sdf mean_{voxels, k} D(2 p_k - 1, phi_k) / sdf_scale`` with
    D the absolute (``dist: l1``) or squared (``l2``) difference, and per image:

    * ``t`` the spatially adaptive target: per class k, the 3 x 3 morphological ``sam_morph`` of its mask
      (default the gradient, dilation minus erosion: a band of 3 voxels across the class's border), aggregated by
      the 3 x 3 ``sam_kernel`` (default the box mean, reflected borders), then normalised over the classes;
      voxels that no band reaches (inside a region) have ``t = 0`` for every class (with L1 their term is the
      constant 1 / K, without gradient). 2D operations; a volume slice by slice (along D, the last axis of
      ``B x C x H x W x D``, as the authors' slice loop over their ``N x D x H x W``);
    * ``phi_k`` the signed distance of class k: Euclidean distance (voxels) to the class minus distance to its
      complement (positive outside, negative inside), divided by its largest magnitude + 1e-6 (3D in 3D; an exact separable transform on the
      logits' device, where the authors call SciPy's ``distance_transform_edt`` on the host).

    Kept from the authors' code: the SDF target is positive OUTSIDE the class while ``2 p - 1`` is positive
    inside, so this term rewards p_k < 1/2 deep inside class k; its weight is lambda_sdf / sdf_scale = 1e-3.
    Differences: a class absent from an image gets ``phi = +1`` everywhere (one filling the image -1); the
    authors' code gives SciPy's transform a mask without background, which measures the distance to a phantom
    voxel just outside the array's first corner (index -1 on the first axis, 0 on the others): once normalised, a
    map rising along every axis, from 1 / its largest distance at the first corner to 1 at the opposite one, not a
    ramp along one axis. Ignored voxels
    (``ignore_index``; the authors' code has none) belong to no class's mask and are left out of every mean.

    Args:
        alpha: weight of the local-calibration term >= 0; default 0.1.
        lambda_sdf: weight of the signed-distance term >= 0; default 0.1.
        sdf_scale: divisor of the signed-distance term > 0; default 100.
        sam_morph: one of ``erosion, dilation, opening, closing, internal_boundary, external_boundary,
            gradient``; default ``gradient``.
        sam_kernel: ``mean`` (default), ``max`` or ``min`` (the authors' other kernels, Gaussian, bilateral and
            mode, are not provided).
        dist: ``l1`` (default) or ``l2``.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    spatial_dims = (2, 3)

    def __init__(
        self,
        alpha: float = 0.1,
        lambda_sdf: float = 0.1,
        sdf_scale: float = 100.0,
        sam_morph: str = "gradient",
        sam_kernel: str = "mean",
        dist: str = "l1",
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.alpha = check_float("alpha", alpha, low=0.0)
        self.lambda_sdf = check_float("lambda_sdf", lambda_sdf, low=0.0)
        self.sdf_scale = check_float("sdf_scale", sdf_scale, low=0.0, low_open=True)
        self.sam_morph = check_choice("sam_morph", sam_morph, MORPHOLOGIES)
        self.sam_kernel = check_choice("sam_kernel", sam_kernel, KERNELS)
        self.dist = check_choice("dist", dist, ("l1", "l2"))

    def _distance(self, a: Tensor, b: Tensor) -> Tensor:
        """Per voxel ``mean_k D(a_k, b_k)`` (``B x spatial``)."""
        d = a - b
        return (d.abs() if self.dist == "l1" else d.square()).mean(dim=1)

    def targets(self, target: Tensor, valid: Tensor | None, num_classes: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The adaptive target t and the signed distances phi (both ``B x C x spatial``)."""
        masks = one_hot(target, num_classes, dtype)
        if valid is not None:
            masks = masks * valid.unsqueeze(1).to(dtype)
        return adapted_target(masks, self.sam_morph, self.sam_kernel), signed_distance_targets(masks)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs, probs = torch.log_softmax(logits, dim=1), torch.softmax(logits, dim=1)
        adapted, signed = self.targets(target, valid, logits.shape[1], logits.dtype)
        per_voxel = (nll(log_probs, target) + self.alpha * self._distance(adapted, probs)
                     + self.lambda_sdf / self.sdf_scale * self._distance(2.0 * probs - 1.0, signed))
        return self.reduce(per_voxel, valid)

    def extra_repr(self) -> str:
        return (f"alpha={self.alpha}, lambda_sdf={self.lambda_sdf}, sdf_scale={self.sdf_scale}, "
                f"sam_morph={self.sam_morph!r}, sam_kernel={self.sam_kernel!r}, dist={self.dist!r}, "
                f"{super().extra_repr()}")
