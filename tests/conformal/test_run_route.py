"""A run's own probabilities through the folder command: evaluate.py saves the validation and test probabilities
(mcseg's <case>_probs), mcseg-conformal-folder fits on the first and gives the second its sets. Slow (a training)."""
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


@pytest.mark.slow
def test_a_runs_saved_probabilities_through_the_folder_command(tmp_path, monkeypatch):
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    msd = write_msd(tmp_path / "msd", n_cases=12, seed=0)
    run = tmp_path / "run"
    train(compose_config("train", [*TINY, f"dataset.root={msd}"], run))  # its test split's probabilities
    evaluate(compose_config("evaluate", ["evaluation.bootstrap_samples=10", f"ckpt={run}", "split=val",
                                         "save_probabilities=true", "posthoc.apply=[]"], tmp_path / "job"))
    split = json.loads((run / "split.json").read_text())
    out = tmp_path / "conformal"
    assert conformal(["--fit", str(run / "eval/val/predictions"), "--reference", str(msd), "--apply",
                      str(run / "eval/test/predictions"), "-o", str(out), "--alpha", "0.4"]) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert record["fit_cases"] == sorted(split["val"]) and record["applied"]["cases"] == sorted(split["test"])
    for name, fit in record["classes"].items():
        for case in split["test"]:
            probs = nib.load(str(run / f"eval/test/predictions/{case}_probs.nii.gz")).get_fdata(dtype=np.float32)
            mask = np.asarray(nib.load(str(out / f"{case}_set_{name}.nii.gz")).dataobj).astype(bool)
            np.testing.assert_array_equal(mask, probs[..., fit["channel"]].astype(np.float64) >= fit["threshold"])
