"""Issue #44: another tool's folder goes through the per-case code of a checkpoint's evaluation (the protocol's
failure-detection settings included), and a prediction format or a post-hoc calibrator is one class plus one
entry of one list."""
from __future__ import annotations

import csv
import json

import nibabel as nib
import numpy as np
import pytest
import torch

from mcseg.evaluate_folder import evaluate_folder
from mcseg.config import EvalProtocol
from tests.test_monai_folders import _labels
from tests.tool_outputs import make_monai


@pytest.fixture(scope="module")
def monai(tmp_path_factory):
    root = tmp_path_factory.mktemp("extension")
    labels = _labels(root / "labels", (11, 9, 6))
    return labels, make_monai(root / "pred", labels, noise=3.0)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_folder_evaluation_follows_the_protocols_failure_region_risk_and_bootstrap(monai, tmp_path):
    """On main the folder evaluation built ``FailureDetection(MAPS)``: evaluation.failure_risk=micro,
    failure_region and bootstrap_samples were ignored (macro risk, the calibration region, 1000 resamples)."""
    from mcseg.metrics.failure import micro_foreground_dice

    labels, pred = monai
    protocol = EvalProtocol(failure_risk="micro", failure_region="all", bootstrap_samples=7, figures=False)
    summary = evaluate_folder(pred, labels, protocol=protocol, output_dir=tmp_path / "out")
    detection = summary["failure_detection"]["protocol"]
    assert detection["risk_definition"] == "micro" and detection["voxel_region"] == "all"
    assert "7 resamples" in detection["rc_ci95"]
    rows = _rows(tmp_path / "out" / "failure_per_case.csv")
    assert {r["risk_definition"] for r in rows} == {"micro"} and {r["voxel_region"] for r in rows} == {"all"}
    for row in rows:  # the risk is 1 - the micro foreground Dice of the arg-max
        case = row["case"]
        label = torch.from_numpy(np.asarray(nib.load(str(labels / f"{case}.nii.gz")).dataobj).astype(np.int64))
        probs = np.asarray(nib.load(str(pred / case / f"{case}_trans.nii.gz")).dataobj)
        argmax = torch.from_numpy(np.moveaxis(probs, -1, 0).argmax(0))
        assert float(row["risk"]) == pytest.approx(1.0 - micro_foreground_dice(argmax, label, False), abs=1e-6)


FAST = ["--bootstrap-samples", "0", "--no-failure-detection", "--no-figures"]
CLASSES = ["background", "outer", "inner"]


def _evaluated(labels, cases: dict[str, np.ndarray]) -> dict:
    """The evaluator's own summary of ``{case: C x *S probabilities}`` against ``labels``, as FAST evaluates."""
    from mcseg.evaluation.evaluator import Evaluator

    ev = Evaluator(3, CLASSES, EvalProtocol(bootstrap_samples=0, failure_detection=False, figures=False))
    for case, probs in sorted(cases.items()):
        img = nib.load(str(labels / f"{case}.nii.gz"))
        ev.add_case(case, torch.from_numpy(probs), torch.from_numpy(np.asarray(img.dataobj).astype(np.int64)),
                    img.header.get_zooms()[:3])
    return json.loads(json.dumps(ev.summary()))


def _monai_probs(pred, case: str) -> np.ndarray:
    """``C x *S`` float32 probabilities of a MONAI SaveImage map."""
    return np.moveaxis(nib.load(str(pred / case / f"{case}_trans.nii.gz")).get_fdata(dtype=np.float32), -1, 0)


def _scaled(probs: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(ln p / T): what a temperature makes of saved softmax probabilities (folder_posthoc)."""
    from mcseg.evaluation.folder_posthoc import log_probabilities

    return torch.softmax(log_probabilities(torch.from_numpy(probs), False) / temperature, 0).numpy()


def _npy_format():
    """A toy prediction format, one class: ``<case>.npy`` channel-first probabilities with ``<case>.json`` (the
    file's spacing and voxel-to-world affine)."""
    import shutil
    from pathlib import Path

    from mcseg.evaluation.formats.base import CasePrediction, PredictionFormat, same_grid

    class NpyFormat(PredictionFormat):
        format = "npy"
        tool = "a toy tool"

        @classmethod
        def pattern(cls, **options) -> str:
            return "<case>.npy"

        @classmethod
        def detect(cls, folder: Path, **options) -> int:
            return len(list(Path(folder).glob("*.npy")))

        def _scan(self) -> dict[str, Path]:
            return {p.stem: p for p in sorted(self.path.glob("*.npy"))}

        def case_files(self, case: str) -> list[Path]:
            return [self.files[case], self.files[case].with_suffix(".json")]

        def read(self, case, label, label_path) -> CasePrediction:
            path, geometry = self.case_files(case)
            probs = self.check_probabilities(case, path, np.load(path))
            grid = json.loads(geometry.read_text())
            same_grid(case, "probabilities", path, probs.shape[1:], grid["spacing"], grid["affine"], label, label_path)
            return CasePrediction(probs, None, [path, geometry])

        def write(self, case, scaled, out_dir: Path) -> list[str]:
            path, geometry = self.case_files(case)
            np.save(out_dir / path.name, scaled(case, path, np.load(path), 0))
            shutil.copy2(geometry, out_dir / geometry.name)
            return [path.name, geometry.name]

    return NpyFormat


def _save_npy(folder, labels, pred, cases: list[str]):
    folder.mkdir(parents=True)
    for case in cases:
        img = nib.load(str(labels / f"{case}.nii.gz"))
        np.save(folder / f"{case}.npy", _monai_probs(pred, case))
        (folder / f"{case}.json").write_text(json.dumps({"spacing": [float(z) for z in img.header.get_zooms()[:3]],
                                                         "affine": img.affine.tolist()}))
    return folder


def test_a_toy_prediction_format_is_one_class_and_one_entry_read_and_written_by_the_folder_tools(
        monai, tmp_path, monkeypatch, capsys):
    from mcseg.calibrate_folder import main as calibrate
    from mcseg.evaluate_folder import main as evaluate
    from mcseg.evaluation import formats

    labels, pred = monai
    npy = _npy_format()
    monkeypatch.setattr(formats, "FORMATS", [*formats.FORMATS, npy])  # the one entry
    fit = _save_npy(tmp_path / "val", labels, pred, ["case_0", "case_1"])
    test = _save_npy(tmp_path / "test", labels, pred, ["case_2"])
    whole = _save_npy(tmp_path / "all", labels, pred, ["case_0", "case_1", "case_2"])
    # read: detected from the folder, evaluated as the evaluator scores the same probabilities
    out = tmp_path / "eval"
    assert evaluate([str(whole), str(labels), "-o", str(out), *FAST]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary.pop("provenance")["predictions"][0]["format"] == "npy"
    assert summary == _evaluated(labels, {c: _monai_probs(pred, c) for c in ("case_0", "case_1", "case_2")})
    assert sorted({r["case"] for r in _rows(out / "per_case.csv")}) == ["case_0", "case_1", "case_2"]
    # written: the calibrated test case in the toy format, then evaluated
    cal = tmp_path / "cal"
    assert calibrate(["--fit", str(fit), "--reference", str(labels), "--apply", str(test), "-o", str(cal),
                      "--format", "npy"]) == 0
    t = json.loads((cal / "calibration.json").read_text())
    assert t["applied"]["format"] == "npy" and sorted(t["applied"]["files"]) == ["case_2.json", "case_2.npy"]
    temperature = next(iter(t["fits"].values()))["scalers"]["temperature"]["temperature"]
    expected = _scaled(_monai_probs(pred, "case_2"), temperature)
    np.testing.assert_allclose(np.load(cal / "case_2.npy"), expected, atol=1e-6)
    capsys.readouterr()
    assert evaluate([str(cal), str(labels), "-o", str(tmp_path / "eval-cal"), "--allow-missing", *FAST]) == 0
    summary = json.loads((tmp_path / "eval-cal" / "summary.json").read_text())
    assert summary.pop("provenance")["predictions"][0]["calibration"]["scaler"] == "temperature"
    assert summary == _evaluated(labels, {"case_2": np.load(cal / "case_2.npy")})
    # and an unknown format name is still refused by the parser
    with pytest.raises(SystemExit):
        evaluate([str(whole), str(labels), "--format", "tiff"])


def _toy_scaler():
    """A toy post-hoc calibrator, one class: the temperature of a grid (0.5, 1, 2, 4) with the smallest NLL."""
    from mcseg.calibration.scaler_registry import Scaler

    class GridTemperature(Scaler):
        name = "toy"
        preserves_argmax = True

        def __init__(self, record: dict | None = None) -> None:
            self.record = record

        def fit(self, data) -> dict:
            logits, target = data.voxels
            nll = {t: float(torch.nn.functional.cross_entropy(logits / t, target)) for t in (0.5, 1.0, 2.0, 4.0)}
            best = min(nll, key=nll.get)
            self.record = {"grid_temperature": best, "nll_before": nll[1.0], "nll_after": nll[best], **data.sample}
            return self.record

        def apply(self, logits, image=None):
            return logits / self.record["grid_temperature"]

        def save(self, directory, key: str = "") -> dict:
            return dict(self.record)

        @classmethod
        def load(cls, record: dict, directory) -> Scaler:
            return cls(dict(record))

    return GridTemperature


def test_a_toy_calibrator_is_one_class_and_one_entry_fitted_by_calibrate_folder_and_evaluated(
        monai, tmp_path, monkeypatch, capsys):
    from mcseg.calibrate_folder import main as calibrate
    from mcseg.calibration.scaler_registry import SCALER_TYPES
    from mcseg.evaluate_folder import main as evaluate
    from tests.tool_outputs import copy_folder

    labels, pred = monai
    monkeypatch.setitem(SCALER_TYPES, "toy", _toy_scaler())  # the one entry
    fit, test = tmp_path / "val", tmp_path / "test"
    for folder, cases in ((fit, ["case_0", "case_1"]), (test, ["case_2"])):
        folder.mkdir()
        for case in cases:
            copy_folder(pred / case, folder / case)
    cal = tmp_path / "cal"
    assert calibrate(["--fit", str(fit), "--reference", str(labels), "--apply", str(test), "-o", str(cal),
                      "--scaler", "toy"]) == 0
    assert "toy (parameters in calibration.json) fitted on 2 case(s)" in capsys.readouterr().out
    record = json.loads((cal / "calibration.json").read_text())
    fitted = next(iter(record["fits"].values()))["scalers"]["toy"]
    assert fitted["grid_temperature"] in (0.5, 1.0, 2.0, 4.0) and fitted["nll_after"] <= fitted["nll_before"]
    assert record["applied"]["scaler"] == "toy"
    calibrated = _monai_probs(cal, "case_2")
    np.testing.assert_allclose(calibrated, _scaled(_monai_probs(pred, "case_2"), fitted["grid_temperature"]),
                               atol=1e-6)
    out = tmp_path / "eval"
    assert evaluate([str(cal), str(labels), "-o", str(out), "--allow-missing", *FAST]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary.pop("provenance")["predictions"][0]["calibration"]["scaler"] == "toy"
    assert summary == _evaluated(labels, {"case_2": calibrated})  # the toy's figures, as the evaluator scores them
    rows = _rows(out / "per_case.csv")  # one row per foreground class
    assert [(r["case"], r["class_name"]) for r in rows] == [("case_2", "outer"), ("case_2", "inner")]
    assert [float(r["dice"]) for r in rows] == [summary["per_class"][c]["dice"]["mean"] for c in ("outer", "inner")]
    assert float(rows[0]["nll"]) == summary["mean_nll"]


def test_a_toy_calibrator_in_a_run_reaches_the_summary_the_report_and_the_trackers(make_cfg, tmp_path, monkeypatch,
                                                                                  one_thread):
    """The same toy calibrator (one class, one SCALER_TYPES entry) fitted and applied by a training run: its figures
    are in the run's summary (posthoc.toy), its own evaluation's per_case.csv, the report's post-hoc table and the
    run's tracker (CSV)."""
    from mcseg.calibration.scaler_registry import SCALER_TYPES
    from mcseg.report import cli as report
    from mcseg.train import train
    from tests.conftest import TINY_2D

    monkeypatch.setitem(SCALER_TYPES, "toy", _toy_scaler())  # the one entry
    train(make_cfg([*TINY_2D, "posthoc.fit=[toy]", "posthoc.apply=[toy]", "logger=csv"]))
    run = tmp_path / "run"
    summary = json.loads((run / "eval" / "test" / "summary.json").read_text())
    toy = summary["posthoc"]["toy"]
    assert toy["params"]["grid_temperature"] in (0.5, 1.0, 2.0, 4.0) and 0 <= toy["mean_ece"] <= 1
    assert [r["case"] for r in _rows(run / "eval" / "test" / "toy" / "per_case.csv")]
    logged = (run / "csv" / "metrics.csv").read_text()
    assert "posthoc/toy/mean_ece" in logged
    assert report.main([str(tmp_path), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    posthoc_table = text[text.index("## Post-hoc scalers"):]
    assert "| toy" in posthoc_table.split("\n## ")[0]
