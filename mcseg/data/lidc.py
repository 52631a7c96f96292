"""LIDC-IDRI lesion crops with four raters, in the two layouts the probabilistic-segmentation studies use.

- **Kohl's PNG crops** (Probabilistic U-Net, NeurIPS 2018; used by CCDM, CARSSS): per split
  ``<split>/images/<patient>/<slice>.png`` and ``<split>/gt/<patient>/<slice>_l<r>.png`` (r = 0..3, masks
  0/255), 180 x 180 pixels, centre-cropped to 128 x 128 by the preset (``dataset.preprocess.crop_size``,
  undone exactly for evaluation). The split folders may sit in ``lidc_crops_<split>/`` as unpacked.
  ``train``/``val``/``test`` are the published split; ``official_split`` makes ``test`` the test set.
- **Knegt's pickle** (Probabilistic-Unet-Pytorch; used by PHiSeg, CCDM): ``*.pickle`` files holding a dict
  keyed by slice id, each value ``{"image": 128 x 128 float, "masks": [4 binary maps], "series_uid": ...}``,
  read in chunks of 2^31 - 1 bytes (files over 2 GB). The published code splits by ``series_uid`` without a
  seed; here the split is mcseg's (``dataset.split``), slices of one series always together. A pickle runs
  code when loaded: read only files from a source you trust.

Pixels are ``pixel_spacing`` mm (0.5, the resolution the crops were resampled to); neither layout stores it.
"""
from __future__ import annotations

import hashlib
import pickle
import re
from pathlib import Path

import numpy as np

from mcseg.data.base import SegmentationDataset, resolve_root
from mcseg.data.cases import CaseData, CaseRef, read_label_array
from mcseg.data.files import visible_files, visible_folders
from mcseg.data.fingerprint import combine
from mcseg.data.io import VolumeError
from mcseg.data.split import SplitInfo

SPLITS = ("train", "val", "test")
PICKLE_CHUNK = 2**31 - 1  # bytes per read: Python on macOS cannot read more at once


def _spacing(value) -> float:
    if not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"dataset.pixel_spacing={value!r}: expected a positive size in mm")
    return float(value)


class LIDCCropsDataset(SegmentationDataset):
    """Kohl's LIDC crops (PNG, four raters per slice); a case is one slice, grouped by patient.

    Args:
        root: the folder holding ``train/ val/ test/`` (or ``lidc_crops_train/train/`` ...).
        pixel_spacing: mm per pixel (both axes).
        official_split: the ``test`` folder's slices are the test set.
    """

    def __init__(self, root: str, name: str = "lidc", pixel_spacing: float = 0.5, official_split: bool = True,
                 **kwargs) -> None:
        self.root = resolve_root(root)
        self.pixel_spacing = _spacing(pixel_spacing)
        self.official_split = bool(official_split)
        kwargs.setdefault("num_classes", 2)
        kwargs.setdefault("label_mapping", {255: 1})
        if kwargs.get("class_names") is None:
            kwargs["class_names"] = ["background", "lesion"]
        super().__init__(name=name, spatial_dims=kwargs.pop("spatial_dims", 2), **kwargs)
        self.label_classes = 2
        self._finalise_classes()
        self.patients: dict[str, str] = {}
        self.test_ids: list[str] = []

    def _split_folder(self, split: str) -> Path | None:
        for folder in (self.root / split, self.root / f"lidc_crops_{split}" / split, self.root / f"lidc_crops_{split}"):
            if (folder / "images").is_dir():
                return folder
        return None

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        refs, problems = [], []
        self.patients, self.test_ids = {}, []
        rater = re.compile(r"(?P<slice>.+)_l(?P<rater>\d+)\.png")
        for split in SPLITS:
            folder = self._split_folder(split)
            if folder is None:
                continue
            for patient in visible_folders(folder / "images"):
                masks: dict[str, list[tuple[int, Path]]] = {}
                for path in visible_files(folder / "gt" / patient.name):
                    m = rater.fullmatch(path.name)
                    if m is not None:
                        masks.setdefault(m["slice"], []).append((int(m["rater"]), path))
                for image in visible_files(patient):
                    if not image.name.endswith(".png"):
                        continue
                    stem = image.name[:-4]
                    found = sorted(masks.get(stem, []))
                    if not found:
                        problems.append(f"{image}: no rater masks {folder / 'gt' / patient.name / stem}_l<r>.png")
                        continue
                    case_id = f"{patient.name}_{stem}"
                    refs.append(CaseRef(case_id, (image,), None, tuple(p for _, p in found),
                                        tuple(f"l{r}" for r, _ in found)))
                    self.patients[case_id] = patient.name
                    if split == "test":
                        self.test_ids.append(case_id)
        if not refs and not problems:
            problems.append(f"dataset.root={self.root}: no train/, val/ or test/ folder with images/ and gt/")
        ids = [r.case_id for r in refs]
        if len(set(ids)) != len(ids):
            problems.append(f"dataset.root={self.root}: the same patient and slice in several splits")
        return sorted(refs, key=lambda r: r.case_id), problems

    def read(self, ref: CaseRef) -> CaseData:
        case = super().read(ref)
        case.spacing = (self.pixel_spacing,) * 2
        case.affine = np.diag([self.pixel_spacing, self.pixel_spacing, 1.0, 1.0])
        return case

    def split_info(self) -> SplitInfo:
        test = list(self.test_ids) if self.official_split and self.test_ids else None
        return SplitInfo(test=test, groups=dict(self.patients))


class LIDCPickleDataset(SegmentationDataset):
    """Knegt's LIDC pickle (four raters per slice); a case is one slice, grouped by ``series_uid``.

    Args:
        root: the folder holding the ``.pickle`` file(s).
        files: the pickle files' name pattern (glob) inside ``root``.
        pixel_spacing: mm per pixel (both axes).
    """

    files_on_disk = False  # cases are entries of a pickle, checked when read (``mcseg-data check`` reads them)

    def __init__(self, root: str, name: str = "lidc_pickle", files: str = "*.pickle", pixel_spacing: float = 0.5,
                 **kwargs) -> None:
        self.root = resolve_root(root)
        self.files = sorted(p for p in self.root.glob(str(files)) if p.is_file())
        if not self.files:
            raise FileNotFoundError(f"dataset.root={root}: no file matching dataset.files={files!r} in {self.root}")
        self.pixel_spacing = _spacing(pixel_spacing)
        kwargs.setdefault("num_classes", 2)
        if kwargs.get("class_names") is None:
            kwargs["class_names"] = ["background", "lesion"]
        super().__init__(name=name, spatial_dims=kwargs.pop("spatial_dims", 2), **kwargs)
        self._finalise_classes()
        self._slices: dict[str, tuple[Path, dict]] | None = None

    def __getstate__(self):  # worker processes re-read the file instead of receiving every slice
        state = dict(self.__dict__)
        state["_slices"] = None
        return state

    @property
    def slices(self) -> dict[str, tuple[Path, dict]]:
        if self._slices is None:
            slices = {}
            for path in self.files:
                data = bytearray()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(PICKLE_CHUNK), b""):
                        data += chunk
                try:
                    loaded = pickle.loads(bytes(data))
                except Exception as exc:  # a truncated or foreign file
                    raise VolumeError(f"{path}: cannot read the pickle ({type(exc).__name__}: {exc})") from exc
                if not isinstance(loaded, dict):
                    raise VolumeError(f"{path}: expected a dict of slices, found {type(loaded).__name__}")
                for key, value in loaded.items():
                    if str(key) in slices:
                        raise VolumeError(f"{path}: slice {key} is also in {slices[str(key)][0]}")
                    slices[str(key)] = (path, value)
            self._slices = slices
        return self._slices

    def case_refs(self) -> list[CaseRef]:
        refs = []
        for key, (path, value) in sorted(self.slices.items()):
            masks = value.get("masks") if isinstance(value, dict) else None
            n = len(masks) if isinstance(masks, (list, tuple)) else 0
            refs.append(CaseRef(key, (path,), None, (path,) * n, tuple(str(r) for r in range(n))))
        return refs

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        refs = self.case_refs()
        problems = [f"{r.image_paths[0]}: slice {r.case_id} has no 'masks' list" for r in refs if not r.raters]
        return [r for r in refs if r.raters], problems

    def source_files(self, ref: CaseRef) -> list[Path | None]:
        return [ref.image_paths[0], None]

    def content_fingerprint(self, ref: CaseRef, cache=None) -> str:
        """A slice is its arrays: the image's and each rater's bytes, shapes and types (not the key or file)."""
        case = self.read(ref)
        parts = [_array_digest("image", case.image)]
        parts += [_array_digest(f"rater{r}", m) for r, m in enumerate(case.raters)]
        return combine(parts)

    def input_fingerprint(self, ref: CaseRef, cache=None) -> str:
        """A slice's image alone (its raters aside): :func:`mcseg.data.fingerprint.image_fingerprint`'s role."""
        return combine(["inputs", _array_digest("image", self.read(ref).image)])

    def read(self, ref: CaseRef) -> CaseData:
        path, value = self.slices[ref.case_id]
        where = f"{path} [slice {ref.case_id}]"
        if not isinstance(value, dict) or "image" not in value or not isinstance(value.get("masks"), (list, tuple)):
            raise VolumeError(f"{where}: expected a dict with 'image' and a 'masks' list")
        image = np.asarray(value["image"], dtype=np.float32)
        if image.ndim != 2:
            raise VolumeError(f"{where}: image of shape {image.shape}, expected 2D")
        if not np.isfinite(image).all():
            raise VolumeError(f"{where}: image of case {ref.case_id} contains NaN or inf values")
        maps = []
        for r, mask in enumerate(value["masks"]):
            source = f"{where} (case {ref.case_id}, rater {r})"
            mask = np.asarray(mask)
            if mask.shape != image.shape:
                raise VolumeError(f"{source}: rater label shape {mask.shape} does not match image shape {image.shape}")
            maps.append(read_label_array(mask.astype(np.float64) if mask.dtype == bool else mask,
                                         self.num_classes, source, self.label_mapping))
        if not maps:
            raise VolumeError(f"{where}: no rater masks")
        affine = np.diag([self.pixel_spacing, self.pixel_spacing, 1.0, 1.0])
        case = CaseData(ref.case_id, image[None], None, (self.pixel_spacing,) * 2, affine, raters=np.stack(maps))
        return self.with_rater_label(case, ref)

    def split_info(self) -> SplitInfo:
        groups = {}
        for key, (_, value) in self.slices.items():
            uid = value.get("series_uid") if isinstance(value, dict) else None
            if uid is not None:
                groups[key] = str(uid)
        return SplitInfo(groups=groups)


def _array_digest(role: str, array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())
    return f"{role}:{digest.hexdigest()}"
