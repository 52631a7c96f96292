"""A study in committed pieces: one configuration at a time, trained, evaluated and written into docs/results/.

    python scripts/study_pieces.py <study> --config <name> [--runs DIR] [--jobs 2]   # one piece
    python scripts/study_pieces.py <study> --table                                   # the table from the pieces
    python scripts/study_pieces.py <study> --list                                    # what exists, what is next

A study's run folders live outside the repository and do not survive a new machine, so a study that only
writes its table at the end loses everything when a session ends. Here each configuration is one piece of
at most about 40 minutes of a 2-core machine: its seeds (and its dropout-trained run) are trained two at a
time with one torch thread each, every predictor is evaluated by mcseg's own evaluation (ensembles need their
members' checkpoints at the same time, so a configuration is never split across pieces), and the piece's raw
tables are written under ``docs/results/<study>/<config>/``:

- ``per_evaluation.csv``: one row per evaluation (seed, predictor, the columns of :mod:`uncertainty_study`),
- ``<evaluation>/summary.json`` and ``<evaluation>/per_case.csv`` of every evaluation,
- ``piece.json``: the commit that made it, when, the machine's load before, during and after, what each
  training and evaluation cost, and (for seed 0) the comparison with the seed-0 figures already published.

While a piece writes its folder, ``piece.json`` says ``status: running`` (``interrupted`` after Ctrl-C, which
also stops the piece's trainings with SIGTERM, so they checkpoint, and ends in one line saying how to resume):
``--table`` and ``--list`` only take pieces whose status is ``completed`` (or absent, as in older pieces).
Commit them before starting the next piece. ``--table`` assembles ``table.md`` and ``per_evaluation.csv`` of the
whole study from the committed pieces only (never from run folders; a row scaled by a degenerate temperature fit
is marked "(degenerate fit)" in table.md), and rewrites the study's README.md (which pieces exist, the command of
the next). Nothing is selected on the test split: every temperature is fitted on
the validation split. Runs are deterministic (``experiment=hippocampus_study``): on the same machine and software
a piece reruns exactly (another CPU can move a figure in its third decimal: ``piece.json`` compares seed 0 with
the figures published before).

Studies: one preset each, ``configs/experiment/study/<study>.yaml`` (read by :func:`load_study`), a study sweep
over ``experiment=hippocampus_study`` whose named arms (``hydra.sweeper.arms``) are the study's configurations and
whose ``hydra.sweeper.params.seed`` are its seeds (so ``python train.py -m experiment=study/<study>`` trains the
whole study at once), with a top-level ``study:`` node that the training ignores: each configuration's label (in
the study's order), and what a piece evaluates besides the single networks (the fields of :class:`Study`;
``prepare`` names a function of :data:`PREPARE`). A new study is a new preset there.

- ``uncertainty_study`` (issue #23): CE, CE + Dice, focal, LS and the margin loss (m = 3), three seeds each: the
  single networks raw and scaled, the three-seed ensemble pooled before and after scaling, TTA of seed 0 (flips,
  and noise: the networks are trained without flips, see docs/results.md), and MC dropout (10 samples) of one
  network trained with ``model.dropout=0.2``.
- ``newer_losses``: the newer losses in the loss study's protocol (one seed, raw and after temperature scaling).
- ``ensembles_under_shift``: the three-seed ensembles of CE + Dice and of the margin loss under ROOD-MRI
  (``shift=rood_mri``), raw and scaled; needs the configuration's seeds (retrained when their run folders
  are gone, which the piece does first).
- ``multirater``, ``multirater_ensembles`` (issue #37, simulated): CE and the margin loss trained on the rater
  mean, one rater or a random rater per sample of synthetic raters (written to ``outputs/synthetic_raters`` first),
  seed 0; the three-seed ensembles of those trained on the rater mean.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from uncertainty_study import COLUMNS, _evaluate, _rows, _scaled, table  # noqa: E402

log = logging.getLogger("study_pieces")

EXPERIMENT = "experiment=hippocampus_study"
RAW_FILES = ("summary.json", "per_case.csv", "failure_per_case.csv", "provenance.json", "shift_summary.json",
             "per_case_raters.csv", "per_rater.csv")


@dataclass(frozen=True)
class Study:
    """What one piece of a study trains and evaluates for each of its configurations (``arms``): a study preset
    (``configs/experiment/study/<name>.yaml``) as :func:`load_study` reads it."""
    arms: dict[str, list[str]]
    labels: dict[str, str]
    seeds: tuple[int, ...] = (0,)
    dropout: float | None = None   # a run per configuration trained with model.dropout, seed 0, for MC dropout
    mc_samples: int = 10
    tta_seeds: tuple[int, ...] = ()
    tta: tuple[str, ...] = ("flips",)  # the TTA kinds evaluated, each alone (evaluate.py tta=[<kind>])
    ensembles: bool = False
    shift: str | None = None       # a corruption suite for the configuration's ensemble
    extra: tuple[str, ...] = ()    # overrides of every evaluation
    base: tuple[str, ...] = (EXPERIMENT,)  # overrides of every training, before the arm's
    runs_of: str | None = None     # another study whose run folders this one evaluates (the same trainings)
    prepare: object = None         # a function called before a piece trains (e.g. writing its data folder)


# The simulated multi-rater study (issue #37): each hippocampus case's own label and four synthetic raters
# (scripts/synthetic_raters.py), written outside git and rebuilt identically when missing.
SYNTHETIC_RATERS = ROOT / "outputs" / "synthetic_raters"
ONE_RATER = "original"  # the "one rater" arms train on the data set's own label, as a single-rater study does


def synthetic_raters() -> None:
    if (SYNTHETIC_RATERS / "dataset.json").is_file():
        return
    import synthetic_raters as sr

    data = Path(os.environ.get("MCSEG_HIPPOCAMPUS_ROOT", ROOT.parent / "shared" / "data" / "hippocampus"))
    log.info("synthetic raters: %s", sr.build(data, SYNTHETIC_RATERS))


PREPARE = {"synthetic_raters": synthetic_raters}  # a preset's study.prepare -> the function it names
PRESETS = ROOT / "configs" / "experiment" / "study"


def study_names() -> list[str]:
    """The studies: one preset each under ``configs/experiment/study/``."""
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def load_study(name: str, overrides: tuple[str, ...] = ()) -> Study:
    """The study of preset ``experiment=study/<name>`` (with ``overrides``, as on train.py's command line): its
    configurations are the study sweep's named arms (in the order of ``study.labels``), its seeds
    ``hydra.sweeper.params.seed``, the rest its ``study:`` node. Composed from the repository root
    (``${hydra:runtime.cwd}`` in a preset is where its trainings run, as study_pieces runs them)."""
    from contextlib import chdir

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with chdir(ROOT), initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment=study/{name}", *overrides], return_hydra_config=True)
    where = f"configs/experiment/study/{name}.yaml"
    before = HydraConfig.instance().cfg
    HydraConfig().set_config(cfg)  # for ${hydra:...} in the preset; put back after: evaluations record it
    try:
        node = OmegaConf.to_container(cfg.get("study") or OmegaConf.create(), resolve=True)
    finally:
        HydraConfig.instance().cfg = before
    arms = {k: v.split() for k, v in cfg.hydra.sweeper.arms.items() if v}
    labels = node.pop("labels", None) or {}
    unlabelled = [arm for arm in arms if arm not in labels]
    if unlabelled:
        raise SystemExit(f"{where}: arm {unlabelled[0]!r} has no study.labels entry")
    settings = {f.name for f in fields(Study)} - {"arms", "labels", "seeds"}
    unknown = sorted(set(node) - settings)
    if unknown:
        raise SystemExit(f"{where}: study.{unknown[0]} is not a study setting (one of {', '.join(sorted(settings))})")
    prepare = node.pop("prepare", None)
    if prepare is not None and prepare not in PREPARE:
        raise SystemExit(f"{where}: study.prepare={prepare!r} is not one of {sorted(PREPARE)}")
    seeds = tuple(int(seed) for seed in str(cfg.hydra.sweeper.params.seed).split(","))
    return Study({k: arms[k] for k in labels if k in arms}, labels, seeds=seeds, prepare=PREPARE.get(prepare),
                 **{k: tuple(v) if isinstance(v, list) else v for k, v in node.items()})


class Studies(dict):
    """Study name -> :class:`Study`, each read from its preset when first asked for (a test may add its own)."""

    def __missing__(self, name: str) -> Study:
        self[name] = load_study(name)
        return self[name]


STUDIES = Studies()


def results_dir(study: str) -> Path:
    return ROOT / "docs" / "results" / study


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head.strip() + (" (with uncommitted changes)" if dirty else "")


class LoadMonitor:
    """The machine's 1-minute load average before, every 30 s during, and after a piece."""

    def __init__(self) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(30):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])

    def record(self) -> dict:
        return {"before": round(self.samples[0], 2), "after": round(self.samples[-1], 2),
                "mean": round(statistics.mean(self.samples), 2), "max": round(max(self.samples), 2),
                "cores": os.cpu_count()}


def train_command(base: tuple[str, ...], arm: list[str], seed: int, run_dir: Path, dropout: float | None) -> list[str]:
    command = [sys.executable, str(ROOT / "train.py"), *base, *arm, f"seed={seed}", f"hydra.run.dir={run_dir}"]
    if dropout:
        command.append(f"model.dropout={dropout}")
    if (run_dir / "checkpoints" / "last.pt").exists():
        command.append("trainer.resume=true")  # cut short earlier: go on from its last epoch
    return command


def train_all(jobs: list[tuple[str, list[str], Path]], parallel: int) -> dict[str, float]:
    """Trains the runs that have no ``result.json`` yet, ``parallel`` at a time with one torch thread each
    (threads x processes <= cores); returns each run's wall seconds (:func:`job_seconds`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    seconds: dict[str, float] = {}
    pending = [(name, command, run_dir) for name, command, run_dir in jobs if not (run_dir / "result.json").exists()]
    running: list[tuple[str, subprocess.Popen, float, Path]] = []
    try:
        _train(pending, running, parallel, env)
    except KeyboardInterrupt:  # a Ctrl-C sent to this process alone would leave its trainings running
        stop_trainings([process for _, process, _, _ in running])
        raise
    for name, _, run_dir in jobs:  # the job's own record: also right for a run trained before this piece
        seconds[name] = job_seconds(run_dir)
    return seconds


def stop_trainings(processes: list[subprocess.Popen], wait_s: float = 120.0) -> None:
    """SIGTERM to each training still running (it writes its checkpoint at the next step and stops, marked
    interrupted, so that the next piece resumes it; never SIGINT: a training that already had the terminal's
    Ctrl-C would take a second one as "stop at once, without a checkpoint"), then wait for them; one that does not
    stop in ``wait_s`` is killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _train(pending: list, running: list, parallel: int, env: dict) -> None:
    """:func:`train_all`'s loop: start the pending trainings ``parallel`` at a time, wait for each to end."""
    while pending or running:
        while pending and len(running) < parallel:
            name, command, run_dir = pending.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log.info("train %s: %s", name, " ".join(command[1:]))
            out = open(run_dir.parent / f"{run_dir.name}.train.log", "a")
            running.append((name, subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT),
                            time.perf_counter(), run_dir))
        time.sleep(5)
        for item in list(running):
            name, process, start, run_dir = item
            if process.poll() is None:
                continue
            running.remove(item)
            if process.returncode != 0 or not (run_dir / "result.json").exists():
                raise RuntimeError(f"training {name} failed (exit {process.returncode}): see "
                                   f"{run_dir.parent / (run_dir.name + '.train.log')}")
            log.info("trained %s in %.0f s", name, time.perf_counter() - start)


def job_seconds(run_dir: Path) -> float:
    """A finished run's wall time (training, its validations, post-hoc fits and test evaluation), from its
    ``status.json``; 0 when it has none."""
    status = run_dir / "status.json"
    return float(json.loads(status.read_text()).get("wall_time_s") or 0.0) if status.is_file() else 0.0


def copy_raw(source: Path, target: Path) -> None:
    """The small files of one evaluation (summary, per-case tables, provenance, shift summary) into the repository."""
    target.mkdir(parents=True, exist_ok=True)
    for name in RAW_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


def published_seed0(study: str, config: str, seed0: dict) -> dict | None:
    """The seed-0 network's figures against those published before (docs/results/uncertainty_study/seed0_*):
    runs are deterministic, so they must agree."""
    path = results_dir("uncertainty_study") / "seed0_per_evaluation.csv"
    if study != "uncertainty_study" or not path.is_file():
        return None
    label = " ".join([EXPERIMENT, *sorted(STUDIES[study].arms[config])])
    rows = [r for r in csv.DictReader(open(path)) if r["configuration"] == label and r["predictor"] == "single"]
    if not rows:
        return None
    published = {c: float(rows[0][c]) for c in COLUMNS if rows[0][c] not in ("", None)}
    now = {c: seed0[c] for c in published if seed0.get(c) is not None}
    diff = max(abs(published[c] - now[c]) for c in now) if now else None
    return {"published": published, "now": now, "max_abs_difference": diff,
            "reproduced": diff is not None and diff < 5e-4}


def run_piece(study_name: str, config: str, runs_root: Path, parallel: int) -> Path:
    study = STUDIES[study_name]
    if config not in study.arms:
        raise SystemExit(f"--config {config!r} is not a configuration of {study_name}: one of {sorted(study.arms)}")
    arm = study.arms[config]
    runs = runs_root / (study.runs_of or study_name) / config
    out = results_dir(study_name) / config
    label = study.labels[config]
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    jobs = [(f"seed{s}", train_command(study.base, arm, s, runs / f"seed{s}", None), runs / f"seed{s}") for s in study.seeds]
    if study.dropout:
        jobs.append(("dropout_seed0", train_command(study.base, arm, 0, runs / "dropout_seed0", study.dropout),
                     runs / "dropout_seed0"))
    rows: list[dict] = []
    costs: dict[str, float] = {}

    def add(predictor: str, seed, summary: dict | None, seconds: float, source: Path | None, slug: str | None):
        if summary is None:
            return
        rows.extend({**r, "seed": seed, "evaluation": slug or ""} for r in _rows(label, predictor, [summary], seconds))
        if source is not None and slug is not None:
            copy_raw(source, out / slug)
            costs[slug] = round(seconds, 1)

    if study.prepare is not None:
        study.prepare()
    earlier = json.loads((out / "piece.json").read_text()) if (out / "piece.json").is_file() else {}
    with LoadMonitor() as load:
        train_seconds = train_all(jobs, parallel)
        with marked(out, earlier, started):  # from here on the piece's folder is written
            evaluate_piece(study, label, runs, add)
    write_piece(study_name, config, out, rows, costs, earlier, {
        "study": study_name, "configuration": config, "label": label,
        "overrides": [*study.base, *arm], "seeds": list(study.seeds), "commit": commit(),
        "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_average": load.record(),
        "parallel_trainings": parallel, "torch_threads_per_training": 1, "training_seconds": train_seconds})
    log.info("%s/%s written to %s: commit it before the next piece", study_name, config, out)
    return out


@contextmanager
def marked(out: Path, earlier: dict, started: str):
    """``piece.json`` says ``status: running`` while the piece's folder is written, ``interrupted`` after a
    Ctrl-C (and stays ``running`` after a kill): :func:`pieces` then never takes the folder, whose raw tables may
    be half this run's and half an earlier one's, for a complete piece. The earlier record is kept beside it."""
    out.mkdir(parents=True, exist_ok=True)
    record = {**earlier, "status": "running", "this_run": {"started": started, "pid": os.getpid()}}
    (out / "piece.json").write_text(json.dumps(record, indent=2) + "\n")
    try:
        yield
    except KeyboardInterrupt:
        (out / "piece.json").write_text(json.dumps({**record, "status": "interrupted"}, indent=2) + "\n")
        raise


def evaluate_piece(study: Study, label: str, runs: Path, add) -> None:
    """Every predictor of the piece evaluated (or read back), each passed to ``add``."""
    seed_runs = [runs / f"seed{s}" for s in study.seeds]
    evals = runs / "evals"
    if study.shift is None:
        for seed, run in zip(study.seeds, seed_runs):
            summary = json.loads((run / "eval/test/summary.json").read_text())
            add("single", seed, summary, 0.0, run / "eval/test", f"single_seed{seed}")
            add("single + T", seed, _scaled(summary), 0.0, None, None)
    if study.ensembles or study.shift:
        members = [str(r) for r in seed_runs]
        shift = [f"shift={study.shift}"] if study.shift else []
        n = len(members)
        ensemble, seconds = _evaluate("ensemble", members, ["posthoc.apply=[temperature]", *shift, *study.extra,
                                                            f"eval_dir={evals / 'ensemble'}"])
        add(f"ensemble of {n}", "all", ensemble, seconds, evals / "ensemble", "ensemble")
        add(f"ensemble of {n} + T (pooled)", "all", _scaled(ensemble), 0.0, None, None)
        if not study.shift:
            after, seconds = _evaluate("ensemble", members, ["posthoc.apply=[temperature]", "posthoc.pool=after",
                                                             *study.extra,
                                                             f"eval_dir={evals / 'ensemble_pool_after'}"])
            add(f"ensemble of {n} + T (each network's, then pooled)", "all", _scaled(after), seconds,
                evals / "ensemble_pool_after", "ensemble_pool_after")
    for seed, kind in ((s, k) for s in study.tta_seeds for k in study.tta):
        slug = f"tta_{kind}_seed{seed}"
        tta, seconds = _evaluate("single", runs / f"seed{seed}/checkpoints/best.pt",
                                 [f"tta=[{kind}]", *study.extra, f"eval_dir={evals / slug}"])
        add(f"TTA ({kind})", seed, tta, seconds, evals / slug, slug)
        add(f"TTA ({kind}) + T (pooled)", seed, _scaled(tta), 0.0, None, None)
    if study.dropout:
        run = runs / "dropout_seed0"
        alone = json.loads((run / "eval/test/summary.json").read_text())
        add("dropout net, one pass", 0, alone, 0.0, run / "eval/test", "dropout_seed0")
        add("dropout net, one pass + T", 0, _scaled(alone), 0.0, None, None)
        k = study.mc_samples
        mc, seconds = _evaluate("single", run / "checkpoints/best.pt",
                                [f"mc_samples={k}", *study.extra, f"eval_dir={evals / f'mc{k}_seed0'}"])
        add(f"MC dropout ({k})", 0, mc, seconds, evals / f"mc{k}_seed0", f"mc{k}_seed0")
        add(f"MC dropout ({k}) + T (pooled)", 0, _scaled(mc), 0.0, None, None)


def write_piece(study_name: str, config: str, out: Path, rows: list[dict], costs: dict[str, float], earlier: dict,
                piece: dict) -> None:
    """``per_evaluation.csv`` and the complete ``piece.json`` (``piece`` plus costs, the seed-0 check and the
    earlier runs of the piece)."""
    costs = kept_costs(costs, earlier.get("evaluation_seconds"))
    for row in rows:  # an evaluation read back costs what it cost when it ran
        row["seconds"] = row["seconds"] or costs.get(row["evaluation"], 0.0)
    write_rows(out / "per_evaluation.csv", rows)
    seed0 = next((r for r in rows if r["predictor"] == "single" and r["seed"] == 0), None)
    complete = bool(earlier.get("commit"))  # a run that completed (a marker keeps the one before it)
    piece = {**piece, "status": "completed", "evaluation_seconds": costs,
             "seed0_against_published": published_seed0(study_name, config, seed0) if seed0 else None,
             "command": f"python scripts/study_pieces.py {study_name} --config {config}",
             "earlier_runs": earlier.get("earlier_runs", []) + ([{k: earlier.get(k) for k in (
                 "commit", "started", "finished", "load_average", "note")}] if complete else [])}
    (out / "piece.json").write_text(json.dumps(piece, indent=2) + "\n")


def kept_costs(now: dict[str, float], earlier: dict[str, float] | None) -> dict[str, float]:
    """This run's seconds, and an earlier run's where this one read the result back (0 s): a piece that is run
    again to add an evaluation keeps what the others cost."""
    return {k: v or (earlier or {}).get(k, 0.0) for k, v in now.items()}


def write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["configuration", "predictor", "seed", "evaluation", "seconds", *COLUMNS])
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path) -> list[dict]:
    rows = []
    for row in csv.DictReader(open(path)):
        rows.append({**row, "seconds": float(row["seconds"]),
                     **{c: (float(row[c]) if row[c] not in ("", None) else None) for c in COLUMNS}})
    return rows


def pieces(study_name: str) -> dict[str, dict]:
    """The committed pieces of a study (configuration -> its piece.json), in the study's order."""
    base = results_dir(study_name)
    found = {}
    for config in STUDIES[study_name].arms:
        piece = base / config / "piece.json"
        if piece.is_file() and (base / config / "per_evaluation.csv").is_file():
            record = json.loads(piece.read_text())
            if record.get("status", "completed") == "completed":  # not one cut short (marked)
                found[config] = record
    return found


def assemble(study_name: str) -> str:
    """``table.md`` and ``per_evaluation.csv`` of the whole study from its committed pieces, and its README."""
    base = results_dir(study_name)
    done = pieces(study_name)
    rows = [r for config in done for r in read_rows(base / config / "per_evaluation.csv")]
    if rows:
        write_rows(base / "per_evaluation.csv", rows)
        (base / "table.md").write_text(table([r for config in done for r in
                                              degenerate_marked(base / config, read_rows(base / config / "per_evaluation.csv"))]))
    if study_name.startswith("multirater") and rows:
        (results_dir("multirater") / "raters_table.md").write_text(rater_table())
    (base / "README.md").write_text(readme(study_name, done))
    return (base / "table.md").read_text() if rows else "(no piece yet)\n"


DEGENERATE_MARK = " (degenerate fit)"


def degenerate_marked(piece_dir: Path, rows: list[dict]) -> list[dict]:
    """One piece's rows for the study's table, each row scaled by a degenerate temperature fit (its evaluation's
    summary.json, :func:`mcseg.calibration.posthoc.degenerate_reason`) marked in its predictor's name. A
    ``... + T`` row without an evaluation of its own is the scaled half of the row before the ``+ T``."""
    from mcseg.calibration.posthoc import degenerate_reason

    slugs = {(row["seed"], row["predictor"]): row["evaluation"] for row in rows}
    marked = []
    for row in rows:
        raw, scaled, _ = row["predictor"].partition(" + T")
        slug = row["evaluation"] or slugs.get((row["seed"], raw), "")
        path = piece_dir / slug / "summary.json"
        degenerate = False
        if scaled and slug and path.is_file():
            summary = json.loads(path.read_text())
            params = ((summary.get("posthoc") or {}).get("temperature") or {}).get("params")
            classes = (summary.get("protocol") or {}).get("num_classes", 2)
            degenerate = any(isinstance(p, dict) and (p.get("degenerate") or degenerate_reason(
                p, classes, bool(summary.get("multilabel")))) for p in (params if isinstance(params, list) else [params]))
        marked.append({**row, "predictor": row["predictor"] + DEGENERATE_MARK} if degenerate else row)
    return marked


RATER_COLUMNS = {  # the multi-rater table: column -> (where in summary["raters"], format)
    "Dice vs raters": (("foreground", "dice_rater_mean"), "{:.3f}"),
    "consensus Dice": (("foreground", "consensus_dice"), "{:.3f}"),
    "QUBIQ Dice": (("foreground", "thresholded_dice"), "{:.3f}"),
    "ECE vs rater mean": (("case", "ece_mean"), "{:.4f}"),
    "CECE vs rater mean": (("case", "classwise_ece_mean"), "{:.4f}"),
    "NLL vs rater mean": (("case", "nll_mean"), "{:.4f}"),
    "ECE vs each rater (CURVAS, mean)": (("case", "ece_curvas_rater_mean"), "{:.4f}"),
    "volume CRPS (mL)": (("foreground", "volume_crps"), "{:.4f}"),
    "GED": (("case", "ged"), "{:.3f}"),
    "HM-IoU": (("case", "hm_iou"), "{:.3f}"),
}


NOT_SCORED = "not scored"
MAJORITY_TARGETS = ("majority", "mean", "random")  # targets whose hard label is the raters' majority vote
# (mcseg.data.raters.hard_label); a rater's name makes that rater the hard label instead


def rater_target(piece: dict) -> str:
    """The ``dataset.raters.target`` a configuration was trained with (its piece's overrides; default majority)."""
    for override in piece.get("overrides", []):
        if override.startswith("dataset.raters.target="):
            return override.split("=", 1)[1]
    return "majority"


def rater_names(summaries: list[dict]) -> list[str]:
    """The raters of the evaluations, in the order they first appear."""
    names: list[str] = []
    for summary in summaries:
        for name in ((summary.get("raters") or {}).get("per_rater") or {}):
            if name not in names:
                names.append(name)
    return names


def rater_table(study_names: tuple[str, ...] = ("multirater", "multirater_ensembles")) -> str:
    """The multi-rater figures of every committed evaluation of the simulated study, one row per network or
    ensemble, every row against the same references: the majority label (the evaluation's hard label, so only for
    the targets whose hard label is the majority vote; a network trained on one rater was scored against that
    rater and shows "not scored" here), each rater (per_rater: Dice, and the CURVAS ECE of rater ``original``)
    and the rater mean (the ``raters`` part of each summary.json)."""
    found = []  # (piece, slug, summary)
    seen = set()
    for study_name in study_names:
        for config, piece in pieces(study_name).items():
            for summary_path in sorted((results_dir(study_name) / config).glob("*/summary.json")):
                slug = summary_path.parent.name
                if (config, slug) in seen:  # seed 0 of the ensembles' study is the multirater run
                    continue
                seen.add((config, slug))
                found.append((piece, slug, json.loads(summary_path.read_text())))
    names = rater_names([summary for _, _, summary in found])
    head = ["configuration", "predictor", "hard label", "Dice (majority label)", "ECE (majority label)",
            *(f"Dice vs {name}" for name in names), f"ECE vs {ONE_RATER} (CURVAS)", *RATER_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for piece, slug, summary in found:
        target = rater_target(piece)
        raters = summary.get("raters") or {}
        per_rater = raters.get("per_rater") or {}
        majority = target in MAJORITY_TARGETS
        cells = [piece["label"], slug.replace("_", " "), "majority" if majority else target,
                 f"{summary.get('mean_foreground_dice', math.nan):.3f}" if majority else NOT_SCORED,
                 f"{summary.get('mean_ece', math.nan):.4f}" if majority else NOT_SCORED,
                 *(f"{per_rater.get(name, {}).get('mean_foreground_dice', math.nan):.3f}" for name in names),
                 f"{per_rater.get(ONE_RATER, {}).get('ece_curvas', math.nan):.4f}"]
        for (part, key), form in RATER_COLUMNS.values():
            value = ((raters.get(part) or {}).get(key) or {}).get("mean", math.nan)
            cells.append("-" if value is None or value != value else form.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def readme(study_name: str, done: dict[str, dict]) -> str:
    study = STUDIES[study_name]
    missing = [c for c in study.arms if c not in done]
    lines = [f"# {study_name}: raw tables, one folder per configuration (a piece)", "",
             (STUDIES_DOC[study_name]), "",
             "Written by `scripts/study_pieces.py` (its docstring says what a piece trains and evaluates). "
             "Each folder holds `per_evaluation.csv`, every evaluation's `summary.json` and `per_case.csv`, and "
             "`piece.json` (commit, load, cost). `table.md` and `per_evaluation.csv` here are assembled from "
             "the folders by `python scripts/study_pieces.py " + study_name + " --table`, never from run folders.",
             "", "| configuration | commit | finished | load average (mean / max of each run of the piece) | training s "
             "| evaluation s |",
             "|---|---|---|---|---|---|"]
    for config, piece in done.items():
        loads = "; then ".join(f"{r['load_average']['mean']} / {r['load_average']['max']}"
                               for r in [*piece.get("earlier_runs", []), piece])
        lines.append(f"| {config} | {piece['commit']} | {piece['finished']} | {loads} on "
                     f"{piece['load_average']['cores']} | {sum(piece['training_seconds'].values()):.0f} | "
                     f"{sum(piece['evaluation_seconds'].values()):.0f} |")
    lines += ["", "Pieces still to run: " + (", ".join(missing) if missing else "none (the study is complete)") + "."]
    if missing:
        lines += ["", "The next piece (about 20 to 40 minutes of both cores; commit its folder when it ends):", "",
                  "```bash", f"python scripts/study_pieces.py {study_name} --config {missing[0]}",
                  f"python scripts/study_pieces.py {study_name} --table", "```"]
    return "\n".join(lines) + "\n"


STUDIES_DOC = {
    "uncertainty_study": "Uncertainty compared (issue #23, docs/results.md): five losses on hippocampus "
                         "(`experiment=hippocampus_study`), three seeds, single networks raw and scaled, their "
                         "ensemble pooled before and after scaling, TTA of seed 0, MC dropout (10 samples) of a "
                         "network trained with `model.dropout=0.2`.",
    "newer_losses": "The newer losses in the loss study's protocol (`experiment=hippocampus_study`, seed 0): raw "
                    "and after the temperature fitted on the validation split.",
    "ensembles_under_shift": "The three-seed ensembles of CE + Dice and of the margin loss (m = 3) under ROOD-MRI "
                             "(`shift=rood_mri`), raw and after the temperature fitted on the clean validation "
                             "prediction of the pooled ensemble. Its training seconds are those of the uncertainty "
                             "study's runs that it evaluates (retrained only when their run folders are gone).",
    "multirater": "SIMULATED: calibration against several raters (issue #37, docs/results.md) on the hippocampus "
                  "cases with five raters: the data set's own label and four synthetic ones made from it "
                  "(scripts/synthetic_raters.py: one voxel of erosion, one of dilation, two smooth displacements "
                  "of 1 mm root mean square), CE and the margin loss (m = 3) trained "
                  "on the rater mean, on one rater and on a random rater per sample, seed 0; every figure "
                  "against each rater and the rater mean (the `raters` part of each summary.json, "
                  "per_rater.csv, per_case_raters.csv).",
    "posthoc_calibrators": "The networks of \"Post-hoc calibrators compared\" (issue #45, docs/results.md): CE, CE + "
                           "Dice and the margin loss (m = 3), three seeds; a piece here evaluates them raw and "
                           "scaled, and scripts/posthoc_study.py compares every post-hoc calibrator on them "
                           "(docs/results/posthoc_calibrators/).",
    "multirater_ensembles": "SIMULATED (as `multirater`): the three-seed ensembles of the networks trained on the "
                            "rater mean; their GED and Hungarian-matched IoU against the five raters. Seed 0 is "
                            "the `multirater` run.",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", choices=sorted({*study_names(), *STUDIES}))
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", help="run one piece: this configuration's trainings and evaluations")
    what.add_argument("--table", action="store_true", help="assemble the study's table from its committed pieces")
    what.add_argument("--list", action="store_true", help="which pieces exist, and the command of the next")
    parser.add_argument("--runs", type=Path, default=ROOT / "outputs" / "studies",
                        help="where the run folders go (outside git; reused when they exist)")
    parser.add_argument("--jobs", type=int, default=2, help="trainings side by side, one torch thread each")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.list:
        print(readme(args.study, pieces(args.study)))
    elif args.table:
        print(assemble(args.study))
    else:
        try:
            run_piece(args.study, args.config, args.runs.resolve(), args.jobs)
        except KeyboardInterrupt:
            print(f"study_pieces: interrupted (Ctrl-C): the piece {args.study}/{args.config} is not complete (its "
                  f"piece.json says so if it was being written; trainings cut short keep their last checkpoint): "
                  f"run `python scripts/study_pieces.py {args.study} --config {shlex.quote(args.config)} --runs "
                  f"{shlex.quote(str(args.runs.resolve()))} --jobs {args.jobs}` again to resume "
                  f"(trained runs are not trained again, evaluations done are read back)", file=sys.stderr)
            return 130
        print(assemble(args.study))
    return 0


if __name__ == "__main__":
    sys.exit(main())
