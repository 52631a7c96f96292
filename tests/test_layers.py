"""Imports point down the layers, with no circle (docs/reliability.md, README "Layout"):

    entry points -> training -> trackers -> evaluation -> inference -> calibration, data, metrics, models, losses
    (and rundir) -> config, runtime, files (writing) and the other bottom modules

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
    "mcseg.train": 5, "mcseg.evaluate": 5, "mcseg.evaluate_folder": 5, "mcseg.calibrate_folder": 5, "mcseg.conformal_folder": 5, "mcseg.cli": 5, "mcseg.sweep": 5,
    "mcseg.new_cases": 5, "mcseg.optuna_proxy": 5, "mcseg.dicom_export": 5,
    "mcseg.report": 5,
    "mcseg.training": 4,
    "mcseg.trackers": 4,  # beside training, which logs through them (never the other way: NEVER below)
    "mcseg.evaluation": 3,
    "mcseg.inference": 2,
    "mcseg.calibration": 1, "mcseg.data": 1, "mcseg.metrics": 1, "mcseg.models": 1, "mcseg.losses": 1,
    "mcseg.rundir": 1, "mcseg.trials": 1, "mcseg.conformal": 1, "mcseg.statements": 1, "mcseg.slots": 1, "mcseg.submitted": 1,
    "mcseg.config": 0, "mcseg.runtime": 0, "mcseg.errors": 0, "mcseg.targets": 0, "mcseg.environment": 0,
    "mcseg.text": 0, "mcseg.files": 0, "mcseg.identity": 0, "mcseg.registry": 0, "mcseg.signatures": 0,
}
# Within the middle layer: data and metrics never import post-hoc calibration, which builds on both; the trackers
# (used by training, evaluate.py and sweeps) never import training.
NEVER = {"mcseg.data": ("mcseg.calibration",), "mcseg.metrics": ("mcseg.calibration",),
         "mcseg.trackers": ("mcseg.training",)}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module ``from ... import`` names, relative ones (``from .x import y``, ``from .. import y``) resolved
    against ``path``'s package."""
    if node.level == 0:
        return node.module
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]  # a module's package; for a package's __init__ that is the package itself
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, source: str | None = None) -> set[str]:
    """The mcseg modules ``path`` (or ``source`` read as ``path``) imports (``from mcseg.x import y`` or relatively
    ``from .x import y``: ``mcseg.x.y`` when that is a module, else ``mcseg.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(path, node)
            submodules = {f"{module}.{alias.name}" for alias in node.names} & set(MODULES)
            found.update(submodules)
            if len(submodules) < len(node.names):  # a name defined in the module itself
                found.add(module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in MODULES and name != "mcseg"}


def _layer(module: str) -> tuple[str, int]:
    top = ".".join(module.split(".")[:2])
    assert top in LAYERS, f"{module}: place {top} in a layer of tests/test_layers.py (and the docs)"
    return top, LAYERS[top]


def _upward(module: str, imports: set[str]) -> list[str]:
    """Each of ``imports`` that points up the layers from ``module``, or into what ``NEVER`` forbids it."""
    top, layer = _layer(module)
    upward = [f"{module} (layer {layer}) imports {name} (layer {_layer(name)[1]})"
              for name in sorted(imports) if _layer(name)[1] > layer]
    upward += [f"{module} imports {name}" for name in sorted(imports)
               if any(name == n or name.startswith(n + ".") for n in NEVER.get(top, ()))]
    return upward


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "mcseg"))
def test_imports_point_down(module):
    upward = _upward(module, _imports(MODULES[module]))
    assert not upward, upward


def _graph() -> dict[str, set[str]]:
    return {module: _imports(path) - {module} for module, path in MODULES.items() if module != "mcseg"}


def test_no_two_modules_import_each_other_directly_or_through_others():
    cycles = _cycles(_graph())
    assert not cycles, cycles


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle of imports a depth-first walk of ``graph`` meets, as ``a -> b -> a``."""
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
    return cycles


def test_the_layer_test_sees_the_imports_it_checks():
    """The checks above would pass vacuously if the parser missed imports: it must see the known ones."""
    assert "mcseg.evaluation.split" in _imports(MODULES["mcseg.evaluation.shift"])  # a top-level import
    assert "mcseg.rundir" in _imports(MODULES["mcseg.evaluation.ensemble"])  # a lazy one, inside a function
    assert "mcseg.rundir" in _imports(MODULES["mcseg.sweep"])  # from mcseg import rundir
    assert "mcseg.losses.base" in _imports(MODULES["mcseg.losses.ace"])  # from .base import ...
    assert "mcseg.losses.margin" in _imports(MODULES["mcseg.losses"])  # a package's own: from .margin import ...


def test_a_planted_upward_relative_import_or_cycle_is_caught():
    """The same checks on planted sources: an upward relative import in losses/ (layer 1 importing training,
    layer 4), and a relative import back from losses/base.py to losses/ace.py, which imports base."""
    ace, base = MODULES["mcseg.losses.ace"], MODULES["mcseg.losses.base"]
    planted = _imports(ace, ace.read_text() + "\nfrom ..training.trainer import Trainer\n")
    assert _upward("mcseg.losses.ace", planted) == [
        "mcseg.losses.ace (layer 1) imports mcseg.training.trainer (layer 4)"]
    assert _upward("mcseg.losses.ace", _imports(ace)) == []
    graph = _graph()
    graph["mcseg.losses.base"] = _imports(base, base.read_text() + "\nfrom . import ace\n") - {"mcseg.losses.base"}
    assert "mcseg.losses.base -> mcseg.losses.ace -> mcseg.losses.base" in _cycles(graph)
    assert _cycles(_graph()) == []


def test_every_module_of_the_package_imports():
    """No module names a path that no longer exists (issue #35 moved engine/ into three packages)."""
    walked = {info.name for info in pkgutil.walk_packages(mcseg.__path__, "mcseg.")}
    assert walked == set(MODULES) - {"mcseg"}, set(MODULES) ^ walked - {"mcseg"}
    for name in sorted(walked):
        importlib.import_module(name)
    assert not (PACKAGE / "engine").exists()
