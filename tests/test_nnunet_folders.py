"""nnU-Net v2 prediction folders, made by nnU-Net's own export code, read and evaluated by mcseg-evaluate-folder.

Every figure is checked against an independent reading (SimpleITK's array order, the npz as nnU-Net wrote it,
no transposition) fed to the same Evaluator, Dice against nnU-Net's own ``compute_metrics``, the ensemble
against nnU-Net's ``average_probabilities``; every check is broken once and must fail in one line.
"""
from __future__ import annotations

import csv
import json
import pickle
import shutil

import numpy as np
import pytest
import SimpleITK as sitk
import torch

from tests.conftest import require

require("nnunetv2", "nnU-Net's export code makes the real nnU-Net files these tests read (README, 'nnU-Net and "
                    "MONAI prediction folders')")

from mcseg.data.cases import to_regions  # noqa: E402
from mcseg.evaluate_folder import main  # noqa: E402
from mcseg.evaluation.evaluator import Evaluator  # noqa: E402
from mcseg.config import EvalProtocol  # noqa: E402
from tests.tool_outputs import make_nnunet  # noqa: E402

FAST = ["--bootstrap-samples", "0", "--no-figures"]


@pytest.fixture(scope="module")
def nn3d(tmp_path_factory):
    return make_nnunet(tmp_path_factory.mktemp("nn3d"), dims=3, members=2)


@pytest.fixture(scope="module")
def nn3d_regions(tmp_path_factory):
    return make_nnunet(tmp_path_factory.mktemp("nn3dr"), dims=3, regions=True)


@pytest.fixture(scope="module")
def nn2d(tmp_path_factory):
    return make_nnunet(tmp_path_factory.mktemp("nn2d"), dims=2)


@pytest.fixture(scope="module")
def nn2d_regions(tmp_path_factory):
    return make_nnunet(tmp_path_factory.mktemp("nn2dr"), dims=2, regions=True)


def _independent(folders, protocol, folder_list=None) -> dict:
    """The summary from SimpleITK arrays (z, y, x), the npz untouched and the spacing reversed: nnU-Net's own
    array order, the opposite of what mcseg reads, so an axis mix-up on either side shows."""
    dataset = json.loads((folders["raw"] / "dataset.json").read_text())
    labels = dataset["labels"]
    regions = [v if isinstance(v, list) else [v] for k, v in labels.items() if v != 0] if "regions_class_order" in \
        dataset else None
    names = [k for k, v in labels.items() if v != 0] if regions else list(labels)
    ev = Evaluator(len(names), names, protocol, multilabel=regions is not None)
    for path in sorted(folders["labels"].glob("*.nii.gz")):
        case = path.name[:-7]
        img = sitk.ReadImage(str(path))
        label = sitk.GetArrayFromImage(img).astype(np.int64)
        probs = [np.load(f / f"{case}.npz")["probabilities"] for f in (folder_list or [folders["pred"]])]
        probs = np.mean(probs, 0) if len(probs) > 1 else probs[0]
        probs = probs.reshape(probs.shape[0], *label.shape)
        seg = sitk.GetArrayFromImage(sitk.ReadImage(str(folders["pred"] / f"{case}.nii.gz"))).astype(np.int64)
        if regions:
            label, seg = to_regions(label, regions), to_regions(seg, regions)
        ev.add_case(case, torch.from_numpy(probs), torch.from_numpy(np.asarray(label, np.int64)),
                    img.GetSpacing()[::-1], prediction=None if folder_list else torch.from_numpy(np.asarray(seg)))
    return json.loads(json.dumps(ev.summary()))


def _rows(out):
    with open(out / "per_case.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("which", ["nn3d", "nn3d_regions", "nn2d", "nn2d_regions"])
def test_nnunet_folders_are_evaluated_as_an_independent_reading_and_as_nnunet_scores_dice(which, request, tmp_path):
    from nnunetv2.evaluation.evaluate_predictions import compute_metrics
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO

    folders = request.getfixturevalue(which)
    out = tmp_path / "eval"
    assert main([str(folders["pred"]), str(folders["raw"]), "-o", str(out), *FAST, "--no-failure-detection"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    provenance = summary.pop("provenance")
    expected = _independent(folders, EvalProtocol(bootstrap_samples=0, failure_detection=False, figures=False))
    assert summary.keys() == expected.keys()
    for key in ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece", "mean_nll",
                "mean_brier", "mean_adaptive_ece"):
        assert summary[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    assert (summary["classes"], summary["multilabel"]) == (expected["classes"], expected["multilabel"])
    assert summary["pooled"]["n_voxels"] == expected["pooled"]["n_voxels"]
    assert provenance["predictions"][0]["tool"] == "nnU-Net v2" and provenance["reference"]["kind"] == "nnunet"
    # the sha256 of every file read: dataset.json (reference, trainer), plans.json, and per case label + npz + pkl + seg
    assert len(provenance["input_files_sha256"]) == 3 + 4 * 4
    # Dice as nnU-Net's own evaluation computes it from its label map
    dataset = json.loads((folders["raw"] / "dataset.json").read_text())
    targets = [tuple(v) if isinstance(v, list) else v for v in dataset["labels"].values() if v != 0]
    rows = _rows(out)
    for path in sorted(folders["labels"].glob("*.nii.gz")):
        case = path.name[:-7]
        theirs = compute_metrics(str(path), str(folders["pred"] / f"{case}.nii.gz"), SimpleITKIO(), targets)
        ours = [float(r["dice"]) for r in rows if r["case"] == case]
        assert ours == pytest.approx([theirs["metrics"][t]["Dice"] for t in targets], rel=1e-9)


def test_splits_final_selects_the_validation_cases_of_a_fold(nn3d, tmp_path):
    out = tmp_path / "fold1"
    assert main([str(nn3d["pred"]), str(nn3d["raw"]), "--splits", str(nn3d["splits"]), "--fold", "1", "-o", str(out),
                 *FAST, "--no-failure-detection"]) == 0
    val = json.loads(nn3d["splits"].read_text())[1]["val"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["cases"] == sorted(val) and summary["n_cases"] == len(val)
    assert summary["provenance"]["selection"]["fold"] == "1" and "failure_detection" not in summary


def test_an_ensemble_of_folders_averages_the_probabilities_as_nnunet_ensemble_does(nn3d, tmp_path):
    from nnunetv2.ensembling.ensemble import average_probabilities

    from mcseg.data.reference import read_reference
    from mcseg.evaluation.folders import read_case
    from mcseg.evaluation.formats import open_folder
    from mcseg.metrics.uncertainty import MemberAccumulator

    a, b = nn3d["members"]
    out = tmp_path / "ens"
    assert main([str(a), str(nn3d["raw"]), "--ensemble", str(b), "-o", str(out), *FAST, "--save-uncertainty"]) == 0
    assert {p.name for p in (out / "uncertainty").glob("tiny_000_*")} == {
        "tiny_000_entropy.nii.gz", "tiny_000_expected_entropy.nii.gz", "tiny_000_mutual_information.nii.gz"}
    assert not list(a.glob("*_entropy.nii.gz"))  # nothing written into nnU-Net's folder
    summary = json.loads((out / "summary.json").read_text())
    assert summary["predictor"]["members"] == 2 and len(summary["provenance"]["predictions"]) == 2
    expected = _independent(nn3d, EvalProtocol(bootstrap_samples=0), [a, b])
    assert summary["mean_ece"] == pytest.approx(expected["mean_ece"], rel=1e-5)
    assert summary["failure_detection"]["mutual_information"]["voxel_auroc_cases"] > 0
    reference = read_reference(nn3d["raw"])
    folders = [open_folder(f, reference.task) for f in (a, b)]
    members = MemberAccumulator()
    _, _, probs, _, _ = read_case(folders, reference, "tiny_000", members)
    theirs = average_probabilities([str(a / "tiny_000.npz"), str(b / "tiny_000.npz")])  # (C, z, y, x)
    np.testing.assert_allclose(probs.numpy(), theirs.transpose(0, 3, 2, 1), atol=1e-6)
    assert float(members.maps()["mutual_information"].max()) > 0.01


def _broken(folders, tmp_path, edit):
    """A copy of the raw dataset and trainer folder with ``edit(raw, pred)`` applied."""
    root = tmp_path / "broken"
    raw, trainer = root / "raw", root / "trainer"
    shutil.copytree(folders["raw"], raw)
    shutil.copytree(folders["trainer"], trainer, ignore=shutil.ignore_patterns("fold_1"))
    pred = trainer / "fold_0" / "validation"
    edit(raw, pred)
    return raw, pred


def _npz(pred, case, change):
    path = pred / f"{case}.npz"
    probs = np.load(path)["probabilities"]
    np.savez_compressed(path, probabilities=change(probs))


def _corner(values):
    """A change of an npz that sets the probabilities of its first voxel."""
    def change(probs):
        probs[(slice(None), *[0] * (probs.ndim - 1))] = values
        return probs

    return change


def _pkl(pred, case, change):
    path = pred / f"{case}.pkl"
    props = pickle.loads(path.read_bytes())
    change(props)
    path.write_bytes(pickle.dumps(props))


def _label(raw, case, change):
    path = raw / "labelsTr" / f"{case}.nii.gz"
    img = sitk.ReadImage(str(path))
    change(img)
    sitk.WriteImage(img, str(path))


def _json(path, change):
    desc = json.loads(path.read_text())
    change(desc)
    path.write_text(json.dumps(desc))


BREAKS = {
    # an axis out of order: y and x swapped in the npz (the pkl still says the original shape)
    "transposed": (lambda raw, pred: _npz(pred, "tiny_001", lambda p: p.swapaxes(2, 3)),
                   r"case tiny_001: tiny_001.npz has spatial shape \(7, 9, 12\), its tiny_001.pkl says \(7, 12, 9\)"),
    # z and x swapped in the npz and in the pkl: only the label map's grid can tell
    "transposed-with-pkl": (lambda raw, pred: (_npz(pred, "tiny_001", lambda p: p.swapaxes(1, 3)),
                                               _pkl(pred, "tiny_001", lambda d: d.update(
                                                   shape_before_cropping=(7, 9, 12)))),
                            r"case tiny_001: probabilities tiny_001.npz has shape \(7, 12, 9\) in the label's axis "
                            r"order, label tiny_001.nii.gz has \(9, 12, 7\)"),
    "swapped-channels": (lambda raw, pred: _npz(pred, "tiny_002", lambda p: p[[0, 2, 1]]),
                         r"case tiny_002: tiny_002.nii.gz differs from nnU-Net's argmax of tiny_002.npz in \d+ of 756 "
                         r"voxels \(\d"),
    "logits": (lambda raw, pred: _npz(pred, "tiny_000", lambda p: p * 3 - 1),
               r"case tiny_000: tiny_000.npz holds values in \[-1, 2\], outside \[0, 1\] by 1"),
    # a probability below 0 in a voxel whose channels still sum to 1, its argmax the label map's (the corner,
    # background in the cropped-away slab; array (0, 0, 0) is file voxel (0, 0, 0))
    "negative": (lambda raw, pred: _npz(pred, "tiny_000", _corner([0.6, -0.01, 0.41])),
                 r"case tiny_000: tiny_000.npz holds values in \[-0.01, 1\], outside \[0, 1\] by 0.01 "),
    # just beyond SUM_TOLERANCE (1e-3)
    "slightly-not-a-softmax": (lambda raw, pred: _npz(pred, "tiny_000", lambda p: p * (1 - 1.5e-3)),
                               r"case tiny_000: tiny_000.npz: the 3 softmax channels sum to 0.998\d*\.\.0.998\d*, "
                               r"off 1 by up to 0.0015 \(voxel \(\d+, \d+, \d+\); tolerance 0.001\)"),
    "not-a-softmax": (lambda raw, pred: _npz(pred, "tiny_000", lambda p: p * 0.9),
                      r"case tiny_000: tiny_000.npz: the 3 softmax channels sum to 0.9\d*\.\.0.9\d*, off 1 by up to "
                      r"0.1"),
    "no-pkl": (lambda raw, pred: (pred / "tiny_003.pkl").unlink(), r"case tiny_003: .*tiny_003.pkl is missing"),
    "no-npz": (lambda raw, pred: (pred / "tiny_003.npz").unlink(), r"1 label\(s\) without a prediction .*: tiny_003"),
    "no-label": (lambda raw, pred: (raw / "labelsTr" / "tiny_003.nii.gz").unlink(),
                 r"1 prediction\(s\) without a label in .*: tiny_003"),
    "origin": (lambda raw, pred: _label(raw, "tiny_001", lambda img: img.SetOrigin((-12.0, 7.5, 35.0))),
               r"case tiny_001: label map tiny_001.nii.gz and label tiny_001.nii.gz have different affines \(largest "
               r"difference 5\)"),
    "spacing": (lambda raw, pred: _label(raw, "tiny_001", lambda img: img.SetSpacing((2.5, 1.0, 0.9))),
                r"case tiny_001: probabilities tiny_001.npz has spacing \(2.5, 1.0, 0.8\) mm, label tiny_001.nii.gz "
                r"has \(2.5, 1.0, 0.9\) mm \(off by up to 0.1 mm\)"),
    "stated-format": (None, r"--format monai contradicts the folder: it holds 4 <case>.npz \(nnU-Net v2\)"),
    "natural-image-reader": (lambda raw, pred: _json(pred.parent.parent / "plans.json", lambda d: d.update(
        image_reader_writer="NaturalImage2DIO")), r"'NaturalImage2DIO': mcseg reads nnU-Net folders of SimpleITKIO"),
    "reader-not-the-files'": (lambda raw, pred: _json(pred.parent.parent / "plans.json", lambda d: d.update(
        image_reader_writer="NibabelIOWithReorient")),
        r"case tiny_000: tiny_000.pkl has no nibabel_stuff original_affine and reoriented_affine"),
    "two-npz-keys": (lambda raw, pred: np.savez_compressed(pred / "tiny_000.npz", probabilities=np.zeros(3),
                                                           softmax=np.zeros(3)),
                     r"case tiny_000: tiny_000.npz holds \['probabilities', 'softmax'\]"),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_every_check_fails_in_one_line_naming_case_file_and_deviation(nn3d, tmp_path, capsys, name):
    edit, message = BREAKS[name]
    raw, pred = _broken(nn3d, tmp_path, edit or (lambda raw, pred: None))
    args = [str(pred), str(raw), "-o", str(tmp_path / "out"), *FAST, "--no-failure-detection"]
    assert main(args + (["--format", "monai"] if name == "stated-format" else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mcseg-evaluate-folder: error: "), err
    assert __import__("re").search(message, err), err


@pytest.mark.parametrize("gap,tied", [(5e-7, True), (2e-6, False)])
@pytest.mark.parametrize("which", ["nn3d", "nn3d_regions"])
def test_a_label_map_may_differ_from_nnunets_rule_only_at_a_tie_within_1e_6(request, tmp_path, capsys, which, gap,
                                                                             tied):
    """The corner voxel, background (0) in the label map: its probabilities set to a near-tie (softmax: background
    ``gap`` below label 1; regions: the first region ``gap`` above 0.5), so nnU-Net's rule picks label 1 there."""
    softmax = which == "nn3d"
    values = [0.5 - gap / 2, 0.5 + gap / 2, 0.0] if softmax else [0.5 + gap, 0.0]
    raw, pred = _broken(request.getfixturevalue(which), tmp_path, lambda raw, pred: _npz(pred, "tiny_000",
                                                                                         _corner(values)))
    code = main([str(pred), str(raw), "-o", str(tmp_path / "out"), *FAST, "--no-failure-detection"])
    err = capsys.readouterr().err
    if tied:
        assert code == 0, err
    else:
        rule = "argmax" if softmax else r"region rule \(p > 0.5 in regions_class_order\)"
        message = rf"case tiny_000: tiny_000.nii.gz differs from nnU-Net's {rule} of tiny_000.npz in 1 of 756 voxels"
        assert code == 2 and __import__("re").search(message, err), err


def test_a_region_model_read_as_labels_is_refused(nn3d_regions, tmp_path, capsys):
    """dataset.json edited to say labels: the two sigmoid channels are not the three softmax channels."""
    labels = {"background": 0, "left": 1, "right": 2}
    raw, pred = _broken(nn3d_regions, tmp_path, lambda raw, pred: [_json(p, lambda d: (d.pop("regions_class_order"),
                                                                                         d.update(labels=labels)))
                                                                   for p in (raw / "dataset.json",
                                                                             pred.parent.parent / "dataset.json")])
    assert main([str(pred), str(raw), *FAST, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "case tiny_000: tiny_000.npz has 2 channels, the task is a softmax over 3 labels" in err, err


def test_a_trainer_dataset_json_other_than_the_reference_is_refused(nn3d_regions, nn3d, capsys, tmp_path):
    assert main([str(nn3d_regions["pred"]), str(nn3d["raw"]), *FAST, "-o", str(tmp_path / "out")]) == 2
    assert "declares 2 sigmoid regions (whole, core), the reference a softmax over 3 labels" in capsys.readouterr().err


@pytest.mark.parametrize("reader", ["NibabelIO", "NibabelIOWithReorient", "SimpleITKIOWithReorient"])
def test_nibabel_and_reorienting_readers_are_read_back_to_the_files_axes(tmp_path, reader):
    """Files far from RAS (anisotropic voxels, 2.5 x 1 x 0.8 mm), read by the reader the plans name: the npz is in
    that reader's order (plain NibabelIO: the file's axes reversed, its pkl spacing too; the reorienting readers:
    the reoriented order); mcseg maps it back as nnU-Net's write_seg does, and scores what nnU-Net's own reader
    gives in its order."""
    from nnunetv2.imageio.reader_writer_registry import recursive_find_reader_writer_by_name

    from mcseg.evaluate_folder import main as evaluate

    io = recursive_find_reader_writer_by_name(reader)()
    folders = make_nnunet(tmp_path / "reo", dims=3, reader=reader, n_cases=2)
    out = tmp_path / "eval"
    assert evaluate([str(folders["pred"]), str(folders["raw"]), "-o", str(out), *FAST, "--no-failure-detection"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    ev = Evaluator(3, ["background", "left", "right"], EvalProtocol(bootstrap_samples=0, failure_detection=False,
                                                                     figures=False))
    for case in ("tiny_000", "tiny_001"):
        label, props = io.read_seg(str(folders["labels"] / f"{case}.nii.gz"))
        seg, _ = io.read_seg(str(folders["pred"] / f"{case}.nii.gz"))
        probs = np.load(folders["pred"] / f"{case}.npz")["probabilities"]
        assert probs.shape[1:] == label.shape[1:]  # the reader's order
        file_reversed = sitk.GetArrayFromImage(sitk.ReadImage(str(folders["labels"] / f"{case}.nii.gz"))).shape
        assert (probs.shape[1:] == file_reversed) == (reader == "NibabelIO")
        assert len(set(props["spacing"])) == 3
        ev.add_case(case, torch.from_numpy(probs), torch.from_numpy(label[0].astype(np.int64)), props["spacing"],
                    prediction=torch.from_numpy(seg[0].astype(np.int64)))
    expected = json.loads(json.dumps(ev.summary()))
    for key in ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_nll", "mean_classwise_ece"):
        assert summary[key] == pytest.approx(expected[key], rel=1e-5), key


@pytest.mark.parametrize("which", ["nn3d", "nn3d_regions"])
def test_the_advice_for_a_labels_folder_without_classes_works_when_followed(which, request, tmp_path, capsys):
    """Issue #43 section 3: against a labels folder without dataset.json the advice `--num-classes K` always led
    to a second refusal for an nnU-Net folder (its class names are not class_1 ...). Each command the refusal
    suggests (in backquotes) must succeed, for both folder tools."""
    import re
    import shlex

    from mcseg.calibrate_folder import main as calibrate

    folders = request.getfixturevalue(which)
    labels = shutil.copytree(folders["labels"], tmp_path / "plain" / "labels")  # no dataset.json here or above
    tools = {"evaluate": (main, [str(folders["pred"]), str(labels), *FAST, "--no-failure-detection"]),
             "calibrate": (calibrate, ["--fit", str(folders["pred"]), "--reference", str(labels)])}
    for name, (tool, args) in tools.items():
        assert tool([*args, "-o", str(tmp_path / f"{name}_refused")]) == 2
        err = capsys.readouterr().err
        k = len(json.loads((folders["raw"] / "dataset.json").read_text())["labels"])
        advice = re.findall(r"`(--[^`]+)`", err) or ([f"--num-classes {k}"] if "--num-classes K" in err else [])
        assert advice and len(err.splitlines()) == 1, err
        for i, option in enumerate(advice):
            code = tool([*args, *shlex.split(option), "-o", str(tmp_path / f"{name}_{i}")])
            assert code == 0, (option, capsys.readouterr().err)
    if which == "nn3d":  # --num-classes alone: the names differ, and the second refusal's advice works too
        args = [*tools["evaluate"][1], "--num-classes", "3"]
        assert main([*args, "-o", str(tmp_path / "k")]) == 2
        advice = re.findall(r"`(--[^`]+)`", capsys.readouterr().err)
        assert len(advice) == 2 and all(main([*args, *shlex.split(option), "-o", str(tmp_path / f"k{i}")]) == 0
                                        for i, option in enumerate(advice))
