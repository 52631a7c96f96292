"""A dataset's root folder: resolved against the folder the user launched from and checked to exist. Torch-free,
so that ``train.py`` and ``evaluate.py`` refuse ``dataset.root=/no/such/folder`` right after Hydra composes
(``mcseg.cli``), before torch and the data are loaded; each dataset that has a root resolves it here again.
"""
from __future__ import annotations

import os
from pathlib import Path


def resolve_root(root: str | os.PathLike | None, key: str = "dataset.root") -> Path:
    """Resolve a dataset root against the directory the user launched from; check it exists."""
    if root in (None, "", "???"):
        raise FileNotFoundError(f"{key} is not set: give {key}=/path/to/dataset")
    path = Path(os.path.expanduser(str(root)))
    if not path.is_absolute():
        try:
            from hydra.utils import get_original_cwd

            path = Path(get_original_cwd()) / path
        except ValueError:  # not inside a Hydra run
            path = Path.cwd() / path
    if not path.is_dir():
        raise FileNotFoundError(f"{key}={root}: directory {path} does not exist")
    return path.resolve()
