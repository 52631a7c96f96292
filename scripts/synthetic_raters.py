"""Synthetic raters for the simulated multi-rater study of docs/results.md ("Calibration against several raters").

    python scripts/synthetic_raters.py DATA_ROOT OUT [--displacement-mm 1.0] [--smoothness-mm 4] [--seed 0]

No data set with several raters can be downloaded here, so this makes one from the MSD hippocampus cases: OUT is
an MSD folder (dataset.json, imagesTr/ linked to DATA_ROOT's images) whose ``training`` entries list five label
files per case, one per rater: ``original`` (the case's own label, the one rater the data set has) and four
synthetic raters, each a documented perturbation of it:

- ``eroded``: every foreground voxel with a background 6-neighbour becomes background (one voxel of erosion of
  the union of the classes, the classes kept where they remain).
- ``dilated``: every background voxel with a foreground 6-neighbour takes the class of its nearest foreground
  voxel (one voxel of dilation).
- ``shifted_a``, ``shifted_b``: the label resampled (nearest neighbour) through a smooth random displacement
  field: white noise per axis, Gaussian-smoothed with sigma ``--smoothness-mm``, scaled so that the root mean
  square of the displacement's length over the case is ``--displacement-mm`` (its largest value is about
  three times that); seeded by the case and the rater, so OUT is the same on every machine.

Distances are in mm on each case's voxel spacing (hippocampus: 1 mm isotropic, so 1 mm is one voxel).
mcseg reads OUT as any MSD folder with several raters (``dataset=hippocampus dataset.root=OUT``; docs/datasets.md,
"Several raters in an nnU-Net or MSD folder"). The raters disagree only near boundaries, as real raters mostly
do; they do not model a rater who misses a structure or labels another one.
"""
from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

RATERS = ("original", "eroded", "dilated", "shifted_a", "shifted_b")  # five: majority votes rarely tie
SIX_NEIGHBOURS = ndimage.generate_binary_structure(3, 1)


def eroded(label: np.ndarray) -> np.ndarray:
    """The label with one voxel of the foreground union's boundary removed (6-connectivity)."""
    keep = ndimage.binary_erosion(label > 0, SIX_NEIGHBOURS, border_value=0)
    return np.where(keep, label, 0).astype(label.dtype)


def dilated(label: np.ndarray) -> np.ndarray:
    """The label grown by one voxel (6-connectivity); a new voxel takes its nearest foreground voxel's class."""
    if not (label > 0).any():
        return label.copy()
    grow = ndimage.binary_dilation(label > 0, SIX_NEIGHBOURS) & (label == 0)
    nearest = ndimage.distance_transform_edt(label == 0, return_distances=False, return_indices=True)
    out = label.copy()
    out[grow] = label[tuple(index[grow] for index in nearest)]
    return out


def displacement_field(shape: tuple[int, ...], spacing: np.ndarray, rms_mm: float, smoothness_mm: float,
                       seed: int) -> np.ndarray:
    """``3 x *shape`` displacements in voxels: smoothed white noise whose length has the root mean square
    ``rms_mm`` (in mm) over the volume."""
    rng = np.random.default_rng(seed)
    field = np.stack([ndimage.gaussian_filter(rng.standard_normal(shape), smoothness_mm / spacing, mode="reflect")
                      for _ in range(3)])
    rms = np.sqrt(((field * spacing[:, None, None, None]) ** 2).sum(0).mean())
    return field * (rms_mm / max(float(rms), 1e-12))


def shifted(label: np.ndarray, field: np.ndarray) -> np.ndarray:
    """The label resampled by nearest neighbour at ``x + field(x)``."""
    grid = np.indices(label.shape, dtype=np.float64) + field
    return ndimage.map_coordinates(label, grid, order=0, mode="nearest").astype(label.dtype)


def rater_maps(label: np.ndarray, spacing: np.ndarray, case: str, rms_mm: float, smoothness_mm: float,
               seed: int) -> dict[str, np.ndarray]:
    """The five raters' maps of one case (module docstring)."""
    maps = {"original": label, "eroded": eroded(label), "dilated": dilated(label)}
    for rater in ("shifted_a", "shifted_b"):
        case_seed = zlib.crc32(f"{seed}/{case}/{rater}".encode())
        maps[rater] = shifted(label, displacement_field(label.shape, spacing, rms_mm, smoothness_mm, case_seed))
    return maps


def build(data_root: Path, out: Path, rms_mm: float = 1.0, smoothness_mm: float = 4.0, seed: int = 0) -> dict:
    source = json.loads((data_root / "dataset.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    training = []
    disagreement = []
    for entry in source["training"]:
        image = (data_root / entry["image"]).resolve()
        case = Path(entry["label"]).name[: -len(".nii.gz")]
        link = out / "imagesTr" / image.name
        link.parent.mkdir(exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(image)
        nii = nib.load(data_root / entry["label"])
        label = np.asarray(nii.dataobj).astype(np.uint8)
        spacing = np.asarray(nii.header.get_zooms()[:3], dtype=np.float64)
        labels = []
        maps = rater_maps(label, spacing, case, rms_mm, smoothness_mm, seed)
        for rater in RATERS:
            path = out / f"labelsTr_{rater}" / f"{case}.nii.gz"
            path.parent.mkdir(exist_ok=True)
            nib.save(nib.Nifti1Image(maps[rater], nii.affine, nii.header), path)
            labels.append(f"./labelsTr_{rater}/{case}.nii.gz")
        stack = np.stack([maps[r] for r in RATERS])
        foreground = (stack > 0).any(0)
        disagreement.append(float((stack != stack[:1]).any(0)[foreground].mean()) if foreground.any() else 0.0)
        training.append({"image": f"./imagesTr/{image.name}", "label": labels})
    dataset = {**{k: v for k, v in source.items() if k not in ("training", "test")},
               "name": source.get("name", "") + " with four synthetic raters beside its own (scripts/synthetic_raters.py)",
               "raters": {"names": list(RATERS), "displacement_rms_mm": rms_mm, "smoothness_mm": smoothness_mm,
                          "seed": seed},
               "training": training, "test": [], "numTraining": len(training), "numTest": 0}
    (out / "dataset.json").write_text(json.dumps(dataset, indent=1))
    return {"cases": len(training), "mean_disagreement_of_foreground": float(np.mean(disagreement))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data_root", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--displacement-mm", type=float, default=1.0, help="root mean square of the displacements (mm)")
    p.add_argument("--smoothness-mm", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    result = build(a.data_root, a.out, a.displacement_mm, a.smoothness_mm, a.seed)
    print(f"{result['cases']} cases, raters {', '.join(RATERS)} -> {a.out}; voxels of the raters' foreground union "
          f"where they disagree: {result['mean_disagreement_of_foreground']:.1%} on average")


if __name__ == "__main__":
    main()
