"""Conformal guarantees of a run (slow: a training): evaluate.py conformal.enabled=true fits on the run's validation
split and applies to its test split; the thresholds satisfy the CRC bound on the validation cases (recomputed from
their saved probabilities) and are the largest that do, the test FNR equals a recomputation from the saved test
probabilities, the masks are written; and the same probabilities through mcseg-conformal-folder."""
from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from mcseg.conformal_folder import main as conformal
from mcseg.evaluate import evaluate
from mcseg.train import train
from tests.conftest import compose_config
from tests.fake_datasets import write_msd

TINY = ["dataset=msd", "debug=fast", "model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1",
        "evaluation.bootstrap_samples=10", "dataset.sampling.slice_axis=0", "dataset.sampling.patch_size=[28,20]",
        "inference.save_probabilities=true"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformal_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCSEG_CACHE_DIR", str(root / "cache"))
        msd = write_msd(root / "msd", n_cases=12, seed=0)
        train(compose_config("train", [*TINY, f"dataset.root={msd}"], root / "run"))  # its test probabilities
        evaluate(compose_config("evaluate", ["evaluation.bootstrap_samples=10", f"ckpt={root / 'run'}", "split=val",
                                             "save_probabilities=true", "posthoc.apply=[]"], root / "job"))
    return root / "run", msd, json.loads((root / "run/split.json").read_text())


def _probs(path):
    return np.moveaxis(nib.load(str(path)).get_fdata(dtype=np.float32), -1, 0).astype(np.float64)


def _label(msd, case):
    return np.asarray(nib.load(str(msd / "labelsTr" / f"{case}.nii.gz")).dataobj).astype(int)


def test_evaluate_fits_on_validation_and_applies_to_test(run, tmp_path, monkeypatch):
    path, msd, split = run
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    summary = evaluate(compose_config("evaluate", [
        "evaluation.bootstrap_samples=10", f"ckpt={path}", "split=test", "overwrite=true", "conformal.enabled=true",
        "conformal.alpha=0.4", "conformal.figures=1", f"eval_dir={tmp_path / 'eval'}"], tmp_path / "job"))
    grid = np.linspace(0, 1, 101)
    n = len(split["val"])
    for source in ("raw", "temperature"):
        record = json.loads((tmp_path / "eval/conformal" / source / "conformal.json").read_text())
        assert record["fit_cases"] == split["val"] and record["applied"]["split_cases"] == split["test"]
        assert summary["conformal"][source]["classes"].keys() == record["classes"].keys()
    # the table of figures reads the raw block from summary.json: means over the classes of the test figures
    from mcseg.evaluation.figure_table import figure, summary_value

    written = json.loads((tmp_path / "eval/summary.json").read_text())
    raw = json.loads((tmp_path / "eval/conformal/raw/conformal.json").read_text())["test"]
    assert summary_value(written, figure("conformal_loss")) == pytest.approx(
        np.mean([t["mean_loss"] for t in raw.values()]))
    assert summary_value(written, figure("conformal_volume")) == pytest.approx(
        np.mean([t["mean_set_over_prediction"] for t in raw.values()]))
    assert written["mean_foreground_dice"] == summary["mean_foreground_dice"]  # the evaluation's own, kept
    record = json.loads((tmp_path / "eval/conformal/raw/conformal.json").read_text())
    figures = [f for f in record["applied"]["files"] if f.endswith(".png")]
    assert figures == [f"{split['test'][0]}_conformal.png"] and (tmp_path / "eval/conformal/raw" / figures[0]).is_file()
    for name, fit in record["classes"].items():
        k = fit["channel"]
        curves = []
        for case in split["val"]:
            p, g = _probs(path / f"eval/val/predictions/{case}_probs.nii.gz")[k], _label(msd, case) == k
            curves.append([1 - ((p >= t) & g).sum() / g.sum() for t in grid])
        bound = n / (n + 1) * np.mean(curves, 0) + 1 / (n + 1)
        j = int(np.flatnonzero(np.isclose(grid, fit["threshold"]))[0])
        assert fit["controlled"] and bound[j] <= 0.4 and (j + 1 == len(grid) or bound[j + 1] > 0.4)
        fnr = []
        for case in split["test"]:
            p, g = _probs(path / f"eval/test/predictions/{case}_probs.nii.gz")[k], _label(msd, case) == k
            fnr.append(1 - ((p >= fit["threshold"]) & g).sum() / g.sum())
            mask = np.asarray(nib.load(str(tmp_path / f"eval/conformal/raw/{case}_set_{name}.nii.gz")).dataobj)
            np.testing.assert_array_equal(mask.astype(bool), p >= fit["threshold"])
        assert record["test"][name]["mean_loss"] == pytest.approx(np.mean(fnr))


def test_a_runs_saved_probabilities_through_the_folder_command(run, tmp_path):
    path, msd, split = run
    out = tmp_path / "conformal"
    assert conformal(["--fit", str(path / "eval/val/predictions"), "--reference", str(msd), "--apply",
                      str(path / "eval/test/predictions"), "-o", str(out), "--alpha", "0.4"]) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert record["fit_cases"] == sorted(split["val"]) and record["applied"]["cases"] == sorted(split["test"])
    for name, fit in record["classes"].items():
        for case in split["test"]:
            probs = _probs(path / f"eval/test/predictions/{case}_probs.nii.gz")
            mask = np.asarray(nib.load(str(out / f"{case}_set_{name}.nii.gz")).dataobj).astype(bool)
            np.testing.assert_array_equal(mask, probs[fit["channel"]] >= fit["threshold"])


def test_statements_of_the_run_equal_the_folder_commands(run, tmp_path, monkeypatch):
    """conformal.statements=true in evaluate.py (issue #54) states for the test cases what mcseg-new-cases states
    from the run's saved validation and test probabilities."""
    import csv

    from mcseg.new_cases import main as new_cases

    path, msd, split = run
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    evaluate(compose_config("evaluate", [
        "evaluation.bootstrap_samples=10", f"ckpt={path}", "split=test", "conformal.enabled=true",
        "conformal.alpha=0.4", "conformal.statements=true", "conformal.posthoc=false", "conformal.repeats=0",
        "conformal.masks=false", "save_predictions=false", f"eval_dir={tmp_path / 'eval'}"], tmp_path / "job"))
    folder = tmp_path / "folder"
    assert new_cases(["--fit", str(path / "eval/val/predictions"), "--reference", str(msd), "--apply",
                      str(path / "eval/test/predictions"), "-o", str(folder), "--alpha", "0.4"]) == 0
    read = lambda p: list(csv.DictReader(p.open()))  # noqa: E731
    ours, theirs = read(tmp_path / "eval/conformal/raw/statements/statements.csv"), read(folder / "statements.csv")
    assert (tmp_path / "eval/conformal/raw/statements/statements.png").read_bytes()[:4] == b"\x89PNG"
    assert [(r["case"], r["structure"]) for r in ours] == [(r["case"], r["structure"]) for r in theirs]
    for a, b in zip(ours, theirs):
        for key in ("volume_mask_ml", "volume_lower_ml", "volume_upper_ml", "dice_lower", "review"):
            assert a[key] == b[key] or float(a[key]) == pytest.approx(float(b[key]), rel=1e-4, abs=1e-6), key
