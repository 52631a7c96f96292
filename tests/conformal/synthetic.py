"""Synthetic cases for the conformal tests: each case's labels drawn from true voxel probabilities, the model's
probabilities a case-level miscalibration of them (so cases differ, as real ones do), all seeded; a predictor for
the evaluation's conformal pass (:class:`Oracle`) and mcseg prediction folders (:func:`mcseg_folder`)."""
from __future__ import annotations

import json

import nibabel as nib
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


class Oracle:
    """A predictor of the phantoms (:class:`mcseg.data.synthetic.SyntheticDataset`, 4 classes) as the evaluation's
    conformal pass calls one: logits the case's one-hot label plus noise seeded by the case."""

    multilabel, device = False, torch.device("cpu")

    def predict(self, case):
        g = torch.Generator().manual_seed(int(case.case_id.rsplit("_", 1)[1]))
        onehot = torch.nn.functional.one_hot(torch.as_tensor(case.label).long(), 4).movedim(-1, 0).float()
        return onehot * 3 + torch.randn(onehot.shape, generator=g) * 1.5, None, {}

    def probabilities(self, logits):
        return torch.softmax(logits, 0)


def mcseg_folder(folder, labels, names, seed):
    """mcseg's ``<case>_probs.nii.gz`` and label map of each case of ``names``, and its label in ``labels``."""
    from tests.test_monai_folders import AFFINE
    from tests.tool_outputs import blob_label

    folder.mkdir(parents=True)
    labels.mkdir(exist_ok=True)
    (labels / "dataset.json").write_text(json.dumps({"labels": {"0": "background", "1": "outer", "2": "inner"}}))
    g = torch.Generator().manual_seed(seed)
    for i, name in enumerate(names):
        label = blob_label((11, 9, 6), seed * 100 + i)
        nib.save(nib.Nifti1Image(label, AFFINE), str(labels / f"{name}.nii.gz"))
        z = torch.nn.functional.one_hot(torch.from_numpy(label).long(), 3).movedim(-1, 0) * 3.0
        probs = torch.softmax(z + torch.randn(z.shape, generator=g) * 2.0, 0)
        nib.save(nib.Nifti1Image(np.moveaxis(probs.numpy(), 0, -1), AFFINE), str(folder / f"{name}_probs.nii.gz"))
        nib.save(nib.Nifti1Image(probs.argmax(0).numpy().astype(np.uint8), AFFINE), str(folder / f"{name}.nii.gz"))
