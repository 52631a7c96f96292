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

Studies: one preset each, ``configs/experiment/study/<study>.yaml`` (read by :func:`study_presets.load_study`),
a study sweep over ``experiment=hippocampus_study`` whose named arms (``hydra.sweeper.arms``) are the study's
configurations and whose ``hydra.sweeper.params.seed`` are its seeds (so
``python train.py -m experiment=study/<study>`` trains the whole study at once), with a top-level ``study:`` node that the training ignores: each configuration's label (in
the study's order), and what a piece evaluates besides the single networks (the fields of :class:`Study`;
``prepare`` names a function of :data:`study_presets.PREPARE`). A new study is a new preset there.

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
import os
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import study_presets  # noqa: E402
from study_presets import EXPERIMENT, STUDIES, Study, pieces, study_names  # noqa: E402
from study_tables import assemble, readme, write_rows  # noqa: E402
from study_training import LoadMonitor, train_all, train_command  # noqa: E402
from uncertainty_study import COLUMNS, _evaluate, _rows, _scaled  # noqa: E402

log = logging.getLogger("study_pieces")

RAW_FILES = ("summary.json", "per_case.csv", "failure_per_case.csv", "provenance.json", "shift_summary.json",
             "per_case_raters.csv", "per_rater.csv")


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head.strip() + (" (with uncommitted changes)" if dirty else "")


def copy_raw(source: Path, target: Path) -> None:
    """The small files of one evaluation (summary, per-case tables, provenance, shift summary) into the repository."""
    target.mkdir(parents=True, exist_ok=True)
    for name in RAW_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


def published_seed0(study: str, config: str, seed0: dict) -> dict | None:
    """The seed-0 network's figures against those published before (docs/results/uncertainty_study/seed0_*):
    runs are deterministic, so they must agree."""
    path = study_presets.results_dir("uncertainty_study") / "seed0_per_evaluation.csv"
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
    out = study_presets.results_dir(study_name) / config
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
