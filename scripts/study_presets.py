"""A study of :mod:`study_pieces` as its preset defines it (``configs/experiment/study/<name>.yaml``, read by
:func:`load_study`), where its pieces are written (:func:`results_dir`) and which of them are complete
(:func:`pieces`); :data:`STUDIES_DOC` says in a paragraph what each study is (its README's opening)."""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

log = logging.getLogger("study_pieces")

EXPERIMENT = "experiment=hippocampus_study"


@dataclass(frozen=True)
class Study:
    """What one piece of a study trains and evaluates for each of its configurations (``arms``): a study preset
    (``configs/experiment/study/<name>.yaml``) as :func:`load_study` reads it."""
    arms: dict[str, list[str]]
    labels: dict[str, str]
    seeds: tuple[int, ...] = (0,)
    dropout: float | None = None   # a run per configuration trained with model.dropout, seed 0, for MC dropout
    mc_samples: int = 10
    tta_seeds: tuple[int, ...] = ()
    tta: tuple[str, ...] = ("flips",)  # the TTA kinds evaluated, each alone (evaluate.py tta=[<kind>])
    ensembles: bool = False
    shift: str | None = None       # a corruption suite for the configuration's ensemble
    extra: tuple[str, ...] = ()    # overrides of every evaluation
    base: tuple[str, ...] = (EXPERIMENT,)  # overrides of every training, before the arm's
    runs_of: str | None = None     # another study whose run folders this one evaluates (the same trainings)
    prepare: object = None         # a function called before a piece trains (e.g. writing its data folder)


# The simulated multi-rater study (issue #37): each hippocampus case's own label and four synthetic raters
# (scripts/synthetic_raters.py), written outside git and rebuilt identically when missing.
SYNTHETIC_RATERS = ROOT / "outputs" / "synthetic_raters"
ONE_RATER = "original"  # the "one rater" arms train on the data set's own label, as a single-rater study does


def synthetic_raters() -> None:
    if (SYNTHETIC_RATERS / "dataset.json").is_file():
        return
    import synthetic_raters as sr

    data = Path(os.environ.get("MCSEG_HIPPOCAMPUS_ROOT", ROOT.parent / "shared" / "data" / "hippocampus"))
    log.info("synthetic raters: %s", sr.build(data, SYNTHETIC_RATERS))


PREPARE = {"synthetic_raters": synthetic_raters}  # a preset's study.prepare -> the function it names
PRESETS = ROOT / "configs" / "experiment" / "study"


def study_names() -> list[str]:
    """The studies: one preset each under ``configs/experiment/study/``."""
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def load_study(name: str, overrides: tuple[str, ...] = ()) -> Study:
    """The study of preset ``experiment=study/<name>`` (with ``overrides``, as on train.py's command line): its
    configurations are the study sweep's named arms (in the order of ``study.labels``), its seeds
    ``hydra.sweeper.params.seed``, the rest its ``study:`` node. Composed from the repository root
    (``${hydra:runtime.cwd}`` in a preset is where its trainings run, as study_pieces runs them)."""
    from contextlib import chdir

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with chdir(ROOT), initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment=study/{name}", *overrides], return_hydra_config=True)
    where = f"configs/experiment/study/{name}.yaml"
    before = HydraConfig.instance().cfg
    HydraConfig().set_config(cfg)  # for ${hydra:...} in the preset; put back after: evaluations record it
    try:
        node = OmegaConf.to_container(cfg.get("study") or OmegaConf.create(), resolve=True)
    finally:
        HydraConfig.instance().cfg = before
    arms = {k: v.split() for k, v in cfg.hydra.sweeper.arms.items() if v}
    labels = node.pop("labels", None) or {}
    unlabelled = [arm for arm in arms if arm not in labels]
    if unlabelled:
        raise SystemExit(f"{where}: arm {unlabelled[0]!r} has no study.labels entry")
    settings = {f.name for f in fields(Study)} - {"arms", "labels", "seeds"}
    unknown = sorted(set(node) - settings)
    if unknown:
        raise SystemExit(f"{where}: study.{unknown[0]} is not a study setting (one of {', '.join(sorted(settings))})")
    prepare = node.pop("prepare", None)
    if prepare is not None and prepare not in PREPARE:
        raise SystemExit(f"{where}: study.prepare={prepare!r} is not one of {sorted(PREPARE)}")
    seeds = tuple(int(seed) for seed in str(cfg.hydra.sweeper.params.seed).split(","))
    return Study({k: arms[k] for k in labels if k in arms}, labels, seeds=seeds, prepare=PREPARE.get(prepare),
                 **{k: tuple(v) if isinstance(v, list) else v for k, v in node.items()})


class Studies(dict):
    """Study name -> :class:`Study`, each read from its preset when first asked for (a test may add its own)."""

    def __missing__(self, name: str) -> Study:
        self[name] = load_study(name)
        return self[name]


STUDIES = Studies()


def results_dir(study: str) -> Path:
    return ROOT / "docs" / "results" / study


def pieces(study_name: str) -> dict[str, dict]:
    """The committed pieces of a study (configuration -> its piece.json), in the study's order."""
    base = results_dir(study_name)
    found = {}
    for config in STUDIES[study_name].arms:
        piece = base / config / "piece.json"
        if piece.is_file() and (base / config / "per_evaluation.csv").is_file():
            record = json.loads(piece.read_text())
            if record.get("status", "completed") == "completed":  # not one cut short (marked)
                found[config] = record
    return found


STUDIES_DOC = {
    "uncertainty_study": "Uncertainty compared (issue #23, docs/results.md): five losses on hippocampus "
                         "(`experiment=hippocampus_study`), three seeds, single networks raw and scaled, their "
                         "ensemble pooled before and after scaling, TTA of seed 0, MC dropout (10 samples) of a "
                         "network trained with `model.dropout=0.2`.",
    "newer_losses": "The newer losses in the loss study's protocol (`experiment=hippocampus_study`, seed 0): raw "
                    "and after the temperature fitted on the validation split.",
    "ensembles_under_shift": "The three-seed ensembles of CE + Dice and of the margin loss (m = 3) under ROOD-MRI "
                             "(`shift=rood_mri`), raw and after the temperature fitted on the clean validation "
                             "prediction of the pooled ensemble. Its training seconds are those of the uncertainty "
                             "study's runs that it evaluates (retrained only when their run folders are gone).",
    "multirater": "SIMULATED: calibration against several raters (issue #37, docs/results.md) on the hippocampus "
                  "cases with five raters: the data set's own label and four synthetic ones made from it "
                  "(scripts/synthetic_raters.py: one voxel of erosion, one of dilation, two smooth displacements "
                  "of 1 mm root mean square), CE and the margin loss (m = 3) trained "
                  "on the rater mean, on one rater and on a random rater per sample, seed 0; every figure "
                  "against each rater and the rater mean (the `raters` part of each summary.json, "
                  "per_rater.csv, per_case_raters.csv).",
    "posthoc_calibrators": "The networks of \"Post-hoc calibrators compared\" (issue #45, docs/results.md): CE, CE + "
                           "Dice and the margin loss (m = 3), three seeds; a piece here evaluates them raw and "
                           "scaled, and scripts/posthoc_study.py compares every post-hoc calibrator on them "
                           "(docs/results/posthoc_calibrators/).",
    "multirater_ensembles": "SIMULATED (as `multirater`): the three-seed ensembles of the networks trained on the "
                            "rater mean; their GED and Hungarian-matched IoU against the five raters. Seed 0 is "
                            "the `multirater` run.",
}
