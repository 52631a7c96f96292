"""Deterministic train/val/test splits by case (or by patient, stratified, with an official test
set where a dataset has one), saved as ``split.json`` and reusable."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcseg.errors import ConfigError

SPLITS = ("train", "val", "test")


def check_split_name(split: str) -> None:
    """``split=`` of ``evaluate.py``: one of the run's splits or ``all`` (checked before torch: ``mcseg.cli``)."""
    if split not in (*SPLITS, "all"):
        raise ConfigError(f"split={split!r}: expected one of {', '.join(SPLITS)} or all")


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
        raise ValueError(f"dataset.split: too few cases ({n}) for the requested val/test fractions")
    order = np.random.default_rng(seed).permutation(n)
    shuffled = [ids[i] for i in order]
    return {
        "test": sorted(shuffled[:n_test]),
        "val": sorted(shuffled[n_test : n_test + n_val]),
        "train": sorted(shuffled[n_test + n_val :]),
    }


def read_split_file(path: Path) -> dict:
    """The JSON of a split file; a missing or unreadable one refused naming ``dataset.split.file``."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"dataset.split.file={path}: cannot read split ({exc})") from exc


def load_split(path: str | Path, case_ids: list[str]) -> dict[str, list[str]]:
    """Read a ``split.json`` and check that every case it names exists in the dataset."""
    path = Path(path)
    split = read_split_file(path)
    known = set(case_ids)
    for name in SPLITS:
        if name not in split:
            raise ValueError(f"{path}: split file has no '{name}' list")
        missing = [c for c in split[name] if c not in known]
        if missing:
            raise ValueError(f"{path}: split '{name}' names cases absent from the dataset: {missing[:5]}")
    return {name: list(split[name]) for name in SPLITS}


def save_split(split: dict[str, list[str]], path: str | Path) -> None:
    from mcseg.files import atomic_write

    text = json.dumps(split, indent=1)
    atomic_write(Path(path), lambda tmp: tmp.write_text(text))


@dataclass
class SplitInfo:
    """What a dataset imposes on its split (:meth:`SegmentationDataset.split_info`).

    Attributes:
        test: the official test cases (used as the test split as they are), or ``None``.
        groups: case id -> group; the cases of a group (the frames of one patient) always
            land in the same split. Cases without a group form their own.
        strata: case id -> stratum (pathology, grade); validation and test draw every
            stratum in proportion.
    """

    test: list[str] | None = None
    groups: dict[str, str] | None = None
    strata: dict[str, str] | None = None


def _apportion(units_by_stratum: dict[str, list[str]], count: int) -> dict[str, int]:
    """Split ``count`` over strata in proportion to their sizes (largest remainders)."""
    total = sum(len(u) for u in units_by_stratum.values())
    if total == 0 or count <= 0:
        return {s: 0 for s in units_by_stratum}
    quotas = {s: count * len(u) / total for s, u in units_by_stratum.items()}
    taken = {s: int(np.floor(q)) for s, q in quotas.items()}
    rest = count - sum(taken.values())
    for s in sorted(quotas, key=lambda s: (-(quotas[s] - taken[s]), s))[:rest]:
        taken[s] += 1
    return taken


def make_grouped_split(
    case_ids: list[str], val_fraction: float, test_fraction: float, seed: int, info: SplitInfo
) -> dict[str, list[str]]:
    """Split by group (never separating a group's cases), stratified, with an optional fixed test set.

    Fractions count groups. With ``info.test`` the test split is that list and
    ``val_fraction`` is the share of the remaining groups; otherwise the fractions are
    shares of all groups, as in :func:`make_split`.
    """
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0 <= value < 1:
            raise ValueError(f"dataset.split.{key}={value}: expected a fraction in [0, 1)")
    ids = sorted(case_ids)
    groups = {c: (info.groups or {}).get(c, f"case:{c}") for c in ids}
    members: dict[str, list[str]] = {}
    for c in ids:
        members.setdefault(groups[c], []).append(c)
    strata = info.strata or {}
    stratum_of = {g: str(strata.get(cs[0], "")) for g, cs in members.items()}
    rng = np.random.default_rng(seed)

    def draw(units: list[str], count: int) -> set[str]:
        by_stratum: dict[str, list[str]] = {}
        for u in sorted(units):
            by_stratum.setdefault(stratum_of[u], []).append(u)
        chosen = set()
        for s, n in sorted(_apportion(by_stratum, count).items()):
            pool = by_stratum[s]
            chosen |= {pool[i] for i in rng.permutation(len(pool))[:n]}
        return chosen

    units = sorted(members)
    if info.test is not None:
        unknown = sorted(set(info.test) - set(ids))
        if unknown:
            raise ValueError(f"official test cases absent from the dataset: {unknown[:5]}")
        test_units = {groups[c] for c in info.test}
        rest = [u for u in units if u not in test_units]
        n_val = max(1, round(len(rest) * val_fraction)) if val_fraction > 0 else 0
    else:
        if val_fraction + test_fraction >= 1:
            raise ValueError("dataset.split: val_fraction + test_fraction must leave cases for training")
        n_test = max(1, round(len(units) * test_fraction)) if test_fraction > 0 else 0
        test_units = draw(units, n_test)
        rest = [u for u in units if u not in test_units]
        n_val = max(1, round(len(units) * val_fraction)) if val_fraction > 0 else 0
    if len(rest) - n_val < 1:
        raise ValueError(f"dataset.split: too few groups of cases ({len(units)}) for the requested val/test fractions")
    val_units = draw(rest, n_val)
    pick = lambda chosen: sorted(c for u in chosen for c in members[u])  # noqa: E731
    return {
        "test": pick(test_units),
        "val": pick(val_units),
        "train": pick(u for u in rest if u not in val_units),
    }


def make_dataset_split(dataset, case_ids: list[str], val_fraction: float, test_fraction: float,
                       seed: int) -> dict[str, list[str]]:
    """The split of a dataset: :func:`make_split` unless the dataset imposes groups, strata or an
    official test set (:meth:`~mcseg.data.base.SegmentationDataset.split_info`)."""
    info = dataset.split_info() if hasattr(dataset, "split_info") else None
    if info is None or (info.test is None and not info.groups and not info.strata):
        return make_split(case_ids, val_fraction, test_fraction, seed)
    return make_grouped_split(case_ids, val_fraction, test_fraction, seed, info)
