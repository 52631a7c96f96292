"""One evaluation of a predictor (issue #56, item 1): a run's own test evaluation after its training and
``evaluate.py`` of its best.pt go through :func:`mcseg.evaluation.predictor.evaluate_predictor` and write the same
files, byte for byte, but for the record of what produced them (``provenance``: paths, times, the split's source)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcseg.evaluate import evaluate
from mcseg.train import train
from tests.conftest import TINY_2D, compose_config

pytestmark = pytest.mark.slow  # a tiny training and an evaluation (about 80 s on a busy 2-core machine)

CONFORMAL = ["conformal.enabled=true", "conformal.alpha=0.4"]


def without_provenance(path: Path) -> str:
    """A JSON file's text as its writer laid it out (key order kept), without its ``provenance`` record."""
    record = json.loads(path.read_text())
    record.pop("provenance", None)
    return json.dumps(record, indent=1)


def test_a_runs_test_evaluation_is_evaluate_pys_byte_for_byte(make_cfg, tmp_path):
    run = tmp_path / "run"
    # a post-hoc fit (the default temperature), applied; the conformal pass on the raw and the scaled outputs
    train(make_cfg([*TINY_2D, "logger=none", "trainer.deterministic=true", *CONFORMAL], output_dir=run))
    again = tmp_path / "again"
    evaluate(compose_config("evaluate", ["debug=fast", f"ckpt={run}", "split=test", *CONFORMAL,
                                         f"eval_dir={again}"], tmp_path / "job"))
    own = run / "eval" / "test"
    files = sorted(str(p.relative_to(own)) for p in own.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file())
    assert {"per_case.csv", "summary.json", "temperature/summary.json", "conformal/raw/conformal.json",
            "conformal/temperature/conformal.json"} <= set(files)
    differ = [name for name in files if Path(name).name != "provenance.json" and (  # the record itself: below
        without_provenance(own / name) != without_provenance(again / name) if name.endswith(".json")
        else (own / name).read_bytes() != (again / name).read_bytes())]
    assert differ == []
    # the run's record says what the training knew of its data; evaluate.py's, what it read from the checkpoint
    mine = json.loads((own / "summary.json").read_text())["provenance"]
    theirs = json.loads((again / "summary.json").read_text())["provenance"]
    assert (mine["split"]["source"], theirs["split"]["source"]) == ("training", "checkpoint")
    assert mine["split"]["cases"] == theirs["split"]["cases"] and mine["checkpoint"] == theirs["checkpoint"]
    assert "content_sha256" in mine["dataset"] and "content_checked" in theirs
    assert mine["trained_on"] == theirs["trained_on"]
