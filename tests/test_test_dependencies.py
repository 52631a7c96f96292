"""A missing test dependency skips a test on a developer's machine and is an error in CI (``CI=true``, as CI
services set it): the shared helper of tests/conftest.py, and scripts/setup.sh, whose optional install of
nnU-Net's export code must not fail quietly there."""
from __future__ import annotations

import os
import subprocess
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
