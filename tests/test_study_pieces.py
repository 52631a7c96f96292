"""A study in committed pieces (scripts/study_pieces.py, issue #33): one configuration trained and evaluated per
piece, its raw tables written where git keeps them, and the study's table assembled from those alone."""
from __future__ import annotations

import csv
import json
import sys
from dataclasses import replace

import pytest

from .conftest import ROOT, TINY_2D

sys.path.insert(0, str(ROOT / "scripts"))
import study_pieces  # noqa: E402
import study_presets  # noqa: E402
import study_rater_table  # noqa: E402
from study_presets import Study  # noqa: E402


def _piece(base, config: str, rows: list[dict], **piece) -> None:
    folder = base / config
    folder.mkdir(parents=True)
    study_pieces.write_rows(folder / "per_evaluation.csv", rows)
    record = {"commit": "abc1234", "finished": "2026-12-04T15:30:00", "training_seconds": {"seed0": 100.0},
              "evaluation_seconds": {"ensemble": 20.0}, "load_average": {"mean": 2.1, "max": 2.6, "cores": 2}}
    (folder / "piece.json").write_text(json.dumps({**record, **piece}))


def _row(config: str, predictor: str, seed, dice: float, ece: float) -> dict:
    return {"configuration": config, "predictor": predictor, "seed": seed, "seconds": 0.0,
            **{c: None for c in study_pieces.COLUMNS}, "Dice": dice, "ECE": ece}


def test_the_table_is_assembled_from_committed_pieces_only_and_the_readme_names_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(study_presets, "results_dir", lambda study: tmp_path / study)
    base = tmp_path / "uncertainty_study"
    _piece(base, "ce_dice", [_row("CE + Dice", "single", s, d, e) for s, d, e in
                             [(0, 0.84, 0.10), (1, 0.86, 0.14), (2, 0.85, 0.12)]])
    _piece(base, "focal", [_row("focal", "single", 0, 0.80, 0.2)])
    (base / "ls").mkdir()  # a piece cut short: no piece.json, so not a piece
    text = study_pieces.assemble("uncertainty_study")
    line = next(r for r in text.splitlines() if r.startswith("| CE + Dice | single |"))
    assert "| 3 | 0.850 ± 0.010 |" in line and "0.120 ± 0.020" in line  # mean ± sample std over the seeds
    assert (base / "table.md").read_text() == text
    assert len(list(csv.DictReader(open(base / "per_evaluation.csv")))) == 4
    readme = (base / "README.md").read_text()
    assert "| ce_dice | abc1234 |" in readme and "| focal |" in readme and "| ls |" not in readme
    assert "Pieces still to run: ce, ls, margin3." in readme
    assert "python scripts/study_pieces.py uncertainty_study --config ce" in readme


def test_seed0_is_compared_with_the_published_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(study_presets, "results_dir", lambda study: tmp_path / study)
    published = tmp_path / "uncertainty_study"
    published.mkdir()
    with open(published / "seed0_per_evaluation.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["configuration", "predictor", "seconds", *study_pieces.COLUMNS])
        writer.writeheader()
        writer.writerow({"configuration": "experiment=hippocampus_study loss.margin=3 loss=margin",
                         "predictor": "single", "seconds": 0, "Dice": 0.844, "ECE": 0.056})
    same = study_pieces.published_seed0("uncertainty_study", "margin3", {"Dice": 0.8441, "ECE": 0.0562})
    assert same["reproduced"] and same["max_abs_difference"] == pytest.approx(2e-4)
    other = study_pieces.published_seed0("uncertainty_study", "margin3", {"Dice": 0.848, "ECE": 0.056})
    assert not other["reproduced"] and other["max_abs_difference"] == pytest.approx(4e-3)
    assert study_pieces.published_seed0("uncertainty_study", "ce", {"Dice": 0.8}) is None  # nothing published


def test_an_unknown_configuration_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(SystemExit, match="'cee' is not a configuration of newer_losses: one of .*'mdca'"):
        study_pieces.run_piece("newer_losses", "cee", tmp_path, 1)


@pytest.mark.slow  # three tiny trainings in subprocesses and five evaluations: about a minute on 2 cores
def test_a_piece_trains_evaluates_every_predictor_and_resumes_without_training_again(tmp_path, monkeypatch):
    tiny = Study({"ce": ["loss=ce"]}, {"ce": "CE"}, seeds=(0, 1), dropout=0.3, mc_samples=2, tta_seeds=(0,),
                 ensembles=True, extra=("evaluation.bootstrap_samples=10",),
                 base=(*TINY_2D, "trainer.deterministic=true", "evaluation.bootstrap_samples=10"))
    monkeypatch.setitem(study_pieces.STUDIES, "tiny", tiny)
    monkeypatch.setattr(study_presets, "results_dir", lambda study: tmp_path / "docs" / study)
    out = study_pieces.run_piece("tiny", "ce", tmp_path / "runs", 2)
    rows = list(csv.DictReader(open(out / "per_evaluation.csv")))
    assert {r["predictor"] for r in rows} == {
        "single", "single + T", "ensemble of 2", "ensemble of 2 + T (pooled)",
        "ensemble of 2 + T (each network's, then pooled)", "TTA (flips)", "TTA (flips) + T (pooled)",
        "dropout net, one pass", "dropout net, one pass + T", "MC dropout (2)", "MC dropout (2) + T (pooled)"}
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "dropout_seed0", "ensemble", "ensemble_pool_after", "mc2_seed0", "single_seed0", "single_seed1",
        "tta_flips_seed0"]
    ensemble = json.loads((out / "ensemble/summary.json").read_text())
    row = next(r for r in rows if r["predictor"] == "ensemble of 2")
    assert float(row["Dice"]) == pytest.approx(ensemble["mean_foreground_dice"])
    assert (out / "mc2_seed0/per_case.csv").is_file()
    piece = json.loads((out / "piece.json").read_text())
    assert set(piece["training_seconds"]) == {"seed0", "seed1", "dropout_seed0"}
    assert all(s > 0 for s in piece["training_seconds"].values()) and piece["load_average"]["cores"]
    logs = {p: p.stat().st_size for p in (tmp_path / "runs").rglob("*.train.log")}
    assert len(logs) == 3
    study_pieces.run_piece("tiny", "ce", tmp_path / "runs", 2)  # the run folders are there: nothing trains again
    assert {p: p.stat().st_size for p in logs} == logs
    again = json.loads((out / "piece.json").read_text())
    assert again["training_seconds"] == piece["training_seconds"]  # each job's own record, read back
    assert len(again["earlier_runs"]) == 1
    assert [r["Dice"] for r in csv.DictReader(open(out / "per_evaluation.csv"))] == [r["Dice"] for r in rows]


def _rater_summary(label_dice: float, per_rater_dice: dict[str, float]) -> dict:
    """A summary.json of one multi-rater evaluation: its hard-label figures and the ``raters`` part."""
    return {"mean_foreground_dice": label_dice, "mean_ece": 0.2,
            "raters": {"per_rater": {name: {"mean_foreground_dice": d, "ece_curvas": 0.03}
                                     for name, d in per_rater_dice.items()},
                       "foreground": {"dice_rater_mean": {"mean": 0.75}},
                       "case": {"ece_mean": {"mean": 0.025}}}}


def test_the_rater_table_scores_every_row_against_the_same_references(tmp_path, monkeypatch):
    """A network trained on rater ``original`` is evaluated against ``original`` as its hard label (issue #43):
    its label figures are not the majority label's, so the table shows them as not scored and gives every row
    the same per-rater columns."""
    monkeypatch.setattr(study_presets, "results_dir", lambda study: tmp_path / study)
    base = tmp_path / "multirater"
    for config, target, label_dice, per_rater in (
            ("ce_mean", "mean", 0.799, {"original": 0.802, "eroded": 0.744}),
            ("ce_original", "original", 0.820, {"original": 0.820, "eroded": 0.737})):
        _piece(base, config, [_row(config, "single", 0, label_dice, 0.2)], label=config,
               overrides=["loss=ce", f"dataset.raters.target={target}"])
        (base / config / "single_seed0").mkdir()
        (base / config / "single_seed0" / "summary.json").write_text(json.dumps(_rater_summary(label_dice, per_rater)))
    lines = study_rater_table.rater_table(("multirater",)).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:]
            if line.startswith("| ce_")}
    column = {name: i for i, name in enumerate(head)}
    assert rows["ce_mean"][column["Dice (majority label)"]] == "0.799"
    assert rows["ce_original"][column["Dice (majority label)"]] == "not scored"
    assert rows["ce_original"][column["ECE (majority label)"]] == "not scored"
    assert rows["ce_original"][column["hard label"]] == "original"
    assert rows["ce_mean"][column["Dice vs original"]] == "0.802"
    assert rows["ce_original"][column["Dice vs original"]] == "0.820"
    assert rows["ce_original"][column["Dice vs eroded"]] == "0.737"


def test_the_study_table_marks_rows_scaled_by_a_degenerate_fit(tmp_path, monkeypatch):
    """A temperature that ends at the uniform prediction (the uncertainty study's CE MC dropout + T: T = 3.3e5,
    NLL = ln 3) is marked in the study's table (issue #43), read from the evaluation's summary.json; a sound fit's
    row keeps its name."""
    monkeypatch.setattr(study_presets, "results_dir", lambda study: tmp_path / study)
    base = tmp_path / "uncertainty_study"
    rows = [{**_row("CE", "single", 0, 0.82, 0.23), "evaluation": "single_seed0"},
            {**_row("CE", "single + T", 0, 0.82, 0.21), "evaluation": ""},
            {**_row("CE", "MC dropout (10)", 0, 0.27, 0.21), "evaluation": "mc10_seed0"},
            {**_row("CE", "MC dropout (10) + T (pooled)", 0, 0.27, 0.11), "evaluation": ""}]
    _piece(base, "ce", rows)
    for slug, t, nll in (("single_seed0", 1.1, 0.80), ("mc10_seed0", 3.3e5, 1.0986123)):
        (base / "ce" / slug).mkdir()
        (base / "ce" / slug / "summary.json").write_text(json.dumps(
            {"multilabel": False, "protocol": {"num_classes": 3},
             "posthoc": {"temperature": {"params": {"temperature": t, "nll_before": 1.16, "nll_after": nll}}}}))
    text = study_pieces.assemble("uncertainty_study")
    assert "| CE | MC dropout (10) + T (pooled) (degenerate fit) |" in text
    assert "| CE | single + T |" in text
    assert "degenerate" not in (base / "per_evaluation.csv").read_text()  # the raw rows keep their names


# The studies as scripts/study_pieces.py defined them in Python before they became presets (main at 090263d):
# each preset configs/experiment/study/<name>.yaml must give the same Study.
_UNCERTAINTY = {"ce": ["loss=ce"], "ce_dice": ["loss=ce_dice"], "focal": ["loss=focal"], "ls": ["loss=ls"],
                "margin3": ["loss=margin", "loss.margin=3"]}
_UNCERTAINTY_LABELS = {"ce": "CE", "ce_dice": "CE + Dice", "focal": "focal", "ls": "LS", "margin3": "margin, m = 3"}
_MULTIRATER = {f"{loss}_{target}": [*arm, f"dataset.raters.target={target}"]
               for loss, arm in (("ce", ["loss=ce"]), ("margin3", ["loss=margin", "loss.margin=3"]))
               for target in ("mean", "original", "random")}
_MULTIRATER_LABELS = {f"{loss}_{target}": f"{name}, trained on {what}"
                      for loss, name in (("ce", "CE"), ("margin3", "margin, m = 3"))
                      for target, what in (("mean", "the rater mean"),
                                           ("original", "one rater (the data set's own label)"),
                                           ("random", "a random rater per sample"))}
_MULTIRATER_BASE = ("experiment=hippocampus_study", f"dataset.root={ROOT / 'outputs' / 'synthetic_raters'}")
STUDIES_BEFORE = {
    "uncertainty_study": Study(_UNCERTAINTY, _UNCERTAINTY_LABELS, seeds=(0, 1, 2), dropout=0.2, tta_seeds=(0,),
                               tta=("flips", "noise"), ensembles=True),
    "newer_losses": Study({k: [f"loss={k}"] for k in ("hardl1ace_dice_ce", "softl1ace_dice_ce", "mdca", "dca", "acls",
                                                      "adafocal", "ce_dml", "crac", "sdc")},
                          {"hardl1ace_dice_ce": "hard mL1-ACE + Dice + CE",
                           "softl1ace_dice_ce": "soft mL1-ACE + Dice + CE", "mdca": "MDCA (+ CE)", "dca": "DCA (+ CE)", "acls": "ACLS", "adafocal": "AdaFocal",
                           "ce_dml": "CE + Dice semimetric loss", "crac": "CRaC", "sdc": "SDC"}),
    "ensembles_under_shift": Study({k: _UNCERTAINTY[k] for k in ("ce_dice", "margin3")}, _UNCERTAINTY_LABELS,
                                   seeds=(0, 1, 2), shift="rood_mri", extra=("evaluation.figures=false",),
                                   runs_of="uncertainty_study"),
    "multirater": Study(_MULTIRATER, _MULTIRATER_LABELS, base=_MULTIRATER_BASE, prepare=study_presets.synthetic_raters),
    # issue #45: the networks of the post-hoc calibrators study (scripts/posthoc_study.py compares the calibrators)
    "posthoc_calibrators": Study({k: _UNCERTAINTY[k] for k in ("ce", "ce_dice", "margin3")}, _UNCERTAINTY_LABELS,
                                 seeds=(0, 1, 2)),
    "multirater_ensembles": Study({k: _MULTIRATER[k] for k in ("ce_mean", "margin3_mean")}, _MULTIRATER_LABELS,
                                  seeds=(0, 1, 2), ensembles=True, base=_MULTIRATER_BASE, runs_of="multirater",
                                  prepare=study_presets.synthetic_raters),
}


def test_every_study_preset_is_a_study_of_study_pieces():
    assert study_pieces.study_names() == sorted(STUDIES_BEFORE)


@pytest.mark.parametrize("name", sorted(STUDIES_BEFORE))
def test_a_study_preset_is_a_study_sweep_that_gives_the_study_defined_before(name, make_cfg):
    from hydra.core.hydra_config import HydraConfig

    from mcseg.config import validate_train_config

    before = STUDIES_BEFORE[name]
    study = study_presets.load_study(name)
    # labels of configurations outside the study are not needed (ensembles_under_shift named all five before)
    assert study == replace(before, labels={k: v for k, v in before.labels.items() if k in study.labels})
    assert list(study.arms) == list(before.arms)  # the order of the table's rows and of the pieces still to run
    cfg = make_cfg([f"experiment=study/{name}"])  # `train.py -m experiment=study/<name>` trains the study
    validate_train_config(cfg)  # the study: node is a known top-level key
    sweeper = HydraConfig.get().sweeper
    assert sweeper._target_.endswith("StudySweeper")
    assert {k: v.split() for k, v in sweeper.arms.items() if v} == before.arms
    assert str(sweeper.params.seed) == ",".join(map(str, before.seeds))


def test_a_study_preset_with_a_misspelt_setting_or_an_arm_without_a_label_is_refused():
    with pytest.raises(SystemExit, match=r"newer_losses.yaml: study.dropuot is not a study setting \(one of .*dropout"):
        study_presets.load_study("newer_losses", ("+study.dropuot=0.2",))
    with pytest.raises(SystemExit, match="newer_losses.yaml: arm 'ce2' has no study.labels entry"):
        study_presets.load_study("newer_losses", ("+hydra.sweeper.arms.ce2='loss=ce'",))
