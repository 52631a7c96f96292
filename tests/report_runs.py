"""Run directories as mcseg-report reads them, with what report.html's per-case view draws: an MSD-like dataset
folder (imagesTr, labelsTr), and per run eval/test/ written by the real evaluator, predictions, probabilities,
entropy maps and conformal masks."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from mcseg.config import EvalProtocol
from mcseg.data.io import write_nifti
from mcseg.evaluation.evaluator import Evaluator
from tests.metrics.reference import blobs

SHAPE = (20, 16, 8)
CASES = ("c0", "c1", "c2")


def dataset_folder(root: Path) -> Path:
    """imagesTr/<case>_0000.nii.gz and labelsTr/<case>.nii.gz of three cases of two blobs classes."""
    for folder in ("imagesTr", "labelsTr"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for i, case in enumerate(CASES):
        label = blobs(SHAPE, 3, seed=i).numpy()
        image = label * 40.0 + np.random.default_rng(i).normal(0, 10, SHAPE)
        write_nifti(root / "imagesTr" / f"{case}_0000.nii.gz", image.astype(np.float32), np.diag([1, 1, 2.5, 1]))
        write_nifti(root / "labelsTr" / f"{case}.nii.gz", label.astype(np.uint8), np.diag([1, 1, 2.5, 1]))
    return root


def write_run(run: Path, loss: str, seed: int, data: Path | None, noise: float = 1.0) -> Path:
    """A completed run of ``loss`` whose test evaluation the evaluator wrote, with the per-case view's files;
    ``data``: the dataset folder its provenance records (None: none)."""
    out = run / "eval" / "test"
    (out / "predictions").mkdir(parents=True)
    (out / "conformal" / "crc").mkdir(parents=True)
    ev = Evaluator(3, ["bg", "a", "b"], EvalProtocol(bootstrap_samples=10, figures=False))
    affine = np.diag([1, 1, 2.5, 1])
    for i, case in enumerate(CASES):
        label = blobs(SHAPE, 3, seed=i)
        logits = torch.nn.functional.one_hot(label, 3).movedim(-1, 0).float() * 3
        gen = torch.Generator().manual_seed(100 * seed + i)
        probs = torch.softmax(logits + noise * (1 + i) * torch.randn(3, *SHAPE, generator=gen), 0)
        ev.add_case(case, probs, label, (1.0, 1.0, 2.5))
        pred = probs.argmax(0).numpy().astype(np.uint8)
        write_nifti(out / "predictions" / f"{case}.nii.gz", pred, affine)
        write_nifti(out / "predictions" / f"{case}_probs.nii.gz", probs.movedim(0, -1).numpy(), affine)
        entropy = -(probs * probs.clamp_min(1e-7).log()).sum(0).numpy()
        write_nifti(out / "predictions" / f"{case}_entropy.nii.gz", entropy, affine)
        for k, name in ((1, "a"), (2, "b")):
            write_nifti(out / "conformal" / "crc" / f"{case}_sure_{name}.nii.gz", (pred == k).astype(np.uint8), affine)
            write_nifti(out / "conformal" / "crc" / f"{case}_possible_{name}.nii.gz",
                        (probs[k] > 0.1).numpy().astype(np.uint8), affine)
    ev.write(out)
    summary = json.loads((out / "summary.json").read_text())
    summary["provenance"] = {"dataset": {"name": "blobs", "root": str(data) if data else None}}
    (out / "summary.json").write_text(json.dumps(summary))
    identity = {"configuration": f"loss={loss}", "overrides": [f"loss={loss}"], "loss_name": loss, "loss": {},
                "dataset": "blobs", "seed": seed}
    (run / "result.json").write_text(json.dumps({"score": 0.5 + 0.1 * seed, "run": identity}))
    (run / "status.json").write_text(json.dumps({"status": "completed"}))
    return run


def report_runs(root: Path, with_images: bool = True) -> Path:
    """Two losses x two seeds under ``root/runs`` (the second seed's evaluation a copy of the first's); the dataset
    folder under ``root/data`` (recorded only with ``with_images``)."""
    data = dataset_folder(root / "data") if with_images else None
    for loss, noise in (("ce", 1.0), ("margin", 0.6)):
        first = write_run(root / "runs" / f"{loss}0", loss, 0, data, noise)
        shutil.copytree(first, root / "runs" / f"{loss}1")
        result = json.loads((first / "result.json").read_text())
        result["run"]["seed"], result["score"] = 1, 0.6
        (root / "runs" / f"{loss}1" / "result.json").write_text(json.dumps(result))
    return root / "runs"


def built_report(root: Path, cases: int = 4) -> Path:
    """``mcseg-report`` over :func:`report_runs` into ``root/report`` (its folder returned), at most ``cases`` cases
    drawn; the dataset reliability histograms (seconds of matplotlib, not under test) left out."""
    import pytest

    from mcseg.report import cli

    runs = report_runs(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "reliability_histograms", lambda *a, **k: None)
        assert cli.main([str(runs), "--no-eval", "--bootstrap", "10", "--out", str(root / "report"),
                         "--html-cases", str(cases)]) == 0
    return root / "report"
