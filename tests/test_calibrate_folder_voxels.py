"""mcseg-calibrate-folder's fit voxels (issue 55 §3): the default sample per calibrator (balanced for one that can
move the arg-max, said in the output), the arg-max changes counted on the calibrated files too, and a warning when
a fit has too few voxels for its parameters. Tiny MONAI folders: three 11 x 9 x 6 cases."""
from __future__ import annotations

import json

import pytest

from mcseg.calibrate_folder import main as calibrate


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from .test_monai_folders import _labels
    from .tool_outputs import make_monai

    root = tmp_path_factory.mktemp("voxels")
    labels = _labels(root / "labels", (11, 9, 6))
    return {"labels": labels, "fit": make_monai(root / "fit", labels, noise=2.5, seed=2),
            "test": make_monai(root / "test", labels, seed=3)}


def _args(folders, out, *extra: str) -> list[str]:
    return ["--fit", str(folders["fit"]), "--reference", str(folders["labels"]), "--apply", str(folders["test"]),
            "-o", str(out), "--allow-fit-cases", *extra]


def _fit(out) -> dict:
    (fit,) = json.loads((out / "calibration.json").read_text())["fits"].values()
    return fit


def test_the_default_voxels_are_chosen_per_calibrator_and_said(folders, tmp_path, capsys):
    """A calibrator that can move the arg-max was refused on the default voxels (region) with advice to pass
    --voxels: the default is now balanced for it, region for one that keeps the arg-max, and the output says which
    and why. An explicit --voxels region stays refused for it."""
    assert calibrate(_args(folders, tmp_path / "v", "--scaler", "vector")) == 0
    out = capsys.readouterr().out
    assert _fit(tmp_path / "v")["scalers"]["vector"]["voxels"] == "balanced"
    assert "--voxels balanced (the default for vector, which can move the arg-max" in out
    assert calibrate(_args(folders, tmp_path / "t")) == 0
    assert _fit(tmp_path / "t")["scalers"]["temperature"]["voxels"] == "region"
    assert "--voxels region (the default for temperature, which keeps the arg-max" in capsys.readouterr().out
    assert calibrate(_args(folders, tmp_path / "r", "--scaler", "vector", "--voxels", "region")) == 2
    assert "--voxels region: vector scaling can change the arg-max" in capsys.readouterr().err


def test_arg_max_changes_are_counted_on_the_calibrated_files_and_a_tiny_fit_is_warned_of(folders, tmp_path, capsys):
    """The record said "arg-max changed at 0 of 5 fit voxels" while the files written moved many voxels: the
    changes are now counted on the calibrated cases too (calibration.json 'applied', and printed), and a fit on
    fewer voxels than its parameters call for is warned of."""
    import numpy as np

    from mcseg.data.reference import read_reference
    from mcseg.evaluation.folders import read_case
    from mcseg.evaluation.formats import open_folder

    out = tmp_path / "tiny"
    assert calibrate(_args(folders, out, "--scaler", "vector", "--voxels", "balanced", "--max-voxels", "5")) == 0
    printed = capsys.readouterr().out
    stored = json.loads((out / "calibration.json").read_text())
    fit = _fit(out)
    assert fit["n_voxels"] == 5
    assert any("5 voxels" in w and "6 parameters" in w for w in fit["warnings"]), fit["warnings"]
    assert "warning: " in printed and "6 parameters" in printed
    reference = read_reference(folders["labels"])
    moved = total = 0
    for case in ("case_0", "case_1", "case_2"):
        before = read_case([open_folder(folders["test"], reference.task)], reference, case)[2]
        after = read_case([open_folder(out, reference.task)], reference, case)[2]
        moved += int((before.argmax(0) != after.argmax(0)).sum())
        total += before[0].numel()
    applied = stored["applied"]["argmax_changes"]
    assert applied == {"count": moved, "share": moved / total, "of": total, "voxels": "every voxel of the 3 "
                       "calibrated case(s)"} and moved > 0
    assert f"arg-max changed at {moved} of {total} voxels of the 3 calibrated case(s)" in printed
    assert np.isfinite(applied["share"])
