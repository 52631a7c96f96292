"""Whole-volume inference, shared by validation, ``evaluate.py`` and reports.

2D models run slice-wise (slices batched, each padded to the network's size divisor and
cropped back); 3D models run MONAI's sliding window with Gaussian blending. The result is
float32 logits ``K x *S`` in the case's own geometry.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from monai.inferers import sliding_window_inference

from mcseg.config import InferenceConfig  # the schema of the ``inference`` node; importable here too

log = logging.getLogger(__name__)


def _pad_to_multiple(x: torch.Tensor, divisor: int) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """Pad the trailing spatial axes of ``x`` (B x C x *S) up to multiples of ``divisor``."""
    spatial = x.shape[2:]
    before = [(-(-n // divisor) * divisor - n) // 2 for n in spatial]
    after = [-(-n // divisor) * divisor - n - b for n, b in zip(spatial, before)]
    pad = [v for b, a in reversed(list(zip(before, after))) for v in (b, a)]
    crop = tuple(slice(b, b + n) for b, n in zip(before, spatial))
    return F.pad(x, pad), (slice(None), slice(None)) + crop


def autocast_context(device: torch.device, precision: str):
    """bf16 autocast on CUDA when asked for; full precision elsewhere."""
    if precision == "bf16" and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def predict_logits(
    model: torch.nn.Module, image: torch.Tensor, model_dims: int, divisor: int, cfg: InferenceConfig,
    roi_size: list[int] | None = None, precision: str = "32", slice_axis: int = -1,
) -> torch.Tensor:
    """Logits ``K x *S`` (float32) for one image ``C x *S`` already on the model's device.

    A 2D model segments a 3D image slice by slice along spatial axis ``slice_axis`` (the
    axis it was trained across, ``dataset.sampling.slice_axis``).
    """
    device = image.device
    spatial_dims = image.ndim - 1
    with autocast_context(device, precision):
        if model_dims == 2 and spatial_dims == 3:
            axis = slice_axis % 3 + 1
            slices = image.movedim(axis, 0)  # Z x C x X x Y
            outs = []
            for start in range(0, slices.shape[0], cfg.sw_batch_size):
                padded, crop = _pad_to_multiple(slices[start : start + cfg.sw_batch_size], divisor)
                outs.append(model(padded)[crop].float())
            return torch.cat(outs, 0).movedim(0, axis)
        if model_dims == 2:
            padded, crop = _pad_to_multiple(image[None], divisor)
            return model(padded)[crop][0].float()
        if spatial_dims != 3:
            raise ValueError(f"a 3D model cannot segment a {spatial_dims}D image")
        roi = list(cfg.roi_size or roi_size or [])
        if len(roi) != 3 or any(r % divisor for r in roi):
            raise ValueError(f"inference.roi_size={roi}: expected 3 sizes, each a multiple of {divisor}")
        window = dict(roi_size=roi, sw_batch_size=cfg.sw_batch_size, predictor=model, overlap=cfg.overlap,
                      mode=cfg.blend_mode)
        try:
            return sliding_window_inference(image[None], **window)[0].float()
        except torch.OutOfMemoryError:
            if device.type == "cpu":
                raise
            # As nnU-Net does: keep the windows on the accelerator, stitch the volume in host memory.
            log.warning("out of memory stitching a %s volume on %s; stitching on the CPU", tuple(image.shape), device)
            torch.cuda.empty_cache()
            return sliding_window_inference(image[None], sw_device=device, device="cpu", **window)[0].float()
