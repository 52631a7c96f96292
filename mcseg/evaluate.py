"""``evaluate(cfg)``: re-evaluate a saved checkpoint (``ckpt=``) or every run under a directory (``runs=``).

The entry point of ``evaluate.py``/``mcseg-evaluate``; what a checkpoint evaluation does, where
it writes and what it records is :mod:`mcseg.evaluation.checkpoint`.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from omegaconf import DictConfig, ListConfig, open_dict

from mcseg.files import write_json
from mcseg.evaluation.checkpoint import evaluate_checkpoint
from mcseg.evaluation.conformal import conformal_config
from mcseg.evaluation.ensemble import evaluate_ensemble
from mcseg.errors import ConfigError
from mcseg.evaluation.provenance import hydra_overrides
from mcseg.rundir import find_run_dirs
from mcseg.runtime import keep_freed_memory
from mcseg.trackers import read_record, reopen_trackers

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict:
    """Evaluate ``cfg.ckpt``, or the ``cfg.checkpoint`` of every run under ``cfg.runs`` (a run or sweep directory)."""
    keep_freed_memory()  # mcseg.runtime: large volumes' tensors are reused, not faulted in again
    cfg = without_training_settings(cfg, hydra_overrides())
    if bool(cfg.get("ckpt")) == bool(cfg.get("runs")):
        raise ConfigError("evaluate: set exactly one of ckpt=<run>/checkpoints/best.pt (one checkpoint) "
                          "or runs=<run or sweep directory> (every run under it)")
    conformal_config(cfg)  # the conformal node alone (e.g. a loss its method cannot control): before any checkpoint
    if isinstance(cfg.get("ckpt"), (list, ListConfig)):  # ckpt=[<a>,<b>,...]: a deep ensemble
        return evaluate_ensemble(cfg, list(cfg.ckpt), hydra_overrides())
    if cfg.get("ckpt"):
        return evaluate_into_run(cfg, Path(cfg.ckpt).expanduser().resolve())
    return evaluate_runs(cfg, Path(cfg.runs).expanduser().resolve())


def evaluate_into_run(cfg: DictConfig, ckpt: Path) -> dict:
    """:func:`evaluate_checkpoint`, then :func:`log_to_run` with the figures its conformal pass drew
    (``conformal.figures``), kept until the run's trackers are reopened."""
    figures: list[tuple[str, object]] = []
    summary = evaluate_checkpoint(cfg, ckpt, hydra_overrides(),
                                  log_figure=lambda tag, figure: figures.append((tag, figure)))
    return log_to_run(summary, figures)


# Nodes a debug preset (configs/debug/, shared with training) sets that an evaluation takes from the checkpoint.
TRAINING_NODES = ("trainer", "logger")


def without_training_settings(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """``cfg`` without what a debug preset (``debug=fast``) sets for training (``trainer``, ``logger``,
    ``dataset.sampling``): an evaluation takes those from the checkpoint and keeps the preset's ``evaluation``.
    A key named on the command line is kept, and refused as before (it sets what the checkpoint fixes)."""
    named = {o.lstrip("+~").split("=")[0].split(".")[0] for o in overrides}
    drop = [k for k in TRAINING_NODES if k in cfg and k not in named]
    preset_only_dataset = cfg.get("dataset") is not None and set(cfg.dataset) <= {"sampling"} \
        and "dataset" not in named
    if not drop and not preset_only_dataset:
        return cfg
    cfg = cfg.copy()
    with open_dict(cfg):
        for key in drop:
            del cfg[key]
        if preset_only_dataset:
            cfg.dataset = None
    log.info("evaluate: the debug preset's training settings (%s) do not apply to an evaluation; its evaluation.* "
             "settings do", ", ".join(drop + (["dataset.sampling"] if preset_only_dataset else [])))
    return cfg


def log_to_run(summary: dict, figures: list[tuple[str, object]] = ()) -> dict:
    """Send an evaluation of a run's checkpoint to the trackers that run logged to (``<run>/trackers.json``:
    the same MLflow run, the same wandb run id, its CSV file, its TensorBoard folder) as
    ``eval/<folder under eval/>/<metric>``, and its ``figures`` (``(tag, figure)``: the conformal overlays) as
    ``eval/<folder>/<tag>``, at the run's last step; an evaluation outside a run, or of a run without trackers, logs
    nowhere else."""
    provenance = summary.get("provenance") or {}
    run_dir, out_dir = provenance.get("run_dir"), provenance.get("output_dir")
    if not run_dir or not out_dir:
        return summary
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    record = read_record(run_dir)
    if not set(record) - {"step"}:
        return summary
    trackers = reopen_trackers(run_dir, record)
    name = out_dir.relative_to(run_dir / "eval").as_posix() if (run_dir / "eval") in out_dir.parents \
        else out_dir.name
    step = int(record.get("step", 0))
    for tag, figure in figures:
        trackers.figure(f"eval/{name}/{tag}", figure, step)
    trackers.evaluation(name, summary, out_dir, step)
    trackers.close()
    return summary


def find_runs(root: Path, checkpoint: str = "best.pt") -> list[Path]:
    """Run directories under ``root`` (itself included) that hold ``checkpoints/<checkpoint>``."""
    return [d for d in find_run_dirs([root]) if (d / "checkpoints" / checkpoint).is_file()]


def evaluate_runs(cfg: DictConfig, root: Path) -> dict:
    """Evaluate every run under ``root``; a run that fails is reported and the others go on."""
    if cfg.get("eval_dir"):
        raise ConfigError("evaluate: eval_dir names one output directory; with runs= each run's results go to "
                          "<run>/eval/<split>")
    runs = find_runs(root, cfg.checkpoint)
    if not runs:
        raise FileNotFoundError(f"runs={root}: no run directory with checkpoints/{cfg.checkpoint} under it")
    results: dict[str, dict] = {}
    for i, run_dir in enumerate(runs, 1):
        log.info("run %d/%d: %s", i, len(runs), run_dir)
        try:
            summary = evaluate_into_run(cfg, run_dir / "checkpoints" / cfg.checkpoint)
            results[str(run_dir)] = {"status": "completed", "mean_foreground_dice": summary.get("mean_foreground_dice"),
                                     "mean_ece": summary.get("mean_ece")}
        except Exception as exc:  # one broken run must not hide the others' results
            log.error("run %s failed: %s: %s", run_dir, type(exc).__name__, exc)
            results[str(run_dir)] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    write_json(Path(cfg.paths.output_dir) / "evaluated_runs.json", results)
    failed = [r for r, v in results.items() if v["status"] != "completed"]
    print(f"evaluated {len(runs) - len(failed)} of {len(runs)} runs under {root}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if failed and len(failed) == len(runs):
        raise ValueError(f"evaluate: every run under {root} failed (see {cfg.paths.output_dir}/evaluated_runs.json)")
    return results


# What Hydra and run_job put in an evaluation job's directory; the evaluation itself writes elsewhere.
JOB_RECORD = (".hydra", "evaluate.log", "status.json")


def move_job_record(job_dir: Path, out_dir: Path) -> None:
    """Move the log of a finished ``ckpt=`` evaluation into its output folder and remove its job directory
    (Hydra's ``outputs/evaluate/runs/<time>/``), when that holds nothing but the job's record: the
    overrides are in the output's provenance.json, so the job directory would stay behind empty of results."""
    job_dir, out_dir = job_dir.resolve(), out_dir.resolve()
    if not job_dir.is_dir() or job_dir == out_dir or job_dir in out_dir.parents:
        return
    if any(p.name not in JOB_RECORD for p in job_dir.iterdir()):
        return
    if (job_dir / "evaluate.log").is_file():
        shutil.move(job_dir / "evaluate.log", out_dir / "evaluate.log")
    shutil.rmtree(job_dir)
    cwd = Path.cwd().resolve()
    for parent in job_dir.parents:  # outputs/evaluate/runs/ when this job was their only content
        if parent == cwd or cwd not in parent.parents or any(parent.iterdir()):
            break
        parent.rmdir()
