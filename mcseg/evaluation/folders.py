"""Other tools' prediction folders evaluated by the protocol: the cases to score, each case read from every
folder (:mod:`mcseg.evaluation.formats`) against the reference (:mod:`mcseg.data.reference`), and scored by the
per-case code of a checkpoint's evaluation (:mod:`mcseg.evaluation.cases`: the evaluator, and failure detection
with the protocol's region, risk and bootstrap).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from mcseg.files import write_csv, write_json
from mcseg.data.io import Volume, read_volume
from mcseg.data.reference import FolderError, Reference
from mcseg.evaluation.cases import detect_failure, failure_detection, write_uncertainty
from mcseg.config import EvalProtocol
from mcseg.evaluation.case_pool import check_workers, map_cases
from mcseg.evaluation.evaluator import Evaluator
from mcseg.evaluation.figure_processes import preload, release
from mcseg.evaluation.folder_outputs import EVALUATE_TOOL, EVALUATION_FILES, claim_output, folder_status, writing
from mcseg.evaluation.formats import PredictionFormat, prediction_files
from mcseg.evaluation.provenance import file_sha256
from mcseg.evaluation.split import FAILURE_FILE, PROVENANCE_FILE
from mcseg.metrics.failure import FailureDetection
from mcseg.metrics.uncertainty import MemberAccumulator
from mcseg.rundir import STATUS_FILE

__all__ = ["CaseScore", "distinct_members", "evaluate_folders", "read_case", "score_case", "select_cases"]


def select_cases(folders: Sequence[PredictionFormat], reference: Reference, cases: Sequence[str] | None = None,
                 allow_missing: bool = False) -> list[str]:
    """The cases to evaluate: ``cases`` (a fold's), else every case of the first folder; each must be in every
    folder and in the reference; reference cases without a prediction are an error unless ``allow_missing``
    or ``cases`` chose them."""
    first = folders[0]
    chosen = sorted(cases) if cases is not None else first.cases()
    if not chosen:
        raise FolderError(f"{first.path}: no cases to evaluate")
    for folder in folders:
        missing = [c for c in chosen if c not in folder.files]
        if missing:
            raise FolderError(f"{len(missing)} case(s) without a prediction in {folder.path}: {', '.join(missing[:10])}")
        if cases is not None:
            continue
        extra = sorted(set(folder.cases()) - set(chosen))
        if extra:
            raise FolderError(f"{folder.path} holds {len(extra)} case(s) that {first.path} lacks: {', '.join(extra[:10])}")
    unlabelled = [c for c in chosen if c not in reference.labels]
    if unlabelled:
        raise FolderError(f"{len(unlabelled)} prediction(s) without a label in {reference.root}: "
                          f"{', '.join(unlabelled[:10])}")
    unpredicted = sorted(set(reference.labels) - set(chosen))
    if unpredicted and cases is None and not allow_missing:
        raise FolderError(f"{len(unpredicted)} label(s) without a prediction in {first.path}: "
                          f"{', '.join(unpredicted[:10])} (pass --allow-missing to evaluate the others, or "
                          f"--splits/--fold to name the cases)")
    return chosen


def read_case(folders: Sequence[PredictionFormat], reference: Reference, case: str,
              members: MemberAccumulator | None = None):
    """The case's label volume, evaluator label, pooled probabilities (``C x *S`` tensor), the tool's own label
    map (one folder only) and the files read; with ``members``, each folder's probabilities are added to it."""
    label_vol, label = reference.load(case)
    files = [reference.labels[case]]
    preds = []
    for folder in folders:
        pred = folder.read(case, label_vol, reference.labels[case])
        files += pred.files
        preds.append(pred)
        if pred.probs is None and len(folders) > 1:
            raise FolderError(f"{folder.path}: an ensemble member needs probabilities, the folder has label maps only")
        if members is not None and pred.probs is not None:
            members.add(torch.from_numpy(pred.probs))
    if preds[0].probs is None:
        probs = None
    else:
        probs = members.mean() if members is not None else torch.from_numpy(preds[0].probs)
    prediction = preds[0].prediction if len(preds) == 1 else None
    return label_vol, label, probs, prediction, files


def image_path(images: Path, case: str) -> Path:
    """A case's image in ``images``: ``<case>_0000`` (nnU-Net's first channel) or ``<case>``, NIfTI."""
    path = next((images / f"{case}{tag}{suffix}" for tag in ("_0000", "") for suffix in (".nii.gz", ".nii")
                 if (images / f"{case}{tag}{suffix}").is_file()), None)
    if path is None:
        raise FolderError(f"--images {images}: no {case}_0000.nii.gz or {case}.nii.gz")
    return path


def read_unlabelled(target: PredictionFormat, case: str, images: Path):
    """A test case without a label: its prediction read and checked against its image's grid (the image of
    ``images`` in place of the label); ``(grid volume, its file, probabilities, tool's label map, files)``."""
    path = image_path(images, case)
    grid = read_volume(path)
    array = np.asarray(grid.array)
    if array.ndim == len(grid.spacing) + 1:  # channels last: the first
        grid = Volume(array[..., 0], grid.spacing, grid.affine)
    pred = target.read(case, grid, path)
    probs = torch.from_numpy(pred.probs) if pred.probs is not None else None
    return grid, path, probs, pred.prediction, [path, *pred.files]


def distinct_members(folders: Sequence[PredictionFormat], cases: Sequence[str]) -> None:
    """An ensemble's members must differ: a folder listed twice, or two folders whose files of ``cases`` are
    byte-identical (sha256 over each case's files), would count one prediction as several members (as
    evaluate.py refuses checkpoints with identical weights)."""
    import hashlib

    paths: dict[Path, PredictionFormat] = {}
    digests: dict[str, PredictionFormat] = {}
    for folder in folders:
        path = Path(folder.path).resolve()
        if path in paths:
            raise FolderError(f"--ensemble: {folder.path} is listed twice (also as {paths[path].path}): a folder with "
                              f"itself is the folder alone; list each member once")
        paths[path] = folder
        digest = hashlib.sha256()
        for case in cases:
            for file in folder.case_files(case):
                digest.update(f"{case}\n{file_sha256(file)}\n".encode())
        key = digest.hexdigest()
        if key in digests:
            raise FolderError(f"--ensemble: {digests[key].path} and {folder.path} hold identical files for the "
                              f"{len(cases)} case(s) (sha256 {key[:8]}): an ensemble of copies is the one prediction "
                              f"folder; evaluate it alone")
        digests[key] = folder


def evaluate_folders(folders: Sequence[PredictionFormat], reference: Reference, protocol: EvalProtocol,
                     output_dir: Path, cases: Sequence[str] | None = None, allow_missing: bool = False,
                     uncertainty_dir: Path | None = None, selection: dict | None = None,
                     overwrite: bool = False, workers: int = 1) -> dict:
    """Evaluate one prediction folder, or the ensemble of several (probabilities averaged, the members' PE / EE /
    MI maps), against ``reference`` with ``protocol``: the evaluator's files plus ``provenance.json`` (tool,
    version where the files say it, the sha256 of every file read) and failure detection; returns the summary.
    ``output_dir`` follows :mod:`mcseg.evaluation.folder_outputs` (an earlier evaluation replaced only with
    ``overwrite``; marked in status.json while written). ``workers``: processes that read and score the cases
    (:mod:`mcseg.evaluation.case_pool`; the outputs are those of one)."""
    check_workers(workers)
    for folder in folders:
        unfinished = folder_status(folder.path)
        if unfinished is not None and unfinished["status"] != "completed":
            raise FolderError(f"{folder.path}: {unfinished['tool']} did not complete this folder ({STATUS_FILE}: "
                              f"{unfinished['status']}): run its command again before evaluating it")
    chosen = select_cases(folders, reference, cases, allow_missing)
    if len(folders) > 1:
        distinct_members(folders, chosen)
    with_probs = folders[0].has_probs
    if uncertainty_dir is not None and not with_probs:
        raise FolderError("uncertainty maps (--save-uncertainty) need the probability maps (--probs)")
    out = Path(output_dir)
    options = folders[0].options  # how to tell a folder of predictions (MONAI's postfix)
    earlier = claim_output(out, EVALUATE_TOOL, overwrite, lambda folder: prediction_files(folder, **options))
    record = {"predictions": [str(Path(f.path).resolve()) for f in folders], "reference": str(reference.root.resolve())}
    with writing(out, EVALUATE_TOOL, record, EVALUATION_FILES if earlier is not None else ()):
        try:
            return _evaluate(folders, reference, protocol, out, chosen, uncertainty_dir, selection, with_probs,
                             workers)
        finally:
            release()  # a figures' drawer that the evaluation did not take (it stopped before its figures)


@dataclass
class CaseScore:
    """One case's part of a folder evaluation, as a worker returns it: an evaluator and a failure detection that
    hold this case alone (merged in case order, they add what one process adds), and the sha256 of its files."""

    evaluator: Evaluator
    failure: FailureDetection | None
    hashes: list[tuple[str, str]]


def score_case(folders: Sequence[PredictionFormat], reference: Reference, protocol: EvalProtocol,
               uncertainty_dir: Path | None, with_probs: bool, case: str) -> CaseScore:
    """Read and score one case (:func:`read_case`, the evaluator, failure detection), write its uncertainty maps;
    no state is shared with other cases (:mod:`mcseg.evaluation.case_pool` runs it in a worker)."""
    task = reference.task
    evaluator = Evaluator(task.channels, task.class_names, protocol, task.multilabel)
    failure = failure_detection(protocol) if with_probs else None
    members = MemberAccumulator(task.multilabel)
    label_vol, label, probs, prediction, files = read_case(folders, reference, case, members)
    try:
        row = evaluator.add_case(case, probs, label, label_vol.spacing, prediction=prediction)
    except ValueError as exc:
        raise FolderError(str(exc)) from None
    if probs is not None:
        pred = prediction if prediction is not None else (
            (probs > 0.5).long() if task.multilabel else probs.argmax(0))
        maps = members.maps()
        if failure is not None:
            detect_failure(failure, evaluator, case, row, maps, probs.shape[0], pred, label, label_vol.spacing)
        if uncertainty_dir is not None:
            write_uncertainty(uncertainty_dir, case, maps, len(folders) > 1, label_vol.affine, reference.labels[case])
    return CaseScore(evaluator, failure, [(str(p.resolve()), file_sha256(p)) for p in dict.fromkeys(files)])


def _evaluate(folders: Sequence[PredictionFormat], reference: Reference, protocol: EvalProtocol, out: Path,
              chosen: list[str], uncertainty_dir: Path | None, selection: dict | None, with_probs: bool,
              workers: int = 1) -> dict:
    """:func:`evaluate_folders` once its output folder is owned: read and score the cases (in ``workers``
    processes), merge them in case order, write."""
    task = reference.task
    evaluator = Evaluator(task.channels, task.class_names, protocol, task.multilabel)
    failure = failure_detection(protocol) if with_probs else None
    inputs = [*reference.files, *(f for folder in folders for f in folder.config_files())]
    hashes = {str(p.resolve()): file_sha256(p) for p in dict.fromkeys(inputs)}
    job = partial(score_case, folders, reference, protocol, uncertainty_dir, with_probs)
    # the figures' drawer forked as the cases start: it imports matplotlib beside them (figure_processes.preload)
    for part in map_cases(job, chosen, workers, desc="evaluating", when_running=preload if protocol.figures else None):
        evaluator.merge(part.evaluator)
        if failure is not None:
            failure.merge(part.failure)
        for path, digest in part.hashes:
            hashes.setdefault(path, digest)
    identities = [folder.identity() for folder in folders]
    provenance = {
        "predictions": identities,
        "reference": {"path": str(reference.root.resolve()), "kind": reference.kind},
        "cases": chosen, **({"selection": selection} if selection else {}),
        "input_files_sha256": hashes,
    }
    scored_fit = sorted({c for i in identities for c in (i.get("calibration") or {}).get("fit_cases_calibrated") or []
                         if c in chosen})
    if scored_fit:
        provenance["scored_fit_cases"] = scored_fit
        provenance["warnings"] = [f"{len(scored_fit)} scored case(s) ({', '.join(scored_fit[:10])}) are cases the "
                                  f"calibration of the predictions was fitted on (their calibration.json 'applied'): "
                                  f"their calibration figures measure the fit, not unseen cases"]
    extra = {"provenance": provenance}
    if len(folders) > 1:
        extra["predictor"] = {"members": len(folders), "pooled": "probabilities",
                              "note": "the folders' saved probabilities averaged (nnU-Net's own fold ensemble "
                                      "averages logits inside one predictor)"}

    def with_failure_detection() -> dict:  # its bootstrap runs beside the figures' drawing (Evaluator.write)
        if failure is not None:
            extra["failure_detection"] = failure.summary()
        return extra
    summary = evaluator.write(out, extra=with_failure_detection)
    if failure is not None and failure.rows:
        write_csv(out / FAILURE_FILE, failure.rows)
    write_json(out / PROVENANCE_FILE, provenance)
    return summary
