"""mcseg-report with evaluations against several raters: their columns beside the single-label ones (only when
some row has raters), and reliability_raters.png: against the rater mean beside against the first rater."""
from __future__ import annotations

import csv
import shutil

import numpy as np
import pytest

from mcseg.config import EvalProtocol
from mcseg.evaluation.evaluator import Evaluator
from mcseg.report import cli
from mcseg.report.collect import collect_runs
from mcseg.report.figures import pooled_reliability, reliability_raters
from mcseg.report.table import build_rows

from .metrics.test_rater_evaluator import _case
from .test_rundir import _fake_run

RATER_HEADERS = ("Dice vs raters", "consensus Dice", "thresholded Dice", "ECE vs rater mean", "ECE per rater (CURVAS)",
                 "NLL vs rater mean", "volume CRPS (mL)", "GED", "HM-IoU")


def _rater_run(run, seed: int, cases, with_samples: bool) -> dict:
    """A run of loss=margin whose test evaluation scored three raters (members' samples for the first case)."""
    _fake_run(run, "d", "margin", seed, 0.0, score=0.5)
    shutil.rmtree(run / "eval" / "test")
    evaluator = Evaluator(3, ["background", "a", "b"], EvalProtocol(bootstrap_samples=0, figures=False, n_bins=5),
                          raters=True)
    for i in cases:
        probs, raters, samples = _case(i)
        evaluator.add_case(f"c{i}", probs, raters[0], (1.0, 1.0, 1.0), raters=raters, rater_names=["r1", "r2", "r3"],
                           samples=samples if with_samples and i == cases[0] else None)
    return evaluator.write(run / "eval" / "test")


def _runs(tmp_path) -> list[dict]:
    _fake_run(tmp_path / "ce0", "d", "ce", 0, 0.8, score=0.5)  # a single-label evaluation: no raters
    return [_rater_run(tmp_path / "m0", 0, [0, 1], with_samples=True),
            _rater_run(tmp_path / "m1", 1, [2], with_samples=False)]


def test_rater_columns_beside_the_single_label_ones_only_where_raters_exist(tmp_path):
    summaries = _runs(tmp_path)
    rows = {r.loss_name: r for r in build_rows(collect_runs([tmp_path]), baseline="ce", n_boot=10)}
    assert rows["ce"].raters == {}
    cells = rows["margin"].raters
    means = [s["raters"]["foreground"]["dice_rater_mean"]["mean"] for s in summaries]
    assert cells["dice_raters"].mean == pytest.approx(np.mean(means))
    assert cells["consensus_dice"].n_cases == 3  # per case from per_case_raters.csv, over both seeds' cases
    assert cells["nll_rater_mean"].mean == pytest.approx(np.mean([s["raters"]["case"]["nll_mean"]["mean"]
                                                                  for s in summaries]))
    assert cells["ged"].mean == pytest.approx(summaries[0]["raters"]["case"]["ged"]["mean"])  # seed 0 only
    assert cells["ged"].n_cases == 1

    assert cli.main([str(tmp_path), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report/report.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| loss |"))
    assert header.index("CECE post_T") < header.index("Dice vs raters")
    assert all(f"| {h} |" in header for h in RATER_HEADERS)
    ce = next(line for line in text.splitlines() if line.startswith("| ce (baseline) |"))
    assert ce.rstrip(" |").endswith(" | ".join(["–"] * len(RATER_HEADERS)))
    assert "reliability_raters*.png" in text and "against each case's single label" in text
    with open(tmp_path / "report/report.csv", newline="") as f:
        by_loss = {r["loss"]: r for r in csv.DictReader(f)}
    assert float(by_loss["margin"]["dice_raters_mean"]) == pytest.approx(np.mean(means))
    assert by_loss["ce"]["dice_raters_mean"] == ""
    assert "Dice vs raters" in (tmp_path / "report/report.tex").read_text()
    assert (tmp_path / "report/reliability_raters.png").is_file()


def test_a_report_without_raters_has_no_rater_columns_nor_figure(tmp_path):
    _fake_run(tmp_path / "ce0", "d", "ce", 0, 0.8, score=0.5)
    _fake_run(tmp_path / "m0", "d", "margin", 0, 0.9, score=0.6)
    assert cli.main([str(tmp_path), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report/report.md").read_text()
    assert not any(h in text for h in RATER_HEADERS) and "Several raters" not in text
    assert "dice_raters" not in (tmp_path / "report/report.csv").read_text().splitlines()[0]
    assert not (tmp_path / "report/reliability_raters.png").exists()


def test_reliability_raters_figure_pools_the_seeds_against_the_mean_and_the_first_rater(tmp_path):
    _runs(tmp_path)
    rows = {r.loss_name: r for r in build_rows(collect_runs([tmp_path]), baseline="ce", n_boot=10)}
    fig = reliability_raters(list(rows.values()), "test")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["margin: against the rater mean", "margin: against rater r1"]  # ce: no raters, no panels
    paths = [tmp_path / "m0", tmp_path / "m1"]
    for ax, panel in zip(fig.axes, ("rater mean", "rater r1")):
        conf, observed, counts = pooled_reliability(paths, "test", panel, "reliability_raters.csv")
        assert counts.sum() == 3 * 8 * 7 * 5  # every voxel of both seeds' cases
        x, y = ax.lines[1].get_data()
        np.testing.assert_allclose(x, conf[counts > 0])
        np.testing.assert_allclose(y, observed[counts > 0])
    mean_curve, rater_curve = (ax.lines[1].get_ydata() for ax in fig.axes)
    assert not np.allclose(mean_curve, rater_curve)  # two references, two curves
    fig.canvas.draw()
    rows["margin"].selected = False
    assert reliability_raters(list(rows.values()), "test") is None


def test_the_predictor_table_gets_the_rater_columns_only_where_a_predictor_has_them(tmp_path):
    from mcseg.report.render import predictor_table
    from mcseg.report.table import ConfigRow, predictor_cells

    summaries = _runs(tmp_path)
    row = ConfigRow("d", "margin", "margin", "defaults", [], [0, 1], None)
    row.predictors = {"single": predictor_cells(summaries), "single + T": predictor_cells([{}]),
                      "ensemble of 2": predictor_cells(summaries[:1])}
    header = predictor_table([row])[2]
    assert header.endswith("| AUROC | " + " | ".join(RATER_HEADERS) + " |")
    ensemble = predictor_table([row])[-2]
    assert ensemble.startswith("| margin | defaults | ensemble of 2 | 1 |")
    assert ensemble.endswith(f"| {summaries[0]['raters']['case']['hm_iou']['mean']:.3f} |")
    row.predictors = {name: predictor_cells([{"mean_ece": 0.1}]) for name in ("single", "a", "b")}
    assert predictor_table([row])[2].endswith("| AUROC |")
