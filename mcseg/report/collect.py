"""Find the runs under run or sweep directories and read what each one measured.

Run directories are found by :func:`mcseg.rundir.find_run_dirs`. Its identity (configuration, loss, seed) comes from ``result.json``'s
``run`` record, else from Hydra's ``.hydra/`` files; its test metrics from
``eval/<split>/summary.json`` and ``per_case.csv``, with several raters also ``per_case_raters.csv`` (and
``eval/<split>/<scaler>/`` after post-hoc calibration); its validation metrics, by which configurations are selected, from
``result.json``; its results under shift from ``eval/<split>[-<members>]/shift_summary.json``
(:mod:`mcseg.evaluation.shift`).
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mcseg.data.raters import scored_reference
from mcseg.evaluation.figure_table import table
from mcseg.evaluation.provenance import file_sha256
from mcseg.evaluation.raters import CASE_FIGURES, FOREGROUND_FIGURES
from mcseg.evaluation.shift import SUMMARY_FILE as SHIFT_SUMMARY
from mcseg.metrics.statistics import nanmean
from mcseg.identity import describe_run
from mcseg.rundir import STATUS_FILE, find_run_dirs, state_of

log = logging.getLogger(__name__)

@dataclass
class RunRecord:
    """One training run as the report sees it."""

    path: Path
    configuration: str
    loss_name: str
    loss: dict
    seed: int
    status: str  # as recorded in status.json; a "running" whose process is gone reads "interrupted"
    result: dict = field(default_factory=dict)
    summaries: dict[str, dict] = field(default_factory=dict)  # "" (raw outputs) or a scaler name -> summary.json
    per_case: dict[str, dict[str, dict]] = field(default_factory=dict)  # same keys -> case -> metric -> value
    error: str | None = None
    dataset: str = "?"
    duplicate_of: Path | None = None  # same dataset, configuration and seed as that run (set by the table)
    # What the run ran and on which data: the hash of its resolved config and of its split's content
    # (mcseg.evaluation.provenance); runs of versions that recorded neither fall back to overrides and name.
    configuration_key: str = ""
    dataset_key: str = ""
    # other predictors of the run's checkpoint: eval/<split>-<members>/ (TTA, MC dropout) -> summary.json
    variants: dict[str, dict] = field(default_factory=dict)
    # evaluations under shift of the same folders: "" (eval/<split>/) or a variant's tag -> shift_summary.json
    shift: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.configuration_key = self.configuration_key or self.configuration
        self.dataset_key = self.dataset_key or self.dataset

    @property
    def evaluated(self) -> bool:
        return "" in self.summaries

    @property
    def environment(self) -> dict | None:
        """The code, libraries and device that made the run's numbers (None: an older version's run)."""
        return self.result.get("environment") or self.summaries.get("", {}).get("provenance", {}).get("environment")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError as exc:
        log.warning("%s: unreadable JSON (%s); ignored", path, exc)
        return None


def read_per_case(path: Path) -> dict[str, dict]:
    """Per-case values from an evaluator's per_case.csv (one row per case and foreground class), of every per-case
    figure of the table of figures (:mod:`mcseg.evaluation.figure_table`) that the file has a column of.

    A per-class figure's case value (Dice, HD95, ...) is the mean over its classes with undefined (NaN) values
    excluded, as in the evaluator's ``mean_foreground_*``; a per-case figure (the calibration figures) is the
    case's own value. With a per_case_raters.csv beside it, also the figures against several raters,
    ``raters/<figure>``: the mean over foreground classes of the per-class ones (the summary's ``foreground``), the
    per-case ones as they are.
    """
    rows = _case_rows(path)
    written = set(next(iter(rows.values()))[0]) if rows else set()
    declared = [f for f in table() if f.per != "split" and f.key in written]  # an older file: the columns it has
    out = {}
    for case, case_rows in rows.items():
        out[case] = {f.key: nanmean([_number(r[f.key]) for r in case_rows]) if f.per == "class"
                     else _number(case_rows[0][f.key]) for f in declared}
    raters = path.parent / "per_case_raters.csv"
    for case, case_rows in (_case_rows(raters) if raters.is_file() else {}).items():
        found = out.setdefault(case, {})
        found.update({f"raters/{key}": nanmean([_number(r[key]) for r in case_rows]) for key in FOREGROUND_FIGURES})
        found.update({f"raters/{key}": _number(case_rows[0][key]) for key in CASE_FIGURES})
    return out


def _number(text: str) -> float:
    return float(text) if text not in ("", "None") else math.nan


def _case_rows(path: Path) -> dict[str, list[dict]]:
    """The rows of a per-case CSV grouped by their ``case``."""
    rows: dict[str, list[dict]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row["case"], []).append(row)
    return rows


def _identity(run_dir: Path, result: dict | None) -> dict | None:
    if result and "run" in result:
        return result["run"]
    hydra_dir = run_dir / ".hydra"
    if not (hydra_dir / "config.yaml").is_file():
        return None
    cfg = yaml.safe_load((hydra_dir / "config.yaml").read_text()) or {}
    if "loss" not in cfg:
        return None  # an evaluate job's directory, not a training run
    overrides = yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) if (hydra_dir / "overrides.yaml").is_file() else []
    hydra_cfg = yaml.safe_load((hydra_dir / "hydra.yaml").read_text()) if (hydra_dir / "hydra.yaml").is_file() else {}
    choices = (hydra_cfg or {}).get("hydra", {}).get("runtime", {}).get("choices", {}) or {}
    return describe_run(overrides or [], choices, cfg.get("loss", {}), str(cfg.get("dataset", {}).get("name")),
                        cfg.get("seed", 0))


def read_run(run_dir: Path, split: str = "test") -> RunRecord | None:
    """The :class:`RunRecord` of ``run_dir``, or None if its configuration cannot be identified."""
    result = _read_json(run_dir / "result.json")
    identity = _identity(run_dir, result)
    if identity is None:
        if (run_dir / "checkpoints").is_dir():
            log.warning("%s: neither result.json nor .hydra/config.yaml; not a run the report can identify", run_dir)
        return None
    status = _read_json(run_dir / STATUS_FILE) or {}
    state = state_of(run_dir, status.get("status") or ("completed" if result else "unknown"))
    record = RunRecord(run_dir, identity["configuration"], identity["loss_name"], identity.get("loss") or {},
                       int(identity.get("seed", 0)), state, {k: v for k, v in (result or {}).items() if k != "run"},
                       error=status.get("error"), dataset=str(identity.get("dataset")),
                       configuration_key=identity.get("configuration_sha256") or "",
                       dataset_key=identity.get("dataset_content") or "")
    eval_dir = run_dir / "eval" / split
    summary = _read_json(eval_dir / "summary.json")
    if summary is not None and not summary.get("provenance", {}).get("checkpoint", {}).get("selected", True):
        log.warning("%s: evaluates %s, not the run's selected checkpoint; not reported", eval_dir,
                    summary["provenance"]["checkpoint"].get("path"))
        summary = None
    keep_apart(record, _scored_reference(identity, summary))
    if summary is not None:
        record.summaries[""] = summary
        record.per_case[""] = read_per_case(eval_dir / "per_case.csv")
        if (shift := _read_json(eval_dir / SHIFT_SUMMARY)) is not None:
            record.shift[""] = shift
        for name in summary.get("posthoc", {}):
            scaled = _read_json(eval_dir / name / "summary.json")
            if scaled is not None:
                record.summaries[name] = scaled
                record.per_case[name] = read_per_case(eval_dir / name / "per_case.csv")
    for folder in sorted(run_dir.glob(f"eval/{split}-*/summary.json")):
        variant = _read_json(folder)
        if variant is not None and variant.get("predictor"):
            tag = folder.parent.name.removeprefix(f"{split}-")
            record.variants[tag] = variant
            if (shift := _read_json(folder.parent / SHIFT_SUMMARY)) is not None:
                record.shift[tag] = shift
    return record


def _scored_reference(identity: dict, summary: dict | None) -> str:
    """The hard label a run's single-label figures are scored against (:func:`mcseg.data.raters.scored_reference`
    of its ``dataset.raters.target``): as its evaluation records it, else (evaluations of older versions) as its
    overrides set it; ``majority`` (also a single-rater case's own label) by default."""
    recorded = (((summary or {}).get("provenance") or {}).get("dataset") or {}).get("raters_target")
    given = [o.split("=", 1)[1] for o in identity.get("overrides") or []
             if o.lstrip("+~").startswith("dataset.raters.target=")]
    return scored_reference(str(recorded or (given[-1] if given else "majority")))


def keep_apart(record: RunRecord, reference: str) -> None:
    """A run scored against another label than the majority (trained on one rater, or STAPLE) is of a dataset of
    its own in the report: its rows are never selected or tested beside rows scored against another label."""
    if reference != "majority":
        record.dataset = f"{record.dataset} [against {reference}]"
        record.dataset_key = f"{record.dataset_key} [against {reference}]"


@dataclass
class EnsembleRecord:
    """An ensemble's evaluation (``<dir>/ensembles/<name>/<split>[-<tag>]/``) and the run directories of its
    members; ``tag`` names what else its networks did (``tta-flips``, ``pool-after``; "" for the plain one)."""

    path: Path
    members: list[Path]
    summary: dict
    tag: str = ""
    shift: dict | None = None  # its shift_summary.json, when it was evaluated under shift


def collect_ensembles(roots: list[Path], split: str = "test") -> list[EnsembleRecord]:
    found = []
    for root in roots:
        for path in sorted({*Path(root).glob(f"**/ensembles/*/{split}/summary.json"),
                            *Path(root).glob(f"**/ensembles/*/{split}-*/summary.json")}):
            summary = _read_json(path)
            members = (summary or {}).get("provenance", {}).get("members") or []
            if summary is not None and members:
                found.append(EnsembleRecord(path.parent, [Path(m["run_dir"]) for m in members if m.get("run_dir")],
                                            summary, path.parent.name.removeprefix(split).removeprefix("-"),
                                            _read_json(path.parent / SHIFT_SUMMARY)))
    return found


def collect_runs(roots: list[Path], split: str = "test") -> list[RunRecord]:
    records = [read_run(d, split) for d in find_run_dirs(roots)]
    return [r for r in records if r is not None]


def _unfinished_folder_evaluation(eval_dir: Path) -> RunRecord | None:
    """An evaluation by ``mcseg-evaluate-folder`` whose ``status.json`` says it did not complete (interrupted,
    failed, or running with its process gone): a record without results, which the report lists as left out."""
    from mcseg.evaluation.folder_outputs import EVALUATE_TOOL, folder_status

    status = folder_status(eval_dir)
    if status is None or status.get("tool") != EVALUATE_TOOL or status["status"] == "completed":
        return None
    folders = "+".join("/".join(Path(str(p)).parts[-2:]) for p in status.get("predictions") or [])
    reference = str(status.get("reference") or "?")
    return RunRecord(eval_dir, f"predictions={folders.replace(' ', '_')}", EVALUATE_TOOL, {}, 0,
                     str(status["status"]), error=f"{status.get('error') or 'not completed'}: its files are "
                     f"incomplete; run its mcseg-evaluate-folder command again", dataset=Path(reference).name,
                     dataset_key=reference)


def read_folder_evaluation(eval_dir: Path) -> RunRecord | None:
    """An evaluation of another tool's prediction folder (``mcseg-evaluate-folder``: a summary.json whose
    provenance names the ``predictions``) as a report row of its own: the tool in the loss column, the
    configuration ``predictions=<folder>[+<folder>...]`` (the folders' whole paths as its key), the reference
    (:func:`folder_reference`) as the dataset, one evaluation (seed 0). None for any other summary.json. One that
    did not complete (its status.json) is a record without results (:func:`_unfinished_folder_evaluation`)."""
    unfinished = _unfinished_folder_evaluation(eval_dir)
    if unfinished is not None:
        return unfinished
    summary = _read_json(eval_dir / "summary.json")
    provenance = (summary or {}).get("provenance") or {}
    predictions = provenance.get("predictions")
    if not predictions or not isinstance(predictions, list):
        return None
    tool = " + ".join(dict.fromkeys(str(p.get("tool")) for p in predictions))
    folders = "+".join("/".join(Path(str(p.get("path"))).parts[-2:]) for p in predictions)
    name, key = folder_reference(provenance, summary)
    record = RunRecord(eval_dir, f"predictions={folders.replace(' ', '_')}", tool, {}, 0, "completed",
                       dataset=name, dataset_key=key,
                       configuration_key=_sha256("\n".join(str(p.get("path")) for p in predictions)))
    record.summaries[""] = summary
    record.per_case[""] = read_per_case(eval_dir / "per_case.csv")
    return record


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _under(path: str | Path, folder: Path) -> bool:
    return Path(path).is_relative_to(folder)


def folder_reference(provenance: dict, summary: dict | None = None) -> tuple[str, str]:
    """A folder evaluation's reference as (readable name, identity): the folder's last two path parts (with
    ``[regions]`` when its classes were scored as sigmoid regions), and a hash of the reference files it read
    (their names within the folder and sha256, from ``input_files_sha256``; the folder's whole path where none was
    recorded) and of the task they were scored as (the summary's ``classes`` and ``multilabel``: the dataset.json
    that gave them may lie outside the folder): two references of one name, or one label folder scored as labels
    and as regions, are two datasets; a moved copy of one is the same."""
    path = Path(str((provenance.get("reference") or {}).get("path") or "?"))
    read = sorted(f"{Path(p).relative_to(path)}:{digest}"
                  for p, digest in (provenance.get("input_files_sha256") or {}).items() if _under(p, path))
    task = {k: (summary or {}).get(k) for k in ("classes", "multilabel")}
    name = "/".join(path.parts[-2:]) + (" [regions]" if task["multilabel"] else "")
    return name, _sha256("\n".join([*(read or [str(path)]), json.dumps(task, sort_keys=True)]))


def changed_predictions(provenance: dict) -> tuple[list[str], list[str]]:
    """The prediction files an evaluation read that no longer hold what it read: (those of other content, those
    gone)."""
    folders = [Path(str(p.get("path"))) for p in provenance.get("predictions") or []]
    read = [(path, digest) for path, digest in (provenance.get("input_files_sha256") or {}).items()
            if any(_under(path, f) for f in folders)]
    gone = [path for path, _ in read if not Path(path).is_file()]
    return [path for path, digest in read if path not in gone and file_sha256(path) != digest], gone


def _listed(files: list[str]) -> str:
    return f"{len(files)}: {files[0]}{' ...' if len(files) > 1 else ''}"


def _stale(record: RunRecord, files: list[str]) -> RunRecord:
    """``record`` as a stale evaluation: no results (listed as left out), and why."""
    record.summaries.clear()
    record.per_case.clear()
    record.status = "stale"
    record.error = (f"the prediction files it scored changed since (other content, {_listed(files)}): its figures "
                    f"are of files that no longer exist; run its mcseg-evaluate-folder command again")
    return record


def current_evaluations(records: list[RunRecord]) -> list[RunRecord]:
    """Of one or several evaluations of the same prediction folders against the same reference, those of the
    folders' current files; the others are warned of and left out. Where none is current, an evaluation whose
    files now hold other content is stale (:func:`_stale`: listed as left out, never reported with the old
    figures), and of those whose files are only gone (their figures can no longer be checked) the newest is
    reported with a warning. Returns the records kept, stale ones included (without results)."""
    changed = {r.path: changed_predictions(r.summaries[""]["provenance"]) for r in records}
    current = [r for r in records if not any(changed[r.path])]
    gone_only = [r for r in records if not changed[r.path][0] and changed[r.path][1]]
    kept = current or ([max(gone_only, key=lambda r: (r.path / "summary.json").stat().st_mtime_ns)]
                       if gone_only else [])
    out = []
    for record in records:
        other, gone = changed[record.path]
        if record in kept:
            if gone:
                log.warning("%s: %s of its prediction files are gone, and no evaluation of the folder's current "
                            "files exists; reported as it was made (re-evaluate the folder)", record.path,
                            _listed(gone))
            out.append(record)
        elif current or not other:
            log.warning("%s: the prediction files it scored no longer hold what it read (%s changed); not "
                        "reported, %s is", record.path, _listed(other + gone),
                        ", ".join(str(r.path) for r in kept))
        else:
            log.warning("%s: the prediction files it scored no longer hold what it read (%s changed); not "
                        "reported, listed as stale (run its mcseg-evaluate-folder command again)", record.path,
                        _listed(other))
            out.append(_stale(record, other))
    return out


def collect_folder_evaluations(roots: list[Path]) -> list[RunRecord]:
    """Every evaluation of a prediction folder under ``roots`` (:func:`read_folder_evaluation`); of the complete
    ones of the same folders against the same reference (one or several), the current ones
    (:func:`current_evaluations`: the recorded sha256 of every prediction file is checked, a stale one is kept
    without results); unfinished ones (no results) are kept to be listed as left out."""
    found = {path.parent.resolve() for root in roots for name in ("summary.json", STATUS_FILE)
             for path in Path(root).glob(f"**/{name}")}
    records = [r for r in (read_folder_evaluation(path) for path in sorted(found)) if r is not None]
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        if record.summaries:
            groups.setdefault((record.dataset_key, record.configuration_key), []).append(record)
    kept = {r.path for group in groups.values() for r in current_evaluations(group)}
    return [r for r in records if r.path in kept or not r.summaries]
