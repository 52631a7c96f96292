"""A run's own test evaluation runs the conformal pass with conformal.enabled=true (issue #46, "every path"): the
same conformal.json as evaluate.py writes for the run's best checkpoint, and nothing of it by default."""
from __future__ import annotations

import json

import pytest

from mcseg.evaluate import evaluate
from mcseg.train import train
from tests.conftest import TINY_2D, compose_config

pytestmark = pytest.mark.slow  # two tiny trainings and an evaluation


def _fit_and_test(record: dict) -> dict:
    return {key: record[key] for key in ("alpha", "method", "loss", "classes", "fit_cases", "test")}


def test_run_evaluation_writes_what_evaluate_writes(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    train(make_cfg([*TINY_2D, "logger=none", "conformal.enabled=true", "conformal.alpha=0.4",
                    "conformal.statements=true"], output_dir=run))
    summary = json.loads((run / "eval/test/summary.json").read_text())
    evaluate(compose_config("evaluate", ["evaluation.bootstrap_samples=10", f"ckpt={run}", "split=test",
                                         "conformal.enabled=true", "conformal.alpha=0.4",
                                         "conformal.statements=true", f"eval_dir={tmp_path / 'eval'}"], tmp_path / "job"))
    sources = sorted(p.name for p in (run / "eval/test/conformal").iterdir())
    assert sources == sorted(p.name for p in (tmp_path / "eval/conformal").iterdir()) and "raw" in sources
    for source in sources:
        ours = json.loads((run / "eval/test/conformal" / source / "conformal.json").read_text())
        theirs = json.loads((tmp_path / "eval/conformal" / source / "conformal.json").read_text())
        assert _fit_and_test(ours) == _fit_and_test(theirs)
        assert ours["applied"]["split_cases"] == theirs["applied"]["split_cases"]
        # the new-case statements (issue #54) of the run's test cases, fitted on its validation cases, alike
        mine = json.loads((run / "eval/test/conformal" / source / "statements/statements.json").read_text())
        other = json.loads((tmp_path / "eval/conformal" / source / "statements/statements.json").read_text())
        assert mine == other and mine["calibration_cases"] == ours["fit_cases"]
        assert mine["new_cases"] == ours["applied"]["split_cases"] and len(mine["rows"]) > 0
    assert set(summary["conformal"]) == set(sources)


def test_disabled_by_default(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    cfg = make_cfg([*TINY_2D, "logger=none"], output_dir=tmp_path / "run")
    assert cfg.conformal.enabled is False
    train(cfg)
    assert not (tmp_path / "run/eval/test/conformal").exists()
    assert "conformal" not in json.loads((tmp_path / "run/eval/test/summary.json").read_text())


def _conformal_images(run, prefix: str) -> dict:
    """The run's TensorBoard images whose tag starts with ``prefix``: tag -> its events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    return {t: events.Images(t) for t in events.Tags()["images"] if t.startswith(prefix)}


def test_overlays_logged_to_tensorboard(make_cfg, tmp_path, monkeypatch):
    """By the run's own test evaluation, and by evaluate.py of the run's checkpoint (its trackers reopened from
    trackers.json, TensorBoard included), at the run's last step."""
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    conformal = ["conformal.enabled=true", "conformal.alpha=0.4", "conformal.figures=1", "conformal.posthoc=false"]
    train(make_cfg([*TINY_2D, "logger=tensorboard", *conformal], output_dir=run))
    record = json.loads((run / "eval/test/conformal/raw/conformal.json").read_text())
    first = record["applied"]["split_cases"][0]
    assert f"{first}_conformal.png" in record["applied"]["files"]
    images = _conformal_images(run, "conformal/")
    # the first conformal.figures cases, of each source, and its coverage figure over the re-splits
    assert sorted(images) == sorted([f"conformal/raw/{first}", "conformal/raw/coverage"])
    image = images[f"conformal/raw/{first}"][0]
    assert image.width > 100 and image.height > 100 and image.encoded_image_string[:4] == b"\x89PNG"

    evaluate(compose_config("evaluate", ["evaluation.bootstrap_samples=10", f"ckpt={run}", "split=test",
                                         "overwrite=true", *conformal], tmp_path / "job"))
    images = _conformal_images(run, "eval/")
    # eval/<its folder under eval/>/conformal/...: the overlay and the coverage figure
    assert sorted(images) == sorted([f"eval/test/conformal/raw/{first}", "eval/test/conformal/raw/coverage"])
    [image] = images[f"eval/test/conformal/raw/{first}"]
    assert image.step == json.loads((run / "trackers.json").read_text())["step"]
    assert image.width > 100 and image.encoded_image_string[:4] == b"\x89PNG"


def _text(value) -> str:
    """A margin as the report writes it ('–': none, e.g. too few calibration cases for the quantile)."""
    return "–" if value is None else f"{value:.3g}"


def test_report_section(make_cfg, tmp_path, monkeypatch):
    from mcseg.report.cli import main as report

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "runs/run"
    train(make_cfg([*TINY_2D, "logger=none", "conformal.enabled=true", "conformal.alpha=0.4", "conformal.figures=1",
                    "conformal.posthoc=false"], output_dir=run))
    assert report([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--no-eval", "--bootstrap", "10"]) == 0
    text = (tmp_path / "report/report.md").read_text()
    section = text[text.index("## Conformal guarantees"):].split("\n## ")[0]
    record = json.loads((run / "eval/test/conformal/raw/conformal.json").read_text())
    for name, fit in record["classes"].items():
        test = record["test"][name]
        line = next(line for line in section.splitlines() if f"| raw | {name} |" in line)
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[-7:] == [f"{fit['threshold']:.3g}", "yes" if fit["controlled"] else "NO",
                              f"{test['mean_loss']:.3f} / 0.4", f"{test['mean_set_over_prediction']:.3f}",
                              _text(fit["margin"]["outer_mm"]), _text(fit["margin"]["inner_mm"]),
                              str(fit["n_cases"])]
    figure = f"{record['applied']['split_cases'][0]}_conformal.png"
    assert f"(../runs/run/eval/test/conformal/raw/{figure})" in section
    assert (tmp_path / "report" / "../runs/run/eval/test/conformal/raw" / figure).is_file()


def test_bad_node_refused_before_training(make_cfg, tmp_path):
    from mcseg.errors import ConfigError

    with pytest.raises(ConfigError, match="conformal.alpha"):
        train(make_cfg([*TINY_2D, "logger=none", "conformal.alpha=1.5"], output_dir=tmp_path / "run"))
    assert not (tmp_path / "run/checkpoints").exists()
