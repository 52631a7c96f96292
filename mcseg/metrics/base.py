"""MONAI-style cumulative metric: call once per case, ``aggregate()`` over cases, ``reset()``."""

from __future__ import annotations

from typing import Any

__all__ = ["CaseMetric"]


class CaseMetric:
    """Buffers the per-case results of ``compute`` (the functional twin); subclasses reduce them.

    ``__call__`` returns the case's result and keeps it; ``aggregate`` reduces the buffer;
    ``reset`` empties it.
    """

    def __init__(self) -> None:
        self._buffer: list[Any] = []

    def compute(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def aggregate(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.compute(*args, **kwargs)
        self._buffer.append(result)
        return result

    def reset(self) -> None:
        self._buffer.clear()

    def __len__(self) -> int:
        return len(self._buffer)
