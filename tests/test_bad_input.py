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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_dataset_json_cannot_point_outside_root(tmp_path):
    import json

    root = write_msd(tmp_path / "msd")
    desc = json.loads((root / "dataset.json").read_text())
    desc["training"][0]["image"] = "../../etc/passwd"
    (root / "dataset.json").write_text(json.dumps(desc))
    _fails_with(MSD_TINY + [f"dataset.root={root}"], tmp_path, "outside the dataset root")


@pytest.mark.slow
def test_dataset_without_root_names_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("MCSEG_ACDC_ROOT", raising=False)
    _fails_with(["dataset=acdc", "debug=fast"], tmp_path, "dataset.root")


# --------------------------------------------------------------------------- bad data is found at start
def _msd_cfg(make_cfg, root, *overrides):
    return make_cfg(MSD_TINY + [f"dataset.root={root}", *overrides])


def _move_label(label, fn):
    """Rewrite ``label`` with its affine changed by ``fn`` (voxels kept)."""
    img = nib.load(label)
    affine = img.affine.copy()
    fn(affine)
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), affine), str(label))


def _set_header(path, qform_code=1, sform_code=1, units=("mm", "sec")):
    img = nib.load(path)
    img.header.set_qform(img.affine, code=qform_code)
    img.header.set_sform(img.affine, code=sform_code)
    img.header.set_xyzt_units(*units)
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), img.affine, img.header), str(path))


@pytest.mark.parametrize("move", [
    pytest.param(lambda a: a.__setitem__((0, 3), a[0, 3] + 20.0), id="origin-shifted-20mm"),
    pytest.param(lambda a: a.__setitem__((slice(0, 3), slice(0, 3)), a[:3, :3] * 2), id="spacing-doubled"),
])
def test_label_elsewhere_in_world_space_is_refused_at_start(tmp_path, make_cfg, move):
    from mcseg.data.io import VolumeError
    from mcseg.train import train

    root = write_msd(tmp_path / "msd")
    _move_label(root / "labelsTr/case_004.nii.gz", move)
    cfg = _msd_cfg(make_cfg, root)
    with pytest.raises(VolumeError, match=r"labelsTr/case_004.nii.gz: label affine differs .* dataset.geometry_check"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_geometry_opt_out_runs_and_predictions_keep_the_input_header(tmp_path, make_cfg):
    """dataset.geometry_check=off accepts a shifted label; the predicted NIfTI files carry the
    input's qform/sform codes and units (issue #12 items 5 and 15); evaluate.py refuses a truncated
    file of the split it scores before scoring."""
    from mcseg.train import train

    root = write_msd(tmp_path / "msd")
    for path in (root / "imagesTr").glob("*.nii.gz"):
        _set_header(path, qform_code=1, sform_code=2)
    _move_label(root / "labelsTr/case_004.nii.gz", lambda a: a.__setitem__((0, 3), a[0, 3] + 20.0))
    result = train(_msd_cfg(make_cfg, root, "dataset.geometry_check=off", "posthoc.fit=[]", "posthoc.apply=[]",
                            "trainer.max_epochs=1"))
    assert result["test/mean_foreground_dice"] is not None
    predictions = sorted((tmp_path / "run" / "eval" / "test" / "predictions").glob("case_*.nii.gz"))
    assert predictions
    for pred in predictions:
        written, source = nib.load(pred).header, nib.load(root / "imagesTr" / pred.name).header
        assert (int(written["qform_code"]), int(written["sform_code"])) == (1, 2)
        assert written.get_xyzt_units() == source.get_xyzt_units() == ("mm", "sec")
        np.testing.assert_allclose(written.get_qform(), source.get_qform(), atol=1e-5)
        np.testing.assert_allclose(written.get_sform(), source.get_sform(), atol=1e-5)

    # evaluate.py checks the split it scores the same way before scoring
    from mcseg.data.io import VolumeError
    from mcseg.evaluate import evaluate

    test_case = predictions[0].name
    raw = (root / "imagesTr" / test_case).read_bytes()
    (root / "imagesTr" / test_case).write_bytes(raw[: len(raw) // 2])
    cfg = make_cfg([f"ckpt={tmp_path}/run/checkpoints/best.pt", f"eval_dir={tmp_path}/again"], config_name="evaluate",
                   output_dir=tmp_path / "evaluate")
    with pytest.raises(VolumeError, match=rf"imagesTr/{test_case}: cannot read volume .*checked before scoring"):
        evaluate(cfg)
    assert not (tmp_path / "again").exists()


def test_corrupt_test_split_file_is_refused_before_training(tmp_path, make_cfg):
    import json
    import time

    from mcseg.data.io import VolumeError
    from mcseg.train import train

    root = write_msd(tmp_path / "msd")
    split = {"train": ["case_000", "case_001", "case_002"], "val": ["case_003"], "test": ["case_004", "case_005"]}
    (tmp_path / "split.json").write_text(json.dumps(split))
    image = root / "imagesTr/case_005.nii.gz"
    raw = image.read_bytes()
    image.write_bytes(raw[: len(raw) // 2])  # a truncated copy: the header still reads
    cfg = _msd_cfg(make_cfg, root, f"dataset.split.file={tmp_path / 'split.json'}")
    start = time.perf_counter()
    with pytest.raises(VolumeError, match=r"imagesTr/case_005.nii.gz: cannot read volume") as failure:
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists(), "refused only after training"
    assert "checked before training" in str(failure.value)
    assert time.perf_counter() - start < 10


def test_posthoc_without_validation_cases_is_refused_at_start(tmp_path, make_cfg):
    from mcseg.errors import ConfigError
    from mcseg.train import train

    root = write_msd(tmp_path / "msd")
    cfg = _msd_cfg(make_cfg, root, "dataset.split.val_fraction=0", "posthoc.fit=[temperature]",
                   "posthoc.apply=[temperature]")
    with pytest.raises(ConfigError, match=r"posthoc.fit.*dataset.split.val_fraction=0"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("layout", ["root", "images_folder", "files"])
def test_symlinked_dataset_folders_are_accepted(tmp_path, layout):
    """Cluster layouts: the root, imagesTr/ or each file a symlink to shared storage (issue #12 item 13)."""
    import shutil

    from mcseg.data.io import read_header
    from mcseg.data.msd import MSDDataset
    from mcseg.data.validate import validate_cases

    root = write_msd(tmp_path / "msd", n_cases=3)
    shared = tmp_path / "shared"
    shared.mkdir()
    if layout == "root":
        (tmp_path / "link").symlink_to(root, target_is_directory=True)
        root = tmp_path / "link"
    elif layout == "images_folder":
        shutil.move(root / "imagesTr", shared / "imagesTr")
        (root / "imagesTr").symlink_to(shared / "imagesTr", target_is_directory=True)
    else:
        for path in sorted((root / "imagesTr").iterdir()):
            shutil.move(path, shared / path.name)
            path.symlink_to(shared / path.name)
    dataset = MSDDataset(str(root))
    refs = dataset.case_refs()
    assert [r.case_id for r in refs] == ["case_000", "case_001", "case_002"]
    validate_cases(dataset, refs)
    assert read_header(refs[0].image_paths[0]).shape == (24, 28, 20)


@pytest.mark.parametrize("entry", ["../outside/case_000.nii.gz", "./imagesTr/../../outside/case_000.nii.gz",
                                   "/etc/passwd"])
def test_dataset_json_entries_leaving_the_root_are_refused(tmp_path, entry):
    import json

    from mcseg.data.msd import MSDDataset

    root = write_msd(tmp_path / "msd", n_cases=3)
    desc = json.loads((root / "dataset.json").read_text())
    desc["training"][1]["label"] = entry
    (root / "dataset.json").write_text(json.dumps(desc))
    with pytest.raises(ValueError, match=r"dataset.json: entry .* points outside the dataset root .* as written"):
        MSDDataset(str(root)).case_refs()
