"""Bad input ends the run with a non-zero exit and a message naming the file or key."""
from __future__ import annotations

import gzip

import nibabel as nib
import numpy as np
import pytest

from .conftest import TINY_2D, run_cli
from .fake_datasets import write_msd

MSD_TINY = ["dataset=msd", "debug=fast", "model.channels=[8,16,32]", "model.strides=[2,2]",
            "model.num_res_units=1", "dataset.sampling.patch_size=[32,32]"]


def _fails_with(args: list[str], tmp_path, *needles: str) -> None:
    done = run_cli("train.py", args + [f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode != 0
    message = done.stderr + done.stdout
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message[-2000:]}"


def test_missing_dataset_root(tmp_path):
    _fails_with(MSD_TINY + [f"dataset.root={tmp_path / 'nowhere'}"], tmp_path, "dataset.root", "nowhere")


def test_image_label_shape_mismatch(tmp_path):
    root = write_msd(tmp_path / "msd")
    label = root / "labelsTr/case_002.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((24, 28, 19), np.uint8), np.eye(4)), str(label))
    _fails_with(MSD_TINY + [f"dataset.root={root}"], tmp_path, "case_002.nii.gz", "does not match")


def test_label_value_out_of_range(tmp_path):
    root = write_msd(tmp_path / "msd")
    label = root / "labelsTr/case_001.nii.gz"
    img = nib.load(label)
    data = np.asarray(img.dataobj).copy()
    data[0, 0, 0] = 7
    nib.save(nib.Nifti1Image(data, img.affine), str(label))
    _fails_with(MSD_TINY + [f"dataset.root={root}"], tmp_path, "case_001.nii.gz", "[7]", "num_classes=3")


def test_truncated_nifti(tmp_path):
    root = write_msd(tmp_path / "msd")
    image = root / "imagesTr/case_003.nii.gz"
    raw = image.read_bytes()
    image.write_bytes(raw[: len(raw) // 2])
    _fails_with(MSD_TINY + [f"dataset.root={root}"], tmp_path, "case_003.nii.gz", "cannot read")


def test_misspelt_override_is_named(tmp_path):
    _fails_with(TINY_2D + ["trainer.max_epoch=3"], tmp_path, "max_epoch")


def test_added_unknown_key_is_named(tmp_path):
    _fails_with(TINY_2D + ["+dataset.sampling.batchsize=3"], tmp_path, "dataset.sampling.batchsize")


def test_dataset_json_cannot_point_outside_root(tmp_path):
    import json

    root = write_msd(tmp_path / "msd")
    desc = json.loads((root / "dataset.json").read_text())
    desc["training"][0]["image"] = "../../etc/passwd"
    (root / "dataset.json").write_text(json.dumps(desc))
    _fails_with(MSD_TINY + [f"dataset.root={root}"], tmp_path, "outside the dataset root")


def test_dataset_without_root_names_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("MCSEG_ACDC_ROOT", raising=False)
    _fails_with(["dataset=acdc", "debug=fast"], tmp_path, "dataset.root")
