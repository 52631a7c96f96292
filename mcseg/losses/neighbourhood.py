"""Neighbourhood kernels and label smoothing by depthwise convolution, shared by SVLS and NACL.

A smoothed label ``tau_k(x) = sum_o w(o) [y(x + o) = k]`` is the one-hot label map convolved
with a window ``w`` (k^d taps, sum 1). Borders follow ``padding``:

* ``"replicate"``: the label map is extended by its edge values (SVLS code);
* ``"background"``: outside voxels are class 0 (the NACL 2D code zero-pads the LABEL map);
* ``"zeros"``: outside voxels count for no class, so tau sums to less than 1 at the border
  (zero-padded one-hot, as MONAI's ``NACLLoss``).

Ignored voxels (``valid`` False) count for no class and the window is renormalised over the
non-ignored voxels and the padding: ``tau = conv(onehot * valid) / conv(valid)``.
"""

from __future__ import annotations

import functools
import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import check_choice, check_float, check_int, one_hot

__all__ = ["KERNELS", "PADDINGS", "device_kernel", "make_kernel", "smooth_labels"]

KERNELS = ("mean", "gaussian", "svls")
PADDINGS = ("replicate", "background", "zeros")


@functools.lru_cache(maxsize=64)
def _kernel(kind: str, size: int, sigma: float, dims: int) -> Tensor:
    r = size // 2
    offsets = torch.tensor(list(itertools.product(range(-r, r + 1), repeat=dims)), dtype=torch.float64)
    sq = offsets.square().sum(dim=1).view((size,) * dims)
    if kind == "mean":
        return torch.ones_like(sq) / sq.numel()
    # Gaussian weights relative to the heaviest tap (centre for "gaussian", nearest neighbours
    # for "svls"), so that nothing underflows to 0/0 as sigma -> 0
    excess = sq - (0.0 if kind == "gaussian" else 1.0)
    w = torch.exp(-torch.where(excess == 0, torch.zeros_like(excess), excess / (2.0 * sigma**2)))
    if kind == "svls":  # centre = sum of the neighbours
        w[(r,) * dims] = 0.0
        w[(r,) * dims] = w.sum()
    return w / w.sum()


def make_kernel(kind: str, size: int, sigma: float, dims: int) -> Tensor:
    """A float64 ``size^dims`` window summing to 1.

    ``"mean"``: uniform. ``"gaussian"``: ``exp(-|o|^2 / 2 sigma^2)`` normalised.
    ``"svls"`` (Islam & Glocker, IPMI 2021): the Gaussian with its centre replaced by the sum
    of the other taps, normalised, so the centre is always 1/2 and the neighbours share 1/2
    by Gaussian weight (2D, sigma 1: edge 0.0778, corner 0.0472).
    """
    check_choice("kernel", kind, KERNELS)
    check_int("kernel_size", size, low=1 if kind != "svls" else 3, odd=True)
    check_float("sigma", sigma, low=0.0, low_open=True)
    check_choice("spatial dims", dims, (1, 2, 3))
    return _kernel(kind, size, float(sigma), dims).clone()


@functools.lru_cache(maxsize=64)
def device_kernel(kind: str, size: int, sigma: float, dims: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """:func:`make_kernel` on ``device`` in ``dtype``, made once: copying it from the host on every
    forward would be a host-to-device copy per training step (on CUDA a synchronisation). Shared:
    do not modify it in place."""
    return make_kernel(kind, size, sigma, dims).to(device, dtype)


def _pad(x: Tensor, r: int, padding: str, fill_first_channel: float) -> Tensor:
    """Pad every spatial dim by ``r``; constant modes fill channel 0 with ``fill_first_channel``."""
    if r == 0:
        return x
    pad = (r, r) * (x.ndim - 2)
    if padding == "replicate":
        return F.pad(x, pad, mode="replicate")
    if fill_first_channel == 0.0:
        return F.pad(x, pad)
    first = F.pad(x[:, :1], pad, value=fill_first_channel)
    return first if x.shape[1] == 1 else torch.cat([first, F.pad(x[:, 1:], pad)], dim=1)


def _depthwise(x: Tensor, kernel: Tensor) -> Tensor:
    c = x.shape[1]
    weight = kernel.to(x).expand(c, 1, *kernel.shape)
    conv = (F.conv1d, F.conv2d, F.conv3d)[x.ndim - 3]
    return conv(x, weight, groups=c)


def smooth_labels(
    target: Tensor, valid: Tensor | None, num_classes: int, kernel: Tensor, padding: str, dtype: torch.dtype
) -> Tensor:
    """``tau`` (``B x C x spatial`` of ``dtype``) from labels ``B x spatial`` (see module docstring)."""
    check_choice("padding", padding, PADDINGS)
    r = kernel.shape[0] // 2
    truth = one_hot(target, num_classes, dtype)
    background = 1.0 if padding == "background" else 0.0
    if valid is None:
        return smooth_probabilities(truth, kernel, padding)
    weight = valid.unsqueeze(1).to(dtype)
    numerator = _depthwise(_pad(truth * weight, r, padding, background), kernel)
    denominator = _depthwise(_pad(weight, r, padding, 0.0 if padding == "replicate" else 1.0), kernel)
    # > 0 at every valid voxel (the centre tap is positive); ignored voxels are masked by the caller
    return numerator / denominator.clamp(min=torch.finfo(dtype).tiny)


def smooth_probabilities(truth: Tensor, kernel: Tensor, padding: str) -> Tensor:
    """``tau`` from ``B x C x spatial`` class probabilities (one-hot labels or a soft target such as the rater
    mean): the window applied to each class map; linear in ``truth``."""
    check_choice("padding", padding, PADDINGS)
    return _depthwise(_pad(truth, kernel.shape[0] // 2, padding, 1.0 if padding == "background" else 0.0), kernel)


def kernel_repr(kind: str, size: int, sigma: float) -> str:
    return f"kernel={kind!r}, kernel_size={size}" + ("" if kind == "mean" else f", sigma={sigma}")
