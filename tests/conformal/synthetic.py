"""Synthetic cases for the conformal tests: each case's labels drawn from true voxel probabilities, the model's
probabilities a case-level miscalibration of them (so cases differ, as real ones do), all seeded."""
from __future__ import annotations

import numpy as np
import torch

from mcseg.conformal import default_thresholds, summarise
from mcseg.conformal.fit import CaseSummary, predicted_masks
from mcseg.conformal.risks import class_masks


def synthetic_case(rng: np.random.Generator, shape=(12, 14), classes: int = 3, absent: int | None = None):
    """Probabilities ``C x *S`` (float32) and an integer label map; ``absent``: a class the label never holds."""
    z = torch.from_numpy(rng.normal(size=(classes, *shape)) * 2.0)
    z[1:] += torch.from_numpy(rng.normal(size=(classes - 1,) + (1,) * len(shape)))  # case-level class prevalence
    truth_p = torch.softmax(z, 0)
    if absent is not None:
        truth_p[absent] = 0
        truth_p /= truth_p.sum(0, keepdim=True)
    u = torch.from_numpy(rng.random(shape))
    label = (truth_p.cumsum(0) < u).sum(0).clamp_max(classes - 1)
    model = torch.softmax(z * float(np.exp(rng.normal(0, 0.5))), 0)  # over- or under-confident, per case
    return model.float(), label


def synthetic_summaries(rng: np.random.Generator, n: int, thresholds=None, absent_every: int = 0,
                        **kw) -> CaseSummary:
    thresholds = default_thresholds() if thresholds is None else thresholds
    out = []
    for i in range(n):
        absent = 2 if absent_every and i % absent_every == 0 else None
        probs, label = synthetic_case(rng, absent=absent, **kw)
        truth = class_masks(label, probs.shape[0], False)
        out.append(summarise(f"case_{i:04d}", probs, truth, predicted_masks(probs, False), (1.0, 1.0), thresholds,
                             classes=range(1, probs.shape[0])))
    return CaseSummary.stack(out)
