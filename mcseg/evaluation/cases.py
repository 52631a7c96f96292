"""Predict a list of cases and feed the evaluator: the one path for validation and evaluation."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from mcseg.data.cases import CaseData
from mcseg.data.io import write_nifti
from mcseg.config import EvalProtocol
from mcseg.evaluation.evaluator import Evaluator
from mcseg.inference.predict import SegmentationPredictor
from mcseg.metrics.failure import FailureDetection, micro_foreground_dice
from mcseg.metrics.uncertainty import MAPS, MemberAccumulator, entropy, normalise
from mcseg.runtime import share_cpu


def evaluate_cases(
    predictor: SegmentationPredictor, cases: Iterable[CaseData], evaluator: Evaluator, restore: Callable,
    out_dir: Path | None = None, save_predictions: bool = False, save_probabilities: bool = False,
    save_uncertainty: bool = False, on_logits: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    keep: int = 0,
    posthoc: Mapping[str, tuple[Callable[[torch.Tensor, CaseData], torch.Tensor], Evaluator, bool]] | None = None,
    failure: FailureDetection | None = None, restore_maps: Callable | None = None,
    raters: Callable[[CaseData], np.ndarray | None] | None = None,
    rater_image: Callable[[CaseData], np.ndarray] | None = None, changes: ArgmaxChanges | None = None,
) -> list[tuple[CaseData, torch.Tensor]]:
    """Segment each case, add it to ``evaluator`` and write the requested NIfTI files.

    ``restore(case, probs)`` maps probabilities back to the original geometry (the dataset's
    :meth:`~mcseg.data.base.SegmentationDataset.restore`). ``on_logits(logits, label)``
    receives ``1 x K x *S`` logits and the ``1 x *S`` label
    (the loss's validation hook). ``posthoc`` maps a name to ``(transform, evaluator, keeps_argmax)``:
    the case's logits, transformed (``transform(logits, case)``, e.g. divided by a temperature), also go to
    that evaluator, one probability tensor at a time; with ``keeps_argmax`` it scores the raw prediction
    (with a large T, float32 probabilities of nearly equal classes can round to a tie and move the arg-max). Returns the first ``keep`` cases with their predicted label
    maps and normalised predictive entropy (for image logging). ``changes`` counts, per post-hoc entry, the scored
    voxels whose label the transformed probabilities give differently from the raw prediction (for every entry,
    also those that keep the arg-max by construction: it is measured, not assumed).

    ``failure`` receives each case's normalised uncertainty maps (:func:`uncertainty_maps` on the label's grid:
    ``restore_maps`` maps several members' back, as ``restore`` does probabilities), its error voxels inside
    ``failure.region`` and its risk (``failure.risk``: 1 - the macro or micro foreground Dice); ``save_uncertainty``
    writes the maps (in nats) as NIfTI.

    ``raters(case)`` gives a case's raters' label maps on the file grid (the dataset's
    :meth:`~mcseg.data.base.SegmentationDataset.original_raters`; ``None`` for a case with one label): the
    evaluator then scores against them, and against the label maps of the predictor's members (mapped back as
    one-hot maps, each voxel to its most probable class) when it has several; ``rater_image(case)`` the raw CT
    on that grid, for ``evaluation.rater_crop=curvas2024``.
    """
    predictor.eval()
    if raters is not None:
        predictor.keep_member_labels = True
    after = {name: t.transforms for name, (t, _, _) in (posthoc or {}).items() if isinstance(t, PerNetwork)}
    kept = []
    pred_dir = (out_dir / "predictions") if out_dir is not None else None
    for case in cases:
        share_cpu(predictor.device)  # a busy machine: fewer torch threads (mcseg.runtime.AdaptiveThreads)
        logits, members, pooled_after = predictor.predict(case, after)
        if on_logits is not None:
            on_logits(logits[None], torch.from_numpy(case.label).to(logits.device)[None])
        probs = predictor.probabilities(logits)
        if not posthoc:  # never more than two volume-sized K x *S tensors: logits and probabilities, briefly
            del logits  # (post-hoc scalers need the logits again, once these probabilities are freed)
        if len(kept) < keep:  # for image logging, in the network's space: prediction and normalised entropy
            entropy_map = (members.maps(normalised=True)["predictive_entropy"] if members is not None else
                           normalise({"predictive_entropy": entropy(probs, predictor.multilabel)}, probs.shape[0],
                                     predictor.multilabel)["predictive_entropy"])
            kept.append((case, predictor.label_map(probs).cpu(), entropy_map.cpu()))
        probs, label, spacing, affine = restore(case, probs)
        label = torch.as_tensor(label, device=probs.device)
        rater_maps = raters(case) if raters is not None else None
        against = {} if rater_maps is None else {  # the figures against several raters
            "raters": rater_maps, "rater_names": getattr(ref_of(case), "rater_names", None),
            "samples": member_labels(case, members, restore_maps, probs.shape[0]),
            "image": rater_image(case) if rater_image is not None else None}
        row = evaluator.add_case(case.case_id, probs, label, spacing, **against)
        pred = predictor.label_map(probs)
        maps = None
        if failure is not None or (pred_dir is not None and save_uncertainty):
            maps = uncertainty_maps(case, probs, members, restore_maps, predictor.multilabel)
        if failure is not None:
            detect_failure(failure, evaluator, case.case_id, row, maps, probs.shape[0], pred, label, spacing)
        ref = ref_of(case)
        source = ref.image_paths[0] if ref is not None and ref.image_paths else None  # its header is copied
        if pred_dir is not None and save_predictions:
            arr = pred.cpu().numpy()
            write_nifti(pred_dir / f"{case.case_id}.nii.gz", _channel_last(arr) if predictor.multilabel else arr,
                        affine, source)
        if pred_dir is not None and save_probabilities:
            write_nifti(pred_dir / f"{case.case_id}_probs.nii.gz", _channel_last(probs.float().cpu().numpy()), affine,
                        source)
        if pred_dir is not None and save_uncertainty:
            write_uncertainty(pred_dir, case.case_id, maps, members is not None, affine, source)
        del probs, maps
        for name, (transform, extra_evaluator, keeps_argmax) in (posthoc or {}).items():
            z = pooled_after[name] if name in pooled_after else transform(logits, case)
            scaled, label, spacing, _ = restore(case, predictor.probabilities(z))
            if changes is not None:
                changes.add(name, predictor.label_map(scaled), pred)
            scaled_against = against if keeps_argmax else {**against, "samples": None}  # members' maps: unscaled
            extra_evaluator.add_case(case.case_id, scaled, torch.as_tensor(label, device=scaled.device), spacing,
                                     prediction=pred if keeps_argmax else None, **scaled_against)
            del scaled
        del pred
    return kept


def failure_detection(protocol: EvalProtocol) -> FailureDetection | None:
    """The protocol's failure detection (its voxel region, risk, bootstrap resamples and seed); None when off."""
    if not protocol.failure_detection:
        return None
    return FailureDetection(MAPS, region=protocol.failure_region or protocol.region, risk=protocol.failure_risk,
                            bootstrap_samples=protocol.bootstrap_samples, seed=protocol.seed)


def detect_failure(failure: FailureDetection, evaluator: Evaluator, case_id: str, row: dict,
                   maps: dict[str, torch.Tensor], channels: int, pred: torch.Tensor, label: torch.Tensor,
                   spacing) -> None:
    """Add one scored case to ``failure``: its uncertainty ``maps`` (nats, on the label's grid, of ``channels``
    probability channels; normalised here),
    the error voxels of the prediction ``pred`` inside ``failure.region``, and its risk (``failure.risk``: 1 - the
    macro foreground Dice of the evaluator's ``row``, or the micro one)."""
    multilabel = evaluator.multilabel
    errors = (pred != label).any(0) if multilabel else pred != label
    dice = row["mean_foreground_dice"] if failure.risk == "macro" else micro_foreground_dice(pred, label, multilabel)
    failure.add_case(case_id, normalise(maps, channels, multilabel), errors,
                     evaluator.region_of(label, pred, spacing, failure.region), 1.0 - dice)


def write_uncertainty(folder: Path, case_id: str, maps: dict[str, torch.Tensor], members: bool, affine,
                      source: Path | None) -> None:
    """The case's uncertainty maps (nats) as ``<case>_<suffix>.nii.gz``: the predictive entropy, and with several
    ``members`` the expected entropy and mutual information too (:data:`UNCERTAINTY_FILES`)."""
    for name, suffix in UNCERTAINTY_FILES.items():
        if members or name == "predictive_entropy":
            write_nifti(Path(folder) / f"{case_id}_{suffix}.nii.gz", maps[name].float().cpu().numpy(), affine, source)


def ref_of(case: CaseData):
    return case.meta.get("ref") if case.meta else None


def member_labels(case: CaseData, members: MemberAccumulator | None, restore_maps: Callable | None,
                  num_classes: int) -> torch.Tensor | None:
    """``N x *S`` the members' label maps on the file grid (``None`` without members): each member's one-hot map
    mapped back as probabilities are (:meth:`~mcseg.data.base.SegmentationDataset.restore_maps`), then its
    arg-max; exact where preprocessing only reorients, crops and pads."""
    if members is None or not members.labels:
        return None
    out = []
    for labels in members.labels:
        if restore_maps is not None:
            onehot = torch.nn.functional.one_hot(labels.long(), num_classes).movedim(-1, 0).float()
            labels = restore_maps(case, onehot).argmax(0)
        out.append(labels)
    return torch.stack(out)


class ArgmaxChanges:
    """Per post-hoc entry: how many voxels (and cases) a transform gave another label than the raw prediction,
    counted over EVERY voxel of each volume, not only the scored region (``voxels`` is the volumes' total size;
    ``multilabel``: ``R x *S`` maps, a voxel counts once if any region's label differs)."""

    def __init__(self, multilabel: bool = False) -> None:
        self.multilabel = multilabel
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, name: str, labels: torch.Tensor, raw: torch.Tensor) -> None:
        differs = labels != raw
        if self.multilabel:
            differs = differs.any(0)
        n = int(differs.sum())
        count = self.counts.setdefault(name, {"voxels_changed": 0, "voxels": 0, "cases_changed": 0, "cases": 0})
        count["voxels_changed"] += n
        count["voxels"] += differs.numel()
        count["cases_changed"] += int(n > 0)
        count["cases"] += 1


@dataclasses.dataclass
class PerNetwork:
    """A post-hoc entry of :func:`evaluate_cases` applied before pooling (``posthoc.pool=after``): one logit
    transform ``(logits, case)`` per network of the predictor (an ensemble's members, in order)."""

    transforms: list[Callable[[torch.Tensor, CaseData], torch.Tensor]]


# uncertainty map -> file name suffix (``<case>_<suffix>.nii.gz``); a single network writes the first only
UNCERTAINTY_FILES = {"predictive_entropy": "entropy", "expected_entropy": "expected_entropy",
                     "mutual_information": "mutual_information"}


def uncertainty_maps(case: CaseData, probs: torch.Tensor, members: MemberAccumulator | None,
                     restore_maps: Callable | None, multilabel: bool) -> dict[str, torch.Tensor]:
    """The case's uncertainty maps (nats) on the label's grid: a single network's from its restored
    probabilities (mutual information 0), several members' from their accumulator, mapped back."""
    if members is None:
        single = MemberAccumulator(multilabel)
        single.add(probs)
        return single.maps()
    maps = members.maps()
    if restore_maps is None:
        return maps
    names = list(maps)
    restored = restore_maps(case, torch.stack([maps[n] for n in names]))
    return {name: restored[i] for i, name in enumerate(names)}


def _channel_last(arr: np.ndarray) -> np.ndarray:
    """``C x *S`` to ``*S x C``: NIfTI keeps channels (time, components) on the last axis."""
    return np.moveaxis(arr, 0, -1)
