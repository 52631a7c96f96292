"""Dataset configs share their base (configs/dataset_base/files.yaml) through Hydra's defaults instead of
repeating it, and each sets only what differs from it."""
from __future__ import annotations

from pathlib import Path

import yaml

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BASE = "/dataset_base/files@_here_"


def _own(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_every_file_dataset_starts_from_the_base_and_restates_none_of_it():
    base = _own(CONFIGS / "dataset_base" / "files.yaml")
    for path in sorted((CONFIGS / "dataset").glob("*.yaml")):
        own = _own(path)
        defaults = own.get("defaults", [])
        parent = [d for d in defaults if isinstance(d, str) and d != "_self_"]
        if "synthetic" in path.stem or (parent and parent[0] != BASE):
            continue  # the built-in phantoms, or a dataset derived from another one (hippocampus from msd)
        assert parent == [BASE], f"{path.name}: expected '{BASE}' first in its defaults, found {defaults}"
        for key, value in own.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                same = {k for k, v in value.items() if k in base[key] and base[key][k] == v}
                assert not same, f"{path.name}: {key}.{sorted(same)} restate the base's value"
            elif key in base:
                assert base[key] != value, f"{path.name}: {key} restates the base's value"
