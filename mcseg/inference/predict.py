"""Predict whole cases: a network with its members, or an ensemble of networks; the one inference path for
validation and evaluation (:mod:`mcseg.evaluation.cases` feeds its predictions to the evaluator)."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext

import torch

from mcseg.calibration.logit_scaling import inverse_link
from mcseg.data.cases import CaseData
from mcseg.inference.volume import predict_logits
from mcseg.config import InferenceConfig
from mcseg.inference.members import case_seed, check_members, flip_views, mc_dropout, noisy_inputs, seeded
from mcseg.metrics.uncertainty import MemberAccumulator


class SegmentationPredictor:
    """A model with what it takes to segment whole cases: dims, size divisor (or fixed input size), link function.

    With members (``cfg.tta``, ``cfg.mc_samples``: :mod:`mcseg.inference.members`) it predicts each case once per
    member and pools their probabilities; :meth:`logits` then returns the pooled prediction's logits (the
    inverse link of the mean probability, so that post-hoc scalers, fitted or applied, act on the pooled
    prediction: ``posthoc.pool=before``); :meth:`predict` also pools members scaled each by its network's
    own scaler (``posthoc.pool=after``).
    """

    keep_member_labels = False  # each member's label map kept with the pooled prediction (sampled segmentations)

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
        members = MemberAccumulator(self.multilabel, keep_labels=self.keep_member_labels)
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


