"""Uncertainty maps of a predictor with several members (ensemble, MC-dropout samples, TTA views).

Members are pooled as **probabilities** (ValUES, Jungo & Reyes): :math:`\\bar p = \\frac1M\\sum_m p_m`. Per voxel,
with the natural log and :math:`0 \\ln 0 := 0`:

* predictive entropy  :math:`PE = -\\sum_c \\bar p_c \\ln \\bar p_c` (total uncertainty);
* expected entropy    :math:`EE = \\frac1M \\sum_m \\big(-\\sum_c p_{mc} \\ln p_{mc}\\big)` (aleatoric);
* mutual information  :math:`MI = PE - EE \\ge 0` (epistemic; 0 for one member);
* one minus the top-label probability :math:`1 - \\max_c \\bar p_c` (ValUES' single-network map).

:class:`MemberAccumulator` keeps only two sums over members (:math:`\\sum_m p_m` and
:math:`\\sum_m \\sum_c p_{mc}\\ln p_{mc}`), so memory does not grow with M. ``normalised=True`` divides the
entropies by :math:`\\ln C` (C classes), into [0, 1], where a fixed threshold needs it (UEO's 11 thresholds).
Multi-label (sigmoid) outputs: the entropies are those of C independent Bernoulli variables, summed over the
C regions, and the top-label map is :math:`\\max_c \\min(\\bar p_c, 1 - \\bar p_c)`.
"""
from __future__ import annotations

import math

import torch

MAPS = ("predictive_entropy", "expected_entropy", "mutual_information", "one_minus_max_prob")


def entropy(probs: torch.Tensor, multilabel: bool = False) -> torch.Tensor:
    """``-sum_c p ln p`` over the class axis 0 (``C x *S`` -> ``*S``); multi-label: the Bernoulli entropies
    ``-(p ln p + (1-p) ln(1-p))`` summed over regions. ``0 ln 0 = 0`` (``torch.xlogy``)."""
    plogp = torch.xlogy(probs, probs)
    if multilabel:
        plogp = plogp + torch.xlogy(1 - probs, 1 - probs)
    return -plogp.sum(0)


class MemberAccumulator:
    """Pools the probabilities of a predictor's members for one case, one member at a time.

    ``add(probs)`` takes one member's ``C x *S`` probabilities (softmax, or sigmoid with ``multilabel``);
    :meth:`mean` is :math:`\\bar p`, :meth:`maps` the uncertainty maps of the module docstring.
    """

    def __init__(self, multilabel: bool = False, keep_labels: bool = False) -> None:
        self.multilabel = multilabel
        self.members = 0
        self.keep_labels = keep_labels
        self.labels: list[torch.Tensor] = []  # with keep_labels: each member's label map (uint8), for the GED
        self.sum_probs: torch.Tensor | None = None
        self.sum_entropy: torch.Tensor | None = None

    def add(self, probs: torch.Tensor) -> None:
        probs = probs.float()
        if self.keep_labels:
            self.labels.append((probs > 0.5).to(torch.uint8) if self.multilabel else probs.argmax(0).to(torch.uint8))
        if self.sum_probs is None:
            self.sum_probs, self.sum_entropy = probs.clone(), entropy(probs, self.multilabel)
        else:
            if probs.shape != self.sum_probs.shape:
                raise ValueError(f"member {self.members + 1} predicts shape {tuple(probs.shape)}, the first member "
                                 f"{tuple(self.sum_probs.shape)}: members must agree on classes and geometry")
            self.sum_probs += probs
            self.sum_entropy += entropy(probs, self.multilabel)
        self.members += 1

    def mean(self) -> torch.Tensor:
        if not self.members:
            raise ValueError("no member was added")
        return self.sum_probs / self.members

    def maps(self, normalised: bool = False) -> dict[str, torch.Tensor]:
        """The four maps (``*S`` each; :func:`normalise` with ``normalised``)."""
        mean = self.mean()
        predictive = entropy(mean, self.multilabel)
        expected = self.sum_entropy / self.members
        # MI >= 0 by Jensen's inequality; float rounding can leave -1e-7 where the members agree
        mutual = (predictive - expected).clamp_min(0.0)
        # multi-label: one minus the confidence of the least confident region, min(p, 1 - p) at its largest
        top = torch.minimum(mean, 1 - mean).max(0).values if self.multilabel else 1.0 - mean.max(0).values
        maps = dict(zip(MAPS, (predictive, expected, mutual, top)))
        return normalise(maps, mean.shape[0], self.multilabel) if normalised else maps


def normalise(maps: dict[str, torch.Tensor], classes: int, multilabel: bool) -> dict[str, torch.Tensor]:
    """The maps divided by their largest possible value, into [0, 1]: entropies and MI by ``ln C`` (``C ln 2``
    for multi-label), 1 - max probability by ``1 - 1/C`` (0.5 for multi-label)."""
    scale = classes * math.log(2.0) if multilabel else math.log(classes)
    top = 0.5 if multilabel else 1.0 - 1.0 / classes
    return {name: m / (top if name == "one_minus_max_prob" else scale) for name, m in maps.items()}
