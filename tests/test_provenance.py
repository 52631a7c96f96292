"""Every evaluation says what produced it and never replaces a run's official results (issue #12).

One tiny 2D run (slices across axis 0) and one tiny 3D run on a fake MSD folder are trained once
for the module; tests that change a run work on a copy.
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
from mcseg.evaluate import evaluate
from mcseg.train import train

from .conftest import compose_config, run_cli
from .fake_datasets import write_msd

TINY_MSD = ["dataset=msd", "debug=fast", "model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1",
            "posthoc.fit=[temperature]", "posthoc.apply=[temperature]", "evaluation.bootstrap_samples=10"]
GEOMETRY = {"2d": ["dataset.sampling.slice_axis=0", "dataset.sampling.patch_size=[28,20]"],
            "3d": ["dataset.sampling.dims=3", "dataset.sampling.patch_size=[16,16,16]", "inference.overlap=0.25"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("provenance")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCSEG_CACHE_DIR", str(root / "cache"))
        msd_a = write_msd(root / "msd_a", n_cases=6, seed=0)
        msd_b = write_msd(root / "msd_b", n_cases=3, seed=1, prefix="other")
        for kind, geometry in GEOMETRY.items():
            train(compose_config("train", TINY_MSD + [f"dataset.root={msd_a}", *geometry], root / kind))
    return SimpleNamespace(root=root, msd_a=msd_a, msd_b=msd_b, run2d=root / "2d", run3d=root / "3d")


def copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns("tensorboard", "predictions"))
    return dest


def evaluate_with(make_cfg, tmp_path, overrides):
    """Fast settings (temperature scaling only, few resamples, no NIfTI written), then ``overrides``."""
    return evaluate(make_cfg(["evaluation.bootstrap_samples=10", "save_predictions=false",
                              "posthoc.apply=[temperature]", *overrides],
                             config_name="evaluate", output_dir=tmp_path / "job"))


def other_model(best: Path, dest: Path) -> Path:
    """A checkpoint of the same run with other weights (scaled: a different temperature fits it)."""
    state = load_checkpoint(best)
    state["model"] = {k: v * 3 if v.is_floating_point() else v for k, v in state["model"].items()}
    save_checkpoint(dest, state)
    return dest


def read(path: Path) -> dict:
    return json.loads(path.read_text())


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


@pytest.mark.parametrize("kind, expected", [("2d", (2, 0, (28, 20))), ("3d", (3, -1, (16, 16, 16)))])
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

    root = Path(__file__).resolve().parent.parent / "mcseg"
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
def _split_of(run: Path) -> dict:
    return read(run / "split.json")


def _overwrite_case(root: Path, case: str, with_case: str) -> None:
    """``case``'s files replaced by those of ``with_case`` (same names, other content)."""
    for folder in ("imagesTr", "labelsTr"):
        shutil.copyfile(root / folder / f"{with_case}.nii.gz", root / folder / f"{case}.nii.gz")


def test_checkpoints_record_the_content_of_every_case_of_their_split(runs):
    state = load_checkpoint(runs.run2d / "checkpoints/best.pt")
    split = _split_of(runs.run2d)
    assert {part: set(cases) for part, cases in state["content"].items()} == \
        {part: set(split[part]) for part in ("train", "val", "test")}
    assert len({fp for part in state["content"].values() for fp in part.values()}) == 6  # six different cases
    assert state["dataset"]["content_sha256"] and state["classes_unseen_in_training"] == []
    summary = read(runs.run2d / "eval/test/summary.json")
    assert summary["provenance"]["dataset"]["content_sha256"] == state["dataset"]["content_sha256"]
    assert summary["provenance"]["seen_in_training"] == {}


def test_a_resume_on_data_of_other_content_is_refused_naming_the_cases_and_a_moved_copy_is_accepted(runs, tmp_path):
    """#22.1: the same case names with other files (a validation and a test case replaced by a training
    case's) used to resume silently: the names were all the record compared."""
    from mcseg.data.build import build_dataset
    from mcseg.evaluation.provenance import content_lookup
    from mcseg.training.relaunch import check_launch
    from mcseg.rundir import LaunchRefused

    run = copy_run(runs.run2d, tmp_path / "run")
    (run / "result.json").unlink()  # as if interrupted
    split = _split_of(run)
    state = load_checkpoint(run / "checkpoints/last.pt")
    changed = shutil.copytree(runs.msd_a, tmp_path / "changed")
    _overwrite_case(changed, split["val"][0], split["train"][0])
    _overwrite_case(changed, split["test"][0], split["train"][0])
    moved = shutil.copytree(runs.msd_a, tmp_path / "moved")

    def launch(root: Path):
        config = json.loads(json.dumps(state["config"]))
        config["dataset"]["root"] = str(root)
        from omegaconf import OmegaConf

        dataset = build_dataset(OmegaConf.create(config["dataset"]))
        return check_launch(run, True, False, config, content_lookup(dataset))

    with pytest.raises(LaunchRefused, match="2 case\\(s\\) of the run's split differ in content") as refused:
        launch(changed)
    assert f"{split['val'][0]} (val)" in str(refused.value) and f"{split['test'][0]} (test)" in str(refused.value)
    assert launch(moved) == run / "checkpoints/last.pt"


def test_an_evaluation_on_another_root_that_holds_training_cases_warns_and_records_them(runs, make_cfg, tmp_path,
                                                                                           caplog):
    """#22.1: a checkpoint evaluated with dataset.root=<some of the same cases> draws its own split and scored
    a training case as a test case without a word; now by content, whatever the names."""
    from mcseg.report.collect import collect_runs
    from mcseg.report.table import build_rows

    run = copy_run(runs.run2d, tmp_path / "run")
    split = _split_of(run)
    other = write_msd(tmp_path / "other", n_cases=3, seed=5, prefix="x")
    trained = split["train"][0]
    _overwrite_case(other, "x_001", "x_000")  # placeholder names first ...
    for folder in ("imagesTr", "labelsTr"):  # ... then x_001 holds the training case's files under another name
        shutil.copyfile(runs.msd_a / folder / f"{trained}.nii.gz", other / folder / "x_001.nii.gz")
    with caplog.at_level(logging.WARNING):
        summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/best.pt", "dataset=msd",
                                                     f"dataset.root={other}", "split=all"])
    assert summary["provenance"]["seen_in_training"] == {"train": {"x_001": trained}}
    assert any("WARNING: 1 of the 3 scored cases are, by content, cases of" in r.message and "x_001" in r.message
               for r in caplog.records)
    out = run / "eval/msd-all"
    assert read(out / "provenance.json")["seen_in_training"] == {"train": {"x_001": trained}}
    # the run's own evaluation scored no seen case; a report over an evaluation that did marks it
    shutil.rmtree(run / "eval/test")
    shutil.copytree(out, run / "eval/test")
    rows = build_rows(collect_runs([run]), baseline=None, n_boot=10)
    assert rows[0].seen_in_training == [str(run)]


def test_a_checkpoint_without_content_fingerprints_compares_case_ids_and_says_content_was_not_checked(
        runs, make_cfg, tmp_path, caplog):
    """Issue #34 section 3, no fingerprints: a checkpoint without content fingerprints (older, or stripped)
    evaluated on a folder that holds its training cases recorded seen_in_training {} and said nothing; when
    content cannot be compared, case ids are, and the evaluation says that content was not checked."""
    run = copy_run(runs.run2d, tmp_path / "run")
    state = load_checkpoint(run / "checkpoints/best.pt")
    del state["content"]
    save_checkpoint(run / "checkpoints/best.pt", state)
    split = _split_of(run)
    other = shutil.copytree(runs.msd_a, tmp_path / "other")  # the same cases, under the same names
    with caplog.at_level(logging.WARNING):
        summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}", "dataset=msd", f"dataset.root={other}",
                                                     "split=all"])
    seen = summary["provenance"]["seen_in_training"]
    assert seen == {part: {c: c for c in split[part]} for part in ("train", "val")}
    assert summary["provenance"]["content_checked"] is False
    assert any("no content fingerprints" in r.message and "by case id" in r.message and "content not checked"
               in r.message for r in caplog.records)


def test_a_checkpoint_copied_from_a_run_of_another_configuration_is_refused(runs, make_cfg, tmp_path):
    """#22.2: a focal run's checkpoint copied into this CE run's checkpoints/ has the same split and was taken
    for another checkpoint of the run (its fit joined this run's calibration.json)."""
    run = copy_run(runs.run2d, tmp_path / "run")
    state = load_checkpoint(run / "checkpoints/best.pt")
    state["config"]["loss"] = {"_target_": "mcseg.losses.FocalLoss", "gamma": 3.0}
    save_checkpoint(run / "checkpoints/focal.pt", state)
    calibration = (run / "calibration.json").read_bytes()
    with pytest.raises(ValueError, match="its configuration is not its run's .*loss") as refused:
        evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/focal.pt"])
    # issue #34 section 3 (smaller): the run's own value was labelled "checkpoint:"; each value names its owner
    assert "loss._target_='mcseg.losses.FocalLoss' in the checkpoint, 'mcseg.losses." in str(refused.value)
    assert f"in {run / 'checkpoints/best.pt'}" in str(refused.value) and "(checkpoint:" not in str(refused.value)
    assert (run / "calibration.json").read_bytes() == calibration
    summary = evaluate_with(make_cfg, tmp_path, [f"ckpt={run}/checkpoints/focal.pt", f"eval_dir={tmp_path / 'elsewhere'}"])
    assert summary["provenance"]["run_dir"] is None


def test_a_class_without_a_voxel_in_the_training_split_is_warned_of_and_marked(runs, tmp_path, caplog, capsys,
                                                                               monkeypatch):
    """#22.1: a training split without any voxel of class 2 trained and reported its Dice like any other's."""
    import nibabel as nib

    split = _split_of(runs.run2d)
    data = shutil.copytree(runs.msd_a, tmp_path / "no_core")
    for case in split["train"]:
        path = data / "labelsTr" / f"{case}.nii.gz"
        img = nib.load(str(path))
        label = np.asarray(img.dataobj)
        nib.save(nib.Nifti1Image(np.where(label == 2, 1, label).astype(np.uint8), img.affine), str(path))
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        train(compose_config("train", TINY_MSD + [f"dataset.root={data}", *GEOMETRY["2d"], "trainer.max_epochs=1",
                                                  "posthoc.fit=[]", "posthoc.apply=[]",
                                                  f"dataset.split.file={runs.run2d / 'split.json'}"], tmp_path / "run"))
    assert any("class 'core' has no voxel in the training split" in r.message for r in caplog.records)
    summary = read(tmp_path / "run/eval/test/summary.json")
    assert summary["provenance"]["classes_unseen_in_training"] == ["core"]
    assert "(no voxel of it in the training split)" in capsys.readouterr().out


def test_a_shift_suite_of_another_modality_is_refused_naming_both(runs, make_cfg, tmp_path):
    """Issue #34 section 3, shift=ct on MRI: it ran without a word, adding noise and window shifts defined in
    Hounsfield units to MRI intensities (the window shift then degraded nothing). Each preset states its modality;
    a dataset of another one is refused naming both, before anything is written."""
    before = sorted(p for p in runs.run3d.rglob("*") if p.is_file())
    with pytest.raises(ConfigError, match=r"shift=ct is defined for CT .* dataset msd is MRI"):
        evaluate_with(make_cfg, tmp_path, [f"ckpt={runs.run3d}", "shift=ct", "shift.levels=[1]"])
    assert sorted(p for p in runs.run3d.rglob("*") if p.is_file()) == before
    from mcseg.data.shift import modality_of  # MSD's modality and nnU-Net's channel_names, read

    assert modality_of(["T1", "T2"]) == modality_of(["FLAIR"]) == modality_of(["MRI"]) == "MRI"
    assert modality_of(["CT"]) == modality_of(["non-contrast CT"]) == "CT"
    assert modality_of(["PET", "CT"]) is None and modality_of(["noise"]) is None
