"""The acceptance check of issue #46 on hippocampus, recomputed without mcseg (numpy and nibabel only): for each run
and alpha, the CRC threshold per class from the saved validation probabilities (the largest grid t with
n/(n+1) * mean FNR + 1/(n+1) <= alpha, grid 0, 0.01, ..., 1, set {p_k >= t}) and the mean FNR of the saved test
probabilities there, against what evaluate.py recorded (docs/results/conformal/<run>/fixed/a<alpha>/<source>/).
Raw: <run>/eval/{val,test}/predictions; temperature: the probabilities mcseg-calibrate-folder wrote with the
same temperature (<run>/calibrated_val, <run>/calibrated_test). Prints one line per run, alpha, source and class
and the largest differences.

    python scripts/conformal_recheck.py RUNS_DIR docs/results/conformal LABELS_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nibabel as nib
import numpy as np

GRID = np.linspace(0.0, 1.0, 101)
FOLDERS = {"raw": ("eval/val/predictions", "eval/test/predictions"), "temperature": ("calibrated_val",
                                                                                      "calibrated_test")}


def fnr_curves(folder: Path, labels: Path, classes: list[int]) -> np.ndarray:
    """Cases x classes x grid: 1 - |{p_k >= t} ∩ G_k| / |G_k| (every hippocampus case has both classes)."""
    curves = []
    for f in sorted(folder.glob("*_probs.nii.gz")):
        p = np.asarray(nib.load(f).dataobj, dtype=np.float32)
        g = np.asarray(nib.load(labels / f.name.replace("_probs", "")).dataobj).astype(int)
        rows = []
        for k in classes:
            inside = np.sort(p[..., k][g == k])
            rows.append(np.searchsorted(inside, GRID.astype(np.float32), side="left") / len(inside))
        curves.append(rows)
    return np.array(curves)


def main(runs: Path, results: Path, labels: Path) -> int:
    worst_t, worst_fnr = 0.0, 0.0
    for run_results in sorted(p for p in results.iterdir() if (p / "fixed").is_dir()):
        run = runs / run_results.name
        for source, (val_dir, test_dir) in FOLDERS.items():
            val, test = fnr_curves(run / val_dir, labels, [1, 2]), fnr_curves(run / test_dir, labels, [1, 2])
            n = len(val)
            for alpha_dir in sorted((run_results / "fixed").iterdir()):
                record = json.loads((alpha_dir / source / "conformal.json").read_text())
                alpha = record["alpha"]
                for i, name in enumerate(("Anterior", "Posterior")):
                    bound = n / (n + 1) * val[:, i].mean(0) + 1 / (n + 1)
                    j = int(np.nonzero(bound <= alpha)[0].max())
                    fnr = float(test[:, i, j].mean())
                    t_mcseg, fnr_mcseg = record["classes"][name]["threshold"], record["test"][name]["mean_loss"]
                    worst_t, worst_fnr = max(worst_t, abs(GRID[j] - t_mcseg)), max(worst_fnr, abs(fnr - fnr_mcseg))
                    print(f"{run.name} alpha={alpha} {source} {name}: t={GRID[j]:.2f} (mcseg {t_mcseg:.2f}), bound "
                          f"there {bound[j]:.4f} <= {alpha} and {bound[j + 1] if j < 100 else float('nan'):.4f} "
                          f"at the next grid t; test FNR {fnr:.6f} (mcseg {fnr_mcseg:.6f}); {n} val, {len(test)} "
                          f"test cases")
    print(f"largest difference: threshold {worst_t:.3g}, test FNR {worst_fnr:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*(Path(a) for a in sys.argv[1:4])))
