"""scripts/ensemble_probe.py: single, pair and whole-ensemble validation Dice of finished runs."""
from __future__ import annotations

import csv
import json
import shutil
import sys

import numpy as np
import pytest

from mcseg.evaluate import evaluate
from mcseg.train import train
from tests.conftest import ROOT, TINY_2D

sys.path.insert(0, str(ROOT / "scripts"))
import ensemble_probe  # noqa: E402


def test_probe_scores_each_run_as_evaluate_does_and_an_ensemble_of_copies_as_one(make_cfg, tmp_path):
    run = tmp_path / "run"
    train(make_cfg([*TINY_2D, "posthoc.fit=[]", "posthoc.apply=[]"], output_dir=run))
    summary = evaluate(make_cfg([f"ckpt={run}/checkpoints/best.pt", "split=val", f"eval_dir={tmp_path}/val"],
                                config_name="evaluate", output_dir=tmp_path / "evaluate"))
    with open(tmp_path / "val" / "per_case.csv") as f:  # the evaluator's per-case Dice, averaged per case
        per_case: dict[str, list[float]] = {}
        for row in csv.DictReader(f):
            per_case.setdefault(row["case"], []).append(float(row["dice"]) if row["dice"] else np.nan)
    want = float(np.mean([np.nanmean(v) for v in per_case.values()]))

    copy = shutil.copytree(run, tmp_path / "copy", ignore=shutil.ignore_patterns("eval", "tensorboard"))
    result = ensemble_probe.probe([run, copy])
    assert result["n_cases"] == summary["n_cases"] == len(per_case)
    assert result["single"] == pytest.approx([want, want], abs=1e-6)
    # averaging identical probabilities changes nothing
    assert result["pairs"] == {(0, 1): pytest.approx(want, abs=1e-6)}
    assert result["all"] == pytest.approx(want, abs=1e-6)

    split = json.loads((copy / "split.json").read_text())
    split["val"] = split["val"][1:] + split["train"][:1]
    (copy / "split.json").write_text(json.dumps(split))
    with pytest.raises(ValueError, match="do not share one validation split"):
        ensemble_probe.probe([run, copy])
