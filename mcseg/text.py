"""Small helpers for messages shown to users."""
from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``"1 case"``, ``"2 cases"``: a count with its noun (``nouns``: an irregular plural)."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
