"""Post-hoc calibration from saved probabilities (mcseg-calibrate-folder): the math, and real nnU-Net / MONAI files.

* ln p / T is the logits' temperature for a softmax, logit(p) / T for sigmoids; a fit on ln p finds the T of a fit
  on the logits; a region model scaled as a softmax, or a softmax scaled without renormalising, is caught.
* On nnU-Net folders made by nnU-Net's export: calibrated files that nnU-Net's own code reads (npz, pkl, label map
  equal to its LabelManager's conversion, its ensembling), a fit recorded in calibration.json as mcseg's fits are.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from mcseg.calibrate_folder import main as calibrate
from mcseg.calibration import PosthocConfig
from mcseg.calibration.logit_scaling import fit_scaler
from mcseg.evaluate_folder import main as evaluate
from mcseg.evaluation.folder_posthoc import FLOOR, log_probabilities
from tests.conftest import require

from .conftest import FAST, NNUNET_FILES, fit_fold_0


def test_ln_p_over_t_is_the_logits_temperature_and_the_clamp_is_bounded():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 5000, generator=g) * 6
    z[:, :10] = torch.tensor([200.0, 0.0, -10.0, 5.0])[:, None]  # p underflows to exactly 0 in float32
    p = torch.softmax(z, 0)
    assert (p == 0).any()
    for t in (0.5, 1.7, 3.0):
        ours = torch.softmax(log_probabilities(p, False) / t, 0)
        np.testing.assert_allclose(ours[:, 10:], torch.softmax(z / t, 0)[:, 10:], atol=2e-6)
        # clamped voxels: the true gap (>= 190) is read as 87.3, the probability moved stays below exp(-87.3 / T)
        assert float(ours[1:, :10].max()) <= float(np.exp(np.log(FLOOR) / t)) * 1.0001
    # sigmoids: logit(p) / T per channel, never a softmax over the channels; float32 holds 1 - p only to 6e-8
    # near p = 1, so logit(p) is exact to ~6e-8 / (1 - p): within |z| <= 8 that is below 2e-4
    zs = z.clamp(-8, 8)
    s = torch.sigmoid(zs)
    np.testing.assert_allclose(torch.sigmoid(log_probabilities(s, True) / 2), torch.sigmoid(zs / 2), atol=1e-5)
    assert not torch.allclose(torch.softmax(log_probabilities(s, False) / 2, 0), torch.sigmoid(zs / 2), atol=1e-2)


def test_a_temperature_fitted_on_saved_probabilities_is_the_one_fitted_on_the_logits():
    g = torch.Generator().manual_seed(1)
    target = torch.randint(0, 3, (4000,), generator=g)
    z = torch.nn.functional.one_hot(target, 3).float() * 5 + torch.randn(4000, 3, generator=g) * 2.5
    p = torch.softmax(z, 1).float()
    on_logits = fit_scaler("temperature", z, target, lambda x: torch.softmax(x, 1))
    on_probs = fit_scaler("temperature", log_probabilities(p, False), target, lambda x: torch.softmax(x, 1))
    assert on_logits["temperature"] != pytest.approx(1.0, abs=0.05)
    assert on_probs["temperature"] == pytest.approx(on_logits["temperature"], rel=1e-4)


@pytest.mark.parametrize("kind", ["labels", "regions"])
def test_nnunet_fit_apply_and_write_back_as_nnunet_reads_it(nn, kind, tmp_path):
    from nnunetv2.ensembling.ensemble import average_probabilities
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    folders = nn[kind]
    val, test = folders["members"]
    out = tmp_path / "calibrated"
    # test holds every case (another member's predictions): fold 0's, the fit cases, are left out of its evaluation
    assert calibrate(fit_fold_0(folders, out)) == 0
    record = json.loads((out / "calibration.json").read_text())
    (key, fit), = record["fits"].items()
    assert fit["val_cases"] == json.loads(folders["splits"].read_text())[0]["val"]
    assert fit["checkpoint"]["sha256"] == key and len(fit["input_files_sha256"]) == 3 + 2 * 4
    assert fit["fitted_on_probabilities"]["link"] == ("sigmoid per region" if kind == "regions" else "softmax")
    t = fit["scalers"]["temperature"]["temperature"]
    assert t > 1.2 and fit["scalers"]["temperature"]["nll_after"] < fit["scalers"]["temperature"]["nll_before"]
    # nnU-Net's own files: pkl copied byte for byte, plans/dataset copied, npz one float32 key in the same order
    plans = json.loads((out / "plans.json").read_text())
    dataset = json.loads((out / "dataset.json").read_text())
    labels = PlansManager(plans).get_label_manager(dataset)
    for case in ("tiny_000", "tiny_003"):
        assert (out / f"{case}.pkl").read_bytes() == (test / f"{case}.pkl").read_bytes()
        new = np.load(out / f"{case}.npz")
        assert list(new.keys()) == ["probabilities"] and new["probabilities"].dtype == np.float32
        old = np.load(test / f"{case}.npz")["probabilities"]
        z = log_probabilities(torch.from_numpy(old), kind == "regions") / t
        expected = torch.sigmoid(z) if kind == "regions" else torch.softmax(z, 0)
        np.testing.assert_allclose(new["probabilities"], expected.numpy(), atol=1e-6)
        seg, props = SimpleITKIO().read_seg(str(out / f"{case}.nii.gz"))
        theirs = labels.convert_probabilities_to_segmentation(new["probabilities"])
        np.testing.assert_array_equal(seg[0], theirs)  # nnU-Net's argmax / region rule, on its own grid
        _, original = SimpleITKIO().read_seg(str(test / f"{case}.nii.gz"))
        assert props["sitk_stuff"] == original["sitk_stuff"]
    # nnUNetv2_ensemble's averaging reads them as it reads its own
    assert average_probabilities([str(out / "tiny_000.npz"), str(test / "tiny_000.npz")]).shape == old.shape
    # and mcseg evaluates them with every check of the reader (sums, grid, label map = nnU-Net's reading): the
    # test cases (fold 1) are better calibrated, the segmentation is the same
    before, after = tmp_path / "before", tmp_path / "after"
    test_cases = ["--splits", str(folders["splits"]), "--fold", "1"]
    assert evaluate([str(test), str(folders["raw"]), "-o", str(before), *FAST, *test_cases]) == 0
    assert evaluate([str(out), str(folders["raw"]), "-o", str(after), *FAST, *test_cases]) == 0
    b, a = (json.loads((d / "summary.json").read_text()) for d in (before, after))
    assert a["provenance"]["predictions"][0]["calibration"]["fit_cases_calibrated"] == ["tiny_000", "tiny_002"]
    assert "scored_fit_cases" not in a["provenance"]  # fold 1's cases only
    assert a["mean_nll"] < b["mean_nll"] and a["mean_foreground_dice"] == pytest.approx(b["mean_foreground_dice"])


def test_folds_validation_folders_together_and_refusals(nn, tmp_path, capsys):
    folders = nn["labels"]
    val, test = folders["members"]
    # fold 0's and fold 1's validation folders (disjoint cases) fit one temperature on every case, out of fold
    splits = json.loads(folders["splits"].read_text())
    fold_dirs = []
    for k, split in enumerate(splits):
        d = tmp_path / f"fold_{k}" / "validation"
        d.mkdir(parents=True)
        for case in split["val"]:
            for ext in (".npz", ".pkl", ".nii.gz"):
                shutil.copy2(val / f"{case}{ext}", d / f"{case}{ext}")
        for name in ("plans.json", "dataset.json"):
            shutil.copy2(folders["trainer"] / name, d / name)
        fold_dirs.append(str(d))
    out = tmp_path / "out"
    assert calibrate(["--fit", *fold_dirs, "--reference", str(folders["raw"]), "-o", str(out)]) == 0
    fit, = json.loads((out / "calibration.json").read_text())["fits"].values()
    assert fit["val_cases"] == sorted(c for s in splits for c in s["val"])
    # the same case in two fit folders, local temperature scaling, writing into an input folder
    assert calibrate(["--fit", str(val), fold_dirs[0], "--reference", str(folders["raw"]), "-o",
                      str(tmp_path / "both")]) == 2
    assert "is in both" in capsys.readouterr().err
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "-o", str(test), "--apply", str(test)]) == 2
    assert "not an input folder" in capsys.readouterr().err
    # the folder to calibrate is checked as it is read: logits instead of probabilities stop it
    broken = tmp_path / "broken"
    shutil.copytree(test, broken)
    for name in ("plans.json", "dataset.json"):
        shutil.copy2(folders["trainer"] / name, broken / name)
    np.savez_compressed(broken / "tiny_002.npz", probabilities=np.load(test / "tiny_002.npz")["probabilities"] * 4 - 2)
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "-o", str(tmp_path / "b"), "--apply",
                      str(broken), "--allow-fit-cases"]) == 2
    assert "case tiny_002: tiny_002.npz holds values in [-2, 2], outside [0, 1] by 2" in capsys.readouterr().err
    from mcseg.evaluation.folder_posthoc import fit_folders
    from mcseg.data.reference import FolderError, read_reference
    from mcseg.evaluation.formats import open_folder

    reference = read_reference(folders["raw"])
    with pytest.raises(FolderError, match="image input .* refused on saved predictions: a prediction folder holds no"):
        fit_folders([open_folder(val, reference.task)], reference, tmp_path / "lts", ["lts"],
                    posthoc=PosthocConfig(fit=["lts"], apply=["lts"], lts={"use_image": True}))
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "-o", str(tmp_path / "lts"),
                      "--scaler", "lts", "--lts", "use_image=true"]) == 2
    assert "holds no image" in capsys.readouterr().err
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "-o", str(tmp_path / "lts"),
                      "--scaler", "lts", "--lts", "max_epochs"]) == 2
    assert "--lts max_epochs: expected KEY=VALUE" in capsys.readouterr().err
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "-o", str(tmp_path / "v"),
                      "--scaler", "vector", "--voxels", "region"]) == 2  # by default: balanced (issue 55)
    assert "vector scaling can change the arg-max" in capsys.readouterr().err
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "-o", str(tmp_path / "v"),
                      "--scaler", "vector", "--voxels", "all"]) == 0
    fit, = json.loads((tmp_path / "v" / "calibration.json").read_text())["fits"].values()
    assert "not the logits' vector scaling" in fit["fitted_on_probabilities"]["vector"]


def test_monai_maps_are_calibrated_in_place_of_their_own_files(tmp_path):
    import nibabel as nib

    from tests.test_monai_folders import _labels
    from tests.tool_outputs import make_monai

    labels = _labels(tmp_path / "labels", (11, 9, 6))
    pred = make_monai(tmp_path / "pred", labels, noise=3.0)
    out = tmp_path / "out"
    assert calibrate(["--fit", str(pred), "--reference", str(labels), "--apply", str(pred), "-o", str(out),
                      "--allow-fit-cases"]) == 0
    t = next(iter(json.loads((out / "calibration.json").read_text())["fits"].values()))["scalers"]["temperature"]
    old = nib.load(str(pred / "case_0" / "case_0_trans.nii.gz"))
    new = nib.load(str(out / "case_0" / "case_0_trans.nii.gz"))
    np.testing.assert_allclose(new.affine, old.affine)
    z = log_probabilities(torch.from_numpy(np.moveaxis(old.get_fdata(dtype=np.float32), -1, 0)), False)
    np.testing.assert_allclose(np.moveaxis(new.get_fdata(dtype=np.float32), -1, 0),
                               torch.softmax(z / t["temperature"], 0).numpy(), atol=1e-6)
    assert evaluate([str(out), str(labels), "-o", str(tmp_path / "e"), *FAST]) == 0


def test_mcseg_probability_maps_and_their_label_maps_are_rewritten(tmp_path):
    import nibabel as nib

    from tests.test_monai_folders import AFFINE, _labels

    labels = _labels(tmp_path / "labels", (11, 9, 6))
    pred = tmp_path / "pred"
    pred.mkdir()
    g = torch.Generator().manual_seed(3)
    for i in range(3):
        label = torch.from_numpy(np.asarray(nib.load(str(labels / f"case_{i}.nii.gz")).dataobj).astype(np.int64))
        probs = torch.softmax(torch.nn.functional.one_hot(label, 3).movedim(-1, 0) * 4.0
                              + torch.randn(3, *label.shape, generator=g) * 3, 0)
        nib.save(nib.Nifti1Image(np.moveaxis(probs.numpy(), 0, -1), AFFINE), str(pred / f"case_{i}_probs.nii.gz"))
        nib.save(nib.Nifti1Image(probs.argmax(0).numpy().astype(np.uint8), AFFINE), str(pred / f"case_{i}.nii.gz"))
    out = tmp_path / "out"
    assert calibrate(["--fit", str(pred), "--reference", str(labels), "--apply", str(pred), "-o", str(out),
                      "--allow-fit-cases"]) == 0
    for i in range(3):
        new = np.moveaxis(nib.load(str(out / f"case_{i}_probs.nii.gz")).get_fdata(dtype=np.float32), -1, 0)
        seg = np.asarray(nib.load(str(out / f"case_{i}.nii.gz")).dataobj)
        np.testing.assert_array_equal(seg, new.argmax(0))
    assert evaluate([str(out), str(labels), "-o", str(tmp_path / "e"), *FAST]) == 0


@pytest.mark.parametrize("reader", ["NibabelIOWithReorient", "SimpleITKIOWithReorient"])
def test_calibrated_files_of_nnunets_reorienting_readers_keep_the_files_orientation(tmp_path, reader):
    require("nnunetv2", NNUNET_FILES)
    from nnunetv2.imageio.reader_writer_registry import recursive_find_reader_writer_by_name
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    from tests.tool_outputs import make_nnunet

    folders = make_nnunet(tmp_path / "reo", dims=3, reader=reader, n_cases=2, noise=4.0)
    out = tmp_path / "out"
    assert calibrate(["--fit", str(folders["pred"]), "--reference", str(folders["raw"]), "--apply",
                      str(folders["pred"]), "-o", str(out), "--allow-fit-cases"]) == 0
    labels = PlansManager(json.loads((out / "plans.json").read_text())).get_label_manager(
        json.loads((out / "dataset.json").read_text()))
    for case in ("tiny_000", "tiny_001"):
        seg, _ = recursive_find_reader_writer_by_name(reader)().read_seg(str(out / f"{case}.nii.gz"))  # its order
        theirs = labels.convert_probabilities_to_segmentation(np.load(out / f"{case}.npz")["probabilities"])
        np.testing.assert_array_equal(seg[0], theirs)
    assert evaluate([str(out), str(folders["raw"]), "-o", str(tmp_path / "e"), *FAST]) == 0


def _mcseg_predictions(root, cases: dict[str, list[int]], seed: int = 3):
    """A labels folder of 4 cases and mcseg prediction folders (``<case>_probs`` and ``<case>``) holding the
    cases ``cases`` names (folder name -> case numbers), over-confident."""
    import nibabel as nib

    from tests.test_monai_folders import AFFINE, _labels

    labels = _labels(root / "labels", (11, 9, 6), n=4)
    g = torch.Generator().manual_seed(seed)
    folders = {}
    for name, numbers in cases.items():
        pred = folders[name] = root / name
        pred.mkdir()
        for i in numbers:
            label = torch.from_numpy(np.asarray(nib.load(str(labels / f"case_{i}.nii.gz")).dataobj).astype(np.int64))
            probs = torch.softmax(torch.nn.functional.one_hot(label, 3).movedim(-1, 0) * 4.0
                                  + torch.randn(3, *label.shape, generator=g) * 3, 0)
            nib.save(nib.Nifti1Image(np.moveaxis(probs.numpy(), 0, -1), AFFINE), str(pred / f"case_{i}_probs.nii.gz"))
            nib.save(nib.Nifti1Image(probs.argmax(0).numpy().astype(np.uint8), AFFINE), str(pred / f"case_{i}.nii.gz"))
    return labels, folders


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_calibrate_folder_never_replaces_a_result_unless_asked_nor_writes_into_another_tools_folder(tmp_path,
                                                                                                      capsys):
    """Issue #43 section 3: -o onto another tool's folder overwrote its files (exit 0); a rerun with another
    scaler replaced the calibrated files while calibration.json kept both fits without saying which they carry."""
    labels, f = _mcseg_predictions(tmp_path, {"val": [0, 1], "test": [2, 3], "other": [2, 3]})
    common = ["--fit", str(f["val"]), "--reference", str(labels), "--apply", str(f["test"])]
    # another tool's predictions (here mcseg's own <case>_probs of another model) and an evaluation's folder
    assert evaluate([str(f["other"]), str(labels), "-o", str(tmp_path / "evaluation"), "--allow-missing", *FAST]) == 0
    for target, held in ((f["other"], "predictions"), (tmp_path / "evaluation", "evaluation")):
        before = _snapshot(target)
        assert calibrate([*common, "-o", str(target)]) == 2
        err = capsys.readouterr().err
        assert f"-o {target}" in err and held in err and "a new folder" in err and len(err.splitlines()) == 1, err
        assert _snapshot(target) == before
    out = tmp_path / "calibrated"
    assert calibrate([*common, "-o", str(out)]) == 0
    first = _snapshot(out)
    # a second calibration into the same folder: refused, untouched; replaced with --overwrite
    again = [*common, "-o", str(out), "--scaler", "vector", "--voxels", "all"]
    assert calibrate(again) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and str(out) in err and len(err.splitlines()) == 1, err
    assert _snapshot(out) == first
    assert calibrate([*again, "--overwrite"]) == 0
    stored = json.loads((out / "calibration.json").read_text())
    (key, fit), = stored["fits"].items()  # the fit the files carry, alone
    assert list(fit["scalers"]) == ["vector"]
    assert stored["applied"]["fit"] == key and stored["applied"]["scaler"] == "vector"
    assert stored["applied"]["to"] == str(f["test"].resolve())
    replaced, = stored["replaced"]  # the earlier fit, said to be replaced
    assert list(replaced["scalers"]) == ["temperature"] and replaced["applied"]["scaler"] == "temperature"
    assert _snapshot(out)[__import__("pathlib").Path("case_2_probs.nii.gz")] != first[
        __import__("pathlib").Path("case_2_probs.nii.gz")]


def test_the_cases_a_temperature_is_fitted_on_are_not_calibrated_for_scoring_without_a_word(tmp_path, capsys):
    """Issue #43 section 3: --fit and --apply given the same folder fitted the temperature on the cases it then
    scored, silently. Refused; --allow-fit-cases calibrates them with a warning, recorded in calibration.json and
    in the provenance of the calibrated folder's evaluation."""
    labels, f = _mcseg_predictions(tmp_path, {"val": [0, 1], "test": [1, 2, 3]})
    for apply, named in ((f["val"], "case_0, case_1"), (f["test"], "case_1")):
        out = tmp_path / f"out_{apply.name}"
        assert calibrate(["--fit", str(f["val"]), "--reference", str(labels), "--apply", str(apply), "-o",
                          str(out)]) == 2
        err = capsys.readouterr().err
        assert named in err and "--allow-fit-cases" in err and len(err.splitlines()) == 1, err
        assert not out.exists()
    out = tmp_path / "out"
    assert calibrate(["--fit", str(f["val"]), "--reference", str(labels), "--apply", str(f["test"]), "-o", str(out),
                      "--allow-fit-cases"]) == 0
    assert "warning" in capsys.readouterr().out.lower()
    assert json.loads((out / "calibration.json").read_text())["applied"]["fit_cases_calibrated"] == ["case_1"]
    assert evaluate([str(out), str(labels), "-o", str(tmp_path / "e"), "--allow-missing", *FAST]) == 0
    assert "case_1" in capsys.readouterr().err
    provenance = json.loads((tmp_path / "e" / "provenance.json").read_text())
    assert provenance["scored_fit_cases"] == ["case_1"]
    assert any("case_1" in w for w in provenance["warnings"])


def test_ctrl_c_in_calibrate_folder_marks_the_folder_which_is_not_evaluated_until_redone(tmp_path, capsys,
                                                                                         monkeypatch):
    """Ctrl-C while calibrated files are written: one line, the folder marked interrupted; mcseg-evaluate-folder
    refuses the half-calibrated folder; the same command again redoes it without --overwrite."""
    from mcseg.evaluation.formats import McsegFormat

    labels, f = _mcseg_predictions(tmp_path, {"val": [0, 1], "test": [2, 3]})
    out = tmp_path / "out"
    args = ["--fit", str(f["val"]), "--reference", str(labels), "--apply", str(f["test"]), "-o", str(out)]
    written = []
    real = McsegFormat.write

    def ctrl_c_after_one_case(*a, **k):
        if written:
            raise KeyboardInterrupt
        written.append(real(*a, **k))
        return written[-1]

    monkeypatch.setattr(McsegFormat, "write", ctrl_c_after_one_case)
    try:
        code = calibrate(args)
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped: a traceback"
    assert code == 130
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "run the same command again" in err, err
    assert json.loads((out / "status.json").read_text())["status"] == "interrupted"
    assert evaluate([str(out), str(labels), "-o", str(tmp_path / "e"), "--allow-missing", *FAST]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "interrupted" in err, err
    monkeypatch.undo()
    assert calibrate(args) == 0
    assert evaluate([str(out), str(labels), "-o", str(tmp_path / "e"), "--allow-missing", *FAST]) == 0
