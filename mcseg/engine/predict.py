"""Predict a list of cases and feed the evaluator: the one path for validation and evaluation."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from mcseg.data.cases import CaseData
from mcseg.data.io import write_nifti
from mcseg.engine.evaluator import Evaluator, entropy_map
from mcseg.engine.inference import InferenceConfig, predict_logits
from mcseg.runtime import share_cpu


class SegmentationPredictor:
    """A model with what it takes to segment whole cases: dims, size divisor (or fixed input size), link function."""

    def __init__(self, model: torch.nn.Module, model_dims: int, divisor: int, link: Callable, multilabel: bool,
                 cfg: InferenceConfig, roi_size: list[int] | None, precision: str, device: torch.device,
                 slice_axis: int = -1, input_size: tuple[int, ...] | None = None) -> None:
        self.model, self.model_dims, self.divisor, self.link = model, model_dims, divisor, link
        self.slice_axis, self.input_size = slice_axis, input_size
        self.multilabel, self.cfg, self.roi_size, self.precision, self.device = multilabel, cfg, roi_size, precision, device

    def logits(self, case: CaseData) -> torch.Tensor:
        image = torch.from_numpy(case.image).to(self.device)
        return predict_logits(self.model, image, self.model_dims, self.divisor, self.cfg, self.roi_size,
                              self.precision, self.slice_axis, self.input_size)

    def unmirrored(self) -> SegmentationPredictor:
        """This predictor without test-time mirroring (for the validation during training)."""
        if not self.cfg.mirror_axes:
            return self
        plain = copy.copy(self)
        plain.cfg = dataclasses.replace(self.cfg, mirror_axes=[])
        return plain

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return self.link(logits[None])[0]

    def label_map(self, probs: torch.Tensor) -> torch.Tensor:
        return (probs > 0.5).to(torch.uint8) if self.multilabel else probs.argmax(0).to(torch.uint8)


def evaluate_cases(
    predictor: SegmentationPredictor, cases: Iterable[CaseData], evaluator: Evaluator, restore: Callable,
    out_dir: Path | None = None, save_predictions: bool = False, save_probabilities: bool = False,
    save_uncertainty: bool = False, on_logits: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    keep: int = 0,
    posthoc: Mapping[str, tuple[Callable[[torch.Tensor, CaseData], torch.Tensor], Evaluator, bool]] | None = None,
) -> list[tuple[CaseData, torch.Tensor]]:
    """Segment each case, add it to ``evaluator`` and write the requested NIfTI files.

    ``restore(case, probs)`` maps probabilities back to the original geometry (the dataset's
    :meth:`~mcseg.data.base.SegmentationDataset.restore`). ``on_logits(logits, label)``
    receives ``1 x K x *S`` logits and the ``1 x *S`` label
    (the loss's validation hook). ``posthoc`` maps a name to ``(transform, evaluator, keeps_argmax)``:
    the case's logits, transformed (``transform(logits, case)``, e.g. divided by a temperature), also go to
    that evaluator, one probability tensor at a time; with ``keeps_argmax`` it scores the raw prediction
    (with a large T, float32 probabilities of nearly equal classes can round to a tie and move the arg-max). Returns the first ``keep`` cases with their predicted label
    maps (for image logging).
    """
    predictor.model.eval()
    kept = []
    pred_dir = (out_dir / "predictions") if out_dir is not None else None
    for case in cases:
        share_cpu(predictor.device)  # a busy machine: fewer torch threads (mcseg.runtime.AdaptiveThreads)
        logits = predictor.logits(case)
        if on_logits is not None:
            on_logits(logits[None], torch.from_numpy(case.label).to(logits.device)[None])
        probs = predictor.probabilities(logits)
        if not posthoc:  # never more than two volume-sized K x *S tensors: logits and probabilities, briefly
            del logits  # (post-hoc scalers need the logits again, once these probabilities are freed)
        if len(kept) < keep:  # for image logging, in the network's space
            kept.append((case, predictor.label_map(probs).cpu()))
        probs, label, spacing, affine = restore(case, probs)
        label = torch.as_tensor(label, device=probs.device)
        evaluator.add_case(case.case_id, probs, label, spacing)
        pred = predictor.label_map(probs)
        ref = case.meta.get("ref") if case.meta else None
        source = ref.image_paths[0] if ref is not None and ref.image_paths else None  # its header is copied
        if pred_dir is not None and save_predictions:
            arr = pred.cpu().numpy()
            write_nifti(pred_dir / f"{case.case_id}.nii.gz", _channel_last(arr) if predictor.multilabel else arr,
                        affine, source)
        if pred_dir is not None and save_probabilities:
            write_nifti(pred_dir / f"{case.case_id}_probs.nii.gz", _channel_last(probs.float().cpu().numpy()), affine,
                        source)
        if pred_dir is not None and save_uncertainty:
            unc = entropy_map(probs, multilabel=predictor.multilabel)
            write_nifti(pred_dir / f"{case.case_id}_entropy.nii.gz", unc.float().cpu().numpy(), affine, source)
        del probs
        for transform, extra_evaluator, keeps_argmax in (posthoc or {}).values():
            scaled, label, spacing, _ = restore(case, predictor.probabilities(transform(logits, case)))
            extra_evaluator.add_case(case.case_id, scaled, torch.as_tensor(label, device=scaled.device), spacing,
                                     prediction=pred if keeps_argmax else None)
            del scaled
        del pred
    return kept


def _channel_last(arr: np.ndarray) -> np.ndarray:
    """``C x *S`` to ``*S x C``: NIfTI keeps channels (time, components) on the last axis."""
    return np.moveaxis(arr, 0, -1)
