"""Tiny labelled folders for the new-case statements: labels (two nested ellipsoids, anisotropic spacing), images,
and MONAI SaveImage folders of noisy softmax probabilities for 20 calibration and 10 new cases."""
from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from tests.tool_outputs import blob_label, make_monai

SPACING = (1.2, 0.9, 2.0)
CALIBRATION = [f"case_{i:03d}" for i in range(20)]
NEW = [f"case_{i:03d}" for i in range(20, 30)]


def write_case(folder: Path, case: str, array: np.ndarray, tag: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case}{tag}.nii.gz"
    nib.save(nib.Nifti1Image(array, np.diag([*SPACING, 1.0])), str(path))
    return path


@pytest.fixture(scope="package")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("statements")
    rng = np.random.default_rng(0)
    for i, case in enumerate(CALIBRATION + NEW):
        label = blob_label((12, 10, 8), seed=i)
        part = "fit_labels" if case in CALIBRATION else "new_labels"
        write_case(root / part, case, label)
        write_case(root / "labels", case, label)
        write_case(root / "images", case, (label * 50 + rng.normal(0, 10, label.shape)).astype(np.float32), "_0000")
    return {"root": root, "labels": root / "labels", "fit_labels": root / "fit_labels",
            "images": root / "images",
            "fit": make_monai(root / "fit", root / "fit_labels", noise=1.2, seed=1),
            "new": make_monai(root / "new", root / "new_labels", noise=1.2, seed=2)}
