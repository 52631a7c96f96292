"""The output folders of ``mcseg-evaluate-folder``, ``mcseg-calibrate-folder`` and ``mcseg-conformal-folder``, under
the run directories' rule.

* **Never into another tool's folder.** A folder that holds predictions (nnU-Net's npz, MONAI's maps, mcseg's
  ``<case>_probs`` or label maps), an evaluation when calibrating, calibrated files when evaluating, a checkpoint's
  evaluation or a run is refused with one line naming it and what it holds (:func:`claim_output`), even with
  ``--overwrite``: its own tools would read the new files as theirs.
* **Never replace a result unless asked.** A complete evaluation (or calibration) of the same tool is replaced
  only with ``--overwrite``; an interrupted or failed one (``status.json``) is simply redone.
* **Marked while written.** :func:`writing` owns the folder (``run.lock``, :mod:`mcseg.rundir`) and records
  ``status.json`` as a run does: ``running``, then ``completed``, ``failed`` or ``interrupted`` (Ctrl-C: a
  one-line :class:`FolderInterrupted` saying how to resume); a ``running`` whose process is gone reads
  ``interrupted`` (:func:`mcseg.rundir.state_of`). ``mcseg-report`` leaves out an evaluation that is not
  ``completed``.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mcseg.files import check_writable, write_json
from mcseg.rundir import LOCK_FILE, RUN_MARKERS, STATUS_FILE, held, state_of

__all__ = ["run_command", "CALIBRATE_TOOL", "CONFORMAL_TOOL", "EVALUATE_TOOL", "EXIT_INTERRUPTED", "FolderInterrupted", "Held",
           "NEW_CASES_TOOL", "OutputRefused",
           "claim_output", "folder_status", "held_by", "writing"]

EVALUATE_TOOL = "mcseg-evaluate-folder"
CALIBRATE_TOOL = "mcseg-calibrate-folder"
CONFORMAL_TOOL = "mcseg-conformal-folder"
NEW_CASES_TOOL = "mcseg-new-cases"
KINDS = {EVALUATE_TOOL: "evaluation", CALIBRATE_TOOL: "calibration", CONFORMAL_TOOL: "conformal fit",
         NEW_CASES_TOOL: "set of statements for new cases"}
CALIBRATION_FILE = "calibration.json"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells expect of a command ended by Ctrl-C (as mcseg.sweep's jobs)
# What an evaluation writes at the top of its folder (Evaluator.write, failure detection, provenance)
EVALUATION_FILES = ("summary.json", "per_case.csv", "per_case_raters.csv", "per_rater.csv", "reliability_raters.csv",
                    "reliability.csv", "reliability.png", "reliability_histogram.csv", "reliability_histogram.png",
                    "failure_per_case.csv", "provenance.json")


class OutputRefused(ValueError):
    """The output folder holds what the tool must not write into or replace; nothing was written."""


class FolderInterrupted(KeyboardInterrupt):
    """Ctrl-C while a folder tool wrote its output folder; the message says what was left and how to resume."""


@dataclass
class Held:
    """What an output folder already holds: ``kind`` (evaluation, calibration, predictions, other), a phrase for
    messages, and whether it is a complete result (False: interrupted or failed, to be redone)."""

    kind: str
    what: str
    complete: bool = True


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def folder_status(folder: Path) -> dict | None:
    """The ``status.json`` a folder tool wrote into ``folder`` (its ``status`` as :func:`state_of` reads it:
    a ``running`` whose process is gone is ``interrupted``), or None when no folder tool wrote one."""
    status = _read_json(Path(folder) / STATUS_FILE)
    if status.get("tool") not in KINDS:
        return None
    return {**status, "status": state_of(Path(folder), str(status.get("status")))}


def _calibrated_here(folder: Path) -> bool:
    """``calibration.json`` written by mcseg-calibrate-folder (fits on saved probabilities), not a run's."""
    stored = _read_json(folder / CALIBRATION_FILE)
    kinds = [str((fit.get("checkpoint") or {}).get("kind", "")) for fit in (stored.get("fits") or {}).values()
             if isinstance(fit, dict)]
    return "applied" in stored or any(kind.startswith("saved probabilities") for kind in kinds)


def held_by(folder: Path, predictions: Callable[[Path], str | None] | None = None) -> Held | None:
    """What ``folder`` holds that a folder tool must not silently replace (None: absent, empty or unrelated);
    ``predictions(folder)`` describes the prediction files it holds (None: none), e.g.
    :func:`mcseg.evaluation.formats.prediction_files`."""
    folder = Path(folder)
    if not folder.exists():
        return None
    status = folder_status(folder)
    if status is not None:
        state = status["status"]
        tool = status["tool"]
        return Held(KINDS[tool], f"{'an' if KINDS[tool] == 'evaluation' else 'a'} {KINDS[tool]} by {tool} "
                                 f"({STATUS_FILE}: {state})", state == "completed")
    if (folder / CALIBRATION_FILE).is_file():
        if _calibrated_here(folder):
            return Held("calibration", f"a calibration by {CALIBRATE_TOOL} ({CALIBRATION_FILE})")
        return Held("other", f"a trained run's post-hoc fits ({CALIBRATION_FILE})")
    if (folder / "summary.json").is_file():
        provenance = _read_json(folder / "summary.json").get("provenance") or {}
        if provenance.get("predictions"):
            return Held("evaluation", f"an evaluation by {EVALUATE_TOOL} (summary.json)")
        return Held("other", "an evaluation of a checkpoint (summary.json)")
    markers = [m for m in RUN_MARKERS if (folder / m).exists()]
    if markers:
        return Held("other", f"an mcseg run ({', '.join(markers)})")
    found = predictions(folder) if predictions is not None else None
    return Held("predictions", f"predictions: {found}") if found else None


def claim_output(out: Path, tool: str, overwrite: bool,
                 predictions: Callable[[Path], str | None] | None = None) -> Held | None:
    """Refuse (one :class:`OutputRefused` line) an output folder that holds another tool's files, or a complete
    result of ``tool`` without ``overwrite``; return what it holds (None: nothing). ``predictions``: as
    :func:`held_by`'s. An output folder that cannot be written is refused first, naming it."""
    try:
        check_writable(out, "-o")
    except OSError as exc:
        raise OutputRefused(str(exc)) from None
    found = held_by(out, predictions)
    if found is None:
        return None
    if found.kind != KINDS[tool]:
        raise OutputRefused(f"-o {out} holds {found.what}: {tool} never writes into another tool's folder (its "
                            f"files would be mixed with, or read as, those); pass -o a new folder")
    if found.complete and not overwrite:
        raise OutputRefused(f"-o {out} holds {found.what}: pass --overwrite to replace it, or -o a new folder")
    return found


@contextmanager
def writing(out: Path, tool: str, record: dict, replace: tuple[str, ...] = ()):
    """Own ``out`` while the block writes it, marked in ``status.json`` (module docstring); ``replace``: the
    files of an earlier result removed first. A failure that wrote nothing into a folder it created leaves none."""
    out = Path(out)
    existed = out.exists()
    status = {"status": "running", "tool": tool, **record, "pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    failed = False
    with held(out):
        write_json(out / STATUS_FILE, status)
        for name in replace:
            (out / name).unlink(missing_ok=True)
        try:
            yield
        except KeyboardInterrupt:
            write_json(out / STATUS_FILE, {**status, "status": "interrupted", "error": "KeyboardInterrupt (Ctrl-C)"})
            raise FolderInterrupted(f"{tool}: interrupted (Ctrl-C); {out} is incomplete and marked interrupted "
                                    f"({STATUS_FILE}): run the same command again to redo it") from None
        except BaseException as exc:
            write_json(out / STATUS_FILE, {**status, "status": "failed", "error": f"{type(exc).__name__}: {exc}"})
            failed = True
            raise
        else:
            write_json(out / STATUS_FILE, {**status, "status": "completed",
                                           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        finally:
            if failed and not existed and {p.name for p in out.iterdir()} <= {STATUS_FILE, LOCK_FILE}:
                shutil.rmtree(out, ignore_errors=True)  # refused on reading a case: leave no folder behind


def run_command(tool: str, action: Callable[[], object]) -> tuple[int, object]:
    """A folder command's ``action()`` as its ``main`` runs it: ``(0, result)``; a refusal (a bad folder, file,
    option or a busy output) printed as one ``<tool>: error:`` line, ``(2, None)``; Ctrl-C, ``(130, None)`` with
    what :func:`writing` says of the folder (or that nothing was written)."""
    import sys

    from mcseg.data.io import VolumeError
    from mcseg.data.reference import FolderError
    from mcseg.rundir import RunDirBusy

    try:
        return 0, action()
    except (FolderError, VolumeError, ValueError, RunDirBusy) as exc:
        print(f"{tool}: error: {exc}", file=sys.stderr)
        return 2, None
    except KeyboardInterrupt as exc:
        print(str(exc) if isinstance(exc, FolderInterrupted) else
              f"{tool}: interrupted (Ctrl-C) before anything was written", file=sys.stderr)
        return EXIT_INTERRUPTED, None
