"""Small datasets written by tests in the real on-disk layouts and formats."""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np

from mcseg.data.synthetic import phantom


def write_msd(root: Path, n_cases: int = 6, shape=(24, 28, 20), spacing=(0.9, 0.9, 2.5), channels: int = 1,
              seed: int = 0) -> Path:
    """An MSD task folder (dataset.json, imagesTr/, labelsTr/) of 3-class phantoms with an oblique affine."""
    (root / "imagesTr").mkdir(parents=True, exist_ok=True)
    (root / "labelsTr").mkdir(parents=True, exist_ok=True)
    affine = np.diag(list(spacing) + [1.0])
    affine[:3, 3] = (-40.0, 12.5, 7.0)
    training = []
    for i in range(n_cases):
        image, label = phantom(tuple(shape), seed, i)
        label = np.where(label >= 2, 2, label)  # 3 classes: background, crescent, ring+pool
        data = image if channels == 1 else np.stack([image * (c + 1) for c in range(channels)], axis=-1)
        name = f"case_{i:03d}.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.float32), affine), str(root / "imagesTr" / name))
        nib.save(nib.Nifti1Image(label.astype(np.uint8), affine), str(root / "labelsTr" / name))
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    description = {
        "name": "fake", "tensorImageSize": "4D" if channels > 1 else "3D",
        "modality": {str(c): f"MR{c}" for c in range(channels)},
        "labels": {"0": "background", "1": "crescent", "2": "core"},
        "numTraining": n_cases, "training": training,
    }
    (root / "dataset.json").write_text(json.dumps(description, indent=1))
    return root
