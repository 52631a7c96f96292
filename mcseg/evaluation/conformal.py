"""Conformal guarantees in a checkpoint's evaluation (``evaluate.py conformal.enabled=true``; docs/conformal.md).

Per class, a threshold and margins in mm (:mod:`mcseg.conformal`) are fitted on the checkpoint's own validation
split and applied to the evaluated split, on the raw probabilities and (``conformal.posthoc``) on each applied
post-hoc scaler's, each named: ``<eval dir>/conformal/<raw|scaler>/`` holds ``conformal.json`` (as
``mcseg-conformal-folder`` writes it: settings, per class the threshold, calibration risk, n cases and those
without the class, margins, the test figures), ``per_case.csv`` and (``conformal.masks``) the set, possible and
sure masks of each case as NIfTI on its file grid. The probabilities are the evaluation's own (the predictor's,
mapped back to each case's file grid by the dataset's ``restore``), recomputed in a pass of their own so the
evaluation's pass stays as it is. The evaluated split must not hold validation cases (no guarantee for them).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from mcseg.conformal import (CaseSummary, ConformalSettings, case_sets, case_test,
                             default_thresholds, fit_margins, fit_thresholds, predicted_masks, summarise)
from mcseg.conformal.config import ConformalConfig, conformal_config
from mcseg.conformal.plots import case_overlay
from mcseg.conformal.record import (CONFORMAL_FILE, class_records, fit_lines, settings_record, test_figures,
                                   versions, write_masks)
from mcseg.conformal.risks import class_masks
from mcseg.conformal.validity import levels, pooled_splits
from mcseg.errors import ConfigError
from mcseg.files import write_csv, write_json
from mcseg.statements.features import case_row

__all__ = ["ConformalConfig", "add_to_summary", "check_conformal", "conformal_config", "conformal_of_predictor",
           "conformal_pass", "headline"]

# the figures per class that go into summary.json's "conformal" block, and their means over the classes there
HEADLINE = {"test_loss": "mean_loss", "set_over_prediction": "mean_set_over_prediction",
            "covered": "covered", "sure_inside": "sure_inside"}


def check_conformal(config: ConformalConfig, split: str, own_split: dict | None) -> None:
    """Refused before the evaluation: no validation split to fit on, or another split than the test split."""
    if not config.enabled:
        return
    if own_split is None or not own_split.get("val"):
        raise ConfigError("conformal.enabled=true: the checkpoint has no validation split to fit on")
    if split != "test":
        raise ConfigError(f"conformal.enabled=true with split={split}: the guarantee is for new cases exchangeable "
                          f"with the validation cases the thresholds are fitted on (not those, nor the training "
                          f"cases the network has seen); evaluate split=test")


def _sources(scalers: Mapping[str, object], posthoc: bool) -> dict[str, Callable | None]:
    """``raw`` (the probabilities as they come) and, with ``posthoc``, each applied scaler's logit transform."""
    from mcseg.evaluation.split import _transform

    return {"raw": None, **({name: _transform(s) for name, s in scalers.items()} if posthoc else {})}


def _probabilities(predictor, dataset, refs, sources: dict[str, Callable | None]):
    """Per case: ``(case, {source: (probs, label, spacing, affine)})`` on the case's file grid."""
    dataset.prepare(refs)
    for ref in refs:
        case = dataset.load(ref)
        logits = predictor.predict(case)[0]
        out = {}
        for name, transform in sources.items():
            z = logits if transform is None else transform(logits, case)
            probs, label, spacing, affine = dataset.restore(case, predictor.probabilities(z))
            out[name] = (probs.float().cpu(), torch.as_tensor(np.asarray(label)), tuple(spacing), affine)
        yield case, out


def conformal_of_predictor(config: ConformalConfig, predictor, own_dataset, val_refs, dataset, refs,
                           scalers: Mapping[str, object], out_dir: Path, provenance: dict,
                           log_figure: Callable[[str, object], None] | None = None) -> dict:
    """Fit on ``val_refs`` of ``own_dataset``, apply to ``refs`` of ``dataset``, write ``out_dir/<source>/``;
    returns per source the conformal.json record. The overlay figures (``conformal.figures``) are drawn over each
    case's image (first channel) on its file grid, where the restored probabilities and the masks are;
    ``log_figure(tag, figure)`` also gets each, tagged ``conformal/<source>/<case>``: a run's trackers (TensorBoard)."""
    multilabel = predictor.multilabel
    names = list(dataset.class_names)
    settings = config.settings(names, multilabel)
    grid = default_thresholds(config.grid_size)
    sources = _sources({n: s.to(predictor.device) for n, s in scalers.items()}, config.posthoc)
    fit: dict[str, list[CaseSummary]] = {name: [] for name in sources}
    table = {name: {"val": {}, "test": {}} for name in sources}  # conformal.statements: the per-case tables
    with torch.no_grad():
        for case, per_source in _probabilities(predictor, own_dataset, val_refs, sources):
            for name, (probs, label, spacing, _) in per_source.items():
                truth = class_masks(label, probs.shape[0], multilabel)
                pred = predicted_masks(probs, multilabel)
                fit[name].append(summarise(case.case_id, probs, truth, pred, spacing, grid, settings.tau,
                                           settings.classes))
                if config.statements:
                    table[name]["val"][case.case_id] = case_row(probs, pred, spacing, settings.classes, truth.numpy())
        fits = {}
        for name, summaries in fit.items():
            stacked = CaseSummary.stack(summaries)
            fits[name] = (stacked, fit_thresholds(stacked, settings), fit_margins(stacked, settings))
        rows: dict[str, list[dict]] = {name: [] for name in sources}
        written: dict[str, list[str]] = {name: [] for name in sources}
        tested: dict[str, list[CaseSummary]] = {name: [] for name in sources}  # for conformal.repeats
        for index, (case, per_source) in enumerate(_probabilities(predictor, dataset, refs, sources)):
            image = dataset.original_image(case)[0] if index < config.figures else None  # first channel
            for name, (probs, label, spacing, affine) in per_source.items():
                _, thresholds, margins = fits[name]
                pred = predicted_masks(probs, multilabel)
                sets = case_sets(probs, pred, spacing, thresholds, margins)
                truth = class_masks(label, probs.shape[0], multilabel).numpy()
                if config.statements:
                    table[name]["test"][case.case_id] = case_row(probs, pred, spacing, settings.classes, truth)
                rows[name] += [{"case": case.case_id, "class": names[k], **r}
                               for k, r in case_test(sets, truth, pred, settings.loss, settings.tau).items()]
                if config.repeats:
                    tested[name].append(summarise(case.case_id, probs, torch.from_numpy(truth), pred, spacing, grid,
                                                  settings.tau, settings.classes))
                if config.masks:
                    written[name] += write_masks(out_dir / name, case.case_id, sets, names, affine)
                if index < config.figures:
                    file = f"{case.case_id}_conformal.png"
                    figure = case_overlay(out_dir / name / file, case.case_id, probs, sets, pred, truth, names, image)
                    written[name].append(file)
                    if log_figure is not None:
                        log_figure(f"conformal/{name}/{case.case_id}", figure)
    if config.statements:
        for name in sources:
            statements_of_split(config, [names[k] for k in settings.classes], table[name], out_dir / name,
                                name, log_figure)
    validity = {name: _repeated_splits(config, settings, names, fits[name][0], tested[name], out_dir / name, name,
                                       log_figure) for name in sources}
    return {name: _write_record(out_dir / name, name, settings, *fits[name], rows[name], written[name], provenance,
                                names, [r.case_id for r in refs], validity[name])
            for name in sources}


def statements_of_split(config: ConformalConfig, structures: list[str], table: dict[str, dict], folder: Path,
                        source: str = "raw", log_figure: Callable[[str, object], None] | None = None) -> dict:
    """``conformal.statements``: the new-case statements (:mod:`mcseg.statements`) fitted on the validation cases'
    table and stated for the test cases, whose labels only measure them; ``folder/statements/`` holds what
    ``mcseg-new-cases`` writes and ``statements.png`` (:func:`mcseg.statements.plots.statements_figure`), also
    given to ``log_figure`` as ``conformal/<source>/statements``. Returns the record."""
    from mcseg.statements.statements import StatementSettings, make_statements, write_statements
    from mcseg.statements.table import CaseTable

    parts = {part: CaseTable.from_rows(list(rows), structures, list(rows.values())) for part, rows in table.items()}
    settings = StatementSettings(config.alpha, config.delta if config.delta is not None else 0.1, config.floor)
    rows, record = make_statements(parts["val"], parts["test"], settings)
    record = {**record, "classes": structures, "calibration_cases": parts["val"].cases,
              "new_cases": parts["test"].cases, "rows": rows}
    figure = write_statements(folder / "statements", parts["val"], parts["test"], rows, record, figure=True)
    if log_figure is not None:
        log_figure(f"conformal/{source}/statements", figure)
    return record


def _repeated_splits(config: ConformalConfig, settings: ConformalSettings, names: list[str], fitted: CaseSummary,
                     tested: list[CaseSummary], folder: Path, source: str,
                     log_figure: Callable[[str, object], None] | None) -> dict | None:
    """``conformal.repeats`` random re-splits of the validation and test cases pooled
    (:func:`mcseg.conformal.validity.pooled_splits`: ``validity.csv`` and ``coverage.png`` in ``folder``, the
    figure also to ``log_figure`` as ``conformal/<source>/coverage``); conformal.json's ``validity`` block."""
    if not config.repeats or not tested:
        return None
    block, figure = pooled_splits(fitted, CaseSummary.stack(tested), settings, names,
                                  levels(config.alphas, config.alpha), config.repeats, folder)
    if log_figure is not None:
        log_figure(f"conformal/{source}/coverage", figure)
    return block


def _write_record(folder: Path, source: str, settings: ConformalSettings, summaries: CaseSummary, thresholds: dict,
                  margins: dict, rows: list[dict], files: list[str], provenance: dict, names: list[str],
                  cases: list[str], validity: dict | None = None) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    record = {**settings_record(settings, summaries),
              "probabilities": "raw" if source == "raw" else f"after the post-hoc scaler {source}",
              "classes": class_records(settings, thresholds, margins, names),
              "fit_cases": summaries.cases, "provenance": {**provenance, "versions": versions()},
              "applied": {"split_cases": cases, "files": files}, "test": test_figures(rows, settings),
              **({"validity": validity} if validity else {})}
    if rows:
        write_csv(folder / "per_case.csv", rows)
    write_json(folder / CONFORMAL_FILE, record)
    return record


def headline(record: dict) -> dict:
    """A source's block of summary.json (the table of figures reads ``conformal.<source>.mean_*``): the settings,
    per class the threshold, whether it is controlled, n and the test figures, and their means over the classes."""
    classes = {}
    for name, fit in record["classes"].items():
        test = (record.get("test") or {}).get(name) or {}
        classes[name] = {"threshold": fit["threshold"], "controlled": fit["controlled"], "n_cases": fit["n_cases"],
                         "outer_mm": fit["margin"]["outer_mm"], "inner_mm": fit["margin"]["inner_mm"],
                         **{key: test.get(source) for key, source in HEADLINE.items()}}
    means = {}
    for key in HEADLINE:
        values = [c[key] for c in classes.values() if c[key] is not None]
        means[f"mean_{key}"] = float(np.mean(values)) if values else None
    return {"alpha": record["alpha"], "method": record["method"], "loss": record["loss"], **means,
            "classes": classes}


def add_to_summary(out_dir: Path, block: dict) -> None:
    """``block`` added to the evaluation's summary.json (written by the evaluation before the conformal pass)."""
    import json

    path = Path(out_dir) / "summary.json"
    write_json(path, {**json.loads(path.read_text()), **block})


def conformal_pass(config: ConformalConfig, predictor, own_dataset, val_refs, dataset, refs,
                   scalers: Mapping[str, object], eval_dir: Path, provenance: dict, summary: dict,
                   log_figure: Callable[[str, object], None] | None = None) -> dict:
    """The conformal pass of an evaluation in ``eval_dir`` (evaluate.py's and a run's own test evaluation):
    :func:`conformal_of_predictor` into ``eval_dir/conformal``, its headline added to summary.json for the table of
    figures and printed; returns ``summary`` with its ``conformal`` block."""
    out_dir = Path(eval_dir) / "conformal"
    records = conformal_of_predictor(config, predictor, own_dataset, val_refs, dataset, refs, scalers, out_dir,
                                     provenance, log_figure)
    block = {name: headline(record) for name, record in records.items()}
    add_to_summary(eval_dir, {"conformal": block})
    for name, record in records.items():
        print(f"conformal, {name} probabilities -> {out_dir / name}:\n" + "\n".join(
            f"  {line}" for line in fit_lines(record)))
    return {**summary, "conformal": block}
