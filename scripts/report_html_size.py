"""How large report.html's per-case view makes the page: one case of a given grid drawn as mcseg-report draws it.

    python scripts/report_html_size.py --shape 512 512 200            # a CT-sized case, synthetic volumes
    python scripts/report_html_size.py --case hippocampus_001 --images ../shared/data/hippocampus/imagesTr \\
        --labels ../shared/data/hippocampus/labelsTr                  # a real hippocampus image and label

Writes the case's image, label, prediction, entropy map and conformal masks as NIfTI into a temporary folder
(synthetic: a smooth image with ellipsoid structures; with --case, the prediction is the label shifted by one voxel
and the masks its erosion and dilation: the size depends on the grid and the image, not on a network), draws it with
:func:`mcseg.report.case_view.render_case` and prints the bytes the case adds to report.html and the seconds taken,
for each ``--size`` (pixels of a slice's longer side) and ``--slices``. docs/report_html.md quotes its output.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import ndimage

from mcseg.data.io import write_nifti
from mcseg.evaluation.case_files import CaseFiles
from mcseg.report.case_view import render_case


def synthetic(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A smooth noisy image and a label of two ellipsoid classes on ``shape``."""
    rng = np.random.default_rng(seed)
    grid = np.ogrid[tuple(slice(0, n) for n in shape)]
    label = np.zeros(shape, np.uint8)
    for k, (centre, radii) in enumerate((((0.45, 0.5, 0.5), (0.2, 0.15, 0.3)), ((0.6, 0.4, 0.45), (0.1, 0.12, 0.2))),
                                        start=1):
        inside = sum(((g - c * n) / (r * n)) ** 2 for g, c, r, n in zip(grid, centre, radii, shape)) <= 1
        label[inside] = k
    image = ndimage.gaussian_filter(rng.normal(0, 1, shape).astype(np.float32), 2) * 30 + label * 60.0
    return image.astype(np.float32), label


def case_folder(folder: Path, image: np.ndarray, label: np.ndarray, affine: np.ndarray) -> CaseFiles:
    """The case's files as an evaluation leaves them (uncompressed NIfTI: quicker to write, the same to draw)."""
    pred = np.roll(label, 1, axis=0)
    entropy = ndimage.gaussian_filter((ndimage.binary_dilation(pred > 0, iterations=2)
                                       ^ ndimage.binary_erosion(pred > 0, iterations=2)).astype(np.float32), 1)
    paths = {}
    for name, array in (("image", image), ("label", label), ("pred", pred), ("entropy", entropy * 0.69),
                        ("sure", ndimage.binary_erosion(pred > 0, iterations=2)),
                        ("possible", ndimage.binary_dilation(pred > 0, iterations=3))):
        paths[name] = folder / f"{name}.nii"
        write_nifti(paths[name], np.asarray(array, dtype=np.float32 if array.dtype.kind == "f" else np.uint8), affine)
    return CaseFiles("case", "measure", 0.5, prediction=paths["pred"], uncertainty=paths["entropy"],
                     image=paths["image"], label=paths["label"], sure=[paths["sure"]], possible=[paths["possible"]])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(512, 512, 200))
    parser.add_argument("--case", help="a case of --images and --labels instead of a synthetic one")
    parser.add_argument("--images", type=Path)
    parser.add_argument("--labels", type=Path)
    parser.add_argument("--size", type=int, nargs="+", default=[160])
    parser.add_argument("--slices", type=int, nargs="+", default=[32])
    args = parser.parse_args(argv)
    import nibabel as nib

    if args.case:
        img = nib.load(str(args.images / f"{args.case}.nii.gz"))
        image, affine = np.asanyarray(img.dataobj).astype(np.float32), img.affine
        label = np.asanyarray(nib.load(str(args.labels / f"{args.case}.nii.gz")).dataobj).astype(np.uint8)
    else:
        image, label = synthetic(tuple(args.shape))
        affine = np.diag([0.8, 0.8, 1.5, 1.0])
    with tempfile.TemporaryDirectory() as tmp:
        files = case_folder(Path(tmp), image, label, affine)
        for size in args.size:
            for slices in args.slices:
                start = time.perf_counter()
                case = render_case(files, size, slices)
                seconds = time.perf_counter() - start
                print(json.dumps({"grid": list(image.shape), "size": size, "slices": slices,
                                  "bytes": len(json.dumps(case, separators=(",", ":"))),
                                  "seconds": round(seconds, 2)}))


if __name__ == "__main__":
    main()
