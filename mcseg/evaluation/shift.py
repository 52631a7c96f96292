"""Evaluation under shift: every (corruption, level) of a suite as a normal evaluation, and their summary.

``evaluate.py ckpt=<run> shift=rood_mri`` (configs/shift/): after the clean evaluation of ``<eval dir>``
(level 0; an existing one of the same checkpoint, protocol and predictor is reused, not recomputed),
each condition is evaluated by the one inference path into ``<eval dir>/shift/<corruption>/<level>/``
(per_case.csv, summary.json, provenance.json with the corruption, its level, parameters, the suite's seed
and every case's seed and draws). The cases are corrupted as read, before preprocessing and normalisation
(:meth:`mcseg.data.base.SegmentationDataset.corrupted`, :mod:`mcseg.data.shift`).

``<eval dir>/shift_summary.json`` (and ``.md``) holds, per predictor (the raw one and each post-hoc
scaler), for every directional figure the table of figures shows under shift (``shift_metrics``: Dice, HD95,
ECE, classwise ECE, smooth ECE, NLL; failure detection where evaluated) the value per corruption and level and ROOD-MRI's robustness scores (:mod:`mcseg.metrics.robustness`), over every
condition of the suite in ``<eval dir>/shift/`` of the same checkpoint, protocol and members: an earlier subset's
conditions stay in it (:func:`add_conditions_on_disk`).

A condition evaluated before with the same definition, seed, checkpoint and protocol is reused (an
interrupted suite resumes); one of another definition is refused unless ``overwrite=true``.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, fields
from pathlib import Path

from mcseg.data.base import SegmentationDataset
from mcseg.data.cases import CaseData, CaseRef
from mcseg.files import atomic_write, write_json
from mcseg.data.shift import Corruption, ShiftConfig, case_seed, corruption
from mcseg.evaluation.split import clear_evaluation, evaluate_split
from mcseg.evaluation.evaluator import Evaluator
from mcseg.config import EvalProtocol
from mcseg.evaluation.figure_table import shown_in
from mcseg.errors import ConfigError
from mcseg.metrics.robustness import level_weights, suite_robustness

log = logging.getLogger(__name__)

SHIFT_DIR = "shift"
SUMMARY_FILE = "shift_summary.json"
TABLE_FILE = "shift_summary.md"


def shift_metrics() -> dict[str, tuple[str, bool]]:
    """The per-case figures under shift (the table of figures' "shift"): metric -> (summary key, higher is better).
    Only a directional figure (:attr:`Figure.directional`) has robustness scores: one whose best value is zero
    (signed ECE) stays out."""
    return {f.key: (f.summary_key, f.better > 0) for f in shown_in("shift") if f.per != "split" and f.directional}


def failure_metrics() -> dict[str, tuple[tuple[str, ...], bool]]:
    """Failure detection of the predictive entropy under shift, where the evaluation has it: <key>_pe -> (path in
    the summary, higher is better)."""
    return {f"{f.key}_pe": (f.path, f.better > 0) for f in shown_in("shift") if f.per == "split" and f.directional}


def shift_digits(metric: str) -> int:
    """The digits of a metric of :func:`shift_metrics` or :func:`failure_metrics` in the shift tables: a figure
    the table of figures shows with fewer than 3 digits (a distance in mm) keeps them; the others get 4, one more
    than the report's, as a level's change is small."""
    declared = next((f for f in shown_in("shift") if metric in (f.key, f"{f.key}_pe")), None)
    return declared.digits if declared is not None and declared.digits < 3 else 4


class CaseCorruption:
    """``raw case -> corrupted raw case`` with the case's own seed; records each case's seed and draws."""

    def __init__(self, corruption_: Corruption, seeds: dict[str, int], record: dict[str, dict]) -> None:
        self.corruption, self.seeds, self.record = corruption_, seeds, record

    def __call__(self, case: CaseData) -> CaseData:
        out, drawn = self.corruption(case, self.seeds[case.case_id])
        self.record[case.case_id] = drawn
        return out


def _protocol_record(dataset: SegmentationDataset, protocol: EvalProtocol, multilabel: bool) -> dict:
    from mcseg.evaluation.evaluator import _json_safe

    evaluator = Evaluator(dataset.num_classes, dataset.class_names, protocol, multilabel)
    return json.loads(json.dumps(_json_safe(evaluator.protocol_description())))


# Every key of the evaluation protocol at its default, as a summary records it (JSON).
PROTOCOL_DEFAULTS = json.loads(json.dumps(asdict(EvalProtocol())))


def _same_origin(summary: dict, sha256: str, protocol: dict, inference: dict | None) -> str | None:
    """What differs between an earlier summary and this evaluation (checkpoint, protocol, members), or None."""
    prov = summary.get("provenance") or {}
    if (prov.get("checkpoint") or {}).get("sha256", sha256) != sha256:
        return f"checkpoint sha256 {prov['checkpoint']['sha256'][:8]}, not {sha256[:8]}"
    def numbers(record: dict | None) -> dict:  # what the figures depend on, not which files are written
        # a summary written before a protocol key existed (failure_region and failure_risk, the rater_* keys)
        # was computed with that key's default
        record = {**PROTOCOL_DEFAULTS, **(record or {})}
        return {k: v for k, v in record.items() if k not in ("figures", "save_uncertainty")}

    stored, requested = numbers(summary.get("protocol")), numbers(protocol)
    if stored != requested:
        keys = [k for k in sorted(stored.keys() | requested.keys()) if stored.get(k) != requested.get(k)]
        named = {f.name for f in fields(EvalProtocol)}
        return "another evaluation protocol (" + "; ".join(
            f"{'evaluation.' if k in named else 'protocol.'}{k}: {stored.get(k)!r} stored, {requested.get(k)!r} "
            f"requested" for k in keys) + ")"
    if inference is not None and prov.get("inference") is not None:
        keys = ("mirror_axes", "mc_samples", "tta", "tta_noise_std", "member_seed")
        if any(prov["inference"].get(k) != inference.get(k) for k in keys):
            return "other members or mirroring"
    return None


def clean_to_reuse(out_dir: Path, dataset: SegmentationDataset, protocol: EvalProtocol, multilabel: bool,
                   sha256: str, inference: dict, scalers) -> dict:
    """The clean evaluation already in ``out_dir`` (level 0), checked to be of this checkpoint, protocol,
    members and post-hoc scalers; otherwise one line that says to pass overwrite=true."""
    summary = json.loads((out_dir / "summary.json").read_text())
    why = _same_origin(summary, sha256, _protocol_record(dataset, protocol, multilabel), inference)
    missing = sorted(set(scalers) - set(summary.get("posthoc") or {}))
    if missing:
        why = f"it was made without the post-hoc scaler(s) {missing}"
    if why:
        raise FileExistsError(f"{out_dir / 'summary.json'} (the clean evaluation, level 0 of the shift suite) "
                              f"differs from this one: {why}; pass overwrite=true to evaluate it anew")
    log.info("shift: level 0 is the clean evaluation already in %s (not recomputed)", out_dir)
    return summary


def condition_record(shift: ShiftConfig, c: Corruption, seeds: dict[str, int]) -> dict:
    return {"suite": shift.suite, **c.record(), "seed": shift.seed,
            "case_seed": "31 bits of sha256('<seed>/<case>/<corruption>/<level>') (mcseg.data.shift.case_seed)",
            "applied": "to the raw case as read, before preprocessing and normalisation",
            **({"torchio": _version("torchio")} if c.record()["library"] == "torchio" else {}),
            "case_seeds": dict(seeds)}


def _version(distribution: str) -> str:
    from importlib import metadata

    return metadata.version(distribution)


def evaluate_shift(shift: ShiftConfig, predictor, dataset: SegmentationDataset, refs: list[CaseRef],
                   protocol: EvalProtocol, out_dir: Path, clean: dict, provenance: dict, scalers=None,
                   per_network=None, overwrite: bool = False) -> dict:
    """Evaluate every condition of ``shift`` into ``out_dir/shift/<corruption>/<level>/`` and write the shift
    summary; returns it. ``clean`` is the level-0 summary of ``out_dir``."""
    sha = (provenance.get("checkpoint") or {}).get("sha256") or (provenance.get("ensemble") or "")
    protocol_record = _protocol_record(dataset, protocol, predictor.multilabel)
    summaries: dict[str, dict[int, dict]] = {}
    total = len(shift.corruptions) * len(shift.levels)
    started = time.perf_counter()
    for i, name in enumerate(shift.corruptions):
        spec = shift.definitions[name]
        summaries[name] = {0: clean}
        for j, level in enumerate(shift.levels):
            c = corruption(name, spec, level)
            seeds = {r.case_id: case_seed(shift.seed, r.case_id, name, level) for r in refs}
            record = condition_record(shift, c, seeds)
            cond = out_dir / SHIFT_DIR / name / str(level)
            done = cond / "summary.json"
            if done.exists():
                earlier = json.loads(done.read_text())
                before = {k: v for k, v in ((earlier.get("provenance") or {}).get("shift") or {}).items()
                          if k != "cases"}
                why = _same_origin(earlier, sha, protocol_record, None) or (
                    None if before == json.loads(json.dumps(record)) else "another definition or seed")
                if why is None and not overwrite:
                    log.info("shift: %s level %d already evaluated in %s (reused)", name, level, cond)
                    summaries[name][level] = earlier
                    continue
                if not overwrite:
                    raise FileExistsError(f"{done} exists with {why}: pass overwrite=true to replace it")
                clear_evaluation(cond)
            drawn: dict[str, dict] = {}
            view = dataset.corrupted(CaseCorruption(c, seeds, drawn))
            prov = {**provenance, "output_dir": str(cond), "clean_evaluation": str(out_dir),
                    "shift": {**record, "cases": drawn}}
            log.info("shift %d/%d: %s level %d %s", i * len(shift.levels) + j + 1, total, name, level, c.params)
            summaries[name][level] = evaluate_split(predictor, view, refs, protocol, cond, shift.save_predictions,
                                                    shift.save_probabilities, scalers, prov, progress=False,
                                                    per_network=per_network)
    names = [*(scalers or {}), *(per_network or {})]
    add_conditions_on_disk(shift, summaries, out_dir, refs, clean, sha, protocol_record,
                           inference_record(predictor), names)
    result = shift_summary(shift, summaries, names)
    result["output_dir"], result["clean_evaluation"] = str(out_dir / SHIFT_DIR), str(out_dir)
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_json(out_dir / SUMMARY_FILE, result)
    atomic_write(out_dir / TABLE_FILE, lambda tmp: tmp.write_text(shift_table(result)))
    log.info("shift summary written to %s", out_dir / SUMMARY_FILE)
    return result


def add_conditions_on_disk(shift: ShiftConfig, summaries: dict[str, dict[int, dict]], out_dir: Path,
                           refs: list[CaseRef], clean: dict, sha: str, protocol_record: dict, inference: dict,
                           scaler_names) -> None:
    """Add to ``summaries`` the conditions of ``shift``'s suite already in ``out_dir/shift/`` (an earlier
    subset): the summary covers every condition on disk of the same checkpoint, protocol, members, definition
    and seed. One that differs is left out with a warning; another suite's conditions are left alone."""
    for done in sorted((out_dir / SHIFT_DIR).glob("*/*/summary.json")):
        name, level = done.parent.parent.name, done.parent.name
        if not level.isdigit() or int(level) < 1 or int(level) in summaries.get(name, {}) \
                or name not in shift.definitions:
            continue
        level = int(level)
        earlier = json.loads(done.read_text())
        before = {k: v for k, v in ((earlier.get("provenance") or {}).get("shift") or {}).items() if k != "cases"}
        if before.get("suite") != shift.suite:
            continue
        try:
            c = corruption(name, shift.definitions[name], level)
        except (ConfigError, IndexError, ValueError) as exc:
            log.warning("shift: %s is left out of the summary: level %d is not in suite %s (%s)", done.parent, level,
                        shift.suite, exc)
            continue
        record = condition_record(shift, c, {r.case_id: case_seed(shift.seed, r.case_id, name, level) for r in refs})
        missing = sorted(set(scaler_names) - set(earlier.get("posthoc") or {}))
        why = _same_origin(earlier, sha, protocol_record, inference) or (
            None if before == json.loads(json.dumps(record)) else "another definition or seed") or (
            f"without the post-hoc scaler(s) {missing}" if missing else None)
        if why:
            log.warning("shift: %s is left out of the summary: it was evaluated with %s", done.parent, why)
            continue
        log.info("shift: %s level %d, evaluated earlier in %s, is in the summary", name, level, done.parent)
        summaries.setdefault(name, {0: clean})[level] = earlier


def _get(summary: dict, path) -> float | None:
    value = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def shift_summary(shift: ShiftConfig, summaries: dict[str, dict[int, dict]], scaler_names=()) -> dict:
    """The values per predictor, metric, corruption and level, and their robustness scores."""
    predictors: dict[str, dict] = {}
    for predictor in ("raw", *scaler_names):
        metrics = {}
        failure = failure_metrics()
        wanted = {m: ((key,), hib) for m, (key, hib) in shift_metrics().items()}
        if predictor == "raw":
            wanted.update(failure)
        for metric, (path, higher) in wanted.items():
            def value(s, path=path):
                return _get(s, path) if predictor == "raw" else _get((s.get("posthoc") or {}).get(predictor) or {},
                                                                     path)
            table = {name: {level: value(s) for level, s in levels.items()} for name, levels in summaries.items()}
            if all(v is None for t in table.values() for v in t.values()):
                continue  # not evaluated (evaluation.failure_detection=false), or not scored on this kind of task
            scores = suite_robustness(table, higher, shift.alpha)
            metrics[metric] = {"higher_is_better": higher, "values": {n: {str(k): v for k, v in t.items()}
                                                                       for n, t in table.items()},
                               "overall": scores["overall"], "degradation": scores["degradation"],
                               "corruptions_scored": scores["corruptions_scored"],
                               "per_corruption": scores["per_corruption"]}
        predictors[predictor] = metrics
    levels = sorted({int(s) for by_level in summaries.values() for s in by_level} - {0})
    return {"suite": shift.suite, "seed": shift.seed, "corruptions": list(summaries),
            "levels": [0, *levels], "corruption_levels": {n: sorted(t) for n, t in summaries.items()},
            "alpha": shift.alpha,
            "level_weights": {str(k): v for k, v in level_weights(levels, shift.alpha).items()},
            "scores": "ROOD-MRI (Boone et al. 2023): overall = (m0 + sum w_s m_s) / (1 + sum w_s); degradation = "
                      "sum w_s (m0 - m_s) / sum w_s (higher is better; m_s - m0 otherwise), w_s = alpha^s, over "
                      "the levels evaluated, then averaged over corruptions; m_s: mean over cases",
            "definitions": {n: {"kind": shift.definitions[n].kind, "levels": dict(shift.definitions[n].levels),
                                "fixed": dict(shift.definitions[n].fixed)} for n in summaries},
            "predictors": predictors}


def _f(v, digits=4) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def shift_table(result: dict) -> str:
    """shift_summary.md: per predictor and metric, corruptions by level, with the robustness scores."""
    levels = [str(s) for s in result["levels"]]
    lines = [f"# Evaluation under shift: suite {result['suite']}, seed {result['seed']}", "",
             f"Levels {', '.join(levels)} (0: clean); robustness scores with level weights "
             f"{', '.join(f'{k}: {v:.4g}' for k, v in result['level_weights'].items())}. {result['scores']}.", ""]
    for predictor, metrics in result["predictors"].items():
        for metric, entry in metrics.items():
            digits = shift_digits(metric)
            arrow = "higher is better" if entry["higher_is_better"] else "lower is better"
            lines += [f"## {predictor}: {metric} ({arrow})", "",
                      "| corruption | " + " | ".join(f"level {s}" for s in levels) + " | overall | degradation |",
                      "|---" * (len(levels) + 3) + "|"]
            for name, values in entry["values"].items():
                per = entry["per_corruption"][name]
                lines.append(f"| {name} | " + " | ".join(_f(values.get(s), digits) for s in levels)
                             + f" | {_f(per['overall'], digits)} | {_f(per['degradation'], digits)} |")
            lines += [f"| mean over {entry['corruptions_scored']} corruptions | " + " | ".join("" for _ in levels)
                      + f" | {_f(entry['overall'], digits)} | {_f(entry['degradation'], digits)} |", ""]
    return "\n".join(lines)


def inference_record(predictor) -> dict:
    """How the predictor makes its logits, as evaluate_split records it in provenance.inference."""
    cfg = predictor.cfg
    return {"mirror_axes": list(cfg.mirror_axes), "mc_samples": cfg.mc_samples, "tta": list(cfg.tta),
            "tta_noise_std": cfg.tta_noise_std, "member_seed": cfg.member_seed}


def mean_over_corruptions(values: dict[str, dict[str, float | None]], level: str) -> float | None:
    """``mean_c m_c(level)`` of a metric's ``values`` (corruption -> level -> value, as in shift_summary.json),
    over the corruptions with a value at that level; None when none has one."""
    have = [v[level] for v in values.values() if v.get(level) is not None]
    return sum(have) / len(have) if have else None


def format_shift(result: dict) -> str:
    """A plain-text digest: per metric of the raw predictor, the mean over corruptions per level and the scores."""
    levels = [str(s) for s in result["levels"]]
    lines = [f"== shift suite {result['suite']} ({len(result['corruptions'])} corruptions, levels "
             f"{', '.join(levels)}) -> {result['output_dir']} =="]
    lines.append(f"{'metric':<16}" + "".join(f"{'L' + s:>9}" for s in levels) + f"{'overall':>10}{'degrad.':>10}")
    for metric, entry in result["predictors"]["raw"].items():
        means = [mean_over_corruptions(entry["values"], s) for s in levels]
        lines.append(f"{metric:<16}" + "".join(f"{_f(m):>9}" for m in means)
                     + f"{_f(entry['overall']):>10}{_f(entry['degradation']):>10}")
    return "\n".join(lines)
