"""Dataset tests run on tiny tensors: one intra-op thread (the private cache is global)."""
import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield
