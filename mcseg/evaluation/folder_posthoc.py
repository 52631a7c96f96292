"""Post-hoc calibration of another tool's saved probabilities: fit on a validation folder, apply to a test
folder, write the calibrated probabilities back in the tool's own format.

**Why the saved probabilities suffice.** For a softmax, ln p_k = z_k - logsumexp(z): the log-probabilities are
the logits up to one constant per voxel, and a softmax ignores a per-voxel constant, so
softmax(ln p / T) = softmax(z / T) for every T: a temperature fitted on ln p *is* the logits' temperature
(same NLL at every T, so the same fit). For independent sigmoids (nnU-Net's region models) logit(p) = z exactly,
so logit(p) / T per channel is the logits' temperature too. Two roundings remain. p is stored in float32: ln p
carries its relative rounding (6e-8), but a sigmoid near 1 holds 1 - p only to float32's spacing there (6e-8), so
logit(p) is exact only to about 6e-8 / (1 - p) (2e-4 at logit 8). And a p that underflowed to 0 (or a sigmoid that
saturated to 1) has no finite log: p is clamped to [2^-126, 1 - 2^-24] (float32's smallest normal number, and the
largest float32 below 1), i.e. a log-probability of at least -87.3 and a logit within +-16.6; a temperature
T moves such a voxel as if its logit gap were exactly that bound (saturated voxels stay saturated for T < ~5).
nnU-Net writes p = 0 on purpose outside its crop box (background 1, other channels 0): those voxels keep a
certain background after scaling, up to exp(-87.3 / T).

**Vector scaling** maps channel k to w_k u_k + b_k. On sigmoid logits u = z it is the logits' vector scaling; on
softmax log-probabilities u = ln p = z - c(x) it is *not* (the per-voxel constant becomes -w_k c(x), which does not
drop out unless all w_k are equal): it is then a calibration map of its own on the log-probabilities (a diagonal
Dirichlet calibration, Kull et al. 2019), recorded as such.

**Fiducio's calibrators** (:mod:`mcseg.calibration.fiducio_adapters`) take ln p as their logits: the
translation-invariant ones (ETS, MSc) and those of the log-probabilities (Dirichlet, CMS, CMSap, CMSop) are then
exactly the logits' own maps; matrix scaling (MS), like vector scaling, is a map of the log-probabilities.

**Local temperature scaling** (``lts``) is a network that maps a case's logits to a temperature per voxel. Fed the
saved ln p = z - logsumexp(z) instead of z (Fiducio's "LTS(log S)", ../shared/reference/posthoc_and_conformal.md
A7), it depends on the probabilities only: adding any per-voxel constant to the logits changes neither its input
nor, as softmax(ln p / T) = softmax(z / T), its output. It is thus LTS on the log-probabilities, a calibrator of its
own, not the LTS a network's raw logits would have given (those would need the per-voxel constant the files no
longer hold). For sigmoids logit(p) = z, so it is the logits' own LTS. The clamp above enters its input: nnU-Net's
p = 0 outside its crop box is ln p = -87.3 (and weighs in the input scale, the standard deviation of the fit
cases' log-probabilities). **Refused**: its image input (``use_image``): a prediction folder holds no image.

Fits go through :func:`mcseg.calibration.posthoc.fit_posthoc` (same voxel sample, objectives, identity fallback and
warnings as a trained run's) with :class:`SavedProbabilities` as the predictor, and are recorded in
``<out>/calibration.json`` keyed by the sha256 of the validation files (the checkpoint's hash for a trained run).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from mcseg.calibration import PosthocConfig, fit_posthoc
from mcseg.calibration.posthoc import CALIBRATION_FILE
from mcseg.calibration.scaler_registry import SCALER_TYPES, Scaler, load_scaler
from mcseg.data.cases import CaseData
from mcseg.files import write_json
from mcseg.config import EvalProtocol
from mcseg.data.reference import FolderError, Reference
from mcseg.evaluation.case_pool import map_cases
from mcseg.evaluation.folders import read_case
from mcseg.evaluation.formats import PredictionFormat
from mcseg.evaluation.provenance import file_sha256

__all__ = ["FLOOR", "CEIL", "NO_IMAGE", "SavedProbabilities", "calibrate_folder", "fit_folders", "log_probabilities"]

FLOOR = 2.0 ** -126   # float32's smallest normal number: ln FLOOR = -87.34
CEIL = 1.0 - 2.0 ** -24  # the largest float32 below 1: logit(CEIL) = 16.64
NO_IMAGE = ("local temperature scaling with the image input (lts use_image=true) is refused on saved predictions: "
            "a prediction folder holds no image, only the probabilities (fitted on their logarithm instead)")
CLAMP_TEXT = (f"p clamped to [2^-126, 1 - 2^-24] before the log (softmax: ln max(p, 2^-126) >= -87.34; sigmoid: "
              f"logit(p) within +-16.64): float32 underflow and saturation, and nnU-Net's p = 0 outside its crop box")


def log_probabilities(probs: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """The logits of saved probabilities, up to what the link ignores: ln p (softmax: the logits up to a
    per-voxel constant) or logit(p) (sigmoid: the logits), p clamped as stated in the module docstring."""
    p = probs.float()
    if multilabel:
        p = p.clamp(FLOOR, CEIL)
        return torch.log(p) - torch.log1p(-p)
    return torch.log(p.clamp_min(FLOOR))


def _link(multilabel: bool):
    return torch.sigmoid if multilabel else (lambda z: torch.softmax(z, 1))


class SavedProbabilities:
    """Saved probabilities as the predictor :func:`~mcseg.calibration.posthoc.fit_posthoc` fits scalers to: its
    "logits" are the log-probabilities of each case (:func:`log_probabilities`), carried in ``case.meta``."""

    # the geometry LTS takes when posthoc.lts leaves it unset: 3D patches of LTSConfig's default size
    model_dims, roi_size, slice_axis = 3, None, -1

    def __init__(self, multilabel: bool) -> None:
        self.multilabel = multilabel
        self.link = _link(multilabel)

    def eval(self) -> SavedProbabilities:
        return self

    def logits(self, case: CaseData) -> torch.Tensor:
        return case.meta["log_probabilities"]

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return self.link(logits[None])[0]

    def label_map(self, probs: torch.Tensor) -> torch.Tensor:
        return (probs > 0.5).to(torch.uint8) if self.multilabel else probs.argmax(0).to(torch.uint8)


def _fit_owners(folders: Sequence[PredictionFormat], cases: Sequence[str] | None) -> dict[str, PredictionFormat]:
    """Which folder holds each fit case: folds' validation folders hold disjoint cases (together, every training
    case once, out of fold)."""
    owners: dict[str, PredictionFormat] = {}
    for folder in folders:
        for case in folder.cases():
            if case in owners:
                raise FolderError(f"case {case} is in both {owners[case].path} and {folder.path}: the folders a "
                                  f"scaler is fitted on must hold different cases (the folds' validation outputs)")
            owners[case] = folder
    if cases is not None:
        missing = [c for c in cases if c not in owners]
        if missing:
            raise FolderError(f"{len(missing)} fit case(s) in no fit folder: {', '.join(missing[:10])}")
        owners = {c: owners[c] for c in cases}
    return dict(sorted(owners.items()))


def fit_folders(folders: Sequence[PredictionFormat], reference: Reference, out_dir: Path,
                scalers: Sequence[str] = ("temperature",), cases: Sequence[str] | None = None,
                posthoc: PosthocConfig | None = None, protocol: EvalProtocol | None = None,
                workers: int = 1) -> tuple[dict, dict[str, Scaler]]:
    """Fit ``scalers`` on the saved probabilities of the fit cases (every case of ``folders``, or ``cases``)
    against ``reference``, the cases read in ``workers`` processes (:mod:`mcseg.evaluation.case_pool`; the fit
    itself, and its voxel sample, in this one, in case order); the record goes to ``out_dir/calibration.json``.
    Returns it and the fitted scalers."""
    unknown = [s for s in scalers if s not in SCALER_TYPES]
    if unknown:
        raise FolderError(f"post-hoc scaler {unknown[0]!r}: expected one of {', '.join(SCALER_TYPES)}")
    protocol = protocol or EvalProtocol()
    default = PosthocConfig()
    posthoc = posthoc or default
    if "lts" in scalers and posthoc.lts.get("use_image"):
        raise FolderError(NO_IMAGE)
    try:
        cfg = PosthocConfig(fit=list(scalers), apply=list(scalers), max_voxels=posthoc.max_voxels,
                            max_iter=posthoc.max_iter, seed=posthoc.seed, voxels=posthoc.voxels,
                            objective=posthoc.objective, lts=dict(posthoc.lts), histogram_bins=posthoc.histogram_bins,
                            fiducio=dict(posthoc.fiducio))
    except ValueError as exc:
        raise FolderError(str(exc)) from None
    owners = _fit_owners(folders, cases)
    unlabelled = [c for c in owners if c not in reference.labels]
    if unlabelled:
        raise FolderError(f"{len(unlabelled)} fit case(s) without a label in {reference.root}: "
                          f"{', '.join(unlabelled[:10])}")
    task = reference.task
    read: list[Path] = [*reference.files, *dict.fromkeys(f for folder in folders for f in folder.config_files())]
    for case, folder in owners.items():
        read += [reference.labels[case], *folder.case_files(case)]
    digests = {str(p.resolve()): file_sha256(p) for p in dict.fromkeys(read)}
    key = hashlib.sha256("\n".join(f"{digests[p]}" for p in sorted(digests)).encode()).hexdigest()

    def fit_cases() -> Iterator[CaseData]:  # read in ``workers`` processes, in case order (the voxel sample's)
        for case in map_cases(partial(_fit_case, owners, reference), list(owners), workers, desc="reading fit cases"):
            case.meta["log_probabilities"] = torch.from_numpy(case.meta["log_probabilities"])
            yield case

    identity = {"path": [str(Path(f.path).resolve()) for f in folders], "sha256": key,
                "kind": "saved probabilities (sha256 over the sha256 of every file read for the fit)"}
    how = {"link": "sigmoid per region" if task.multilabel else "softmax",
           "logits_from_probabilities": ("logit(p) = the logits" if task.multilabel else
                                         "ln p = the logits minus a per-voxel constant, which the softmax ignores"),
           "clamp": CLAMP_TEXT}
    if "lts" in scalers:
        how["lts"] = ("local temperature scaling fed the log-probabilities (ln p; logit(p) for sigmoids): it depends "
                      "on the probabilities only, invariant to a per-voxel constant added to the logits")
    if "vector" in scalers and not task.multilabel:
        how["vector"] = ("vector scaling of the log-probabilities w_k ln p_k + b_k: not the logits' vector scaling "
                         "(the per-voxel constant does not drop out), a diagonal Dirichlet calibration")
    provenance = {"fitted_on_probabilities": how, "predictions": [f.identity() for f in folders],
                  "reference": {"path": str(reference.root.resolve()), "kind": reference.kind},
                  "input_files_sha256": digests}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    try:
        record = fit_posthoc(SavedProbabilities(task.multilabel), fit_cases(), cfg, Path(out_dir), identity,
                             provenance, protocol)
    except ValueError as exc:
        raise FolderError(str(exc)) from None
    fitted = {name: load_scaler(name, record["scalers"][name], Path(out_dir)) for name in scalers}
    return record, fitted


def _fit_case(owners: dict[str, PredictionFormat], reference: Reference, case: str) -> CaseData:
    """One fit case read (:func:`read_case`), its log-probabilities (:func:`log_probabilities`, as an array: it
    crosses from a worker by value) in ``meta``."""
    folder = owners[case]
    label_vol, label, probs, _, _ = read_case([folder], reference, case)
    if probs is None:
        raise FolderError(f"case {case}: {folder.path} has label maps only; a fit needs probabilities")
    return CaseData(case, np.zeros((0,), np.float32), label.numpy(), tuple(label_vol.spacing), label_vol.affine,
                    {"log_probabilities": log_probabilities(probs, reference.task.multilabel).numpy()})


def _decisions(probs: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """Each voxel's decision from ``C x *S`` probabilities: its class (first maximum), or its regions (p > 0.5)."""
    return probs > 0.5 if multilabel else probs.argmax(0)


def calibrate_folder(folder: PredictionFormat, scaler: Scaler, out_dir: Path,
                     multilabel: bool, workers: int = 1) -> tuple[list[str], dict]:
    """Write ``folder``'s probabilities scaled by ``scaler`` to ``out_dir`` in the tool's own format (its
    :meth:`~mcseg.evaluation.formats.base.PredictionFormat.write`: nnU-Net's npz, pkl and label map re-derived,
    MONAI's and mcseg's maps with their NIfTI header), its config files (plans.json, dataset.json) copied.
    Returns the files written (relative to ``out_dir``) and how many voxels of the calibrated cases changed their
    decision (arg-max; multi-label: any region's p > 0.5) from the saved probabilities to the written ones, as
    :func:`~mcseg.calibration.posthoc.argmax_changes` counts the fit voxels: ``{"count", "share", "of",
    "voxels"}``; the fit voxels can be few, or of other cases. The cases are calibrated in ``workers`` processes
    (:mod:`mcseg.evaluation.case_pool`; each writes its own files, the counts are added in case order)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for config in folder.config_files():
        if config.parent != out_dir:
            shutil.copy2(config, out_dir / config.name)
            written.append(config.name)
    count = of = calibrated = 0
    job = partial(_calibrate_case, folder, scaler, out_dir, multilabel)
    for files, changed, voxels, scaled in map_cases(job, folder.cases(), workers, desc="calibrating"):
        written += files
        count, of, calibrated = count + changed, of + voxels, calibrated + scaled
    changes = {"count": count, "share": count / max(of, 1), "of": of,
               "voxels": f"every voxel of the {calibrated} calibrated case(s)"}
    return written, changes


def _calibrate_case(folder: PredictionFormat, scaler: Scaler, out_dir: Path, multilabel: bool,
                    case: str) -> tuple[list[str], int, int, bool]:
    """One case of :func:`calibrate_folder` written to ``out_dir``: the files written, the voxels whose decision
    the scaler changed, the voxels it scaled, and whether it scaled any probabilities of the case."""
    link = _link(multilabel)
    counted = [0, 0, False]

    def scaled(case: str, path: Path, probs: np.ndarray, channel_axis: int) -> np.ndarray:
        checked = folder.check_probabilities(case, path, np.moveaxis(np.asarray(probs), channel_axis, 0))
        z = log_probabilities(torch.from_numpy(checked), multilabel)
        with torch.no_grad():
            p = link(scaler.apply(z)[None])[0]
        changed = _decisions(torch.from_numpy(checked), multilabel) != _decisions(p, multilabel)
        changed = changed.any(0) if multilabel else changed
        counted[0] += int(changed.sum())
        counted[1] += changed.numel()
        counted[2] = True
        return np.ascontiguousarray(np.moveaxis(p.numpy().astype(np.float32), 0, channel_axis))

    files = folder.write(case, scaled, out_dir)
    return files, counted[0], counted[1], counted[2]


def take_over(out_dir: Path) -> list[dict]:
    """Remove an earlier calibration of ``out_dir`` (its calibration.json and the files it says it wrote) before
    a new one is written there; return what it was (its fits and what they were applied to), plus what that one
    had replaced, for the new calibration.json's ``replaced``."""
    path = Path(out_dir) / CALIBRATION_FILE
    try:
        stored = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        stored = {}
    applied = stored.get("applied") or {}
    own_files = [r.get(key) for fit in (stored.get("fits") or {}).values()
                 for r in (fit.get("scalers") or {}).values() if isinstance(r, dict)
                 for key in ("weights", "file")]  # LTS weights, Fiducio's calibrator files
    for name in [*(applied.get("files") or []), *filter(None, own_files)]:
        (Path(out_dir) / Path(name).name).unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    earlier = [{"fit": key, "scalers": {n: {k: v for k, v in r.items() if k in ("temperature", "weight", "bias")}
                                        for n, r in (fit.get("scalers") or {}).items()},
                "fitted_on": (fit.get("checkpoint") or {}).get("path"),
                "applied": {k: v for k, v in applied.items() if k != "files"} if applied.get("fit") == key else None}
               for key, fit in (stored.get("fits") or {}).items()]
    return [*(stored.get("replaced") or []), *earlier]


def record_applied(out_dir: Path, fit: dict, scaler: str, target: PredictionFormat | None, files: list[str],
                   fit_cases: list[str], replaced: list[dict], changes: dict | None = None) -> dict:
    """Say in ``out_dir/calibration.json`` which fit and scaler the calibrated files carry (``applied``: the
    fit's key, the folder they were made from, its cases, the files written, the fit cases among them, the voxels
    whose arg-max the calibration changed, ``changes`` of :func:`calibrate_folder`) and which earlier
    calibrations of the folder they replaced (``replaced``)."""
    path = Path(out_dir) / CALIBRATION_FILE
    stored = json.loads(path.read_text())
    if target is not None:
        stored["applied"] = {"fit": fit["checkpoint"]["sha256"], "scaler": scaler,
                             "to": str(Path(target.path).resolve()), "format": target.format,
                             "cases": target.cases(), "files": files,
                             "fit_cases_calibrated": sorted(set(fit_cases) & set(target.cases())),
                             **({"argmax_changes": changes} if changes is not None else {})}
    if replaced:
        stored["replaced"] = replaced
    write_json(path, stored)
    return stored
