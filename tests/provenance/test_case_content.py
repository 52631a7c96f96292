"""Checkpoints record the content of their split's cases, and a run refuses data of other content (issue #12).

On the package's two tiny runs (conftest.py).
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from mcseg.training.checkpoint import save_checkpoint
from mcseg.inference.build import load_checkpoint
from mcseg.errors import ConfigError
from mcseg.train import train

from ..conftest import compose_config
from ..fake_datasets import write_msd

from .conftest import TINY_MSD, GEOMETRY, copy_run, evaluate_with, read


def _split_of(run: Path) -> dict:
    return read(run / "split.json")


def _overwrite_case(root: Path, case: str, with_case: str) -> None:
    """``case``'s files replaced by those of ``with_case`` (same names, other content)."""
    for folder in ("imagesTr", "labelsTr"):
        shutil.copyfile(root / folder / f"{with_case}.nii.gz", root / folder / f"{case}.nii.gz")


def test_checkpoints_record_the_content_of_every_case_of_their_split(runs):
    state = load_checkpoint(runs.run2d / "checkpoints/best.pt")
    split = _split_of(runs.run2d)
    assert {part: set(cases) for part, cases in state["content"].items()} == \
        {part: set(split[part]) for part in ("train", "val", "test")}
    assert len({fp for part in state["content"].values() for fp in part.values()}) == 6  # six different cases
    assert state["dataset"]["content_sha256"] and state["classes_unseen_in_training"] == []
    summary = read(runs.run2d / "eval/test/summary.json")
    assert summary["provenance"]["dataset"]["content_sha256"] == state["dataset"]["content_sha256"]
    assert summary["provenance"]["seen_in_training"] == {}


def test_a_resume_on_data_of_other_content_is_refused_naming_the_cases_and_a_moved_copy_is_accepted(runs, tmp_path):
    """#22.1: the same case names with other files (a validation and a test case replaced by a training
    case's) used to resume silently: the names were all the record compared."""
    from mcseg.data.build import build_dataset
    from mcseg.evaluation.provenance import content_lookup
    from mcseg.training.relaunch import check_launch
    from mcseg.rundir import LaunchRefused

    run = copy_run(runs.run2d, tmp_path / "run")
    (run / "result.json").unlink()  # as if interrupted
    split = _split_of(run)
    state = load_checkpoint(run / "checkpoints/last.pt")
    changed = shutil.copytree(runs.msd_a, tmp_path / "changed")
    _overwrite_case(changed, split["val"][0], split["train"][0])
    _overwrite_case(changed, split["test"][0], split["train"][0])
    moved = shutil.copytree(runs.msd_a, tmp_path / "moved")

    def launch(root: Path):
        config = json.loads(json.dumps(state["config"]))
        config["dataset"]["root"] = str(root)
        from omegaconf import OmegaConf

        dataset = build_dataset(OmegaConf.create(config["dataset"]))
        return check_launch(run, True, False, config, content_lookup(dataset))

    with pytest.raises(LaunchRefused, match="2 case\\(s\\) of the run's split differ in content") as refused:
        launch(changed)
    assert f"{split['val'][0]} (val)" in str(refused.value) and f"{split['test'][0]} (test)" in str(refused.value)
    assert launch(moved) == run / "checkpoints/last.pt"


def test_an_evaluation_on_another_root_that_holds_training_cases_warns_and_records_them(runs, make_cfg, tmp_path,
                                                                                           caplog):
    """#22.1: a checkpoint evaluated with dataset.root=<some of the same cases> draws its own split and scored
    a training case as a test case without a word; now by content, whatever the names."""
    from mcseg.report.collect import collect_runs
    from mcseg.report.table import build_rows

    run = copy_run(runs.run2d, tmp_path / "run")
    split = _split_of(run)
    other = write_msd(tmp_path / "other", n_cases=3, seed=5, prefix="x")
    trained = split["train"][0]
    _overwrite_case(other, "x_001", "x_000")  # placeholder names first ...
    for folder in ("imagesTr", "labelsTr"):  # ... then x_001 holds the training case's files under another name
        shutil.copyfile(runs.msd_a / folder / f"{trained}.nii.gz", other / folder / "x_001.nii.gz")
    with caplog.at_level(logging.WARNING):
        summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/best.pt", "dataset=msd",
                                                     f"dataset.root={other}", "split=all"])
    assert summary["provenance"]["seen_in_training"] == {"train": {"x_001": trained}}
    assert any("WARNING: 1 of the 3 scored cases are, by content, cases of" in r.message and "x_001" in r.message
               for r in caplog.records)
    out = run / "eval/msd-all"
    assert read(out / "provenance.json")["seen_in_training"] == {"train": {"x_001": trained}}
    # the run's own evaluation scored no seen case; a report over an evaluation that did marks it
    shutil.rmtree(run / "eval/test")
    shutil.copytree(out, run / "eval/test")
    rows = build_rows(collect_runs([run]), baseline=None, n_boot=10)
    assert rows[0].seen_in_training == [str(run)]


def test_a_checkpoint_without_content_fingerprints_compares_case_ids_and_says_content_was_not_checked(
        runs, make_cfg, tmp_path, caplog):
    """Issue #34 section 3, no fingerprints: a checkpoint without content fingerprints (older, or stripped)
    evaluated on a folder that holds its training cases recorded seen_in_training {} and said nothing; when
    content cannot be compared, case ids are, and the evaluation says that content was not checked."""
    run = copy_run(runs.run2d, tmp_path / "run")
    state = load_checkpoint(run / "checkpoints/best.pt")
    del state["content"]
    save_checkpoint(run / "checkpoints/best.pt", state)
    split = _split_of(run)
    other = shutil.copytree(runs.msd_a, tmp_path / "other")  # the same cases, under the same names
    with caplog.at_level(logging.WARNING):
        summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}", "dataset=msd", f"dataset.root={other}",
                                                     "split=all"])
    seen = summary["provenance"]["seen_in_training"]
    assert seen == {part: {c: c for c in split[part]} for part in ("train", "val")}
    assert summary["provenance"]["content_checked"] is False
    assert any("no content fingerprints" in r.message and "by case id" in r.message and "content not checked"
               in r.message for r in caplog.records)


def test_a_checkpoint_copied_from_a_run_of_another_configuration_is_refused(runs, make_cfg, tmp_path):
    """#22.2: a focal run's checkpoint copied into this CE run's checkpoints/ has the same split and was taken
    for another checkpoint of the run (its fit joined this run's calibration.json)."""
    run = copy_run(runs.run2d, tmp_path / "run")
    state = load_checkpoint(run / "checkpoints/best.pt")
    state["config"]["loss"] = {"_target_": "mcseg.losses.FocalLoss", "gamma": 3.0}
    save_checkpoint(run / "checkpoints/focal.pt", state)
    calibration = (run / "calibration.json").read_bytes()
    with pytest.raises(ValueError, match="its configuration is not its run's .*loss") as refused:
        evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/focal.pt"])
    # issue #34 section 3 (smaller): the run's own value was labelled "checkpoint:"; each value names its owner
    assert "loss._target_='mcseg.losses.FocalLoss' in the checkpoint, 'mcseg.losses." in str(refused.value)
    assert f"in {run / 'checkpoints/best.pt'}" in str(refused.value) and "(checkpoint:" not in str(refused.value)
    assert (run / "calibration.json").read_bytes() == calibration
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/focal.pt", f"eval_dir={tmp_path / 'elsewhere'}"])
    assert summary["provenance"]["run_dir"] is None


def test_a_class_without_a_voxel_in_the_training_split_is_warned_of_and_marked(runs, tmp_path, caplog, capsys,
                                                                               monkeypatch):
    """#22.1: a training split without any voxel of class 2 trained and reported its Dice like any other's."""
    import nibabel as nib

    split = _split_of(runs.run2d)
    data = shutil.copytree(runs.msd_a, tmp_path / "no_core")
    for case in split["train"]:
        path = data / "labelsTr" / f"{case}.nii.gz"
        img = nib.load(str(path))
        label = np.asarray(img.dataobj)
        nib.save(nib.Nifti1Image(np.where(label == 2, 1, label).astype(np.uint8), img.affine), str(path))
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        train(compose_config("train", TINY_MSD + [f"dataset.root={data}", *GEOMETRY["2d"], "trainer.max_epochs=1",
                                                  "posthoc.fit=[]", "posthoc.apply=[]",
                                                  f"dataset.split.file={runs.run2d / 'split.json'}"], tmp_path / "run"))
    assert any("class 'core' has no voxel in the training split" in r.message for r in caplog.records)
    summary = read(tmp_path / "run/eval/test/summary.json")
    assert summary["provenance"]["classes_unseen_in_training"] == ["core"]
    assert "(no voxel of it in the training split)" in capsys.readouterr().out


def test_a_shift_suite_of_another_modality_is_refused_naming_both(runs, make_cfg, tmp_path):
    """Issue #34 section 3, shift=ct on MRI: it ran without a word, adding noise and window shifts defined in
    Hounsfield units to MRI intensities (the window shift then degraded nothing). Each preset states its modality;
    a dataset of another one is refused naming both, before anything is written."""
    before = sorted(p for p in runs.run3d.rglob("*") if p.is_file())
    with pytest.raises(ConfigError, match=r"shift=ct is defined for CT .* dataset msd is MRI"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={runs.run3d}", "shift=ct", "shift.levels=[1]"])
    assert sorted(p for p in runs.run3d.rglob("*") if p.is_file()) == before
    from mcseg.data.shift import modality_of  # MSD's modality and nnU-Net's channel_names, read

    assert modality_of(["T1", "T2"]) == modality_of(["FLAIR"]) == modality_of(["MRI"]) == "MRI"
    assert modality_of(["CT"]) == modality_of(["non-contrast CT"]) == "CT"
    assert modality_of(["PET", "CT"]) is None and modality_of(["noise"]) is None
