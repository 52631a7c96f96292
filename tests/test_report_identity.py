"""mcseg-report compares what runs ran, on which data, by which code: configurations by their resolved config,
datasets by content, and a warning (with marked rows) where code, libraries or devices differ."""
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


def _identified(run, configuration_sha256: str, dataset_content: str, configuration: str | None = None):
    result = json.loads((run / "result.json").read_text())
    result["run"].update(configuration_sha256=configuration_sha256, dataset_content=dataset_content)
    if configuration:
        result["run"]["configuration"] = configuration
    (run / "result.json").write_text(json.dumps(result))


def test_a_default_spelt_out_is_one_configuration_and_two_roots_of_one_preset_two_datasets(tmp_path):
    """#22.2: `optim.lr=0.001` (the default) made a second configuration, hid the duplicate seed and tested two
    identical runs against each other; a 4-case and a 10-case root of `dataset=msd` were one dataset."""
    for name, loss, seed, config, content, label in [
            ("ce_s0", "ce", 0, "c_ce", "big", None), ("ce_s1", "ce", 1, "c_ce", "big", None),
            ("ce_lr_s1", "ce", 1, "c_ce", "big", "loss=ce optim.lr=0.001"),  # the same run, a default spelt out
            ("focal_s0", "focal", 0, "c_focal", "big", None),
            ("ce_small_s0", "ce", 0, "c_ce", "small", None)]:  # the preset on another root
        _fake_run(tmp_path / name, "msd", loss, seed, 0.8, score=0.5)
        _identified(tmp_path / name, config, content, label)
    runs = collect_runs([tmp_path])
    rows = build_rows(runs, baseline="ce", n_boot=10)
    assert [r.path.name for r in runs if r.duplicate_of] == ["ce_s1"] or \
        [r.path.name for r in runs if r.duplicate_of] == ["ce_lr_s1"]
    by = {(r.dataset, r.loss_name): r for r in rows}
    assert set(by) == {("msd [big]", "ce"), ("msd [big]", "focal"), ("msd [small]", "ce")}
    assert by["msd [big]", "ce"].seeds == [0, 1] and by["msd [big]", "ce"].configuration == "loss=ce"
    assert by["msd [big]", "ce"].baseline and by["msd [small]", "ce"].baseline  # each dataset its own baseline


def test_the_configuration_hash_ignores_paths_loggers_workers_and_spelt_out_defaults(make_cfg, tmp_path):
    from omegaconf import OmegaConf

    from mcseg.evaluation.provenance import configuration_sha256

    def sha(*overrides):
        cfg = make_cfg(list(overrides), output_dir=tmp_path / "x")
        return configuration_sha256(OmegaConf.to_container(cfg, resolve=True))

    base = sha()
    lr = OmegaConf.to_container(make_cfg([]).optim)["lr"]
    assert sha(f"optim.lr={lr}") == base
    assert sha("logger=none", "dataset.sampling.num_workers=3", "trainer.progress_bar=false", "seed=7",
               "+dataset.root=/elsewhere") == base
    assert sha(f"optim.lr={lr * 2}") != base and sha("loss=focal") != base


def test_runs_left_out_keep_one_table_row_per_run_whatever_their_error():
    """Issue #34 section 3 (smaller): the "Runs left out" table broke on multi-line errors (every bad loss
    argument gives one): each run is one row, its error on one line."""
    from pathlib import Path

    from mcseg.report.collect import RunRecord

    error = "ConfigError: loss=margin:\n  loss.margin=-1: expected > 0\n  loss.alpha=2 | 3: expected a number"
    runs = [RunRecord(Path("sweep/0_margin"), "c", "margin", {}, 0, "failed", error=error),
            RunRecord(Path("sweep/1_ce"), "c", "ce", {}, 0, "failed", error="ValueError: one line")]
    lines = [line for line in cli.failure_lines(runs) if line]
    assert lines[:3] == ["## Runs left out", "| run | status | error |", "|---|---|---|"]
    assert len(lines) == 5 and all(line.startswith("| ") and line.endswith(" |") for line in lines[3:])
    assert lines[3] == ("| sweep/0_margin | failed | ConfigError: loss=margin: loss.margin=-1: expected > 0 "
                        "loss.alpha=2 / 3: expected a number |")


def test_untracked_files_are_recorded_apart_from_code_changes(tmp_path, monkeypatch):
    """Issue 55: every run launched from a clone with an untracked folder (data, outputs) recorded
    ``git_dirty: true`` and the report warned that its code was not the commit. Untracked files are not code
    changes: counted apart (``git_untracked``); only modified tracked files make a tree dirty and warn."""
    import subprocess

    from mcseg import environment

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-q", "-m", "code")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "run.log").write_text("a run's output\n")
    (tmp_path / "notes.txt").write_text("untracked\n")
    monkeypatch.setattr(environment, "PACKAGE_DIR", tmp_path)
    environment.code_version.cache_clear()
    try:
        clean = environment.code_version()
        assert clean["git_dirty"] is False and clean["git_untracked"] == 2
        untracked_only = _env(git_dirty=clean["git_dirty"])
        untracked_only["code"]["git_untracked"] = clean["git_untracked"]
        # neither a dirty-tree warning nor "different code" beside a run of the same commit without them
        assert environment_differences({"a": untracked_only, "b": _env()}) == ([], {"a": [], "b": []})
        (tmp_path / "code.py").write_text("x = 2\n")
        environment.code_version.cache_clear()
        changed = environment.code_version()
        assert changed["git_dirty"] is True and changed["git_untracked"] == 2
        warnings, _ = environment_differences({"a": _env(git_dirty=True), "b": _env()})
        assert any("uncommitted changes" in w for w in warnings)
    finally:
        environment.code_version.cache_clear()
