"""Several raters of one case: their label maps as one ``K x *S`` stack, and the hard label derived from them.

A dataset whose cases carry K label maps (QUBIQ, CURVAS, LIDC) keeps them all (``CaseData.raters``); the
metrics read them as references (:mod:`mcseg.metrics.raters`). Where one hard label map is needed (the
``label`` of a case: sampling, the single-reference figures) it is derived as ``dataset.raters.target`` says:

- ``majority``: per voxel the class most raters gave; a tie goes to the lowest class value (background
  first), so with an even K a voxel two of four raters marked stays background.
- ``staple``: SimpleITK's STAPLE consensus (two classes: its probability > 0.5) or MultiLabelSTAPLE (more
  classes; undecided voxels take the majority vote; :func:`staple_reference`), computed
  when a case is read (training loads each case once) and kept in the preprocessing cache when there is one.
- ``random``: one rater drawn per training sample and iteration, seeded by the sample's identity
  (:class:`~mcseg.data.sampling.PatchDataset`); the case's own label (validation, the centres of
  foreground samples) is the majority vote.
- ``<rater name>``: that rater's map (``seg01``, ``annotation_2``, ``l0``...); a case without that rater is
  an error naming the case.
- ``mean``: training samples carry the soft rater mean (``C x *S``: the fraction of raters that gave each
  class; :class:`~mcseg.data.sampling.PatchDataset`), for the losses defined on soft targets (the others
  refuse it at start, :func:`mcseg.losses.base.hard_label_only`); the case's own label is the majority vote.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mcseg.errors import ConfigError

RATER_KEYS = ("target",)
TARGETS = ("majority", "staple", "random", "mean")  # or a rater's name


def rater_config(node: Mapping | None) -> dict:
    """The ``dataset.raters`` node, checked: ``{target: majority | <rater name>}``."""
    node = dict(node or {})
    unknown = sorted(set(node) - set(RATER_KEYS))
    if unknown:
        raise ValueError(f"dataset.raters: unknown keys {unknown}; expected {list(RATER_KEYS)}")
    target = node.get("target") or "majority"
    if not isinstance(target, str):
        raise ValueError(f"dataset.raters.target={target!r}: expected {', '.join(TARGETS)} or a rater's name")
    return {"target": target}


def scored_reference(target: str) -> str:
    """The hard label a run trained on ``dataset.raters.target=<target>`` is scored against in its single-label
    figures: the majority vote for ``majority``, ``random`` and ``mean``; the STAPLE consensus; a rater's map."""
    return "majority" if target in ("majority", "random", "mean") else target


def check_target_has_raters(target: str, refs: Sequence, dataset_name: str) -> None:
    """A rater target other than the default (``majority``, which is a single-rater case's own label) needs cases
    with several raters: on a dataset without them it would train the plain run under another name."""
    if target != "majority" and not any(getattr(r, "raters", None) for r in refs):
        raise ConfigError(f"config key 'dataset.raters.target'={target}: dataset {dataset_name} has no case with "
                          "several raters (one label per case), so there is no rater to choose or average; leave "
                          "the key at its default, majority, which is each case's own label")


def majority_vote(raters: np.ndarray, num_classes: int) -> np.ndarray:
    """``K x *S`` label maps to the ``*S`` map of the most frequent class per voxel (ties: lowest class)."""
    raters = np.asarray(raters)
    votes = np.stack([(raters == k).sum(axis=0) for k in range(num_classes)])
    return votes.argmax(axis=0).astype(raters.dtype)


def soft_target(raters: np.ndarray, num_classes: int) -> np.ndarray:
    """``K x *S`` label maps to the ``C x *S`` float32 rater mean (each voxel's fractions sum to 1)."""
    raters = np.asarray(raters)
    return np.stack([(raters == k).mean(axis=0) for k in range(num_classes)]).astype(np.float32)


def hard_label(raters: np.ndarray, names: Sequence[str], target: str, num_classes: int, case_id: str) -> np.ndarray:
    """The case's hard label from its raters' maps, by ``dataset.raters.target`` (module docstring)."""
    if target in ("majority", "random", "mean"):
        return majority_vote(raters, num_classes)
    if target == "staple":
        return staple_reference(raters, num_classes).astype(np.asarray(raters).dtype)
    names = list(names)
    if target not in names:
        raise ValueError(f"dataset.raters.target={target}: case {case_id} has no rater of that name "
                         f"(its raters: {', '.join(names)}); use majority or one of them")
    return np.asarray(raters[names.index(target)])


def staple_reference(raters, num_classes: int, threshold: float = 0.5) -> np.ndarray:
    """The STAPLE consensus of ``K x *S`` rater maps (an array or a tensor) as a label map: SimpleITK's STAPLE
    for two classes (its probability > ``threshold``; 0.5 is CURVAS 2025's), MultiLabelSTAPLE for more
    (undecided voxels take the majority vote)."""
    import SimpleITK as sitk

    maps = np.asarray(raters.cpu() if hasattr(raters, "cpu") else raters).astype(np.uint8)
    images = [sitk.GetImageFromArray(m) for m in maps]
    if num_classes == 2:
        if not maps.any():
            return np.zeros(maps.shape[1:], dtype=np.int64)
        prob = sitk.GetArrayFromImage(sitk.STAPLE(images, 1.0))
        return (prob > threshold).astype(np.int64)
    undecided = num_classes  # a value no rater uses
    filt = sitk.MultiLabelSTAPLEImageFilter()
    filt.SetLabelForUndecidedPixels(undecided)
    out = sitk.GetArrayFromImage(filt.Execute(images)).astype(np.int64)
    return np.where(out == undecided, majority_vote(maps, num_classes).astype(np.int64), out)
