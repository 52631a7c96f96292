"""Post-hoc calibration of a trained run: fit on the validation split, save, apply at evaluation.

``fit_posthoc`` segments the validation cases with the run's predictor and fits each scaler of
``posthoc.fit`` through the one interface of :mod:`mcseg.calibration.scaler_registry`. The voxel-wise
scalers (temperature, vector) are fitted on a voxel sample: ``region`` (default: the voxels of the
protocol's calibration region ``evaluation.region``, chosen by the evaluator's own
:func:`~mcseg.metrics.regions.region_mask` with the model's own prediction: the fit is made where
the ECE is scored; refused for vector scaling, which moves the arg-max and with it the region),
``balanced`` (all foreground voxels of each case plus as many random background voxels, the
reference protocol for 3D volumes) or ``all`` (every voxel, the plain NLL of Guo et al.); then at
most ``max_voxels`` in all, drawn uniformly. Temperature scaling is fitted by the NLL (L-BFGS) or,
with ``objective: ece``, by the ECE of those voxels (a 1-D search). The default follows the study
in docs/results.md ("Post-hoc calibration compared").
Spatial scalers (LTS) are fitted on the whole validation cases. Everything runs in the network's
space (the preprocessed cases), where the scalers are applied.

``calibration.json`` holds one fit per checkpoint, keyed by the checkpoint file's sha256
(``{"fits": {sha256: record}}``), never by its file name: fits of several checkpoints coexist,
and a different model that happens to have the same file name is fitted anew. Each scaler's
entry is its :meth:`~mcseg.calibration.scaler_registry.Scaler.save` record (with which voxels and which
objective it was fitted on); files it writes (LTS weights) sit beside ``calibration.json``, named
with the checkpoint's sha256. A fitted temperature outside ``PLAUSIBLE_TEMPERATURE`` is kept but
warned about (and listed in the record's ``warnings``): it usually means too few validation voxels.
A degenerate fit (:func:`degenerate_reason`: a temperature outside ``DEGENERATE_TEMPERATURE``, or a fitted NLL
within ``UNIFORM_NLL_TOLERANCE`` of the uniform prediction's) is kept too, warned about, listed in ``warnings``
and marked in its scaler's entry (``"degenerate": true`` and ``"degenerate_reason"``; a sound fit has neither
key): its "calibrated" figures are those of a near-uniform prediction, not of a calibration.
Every scaler's entry says how many of the voxels it was fitted on changed their arg-max under it
(``argmax_changes``: count, share, of how many; :func:`argmax_changes`); a scaler that should keep the arg-max and
changed it is warned about. A fit on fewer than ``MIN_VOXELS_PER_PARAMETER`` voxels per number it chose
(:meth:`~mcseg.calibration.scaler_registry.Scaler.n_parameters`) is warned about too (:func:`too_few_voxels`): its
parameters are not determined by so few (and neighbouring voxels are not independent), and its arg-max changes on
the fit voxels say little of those on other cases.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mcseg.calibration.lts import CaseLogits
from mcseg.calibration.lts_config import LTSConfig
from mcseg.calibration.posthoc_config import PosthocConfig
from mcseg.calibration.scaler_registry import FitData, FitOptions, Scaler, build_scaler, load_scaler
from mcseg.config import EvalProtocol
from mcseg.data.cases import CaseData
from mcseg.files import write_json
from mcseg.metrics.regions import region_mask

log = logging.getLogger(__name__)

CALIBRATION_FILE = "calibration.json"
# Fitted temperatures outside this range are legal but suspicious (e.g. T = 6223 on one validation case).
PLAUSIBLE_TEMPERATURE = (0.05, 20.0)
# A fit is degenerate (not only suspicious) beyond these: at T = 100 logits of order 10 are within 0.1 of each
# other (a near-uniform prediction); at T = 0.01 every voxel is one-hot.
DEGENERATE_TEMPERATURE = (0.01, 100.0)
# ... or when its NLL is within this many nats of the uniform prediction's (ln C; ln 2 per region, multi-label)
UNIFORM_NLL_TOLERANCE = 1e-3
# A fit with fewer voxels than this per fitted number is warned about (a rule of thumb, as ten events per variable
# for a regression; voxels of one case are correlated, so it is a floor, not a sufficient size)
MIN_VOXELS_PER_PARAMETER = 10


def fit_options(cfg: PosthocConfig, protocol: EvalProtocol, predictor) -> FitOptions:
    """How each scaler of ``cfg`` is fitted: ECE bins of the protocol, LTS in the model's geometry."""
    lts = (cfg.lts_config(predictor.model_dims, predictor.roi_size, predictor.slice_axis)
           if "lts" in cfg.fit else LTSConfig())
    return FitOptions(cfg.max_iter, cfg.objective, protocol.n_bins, lts, cfg.histogram_bins, dict(cfg.fiducio))


def _sample_voxels(logits: torch.Tensor, label: torch.Tensor, multilabel: bool, generator: torch.Generator,
                   voxels: str = "balanced", region: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(N x K logits, targets) of one case: every voxel (``all``, or ``region`` with ``region=None``,
    the region ``all``), the voxels of the boolean ``region`` mask (``region``), or all foreground
    voxels plus as many random background ones (``balanced``)."""
    k = logits.shape[0]
    flat_logits = logits.reshape(k, -1).T
    flat_label = label.reshape(k, -1).T if multilabel else label.reshape(-1)
    if voxels == "all" or (voxels == "region" and region is None):
        return flat_logits.float(), flat_label
    if voxels == "region":
        idx = torch.nonzero(region.reshape(-1).to(flat_label.device)).flatten()
        return flat_logits[idx].float(), flat_label[idx]
    foreground = flat_label.any(1) if multilabel else flat_label > 0
    fg_idx = torch.nonzero(foreground).flatten()
    bg_idx = torch.nonzero(~foreground).flatten()
    n_bg = min(len(bg_idx), max(len(fg_idx), 1))
    pick = torch.randperm(len(bg_idx), generator=generator)[:n_bg].to(bg_idx.device)
    idx = torch.cat([fg_idx, bg_idx[pick]])
    return flat_logits[idx].float(), flat_label[idx]


def fit_region(predictor, logits: torch.Tensor, label: torch.Tensor, spacing, protocol: EvalProtocol) -> torch.Tensor | None:
    """The voxels of ``protocol.region`` of one case, as the evaluator picks them (its ``region_mask``
    with the model's own prediction, which temperature scaling and LTS do not change); multi-label:
    the voxels in any region's own mask. None: every voxel."""
    pred = predictor.label_map(predictor.probabilities(logits))
    if not predictor.multilabel:
        return region_mask(protocol.region, label, pred, spacing, protocol.boundary_width_mm)
    masks = [region_mask(protocol.region, label[r].long(), pred[r].long(), spacing, protocol.boundary_width_mm)
             for r in range(label.shape[0])]
    return None if masks[0] is None else torch.stack(masks).any(0)


@dataclass
class ValidationData:
    """What the scalers are fitted on: the voxel sample, and the whole cases when a spatial scaler needs them."""

    logits: torch.Tensor
    target: torch.Tensor
    n_cases: int
    case_ids: list[str]
    cases: list[CaseLogits] | None = None


def collect_validation(predictor, cases: Iterable[CaseData], cfg: PosthocConfig,
                       protocol: EvalProtocol | None = None, keep_cases: bool = False,
                       with_image: bool = False) -> ValidationData:
    """Segment the validation ``cases`` once: the voxel sample of ``cfg.voxels`` (network space, at most
    ``cfg.max_voxels``) and, with ``keep_cases``, every case's logits and label (CPU; image too with
    ``with_image``)."""
    if cfg.voxels == "region" and protocol is None:
        raise ValueError("posthoc.voxels=region needs the evaluation protocol (its region)")
    generator = torch.Generator().manual_seed(cfg.seed)
    predictor.eval()
    logits_parts, target_parts, ids, kept = [], [], [], []
    for case in cases:
        if case.label is None:
            raise ValueError(f"post-hoc calibration: validation case {case.case_id} has no label")
        logits = predictor.logits(case)
        label = torch.from_numpy(np.asarray(case.label)).to(logits.device)
        region = fit_region(predictor, logits, label, case.spacing, protocol) if cfg.voxels == "region" else None
        z, y = _sample_voxels(logits, label, predictor.multilabel, generator, cfg.voxels, region)
        logits_parts.append(z.cpu())
        target_parts.append(y.cpu())
        ids.append(case.case_id)
        if keep_cases:
            kept.append(CaseLogits(case.case_id, logits.float().cpu(), np.asarray(case.label),
                                   np.asarray(case.image) if with_image else None))
        del logits
    if not ids:
        raise ValueError("post-hoc calibration needs validation cases; the validation split is empty")
    logits, target = torch.cat(logits_parts), torch.cat(target_parts)
    if len(logits) == 0:
        raise ValueError(f"post-hoc calibration: the fit voxels ({cfg.voxels}) of the {len(ids)} validation case(s) "
                         f"are empty; set posthoc.voxels=balanced")
    if len(logits) > cfg.max_voxels:
        keep = torch.randperm(len(logits), generator=generator)[:cfg.max_voxels]
        logits, target = logits[keep], target[keep]
    return ValidationData(logits, target, len(ids), ids, kept if keep_cases else None)


def _sampling_text(cfg: PosthocConfig, protocol: EvalProtocol | None) -> str:
    what = {"all": "every voxel",
            "balanced": "all foreground voxels + equally many random background voxels per case",
            "region": f"the voxels of the calibration region {getattr(protocol, 'region', '?')} (model's own "
                      f"prediction)"}[cfg.voxels]
    return f"{what}, then at most {cfg.max_voxels} uniformly"


def fit_posthoc(predictor, cases: Iterable[CaseData], cfg: PosthocConfig, where: Path, checkpoint: dict,
                provenance: dict | None = None, protocol: EvalProtocol | None = None) -> dict:
    """Fit ``cfg.fit`` scalers on the validation ``cases`` and add them to ``<where>/calibration.json``.

    ``checkpoint``: the identity of the checkpoint whose predictor this is
    (:func:`mcseg.evaluation.provenance.checkpoint_identity`; its ``sha256`` is the record's key);
    ``provenance``: more of what produced the fit (dataset identity, overrides) for the record;
    ``protocol``: the evaluation protocol (its region for ``voxels: region``, its bins for ``objective: ece``).
    """
    protocol = protocol or EvalProtocol()
    options = fit_options(cfg, protocol, predictor)
    scalers = [build_scaler(name, options) for name in cfg.fit]
    data = collect_validation(predictor, cases, cfg, protocol, any(s.fitted_on == "cases" for s in scalers),
                              options.lts.use_image)
    sample = {"voxels": cfg.voxels, **({"region": protocol.region} if cfg.voxels == "region" else {}),
              "n_voxels": len(data.logits), "n_cases": data.n_cases}
    fit_data = FitData((data.logits, data.target), data.cases, predictor.link, predictor.multilabel, sample)
    record = {"fitted_on": "val", "checkpoint": checkpoint, "val_cases": data.case_ids, **(provenance or {}),
              "n_cases": data.n_cases, "n_voxels": len(data.logits), "sampling": _sampling_text(cfg, protocol),
              "scalers": {}, "warnings": []}
    for scaler in scalers:
        start = time.perf_counter()
        scaler.fit(fit_data)
        scaler.record["fit_seconds"] = round(time.perf_counter() - start, 3)  # wall time, on this machine's load
        reason = degenerate_reason(scaler.record, data.logits.shape[-1], predictor.multilabel)
        if reason:
            scaler.record.update(degenerate=True, degenerate_reason=reason)
            message = f"post-hoc {scaler.name}: degenerate fit ({reason}); its scaled figures are not a calibration"
            log.warning(message)
            record["warnings"].append(message)
        scaler.record["argmax_changes"] = argmax_changes(scaler, fit_data)
        if scaler.preserves_argmax and scaler.record["argmax_changes"]["count"]:
            message = (f"post-hoc {scaler.name} should keep the arg-max but changed it at "
                       f"{scaler.record['argmax_changes']['count']} fit voxel(s)")
            log.warning(message)
            record["warnings"].append(message)
        if (message := too_few_voxels(scaler, fit_data)) is not None:
            log.warning(message)
            record["warnings"].append(message)
        record["scalers"][scaler.name] = {**scaler.save(where, checkpoint["sha256"]), "guarantee": scaler.guarantee}
        log.info("post-hoc %s: NLL %.5g -> %.5g", scaler.describe(), scaler.record.get("nll_before", float("nan")),
                 scaler.record.get("nll_after", float("nan")))
        t = scaler.record.get("temperature")
        if t is not None and not PLAUSIBLE_TEMPERATURE[0] <= t <= PLAUSIBLE_TEMPERATURE[1]:
            message = (f"post-hoc temperature T={t:.4g} fitted on {data.n_cases} validation case(s), "
                       f"{len(data.logits)} voxels, is outside {PLAUSIBLE_TEMPERATURE}: the validation split is "
                       f"probably too small to fit it")
            log.warning(message)
            record["warnings"].append(message)
    path = Path(where) / CALIBRATION_FILE
    stored = _read_calibration(path) or {"fits": {}}
    stored["fits"][checkpoint["sha256"]] = record
    write_json(path, stored)
    return record


def _decisions(logits: torch.Tensor, link, multilabel: bool) -> torch.Tensor:
    """Each voxel's decision from ``logits`` (N x K): its class (first maximum of the probabilities), or, for
    multi-label, its regions (probability above 0.5)."""
    probs = (link or (lambda z: torch.softmax(z, 1)))(logits.float())
    return probs > 0.5 if multilabel else probs.argmax(1)


def argmax_changes(scaler: Scaler, data: FitData) -> dict:
    """How many voxels of what ``scaler`` was fitted on change their decision under it (arg-max; multi-label:
    any region's p > 0.5): the voxel sample (``data.voxels``), or every voxel of the cases (``data.cases``) of
    a scaler fitted on cases. ``{"count", "share", "of", "voxels"}``."""
    if scaler.fitted_on == "cases":
        parts = [(torch.as_tensor(c.logits).float(),
                  torch.as_tensor(c.image).float() if scaler.uses_image else None) for c in data.cases]
        where = "every voxel of the fit cases"
    else:
        parts = [(data.voxels[0].T, None)]
        where = "the fit voxels"
    count = total = 0
    with torch.no_grad():
        for z, image in parts:
            k = z.shape[0]
            before = _decisions(z.reshape(k, -1).T, data.link, data.multilabel)
            after = _decisions(scaler.apply(z, image).reshape(k, -1).T.cpu(), data.link, data.multilabel)
            changed = (before != after).any(1) if data.multilabel else before != after
            count, total = count + int(changed.sum()), total + len(changed)
    return {"count": count, "share": count / max(total, 1), "of": total, "voxels": where}


def too_few_voxels(scaler: Scaler, data: FitData) -> str | None:
    """A warning when ``scaler`` was fitted on fewer than ``MIN_VOXELS_PER_PARAMETER`` voxels per parameter (the
    voxel sample, or every voxel of the cases of a scaler fitted on cases); None otherwise or when it does not
    count its parameters."""
    n = scaler.n_parameters()
    if scaler.fitted_on == "cases":
        voxels = sum(int(np.prod(np.shape(c.logits)[1:])) for c in data.cases or [])
    else:
        voxels = len(data.voxels[0])
    if not n or voxels >= MIN_VOXELS_PER_PARAMETER * n:
        return None
    return (f"post-hoc {scaler.name}: fitted on {voxels} voxels for its {n} parameters (fewer than "
            f"{MIN_VOXELS_PER_PARAMETER} per parameter): too few to determine it; its fit and its arg-max changes on "
            f"the fit voxels say little of other cases (more validation cases, or a larger posthoc.max_voxels / "
            f"--max-voxels)")


def degenerate_reason(fit: dict, n_channels: int, multilabel: bool) -> str | None:
    """Why the fitted scaler ``fit`` (its record) is degenerate, or None: a temperature outside
    ``DEGENERATE_TEMPERATURE``, or a fitted NLL within ``UNIFORM_NLL_TOLERANCE`` of the uniform prediction's
    (ln C for ``n_channels`` = C classes; ln 2 per region, multi-label)."""
    reasons = []
    t = fit.get("temperature")
    if t is not None and not DEGENERATE_TEMPERATURE[0] <= t <= DEGENERATE_TEMPERATURE[1]:
        reasons.append(f"T={t:.4g} outside {DEGENERATE_TEMPERATURE}")
    k = 2 if multilabel else n_channels
    after = fit.get("nll_after")
    if after is not None and k > 1 and abs(after - float(np.log(k))) <= UNIFORM_NLL_TOLERANCE:
        reasons.append(f"fitted NLL {after:.6g} is the uniform prediction's ln {k} = {float(np.log(k)):.6g}")
    return "; ".join(reasons) or None


def _read_calibration(path: Path) -> dict | None:
    """The whole calibration.json (``{"fits": {sha256: record}}``); a file of an older version, whose one
    fit is keyed by a file name only, is kept under ``"unkeyed"`` and matches no checkpoint."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); delete it or pass posthoc.refit=true") from None
    if "fits" not in stored:
        stored = {"fits": {}, "unkeyed": stored}
    return stored


def load_calibration(where: Path, sha256: str) -> dict | None:
    """The fit of the checkpoint whose file has hash ``sha256`` in ``<where>/calibration.json``, or None."""
    stored = _read_calibration(Path(where) / CALIBRATION_FILE)
    return (stored or {}).get("fits", {}).get(sha256)


def scalers_to_apply(record: dict | None, names: list[str], where: Path) -> dict[str, Scaler]:
    """The fitted scaler of each name in ``names`` (files read from ``where``); an error names a scaler
    that was not fitted."""
    if not names:
        return {}
    fitted = (record or {}).get("scalers", {})
    missing = [n for n in names if n not in fitted]
    if missing:
        raise ValueError(f"posthoc.apply={names}: {missing[0]!r} was not fitted for {where} "
                         f"(add it to posthoc.fit, or pass posthoc.refit=true)")
    return {n: load_scaler(n, fitted[n], where) for n in names}
