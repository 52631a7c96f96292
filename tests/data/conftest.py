"""Fixtures of the dataset tests: a private preprocessing cache and one intra-op thread."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Never touch ~/.cache: every test gets its own preprocessing cache."""
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors on a shared machine: one intra-op thread is faster."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
