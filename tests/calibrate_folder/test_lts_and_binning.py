"""mcseg-calibrate-folder with local temperature scaling and with the binning calibrators, on saved probabilities
(nnU-Net, MONAI folders)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mcseg.calibrate_folder import main as calibrate
from mcseg.evaluate_folder import main as evaluate
from mcseg.evaluation.folder_posthoc import log_probabilities

from .conftest import FAST, fit_fold_0


# LTS on saved probabilities, kept tiny: one epoch of two steps on 8^3 patches
LTS_TINY = ["--scaler", "lts", "--lts", "max_epochs=1", "steps_per_epoch=2", "batch_size=1", "patch_size=[8,8,8]",
            "patience=1"]


def test_lts_on_log_probabilities_is_invariant_to_a_per_voxel_constant_added_to_the_logits():
    from mcseg.calibration.lts import LTSNet

    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    net = LTSNet(3, dims=3)
    with torch.no_grad():  # a fitted-looking net: temperatures that vary with the input
        for conv in (net.leaves, net.gates):
            conv.weight.normal_(std=0.05)
    # float64 logits: in float32, z + c itself would round z by up to 4e-6 at |c| ~ 60 (not the method's doing)
    z = torch.randn(3, 10, 9, 8, generator=g, dtype=torch.float64) * 3
    c = torch.randn(1, 10, 9, 8, generator=g, dtype=torch.float64) * 20  # the offset saved probabilities drop
    t = net.temperature_map(torch.log_softmax(z, 0).float())
    assert float(t.max() - t.min()) > 0.05

    def calibrated(logits, fed):
        return torch.softmax(net.apply(fed(logits)), 0)

    log_p = lambda x: torch.log_softmax(x, 0).float()  # noqa: E731  (what the folder tool feeds it: ln p)
    assert float((calibrated(z + c, log_p) - calibrated(z, log_p)).abs().max()) <= 1e-6
    # fed the raw logits, the same network sees the offset: not invariant (why a folder cannot give the logits' LTS)
    raw = lambda x: x.float()  # noqa: E731
    assert float((calibrated(z + c, raw) - calibrated(z, raw)).abs().max()) > 1e-2
    # and from saved probabilities (float32 files): p of z and of z + c are the same file, the same calibration
    p, p_shifted = torch.softmax(z, 0).float(), torch.softmax(z + c, 0).float()
    np.testing.assert_allclose(calibrated(p, lambda x: log_probabilities(x, False)),
                               calibrated(p_shifted, lambda x: log_probabilities(x, False)), atol=1e-6)


@pytest.mark.parametrize("kind", ["labels", "regions"])
def test_lts_on_nnunet_folders_from_log_probabilities_keeps_the_segmentation(nn, kind, tmp_path):
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO

    from mcseg.calibration.scaler_registry import load_scaler

    folders = nn[kind]
    val, test = folders["members"]
    out = tmp_path / "lts"
    assert calibrate(fit_fold_0(folders, out, *LTS_TINY)) == 0
    fit, = json.loads((out / "calibration.json").read_text())["fits"].values()
    lts = fit["scalers"]["lts"]
    assert (out / lts["weights"]).is_file() and lts["config"]["max_epochs"] == 1 and lts["config"]["dims"] == 3
    assert lts["argmax_changes"]["count"] == 0 and lts["argmax_changes"]["of"] > 0
    assert "invariant to a per-voxel constant" in fit["fitted_on_probabilities"]["lts"]
    scaler = load_scaler("lts", lts, out)
    for case in ("tiny_001", "tiny_003"):
        old = np.load(test / f"{case}.npz")["probabilities"]
        z = scaler.apply(log_probabilities(torch.from_numpy(old), kind == "regions"))
        expected = torch.sigmoid(z) if kind == "regions" else torch.softmax(z, 0)
        np.testing.assert_allclose(np.load(out / f"{case}.npz")["probabilities"], expected.numpy(), atol=1e-6)
        # a temperature per voxel keeps the arg-max (and every sigmoid's side of 0.5): the label map is the same
        np.testing.assert_array_equal(SimpleITKIO().read_seg(str(out / f"{case}.nii.gz"))[0],
                                      SimpleITKIO().read_seg(str(test / f"{case}.nii.gz"))[0])
    after = tmp_path / "after"
    assert evaluate([str(out), str(folders["raw"]), "-o", str(after), *FAST, "--splits", str(folders["splits"]),
                     "--fold", "1"]) == 0
    # a new calibration of the folder replaces the weights of the one before
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "-o", str(out), "--overwrite",
                      "--splits", str(folders["splits"]), "--fold", "0"]) == 0
    assert not (out / lts["weights"]).exists()


def test_lts_on_monai_folders_from_log_probabilities(tmp_path):
    import nibabel as nib

    from mcseg.calibration.scaler_registry import load_scaler
    from tests.test_monai_folders import _labels
    from tests.tool_outputs import make_monai

    labels = _labels(tmp_path / "labels", (11, 9, 6))
    pred = make_monai(tmp_path / "pred", labels, noise=3.0)
    out = tmp_path / "out"
    assert calibrate(["--fit", str(pred), "--reference", str(labels), "--apply", str(pred), "-o", str(out),
                      "--allow-fit-cases", *LTS_TINY]) == 0
    lts = next(iter(json.loads((out / "calibration.json").read_text())["fits"].values()))["scalers"]["lts"]
    scaler = load_scaler("lts", lts, out)
    old = nib.load(str(pred / "case_1" / "case_1_trans.nii.gz")).get_fdata(dtype=np.float32)
    new = nib.load(str(out / "case_1" / "case_1_trans.nii.gz")).get_fdata(dtype=np.float32)
    z = scaler.apply(log_probabilities(torch.from_numpy(np.moveaxis(old, -1, 0)), False))
    np.testing.assert_allclose(np.moveaxis(new, -1, 0), torch.softmax(z, 0).numpy(), atol=1e-6)
    assert evaluate([str(out), str(labels), "-o", str(tmp_path / "e"), *FAST]) == 0


@pytest.mark.parametrize("scaler", ["histogram", "isotonic_top"])
def test_binning_scalers_on_an_nnunet_folder(nn, scaler, tmp_path, capsys):
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    from mcseg.calibration.scaler_registry import load_scaler

    folders = nn["labels"]
    val, test = folders["members"]
    out = tmp_path / scaler
    args = fit_fold_0(folders, out, "--scaler", scaler)
    assert calibrate([*args, "--voxels", "region"]) == 2  # the region sample is refused: the scaler moves the arg-max
    assert f"--voxels region: {scaler} scaling can change the arg-max" in capsys.readouterr().err
    assert calibrate([*args, "--voxels", "balanced", "--histogram-bins", "8"]) == 0
    fit, = json.loads((out / "calibration.json").read_text())["fits"].values()
    entry = fit["scalers"][scaler]
    assert entry["argmax_changes"]["of"] == fit["n_voxels"] and entry["nll_after"] < entry["nll_before"]
    assert f"arg-max changed at {entry['argmax_changes']['count']} of {fit['n_voxels']} fit voxels" in \
        capsys.readouterr().out
    fitted = load_scaler(scaler, entry, out)
    plans = PlansManager(json.loads((out / "plans.json").read_text()))
    labels = plans.get_label_manager(json.loads((out / "dataset.json").read_text()))
    old = np.load(test / "tiny_001.npz")["probabilities"]
    new = np.load(out / "tiny_001.npz")["probabilities"]
    expected = torch.softmax(fitted.apply(log_probabilities(torch.from_numpy(old), False)), 0).numpy()
    np.testing.assert_allclose(new, expected, atol=1e-6)
    # the label map written back is nnU-Net's reading of the calibrated probabilities (it may differ from the old)
    np.testing.assert_array_equal(SimpleITKIO().read_seg(str(out / "tiny_001.nii.gz"))[0][0],
                                  labels.convert_probabilities_to_segmentation(new))
    assert evaluate([str(out), str(folders["raw"]), "-o", str(tmp_path / "e"), *FAST, "--splits",
                     str(folders["splits"]), "--fold", "1"]) == 0
    regions = nn["regions"]
    assert calibrate(["--fit", str(regions["members"][0]), "--reference", str(regions["raw"]), "-o",
                      str(tmp_path / "r"), "--scaler", scaler, "--voxels", "all"]) == 2
    assert "independent (sigmoid) regions" in capsys.readouterr().err
