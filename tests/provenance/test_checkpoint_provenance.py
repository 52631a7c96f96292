"""Every evaluation says what produced it and never replaces a run's official results (issue #12).

On the package's two tiny runs (conftest.py); tests that change a run work on a copy.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mcseg.training.checkpoint import save_checkpoint
from mcseg.inference.build import load_checkpoint
from mcseg.evaluation.provenance import file_sha256
from mcseg.errors import ConfigError

from ..conftest import run_cli
from ..fake_datasets import write_msd

from .conftest import copy_run, evaluate_with, other_model, read


def test_another_checkpoint_goes_to_its_own_folder_and_records_what_produced_it(runs, make_cfg, tmp_path):
    """#12.3: evaluating another checkpoint of a run never replaces <run>/eval/test; every output says
    which checkpoint (path, sha256, epoch), split, dataset and overrides produced it."""
    run = copy_run(runs.run2d, tmp_path / "run")
    official = (run / "eval/test/summary.json").read_bytes()
    other = other_model(run / "checkpoints/best.pt", run / "checkpoints/other.pt")
    sha = file_sha256(other)
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={other}"])
    assert (run / "eval/test/summary.json").read_bytes() == official
    out = run / "eval" / f"other-{sha[:8]}" / "test"
    for record in (summary["provenance"], read(out / "provenance.json"), read(out / "summary.json")["provenance"],
                   read(out / "temperature/summary.json")["provenance"]):
        assert record["checkpoint"]["sha256"] == sha and record["checkpoint"]["path"] == str(other)
        assert record["checkpoint"]["epoch"] == load_checkpoint(other)["epoch"] and not record["checkpoint"]["selected"]
        assert record["split"]["name"] == "test"
        assert record["split"]["cases"] == read(run / "split.json")["test"]
        assert record["dataset"]["name"] == "msd" and record["dataset"]["root"] == str(runs.msd_a)
        assert "evaluation.bootstrap_samples=10" in record["overrides"]
    # the run's own evaluation records its best.pt the same way
    own = read(run / "eval/test/provenance.json")
    assert own["checkpoint"]["sha256"] == file_sha256(run / "checkpoints/best.pt") and own["checkpoint"]["selected"]
    # calibration.json holds both fits, keyed by the checkpoints' hashes
    fits = read(run / "calibration.json")["fits"]
    assert set(fits) == {sha, own["checkpoint"]["sha256"]}
    assert fits[sha]["checkpoint"]["path"] == str(other) and fits[sha]["val_cases"] == read(run / "split.json")["val"]


def test_a_second_evaluation_replaces_the_first_only_when_asked(runs, make_cfg, tmp_path):
    """#12.3: the run's selected checkpoint keeps <run>/eval/<split>/; evaluating it again is refused
    without overwrite=true."""
    run = copy_run(runs.run2d, tmp_path / "run")
    official = (run / "eval/test/summary.json").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=true"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/best.pt"])
    assert (run / "eval/test/summary.json").read_bytes() == official
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/best.pt", "overwrite=true"])
    assert summary["provenance"]["output_dir"] == str(run / "eval/test")
    assert summary["mean_foreground_dice"] == pytest.approx(json.loads(official)["mean_foreground_dice"])


@pytest.mark.parametrize("spoil, apply, says", [
    ("unreadable", "temperature", "not valid JSON"),  # calibration.json cut short or edited by hand
    ("lts-without-weights", "lts", "incomplete"),  # a recorded LTS fit whose weights cannot be loaded
])
def test_a_refused_overwrite_leaves_the_earlier_evaluation_byte_identical(runs, make_cfg, tmp_path, spoil, apply,
                                                                          says):
    """#22.4: every check that can refuse an evaluation (scalers, LTS weights, refit target) comes before
    overwrite=true clears anything."""
    run = copy_run(runs.run2d, tmp_path / "run")
    calibration = run / "calibration.json"
    if spoil == "unreadable":
        calibration.write_text(calibration.read_text()[:40])
    else:
        stored = read(calibration)
        for fit in stored["fits"].values():
            fit["scalers"]["lts"] = {}
        calibration.write_text(json.dumps(stored))
    official = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (run / "eval/test").rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=says):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/best.pt", "overwrite=true",
                                           f"posthoc.apply=[{apply}]"])
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns)
            for p in (run / "eval/test").rglob("*") if p.is_file()} == official


def test_a_checkpoint_outside_a_run_writes_only_where_eval_dir_says(runs, make_cfg, tmp_path):
    """#12.4: a checkpoint outside a run writes nothing next to it, and is scored on its own split."""
    loose = tmp_path / "shared" / "models" / "model.pt"
    loose.parent.mkdir(parents=True)
    shutil.copy(runs.run2d / "checkpoints/best.pt", loose)
    with pytest.raises(ConfigError, match="eval_dir="):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={loose}"])
    assert sorted(p.name for p in (tmp_path / "shared").rglob("*")) == ["model.pt", "models"]
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={loose}", f"eval_dir={tmp_path / 'mine'}"])
    assert summary["provenance"]["split"]["cases"] == read(runs.run2d / "split.json")["test"]
    assert (tmp_path / "mine/calibration.json").is_file() and (tmp_path / "mine/provenance.json").is_file()
    assert sorted(p.name for p in (tmp_path / "shared").rglob("*")) == ["model.pt", "models"]


def test_a_checkpoint_copied_into_another_run_is_not_scored_on_that_runs_split(runs, make_cfg, tmp_path):
    """#12.4: another run's split.json (here: this model's training cases as 'test') is refused."""
    run = copy_run(runs.run2d, tmp_path / "run")
    split = read(run / "split.json")
    swapped = {"train": split["test"] + split["val"], "val": split["train"][:1], "test": split["train"][1:]}
    other_run = tmp_path / "other_run"
    (other_run / "checkpoints").mkdir(parents=True)
    (other_run / "split.json").write_text(json.dumps(swapped))
    shutil.copy(run / "checkpoints/best.pt", other_run / "checkpoints/best.pt")
    with pytest.raises(ValueError, match="split.json"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={other_run}/checkpoints/best.pt"])
    assert sorted(p.name for p in other_run.iterdir()) == ["checkpoints", "split.json"]


def test_a_different_model_with_the_same_file_name_gets_its_own_temperature(runs, make_cfg, tmp_path):
    """#12.4: calibration.json is keyed by the checkpoint's sha256, not its file name."""
    run = copy_run(runs.run2d, tmp_path / "run")
    t_before = read(run / "eval/test/summary.json")["posthoc"]["temperature"]["params"]["temperature"]
    other_model(run / "checkpoints/best.pt", run / "checkpoints/best.pt")  # same name, other weights
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/best.pt", "split=val",
                                                 "posthoc.apply=[temperature]"])
    t_after = summary["posthoc"]["temperature"]["params"]["temperature"]
    assert t_after != pytest.approx(t_before, rel=1e-3)
    sha = file_sha256(run / "checkpoints/best.pt")
    assert t_after == pytest.approx(read(run / "calibration.json")["fits"][sha]["scalers"]["temperature"]["temperature"])


@pytest.mark.parametrize("override, named", [
    ("+model=dynunet", "+model=dynunet"),
    ("+inference.overlap=0.9", "+inference.overlap=0.9"),
    ("+trainer.precision=32", "+trainer.precision=32"),
])
def test_overrides_of_what_the_checkpoint_fixes_are_refused(runs, make_cfg, tmp_path, override, named):
    """#12.8: Hydra's suggested `+model=...` is not silently ignored."""
    with pytest.raises(ConfigError, match=re.escape(named) + ".*checkpoint fixes"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={runs.run2d}/checkpoints/best.pt", override])


def test_sampling_override_on_another_dataset_is_refused(runs, make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="dataset.sampling.slice_axis=2"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={runs.run2d}/checkpoints/best.pt", "dataset=msd",
                                           f"dataset.root={runs.msd_b}", "dataset.sampling.slice_axis=2"])


@pytest.fixture
def geometry_spy(monkeypatch):
    """The (dims, slice axis, window) of every prediction made."""
    import mcseg.inference.predict as predict

    seen = []
    real = predict.predict_logits

    def spy(model, image, dims, divisor, cfg, roi_size, precision, slice_axis=-1, input_size=None):
        seen.append((dims, slice_axis, tuple(roi_size)))
        return real(model, image, dims, divisor, cfg, roi_size, precision, slice_axis, input_size)

    monkeypatch.setattr(predict, "predict_logits", spy)
    return seen


@pytest.mark.parametrize("kind, expected", [("2d", (2, 0, (28, 20))),
                                            pytest.param("3d", (3, -1, (16, 16, 16)), marks=pytest.mark.slow)])
def test_another_dataset_is_seen_with_the_checkpoints_geometry(runs, make_cfg, tmp_path, geometry_spy, kind,
                                                               expected):
    """#12.9: `dataset=msd dataset.root=<another folder>` keeps the model's dimensionality, slice axis
    and patch size (the msd preset's are 2D, slice axis -1, 64 x 64)."""
    run = copy_run(getattr(runs, f"run{kind}"), tmp_path / "run")
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/best.pt", "dataset=msd",
                                                 f"dataset.root={runs.msd_b}", "split=all"])
    assert summary["n_cases"] == 3
    assert set(geometry_spy) == {expected}
    assert summary["provenance"]["dataset"]["root"] == str(runs.msd_b)
    assert summary["provenance"]["geometry"] == {"dims": expected[0], "slice_axis": expected[1], "patch_size": list(expected[2])}
    assert (run / "eval/msd-all/summary.json").is_file() and (run / "eval/msd-all/split.json").is_file()


def test_a_model_with_other_classes_is_refused_before_inference(runs, make_cfg, tmp_path, geometry_spy):
    """#12.14: a 3-class model on the 4-class synthetic dataset: one line at start, no case blamed."""
    with pytest.raises(ValueError, match="predicts 3 classes.*has 1 channel.*and 4 classes"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={runs.run2d}/checkpoints/best.pt", "dataset=synthetic2d",
                                           "dataset.n_cases=4", "dataset.shape=[32,32]"])
    assert geometry_spy == []


def test_a_nifti_passed_as_checkpoint_gets_no_advice_to_unpickle(tmp_path):
    """#12.14: never repeat torch's 'retry with weights_only=False'."""
    nifti = write_msd(tmp_path / "msd", n_cases=1) / "imagesTr" / "case_000.nii.gz"
    with pytest.raises(ValueError, match="not an mcseg checkpoint") as info:
        load_checkpoint(nifti)
    assert "weights_only` set to `False" not in str(info.value) and "Re-running" not in str(info.value)
    assert "\n" not in str(info.value)


def test_a_run_directory_as_ckpt_means_its_selected_checkpoint(runs, make_cfg, tmp_path):
    """#12.14: ckpt=<run> evaluates <run>/checkpoints/best.pt; a directory without one says what to pass."""
    run = copy_run(runs.run2d, tmp_path / "run")
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}", "split=val", "posthoc.apply=[]"])
    assert summary["provenance"]["checkpoint"]["path"] == str(run / "checkpoints/best.pt")
    assert (run / "eval/val/summary.json").is_file()
    with pytest.raises(FileNotFoundError, match="runs="):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={tmp_path}"])


def test_an_absurd_temperature_is_warned_about(tmp_path, caplog):
    """#12.14: T fitted on one confidently wrong case (here ~1e2 or more) is kept but warned about and recorded."""
    from mcseg.calibration import PosthocConfig, fit_posthoc
    from mcseg.data.cases import CaseData

    label = torch.zeros(8, 8, dtype=torch.long)
    label[2:6, 2:6] = 1
    logits = torch.zeros(2, 8, 8)
    logits[1] = 20.0 * (torch.rand(8, 8, generator=torch.Generator().manual_seed(0)) - 0.5)  # confident, random
    predictor = SimpleNamespace(model=torch.nn.Identity(), eval=lambda: None, multilabel=False,
                                link=lambda z: z.softmax(1), logits=lambda case: logits)
    case = CaseData(case_id="c0", image=logits.numpy(), label=label.numpy(), spacing=(1.0, 1.0), affine=np.eye(4))
    with caplog.at_level(logging.WARNING):
        # balanced voxels: this fake predictor has no label map to pick the region with
        record = fit_posthoc(predictor, [case], PosthocConfig(fit=["temperature"], apply=[], voxels="balanced"),
                             tmp_path,
                             {"sha256": "0" * 64, "path": "x.pt"})
    assert record["scalers"]["temperature"]["temperature"] > 20
    assert record["warnings"] and "too small" in caplog.text


@pytest.mark.slow
def test_cli_evaluation_leaves_no_empty_job_directory(runs, tmp_path):
    """#12.15: `python evaluate.py ckpt=...` leaves no outputs/evaluate/runs/<time>/ behind; its log
    goes beside its results."""
    run = copy_run(runs.run2d, tmp_path / "run")
    done = run_cli("evaluate.py", [f"ckpt={run}/checkpoints/best.pt", "split=val", "posthoc.apply=[]",
                                   "evaluation.bootstrap_samples=10"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "outputs").exists()
    assert (run / "eval/val/evaluate.log").is_file() and (run / "eval/val/provenance.json").is_file()
    assert "ckpt=" in " ".join(read(run / "eval/val/provenance.json")["overrides"])


def test_train_and_evaluate_do_not_import_each_other():
    """Structure: entry points share builders below them (mcseg.inference.build), never each other."""
    import ast

    root = Path(__file__).resolve().parents[2] / "mcseg"
    entry_points = {"mcseg.train", "mcseg.evaluate"}
    for path in [root / "train.py", root / "evaluate.py", *sorted((root / "report").glob("*.py"))]:
        imported = {node.module for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & entry_points, f"{path.name} imports {imported & entry_points}"


def test_the_report_never_takes_another_checkpoints_numbers_for_the_runs(runs, make_cfg, tmp_path):
    """#12.3: even written into <run>/eval/test by hand (eval_dir=), last.pt's numbers are not the run's."""
    from mcseg.report.collect import read_run

    run = copy_run(runs.run2d, tmp_path / "run")
    assert read_run(run, "test").evaluated
    other = other_model(run / "checkpoints/best.pt", run / "checkpoints/last.pt")
    evaluate_with(make_cfg, tmp_path, [f"ckpt={other}", f"eval_dir={run}/eval/test", "overwrite=true",
                                       "posthoc.apply=[]"])
    assert not read_run(run, "test").evaluated


def test_a_checkpoint_without_a_stored_split_uses_its_runs_split_or_is_refused(runs, make_cfg, tmp_path, caplog):
    """#12.4: checkpoints written before splits were stored: the split.json of the run they sit in, with a
    warning; outside a run they are refused (nothing else says which cases are its test cases)."""
    run = copy_run(runs.run2d, tmp_path / "run")
    state = load_checkpoint(run / "checkpoints/best.pt")
    del state["split"], state["dataset"]
    save_checkpoint(run / "checkpoints/old.pt", state)
    with caplog.at_level(logging.WARNING):
        summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/old.pt", "posthoc.apply=[]"])
    assert "before checkpoints stored their split" in caplog.text
    assert summary["provenance"]["split"]["cases"] == read(run / "split.json")["test"]
    assert summary["provenance"]["split"]["source"] == str(run / "split.json")
    shutil.copy(run / "checkpoints/old.pt", tmp_path / "old.pt")
    with pytest.raises(ValueError, match="holds no split"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={tmp_path / 'old.pt'}", f"eval_dir={tmp_path / 'out'}"])


# ----------------------------------------------------------------------------- identity by content (issue #22)
