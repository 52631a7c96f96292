"""What produced a result: a checkpoint's identity (path, sha256, epoch), a dataset's identity, a split.

Training stores the split's case ids and the dataset's identity in every checkpoint
(``Trainer.provenance``); every evaluation writes them, with the checkpoint's hash and the
overrides it was run with, into ``summary.json`` (key ``provenance``) and ``provenance.json``
beside ``per_case.csv``.
"""
from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

from mcseg.data.base import SegmentationDataset
from mcseg.data.fingerprint import file_digest as file_sha256  # a checkpoint's sha256, read in 1 MiB chunks
from mcseg.data.fingerprint import case_fingerprints, seen_in, split_content_sha256, split_fingerprints

log = logging.getLogger(__name__)


def checkpoint_identity(path: str | Path, state: dict, sha256: str | None = None) -> dict:
    """Path, sha256 and epoch of a checkpoint file (``sha256`` when already computed)."""
    return {"path": str(Path(path).resolve()), "sha256": sha256 or file_sha256(path),
            "epoch": state.get("epoch"), "best_epoch": state.get("best_epoch")}


def split_case_ids(refs: dict) -> dict[str, list[str]]:
    """``{"train": [...], "val": [...], "test": [...]}`` case ids of a split of case references."""
    return {name: [r.case_id for r in part] for name, part in refs.items()}


def dataset_identity(dataset: SegmentationDataset, case_ids: list[str], content: dict | None = None) -> dict:
    """Name, root, classes, channels, a hash of the case ids (``cases_sha256``: names only) and, given the
    split's content fingerprints (:func:`mcseg.data.fingerprint.split_fingerprints`), ``content_sha256``:
    which content is in which part of the split, the identity reports tell datasets apart by."""
    ids = sorted(case_ids)
    root = getattr(dataset, "root", None)
    identity = {
        "name": dataset.name, "root": str(root) if root is not None else None,
        "n_cases": len(ids), "cases_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
        "num_classes": dataset.num_classes, "class_names": list(dataset.class_names),
        "in_channels": dataset.in_channels, "multilabel": bool(dataset.multilabel),
        # cases with several raters: which hard label the single-label figures score (mcseg.data.raters)
        "raters_target": dataset.raters["target"],
    }
    if content is not None:
        identity["content_sha256"] = split_content_sha256(content)
    return identity


def hydra_overrides() -> list[str]:
    """The command-line overrides of the running Hydra job ([] outside one)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def content_lookup(dataset: SegmentationDataset):
    """``content_of(ids by split) -> fingerprints by split`` over ``dataset`` (cases it lacks left out), for
    :func:`mcseg.training.relaunch.check_launch`."""

    def content_of(ids_by_split: dict[str, list[str]]) -> dict[str, dict[str, str]]:
        by_id = {r.case_id: r for r in dataset.case_refs()}
        return split_fingerprints(dataset, {name: [by_id[c] for c in ids if c in by_id]
                                            for name, ids in ids_by_split.items()})

    return content_of


def warn_shared_content(content: dict[str, dict[str, str]], where: str) -> dict[str, dict[str, str]]:
    """Validation or test cases with the content of a training case (a scan copied under two names):
    warned of, and returned as ``{part: {case: training case}}``."""
    shared = {part: hits for part in ("val", "test")
              for hits in [seen_in(content, content.get(part, {}), ("train",)).get("train", {})] if hits}
    for part, hits in shared.items():
        pairs = ", ".join(f"{case} = {train}" for case, train in list(hits.items())[:5])
        log.warning("%s: %d %s case(s) have the content of a training case (%s%s): their figures are not of "
                    "unseen data", where, len(hits), part, pairs, " ..." if len(hits) > 5 else "")
    return shared


def classes_unseen_in_training(foreground_points: list[dict], class_names: list[str], multilabel: bool) -> list[str]:
    """Foreground classes (regions) with no voxel in the training split, from the sampler's per-case
    foreground points (:class:`mcseg.data.sampling.PatchDataset`); warned of by name."""
    seen = {k for points in foreground_points for k, v in points.items() if len(v)}
    names = list(class_names)
    indices = range(1, len(names) + 1) if multilabel else range(1, len(names))
    unseen = [names[k - 1] if multilabel else names[k] for k in indices if k not in seen]
    for name in unseen:
        log.warning("class %r has no voxel in the training split (%d cases): the model never saw it, and its "
                    "figures are marked in summary.json (provenance.classes_unseen_in_training)", name,
                    len(foreground_points))
    return unseen


# Resolved-config keys that do not change what a run computes: where files go, logging, workers and caches,
# resuming, the seed (runs of one configuration differ in it), the data's location (the data are told apart
# by their content: dataset_identity's content_sha256) and the device (recorded in the environment record).
RESULT_NEUTRAL = (
    "seed", "paths", "hydra", "logger", "task_name", "tags", "trainer.device", "trainer.resume", "trainer.auto_resume",
    "trainer.progress_bar", "trainer.log_every_n_steps", "trainer.checkpoint_every_n_steps", "dataset.root",
    "dataset.split.file", "dataset.sampling.num_workers", "dataset.preprocess.cache", "dataset.preprocess.cache_dir",
    "dataset.preprocess.workers", "inference.save_predictions", "inference.save_probabilities",
    "inference.save_dicom",
)


def configuration_sha256(config: dict) -> str:
    """A hash of what a run ran: its resolved config without :data:`RESULT_NEUTRAL`, so that a sweep that
    spells out a default (``optim.lr=0.001``) and one that does not are one configuration."""
    import json

    def strip(node, prefix: str):
        if not isinstance(node, dict):
            return node
        return {k: strip(v, f"{prefix}{k}.") for k, v in sorted(node.items())
                if f"{prefix}{k}" not in RESULT_NEUTRAL}

    return hashlib.sha256(json.dumps(strip(config, ""), sort_keys=True, default=str).encode()).hexdigest()[:16]


def scored_content(ckpt: Path, state: dict, dataset: SegmentationDataset, refs: list, own_split: str | None
                   ) -> tuple[dict[str, dict[str, str]], list[str], dict[str, str]]:
    """Which scored cases are, by content, cases the checkpoint was trained or validated on
    (``{part: {scored case: the checkpoint's case}}``; by their images alone where the checkpoint recorded
    theirs, ``inputs``, so a copy labelled otherwise, a single-rater copy of cases with raters, is found; on its own split the part scored itself is not
    counted), and which cases of its own split now hold other content than it recorded; both warned of
    loudly; and the scored cases' fingerprints. A checkpoint that recorded no content (older versions, or
    stripped) is compared by case id with the split it stored, and the log says that content was not checked
    (``provenance.content_checked``)."""
    scored = case_fingerprints(dataset, refs)
    recorded = state.get("content")
    if not recorded:
        ids = {part: set(cases) for part, cases in (state.get("split") or {}).items()}
        seen = {part: {c: c for c in scored if c in ids.get(part, ())} for part in ("train", "val")
                if own_split not in (part, "all")}
        seen = {part: hits for part, hits in seen.items() if hits}
        found = "; ".join(f"{len(h)} are ids of its {part} split ({', '.join(list(h)[:5])}"
                          f"{' ...' if len(h) > 5 else ''})" for part, h in seen.items())
        log.warning("WARNING: %s has no content fingerprints (an older or stripped checkpoint): the %d scored cases "
                    "were compared with its split by case id only, content not checked: %s", ckpt, len(refs),
                    found + " (recorded in provenance.seen_in_training)" if found else "none is one of its training "
                    "or validation cases by name, but a copy under another name would not be found")
        return seen, [], scored
    # by the images where the checkpoint recorded theirs: the same scans, whatever their labels or raters
    by_images = state.get("inputs")
    found = seen_in(by_images, case_fingerprints(dataset, refs, inputs=True)) if by_images else seen_in(recorded, scored)
    seen = {part: hits for part, hits in found.items() if own_split not in (part, "all")}
    for part, hits in seen.items():
        pairs = ", ".join(f"{case} = {theirs}" for case, theirs in list(hits.items())[:5])
        log.warning("WARNING: %d of the %d scored cases are, by content, cases of %s's %s split (%s%s): their "
                    "figures are not of unseen data (recorded in provenance.seen_in_training)", len(hits), len(refs),
                    ckpt, part, pairs, " ..." if len(hits) > 5 else "")
    changed = []
    own = {c: fp for part in recorded.values() for c, fp in part.items()} if own_split == "all" \
        else recorded.get(own_split) if own_split else None
    if own:
        changed = sorted(c for c, fp in scored.items() if own.get(c) not in (None, fp))
        if changed:
            log.warning("WARNING: %d scored case(s) differ in content from the %s cases %s recorded at training "
                        "(%s): dataset.root holds other data under the same names", len(changed), own_split, ckpt,
                        ", ".join(changed[:5]))
    return seen, changed, scored


def evaluation_provenance(origin: dict, split: dict, dataset: dict, trained_on: dict, predictor, overrides: list[str],
                          output_dir: Path, environment: dict, content: dict) -> dict:
    """The provenance record of one evaluation (summary.json's ``provenance`` and provenance.json), the same for a
    run's own test evaluation, a checkpoint's and an ensemble's: ``origin`` names the predictor (``checkpoint`` and
    ``run_dir``, or ``ensemble``, ``members`` and ``pool``), then the split scored (name, source, cases), the
    dataset and what the network was trained on, the patch geometry, the command's overrides, the output folder,
    when, the environment, and ``content``: which scored cases it saw in training (:func:`scored_content`)."""
    return {**origin, "split": split, "dataset": dataset, "trained_on": trained_on,
            "geometry": {"dims": predictor.model_dims, "slice_axis": predictor.slice_axis,
                         "patch_size": list(predictor.roi_size or [])},
            "overrides": list(overrides), "output_dir": str(output_dir), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "environment": environment, **content}


def content_record(ckpt: Path, state: dict, dataset: SegmentationDataset, refs: list, split: str,
                   own_split: str | None) -> dict:
    """The ``content`` of :func:`evaluation_provenance` for a checkpoint's stored ``state`` scoring ``refs`` of
    split ``split`` (``own_split``: that split's name when it is the checkpoint's own, None on other data)."""
    seen, changed, scored = scored_content(ckpt, state, dataset, refs, own_split)
    return {"scored_content_sha256": split_content_sha256({split: scored}), "seen_in_training": seen,
            "content_changed": changed, "content_checked": bool(state.get("content")),
            "classes_unseen_in_training": list(state.get("classes_unseen_in_training") or [])}
