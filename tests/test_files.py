"""mcseg.files.undone_on_failure: a block that fails leaves its folder as it found it (what it created removed)."""
from __future__ import annotations

import pytest

from mcseg.files import undone_on_failure, write_json


def test_a_failed_block_removes_what_it_created_and_keeps_what_was_there(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    out = run / "eval" / "test"
    with pytest.raises(RuntimeError, match="conformal"):
        with undone_on_failure(out):
            write_json(out / "summary.json", {"mean_dice": 0.5})
            (out / "conformal" / "raw").mkdir(parents=True)
            raise RuntimeError("the conformal pass failed")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]  # eval/ and eval/test/ were the block's
    out.mkdir(parents=True)
    write_json(out / "calibration.json", {"on": "record"})
    with pytest.raises(KeyboardInterrupt):
        with undone_on_failure(out):
            write_json(out / "summary.json", {})
            write_json(out / "calibration.json", {"changed": True})
            raise KeyboardInterrupt
    assert [p.name for p in out.iterdir()] == ["calibration.json"]  # there before: kept (as the block left it)
    with undone_on_failure(out):  # a block that succeeds keeps everything
        write_json(out / "summary.json", {})
    assert sorted(p.name for p in out.iterdir()) == ["calibration.json", "summary.json"]
