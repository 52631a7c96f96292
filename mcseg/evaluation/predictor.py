"""One evaluation of a predictor, whatever it is made of: a checkpoint is an ensemble of one.

Every evaluation of a predictor comes here: :func:`mcseg.evaluation.checkpoint.evaluate_checkpoint` and
:func:`mcseg.evaluation.ensemble.evaluate_ensemble` (``evaluate.py``), a run's own test evaluation after its
training (:func:`mcseg.train.evaluate_test`) and the post-hoc study (``scripts/posthoc_study.py``). Each resolves
what is specific to its origin (the checkpoint's path, split, run and output folder; the members' identities and
agreement; a training's own record of its data) into an :class:`Evaluation` of :class:`Member` s and says what to
write (:class:`Outputs`). This module does the rest the same way for all:

* the post-hoc plan (:func:`plan_posthoc`, before anything is written or cleared): pooled before (the default),
  one fit of the pooled prediction; ``posthoc.pool=after``, each member's own fit, applied before pooling;
* which scored cases the networks saw in training and the provenance record
  (:func:`mcseg.evaluation.provenance.evaluation_provenance`);
* the scalers (on record, or fitted now on the checkpoint's own validation split), the evaluation of the split
  or the clean one reused as a shift suite's level 0, and the shift suite.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from mcseg.calibration import CALIBRATION_FILE, PosthocConfig, Scaler, fit_posthoc, load_calibration, scalers_to_apply
from mcseg.config import EvalProtocol, typed
from mcseg.data.base import SegmentationDataset
from mcseg.data.build import build_dataset
from mcseg.data.shift import ShiftConfig
from mcseg.evaluation.provenance import content_record, dataset_identity, evaluation_provenance
from mcseg.evaluation.shift import clean_to_reuse, evaluate_shift, format_shift, inference_record
from mcseg.evaluation.split import evaluate_split, format_summary
from mcseg.files import undone_on_failure

if TYPE_CHECKING:  # imported where a conformal pass runs: it costs every evaluation without one its start-up
    from mcseg.evaluation.conformal import ConformalConfig

log = logging.getLogger(__name__)

__all__ = ["Member", "Evaluation", "Outputs", "PosthocPlan", "plan_posthoc", "posthoc_scalers", "plan_members",
           "evaluate_predictor"]


@dataclass
class PosthocPlan:
    """What :func:`plan_posthoc` found: the scalers on record (loaded), or the fit to make and where it goes."""

    scalers: dict[str, Scaler]
    fit: PosthocConfig | None = None  # a fit to make now (its ``apply`` are the scalers returned)
    fit_into: Path | None = None  # the fit is saved in <fit_into>/calibration.json
    cases: Iterable | None = None  # the loaded cases to fit on (a training's validation cases); None: the own split


@dataclass(frozen=True)
class Outputs:
    """What an evaluation writes and runs beyond its tables, as its entry point's config says.

    ``dicom_stops``: a DICOM export that fails fails the evaluation (``evaluate.py``), or is logged and left out
    while the evaluation stands (a run's own test evaluation, after hours of training)."""

    predictions: bool
    probabilities: bool
    conformal: ConformalConfig | None = None  # None (or not enabled): no conformal pass
    dicom: bool = False
    dicom_stops: bool = True
    overwrite: bool = False  # a shift suite replaces its earlier levels

    @classmethod
    def of_evaluate(cls, cfg: DictConfig) -> "Outputs":
        """``evaluate.py``'s keys (configs/evaluate.yaml)."""
        from mcseg.evaluation.conformal import conformal_config

        return cls(bool(cfg.save_predictions), bool(cfg.save_probabilities), conformal_config(cfg),
                   bool(cfg.get("save_dicom")), True, bool(cfg.get("overwrite")))


def plan_posthoc(cfg: DictConfig, own_split: dict | None, where: Path, checkpoint: dict,
                 evaluation_dir: Path | None = None) -> PosthocPlan:
    """Every check that can refuse the scalers of ``cfg.posthoc.apply``, before anything is written or cleared:
    ``<where>/calibration.json`` is read (by the checkpoint's sha256) and its scalers loaded (LTS weights
    included); a fit it lacks needs the checkpoint's own validation split.

    A fit on record is never replaced: the run's evaluations were made with it. A new fit of a checkpoint
    that ``<where>/calibration.json`` already holds (``posthoc.refit=true``, a scaler the recorded fit
    lacks, or a file that cannot be read) goes with this evaluation, to ``<evaluation_dir>/calibration.json``,
    and the log says so.
    """
    posthoc = typed(cfg.posthoc, PosthocConfig, "posthoc")
    if not posthoc.apply:
        return PosthocPlan({})
    try:
        recorded = load_calibration(where, checkpoint["sha256"])
        on_record = recorded is not None
    except ValueError:  # an unreadable calibration.json: left as it is when refitting
        if not posthoc.refit:
            raise
        recorded, on_record = None, True
    record = None if posthoc.refit else recorded
    if record is not None and not set(posthoc.apply) - set(record.get("scalers", {})):
        return PosthocPlan(scalers_to_apply(record, posthoc.apply, where))
    if own_split is None:
        raise ValueError(f"posthoc.apply={posthoc.apply}: fitting needs the validation split of "
                         f"{checkpoint['path']}, which neither the checkpoint nor a run directory holds: "
                         f"pass posthoc.apply=[]")
    if on_record and evaluation_dir is not None and Path(evaluation_dir) != Path(where):
        log.warning("%s already holds a post-hoc fit of %s, which the run's evaluations used: the new fit "
                    "goes to %s and that record is left as it is", Path(where) / CALIBRATION_FILE,
                    checkpoint["path"], Path(evaluation_dir) / CALIBRATION_FILE)
        where = Path(evaluation_dir)
    return PosthocPlan({}, replace(posthoc, fit=sorted(set(posthoc.fit) | set(posthoc.apply))), Path(where))


def posthoc_scalers(plan: PosthocPlan, run_cfg: DictConfig, own_split: dict | None, own: SegmentationDataset | None,
                    predictor, checkpoint: dict, provenance: dict,
                    protocol: EvalProtocol | None = None) -> dict[str, Scaler]:
    """The scalers :func:`plan_posthoc` planned: those on record, else fitted now on the checkpoint's own
    validation split (also when evaluating another dataset) and saved where the plan says."""
    if plan.fit is None:
        return plan.scalers
    cases = plan.cases
    if cases is None:
        own = own or build_dataset(run_cfg.dataset)
        by_id = {r.case_id: r for r in own.case_refs()}
        refs = [by_id[c] for c in own_split["val"] if c in by_id]
        own.prepare(refs)
        cases = (own.load(r) for r in refs)
    record = fit_posthoc(predictor, cases, plan.fit, plan.fit_into, checkpoint, provenance, protocol)
    return scalers_to_apply(record, plan.fit.apply, plan.fit_into)



@dataclass
class Member:
    """A network of the predictor: its predictor, the checkpoint identity its post-hoc fit is recorded under,
    and where that record is (``calibration.json`` of its run, or of the evaluation's folder)."""

    predictor: object
    fit_identity: dict
    home: Path


@dataclass
class Evaluation:
    """What a caller resolved for one evaluation (module docstring)."""

    predictor: object  # the pooled predictor: a checkpoint's own, or the ensemble
    members: list[Member]
    pooled: Member  # the pooled predictor's fit: its identity and home (pooled before)
    dataset: SegmentationDataset
    refs: list  # the cases scored
    split: str  # the split's name
    split_source: str
    all_ids: list[str]  # every case of the dataset's split (its identity)
    out_dir: Path
    origin: dict  # provenance keys naming the predictor
    state: dict  # the stored state of (the first) checkpoint: its training data and content
    run_cfg: DictConfig
    checkpoint: Path  # (the first) checkpoint's file
    own_split: dict | None  # its split's case ids (None: none stored)
    own_dataset: SegmentationDataset | None  # its own data for a fit (None: build it from its config)
    content_split: str | None  # the split scored when it is the checkpoint's own, None on other data
    overrides: list[str]
    environment: dict
    identity_sha: str  # the predictor's hash (a reused level 0 must be of it)
    label: str  # how the console title names the predictor
    fit_extra: dict = field(default_factory=dict)  # more provenance for the pooled fit (an ensemble's members)
    shift_extra: dict = field(default_factory=dict)  # more provenance for the shift suite
    log_figure: Callable[[str, object], None] | None = None  # gets the conformal overlays (a run's trackers)
    # what the caller knows already, else read from the dataset and the checkpoint's stored state: the scored
    # dataset's identity (dataset_identity of all_ids) and which scored cases it saw in training (content_record)
    dataset_record: dict | None = None
    content: dict | None = None


def plan_members(cfg: DictConfig, own_split: dict | None, members: list[Member], pooled: Member, fit_dir: Path,
                 pool_after: bool) -> list[PosthocPlan]:
    """The post-hoc plans (:func:`plan_posthoc`), before anything is written or cleared: one per member pooled
    after, else one of the pooled prediction."""
    from mcseg.evaluation.conformal import check_conformal, conformal_config

    check_conformal(conformal_config(cfg), str(cfg.split), own_split)
    return [plan_posthoc(cfg, own_split, m.home, m.fit_identity, evaluation_dir=fit_dir)
            for m in (members if pool_after else [pooled])]


def evaluate_predictor(ev: Evaluation, plans: list[PosthocPlan], protocol: EvalProtocol, outputs: Outputs,
                       reuse: bool = False, shift: ShiftConfig | None = None, pool_after: bool = False) -> dict:
    """Provenance, scalers, the evaluation (or the reused clean one), its conformal pass, its DICOM export and the
    shift suite (module docstring)."""
    provenance = evaluation_provenance(
        ev.origin, {"name": ev.split, "source": ev.split_source, "cases": [r.case_id for r in ev.refs]},
        ev.dataset_record if ev.dataset_record is not None else dataset_identity(ev.dataset, ev.all_ids),
        ev.state.get("dataset") or {"name": ev.run_cfg.dataset.get("name")}, ev.predictor, ev.overrides,
        ev.out_dir, ev.environment,
        ev.content if ev.content is not None
        else content_record(ev.checkpoint, ev.state, ev.dataset, ev.refs, ev.split, ev.content_split))
    fit_provenance = {"dataset": provenance["trained_on"], "overrides": list(ev.overrides)}
    if pool_after:
        fits = [posthoc_scalers(plan, ev.run_cfg, ev.own_split, ev.own_dataset, m.predictor.plain(), m.fit_identity,
                                fit_provenance, protocol) for plan, m in zip(plans, ev.members)]
        scalers, per_network = {}, {name: [f[name] for f in fits] for name in fits[0]}
    else:
        scalers = posthoc_scalers(plans[0], ev.run_cfg, ev.own_split, ev.own_dataset, ev.predictor,
                                  ev.pooled.fit_identity, {**fit_provenance, **ev.fit_extra}, protocol)
        per_network = None
    # a failure from here to the end of the conformal pass removes what it wrote into the evaluation's folder: no
    # summary.json without its conformal pass refuses the corrected command (a shift suite keeps its level 0)
    with undone_on_failure(ev.out_dir):
        if reuse:
            summary = clean_to_reuse(ev.out_dir, ev.dataset, protocol, ev.predictor.multilabel, ev.identity_sha,
                                     inference_record(ev.predictor), {**scalers, **(per_network or {})})
        else:
            summary = evaluate_split(ev.predictor, ev.dataset, ev.refs, protocol, ev.out_dir, outputs.predictions,
                                     outputs.probabilities, scalers, provenance, per_network=per_network)
            print(format_summary(summary, ev.dataset.class_names,
                                 title=f"{ev.dataset.name} {ev.split} split ({ev.label}) -> {ev.out_dir}"))
        if outputs.conformal is not None and outputs.conformal.enabled:
            from mcseg.evaluation.conformal import check_conformal, conformal_pass

            check_conformal(outputs.conformal, ev.split, ev.own_split)
            own = ev.own_dataset or build_dataset(ev.run_cfg.dataset)
            by_id = {r.case_id: r for r in own.case_refs()}
            summary = conformal_pass(outputs.conformal, ev.predictor, own, [by_id[c] for c in ev.own_split["val"]],
                                     ev.dataset, ev.refs, scalers, ev.out_dir, provenance, summary, ev.log_figure)
    if outputs.dicom:  # after the conformal pass: its masks are exported too (docs/report_html.md)
        export_dicom(ev, summary, outputs.dicom_stops)
    if shift is not None:
        summary = {**summary, "shift": evaluate_shift(shift, ev.predictor, ev.dataset, ev.refs, protocol, ev.out_dir,
                                                      summary, {**provenance, **ev.shift_extra}, scalers, per_network,
                                                      outputs.overwrite)}
        print(format_shift(summary["shift"]))
    return summary


def export_dicom(ev: Evaluation, summary: dict, stops: bool) -> None:
    """The scored cases as DICOM into ``<out_dir>/dicom``, each over its own image file
    (:mod:`mcseg.evaluation.dicom_cases`). Unless ``stops``, a case that cannot be written (no image file, another
    grid) is logged with the reason and left out: the evaluation stands."""
    from mcseg.evaluation.dicom import DicomError
    from mcseg.evaluation.dicom_cases import export_evaluation

    images = {r.case_id: Path(r.image_paths[0]) for r in ev.refs if r.image_paths}
    try:
        written = export_evaluation(ev.out_dir, summary, images)
    except (DicomError, OSError) as exc:
        if stops:
            raise
        log.error("save_dicom: %s", exc)
        return
    print(f"DICOM: {len(written)} objects in {ev.out_dir / 'dicom'}")
