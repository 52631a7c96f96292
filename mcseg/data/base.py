"""The dataset interface: a task description plus the list of its cases.

A dataset knows its classes and channels, lists :class:`CaseRef` records and loads a
case into a normalised :class:`CaseData`. Sampling, splitting and caching are done by
the callers, identically for every dataset.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mcseg.data.cases import CaseData, CaseRef, load_case
from mcseg.data.normalize import normalize


class SegmentationDataset(ABC):
    """Base class of every dataset; subclasses implement :meth:`case_refs`.

    Args:
        name: short name written into outputs.
        num_classes: classes including background (multi-label: number of regions).
        class_names: one name per class; defaults to ``class_0 ...``.
        in_channels: image channels (modalities).
        spatial_dims: spatial dimensions of the stored volumes (2 or 3).
        normalization: ``{"scheme": "zscore"|"none", "clip": [lo, hi] | None}``.
        multilabel: outputs are overlapping regions with one sigmoid each.
    """

    def __init__(
        self,
        name: str,
        num_classes: int | None,
        class_names: Sequence[str] | None = None,
        in_channels: int | None = 1,
        spatial_dims: int = 3,
        normalization: dict | None = None,
        multilabel: bool = False,
    ) -> None:
        if spatial_dims not in (2, 3):
            raise ValueError(f"dataset.spatial_dims={spatial_dims}: expected 2 or 3")
        self.name = name
        self.num_classes = num_classes
        self.class_names = list(class_names) if class_names is not None else None
        self.in_channels = in_channels
        self.spatial_dims = spatial_dims
        self.normalization = dict(normalization or {"scheme": "zscore", "clip": None})
        self.multilabel = multilabel

    def _finalise_classes(self) -> None:
        if self.num_classes is None or self.num_classes < 2:
            raise ValueError(f"dataset.num_classes={self.num_classes}: expected an integer >= 2")
        if self.class_names is None:
            self.class_names = [f"class_{i}" for i in range(self.num_classes)]
        if len(self.class_names) != self.num_classes:
            raise ValueError(
                f"dataset.class_names has {len(self.class_names)} names for num_classes={self.num_classes}"
            )

    @abstractmethod
    def case_refs(self) -> list[CaseRef]:
        """All labelled cases of the dataset, sorted by id."""

    def load(self, ref: CaseRef) -> CaseData:
        """Read, check and normalise one case."""
        case = load_case(ref, self.num_classes, self.spatial_dims)
        if self.in_channels is not None and case.image.shape[0] != self.in_channels:
            raise ValueError(
                f"{ref.image_paths[0]}: {case.image.shape[0]} channels, dataset.in_channels={self.in_channels}"
            )
        case.image = normalize(case.image, **self.normalization)
        return case

    def restore(self, case: CaseData, probs):
        """Map ``probs`` (C x *S, in the space :meth:`load` returned) back to the case's original
        geometry; return ``(probs, label, spacing, affine)`` there, for evaluation and writing.

        Datasets that resample, reorient or crop in :meth:`load` override this; metrics are
        always computed in the original space, in mm.
        """
        return probs, case.label, case.spacing, np.asarray(case.affine)


def resolve_root(root: str | os.PathLike | None, key: str = "dataset.root") -> Path:
    """Resolve a dataset root against the directory the user launched from; check it exists."""
    if root in (None, "", "???"):
        raise FileNotFoundError(f"{key} is not set: give {key}=/path/to/dataset")
    path = Path(os.path.expanduser(str(root)))
    if not path.is_absolute():
        try:
            from hydra.utils import get_original_cwd

            path = Path(get_original_cwd()) / path
        except ValueError:  # not inside a Hydra run
            path = Path.cwd() / path
    if not path.is_dir():
        raise FileNotFoundError(f"{key}={root}: directory {path} does not exist")
    return path.resolve()
