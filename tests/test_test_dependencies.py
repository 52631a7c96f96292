"""A missing test dependency skips a test on a developer's machine and is an error in CI (``CI=true``, as CI
services set it): the shared helper of tests/conftest.py, and scripts/setup.sh, whose optional install of
nnU-Net's export code must not fail quietly there."""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, require

ABSENT = "mcseg_no_such_test_dependency"


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_a_missing_test_dependency_is_an_error_under_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=f"{ABSENT} cannot be imported .*: it makes the files of the "
                                                    f"test. Under CI={ci}: a missing test dependency is an error"):
        require(ABSENT, "it makes the files of the test")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_missing_test_dependency_skips_outside_ci_saying_why(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=f"{ABSENT} is not installed: it makes the files of the test"):
        require(ABSENT, "it makes the files of the test")


def test_an_installed_dependency_is_returned(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require("json", "anything").dumps([1]) == "[1]"


def _fake_checkout(tmp_path: Path) -> Path:
    """scripts/setup.sh in a folder of its own, with a .venv whose python installs everything but nnU-Net's
    export code (scripts/nnunet-tests.txt), logging each call."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("scripts/setup.sh", "scripts/nnunet-tests.txt"):
        (repo / name).write_text((ROOT / name).read_text())
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/usr/bin/env bash\necho "$*" >> "$(dirname "$0")/calls"\n'
                      'case "$*" in *nnunet-tests.txt*) echo "ERROR: no matching distribution" >&2; exit 1;; esac\n')
    python.chmod(0o755)
    return repo


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("ci", ["true", None])
def test_setup_fails_under_ci_when_nnunets_export_code_cannot_be_installed(tmp_path, ci, gpu):
    repo = _fake_checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MCSEG_GPU", "MCSEG_TORCH_INDEX", "PYTHON")}
    env["MCSEG_BROWSER"] = "0"  # no apt-get from a test
    if ci:
        env["CI"] = ci
    if gpu:  # the GPU set-up, with an interpreter without torch (.venv's python stands in for the CUDA check)
        env.update(MCSEG_GPU="1", PYTHON="false")
    done = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    calls = (repo / ".venv" / "bin" / "calls").read_text()
    assert "-e .[test]" in calls and "nnunet-tests.txt" in calls  # mcseg first, then the export code
    if ci:
        assert done.returncode != 0, done.stdout + done.stderr
        assert "scripts/nnunet-tests.txt" in done.stderr and "CI=true" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "the tests that need it are skipped" in done.stdout, done.stdout


# ------------------------------------------------------------ what `pip install -e .[test]` brings (issue 55)
FIRST_PARTY = {"mcseg", "tests", "hydra_plugins"}
EXPORT_CODE = "nnunetv2"  # nnU-Net's export code: scripts/nnunet-tests.txt, installed without its dependencies


def _name(requirement: str) -> str:
    """A distribution's normalised name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", requirement).lower()


@functools.cache
def declared_closure() -> frozenset[str]:
    """The distributions `pip install -e .[test]` installs: pyproject.toml's dependencies and its `test` extra, and
    what they require in turn (read from the installed distributions' metadata, with the extras asked for)."""
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = _name(requirement.name)
        if name in seen or name == "mcseg":
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # declared but not installed here: its own requirements are unknown
        for spec in map(Requirement, requires):
            extras = requirement.extras or {""}
            if spec.marker is None or any(spec.marker.evaluate({"extra": e}) for e in extras):
                todo.append(spec)
    return frozenset(seen)


def export_code_distributions() -> set[str]:
    """The distributions scripts/nnunet-tests.txt pins (installed with --no-deps)."""
    lines = (ROOT / "scripts" / "nnunet-tests.txt").read_text().splitlines()
    return {_name(re.split(r"[=<>!~ ;\[]", line.strip(), maxsplit=1)[0]) for line in lines
            if line.strip() and not line.lstrip().startswith("#")}


@functools.cache
def _owners() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def undeclared(modules: set[str], allowed: set[str] | frozenset[str]) -> dict[str, list[str]]:
    """Of the top-level ``modules`` imported, those whose distributions (or absence) are outside ``allowed``:
    standard library, first-party and the scripts' own modules are left out."""
    scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    owners = _owners()
    out = {}
    for module in sorted(modules - set(sys.stdlib_module_names) - FIRST_PARTY - scripts):
        dists = sorted({_name(d) for d in owners.get(module, [])})
        if not dists or not set(dists) & allowed:
            out[module] = dists or ["(not installed)"]
    return out


def test_imports_with_no_declared_distribution_are_found():
    """The check below says something: a module of no declared distribution, or of none installed, is named."""
    assert undeclared({"json", "mcseg", "numpy", "mcseg_no_such_module"}, {"numpy"}) == {
        "mcseg_no_such_module": ["(not installed)"]}
    assert "numpy" in undeclared({"numpy"}, {"torch"})


def _test_imports() -> tuple[set[str], set[str]]:
    """The top-level modules the tests import (import statements anywhere, require() and importorskip() names),
    and the nnU-Net modules among them."""
    modules, nnunet = set(), set()
    for path in ROOT.joinpath("tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                  in ("require", "importorskip") and node.args and isinstance(node.args[0], ast.Constant)):
                names = [node.args[0].value]
            modules |= {n.split(".")[0] for n in names}
            nnunet |= {n for n in names if n.split(".")[0] == EXPORT_CODE}
    return modules, nnunet


def test_every_module_the_tests_import_comes_with_the_test_extra():
    """`pip install -e .[test]` is enough for the tests (README): every third-party module they import belongs to
    a distribution of pyproject.toml's dependencies or `test` extra (or what those require), or to nnU-Net's
    export code (scripts/nnunet-tests.txt, its tests skip without it)."""
    modules, _ = _test_imports()
    assert {"torch", "hypothesis", "relplot", EXPORT_CODE} <= modules  # the scan sees imports, require()s and kin
    missing = undeclared(modules - {EXPORT_CODE}, declared_closure())
    assert not missing, ("modules the tests import that `pip install -e .[test]` does not bring (of a distribution "
                         f"pyproject.toml does not declare, or not installed here): {missing}")


@pytest.mark.slow  # imports nnU-Net's export code (and torch) in a fresh interpreter: about 20 s on 2 cores
def test_nnunets_export_code_needs_nothing_beyond_the_test_extra():
    """The nnU-Net modules the tests import, imported in a fresh interpreter: every module they pull in belongs to
    scripts/nnunet-tests.txt (installed without dependencies) or to the `test` extra's set. scikit-image and pandas
    came from scripts/setup.sh alone, so `pip install -e .[test]` plus the export code failed to import."""
    require(EXPORT_CODE, "the check imports nnU-Net's export code")
    _, nnunet = _test_imports()
    code = ("import importlib, pathlib, sys\n"
            f"for m in {sorted(nnunet)!r}:\n    importlib.import_module(m)\n"
            "sites = [pathlib.Path(p) for p in sys.path if pathlib.Path(p).name in ('site-packages',\n"
            "                                                                       'dist-packages')]\n"
            "files = [pathlib.Path(f) for f in (getattr(m, '__file__', None) for m in list(sys.modules.values()))\n"
            "         if f]\n"
            "tops = {f.relative_to(s).parts[0].split('.')[0] for f in files for s in sites if f.is_relative_to(s)}\n"
            "print(' '.join(sorted(t for t in tops if not t.startswith('__editable__'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    missing = undeclared(set(done.stdout.split()) - {EXPORT_CODE}, declared_closure() | export_code_distributions())
    assert not missing, f"nnU-Net's export code imports modules of no declared distribution: {missing}"


def _setup_calls(tmp_path: Path, gpu: bool) -> list[str]:
    """The pip calls of scripts/setup.sh, with a .venv whose python logs them and succeeds."""
    repo = _fake_checkout(tmp_path)
    python = repo / ".venv" / "bin" / "python"
    python.write_text('#!/usr/bin/env bash\necho "$*" >> "$(dirname "$0")/calls"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MCSEG_GPU", "MCSEG_TORCH_INDEX", "PYTHON")}
    if gpu:
        env.update(MCSEG_GPU="1", PYTHON="false")
    done = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in (python.parent / "calls").read_text().splitlines() if "pip install" in line]


@pytest.mark.parametrize("gpu", [False, True])
def test_setup_installs_the_test_extra_and_the_export_code_only(tmp_path, gpu):
    """scripts/setup.sh installs `.[test]` (on a CPU machine under constraints-cpu.txt) and nnU-Net's export code
    without dependencies, nothing else: a test dependency it installed by name would be missing from
    `pip install -e .[test]`."""
    calls = _setup_calls(tmp_path, gpu)
    extra = "-c constraints-cpu.txt -e .[test]" if not gpu else "-e .[test]"
    assert len(calls) == 2 and calls[0].endswith(f"--disable-pip-version-check {extra}"), calls
    assert calls[1].endswith("--no-deps -r scripts/nnunet-tests.txt"), calls
