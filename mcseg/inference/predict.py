"""Predict a list of cases and feed the evaluator: the one path for validation and evaluation."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from mcseg.data.cases import CaseData
from mcseg.data.io import write_nifti
from mcseg.evaluation.evaluator import Evaluator
from mcseg.inference.volume import InferenceConfig, predict_logits
from mcseg.inference.members import case_seed, check_members, flip_views, mc_dropout, noisy_inputs, seeded
from mcseg.metrics.failure import FailureDetection
from mcseg.metrics.uncertainty import MemberAccumulator, entropy, normalise
from mcseg.runtime import share_cpu


class SegmentationPredictor:
    """A model with what it takes to segment whole cases: dims, size divisor (or fixed input size), link function.

    With members (``cfg.tta``, ``cfg.mc_samples``: :mod:`mcseg.inference.members`) it predicts each case once per
    member and pools their probabilities; :meth:`logits` then returns the pooled prediction's logits (the
    inverse link of the mean probability, so that post-hoc scalers, fitted or applied, act on the pooled
    prediction: ``posthoc.pool=before``); :meth:`predict` also pools members scaled each by its network's
    own scaler (``posthoc.pool=after``).
    """

    def __init__(self, model: torch.nn.Module, model_dims: int, divisor: int, link: Callable, multilabel: bool,
                 cfg: InferenceConfig, roi_size: list[int] | None, precision: str, device: torch.device,
                 slice_axis: int = -1, input_size: tuple[int, ...] | None = None) -> None:
        self.model, self.model_dims, self.divisor, self.link = model, model_dims, divisor, link
        self.slice_axis, self.input_size = slice_axis, input_size
        self.multilabel, self.cfg, self.roi_size, self.precision, self.device = multilabel, cfg, roi_size, precision, device
        check_members(cfg.mc_samples, cfg.tta, cfg.tta_noise_std, model)

    @property
    def n_members(self) -> int:
        views = len(flip_views(self.model_dims, "flips" in self.cfg.tta)) * (2 if "noise" in self.cfg.tta else 1)
        return max(1, int(self.cfg.mc_samples)) * views

    @property
    def pooled(self) -> bool:
        return self.n_members > 1

    def eval(self) -> None:
        self.model.eval()

    def _raw_logits(self, image: torch.Tensor) -> torch.Tensor:
        return predict_logits(self.model, image, self.model_dims, self.divisor, self.cfg, self.roi_size,
                              self.precision, self.slice_axis, self.input_size)

    def _image_dims(self, image: torch.Tensor) -> list[int]:
        """The tensor dims of a ``C x *S`` image that are the network's spatial axes, in their order."""
        spatial = image.ndim - 1
        if self.model_dims == 2 and spatial == 3:
            cut = self.slice_axis % 3
            return [a + 1 for a in range(3) if a != cut]
        return [a + 1 for a in range(spatial)]

    def member_logits(self, case: CaseData) -> Iterator[tuple[int, torch.Tensor]]:
        """``(network, logits)`` of each member (network space), one at a time: every view and sample of this
        network is network 0."""
        image = torch.from_numpy(case.image).to(self.device)
        dims = self._image_dims(image)
        views = flip_views(self.model_dims, "flips" in self.cfg.tta)
        samples = max(1, int(self.cfg.mc_samples))
        seed = int(self.cfg.member_seed)
        for sample in range(samples):
            sampling = mc_dropout(self.model) if self.cfg.mc_samples else nullcontext()
            with sampling, seeded(case_seed(seed, case.case_id, sample + 1), self.device):
                for x in noisy_inputs(image, "noise" in self.cfg.tta, self.cfg.tta_noise_std,
                                      case_seed(seed, case.case_id)):
                    for axes in views:
                        flip = [dims[a] for a in axes]
                        logits = self._raw_logits(x.flip(flip) if flip else x)
                        yield 0, logits.flip(flip) if flip else logits

    def member_probabilities(self, case: CaseData) -> Iterator[torch.Tensor]:
        """Each member's ``C x *S`` probabilities (network space), one at a time."""
        for _, logits in self.member_logits(case):
            yield self.probabilities(logits)

    def predict(self, case: CaseData, after: Mapping[str, Sequence[Callable]] | None = None
                ) -> tuple[torch.Tensor, MemberAccumulator | None, dict[str, torch.Tensor]]:
        """The case's logits, with members their accumulator (the pooled mean and the uncertainty maps), and
        per entry of ``after`` (``posthoc.pool=after``: a scaler's logit transform ``(logits, case)`` per
        network, applied to each member before pooling) the logits of that pooled prediction."""
        if not self.pooled and not after:
            return self.logits(case), None, {}
        members = MemberAccumulator(self.multilabel)
        scaled = {name: MemberAccumulator(self.multilabel) for name in after or {}}
        for network, logits in self.member_logits(case):
            members.add(self.probabilities(logits))
            for name, transforms in (after or {}).items():
                scaled[name].add(self.probabilities(transforms[network](logits, case)))
        return (inverse_link(members.mean(), self.multilabel), members,
                {name: inverse_link(acc.mean(), self.multilabel) for name, acc in scaled.items()})

    def logits(self, case: CaseData) -> torch.Tensor:
        if not self.pooled:
            return self._raw_logits(torch.from_numpy(case.image).to(self.device))
        return self.predict(case)[0]

    def plain(self) -> SegmentationPredictor:
        """This predictor without test-time mirroring and without members (the validation during training:
        one pass per case, as nnU-Net validates)."""
        if not self.cfg.mirror_axes and not self.pooled:
            return self
        plain = copy.copy(self)
        plain.cfg = dataclasses.replace(self.cfg, mirror_axes=[], mc_samples=0, tta=[])
        return plain

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return self.link(logits[None])[0]

    def label_map(self, probs: torch.Tensor) -> torch.Tensor:
        return (probs > 0.5).to(torch.uint8) if self.multilabel else probs.argmax(0).to(torch.uint8)


class EnsemblePredictor(SegmentationPredictor):
    """Several trained networks as one predictor (a deep ensemble): each member predictor's members (its TTA
    views and MC samples too) are pooled as probabilities. Members agree on geometry, classes and link
    (checked where they are built, :mod:`mcseg.evaluation.ensemble`)."""

    def __init__(self, members: list[SegmentationPredictor]) -> None:
        first = members[0]
        self.members = members
        self.model, self.model_dims, self.divisor, self.link = first.model, first.model_dims, first.divisor, first.link
        self.slice_axis, self.input_size, self.multilabel = first.slice_axis, first.input_size, first.multilabel
        self.cfg, self.roi_size, self.precision, self.device = first.cfg, first.roi_size, first.precision, first.device

    @property
    def n_members(self) -> int:
        return sum(m.n_members for m in self.members)

    def eval(self) -> None:
        for member in self.members:
            member.eval()

    def member_logits(self, case: CaseData) -> Iterator[tuple[int, torch.Tensor]]:
        for network, member in enumerate(self.members):
            for _, logits in member.member_logits(case):
                yield network, logits

    def plain(self) -> EnsemblePredictor:
        return EnsemblePredictor([m.plain() for m in self.members])


def inverse_link(probs: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """Logits whose link is ``probs``: ``ln p`` for softmax (softmax(ln p) = p, p summing to 1), the
    logit ``ln p - ln(1 - p)`` for sigmoids; probabilities are kept at least 1e-12 (1e-7 from 0 and 1
    for sigmoids), so that no logit is infinite."""
    if multilabel:
        p = probs.clamp(1e-7, 1 - 1e-7)
        return torch.log(p) - torch.log1p(-p)
    return torch.log(probs.clamp_min(1e-12))


def evaluate_cases(
    predictor: SegmentationPredictor, cases: Iterable[CaseData], evaluator: Evaluator, restore: Callable,
    out_dir: Path | None = None, save_predictions: bool = False, save_probabilities: bool = False,
    save_uncertainty: bool = False, on_logits: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    keep: int = 0,
    posthoc: Mapping[str, tuple[Callable[[torch.Tensor, CaseData], torch.Tensor], Evaluator, bool]] | None = None,
    failure: FailureDetection | None = None, restore_maps: Callable | None = None,
) -> list[tuple[CaseData, torch.Tensor]]:
    """Segment each case, add it to ``evaluator`` and write the requested NIfTI files.

    ``restore(case, probs)`` maps probabilities back to the original geometry (the dataset's
    :meth:`~mcseg.data.base.SegmentationDataset.restore`). ``on_logits(logits, label)``
    receives ``1 x K x *S`` logits and the ``1 x *S`` label
    (the loss's validation hook). ``posthoc`` maps a name to ``(transform, evaluator, keeps_argmax)``:
    the case's logits, transformed (``transform(logits, case)``, e.g. divided by a temperature), also go to
    that evaluator, one probability tensor at a time; with ``keeps_argmax`` it scores the raw prediction
    (with a large T, float32 probabilities of nearly equal classes can round to a tie and move the arg-max). Returns the first ``keep`` cases with their predicted label
    maps and normalised predictive entropy (for image logging).

    ``failure`` receives each case's normalised uncertainty maps (:func:`uncertainty_maps` on the label's grid:
    ``restore_maps`` maps several members' back, as ``restore`` does probabilities), its error voxels inside
    the protocol's region and its risk; ``save_uncertainty`` writes the maps (in nats) as NIfTI.
    """
    predictor.eval()
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
        row = evaluator.add_case(case.case_id, probs, label, spacing)
        pred = predictor.label_map(probs)
        maps = None
        if failure is not None or (pred_dir is not None and save_uncertainty):
            maps = uncertainty_maps(case, probs, members, restore_maps, predictor.multilabel)
        if failure is not None:
            errors = (pred != label).any(0) if predictor.multilabel else pred != label
            failure.add_case(case.case_id, normalise(maps, probs.shape[0], predictor.multilabel), errors,
                             evaluator.region_of(label, pred, spacing), 1.0 - row["mean_foreground_dice"])
        ref = case.meta.get("ref") if case.meta else None
        source = ref.image_paths[0] if ref is not None and ref.image_paths else None  # its header is copied
        if pred_dir is not None and save_predictions:
            arr = pred.cpu().numpy()
            write_nifti(pred_dir / f"{case.case_id}.nii.gz", _channel_last(arr) if predictor.multilabel else arr,
                        affine, source)
        if pred_dir is not None and save_probabilities:
            write_nifti(pred_dir / f"{case.case_id}_probs.nii.gz", _channel_last(probs.float().cpu().numpy()), affine,
                        source)
        if pred_dir is not None and save_uncertainty:  # the predictive entropy; EE and MI too with members
            for name, suffix in UNCERTAINTY_FILES.items():
                if members is not None or name == "predictive_entropy":
                    write_nifti(pred_dir / f"{case.case_id}_{suffix}.nii.gz", maps[name].float().cpu().numpy(),
                                affine, source)
        del probs, maps
        for name, (transform, extra_evaluator, keeps_argmax) in (posthoc or {}).items():
            z = pooled_after[name] if name in pooled_after else transform(logits, case)
            scaled, label, spacing, _ = restore(case, predictor.probabilities(z))
            extra_evaluator.add_case(case.case_id, scaled, torch.as_tensor(label, device=scaled.device), spacing,
                                     prediction=pred if keeps_argmax else None)
            del scaled
        del pred
    return kept


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
