"""Imports point down the layers: entry points -> engine/calibration -> data/models/losses/metrics ->
config/utilities (docs/reliability.md). Read from the source, so a lazy import inside a function counts."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mcseg"
ENTRY = ("mcseg.train", "mcseg.evaluate", "mcseg.evaluate_folder", "mcseg.cli", "mcseg.sweep", "mcseg.report")
LAYERS = {  # a module (or package) and the modules it must never import
    "mcseg.config": ("mcseg.engine", "mcseg.calibration", "mcseg.data", "mcseg.models", "mcseg.losses",
                     "mcseg.metrics", *ENTRY),
    "mcseg.data": ("mcseg.engine", "mcseg.calibration", *ENTRY),
    "mcseg.metrics": ("mcseg.engine", "mcseg.calibration", *ENTRY),
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_imports_point_down(module):
    relative = Path(*module.split(".")[1:])
    files = sorted((PACKAGE / relative).rglob("*.py")) if (PACKAGE / relative).is_dir() \
        else [PACKAGE / relative.with_suffix(".py")]
    assert files
    upward = [f"{path.relative_to(PACKAGE.parent)} imports {name}" for path in files for name in sorted(_imports(path))
              if any(name == up or name.startswith(up + ".") for up in LAYERS[module])]
    assert not upward, upward
