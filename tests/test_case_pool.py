"""mcseg.evaluation.case_pool.map_cases: every case's result in case order whatever the workers, and a bounded
number of cases handed out ahead of the caller (their results may be volumes: a fit's log-probabilities)."""
from __future__ import annotations

import io
import multiprocessing.pool
import pickle
import time
from functools import partial
from pathlib import Path

import torch  # noqa: F401  (imported before the fork, as the commands have it: the workers do not import it again)

from mcseg.evaluation.case_pool import AHEAD, _CasePickler, map_cases


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


def _histograms(case: str) -> dict:
    """A scored case's pooled sums: long histograms with few bins filled, and arrays of every kind around them."""
    g = torch.Generator().manual_seed(len(case))
    bins = torch.zeros(1 << 16, dtype=torch.float64)
    bins[torch.randint(0, 1 << 16, (300,), generator=g)] = torch.rand(300, generator=g, dtype=torch.float64)
    bins[5], bins[6], bins[7] = -0.0, float("nan"), -1.5  # a negative zero keeps its sign bit
    table = torch.zeros(3, 26_625, dtype=torch.float64)
    table[:, ::1000] = 2.0
    mask = torch.zeros(40, 50, dtype=torch.bool)
    mask[3, 4:9] = True
    return {"bins": bins, "table": table, "strided": table[:, ::2], "mask": mask, "int": (bins > 0.5).long(),
            "dense": torch.rand(5000, generator=g, dtype=torch.float64), "float32": bins.float()}


def test_mostly_empty_sums_travel_as_their_occupied_entries_with_the_same_bits():
    """Sent whole, a hippocampus case's pooled sums (26,625 fine bins of the adaptive ECE, 2^16 bins per
    uncertainty map of failure detection) were about 1 MB, most of it zeros, pickled by the worker and read and
    unpickled by the main process beside the two workers; their occupied entries are a third of that."""
    result = _histograms("abc")
    whole = sum(t.numel() * t.element_size() for t in result.values())
    buffer = io.BytesIO()
    _CasePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(result)
    assert len(buffer.getvalue()) < 40_000 + 5000 * 8 < whole // 10
    for back in (pickle.loads(buffer.getvalue()), list(map_cases(_histograms, ["x", "abc"], workers=2))[1]):
        assert back.keys() == result.keys()
        for key, t in result.items():
            assert back[key].dtype == t.dtype and back[key].shape == t.shape, key
            assert torch.equal(back[key].view(-1).view(torch.uint8), t.contiguous().view(-1).view(torch.uint8)), key


def _megabyte(case: str) -> torch.Tensor:
    return torch.rand(1 << 17, dtype=torch.float64)  # 1 MB, no zeros: travels whole


def test_the_pools_worker_handler_sleeps_while_results_arrive(monkeypatch):
    """multiprocessing.Pool's worker handler also waited on the result pipe, which stays readable until a whole
    result is read: it looped (every worker polled, the GIL taken) while each 1 MB case came in, a CPU-second
    of the main process per 500 hippocampus cases beside the two workers."""
    calls = []
    monkeypatch.setattr(multiprocessing.pool.Pool, "_maintain_pool",
                        classmethod(lambda cls, *args: calls.append(1)))
    results = list(map_cases(_megabyte, [f"c{i}" for i in range(12)], workers=2))
    assert len(results) == 12
    assert len(calls) < 12  # one at the start, one per change of the pool (no worker exits here)


def _who(case: str) -> tuple[str, int]:
    import os

    time.sleep(0.02)  # a case's work: long enough for the two processes to share the cases
    return case, os.getpid()


def test_the_calling_process_scores_cases_beside_its_children():
    """With N workers the caller is one of them: while the next result in order is a child's and not ready, it
    scores the next case itself (before, it only merged, leaving a core's share idle). Results stay in order."""
    import os

    cases = [f"c{i:02d}" for i in range(40)]
    results = list(map_cases(_who, cases, workers=2))
    assert [case for case, _ in results] == cases
    here = [case for case, pid in results if pid == os.getpid()]
    assert here[0] == "c00"  # the first case always runs here, before the fork
    assert 5 < len(here) < 35  # the rest shared with the child
