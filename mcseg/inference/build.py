"""Build what training and evaluation both need from a config: the predictor (model + geometry),
and a trained model restored from a checkpoint's stored config; checkpoints are read here without unpickling
code (:mod:`mcseg.training.checkpoint` writes them)."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import DictConfig

from mcseg.data.build import sampling_config
from mcseg.inference.members import untrained_flips
from mcseg.config import InferenceConfig
from mcseg.inference.predict import SegmentationPredictor
from mcseg.models import TWO_D_ONLY, fixed_input_size, size_divisor
from mcseg.targets import instantiate_checked

REQUIRED_KEYS = ("model", "optimizer", "epoch", "config")

log = logging.getLogger(__name__)


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
    unseen = untrained_flips(sampling.dims, sampling.flip_axes, inference.tta, axes)
    if unseen:
        log.warning(
            "inference flips the network's axes %s (%s), which training never flipped (dataset.sampling.flip_axes=%s):"
            " those views are inputs the network never saw, and on anatomy of a fixed orientation they can fail "
            "outright (hippocampus in 2D: Dice 0.85 unflipped, under 0.1 on every flipped view; docs/results.md); "
            "train with dataset.sampling.flip_axes covering them, or use tta=[noise]",
            unseen, " and ".join(n for n, on in (("tta=[flips]", "flips" in inference.tta),
                                                 (f"inference.mirror_axes={axes}", bool(axes))) if on),
            list(sampling.flip_axes))
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


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with ``weights_only=True`` and check its structure."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: not an mcseg checkpoint (a file train.py writes to <run>/checkpoints/); "
                         f"torch.load(weights_only=True) refused it: {_load_error(exc)}") from exc
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path}: checkpoint lacks keys {missing}")
    return state


def _load_error(exc: Exception) -> str:
    """The reason in torch.load's error, without its advice to retry with ``weights_only=False`` (which
    would run whatever code the file holds)."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def load_model_weights(model: torch.nn.Module, weights: dict, source: str | Path) -> None:
    """Load ``weights`` into ``model`` strictly, naming mismatched keys and shapes on failure."""
    own = model.state_dict()
    bad = [k for k, v in weights.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if bad or missing or unexpected:
        details = [f"shape mismatch {k}: {tuple(weights[k].shape)} vs model {tuple(own[k].shape)}" for k in bad[:3]]
        details += [f"missing {missing[:3]}"] if missing else []
        details += [f"unexpected {unexpected[:3]}"] if unexpected else []
        raise ValueError(f"{source}: weights do not fit the configured model: " + "; ".join(details))
    model.load_state_dict(weights)
