"""scripts/statements_shift.py end to end (slow: a training): a run's validation probabilities, its test cases
clean and under one MRI corruption with their probabilities saved (shift.save_probabilities=true), and the plain
and weighted statements measured on each condition."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from mcseg.evaluate import evaluate
from mcseg.train import train
from tests.conftest import compose_config
from tests.fake_datasets import write_msd

pytestmark = pytest.mark.slow
TINY = ["dataset=msd", "debug=fast", "model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1",
        "evaluation.bootstrap_samples=10", "dataset.sampling.slice_axis=0", "dataset.sampling.patch_size=[16,16]",
        "dataset.split.val_fraction=0.3", "dataset.split.test_fraction=0.3"]


def test_plain_and_weighted_statements_on_a_shift_condition(tmp_path, monkeypatch):
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    msd = write_msd(tmp_path / "msd", n_cases=40, shape=(16, 18, 12), seed=0)
    run = tmp_path / "run"
    train(compose_config("train", [*TINY, f"dataset.root={msd}"], run))
    common = ["evaluation.bootstrap_samples=10", f"ckpt={run}", "save_probabilities=true", "posthoc.apply=[]"]
    evaluate(compose_config("evaluate", [*common, "split=val"], tmp_path / "job1"))
    evaluate(compose_config("evaluate", [*common, "split=test", "overwrite=true", "shift=rood_mri",
                                         "shift.corruptions=[ghosting,affine]", "shift.levels=[3]",
                                         "shift.save_probabilities=true"], tmp_path / "job2"))
    assert any((run / "eval/test/shift/ghosting/3/predictions").glob("*_probs.nii.gz"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from statements_shift import main

    out = tmp_path / "shift"
    assert main([str(run), "--reference", str(msd), "-o", str(out), "--alpha", "0.2"]) == 0
    rows = list(csv.DictReader((out / "shift_coverage.csv").open()))
    assert {(r["corruption"], r["level"]) for r in rows} == {("clean", "0"), ("ghosting", "3")}  # affine moves labels
    assert all(0 <= float(r["coverage_plain"]) <= 1 and float(r["n_eff"]) > 0 for r in rows)
    weighted = json.loads((out / "ghosting/3/weighted/statements.json").read_text())
    assert weighted["method"].startswith("weighted split conformal")
    assert "| 3 | volume |" in (out / "shift_coverage.md").read_text()
