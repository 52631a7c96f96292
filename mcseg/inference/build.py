"""Build what training and evaluation both need from a config: the predictor (model + geometry),
and a trained model restored from a checkpoint's stored config."""
from __future__ import annotations

import torch
from omegaconf import DictConfig

from mcseg.training.checkpoint import load_model_weights
from mcseg.training.loader import sampling_config
from mcseg.inference.volume import InferenceConfig
from mcseg.inference.predict import SegmentationPredictor
from mcseg.models import TWO_D_ONLY, fixed_input_size, size_divisor
from mcseg.targets import instantiate_checked


def build_predictor(cfg: DictConfig, model, loss_fn, device, inference: InferenceConfig, precision: str) -> SegmentationPredictor:
    """The predictor of ``model`` with the geometry of ``cfg.dataset.sampling`` (dims, slice axis, patch size)."""
    sampling = sampling_config(cfg.dataset)
    if isinstance(model, TWO_D_ONLY) and sampling.dims != 2:
        raise ValueError(f"model: {type(model).__name__} is a 2D network: set dataset.sampling.dims=2")
    divisor, input_size = size_divisor(model), fixed_input_size(model)
    if input_size is not None and tuple(sampling.patch_size) != input_size:
        raise ValueError(
            f"dataset.sampling.patch_size={list(sampling.patch_size)} must equal model.img_size={list(input_size)}: "
            f"{type(model).__name__} takes inputs of exactly that size (model.img_size follows the patch size "
            "unless set)"
        )
    if input_size is not None and inference.roi_size and tuple(inference.roi_size) != input_size:
        raise ValueError(f"inference.roi_size={list(inference.roi_size)}: {type(model).__name__} takes windows of "
                         f"exactly {list(input_size)} (model.img_size); leave inference.roi_size null")
    axes = list(inference.mirror_axes)
    if len(set(axes)) != len(axes) or any(not 0 <= a < sampling.dims for a in axes):
        raise ValueError(f"inference.mirror_axes={axes}: distinct axes of the {sampling.dims}D network's input, "
                         f"each in [0, {sampling.dims})")
    if any(p % divisor for p in sampling.patch_size):
        raise ValueError(
            f"dataset.sampling.patch_size={sampling.patch_size}: each size must be a multiple of {divisor} "
            f"(the network downsamples by {divisor})"
        )
    return SegmentationPredictor(
        model, sampling.dims, divisor, loss_fn.probabilities, bool(getattr(loss_fn, "multilabel", False)),
        inference, sampling.patch_size, precision, device, sampling.slice_axis, input_size,
    )


def restore_model(run_cfg: DictConfig, state: dict, source, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Model (with the checkpoint's weights) and loss (with its state) of a checkpoint's stored config."""
    model = instantiate_checked(run_cfg.model, "model").to(device)
    load_model_weights(model, state["model"], source)
    loss_fn = instantiate_checked(run_cfg.loss, "loss").to(device)
    loss_fn.load_state_dict(state.get("loss", {}))
    return model, loss_fn
