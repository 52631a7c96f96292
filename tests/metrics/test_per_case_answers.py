"""Every per-case figure and the pooled ones, to the last bit, as recorded before the per-case speed work of
issue #58 (``tests/answers/per_case_figures.json``, recorded by main at fc7de3a).

The speed-ups (shared FFTs of the smooth ECE, one bucketize and three bincounts for pECE, surfaces without the
background, ...) must not move a single bit of what a user reads: the values are compared with ``==`` (NaN equal to
NaN), not within a tolerance. The inputs are exact on every machine: probabilities are ratios of small integers
(one correctly rounded division), the label maps integer ellipsoids, and torch runs on one thread (the thread count
orders float reductions). The figures also pass through log, exp, sqrt and FFTs, whose last bits another CPU's
kernels might round differently: the answers were recorded on the project's CPU machine. A change meant to move a
figure updates the answers in the same commit and says why::

    MCSEG_UPDATE_ANSWERS=1 .venv/bin/python -m pytest tests/metrics/test_per_case_answers.py
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mcseg.config import EvalProtocol
from mcseg.evaluation.evaluator import Evaluator
from tests.regression import ANSWERS_DIR, UPDATE

BOOK = ANSWERS_DIR / "per_case_figures.json"


def _ellipsoids(shape, k: int, rng: np.random.Generator) -> np.ndarray:
    """A label map of k - 1 integer ellipsoids (later classes drawn over earlier ones)."""
    axes = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    label = np.zeros(shape, dtype=np.int64)
    for c in range(1, k):
        centre = [int(rng.integers(n // 4, 3 * n // 4 + 1)) for n in shape]
        radius = [int(rng.integers(2, max(3, n // 3))) for n in shape]
        inside = sum(((x - c0) * 1000 // r) ** 2 for x, c0, r in zip(axes, centre, radius)) <= 1000**2
        label[inside] = c
    return label


def _case(seed: int, shape, k: int, missing: int | None = None):
    """Probabilities a / sum(a) of integer weights that mostly favour the label (some voxels one-hot: exact 0 and
    1), the label map; ``missing``: a class never in the label (a false alarm or a class absent from both)."""
    rng = np.random.default_rng(seed)
    label = _ellipsoids(shape, k, rng)
    if missing is not None:
        label[label == missing] = 0
    weights = rng.integers(0, 40, size=(k, *shape)).astype(np.float32)
    np.put_along_axis(weights, label[None], np.take_along_axis(weights, label[None], 0) + 60, 0)
    onehot = rng.random(shape) < 0.1
    weights[:, onehot] = 0
    weights[rng.integers(0, k, size=int(onehot.sum())), onehot] = 7
    probs = weights / weights.sum(0, keepdims=True)
    return torch.from_numpy(probs), torch.from_numpy(label)


CASES = {  # name: (seed, shape, classes, class missing from the label, spacing)
    "hippocampus_like": (1, (18, 24, 17), 3, None, (1.0, 1.0, 1.0)),
    "anisotropic": (2, (20, 16, 9), 4, None, (0.8, 0.7, 2.5)),
    "class_absent": (3, (14, 15, 13), 4, 2, (1.0, 1.25, 1.5)),
    "slice": (4, (40, 31), 3, None, (0.9, 1.1)),
}


def _plain(value):
    """JSON-able, NaN as the string 'nan' (compared as equal)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return "nan" if math.isnan(value) else float(value)
    if isinstance(value, (np.integer, bool)):
        return int(value) if isinstance(value, np.integer) else value
    return value


def _figures(region: str, multilabel: bool = False) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        groups: dict[tuple[int, int], list[str]] = {}  # (spatial axes, classes): the cases of one evaluator
        for name, (_, shape, k, _, _) in CASES.items():
            groups.setdefault((len(shape), k), []).append(name)
        out = {}
        for (ndim, k), names in groups.items():
            if multilabel:
                ev = Evaluator(k - 1, [f"r{i}" for i in range(1, k)],
                               EvalProtocol(region=region, bootstrap_samples=0), multilabel=True)
            else:
                ev = Evaluator(k, [f"c{i}" for i in range(k)], EvalProtocol(region=region, bootstrap_samples=0))
            for name in names:
                seed, shape, _, missing, spacing = CASES[name]
                probs, label = _case(seed, shape, k, missing)
                if multilabel:  # region r: p_r against label == r
                    probs = probs[1:].clone()
                    label = torch.stack([label == r for r in range(1, k)]).to(torch.uint8)
                out[name] = ev.add_case(name, probs, label, spacing)
            out[f"pooled_{ndim}d_{k}_classes"] = ev.pooled_values()
        return _plain(out)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("region,multilabel", [("all", False), ("union_foreground", False), ("boundary", False),
                                               ("all", True)])
def test_per_case_figures_are_those_recorded(region, multilabel):
    key = f"{region}{'_multilabel' if multilabel else ''}"
    values = _figures(region, multilabel)
    answers = json.loads(BOOK.read_text()) if BOOK.is_file() else {}
    if UPDATE:
        answers[key] = values
        BOOK.write_text(json.dumps(dict(sorted(answers.items())), indent=1) + "\n")
        return
    assert key in answers, f"no answer {key!r} in {BOOK}: run with MCSEG_UPDATE_ANSWERS=1 and commit the answers"
    moved = [f"{case}/{name}: {answers[key][case].get(name)!r} -> {value!r}"
             for case, figures in values.items() for name, value in figures.items()
             if answers[key].get(case, {}).get(name) != value]
    assert values == answers[key], (
        f"{key}: {len(moved)} figure(s) moved (to the last bit): " + "; ".join(moved[:8]))
