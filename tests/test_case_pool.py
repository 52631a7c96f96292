"""mcseg.evaluation.case_pool.map_cases: every case's result in case order whatever the workers, and a bounded
number of cases handed out ahead of the caller (their results may be volumes: a fit's log-probabilities)."""
from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch  # noqa: F401  (imported before the fork, as the commands have it: the workers do not import it again)

from mcseg.evaluation.case_pool import AHEAD, map_cases


def _mark(folder: Path, case: str) -> str:
    """A case's job: say that it started (a file named after it), return the case in capitals."""
    (folder / case).touch()
    return case.upper()


def test_results_come_in_case_order_and_few_cases_run_ahead_of_the_caller(tmp_path):
    """With Pool.imap every case was handed out at once: while the caller worked on the first result, the workers
    read the whole folder and their results (volumes, for a fit) waited in memory. Now at most AHEAD per worker."""
    cases = [f"c{i:02d}" for i in range(24)]
    started = []
    results = []
    for result in map_cases(partial(_mark, tmp_path), cases, workers=2):
        if len(results) == 1:  # the first case ran here; the workers' first result is in: the caller is slow
            time.sleep(1.0)
            started = list(tmp_path.iterdir())
        results.append(result)
    assert results == [c.upper() for c in cases]
    # the parent's case, the awaited one and what was handed out beyond it (one more each time a result came)
    assert len(started) <= 1 + 1 + AHEAD * 2 + 1 < len(cases)


def _tensors(case: str) -> dict:
    """A scored case's shape of result: many small tensors."""
    return {"case": case, "sums": [torch.full((3,), float(i)) for i in range(20)]}


def test_a_workers_tensors_come_back_as_plain_bytes_not_through_shared_memory():
    """Handed to the pool as they were, a result's tensors went through torch's multiprocessing reductions: each
    storage moved to shared memory, its file descriptor sent over a socket of its own (5 of the main process's
    6 CPU seconds on 60 hippocampus cases). Pickled to bytes in the worker, they arrive as ordinary tensors."""
    results = list(map_cases(_tensors, ["a", "b", "c"], workers=2))
    assert [r["case"] for r in results] == ["a", "b", "c"]
    for r in results[1:]:  # the first case runs in this process
        assert all(torch.equal(t, torch.full((3,), float(i))) for i, t in enumerate(r["sums"]))
        assert not any(t.is_shared() for t in r["sums"])


def _kinds(case: str) -> dict:
    """Tensors of the kinds a scored case holds, and one numpy cannot hold (bfloat16)."""
    g = torch.Generator().manual_seed(len(case))
    return {"float64": torch.rand(5, 4, generator=g, dtype=torch.float64), "int64": torch.arange(7) * 3,
            "bool": torch.rand(6, generator=g) > 0.5, "scalar": torch.tensor(2.5), "strided": torch.arange(12.)[::3],
            "bfloat16": torch.rand(3, generator=g).to(torch.bfloat16), "empty": torch.zeros(0, 3)}


def test_a_workers_tensors_come_back_with_their_dtype_shape_and_bits():
    for case, result in zip(["x", "yy", "zzz"], map_cases(_kinds, ["x", "yy", "zzz"], workers=2)):
        expected = _kinds(case)
        assert result.keys() == expected.keys()
        for key, t in expected.items():
            assert result[key].dtype == t.dtype and result[key].shape == t.shape, key
            assert torch.equal(result[key], t), key
