"""Which code and which environment produced a result.

Every checkpoint, ``result.json`` and evaluation (``summary.json`` and ``provenance.json``) carries
:func:`environment_record`, so two tables made months apart can be told apart and ``mcseg-report``
can warn when it compares runs of different code, libraries or device types
(:func:`environment_differences`). The git state is read once per process from the checkout the
``mcseg`` package is imported from; an installed copy outside a checkout says ``unknown``.
"""
from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

UNKNOWN = "unknown"
PACKAGE_DIR = Path(__file__).resolve().parent

# What decides the numbers of a comparison: a run differing from the others in one of these is marked
# by mcseg-report (name in the record -> how the warning names it).
COMPARED = {"code": "code", "libraries": "library versions", "device_type": "device type"}


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(PACKAGE_DIR), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """mcseg's version, the git commit of the checkout it runs from, whether that tree had uncommitted changes
    to tracked files (``git_dirty``: the code is not exactly the commit) and how many untracked paths it held that
    git does not ignore (``git_untracked``, as ``git status`` lists them, a folder once: data, outputs, notes; not
    code changes of the commit, so they do not make the tree dirty): ``unknown`` outside a checkout."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit else None
    lines = [line for line in (status or "").splitlines() if line.strip()]
    untracked = [line for line in lines if line.startswith("??")]
    return {
        "mcseg": _version("mcseg"),
        "git_commit": commit.strip() if commit else UNKNOWN,
        "git_dirty": len(lines) > len(untracked) if status is not None else UNKNOWN,
        "git_untracked": len(untracked) if status is not None else UNKNOWN,
    }


def library_versions() -> dict:
    """The interpreter's and the numerical libraries' versions."""
    import monai
    import numpy

    return {"python": platform.python_version(), "torch": str(torch.__version__), "monai": str(monai.__version__),
            "numpy": str(numpy.__version__), "hydra": _version("hydra-core")}


def environment_record(device: torch.device | str, deterministic: bool, reductions_before: int = 0) -> dict:
    """What produced a result: code, libraries, device and the CPU threads: the configured count, and
    ``cpu_threads_lowered``, how often :class:`mcseg.runtime.AdaptiveThreads` dropped to one thread since
    the process had counted ``reductions_before`` (a run's start: a sweep runs jobs in one process)."""
    from mcseg.runtime import cpu_name, thread_reductions, torch_threads

    device = torch.device(device)
    cuda = device.type == "cuda"
    return {
        "code": code_version(),
        "libraries": library_versions(),
        "device_type": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "cuda": torch.version.cuda if cuda else None,
        "cpu_threads": torch_threads(),
        "cpu_threads_lowered": thread_reductions() - reductions_before,
        "deterministic": bool(deterministic),
    }


# Recorded but not compared: untracked files beside the code do not change the code a run ran.
NOT_COMPARED = ("git_untracked",)


def _key(record: dict | None, name: str) -> str:
    if not record or name not in record:
        return UNKNOWN
    value = record[name]
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items() if k not in NOT_COMPARED)
    return str(value)


def environment_differences(records: dict[str, dict | None]) -> tuple[list[str], dict[str, list[str]]]:
    """Compare the environment records of the runs a table compares (label -> record; None: a result of a
    version that recorded none).

    Returns the warnings (one per compared aspect on which the runs differ, with the values and how many
    runs have each) and, per label, the aspects in which that run differs from the most common value.
    Runs made from a tree with uncommitted changes to tracked files are warned of too: their code is not known
    exactly (untracked files, ``git_untracked``, are not code changes and are neither warned of nor compared).
    """
    warnings: list[str] = []
    dirty = sorted(label for label, record in records.items() if (record or {}).get("code", {}).get("git_dirty") is True)
    if dirty:
        warnings.append(f"{len(dirty)} of the {len(records)} runs were made from a tree with uncommitted changes "
                        f"(first: {dirty[0]}): their code is not exactly the commit they name")
    marks: dict[str, list[str]] = {label: [] for label in records}
    for name, words in COMPARED.items():
        values = {label: _key(record, name) for label, record in records.items()}
        counts: dict[str, int] = {}
        for value in values.values():
            counts[value] = counts.get(value, 0) + 1
        if len(counts) < 2:
            continue
        common = max(counts, key=lambda v: (counts[v], v != UNKNOWN))
        warnings.append(f"the runs compared were made with different {words}: "
                        + "; ".join(f"{value} ({n} run{'s' if n > 1 else ''})" for value, n in counts.items()))
        for label, value in values.items():
            if value != common:
                marks[label].append(words)
    return warnings, marks
