"""Deterministic train/val/test splits by case, saved as ``split.json`` and reusable."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPLITS = ("train", "val", "test")


def make_split(case_ids: list[str], val_fraction: float, test_fraction: float, seed: int) -> dict[str, list[str]]:
    """Shuffle ``case_ids`` with ``seed`` and cut them into train/val/test (at least one each)."""
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0 <= value < 1:
            raise ValueError(f"dataset.split.{key}={value}: expected a fraction in [0, 1)")
    if val_fraction + test_fraction >= 1:
        raise ValueError("dataset.split: val_fraction + test_fraction must leave cases for training")
    ids = sorted(case_ids)
    n = len(ids)
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    n_test = max(1, round(n * test_fraction)) if test_fraction > 0 else 0
    if n - n_val - n_test < 1:
        raise ValueError(f"dataset.split: {n} cases are too few for the requested val/test fractions")
    order = np.random.default_rng(seed).permutation(n)
    shuffled = [ids[i] for i in order]
    return {
        "test": sorted(shuffled[:n_test]),
        "val": sorted(shuffled[n_test : n_test + n_val]),
        "train": sorted(shuffled[n_test + n_val :]),
    }


def load_split(path: str | Path, case_ids: list[str]) -> dict[str, list[str]]:
    """Read a ``split.json`` and check that every case it names exists in the dataset."""
    path = Path(path)
    try:
        split = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"dataset.split.file={path}: cannot read split ({exc})") from exc
    known = set(case_ids)
    for name in SPLITS:
        if name not in split:
            raise ValueError(f"{path}: split file has no '{name}' list")
        missing = [c for c in split[name] if c not in known]
        if missing:
            raise ValueError(f"{path}: split '{name}' names cases absent from the dataset: {missing[:5]}")
    return {name: list(split[name]) for name in SPLITS}


def save_split(split: dict[str, list[str]], path: str | Path) -> None:
    from mcseg.data.io import atomic_write

    text = json.dumps(split, indent=1)
    atomic_write(Path(path), lambda tmp: tmp.write_text(text))
