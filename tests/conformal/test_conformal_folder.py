"""mcseg-conformal-folder on real nnU-Net files (made by nnU-Net's export code) and MONAI SaveImage folders: fit on a
fold's validation cases, apply to the other fold's; the recorded thresholds satisfy the CRC bound on the
calibration cases and are the largest that do, the masks are {p >= t} of the saved probabilities on the label's
grid, the test FNR equals a recomputation from the written masks and the labels; the output folder's refusals."""
from __future__ import annotations

import json
import shutil

import nibabel as nib
import numpy as np
import pytest

from mcseg.conformal_folder import main as conformal
from tests.conftest import require

NNUNET_FILES = "nnU-Net's export code makes the real nnU-Net files (README, 'nnU-Net and MONAI prediction folders')"
FOLD0 = [f"tiny_{i:03d}" for i in range(0, 16, 2)]
FOLD1 = [f"tiny_{i:03d}" for i in range(1, 16, 2)]


@pytest.fixture(scope="module")
def nn(tmp_path_factory):
    require("nnunetv2", NNUNET_FILES)
    from tests.tool_outputs import make_nnunet

    folders = make_nnunet(tmp_path_factory.mktemp("conformal"), dims=3, n_cases=16, members=2, noise=1.5)
    test = folders["trainer"] / "fold_1" / "test"  # fold 1's cases only, predicted by member 1
    test.mkdir()
    for case in FOLD1:
        for path in folders["members"][1].glob(f"{case}.*"):
            shutil.copy2(path, test / path.name)
    return {**folders, "test": test}


def _labels(raw, case):
    return np.asarray(nib.load(str(raw / "labelsTr" / f"{case}.nii.gz")).dataobj).astype(int)


def _fnr(probs_file_order, label, k, t):
    g = label == k
    return 1 - ((probs_file_order[k] >= t) & g).sum() / g.sum()


def test_nnunet_fit_on_fold_0_apply_to_fold_1(nn, tmp_path):
    out = tmp_path / "conformal"
    assert conformal(["--fit", str(nn["members"][0]), "--reference", str(nn["raw"]), "--splits", str(nn["splits"]),
                      "--fold", "0", "--apply", str(nn["test"]), "-o", str(out), "--alpha", "0.2"]) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert record["fit_cases"] == FOLD0 and record["applied"]["cases"] == FOLD1
    assert record["method"] == "crc" and record["alpha"] == 0.2 and set(record["classes"]) == {"left", "right"}
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    grid = np.linspace(0, 1, 101)

    def file_order(folder, case):  # SimpleITKIO: the npz is the file's array reversed
        return np.load(folder / f"{case}.npz")["probabilities"].transpose(0, 3, 2, 1).astype(np.float64)

    for name, fit in record["classes"].items():
        k = fit["channel"]
        assert fit["n_cases"] == 8 and fit["cases_without_class"] == [] and fit["controlled"]
        assert 0 < fit["threshold"] < 1  # not an end of the grid
        # recomputed from the calibration files: the bound holds at t and fails at the next grid value
        curves = np.array([[_fnr(file_order(nn["members"][0], c), _labels(nn["raw"], c), k, t) for t in grid]
                           for c in FOLD0])
        bound = 8 / 9 * curves.mean(0) + 1 / 9
        j = int(np.flatnonzero(np.isclose(grid, fit["threshold"]))[0])
        assert bound[j] <= 0.2 < bound[j + 1]
        assert fit["calibration_risk"] == pytest.approx(curves[:, j].mean())
        assert fit["margin"]["outer_mm"] > 0 and fit["margin"]["n_cases"] == 8
        # the test cases: masks are {p >= t} on the label's grid; the test FNR recomputed from them and the labels
        fnrs = []
        for case in FOLD1:
            label_img = nib.load(str(nn["raw"] / "labelsTr" / f"{case}.nii.gz"))
            mask_img = nib.load(str(out / f"{case}_set_{name}.nii.gz"))
            np.testing.assert_allclose(mask_img.affine, label_img.affine, atol=1e-4)
            mask = np.asarray(mask_img.dataobj).astype(bool)
            np.testing.assert_array_equal(mask, file_order(nn["test"], case)[k] >= fit["threshold"])
            g = _labels(nn["raw"], case) == k
            fnrs.append(1 - (mask & g).sum() / g.sum())
            possible = np.asarray(nib.load(str(out / f"{case}_possible_{name}.nii.gz")).dataobj).astype(bool)
            sure = np.asarray(nib.load(str(out / f"{case}_sure_{name}.nii.gz")).dataobj).astype(bool)
            assert sure.sum() <= possible.sum()
        assert record["test"][name]["mean_loss"] == pytest.approx(np.mean(fnrs))
        assert record["test"][name]["n_cases"] == 8


def test_refusals_and_overwrite(nn, tmp_path, capsys):
    out = tmp_path / "conformal"
    base = ["--fit", str(nn["members"][0]), "--reference", str(nn["raw"]), "--splits", str(nn["splits"]),
            "--fold", "0", "-o", str(out)]
    # alpha = 0.1 < 1 / (n + 1) with 8 calibration cases: nothing controls, the whole volume, said so
    assert conformal(base) == 0
    assert "NOT controlled" in capsys.readouterr().out
    assert not json.loads((out / "conformal.json").read_text())["classes"]["left"]["controlled"]
    shutil.rmtree(out)
    # the test folder holds the calibration cases: no guarantee for them
    assert conformal([*base, "--apply", str(nn["members"][1])]) == 2
    assert "holds 8 calibration case(s) (tiny_000" in capsys.readouterr().err and not out.exists()
    # CRC of the FDR: not monotone
    assert conformal([*base, "--loss", "fdr"]) == 2
    assert "use method 'ltt'" in capsys.readouterr().err
    assert conformal([*base, "--loss", "fdr", "--method", "ltt", "--alpha", "0.5"]) == 0
    assert json.loads((out / "conformal.json").read_text())["fwer"] == "bonferroni_holm"
    # an earlier fit is replaced only when asked; never into a prediction folder
    assert conformal([*base, "--apply", str(nn["test"])]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert conformal([*base, "--apply", str(nn["test"]), "--overwrite"]) == 0
    assert len(list(out.glob("*_set_left.nii.gz"))) == 8
    assert conformal([*base, "--images", str(nn["raw"] / "imagesTr")]) == 2
    assert "--images gives the --apply cases' grid" in capsys.readouterr().err
    assert conformal([*base[:-1], str(nn["test"])]) == 2
    assert "never writes into another tool's folder" in capsys.readouterr().err
    assert conformal([*base[:-1], str(nn["test"]), "--apply", str(nn["test"])]) == 2
    assert "not an input folder" in capsys.readouterr().err


def test_a_loss_its_method_cannot_control_is_refused_before_any_folder_is_read(tmp_path, capsys):
    """CRC (the default) of the FDR is refused from the command line alone: before the reference and the
    prediction folders are read (here they do not even exist), naming both options."""
    out = tmp_path / "conformal"
    argv = ["--fit", str(tmp_path / "validation"), "--reference", str(tmp_path / "raw"), "--loss", "fdr", "-o",
            str(out)]
    assert conformal(argv) == 2
    err = capsys.readouterr().err
    assert "--loss fdr with --method crc" in err and "use method 'ltt'" in err and not out.exists()


def test_monai_folders(nn, tmp_path):
    from tests.tool_outputs import make_monai

    fit_labels, test_labels = tmp_path / "fit_labels", tmp_path / "test_labels"
    for folder, cases in ((fit_labels, FOLD0), (test_labels, FOLD1)):
        folder.mkdir()
        for case in cases:
            shutil.copy2(nn["raw"] / "labelsTr" / f"{case}.nii.gz", folder)
    fit = make_monai(tmp_path / "monai_fit", fit_labels, noise=1.0, seed=1)
    test = make_monai(tmp_path / "monai_test", test_labels, noise=1.0, seed=2)
    out = tmp_path / "conformal"
    assert conformal(["--fit", str(fit), "--reference", str(nn["raw"]), "--apply", str(test), "-o", str(out),
                      "--alpha", "0.2", "--method", "rcps", "--rcps-bound", "hoeffding", "--delta", "0.2",
                      "--classes", "right", "--repeats", "0"]) == 0  # re-splits: test_repeated_splits.py
    record = json.loads((out / "conformal.json").read_text())
    assert list(record["classes"]) == ["right"] and record["delta"] == 0.2 and record["rcps_bound"] == "hoeffding"
    assert record["provenance"]["predictions"][0]["format"] == "monai"
    assert sorted(p.name for p in out.glob("*_right.nii.gz"))[:3] == [
        "tiny_001_possible_right.nii.gz", "tiny_001_set_right.nii.gz", "tiny_001_sure_right.nii.gz"]


def test_validity_script_over_random_splits_of_a_folder(nn, tmp_path, capsys):
    import csv
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "scripts"))
    from conformal_validity import main as validity

    table = tmp_path / "validity.csv"
    assert validity(["--predictions", str(nn["members"][0]), "--reference", str(nn["raw"]), "--alpha", "0.05", "0.2",
                     "--calibration", "10", "--repeats", "20", "-o", str(table),
                     "--figure", str(tmp_path / "validity.png")]) == 0
    assert (tmp_path / "validity.png").read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(table.open()))
    assert [(r["class"], r["alpha"]) for r in rows] == [("left", "0.05"), ("right", "0.05"), ("left", "0.2"),
                                                        ("right", "0.2")]
    assert all(r["n_calibration"] == "10" and r["n_test"] == "6" and r["splits"] == "20" for r in rows)
    # alpha = 0.05 < 1 / 11: no split can control it; 0.2 can
    assert [r["uncontrolled_splits"] for r in rows] == ["20", "20", "0", "0"]
    assert all(float(r["mean_test_risk"]) <= 0.2 for r in rows[2:])
    assert "| left | crc | fnr | 0.2 |" in capsys.readouterr().out


def test_mcseg_maps_margins_in_world_mm_of_a_permuted_anisotropic_affine(tmp_path):
    """mcseg's <case>_probs maps (as evaluate.py save_probabilities=true writes them) with the labels' affine:
    spacing 1.1, 0.9 and 2.0 mm on permuted axes. The recorded outer and inner margins are the conformal quantiles of
    scores computed here by brute force from the voxels' world coordinates."""
    import math

    import torch

    from tests.test_monai_folders import AFFINE, _labels

    labels = _labels(tmp_path / "labels", (11, 9, 6), n=14)
    fit, test = tmp_path / "fit", tmp_path / "test"
    g = torch.Generator().manual_seed(5)
    for i in range(14):
        folder = fit if i < 10 else test
        folder.mkdir(exist_ok=True)
        label = torch.from_numpy(np.asarray(nib.load(str(labels / f"case_{i}.nii.gz")).dataobj).astype(np.int64))
        probs = torch.softmax(torch.nn.functional.one_hot(label, 3).movedim(-1, 0) * 3.0
                              + torch.randn(3, *label.shape, generator=g) * 2.0, 0)
        nib.save(nib.Nifti1Image(np.moveaxis(probs.numpy(), 0, -1), AFFINE), str(folder / f"case_{i}_probs.nii.gz"))
        nib.save(nib.Nifti1Image(probs.argmax(0).numpy().astype(np.uint8), AFFINE), str(folder / f"case_{i}.nii.gz"))
    out = tmp_path / "out"
    assert conformal(["--fit", str(fit), "--reference", str(labels), "--apply", str(test), "-o", str(out),
                      "--alpha", "0.2", "--repeats", "0"]) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert record["provenance"]["predictions"][0]["format"] == "mcseg"

    def world(mask):
        idx = np.argwhere(mask)
        return idx @ AFFINE[:3, :3].T

    for name, k in (("outer", 1), ("inner", 2)):
        outer, inner = [], []
        for i in range(10):
            truth = np.asarray(nib.load(str(labels / f"case_{i}.nii.gz")).dataobj) == k
            pred = np.asarray(nib.load(str(fit / f"case_{i}.nii.gz")).dataobj) == k
            d = np.sqrt(((world(truth)[:, None] - world(pred)[None]) ** 2).sum(-1))
            outer.append(d.min(1).max())
            # depth of a predicted voxel: distance to the nearest voxel outside the prediction (or the volume)
            padded = np.pad(pred, 1)
            outside = np.argwhere(~padded) - 1
            wrong = np.argwhere(pred & ~truth)
            depth = np.sqrt((((wrong[:, None] - outside[None]) @ AFFINE[:3, :3].T) ** 2).sum(-1)).min(1)
            inner.append(depth.max() if len(depth) else 0.0)
        q = math.ceil(11 * 0.8)  # the 9th smallest of 10
        margin = record["classes"][name]["margin"]
        assert margin["outer_mm"] == pytest.approx(sorted(outer)[q - 1])
        assert margin["inner_mm"] == pytest.approx(sorted(inner)[q - 1])
    assert len(list(out.glob("case_1?_sure_inner.nii.gz"))) == 4


def test_nnunet_region_model(tmp_path):
    require("nnunetv2", NNUNET_FILES)
    from tests.tool_outputs import make_nnunet

    folders = make_nnunet(tmp_path / "regions", dims=3, regions=True, n_cases=12, noise=1.5)
    out = tmp_path / "out"
    assert conformal(["--fit", str(folders["pred"]), "--reference", str(folders["raw"]), "--splits",
                      str(folders["splits"]), "--fold", "0", "-o", str(out), "--alpha", "0.2"]) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert list(record["classes"]) == ["whole", "core"]  # every region: a region model has no background channel
    for name, fit in record["classes"].items():
        k = fit["channel"]
        cases = record["fit_cases"]
        grid = np.linspace(0, 1, 101)
        curves = []
        for case in cases:
            p = np.load(folders["pred"] / f"{case}.npz")["probabilities"][k].transpose(2, 1, 0).astype(np.float64)
            truth = np.isin(_labels(folders["raw"], case), [1, 2] if name == "whole" else [2])
            curves.append([1 - ((p >= t) & truth).sum() / truth.sum() for t in grid])
        bound = 6 / 7 * np.mean(curves, 0) + 1 / 7
        j = int(np.flatnonzero(np.isclose(grid, fit["threshold"]))[0])
        assert fit["controlled"] and bound[j] <= 0.2 < bound[j + 1]


def test_test_cases_without_labels_get_their_masks_on_their_images_grid(nn, tmp_path, capsys):
    """A deployment's new cases: no label, the grid checked against their image (nnU-Net's imagesTs)."""
    labels = tmp_path / "labels"  # the calibration cases' labels only
    labels.mkdir()
    for case in FOLD0:
        shutil.copy2(nn["raw"] / "labelsTr" / f"{case}.nii.gz", labels)
    shutil.copy2(nn["raw"] / "dataset.json", labels)
    out = tmp_path / "out"
    base = ["--fit", str(nn["members"][0]), "--reference", str(labels), "--splits", str(nn["splits"]), "--fold", "0",
            "--apply", str(nn["test"]), "-o", str(out), "--alpha", "0.2"]
    assert conformal(base) == 2
    assert "8 --apply case(s) without a label" in capsys.readouterr().err and not out.exists()
    assert conformal([*base, "--images", str(nn["raw"] / "imagesTr"), "--figures"]) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert record["applied"]["cases_without_label"] == FOLD1 and record["test"] == {}
    assert not (out / "per_case.csv").exists()
    assert [f for f in record["applied"]["files"] if f.endswith(".png")] == [f"{c}_conformal.png" for c in FOLD1]
    assert (out / "tiny_001_conformal.png").read_bytes()[:4] == b"\x89PNG"
    image = nib.load(str(nn["raw"] / "imagesTr" / "tiny_001_0000.nii.gz"))
    mask = nib.load(str(out / "tiny_001_set_left.nii.gz"))
    np.testing.assert_allclose(mask.affine, image.affine, atol=1e-4)
    probs = np.load(nn["test"] / "tiny_001.npz")["probabilities"].transpose(0, 3, 2, 1)
    np.testing.assert_array_equal(np.asarray(mask.dataobj).astype(bool),
                                  probs[1].astype(np.float64) >= record["classes"]["left"]["threshold"])
