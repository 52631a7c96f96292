"""Imports point down the layers, with no circle (docs/reliability.md, README "Layout"):

    entry points -> training -> evaluation -> inference -> calibration, data, metrics, models, losses
    (and rundir) -> config and runtime

Read from the source, so a lazy import inside a function counts; every module of ``mcseg`` must also import."""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import mcseg

PACKAGE = Path(__file__).resolve().parent.parent / "mcseg"
# Each top-level module or package of mcseg and its layer, top (entry points) to bottom (config, runtime).
LAYERS = {
    "mcseg.train": 5, "mcseg.evaluate": 5, "mcseg.evaluate_folder": 5, "mcseg.calibrate_folder": 5, "mcseg.cli": 5, "mcseg.sweep": 5,
    "mcseg.report": 5,
    "mcseg.training": 4,
    "mcseg.evaluation": 3,
    "mcseg.inference": 2,
    "mcseg.calibration": 1, "mcseg.data": 1, "mcseg.metrics": 1, "mcseg.models": 1, "mcseg.losses": 1,
    "mcseg.rundir": 1,
    "mcseg.config": 0, "mcseg.runtime": 0, "mcseg.errors": 0, "mcseg.targets": 0, "mcseg.environment": 0,
    "mcseg.text": 0,
}
# Within the middle layer: data and metrics never import post-hoc calibration, which builds on both.
NEVER = {"mcseg.data": ("mcseg.calibration",), "mcseg.metrics": ("mcseg.calibration",)}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """The mcseg modules ``path`` imports (``from mcseg.x import y``: ``mcseg.x.y`` when that is a module, else ``mcseg.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(MODULES)
            found.update(submodules)
            if len(submodules) < len(node.names):  # a name defined in node.module itself
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in MODULES and name != "mcseg"}


def _layer(module: str) -> tuple[str, int]:
    top = ".".join(module.split(".")[:2])
    assert top in LAYERS, f"{module}: place {top} in a layer of tests/test_layers.py (and the docs)"
    return top, LAYERS[top]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "mcseg"))
def test_imports_point_down(module):
    top, layer = _layer(module)
    upward = [f"{module} (layer {layer}) imports {name} (layer {_layer(name)[1]})"
              for name in sorted(_imports(MODULES[module])) if _layer(name)[1] > layer]
    upward += [f"{module} imports {name}" for name in sorted(_imports(MODULES[module]))
               if any(name == n or name.startswith(n + ".") for n in NEVER.get(top, ()))]
    assert not upward, upward


def test_no_two_modules_import_each_other_directly_or_through_others():
    graph = {module: _imports(path) - {module} for module, path in MODULES.items() if module != "mcseg"}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for name in sorted(graph[module]):
            if state.get(name) == 1:
                cycles.append(" -> ".join(path[path.index(name):] + [name]))
            elif name not in state:
                visit(name, path + [name])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_the_layer_test_sees_the_imports_it_checks():
    """The checks above would pass vacuously if the parser missed imports: it must see the known ones."""
    assert "mcseg.evaluation.split" in _imports(MODULES["mcseg.evaluation.shift"])  # a top-level import
    assert "mcseg.rundir" in _imports(MODULES["mcseg.evaluation.ensemble"])  # a lazy one, inside a function
    assert "mcseg.rundir" in _imports(MODULES["mcseg.sweep"])  # from mcseg import rundir


def test_every_module_of_the_package_imports():
    """No module names a path that no longer exists (issue #35 moved engine/ into three packages)."""
    walked = {info.name for info in pkgutil.walk_packages(mcseg.__path__, "mcseg.")}
    assert walked == set(MODULES) - {"mcseg"}, set(MODULES) ^ walked - {"mcseg"}
    for name in sorted(walked):
        importlib.import_module(name)
    assert not (PACKAGE / "engine").exists()
