"""What produced a result: a checkpoint's identity (path, sha256, epoch), a dataset's identity, a split.

Training stores the split's case ids and the dataset's identity in every checkpoint
(``Trainer.provenance``); every evaluation writes them, with the checkpoint's hash and the
overrides it was run with, into ``summary.json`` (key ``provenance``) and ``provenance.json``
beside ``per_case.csv``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from mcseg.data.base import SegmentationDataset

CHUNK = 1 << 20  # hash files in 1 MiB reads: a checkpoint never has to fit in memory twice


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_identity(path: str | Path, state: dict, sha256: str | None = None) -> dict:
    """Path, sha256 and epoch of a checkpoint file (``sha256`` when already computed)."""
    return {"path": str(Path(path).resolve()), "sha256": sha256 or file_sha256(path),
            "epoch": state.get("epoch"), "best_epoch": state.get("best_epoch")}


def split_case_ids(refs: dict) -> dict[str, list[str]]:
    """``{"train": [...], "val": [...], "test": [...]}`` case ids of a split of case references."""
    return {name: [r.case_id for r in part] for name, part in refs.items()}


def dataset_identity(dataset: SegmentationDataset, case_ids: list[str]) -> dict:
    """Name, root, classes, channels and a fingerprint of the case ids of a dataset."""
    ids = sorted(case_ids)
    root = getattr(dataset, "root", None)
    return {
        "name": dataset.name, "root": str(root) if root is not None else None,
        "n_cases": len(ids), "cases_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
        "num_classes": dataset.num_classes, "class_names": list(dataset.class_names),
        "in_channels": dataset.in_channels, "multilabel": bool(dataset.multilabel),
    }


def hydra_overrides() -> list[str]:
    """The command-line overrides of the running Hydra job ([] outside one)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
