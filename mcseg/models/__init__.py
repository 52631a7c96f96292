"""Backbones: MONAI's networks are built straight from config; only what MONAI lacks lives here.

Besides the networks, what training and inference need to know of any of them: the factor input sizes must
be a multiple of (:func:`size_divisor`), a fixed input size if it has one (:func:`fixed_input_size`),
and which of its outputs are the segmentation and which deep-supervision heads (:func:`final_output`,
:func:`supervision_outputs`).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from mcseg.models.mbls_unet import MbLSUNet2D
from mcseg.models.upconv_unet import UpConvUNet2D

__all__ = ["MbLSUNet2D", "TWO_D_ONLY", "UpConvUNet2D", "computes_unused_outputs", "final_output", "fixed_input_size",
           "size_divisor", "supervision_outputs"]

TWO_D_ONLY = (MbLSUNet2D, UpConvUNet2D)  # mcseg's own 2D-only networks


def _largest_stride_product(strides) -> int:
    """Per spatial axis the product of the strides (an int or one per axis); the largest of these."""
    strides = [s if isinstance(s, (list, tuple)) else [s] for s in strides]
    return max(math.prod(int(s[d % len(s)]) for s in strides) for d in range(max(len(s) for s in strides)))


def size_divisor(model: nn.Module) -> int:
    """The factor every spatial input size must be a multiple of (the network's total downsampling)."""
    if hasattr(model, "size_divisor"):
        return int(model.size_divisor)
    from monai.networks.nets import UNETR, AttentionUnet, BasicUNetPlusPlus, DynUNet, SegResNet, SwinUNETR, UNet

    if isinstance(model, (UNet, AttentionUnet, DynUNet)):
        return _largest_stride_product(model.strides)
    if isinstance(model, BasicUNetPlusPlus):
        return 16  # four 2x max-poolings, whatever the features
    if isinstance(model, SegResNet):
        return 2 ** (len(model.blocks_down) - 1)  # a stride-2 convolution before every level but the first
    if isinstance(model, UNETR):
        return max(model.patch_size)  # ViT tokens of 16 voxels a side
    if isinstance(model, SwinUNETR):
        return int(model.patch_size) ** 5  # patch embedding, then four 2x patch mergings
    return 1


def fixed_input_size(model: nn.Module) -> tuple[int, ...] | None:
    """The one spatial input size the network accepts (UNETR: its ``img_size``), or None if any
    multiple of :func:`size_divisor` will do. A network of mcseg's own may declare ``input_size``."""
    if getattr(model, "input_size", None) is not None:
        return tuple(int(s) for s in model.input_size)
    from monai.networks.nets import UNETR

    if isinstance(model, UNETR):  # its position embeddings are learnt for img_size // 16 tokens per axis
        return tuple(int(f) * int(p) for f, p in zip(model.feat_size, model.patch_size))
    return None


def final_output(output) -> torch.Tensor:
    """The segmentation logits among a network's outputs: a list or tuple (BasicUNetPlusPlus, in
    training and evaluation alike) ends with the full network's output; a tensor is the output."""
    return output[-1] if isinstance(output, (list, tuple)) else output


def supervision_outputs(output, model_dims: int) -> list[torch.Tensor]:
    """Every output a training loss should see, the final one first, then the deep-supervision
    heads from the shallowest to the deepest: a list or tuple (BasicUNetPlusPlus: final last), or a
    tensor with the heads stacked on axis 1 (DynUNet in training mode: final first)."""
    if isinstance(output, (list, tuple)):
        return list(output)[::-1]
    if output.ndim == model_dims + 3:  # B x heads x K x *S
        return list(output.unbind(1))
    return [output]


def computes_unused_outputs(model: nn.Module) -> bool:
    """Whether some parameters get no gradient from the returned outputs: BasicUNetPlusPlus computes
    its four nested outputs and, without deep supervision, returns only the last (DistributedDataParallel
    must then look for parameters without gradients each step)."""
    from monai.networks.nets import BasicUNetPlusPlus

    return isinstance(model, BasicUNetPlusPlus) and not model.deep_supervision
