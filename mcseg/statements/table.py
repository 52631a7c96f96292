"""The per-case table every statement is computed from: per case and structure the label-free figures of
:mod:`~mcseg.statements.features` (and, for labelled cases, the truth), so that a statement, its validity over
random splits and a published number all recompute from one small file (``cases.csv``) without the probabilities.
"""
from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcseg.statements.features import FEATURES, MEMBERS, TRUTH

__all__ = ["CaseTable", "read_table"]

COLUMNS = ("voxel_ml", *FEATURES, MEMBERS)  # MEMBERS only where the prediction has members


@dataclass
class CaseTable:
    """``n`` cases x ``K`` structures: ``figures[name]`` is an ``n x K`` float64 array for each of ``voxel_ml``, the
    label-free figures and (``labelled``) the truth; ``structures`` names the K columns."""

    cases: list[str]
    structures: list[str]
    figures: dict[str, np.ndarray]

    @property
    def labelled(self) -> bool:
        return all(name in self.figures for name in TRUTH)

    def __len__(self) -> int:
        return len(self.cases)

    def take(self, rows: Sequence[int] | np.ndarray) -> CaseTable:
        rows = np.asarray(rows, int)
        return CaseTable([self.cases[i] for i in rows], self.structures,
                         {k: v[rows] for k, v in self.figures.items()})

    def unlabelled(self) -> CaseTable:
        """The same cases with the truth left out (what a statement may use of a new case)."""
        return CaseTable(self.cases, self.structures, {k: v for k, v in self.figures.items() if k not in TRUTH})

    @staticmethod
    def from_rows(cases: list[str], structures: list[str], rows: list[dict[str, np.ndarray]]) -> CaseTable:
        """From one dict of per-structure arrays per case (:func:`~mcseg.statements.features.case_features`)."""
        names = [n for n in (*COLUMNS, *TRUTH) if all(n in r for r in rows)]
        return CaseTable(cases, structures, {n: np.stack([np.asarray(r[n], np.float64) for r in rows])
                                             for n in names})

    @staticmethod
    def join(parts: Sequence[CaseTable]) -> CaseTable:
        names = set.intersection(*(set(p.figures) for p in parts))
        return CaseTable([c for p in parts for c in p.cases], parts[0].structures,
                         {n: np.concatenate([p.figures[n] for p in parts]) for n in parts[0].figures if n in names})

    def write(self, path: Path) -> None:
        """``case, structure`` and the figures, one row per case and structure (full float precision)."""
        names = [n for n in (*COLUMNS, *TRUTH) if n in self.figures]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["case", "structure", *names])
            for i, case in enumerate(self.cases):
                for k, structure in enumerate(self.structures):
                    out.writerow([case, structure, *(repr(float(self.figures[n][i, k])) for n in names)])
        tmp.replace(path)


def read_table(path: Path) -> CaseTable:
    """A table written by :meth:`CaseTable.write`."""
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no rows")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    structures = list(dict.fromkeys(r["structure"] for r in rows))
    index = {(r["case"], r["structure"]): r for r in rows}
    missing = [(c, s) for c in cases for s in structures if (c, s) not in index]
    if missing:
        raise ValueError(f"{path}: no row for case {missing[0][0]}, structure {missing[0][1]}")
    names = [n for n in (*COLUMNS, *TRUTH) if n in rows[0]]
    return CaseTable(cases, structures, {n: np.array([[float(index[c, s][n]) for s in structures] for c in cases])
                                         for n in names})
