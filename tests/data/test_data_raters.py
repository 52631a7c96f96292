"""Datasets with several raters, read from fixtures written in each download's layout (QUBIQ, CURVAS, LIDC
crops and pickle, nnU-Net with one labels folder per rater): K maps per case, checked like labels, with
errors naming the case and the rater; fingerprints and the split cover every rater's file."""
from __future__ import annotations

import pickle

import nibabel as nib
import numpy as np
import pytest
import torch

from mcseg.data.check import check_case
from mcseg.data.fingerprint import DigestCache, combine, split_fingerprints
from mcseg.data.io import VolumeError
from mcseg.data.raters import hard_label, majority_vote, staple_reference
from mcseg.data.split import make_dataset_split
from mcseg.data.validate import validate_cases
from tests import fake_datasets as fd

from .data_helpers import build


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    """Every layout written once for the module (tests that damage files copy them first)."""
    base = tmp_path_factory.mktemp("raters")
    return {
        "qubiq": fd.write_qubiq(base / "qubiq"),
        "curvas": fd.write_curvas(base / "curvas"),
        "lidc": fd.write_lidc_crops(base / "lidc"),
        "lidc_pickle": fd.write_lidc_pickle(base / "lidc_pickle"),
        "nnunet": fd.write_nnunet_raters(base / "nnunet"),
    }


def _dataset(make_cfg, name, root, *extra):
    overrides = [f"dataset={name}", f"dataset.root={root}", "dataset.preprocess.workers=1", *extra]
    if name == "nnunet":
        overrides.append("+dataset.rater_folders=auto")
    return build(make_cfg, overrides)[0]


# name: (cases, raters per case, num_classes, spatial shape of a loaded case)
EXPECTED = {
    "qubiq": (6, {5, 6}, 2, (40, 36)),
    "curvas": (6, {3}, 4, None),
    "lidc": (6, {4}, 2, (128, 128)),
    "lidc_pickle": (6, {4}, 2, (128, 128)),
    "nnunet": (4, {3}, 4, None),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_rater_map_is_read_as_a_k_stack(make_cfg, downloads, name):
    dataset = _dataset(make_cfg, name, downloads[name])
    n_cases, ks, num_classes, shape = EXPECTED[name]
    refs = dataset.case_refs()
    assert len(refs) == n_cases and dataset.num_classes == num_classes
    assert {len(r.raters) for r in refs} == ks and all(len(r.rater_names) == len(r.raters) for r in refs)
    ref = refs[0]
    raw = dataset.read(ref)
    assert raw.raters.shape == (len(ref.raters), *raw.image.shape[1:])
    assert raw.raters.max() < num_classes and raw.raters.min() == 0 and raw.raters.any()
    np.testing.assert_array_equal(raw.label, majority_vote(raw.raters, num_classes))
    case = dataset.load(ref)  # through preprocessing (and its cache) where the preset has any
    assert case.raters.shape == (len(ref.raters), *case.image.shape[1:])
    if shape is not None:
        assert case.image.shape[1:] == shape
    np.testing.assert_array_equal(case.label, majority_vote(case.raters, num_classes))
    np.testing.assert_array_equal(dataset.original_raters(case), raw.raters)  # the file grid, exactly
    assert not check_case(dataset, ref).errors
    validate_cases(dataset, refs, "the test")


def test_qubiq_raters_per_task_and_case(make_cfg, downloads):
    task1 = _dataset(make_cfg, "qubiq", downloads["qubiq"])
    by_id = {r.case_id: r for r in task1.case_refs()}
    assert sorted(by_id) == ["training_case01", "training_case02", "training_case03", "training_case04",
                             "validation_case01", "validation_case02"]
    assert len(by_id["training_case01"].raters) == 5 and len(by_id["training_case02"].raters) == 6
    assert by_id["training_case02"].rater_names == tuple(f"task01_seg{r:02d}" for r in range(1, 7))
    task2 = _dataset(make_cfg, "qubiq", downloads["qubiq"], "dataset.task=2")
    assert {len(r.raters) for r in task2.case_refs()} == {3}
    split = make_dataset_split(task1, list(by_id), 0.25, 0.0, 0)
    assert split["test"] == ["validation_case01", "validation_case02"]  # the official part
    # the raw image is H x W x 1 on disk: read as a 2D slice
    assert nib.load(str(by_id["training_case01"].image_paths[0])).shape == (40, 36, 1)


def test_curvas_nested_zip_folder_and_official_test(make_cfg, downloads):
    dataset = _dataset(make_cfg, "curvas", downloads["curvas"])
    refs = dataset.case_refs()
    assert refs[0].case_id == "UKCHLL001" and refs[0].rater_names == ("annotation_1", "annotation_2", "annotation_3")
    split = make_dataset_split(dataset, [r.case_id for r in refs], 0.25, 0.0, 0)
    assert split["test"] == ["UKCHLL050", "UKCHLL051"]


def test_lidc_split_keeps_patients_and_series_together(make_cfg, downloads):
    crops = _dataset(make_cfg, "lidc", downloads["lidc"])
    ids = [r.case_id for r in crops.case_refs()]
    assert ids[0] == "LIDC-IDRI-0001_z-100.0_c0"
    split = make_dataset_split(crops, ids, 0.3, 0.0, 0)
    assert split["test"] == [i for i in ids if i.startswith("LIDC-IDRI-0003")]
    for part in split.values():
        assert len({i.rsplit("_z-", 1)[0] for i in part}) * 2 == len(part)
    case = crops.load(crops.case_refs()[0])
    assert case.spacing == (0.5, 0.5)
    assert crops.original_raters(case).shape == (4, 180, 180)  # the crop is undone for evaluation
    pickled = _dataset(make_cfg, "lidc_pickle", downloads["lidc_pickle"])
    ids = [r.case_id for r in pickled.case_refs()]
    split = make_dataset_split(pickled, ids, 0.3, 0.3, 0)
    for part in split.values():
        assert len({i.rsplit("_slice_", 1)[0] for i in part}) * 2 == len(part)


def test_named_rater_as_the_hard_label(make_cfg, downloads):
    dataset = _dataset(make_cfg, "curvas", downloads["curvas"], "dataset.raters.target=annotation_2")
    case = dataset.read(dataset.case_refs()[0])
    np.testing.assert_array_equal(case.label, case.raters[1])
    with pytest.raises(ValueError, match="rater_9: case c has no rater of that name"):
        hard_label(case.raters, ["a", "b", "c"], "rater_9", 4, "c")


def test_majority_ties_go_to_background():
    raters = np.array([[1, 1, 0, 2], [1, 0, 0, 2], [0, 1, 2, 1], [0, 0, 2, 1]])
    np.testing.assert_array_equal(majority_vote(raters, 3), [0, 0, 0, 1])


def test_staple_keeps_unanimous_voxels():
    raters = np.array([[[1, 1, 0, 0], [0, 1, 1, 0]], [[1, 1, 0, 0], [0, 1, 0, 0]], [[1, 0, 0, 0], [0, 1, 1, 0]]])
    ref = staple_reference(raters, 2)
    assert ref.shape == (2, 4) and ref[0, 0] == 1 and ref[1, 1] == 1 and ref[0, 3] == 0
    multi = staple_reference(raters * np.array([[1], [2]]), 3)
    assert multi[0, 0] == 1 and multi[1, 1] == 2 and multi[0, 3] == 0
    assert staple_reference(np.zeros((3, 2, 2), dtype=np.int64), 2).sum() == 0


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_rater_errors_name_the_case_and_the_rater(make_cfg, downloads, tmp_path):
    root = _copy(downloads["curvas"], tmp_path / "curvas")
    bad = root / "training_set" / "training_set" / "UKCHLL002" / "annotation_3.nii.gz"
    img = nib.load(str(bad))
    data = np.asarray(img.dataobj).copy()
    data[0, 0, 0] = 7  # not a class of the task
    nib.save(nib.Nifti1Image(data, img.affine), str(bad))
    shifted = root / "testing_set" / "UKCHLL050" / "annotation_2.nii.gz"
    img = nib.load(str(shifted))
    affine = img.affine.copy()
    affine[0, 3] += 5.0
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), affine), str(shifted))
    dataset = _dataset(make_cfg, "curvas", root)
    refs = {r.case_id: r for r in dataset.case_refs()}
    with pytest.raises(VolumeError, match=r"annotation_3.nii.gz \(case UKCHLL002, rater annotation_3\): label "
                                          r"values \[7\]"):
        dataset.read(refs["UKCHLL002"])
    report = check_case(dataset, refs["UKCHLL002"])
    assert any("rater annotation_3" in e and "[7]" in e for e in report.errors)
    with pytest.raises(VolumeError, match=r"annotation_2.nii.gz \(case UKCHLL050, rater annotation_2\): rater "
                                          r"label affine differs"):
        validate_cases(dataset, [refs["UKCHLL050"]], "the test")
    (root / "testing_set" / "UKCHLL051" / "annotation_1.nii.gz").unlink()
    nnunet = _copy(downloads["nnunet"], tmp_path / "nnunet")
    (nnunet / "labelsTr_rater2" / "rat_001.nii.gz").unlink()
    dataset = _dataset(make_cfg, "nnunet", nnunet)
    with pytest.raises(VolumeError, match=r"rat_001.nii.gz: file not found \(case rat_001, rater rater2\)"):
        validate_cases(dataset, dataset.case_refs(), "the test")


def test_pickle_errors_name_the_slice_and_the_rater(make_cfg, downloads, tmp_path):
    root = tmp_path / "pickle"
    root.mkdir()
    data = pickle.loads((downloads["lidc_pickle"] / "data_lidc.pickle").read_bytes())
    key = sorted(data)[1]
    data[key]["masks"][2] = data[key]["masks"][2][:64]
    (root / "data_lidc.pickle").write_bytes(pickle.dumps(data))
    dataset = _dataset(make_cfg, "lidc_pickle", root)
    ref = dataset.case_refs()[1]
    with pytest.raises(VolumeError, match=rf"case {key}, rater 2\): rater label shape \(64, 128\)"):
        dataset.read(ref)
    assert check_case(dataset, ref).errors


def test_fingerprints_cover_every_rater(make_cfg, downloads, tmp_path):
    root = _copy(downloads["nnunet"], tmp_path / "nnunet")
    dataset = _dataset(make_cfg, "nnunet", root)
    refs = dataset.case_refs()
    before = split_fingerprints(dataset, {"train": refs})["train"]
    cache = DigestCache(root)
    ref = refs[0]
    images = [f"image{i}:{cache.digest(p)}" for i, p in enumerate(ref.image_paths)]
    assert before[ref.case_id] == combine([*images, "label:none",
                                           *(f"rater{r}:{cache.digest(p)}" for r, p in enumerate(ref.raters))])
    path = ref.raters[2]
    img = nib.load(str(path))
    data = np.asarray(img.dataobj).copy()
    data[data == 1] = 0
    nib.save(nib.Nifti1Image(data, img.affine), str(path))
    after = split_fingerprints(dataset, {"train": refs})["train"]
    assert after[ref.case_id] != before[ref.case_id]
    assert all(after[r.case_id] == before[r.case_id] for r in refs[1:])
    assert ref.raters[2] in dataset.source_files(ref)  # the preprocessing cache is stamped by it too
    pickled = _dataset(make_cfg, "lidc_pickle", downloads["lidc_pickle"])
    prints = split_fingerprints(pickled, {"all": pickled.case_refs()})["all"]
    assert len(set(prints.values())) == len(prints)


def test_staple_target_is_cached_apart_from_majority(make_cfg, downloads):
    majority = _dataset(make_cfg, "nnunet", downloads["nnunet"])
    staple = _dataset(make_cfg, "nnunet", downloads["nnunet"], "dataset.raters.target=staple")
    assert staple.cache.dir != majority.cache.dir  # the cached label depends on the target
    ref = staple.case_refs()[0]
    case = staple.load(ref)
    np.testing.assert_array_equal(case.label, staple_reference(case.raters, 4))
    np.testing.assert_array_equal(staple.load(ref).label, case.label)  # from the cache


def test_random_target_draws_one_rater_per_sample_and_iteration(make_cfg, downloads):
    from mcseg.data.sampling import PatchDataset

    dataset = _dataset(make_cfg, "qubiq", downloads["qubiq"], "dataset.raters.target=random")
    case = dataset.load(dataset.case_refs()[1])
    np.testing.assert_array_equal(case.label, majority_vote(case.raters, 2))  # validation's label
    samples = PatchDataset([case], 2, (40, 36), 24, foreground_ratio=0.0, rater_target="random")
    drawn = []
    for i in range(24):
        label = samples[i]["label"].numpy()
        hits = [r for r in range(len(case.raters)) if np.array_equal(label, case.raters[r])]
        assert hits
        drawn.append(hits[0])
        np.testing.assert_array_equal(samples[i]["label"].numpy(), label)  # seeded by the sample
    assert len(set(drawn)) > 2
    np.testing.assert_array_equal(PatchDataset([case], 2, (40, 36), 4)[0]["label"].numpy(), case.label)


def test_mean_target_gives_soft_samples_and_hard_label_losses_refuse_it(make_cfg, downloads, tmp_path):
    from mcseg.data.raters import soft_target
    from mcseg.data.sampling import PatchDataset
    from mcseg.errors import ConfigError
    from mcseg.train import train

    dataset = _dataset(make_cfg, "qubiq", downloads["qubiq"], "dataset.raters.target=mean")
    case = dataset.load(dataset.case_refs()[1])
    np.testing.assert_array_equal(case.label, majority_vote(case.raters, 2))  # validation's label
    sample = PatchDataset([case], 2, (40, 36), 2, foreground_ratio=0.0, rater_target="mean", num_classes=2)[0]
    assert sample["label"].dtype == torch.float32 and sample["label"].shape == (2, 40, 36)
    np.testing.assert_allclose(sample["label"].numpy(), soft_target(case.raters, 2))
    assert set(np.unique(sample["label"][1].numpy() * 6).round(6)) <= set(range(7))  # sixths of 6 raters
    cfg = make_cfg([f"dataset=qubiq", f"dataset.root={downloads['qubiq']}", "dataset.raters.target=mean",
                    "loss=ce_dice", "trainer.device=cpu"])
    with pytest.raises(ConfigError, match="^loss CEDiceLoss needs a hard label per voxel and refuses "
                                          "dataset.raters.target=mean .*=majority, staple, random or a rater's name$"):
        train(cfg)
    assert not (tmp_path / "run" / "split.json").exists()  # refused before anything is written


def _single_rater_copy(rater_root, dest):
    """The nnU-Net rater dataset as a single-rater one: the same images, rater 1's maps as labelsTr/."""
    import shutil

    shutil.copytree(rater_root / "imagesTr", dest / "imagesTr")
    shutil.copytree(rater_root / "labelsTr_rater1", dest / "labelsTr")
    shutil.copy(rater_root / "dataset.json", dest / "dataset.json")
    return dest


@pytest.mark.slow
def test_a_rater_trained_checkpoint_scored_on_a_single_rater_copy_of_its_cases_warns(make_cfg, tmp_path, caplog,
                                                                                     monkeypatch):
    """Issue #43 section 3: a checkpoint trained with raters, evaluated on a single-rater copy of its own data
    (its training cases among the scored ones), said nothing: seen_in_training {} (a case's fingerprint covered
    its raters' files, the copy's its one label). Cases are now found by their images, whatever their labels."""
    import json
    import logging

    from mcseg.evaluate import evaluate
    from mcseg.train import train
    from tests.conftest import compose_config

    from .data_helpers import TINY_RUN

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    raters = fd.write_nnunet_raters(tmp_path / "raters")
    train(make_cfg(["dataset=nnunet", f"dataset.root={raters}", "+dataset.rater_folders=auto",
                    "dataset.raters.target=mean", "loss=ce", "dataset.preprocess.workers=1",
                    "dataset.sampling.patch_size=[16,16,8]", "posthoc.fit=[]", "posthoc.apply=[]",
                    "evaluation.bootstrap_samples=0", *TINY_RUN]))
    run = tmp_path / "run"
    trained = json.loads((run / "split.json").read_text())["train"]
    copy = _single_rater_copy(raters, tmp_path / "single")
    with caplog.at_level(logging.WARNING):
        summary = evaluate(compose_config("evaluate", [f"ckpt={run}", "dataset=nnunet", f"dataset.root={copy}",
                                                      "split=all", "save_predictions=false", "posthoc.apply=[]",
                                                      "evaluation.bootstrap_samples=0", "debug=fast"],
                                          tmp_path / "job"))
    seen = summary["provenance"]["seen_in_training"]
    assert seen.get("train") == {case: case for case in trained}
    assert any("are, by content, cases of" in r.getMessage() for r in caplog.records)


def test_a_case_with_raters_and_its_single_rater_copy_share_their_images_fingerprint(make_cfg, downloads, tmp_path,
                                                                                     monkeypatch):
    """What the evaluation compares (the slow test above runs the whole chain): a checkpoint's recorded ``inputs``
    against the scored cases' images; the content fingerprints, which cover every rater, stay apart."""
    from pathlib import Path

    from mcseg.evaluation.provenance import scored_content

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    raters = _dataset(make_cfg, "nnunet", downloads["nnunet"])
    single = build(make_cfg, ["dataset=nnunet", f"dataset.root={_single_rater_copy(downloads['nnunet'], tmp_path / 's')}"])[0]
    rater_refs, single_refs = raters.case_refs(), single.case_refs()
    assert all(r.raters for r in rater_refs) and not any(r.raters for r in single_refs)
    split = {"train": rater_refs[:2], "val": rater_refs[2:3], "test": rater_refs[3:]}
    state = {"content": split_fingerprints(raters, split), "inputs": split_fingerprints(raters, split, inputs=True)}
    assert split_fingerprints(single, {"all": single_refs})["all"] != \
        {c: fp for part in state["content"].values() for c, fp in part.items()}
    seen, _, _ = scored_content(Path("best.pt"), state, single, single_refs, None)
    assert seen == {"train": {r.case_id: r.case_id for r in rater_refs[:2]}, "val": {rater_refs[2].case_id:
                                                                                     rater_refs[2].case_id}}
