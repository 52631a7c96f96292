"""Issue #58 item 4 for the other folder commands: ``--workers N`` reads (and scores, calibrates, summarises) the
cases of mcseg-calibrate-folder, mcseg-conformal-folder and mcseg-new-cases in N processes, and every file they
write is the one of a single process to the byte (times aside: a scaler's ``fit_seconds``), as in
tests/test_case_workers.py for mcseg-evaluate-folder. Tiny MONAI SaveImage folders (tests/test_folder_report.py's:
8 fit and 4 new 10 x 9 x 5 cases)."""
from __future__ import annotations

import json

import pytest

from mcseg.calibrate_folder import main as calibrate
from mcseg.conformal_folder import main as conformal
from mcseg.new_cases import main as new_cases
from tests.conftest import torch_threads
from tests.test_case_workers import written_bytes
from tests.test_folder_report import _args, folders  # noqa: F401  (the tiny study folders)

COMMANDS = {
    "calibrate": (calibrate, ["--scaler", "vector", "--no-html"]),
    "conformal": (conformal, ["--alpha", "0.3", "--repeats", "5", "--figures", "--no-html"]),
    "new-cases": (new_cases, ["--alpha", "0.25", "--figure", "--no-html"]),
}


def _without_times(name: str, data: bytes) -> bytes:
    """calibration.json without the scalers' ``fit_seconds`` (wall time)."""
    if name != "calibration.json":
        return data
    stored = json.loads(data)
    for fit in stored["fits"].values():
        for scaler in fit["scalers"].values():
            scaler.pop("fit_seconds")
    return json.dumps(stored).encode()


# calibrate and conformal (its per-case figures) take 7-30 s each on 2 busy cores: the slow run's
@pytest.mark.parametrize("command", [pytest.param("calibrate", marks=pytest.mark.slow),
                                     pytest.param("conformal", marks=pytest.mark.slow), "new-cases"])
def test_two_workers_write_the_bytes_of_one(folders, tmp_path, command):  # noqa: F811
    main, extra = COMMANDS[command]
    outs = {}
    for workers in (1, 2):
        out = tmp_path / str(workers) / "out"
        # one torch thread here as in each worker: calibrating an --apply case with 2 threads can round a
        # probability's last bit otherwise than with 1 (seen in the fresh-clone CI, which sets no thread count)
        with torch_threads(1):
            assert main(_args(folders, out, *extra, "--workers", str(workers))) == 0
        outs[workers] = {name: _without_times(name, data) for name, data in written_bytes(out).items()}
    assert len(outs[1]) > 3
    assert outs[1].keys() == outs[2].keys()
    for name in outs[1]:
        assert outs[1][name] == outs[2][name], name


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_number_of_workers_is_refused_before_anything_is_written(folders, tmp_path, capsys,  # noqa: F811
                                                                        command):
    main, extra = COMMANDS[command]
    assert main(_args(folders, tmp_path / "out", *extra, "--workers", "0")) == 2
    assert "--workers=0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
