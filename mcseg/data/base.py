"""The dataset interface: a task description plus the list of its cases.

A dataset knows its classes and channels, lists :class:`CaseRef` records and loads a
case into a normalised :class:`CaseData`. Subclasses mostly say where a download keeps its
files (:meth:`SegmentationDataset.scan`) and how its labels are numbered
(``label_mapping``, ``regions``); reading, checking, preprocessing, caching and mapping
predictions back to the original geometry are done here, identically for every dataset.
Sampling and splitting are done by the callers.
"""
from __future__ import annotations

import logging
import os
from abc import ABC
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mcseg.data.augment import augment_config
from mcseg.data.fingerprint import DigestCache, files_fingerprint, image_fingerprint
from mcseg.data.cache import CaseCache
from mcseg.data.cases import CaseData, CaseRef, load_case, to_regions
from mcseg.data.normalize import check_normalization, normalize_image
from mcseg.data.preprocess import Geometry, forward, invert, preprocess_config
from mcseg.data.raters import hard_label, rater_config
from mcseg.data.roots import resolve_root  # noqa: F401 (the datasets import it from here)
from mcseg.data.validate import GEOMETRY_TOLERANCE_MM, GeometryRule
from mcseg.runtime import helper_processes
from mcseg.text import plural

log = logging.getLogger(__name__)

_FG_POINTS = 10000  # foreground voxels kept per class and case in the cache, for sampling


class SegmentationDataset(ABC):
    """Base class of every dataset; subclasses implement :meth:`scan` (or :meth:`case_refs`).

    Args:
        name: short name written into outputs.
        num_classes: classes including background (multi-label: number of regions).
        class_names: one name per class; defaults to ``class_0 ...`` (multi-label: region names).
        in_channels: image channels (modalities).
        spatial_dims: spatial dimensions of the stored volumes (2 or 3).
        normalization: ``{"scheme": "zscore"|"none", "clip": [lo, hi] | None, "nonzero": bool}``
            for every channel, or a list of such mappings, one per channel.
        multilabel: outputs are overlapping regions with one sigmoid each (needs ``regions``).
        preprocess: the ``dataset.preprocess`` node (:class:`~mcseg.data.preprocess.PreprocessConfig`):
            orientation, target spacing, non-zero crop, centre crop/pad, cache. Off by default.
        augment: the ``dataset.augment`` node (:class:`~mcseg.data.augment.AugmentConfig`), read by
            the training loader.
        label_mapping: renames raw label values when reading (``{4: 3}`` for BraTS).
        regions: multi-label view, region name -> label values it unites
            (``{WT: [1, 2, 3], TC: [1, 3], ET: [3]}``); labels become ``R x *S`` masks.
        raters: the ``dataset.raters`` node of datasets whose cases have several raters
            (:mod:`mcseg.data.raters`): ``target`` says how the hard label is derived from them.
    """

    MODALITY: str | None = None  # "CT" | "MRI" where the kind of dataset fixes it (read by shift suites)

    @property
    def modality(self) -> str | None:
        """``CT`` or ``MRI`` where the dataset says (its kind, or its dataset.json), else None."""
        return self.MODALITY

    def __init__(
        self,
        name: str,
        num_classes: int | None,
        class_names: Sequence[str] | None = None,
        in_channels: int | None = 1,
        spatial_dims: int = 3,
        normalization: dict | list | None = None,
        multilabel: bool = False,
        preprocess: dict | None = None,
        augment: dict | None = None,
        label_mapping: Mapping[int, int] | None = None,
        regions: Mapping[str, Sequence[int]] | None = None,
        geometry_check: str = "error",
        geometry_tolerance: float = GEOMETRY_TOLERANCE_MM,
        raters: Mapping | None = None,
    ) -> None:
        if spatial_dims not in (2, 3):
            raise ValueError(f"dataset.spatial_dims={spatial_dims}: expected 2 or 3")
        self.name = name
        self.num_classes = num_classes
        self.class_names = list(class_names) if class_names is not None else None
        self.in_channels = in_channels
        self.spatial_dims = spatial_dims
        self.normalization = check_normalization(normalization, in_channels)
        self.multilabel = bool(multilabel)
        self.preprocess = preprocess_config(preprocess, spatial_dims)
        self.augment = augment_config(augment)
        self.label_mapping = _check_mapping(label_mapping)
        self.regions = {str(k): [int(v) for v in vals] for k, vals in regions.items()} if regions else None
        self.label_classes: int | None = None  # values a label file may hold (after label_mapping)
        self.layout_warnings: list[str] = []  # odd but usable things found by scan()
        self.geometry = GeometryRule(str(geometry_check), geometry_tolerance)
        self.raters = rater_config(raters)
        self._cache: CaseCache | None = None
        self.corruption = None  # (raw case) -> corrupted raw case: evaluation under shift (:meth:`corrupted`)

    # ------------------------------------------------------------------ classes
    def _finalise_classes(self) -> None:
        if self.regions is not None:
            if not self.multilabel:
                raise ValueError("dataset.regions gives a multi-label view: set dataset.multilabel=true")
            if any(not vals or min(vals) < 1 for vals in self.regions.values()):
                raise ValueError(f"dataset.regions={self.regions}: each region needs label values >= 1")
            if self.num_classes not in (None, len(self.regions)):
                raise ValueError(f"dataset.num_classes={self.num_classes} but dataset.regions names "
                                 f"{len(self.regions)} regions")
            self.num_classes = len(self.regions)
            if self.class_names is None:
                self.class_names = list(self.regions)
            if self.label_classes is None:
                self.label_classes = max(max(v) for v in self.regions.values()) + 1
        elif self.multilabel:
            raise ValueError("dataset.multilabel=true needs dataset.regions (region name -> label values)")
        min_classes = 1 if self.multilabel else 2
        if self.num_classes is None or self.num_classes < min_classes:
            raise ValueError(f"dataset.num_classes={self.num_classes}: expected an integer >= {min_classes}")
        if self.class_names is None:
            self.class_names = [f"class_{i}" for i in range(self.num_classes)]
        if len(self.class_names) != self.num_classes:
            raise ValueError(
                f"dataset.class_names has {len(self.class_names)} names for num_classes={self.num_classes}"
            )
        if self.label_classes is None:
            self.label_classes = self.num_classes

    # ------------------------------------------------------------------ cases
    def scan(self) -> tuple[list[CaseRef], list[str]]:
        """All cases found on disk (with the files they should have, present or not) and layout
        problems that are not tied to a readable case (``mcseg-data check`` reports both)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither scan() nor case_refs()")

    def note(self, message: str) -> None:
        """Record (once) and log a warning about the layout found by :meth:`scan`."""
        if message not in self.layout_warnings:
            self.layout_warnings.append(message)
            log.warning(message)

    def case_refs(self) -> list[CaseRef]:
        """All labelled cases of the dataset, sorted by id."""
        refs, problems = self.scan()
        if problems:
            more = f" (and {len(problems) - 1} more problems; run `mcseg-data check` to list them)" \
                if len(problems) > 1 else ""
            raise ValueError(problems[0] + more)
        return refs

    def split_info(self):
        """Constraints on the train/val/test split (:class:`mcseg.data.split.SplitInfo`), or ``None``:
        fixed official test cases, groups of cases that stay together (frames of one patient),
        strata to balance (pathology)."""
        return None

    def source_files(self, ref: CaseRef) -> list[Path | None]:
        return [*ref.image_paths, ref.label_path, *ref.raters]

    def content_fingerprint(self, ref: CaseRef, cache: DigestCache) -> str:
        """The case's identity by content (:mod:`mcseg.data.fingerprint`): its source files' bytes, every
        rater's label map included (by rater order, not file name)."""
        return files_fingerprint([*ref.image_paths, ref.label_path], cache, ref.raters)

    def input_fingerprint(self, ref: CaseRef, cache: DigestCache) -> str:
        """The case's images' identity by content, labels and raters aside (:func:`image_fingerprint`)."""
        return image_fingerprint(ref.image_paths, cache)

    # ------------------------------------------------------------------ reading
    def read(self, ref: CaseRef) -> CaseData:
        """Read and check one case as stored on disk (labels mapped, not normalised)."""
        case = load_case(ref, self.label_classes or self.num_classes, self.spatial_dims, self.label_mapping)
        if self.in_channels is not None and case.image.shape[0] != self.in_channels:
            raise ValueError(
                f"{ref.image_paths[0]}: {case.image.shape[0]} channels, dataset.in_channels={self.in_channels}"
            )
        return self.with_rater_label(case, ref)

    def with_rater_label(self, case: CaseData, ref: CaseRef) -> CaseData:
        """Set the hard ``label`` of a case read with several raters (``dataset.raters.target``)."""
        if case.raters is None:
            return case
        if self.regions is not None:
            raise ValueError(f"dataset {self.name}: dataset.regions (a multi-label view) is not available for "
                             "cases with several raters")
        case.label = self.rater_label(case.raters, ref)
        return case

    def rater_label(self, raters: np.ndarray, ref: CaseRef) -> np.ndarray:
        """The hard label of ``raters`` (``K x *S``, any grid) by ``dataset.raters.target``."""
        names = ref.rater_names or [str(r) for r in range(len(raters))]
        return hard_label(raters, names, self.raters["target"], self.label_classes or self.num_classes,
                          ref.case_id)

    def _view(self, label: np.ndarray | None) -> np.ndarray | None:
        """The label as the network sees it: the class map, or ``R x *S`` region masks."""
        if label is None or self.regions is None:
            return label
        return to_regions(label, list(self.regions.values()))

    def corrupted(self, corruption) -> SegmentationDataset:
        """This dataset with ``corruption`` (``raw case -> raw case``, :mod:`mcseg.data.shift`) applied to every
        case as read, before preprocessing and normalisation, as a scanner would. Nothing of it is cached."""
        import copy

        view = copy.copy(self)
        view.corruption, view._cache = corruption, None
        return view

    def _read_raw(self, ref: CaseRef) -> CaseData:
        case = self.read(ref)
        return case if self.corruption is None else self.corruption(case)

    def load(self, ref: CaseRef) -> CaseData:
        """Read, check, preprocess (or fetch from the cache) and normalise one case."""
        if self.preprocess.identity:
            case = self._read_raw(ref)
            case.image = normalize_image(case.image, self.normalization)
            case.label = self._view(case.label)
            case.meta["ref"] = ref
            return case
        cache = self.cache
        found = cache.get(ref.case_id, self.source_files(ref)) if cache is not None else None
        if found is None:
            arrays, meta = self._preprocess(ref)
            if cache is not None:
                cache.put(ref.case_id, arrays, meta, self.source_files(ref))
        else:
            arrays, meta = found
        return self._case_from(ref, arrays, meta)

    # ------------------------------------------------------------------ preprocessing and cache
    @property
    def cache(self) -> CaseCache | None:
        """The preprocessing cache of this dataset's settings (``None`` when off or not needed)."""
        if self.preprocess.identity or not self.preprocess.cache or self.corruption is not None:
            return None
        if self._cache is None:
            root = getattr(self, "root", None)
            settings = {
                "dataset": f"{type(self).__module__}.{type(self).__qualname__}",
                "root": str(root) if root is not None else None,
                "spatial_dims": self.spatial_dims,
                "label_classes": self.label_classes,
                "label_mapping": {str(k): v for k, v in sorted((self.label_mapping or {}).items())},
                "normalization": self.normalization,
                "preprocess": self.preprocess.settings(),
            }
            if self.raters["target"] != "majority":  # the cached label is derived from the raters by it
                settings["rater_target"] = self.raters["target"]
            label = Path(str(root)).name if root is not None else self.name
            self._cache = CaseCache(self.preprocess.cache_dir, settings, label)
        return self._cache

    def _label_dtype(self):
        return np.uint8 if (self.label_classes or 0) <= 256 else np.int32

    def _preprocess(self, ref: CaseRef) -> tuple[dict[str, np.ndarray], dict]:
        """Raw case to the arrays the cache keeps: image, label, original label, foreground points (with a
        corruption: of the corrupted raw case, whose label is the one scored)."""
        raw = self._read_raw(ref)
        several = raw.raters is not None  # the raters' maps are carried (nearest neighbour), the label derived
        image, label, geometry = forward(raw.image, raw.raters if several else raw.label, raw.spacing, raw.affine,
                                         self.preprocess, self.normalization)
        arrays = {"image": image}
        if raw.label is not None and not raw.label.any():
            log.warning("%s: label map is empty (background only)", ref.label_path or ref.case_id)
        if several:
            dtype = self._label_dtype()
            arrays["raters"], arrays["raters_original"] = label.astype(dtype), raw.raters.astype(dtype)
            label = self.rater_label(label, ref)
        if label is not None:
            dtype = self._label_dtype()
            arrays["label"] = label.astype(dtype)
            arrays["label_original"] = raw.label.astype(dtype)
            arrays["fg_points"] = _foreground_points(label)
        if geometry.shape != tuple(image.shape[1:]):
            raise RuntimeError(f"{ref.case_id}: geometry shape {geometry.shape} != image {image.shape}")
        return arrays, {"geometry": geometry.to_dict()}

    def _case_from(self, ref: CaseRef, arrays: dict[str, np.ndarray], meta: dict) -> CaseData:
        geometry = Geometry.from_dict(meta["geometry"])
        label = arrays.get("label")
        info = {"geometry": geometry, "ref": ref, "label_original": arrays.get("label_original"),
                "raters_original": arrays.get("raters_original")}
        if "fg_points" in arrays:
            pts = np.asarray(arrays["fg_points"])
            info["fg_points"] = {int(k): pts[pts[:, 0] == k, 1:].astype(np.int64) for k in np.unique(pts[:, 0])}
        return CaseData(ref.case_id, arrays["image"], self._view(label), geometry.spacing,
                        np.asarray(geometry.affine), info, raters=arrays.get("raters"))

    def prepare(self, refs: Sequence[CaseRef], workers: int | None = None, progress: bool = True) -> int:
        """Preprocess every case of ``refs`` missing from the cache, in parallel processes, with a
        progress bar; return how many were preprocessed. A no-op without preprocessing or cache."""
        cache = self.cache
        if cache is None:
            return 0
        missing = [r for r in refs if not cache.has(r.case_id, self.source_files(r))]
        if not missing:
            return 0
        from tqdm import tqdm

        workers = self.preprocess.workers if workers is None else workers
        if workers is None:
            workers = helper_processes()
        workers = max(1, min(workers, len(missing)))
        log.info("preprocessing %s of %s into %s (%s)", plural(len(missing), "case"), self.name, cache.dir,
                 plural(workers, "process", "processes"))
        bar = tqdm(total=len(missing), desc=f"preprocessing {self.name}", disable=not progress, dynamic_ncols=True)
        try:
            if workers == 1:
                for ref in missing:
                    self._store(ref)
                    bar.update()
            else:
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor, as_completed

                context = multiprocessing.get_context("spawn")  # no fork of a process holding threads/CUDA
                with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                         initargs=(self,)) as pool:
                    futures = [pool.submit(_store_in_worker, ref) for ref in missing]
                    for future in as_completed(futures):
                        future.result()
                        bar.update()
        finally:
            bar.close()
        return len(missing)

    def _store(self, ref: CaseRef) -> None:
        arrays, meta = self._preprocess(ref)
        self.cache.put(ref.case_id, arrays, meta, self.source_files(ref))

    # ------------------------------------------------------------------ back to the original space
    def original_label(self, case: CaseData) -> np.ndarray | None:
        """The case's label in its file grid (mapped; regions for multi-label datasets)."""
        label = case.meta.get("label_original")
        if label is None:
            ref = case.meta.get("ref")
            if ref is None or not ref.labelled:
                return None
            label = self.read(ref).label
        return self._view(label)

    def original_image(self, case: CaseData) -> np.ndarray:
        """The case's image (``C x *S``) in its file grid, where :meth:`restore` puts the probabilities: the loaded
        (normalised) image when nothing was preprocessed, else the case read again (raw intensities)."""
        if case.meta.get("geometry") is None:
            return np.asarray(case.image)
        return np.asarray(self._read_raw(case.meta["ref"]).image)

    def original_raters(self, case: CaseData) -> np.ndarray | None:
        """The case's raters' maps (``K x *S``) in its file grid; ``None`` for a case with one label."""
        if case.raters is None:
            return None
        if case.meta.get("geometry") is None:
            return case.raters
        raters = case.meta.get("raters_original")
        return raters if raters is not None else self.read(case.meta["ref"]).raters

    def restore(self, case: CaseData, probs):
        """Map ``probs`` (C x *S, in the space :meth:`load` returned) back to the case's original
        geometry; return ``(probs, label, spacing, affine)`` there, for evaluation and writing.

        Undoes the preprocessing recorded in ``case.meta["geometry"]`` (pad/crop back with
        background, linear interpolation of probabilities to the file grid, inverse
        reorientation) and returns the label, spacing and affine of the file, so metrics are
        always computed in the original space, in mm. Identity when nothing was preprocessed.
        """
        geometry = case.meta.get("geometry") if case.meta else None
        if geometry is None:
            return probs, case.label, case.spacing, np.asarray(case.affine)
        probs = invert(probs, geometry, self.multilabel)
        return probs, self.original_label(case), geometry.original_spacing, np.asarray(geometry.original_affine)

    def restore_maps(self, case: CaseData, maps):
        """Voxel maps (``M x *S``, e.g. uncertainty) back to the original grid as :meth:`restore` maps
        probabilities: linear interpolation, and 0 (certain background) outside the network's field."""
        geometry = case.meta.get("geometry") if case.meta else None
        return maps if geometry is None else invert(maps, geometry, multilabel=True)


def _foreground_points(label: np.ndarray) -> np.ndarray:
    """``N x (1 + ndim)`` int32 rows ``(class, *coords)``: up to ``_FG_POINTS`` voxels per class."""
    rng = np.random.default_rng(0)
    flat = label.ravel()
    rows = [np.zeros((0, 1 + label.ndim), dtype=np.int32)]
    counts = np.bincount(flat.astype(np.int64), minlength=1) if flat.size else np.zeros(1, np.int64)
    for k in np.flatnonzero(counts):
        if k == 0:
            continue
        idx = np.flatnonzero(flat == k)
        if len(idx) > _FG_POINTS:
            idx = np.sort(rng.choice(idx, _FG_POINTS, replace=False))
        coords = np.stack(np.unravel_index(idx, label.shape), axis=1)
        rows.append(np.concatenate([np.full((len(idx), 1), k), coords], axis=1).astype(np.int32))
    return np.concatenate(rows, axis=0)


_WORKER_DATASET: SegmentationDataset | None = None


def _init_worker(dataset: SegmentationDataset) -> None:
    global _WORKER_DATASET
    _WORKER_DATASET = dataset


def _store_in_worker(ref: CaseRef) -> None:
    _WORKER_DATASET._store(ref)


def _check_mapping(mapping: Mapping | None) -> dict[int, int] | None:
    if not mapping:
        return None
    try:
        return {int(k): int(v) for k, v in mapping.items()}
    except (TypeError, ValueError):
        raise ValueError(f"dataset.label_mapping={dict(mapping)}: expected integer label values") from None


def inside_root(root: Path, relative: str, source: Path) -> Path:
    """``root / relative`` for an entry of ``source`` (a dataset.json); refuse entries that leave the
    root as written: absolute paths and ``..`` past the root. Symlinks are not followed for this
    rule: a root, a folder or a file that is a symlink to shared storage is accepted."""
    path = Path(os.path.normpath(root / relative))  # lexical: '..' resolved, symlinks kept
    if Path(relative).is_absolute() or not path.is_relative_to(root):
        raise ValueError(f"{source}: entry {relative!r} points outside the dataset root {root} as written: "
                         "entries must be relative paths with no '..' leading out of the root (symlinks inside "
                         "the root may point anywhere)")
    return path
