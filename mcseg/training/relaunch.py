"""Pre-flight checks of a training launch into a run directory, made before anything is written to it.

* ``last.pt`` present: the launch must ask to resume (``trainer.resume``/``auto_resume``);
* resuming: what the model sees and how it is trained must be the checkpoint's own
  (:data:`mcseg.config.RESUME_MUST_MATCH`, compared after :func:`~mcseg.data.build.record_dataset_facts`, so the
  class names and channels found in the data are compared too);
* a finished run (``result.json``) is not trained or evaluated again: ``evaluate.py`` re-evaluates it.
  When its ``status.json`` also says ``completed``, the refusal is :class:`RunFinished`, which a
  sweep run again (:func:`mcseg.sweep.run_job`) takes as "skip this job";
* resuming: every case of the run's split must hold the content the checkpoint recorded
  (:mod:`mcseg.data.fingerprint`); data moved to another ``dataset.root`` are accepted when they do.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mcseg.config import resume_mismatch
from mcseg.data.fingerprint import content_differences
from mcseg.inference.build import load_checkpoint
from mcseg.rundir import STATUS_FILE, LaunchRefused

class RunFinished(LaunchRefused):
    """A resume of a run that completed (``result.json``, ``status.json`` ``completed``) with the same config.

    A single run refuses it with this message; a sweep run again skips the job and reports ``result``.
    """

    def __init__(self, message: str, result: Path) -> None:
        super().__init__(message)
        self.result = result


def completed(run_dir: Path) -> bool:
    """``status.json`` of ``run_dir`` says ``completed`` (unreadable or absent: not completed)."""
    import json

    try:
        return json.loads((Path(run_dir) / STATUS_FILE).read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


def check_launch(run_dir: Path, resume: bool, auto_resume: bool, config: dict,
                 content_of: Callable[[dict], dict] | None = None) -> Path | None:
    """The checkpoint to resume from (None: a fresh start); :class:`LaunchRefused` if the launch may not run.

    ``content_of(case ids by split)``: the fingerprints of those cases in the data now (a case not found
    left out), compared with the checkpoint's record.
    """
    last = Path(run_dir) / "checkpoints" / "last.pt"
    if not last.is_file():
        if resume:
            raise LaunchRefused(f"trainer.resume=true but {last} does not exist")
        return None
    if not (resume or auto_resume):
        raise LaunchRefused(f"{last} exists: pass trainer.resume=true to continue this run (a sweep: "
                            "trainer.auto_resume=true, which also skips its completed jobs), or use a new run directory")
    state = load_checkpoint(last)
    mismatch = resume_mismatch(state["config"], config)
    if mismatch:
        raise LaunchRefused(f"{last}: cannot resume with {mismatch}; resume with the run's own config "
                            "or start a new run directory")
    result = Path(run_dir) / "result.json"
    if result.is_file():
        message = (f"{run_dir} is a finished run (result.json): re-evaluate it with "
                   f"`python evaluate.py ckpt={run_dir}/checkpoints/best.pt`, or train in a new run directory")
        raise RunFinished(message, result) if completed(run_dir) else LaunchRefused(message)
    recorded = state.get("content")
    if recorded and content_of is not None:
        changed = content_differences(recorded, content_of({name: list(cases) for name, cases in recorded.items()}))
        if changed:
            more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            raise LaunchRefused(f"{last}: {len(changed)} case(s) of the run's split differ in content from the data "
                                f"it was trained on: {', '.join(changed[:5])}{more} (missing, or other files under "
                                f"the same name); resume on the run's own data (a moved copy of it is accepted)")
    return last
