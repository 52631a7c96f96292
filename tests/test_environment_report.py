"""mcseg-report warns, and marks the rows, when the runs it compares were made by other code, libraries or devices."""
from __future__ import annotations

import json

from mcseg.environment import environment_differences
from mcseg.report import cli
from mcseg.report.collect import collect_runs
from mcseg.report.table import build_rows

from .test_rundir import _fake_run

CODE = {"mcseg": "0.1.0", "git_commit": "a" * 40, "git_dirty": False}
LIBS = {"python": "3.11.2", "torch": "2.13.0+cpu", "monai": "1.6.1", "numpy": "2.1.0", "hydra": "1.3.2"}


def _env(**changes) -> dict:
    record = {"code": dict(CODE), "libraries": dict(LIBS), "device_type": "cpu", "device_name": "x", "cuda": None,
              "cpu_threads": 2, "cpu_threads_lowered": 0, "deterministic": True}
    for key, value in changes.items():
        if key in record["libraries"]:
            record["libraries"][key] = value
        elif key in record["code"]:
            record["code"][key] = value
        else:
            record[key] = value
    return record


def _with_environment(run, environment):
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**result, "environment": environment}))


def test_runs_of_other_libraries_code_or_devices_are_warned_of_and_their_rows_marked(tmp_path, capsys):
    for name, loss, seed, env in [("ce0", "ce", 0, _env()), ("ce1", "ce", 1, _env()), ("m0", "margin", 0, _env()),
                                  ("m1", "margin", 1, _env(torch="2.6.0+cu124", device_type="cuda")),
                                  ("f0", "focal", 0, None)]:  # f0: a run of a version that recorded nothing
        _fake_run(tmp_path / name, "acdc", loss, seed, 0.8, score=0.5)
        if env is not None:
            _with_environment(tmp_path / name, env)
    rows = {r.loss_name: r for r in build_rows(collect_runs([tmp_path]), baseline="ce", n_boot=10)}
    assert rows["ce"].environment_differs == []
    assert rows["margin"].environment_differs == ["device type", "library versions"]
    assert rows["focal"].environment_differs == ["code", "device type", "library versions"]

    assert cli.main([str(tmp_path), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report/report.md").read_text()
    assert "| margin †" in text and "| focal †" in text and "| ce (baseline) |" in text
    assert "different library versions" in text and "torch 2.6.0+cu124" in text and "different device type" in text
    csv = (tmp_path / "report/report.csv").read_text()
    assert "environment_differs" in csv.splitlines()[0] and "device type library versions" in csv


def test_the_same_environment_gives_no_warning_and_a_dirty_tree_one():
    same = {"a": _env(), "b": _env()}
    assert environment_differences(same) == ([], {"a": [], "b": []})
    warnings, marks = environment_differences({"a": _env(git_dirty=True), "b": _env(git_dirty=True)})
    assert marks == {"a": [], "b": []} and len(warnings) == 1 and "uncommitted changes" in warnings[0]
    warnings, marks = environment_differences({"a": _env(), "b": _env(), "c": _env(git_commit="b" * 40)})
    assert marks["c"] == ["code"] and marks["a"] == [] and "2 runs" in warnings[0] and "1 run)" in warnings[0]
