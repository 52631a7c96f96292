"""What a ``_target_`` accepts, read from its source text without importing it: the checks of a training config
(:func:`mcseg.config.validate_train_config` with ``imports=False``) refuse ``optim.lr=abc`` before torch, MONAI
and the data are loaded (``import torch`` alone takes seconds; a typo should not wait for it).

:func:`static_parameters` mirrors :func:`mcseg.config._accepted_parameters` (the parameters of the target by name,
walking ``**kwargs`` up the base classes, annotations as types) from the target's module parsed with :mod:`ast`:
names followed through ``from x import y [as z]``, ``import x`` and ``from x import *``, relative imports
resolved, modules found from their package's folder (``importlib.util.find_spec`` of the top-level name only,
which imports nothing). It never refuses what the import-time check accepts: where the source does not say for
certain (a decorated function or class, several bases, a ``__getattr__`` module, an alias assigned at module
level, an annotation naming what it cannot follow), it answers None (no check of that node) or takes the
annotation as "anything" (``object``). A class in an annotation is kept as a stand-in of the same name (values
from a config are never its instances, as at import time) unless a base of it may make a string or a number one
(an enum, a path, a protocol: anything from the standard library but ``object``).
"""
from __future__ import annotations

import ast
import builtins
import collections.abc
import functools
import importlib.util
import inspect
import sys
import typing
from pathlib import Path

COMPILED = "compiled"  # a module without Python source (an extension): its names are taken as they come
_PLAIN = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "tuple": tuple, "dict": dict,
          "object": object}
_SPECIAL = ("typing", "typing_extensions", "collections.abc", "_collections_abc")


@functools.lru_cache(maxsize=None)
def _module_source(name: str):
    """(path, parsed tree, is a package) of module ``name``, :data:`COMPILED`, or None when not found; only the
    top-level package is looked up through importlib (``find_spec`` of a dotted name would import its parents)."""
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin)
    if rest and not spec.submodule_search_locations:
        return None
    folder = path.parent
    for i, part in enumerate(rest):
        package = folder / part / "__init__.py"
        if package.is_file():
            path, folder = package, folder / part
        elif i == len(rest) - 1 and (folder / f"{part}.py").is_file():
            path = folder / f"{part}.py"
        elif i == len(rest) - 1 and (any(folder.glob(f"{part}.*.so")) or (folder / f"{part}.so").is_file()):
            return COMPILED
        else:
            return None
    if path.suffix != ".py":
        return COMPILED
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    return path, tree, path.name == "__init__.py"


def _statements(body: list) -> list:
    """A module's top-level statements, ``try`` blocks included (``if`` blocks, TYPE_CHECKING ones, are not)."""
    out = []
    for node in body:
        if isinstance(node, ast.Try):
            out += _statements(node.body)
        else:
            out.append(node)
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _resolve(module: str, name: str, depth: int = 0):
    """What ``name`` is in ``module``: ("def", module, ClassDef or FunctionDef), ("module", dotted name),
    (COMPILED, module, name), ("alias",) for a value assigned there, or None when the source does not say."""
    source = _module_source(module)
    if source is None or depth > 20:
        return None
    if source == COMPILED:
        return (COMPILED, module, name)
    _, tree, is_package = source
    found, stars = None, []
    for node in _statements(tree.body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            found = ("def", module, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _assigned(node):
            found = ("alias",)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    found = ("module", alias.name if alias.asname else name)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            for alias in node.names:
                if alias.name == "*":
                    stars.append(base)
                elif (alias.asname or alias.name) == name:
                    found = ("from", base, alias.name)
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and found is None:
            found = ("lazy",)
    if found and found[0] == "from":
        _, base, original = found
        return _resolve(base, original, depth + 1) or (("module", f"{base}.{original}")
                                                        if _module_source(f"{base}.{original}") else None)
    if found and found[0] in ("def", "module", "alias"):
        return found
    if found is None:
        for base in stars:
            hit = _resolve(base, name, depth + 1)
            if hit:
                return hit
        if _module_source(f"{module}.{name}"):
            return ("module", f"{module}.{name}")
    return None


def _assigned(node) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _expression(module: str, node: ast.expr):
    """What a name or dotted name in ``module``'s source refers to (as :func:`_resolve`), ("builtin", name) for
    a builtin, None when unknown."""
    if isinstance(node, ast.Name):
        hit = _resolve(module, node.id)
        if hit is None and hasattr(builtins, node.id) and _module_source(module) not in (None, COMPILED):
            return ("builtin", node.id)
        return hit
    if isinstance(node, ast.Attribute):
        owner = _expression(module, node.value)
        if owner and owner[0] == "module":
            return _resolve(owner[1], node.attr)
    return None


def _qualified(hit) -> tuple[str, str] | None:
    if hit and hit[0] in ("def", COMPILED):
        return hit[1], hit[2].name if hit[0] == "def" else hit[2]
    return None


class Unknown(Exception):
    """An annotation names something the source does not resolve (then, as at import time, none is checked)."""


def _hint(module: str, node: ast.expr | None):
    """An annotation as a type :func:`mcseg.config.fits` understands (``object``: anything); :class:`Unknown`
    when a name cannot be followed."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return type(None)
        if isinstance(node.value, str):
            try:
                return _hint(module, ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                raise Unknown(node.value) from None
        return object
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return typing.Union[_hint(module, node.left), _hint(module, node.right)]
    if isinstance(node, ast.Subscript):
        origin = _hint(module, node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if origin is typing.Literal:
            if not all(isinstance(i, ast.Constant) for i in items):
                return object
            return typing.Literal[tuple(i.value for i in items)]
        args = tuple(Ellipsis if isinstance(i, ast.Constant) and i.value is Ellipsis else _hint(module, i)
                     for i in items)
        try:
            return origin[args if len(args) > 1 else args[0]]
        except TypeError:
            return object
    if isinstance(node, (ast.Name, ast.Attribute)):
        hit = _expression(module, node)
        if hit is None:
            raise Unknown(ast.unparse(node))
        if hit[0] == "builtin":
            return _PLAIN.get(hit[1], object)
        where = _qualified(hit)
        if where and where[0] in _SPECIAL:
            return getattr(collections.abc if "collections" in where[0] else typing, where[1], object)
        if hit[0] == "def" and isinstance(hit[2], ast.ClassDef) and _only_objects(hit[1], hit[2]):
            return _stand_in(*where)
        return object
    return object


@functools.lru_cache(maxsize=None)
def _stand_in(module: str, name: str) -> type:
    """A class named as ``module.name`` (``describe_type`` says "a Tensor") of which no config value is an instance."""
    return type(name, (), {"__module__": module})


def _only_objects(module: str, node: ast.ClassDef, depth: int = 0) -> bool:
    """Whether no base of the class may make a plain value its instance (an enum, a path, a protocol, a metaclass:
    anything from the standard library but ``object``, or a base the source does not resolve)."""
    if node.keywords or depth > 20:
        return False
    for base in node.bases:
        hit = _expression(module, base)
        if hit is None or hit[0] in ("alias", "module"):
            return False
        if hit[0] == "builtin":
            if hit[1] != "object":
                return False
        elif hit[0] == COMPILED:
            continue
        elif hit[1].split(".")[0] in sys.stdlib_module_names or not _only_objects(hit[1], hit[2], depth + 1):
            return False
    return True


def _function_parameters(module: str, fn: ast.FunctionDef) -> tuple[list[inspect.Parameter], bool]:
    """``fn``'s parameters (annotations as types; none at all where one cannot be followed, as
    ``typing.get_type_hints`` fails then) and whether it takes ``**kwargs``."""
    a = fn.args
    kinds = ([(p, inspect.Parameter.POSITIONAL_ONLY) for p in a.posonlyargs]
             + [(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
             + [(p, inspect.Parameter.KEYWORD_ONLY) for p in a.kwonlyargs])
    try:
        hints = {p.arg: _hint(module, p.annotation) for p, _ in kinds if p.annotation is not None}
        if fn.returns is not None:
            _hint(module, fn.returns)
    except Unknown:
        hints = {}
    params = [inspect.Parameter(p.arg, kind, annotation=hints.get(p.arg, inspect.Parameter.empty))
              for p, kind in kinds]
    return params, a.kwarg is not None


def static_parameters(target: str) -> tuple[dict[str, inspect.Parameter], bool] | None:
    """The parameters of ``target`` (a dotted ``_target_``) by name and whether it also takes keywords it does not
    name, as :func:`mcseg.config._accepted_parameters` finds them by importing it; None when its source does not
    say for certain."""
    parts = target.split(".")
    hit = None
    for i in range(len(parts) - 1, 0, -1):
        if _module_source(".".join(parts[:i])):
            hit = ("module", ".".join(parts[:i]))
            for name in parts[i:]:
                hit = _resolve(hit[1], name) if hit and hit[0] == "module" else None
            break
    if not hit or hit[0] != "def":
        return None
    module, node = hit[1], hit[2]
    if isinstance(node, ast.FunctionDef):
        if node.decorator_list:
            return None
        params, open_ended = _function_parameters(module, node)
        return {p.name: p for p in params}, open_ended
    found: dict[str, inspect.Parameter] = {}
    for _ in range(50):  # down the (single) base classes, as the import-time check walks the MRO
        if node.decorator_list or node.keywords:
            return None
        own = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        if any(isinstance(n, (ast.Assign, ast.AnnAssign)) and "__init__" in _assigned(n) for n in node.body):
            return None
        if own:
            if own[-1].decorator_list:
                return None
            params, open_ended = _function_parameters(module, own[-1])
            for p in params:
                found.setdefault(p.name, p)
            if not open_ended:
                return found, False
        if not node.bases:  # object.__init__ takes **kwargs
            return found, True
        if len(node.bases) > 1:
            return None
        base = _expression(module, node.bases[0])
        if base is None or base[0] in ("alias", "module"):
            return None
        if base[0] != "def":  # object, or a class without source: open-ended at import time too
            return found, True
        module, node = base[1], base[2]
    return None
