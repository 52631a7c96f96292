"""Ctrl-C in scripts/study_pieces.py (issue #43 section 3): one line that says how to resume, trainings stopped,
and a piece cut short while its raw tables were being written marked interrupted, so that --table and --list
never take it for a complete piece."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import study_pieces  # noqa: E402
import study_presets  # noqa: E402
import study_training  # noqa: E402
from study_presets import Study  # noqa: E402


def _main():
    """study_pieces.main(), with a KeyboardInterrupt that escapes it (a traceback for the user) as a value."""
    try:
        return study_pieces.main()
    except KeyboardInterrupt:
        return "KeyboardInterrupt escaped: a traceback"


def _tiny(tmp_path, monkeypatch):
    monkeypatch.setitem(study_pieces.STUDIES, "tiny", Study({"ce": ["loss=ce"]}, {"ce": "CE"}, seeds=(0, 1)))
    monkeypatch.setitem(study_presets.STUDIES_DOC, "tiny", "A tiny study of the tests.")
    monkeypatch.setattr(study_presets, "results_dir", lambda study: tmp_path / "docs" / study)
    monkeypatch.setattr(sys, "argv", ["study_pieces.py", "tiny", "--config", "ce", "--runs", str(tmp_path / "runs")])


def test_ctrl_c_while_a_piece_is_written_marks_it_interrupted_and_says_how_to_resume(tmp_path, monkeypatch, capsys):
    _tiny(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--jobs", "3"])  # the resume command keeps --runs and --jobs
    runs = tmp_path / "runs" / "tiny" / "ce"
    for seed in (0, 1):
        (runs / f"seed{seed}" / "eval" / "test").mkdir(parents=True)
        (runs / f"seed{seed}" / "eval" / "test" / "summary.json").write_text(json.dumps({"mean_foreground_dice": 0.8}))
    monkeypatch.setattr(study_pieces, "train_all", lambda jobs, parallel: {})  # the runs are trained
    # a complete piece from before: run again (e.g. to add an evaluation) and cut short half-way
    assert study_pieces.main() == 0
    assert list(study_pieces.pieces("tiny")) == ["ce"]
    capsys.readouterr()
    copies = []

    def copy_then_ctrl_c(source, target):
        if copies:
            raise KeyboardInterrupt
        copies.append(target)

    monkeypatch.setattr(study_pieces, "copy_raw", copy_then_ctrl_c)
    assert _main() == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and \
        f"`python scripts/study_pieces.py tiny --config ce --runs {tmp_path / 'runs'} --jobs 3` again" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    piece = json.loads((tmp_path / "docs" / "tiny" / "ce" / "piece.json").read_text())
    assert piece["status"] == "interrupted"
    assert study_pieces.pieces("tiny") == {}  # not a complete piece for --table and --list


def test_ctrl_c_while_training_stops_the_trainings_it_started(tmp_path, monkeypatch):
    _tiny(tmp_path, monkeypatch)
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    started = []
    real_popen = subprocess.Popen

    def popen(command, **kwargs):
        started.append(real_popen(sleeper, **kwargs))
        return started[-1]

    monkeypatch.setattr(study_pieces.subprocess, "Popen", popen)
    def ctrl_c(seconds):  # while the script waits for its trainings
        raise KeyboardInterrupt

    clock = SimpleNamespace(sleep=ctrl_c, **{name: getattr(time, name) for name in ("perf_counter", "monotonic",
                                                                                     "strftime")})
    monkeypatch.setattr(study_training, "time", clock)  # the script's clock only: subprocess waits with time.sleep
    try:
        assert _main() == 130
        assert len(started) == 2 and all(p.poll() is not None for p in started)
        # SIGTERM: a training that already had the terminal's Ctrl-C takes a second SIGINT as "stop at once"
        assert all(p.returncode == -signal.SIGTERM for p in started)
    finally:
        for process in started:  # what the script left running
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not (tmp_path / "docs" / "tiny" / "ce").exists()  # nothing of the piece was written
