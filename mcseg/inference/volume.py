"""Whole-volume inference, shared by validation, ``evaluate.py`` and reports.

2D models run slice-wise (slices batched, each padded to the network's size divisor, and at least
to the training patch, and cropped back; a network of fixed input size, UNETR, through a 2D sliding
window of that size); 3D models run MONAI's sliding window with Gaussian blending. The result is
float32 logits ``K x *S`` in the case's own geometry, on the image's device.

A device allocation failure while stitching a 3D volume (:func:`is_out_of_memory`) is retried
once with the windows on the device and the volume stitched in host memory (as nnU-Net does);
the stitched logits go back to the device, where the caller's statistics live. cuDNN's
autotuner is off during inference (:func:`cudnn_autotuner_off`): validation volumes differ in shape,
and each new shape would be benchmarked anew.
"""
from __future__ import annotations

import gc
import itertools
import logging
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F

from mcseg.config import InferenceConfig
from mcseg.models import final_output

log = logging.getLogger(__name__)

# Allocation failures that are not torch.OutOfMemoryError: cuDNN and cuBLAS report theirs as a
# plain RuntimeError, and CUDA's own ("CUDA error: out of memory") may surface the same way.
ALLOCATION_FAILURES = ("out of memory", "cudnn_status_alloc_failed", "cublas_status_alloc_failed")


def _pad_to_multiple(x: torch.Tensor, divisor: int,
                     minimum: list[int] | None = None) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """Pad the trailing spatial axes of ``x`` (B x C x *S) up to multiples of ``divisor``, and to at
    least ``minimum`` (the training patch: a smaller input could leave the network a bottleneck of
    one voxel, which instance norm cannot normalise)."""
    spatial = x.shape[2:]
    minimum = list(minimum or [0] * len(spatial))
    target = [max(-(-n // divisor) * divisor, m) for n, m in zip(spatial, minimum)]
    before = [(t - n) // 2 for n, t in zip(spatial, target)]
    after = [t - n - b for n, t, b in zip(spatial, target, before)]
    pad = [v for b, a in reversed(list(zip(before, after))) for v in (b, a)]
    crop = tuple(slice(b, b + n) for b, n in zip(before, spatial))
    return F.pad(x, pad), (slice(None), slice(None)) + crop


def autocast_context(device: torch.device, precision: str):
    """bf16 autocast on CUDA when asked for; full precision elsewhere."""
    if precision == "bf16" and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, is a device allocation failure (MONAI
    re-raises one met while building its Gaussian map as a RuntimeError ``from`` it)."""
    while exc is not None:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in ALLOCATION_FAILURES):
            return True
        exc = exc.__cause__
    return False


def host_stitching_helps(device: torch.device) -> bool:
    """Stitching in host memory frees device memory only when the device is not the host."""
    return device.type != "cpu"


def release_memory(device: torch.device) -> None:
    """Free what a failed attempt left: unreachable tensors, then the caching allocator's blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def sliding_window_inference(*args, **kwargs):
    """MONAI's ``monai.inferers.sliding_window_inference``, imported at the first call: importing any MONAI module
    loads all of MONAI (docs/benchmarks.md, "Start-up"), which only a prediction needs. One name in this module, so
    that tests can stand in for it (tests/test_gpu_cluster.py)."""
    from monai.inferers import sliding_window_inference as monai_sliding_window

    return monai_sliding_window(*args, **kwargs)


def stitch_on_host(image: torch.Tensor, window: dict) -> torch.Tensor:
    """Sliding-window logits with the windows on ``image``'s device and the volume in host memory:
    MONAI's buffered path blends one slab of windows (along the longest axis) on the device and
    adds it to the host volume, one transfer per slab instead of one per window."""
    longest = max(range(image.ndim - 1), key=lambda axis: image.shape[axis + 1])
    return sliding_window_inference(image[None], sw_device=image.device, device="cpu", buffer_steps=1,
                                    buffer_dim=longest, **window)[0].float()


@contextmanager
def cudnn_autotuner_off():
    """cuDNN's autotuner off: it would benchmark every new volume shape anew (restored after)."""
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = benchmark


def mirror_combinations(mirror_axes) -> list[tuple[int, ...]]:
    """Every non-empty subset of ``mirror_axes`` (spatial axes of the network's input), as tensor
    dims of a ``B x C x *S`` batch."""
    axes = [a + 2 for a in mirror_axes]
    return [c for n in range(1, len(axes) + 1) for c in itertools.combinations(axes, n)]


@torch.no_grad()
def predict_logits(
    model: torch.nn.Module, image: torch.Tensor, model_dims: int, divisor: int, cfg: InferenceConfig,
    roi_size: list[int] | None = None, precision: str = "32", slice_axis: int = -1,
    input_size: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Logits ``K x *S`` (float32) for one image ``C x *S`` already on the model's device.

    With ``cfg.mirror_axes`` (test-time mirroring, as nnU-Net does) each window or slice batch also
    goes through the network flipped along every non-empty subset of those axes of the network's
    input, and the logits, flipped back, are averaged: ``z = mean_A flip_A(f(flip_A(x)))`` over the
    2^n subsets A (the empty one included).

    A 2D model segments a 3D image slice by slice along spatial axis ``slice_axis`` (the
    axis it was trained across, ``dataset.sampling.slice_axis``), each slice padded to a multiple of
    ``divisor`` and at least to ``roi_size`` (the training patch). A network with a fixed
    ``input_size`` (UNETR) sees windows of exactly that size, in 2D too: the slices go through
    a 2D sliding window (padded where smaller). Only the final output of a network with
    deep-supervision outputs is used (:func:`~mcseg.models.final_output`).
    """
    device = image.device
    spatial_dims = image.ndim - 1
    flips = mirror_combinations(cfg.mirror_axes)

    def net(x: torch.Tensor) -> torch.Tensor:  # B x C x *S, the network's own spatial axes
        out = final_output(model(x))
        if not flips:
            return out
        for axes in flips:
            out = out + final_output(model(x.flip(axes))).flip(axes)
        return out / (len(flips) + 1)

    def segment_2d(batch: torch.Tensor) -> torch.Tensor:  # B x C x X x Y, any size
        if input_size is not None:
            return sliding_window_inference(batch, roi_size=list(input_size), sw_batch_size=cfg.sw_batch_size,
                                            predictor=net, overlap=cfg.overlap, mode=cfg.blend_mode).float()
        padded, crop = _pad_to_multiple(batch, divisor, roi_size if roi_size and len(roi_size) == 2 else None)
        return net(padded)[crop].float()

    with autocast_context(device, precision), cudnn_autotuner_off():
        if model_dims == 2 and spatial_dims == 3:
            axis = slice_axis % 3 + 1
            slices = image.movedim(axis, 0)  # Z x C x X x Y
            outs = [segment_2d(slices[start : start + cfg.sw_batch_size])
                    for start in range(0, slices.shape[0], cfg.sw_batch_size)]
            return torch.cat(outs, 0).movedim(0, axis)
        if model_dims == 2:
            return segment_2d(image[None])[0]
        if spatial_dims != 3:
            raise ValueError(f"a 3D model cannot segment a {spatial_dims}D image")
        roi = list(input_size or cfg.roi_size or roi_size or [])
        if len(roi) != 3 or any(r % divisor for r in roi):
            raise ValueError(f"inference.roi_size={roi}: expected 3 sizes, each a multiple of {divisor}")
        window = dict(roi_size=roi, sw_batch_size=cfg.sw_batch_size, predictor=net, overlap=cfg.overlap,
                      mode=cfg.blend_mode)
        try:
            return sliding_window_inference(image[None], **window)[0].float()
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            if not (is_out_of_memory(exc) and host_stitching_helps(device)):
                raise
            log.warning("out of memory stitching a %s volume on %s (%s); stitching in host memory",
                        tuple(image.shape), device, str(exc).splitlines()[0])
        # Retried after the except block: its traceback would keep the failed attempt's buffers alive.
        release_memory(device)
        return stitch_on_host(image, window).to(device)
