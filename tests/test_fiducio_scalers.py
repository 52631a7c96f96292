"""Issue #45, items 1, 2 and 5: Fiducio's calibrators behind mcseg's scaler interface.

* mcseg's calibrated probabilities are Fiducio's own ``transform`` of the same input, with the calibrator that
  ``fiducio.load_calibrator`` reads from the file mcseg saved (1e-5), slab by slab or whole;
* every calibrator that claims to keep the arg-max keeps it, on 2D and 3D logits with exact ties and a class
  absent from the fit (its claim is the ``guarantee`` recorded in calibration.json); those that claim the class
  order keep it too;
* mcseg's temperature and vector scaling are Fiducio's TS and VS on the same voxels and objective (one
  implementation of each: mcseg's);
* a multi-label model is refused, naming the key.
"""
from __future__ import annotations

import fiducio
import pytest
import torch

from mcseg.calibration.fiducio_adapters import FIDUCIO_SCALERS, GUARANTEES
from mcseg.calibration.scaler_registry import SCALER_TYPES, FitData, build_scaler, load_scaler
from tests.calibrate_folder.conftest import nn  # noqa: F401  (its nnU-Net folders, made by nnU-Net's export)

NAMES = [o.name for o in FIDUCIO_SCALERS]
KEEPING = [o.name for o in FIDUCIO_SCALERS if o.guarantee != "none"]
SHA = "ab" * 32
K = 4


def _voxels(n: int = 3000, seed: int = 0, absent: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Over-confident N x K logits and their labels; with ``absent``, that class is neither a label nor the top
    class of any voxel (its class-conditional expert gets no data)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, K, (n,), generator=g)
    if absent is not None:
        target[target == absent] = (absent + 1) % K
    logits = torch.nn.functional.one_hot(target, K).float() * 2.0 + torch.randn(n, K, generator=g) * 1.5
    logits = logits * 3.0 + torch.randn(n, 1, generator=g) * 5.0  # per-voxel offsets
    if absent is not None:
        logits[:, absent] = logits.min(1).values - 1.0
    return logits, target


def _fitted(name: str, directory, absent: int | None = None):
    scaler = build_scaler(name)
    scaler.fit(FitData(_voxels(absent=absent), sample={"voxels": "all"}))
    record = scaler.save(directory, SHA)
    return scaler, record


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """Each calibrator fitted once (class K - 1 absent from the fit) and saved, shared by the tests of this
    module that only read it: ``fits(name) -> (scaler, record, directory)``."""
    directory, cache = tmp_path_factory.mktemp("fits"), {}

    def get(name: str):
        if name not in cache:
            cache[name] = (*_fitted(name, directory, absent=K - 1), directory)
        return cache[name]

    return get


def _case(shape: tuple[int, ...], seed: int = 5) -> torch.Tensor:
    """``K x *S`` test logits with exact ties between the top classes on a quarter of the voxels and voxels
    whose top class is class K - 1 (absent from the fit of ``_fitted(..., absent=K - 1)``)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(K, *shape, generator=g) * 4.0
    flat = z.view(K, -1)
    n = flat.shape[1]
    top2 = flat.topk(2, dim=0).indices
    tie = torch.arange(n) % 4 == 0
    cols = torch.nonzero(tie).flatten()
    flat[top2[1, cols], cols] = flat[top2[0, cols], cols]  # the two largest equal: an exact tie
    all_tied = torch.arange(n) % 11 == 0
    flat[:, all_tied] = 1.5  # every class tied
    return z


def test_every_scaler_says_what_it_guarantees():
    for name, kind in SCALER_TYPES.items():
        assert kind.guarantee in GUARANTEES, name
        assert kind.preserves_argmax == (kind.guarantee != "none"), name


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_mcsegs_probabilities_are_fiducios_own_transform_of_the_saved_calibrator(name, fits, monkeypatch):
    scaler, record, directory = fits(name)
    path = directory / record["file"]
    assert record["file"] == f"fiducio-{name}-{SHA[:8]}.pt" and record["guarantee"] == SCALER_TYPES[name].guarantee
    assert record["calibrator"] == SCALER_TYPES[name].calibrator_class.__name__
    assert record["nll_after"] <= record["nll_before"]
    theirs = fiducio.load_calibrator(path)  # Fiducio reads mcseg's file
    z = _case((6, 7, 5))
    expected = theirs.transform(z[None])[0]
    loaded = load_scaler(name, record, directory)
    ours = torch.softmax(loaded.apply(z), 0)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    monkeypatch.setattr("mcseg.calibration.fiducio_adapters.CHUNK_VOXELS", 7 * 5)  # one slice a slab
    torch.testing.assert_close(torch.softmax(loaded.apply(z), 0), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.softmax(scaler.apply(z), 0), expected, atol=1e-5, rtol=0)  # as fitted


def test_a_changed_or_foreign_calibrator_file_is_refused(tmp_path):
    _, record = _fitted("dirichlet", tmp_path)
    other = build_scaler("ms")
    other.fit(FitData(_voxels(seed=3)))
    other.save(tmp_path, SHA)
    with pytest.raises(ValueError, match="holds a MatrixScaling, not the DirichletCalibration"):
        load_scaler("dirichlet", {**record, "file": f"fiducio-ms-{SHA[:8]}.pt", "file_sha256": None}, tmp_path)
    (tmp_path / record["file"]).write_bytes((tmp_path / record["file"]).read_bytes() + b"x")
    with pytest.raises(ValueError, match="does not match the sha256"):
        load_scaler("dirichlet", record, tmp_path)
    with pytest.raises(ValueError, match="record of calibration.json is incomplete"):
        load_scaler("dirichlet", {"guarantee": "none"}, tmp_path)


@pytest.mark.parametrize("shape", [(9, 8), (6, 5, 7)], ids=["2D", "3D"])
@pytest.mark.parametrize("name", KEEPING)
def test_a_calibrator_that_claims_to_keep_the_argmax_keeps_it(name, shape, fits):
    """Ties (two classes, every class) and a class absent from the fit included; with the ``order`` claim, no
    pair of classes changes its order either."""
    scaler, _, _ = fits(name)
    z = _case(shape)
    raw = torch.softmax(z, 0)
    calibrated = torch.softmax(scaler.apply(z), 0)
    assert not torch.allclose(calibrated, raw, atol=1e-3)  # it did calibrate something
    assert torch.equal(calibrated.argmax(0), raw.argmax(0))
    assert (z.view(K, -1).argmax(0) == K - 1).any()  # voxels routed to the absent class's expert
    if SCALER_TYPES[name].guarantee == "order":
        before, after = z.unsqueeze(0) - z.unsqueeze(1), calibrated.unsqueeze(0) - calibrated.unsqueeze(1)
        assert not ((before > 0) & (after < 0)).any()  # a class above another stays at least level with it


def test_a_calibrator_without_the_claim_does_move_the_argmax_here(fits):
    """The claims are not vacuous: matrix scaling of the same data moves some voxels' arg-max."""
    scaler, _, _ = fits("ms")
    z = _case((9, 8))
    assert not torch.equal(torch.softmax(scaler.apply(z), 0).argmax(0), torch.softmax(z, 0).argmax(0))


@pytest.mark.parametrize("name", NAMES)
def test_a_multilabel_model_is_refused_naming_the_key(name):
    logits, target = _voxels(200)
    with pytest.raises(ValueError, match=rf"posthoc.fit.*{name}.*sigmoid per region"):
        build_scaler(name).fit(FitData((logits, torch.nn.functional.one_hot(target, K)), multilabel=True))


@pytest.mark.parametrize("kind", ["temperature", "vector"])
def test_mcsegs_temperature_and_vector_scaling_are_fiducios_ts_and_vs(kind):
    """The same voxels, the same objective (mean cross-entropy) and optimiser (L-BFGS, lr 1, 100 iterations,
    strong Wolfe): the same map. Only the temperature's parametrisation differs (exp(log T) against
    softplus(a) + 1e-6), so T agrees to the optimiser's tolerance, not bit for bit (docs/posthoc.md)."""
    from mcseg.calibration.logit_scaling import fit_scaler, scale_logits

    logits, target = _voxels(5000, seed=2)
    ours = fit_scaler(kind, logits, target, lambda z: torch.softmax(z, 1), max_iter=100)
    theirs = (fiducio.TS if kind == "temperature" else fiducio.VS)(optimizer="lbfgs", device="cpu")
    theirs.fit(logits, target)
    if kind == "temperature":
        assert ours["temperature"] == pytest.approx(theirs.temperature, rel=1e-4)
        assert ours["temperature"] > 1.5  # over-confident: a real fit, not the identity
    else:  # the objective is flat along some directions of (w, b): parameters to 5e-4, the NLL to 1e-6
        state = theirs._get_state()
        torch.testing.assert_close(torch.tensor(ours["weight"]), state["weight"], atol=5e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(ours["bias"]), state["bias"], atol=5e-4, rtol=0)
    probs = theirs.transform(logits)
    torch.testing.assert_close(torch.softmax(scale_logits(logits, ours), 1), probs, atol=5e-4, rtol=0)
    assert ours["nll_after"] == pytest.approx(float(torch.nn.functional.nll_loss(probs.log(), target)), abs=1e-6)


def _per_case(path) -> list[tuple]:
    """(case, class, Dice, HD95) of every row of a per_case.csv, as written (bitwise)."""
    import csv

    with open(path, newline="") as f:
        return [(r["case"], r["class_name"], r["dice"], r["hd95_mm"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_a_run_fits_applies_and_reports_every_fiducio_calibrator_and_evaluate_reuses_them(make_cfg, tmp_path,
                                                                                         one_thread):
    """posthoc.fit/apply of a training run (about 18 s of CPU, the training and evaluations; the fits are cheap):
    each fitted on the run's validation voxel sample (the temperature's),
    saved as Fiducio reads it, applied to the test split; those that keep the arg-max move no voxel's label and
    leave Dice and HD95 bitwise; the summary and the report say which changed the segmentation; evaluate.py
    applies the recorded fits to another split without refitting."""
    import json

    from mcseg.evaluate import evaluate
    from mcseg.report.collect import collect_runs
    from mcseg.report.render import markdown
    from mcseg.report.table import build_rows
    from mcseg.train import train
    from tests.conftest import TINY_2D

    names = ["temperature", *NAMES]
    listed = ",".join(names)
    train(make_cfg([*TINY_2D, "dataset.split.val_fraction=0.3", f"posthoc.fit=[{listed}]",
                    f"posthoc.apply=[{listed}]", "posthoc.voxels=balanced"]))
    run = tmp_path / "run"
    (sha, record), = json.loads((run / "calibration.json").read_text())["fits"].items()
    for name in set(names) & set(NAMES):
        fitted = record["scalers"][name]
        assert fitted["guarantee"] == SCALER_TYPES[name].guarantee and fitted["n_voxels"] == record["n_voxels"] > 0
        assert fitted["voxels"] == "balanced" and fitted["file"] == f"fiducio-{name}-{sha[:8]}.pt"
        assert type(fiducio.load_calibrator(run / fitted["file"])).__name__ == fitted["calibrator"]
    assert all(record["scalers"][name]["guarantee"] == SCALER_TYPES[name].guarantee for name in names)
    test = run / "eval" / "test"
    summary = json.loads((test / "summary.json").read_text())
    raw = _per_case(test / "per_case.csv")
    for name in names:
        change = summary["posthoc"][name]["segmentation"]
        assert change["voxels"] > 0 and change["cases"] == summary["n_cases"]
        if SCALER_TYPES[name].preserves_argmax:
            assert (change["changed"], change["scored_prediction"], change["voxels_changed"]) == (False, "raw", 0)
            assert _per_case(test / name / "per_case.csv") == raw
            assert set(change["difference"].values()) <= {0.0, None}
        else:
            assert change["scored_prediction"] == "calibrated"
            assert change["changed"] == (change["voxels_changed"] > 0)
    assert any(summary["posthoc"][n]["segmentation"]["changed"] for n in names)  # the check can see a change
    text = markdown(build_rows(collect_runs([run]), baseline=None, n_boot=10), "t", [])
    table = text[text.index("## Post-hoc scalers"):].split("\n## ")[0]
    assert "| segmentation |" in table and "| raw |" in table
    assert "cmsap (balanced, nll) |" in table and table.split("cmsap (balanced, nll) |")[1].split("\n")[0].endswith(
        "| kept |")
    # evaluate.py: the recorded fits, applied to the validation split, nothing refitted
    stamp = {p.name: p.read_bytes() for p in run.glob("fiducio-*.pt")}, (run / "calibration.json").read_text()
    evaluate(make_cfg([f"ckpt={run / 'checkpoints' / 'best.pt'}", "split=val", "posthoc.apply=[cmsap,ms]"],
                      config_name="evaluate", output_dir=tmp_path / "eval_job"))
    assert ({p.name: p.read_bytes() for p in run.glob("fiducio-*.pt")}, (run / "calibration.json").read_text()) == stamp
    val = json.loads((run / "eval" / "val" / "summary.json").read_text())
    assert set(val["posthoc"]) == {"cmsap", "ms"} and val["posthoc"]["cmsap"]["segmentation"]["voxels_changed"] == 0
    val_dir = run / "eval" / "val"
    assert _per_case(val_dir / "cmsap" / "per_case.csv") == _per_case(val_dir / "per_case.csv")


def test_a_multilabel_run_asking_for_one_is_refused_before_training(make_cfg, tmp_path, one_thread):
    from mcseg.errors import ConfigError
    from mcseg.train import train
    from tests.data.data_helpers import TINY_RUN, fake_download

    _, overrides = fake_download("brats_regions", tmp_path)
    with pytest.raises(ConfigError, match=r"posthoc.fit.*'cmsop' calibrates a softmax only.*sigmoid per region"):
        train(make_cfg([*overrides, *TINY_RUN, "loss=bce", "posthoc.fit=[temperature,cmsop]",
                        "posthoc.apply=[temperature]", "posthoc.voxels=balanced"]))
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("name", ["cmsap", "ms"])
def test_calibrate_folder_fits_one_on_nnunet_files_and_writes_them_back(name, nn, tmp_path):
    """The fit of the validation folder, saved as Fiducio reads it, applied to the test folder's npz: nnU-Net's
    files written back (its label map rule on the calibrated probabilities), the probabilities Fiducio's own
    transform of ln p; the arg-max keeper's label maps are nnU-Net's originals."""
    import json

    import numpy as np
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO

    from mcseg.calibrate_folder import main as calibrate
    from mcseg.evaluation.folder_posthoc import log_probabilities

    folders = nn["labels"]
    val, test = folders["members"]
    out = tmp_path / "out"
    voxels = [] if SCALER_TYPES[name].preserves_argmax else ["--voxels", "all"]
    assert calibrate(["--fit", str(val), "--reference", str(folders["raw"]), "--apply", str(test), "-o", str(out),
                      "--splits", str(folders["splits"]), "--fold", "0", "--allow-fit-cases", "--scaler", name,
                      *voxels]) == 0
    (key, fit), = json.loads((out / "calibration.json").read_text())["fits"].items()
    fitted = fit["scalers"][name]
    assert fitted["guarantee"] == SCALER_TYPES[name].guarantee and fitted["file"] == f"fiducio-{name}-{key[:8]}.pt"
    theirs = fiducio.load_calibrator(out / fitted["file"])
    for case in ("tiny_001", "tiny_003"):
        old = np.load(test / f"{case}.npz")["probabilities"]
        new = np.load(out / f"{case}.npz")["probabilities"]
        expected = theirs.transform(log_probabilities(torch.from_numpy(old), False)[None])[0]
        np.testing.assert_allclose(new, expected.numpy(), atol=1e-5)
        seg, _ = SimpleITKIO().read_seg(str(out / f"{case}.nii.gz"))
        np.testing.assert_array_equal(seg[0], new.argmax(0))  # nnU-Net's rule, on the calibrated file
        if SCALER_TYPES[name].preserves_argmax:
            np.testing.assert_array_equal(seg, SimpleITKIO().read_seg(str(test / f"{case}.nii.gz"))[0])


def test_calibrate_folder_refuses_one_for_nnunet_region_files(nn, tmp_path, capsys):
    from mcseg.calibrate_folder import main as calibrate

    folders = nn["regions"]
    out = tmp_path / "out"
    assert calibrate(["--fit", str(folders["pred"]), "--reference", str(folders["raw"]), "-o", str(out),
                      "--scaler", "cmsap"]) == 2
    assert "--scaler cmsap: post-hoc scaler 'cmsap' calibrates a softmax only" in capsys.readouterr().err
    assert not (out / "calibration.json").exists()


def test_calibrate_folder_fits_one_on_monai_files(tmp_path):
    import json

    import nibabel as nib
    import numpy as np

    from mcseg.calibrate_folder import main as calibrate
    from mcseg.evaluate_folder import main as evaluate
    from mcseg.evaluation.folder_posthoc import log_probabilities
    from tests.test_monai_folders import _labels
    from tests.tool_outputs import make_monai

    labels = _labels(tmp_path / "labels", (11, 9, 6))
    pred = make_monai(tmp_path / "pred", labels, noise=3.0)
    out = tmp_path / "out"
    assert calibrate(["--fit", str(pred), "--reference", str(labels), "--apply", str(pred), "-o", str(out),
                      "--allow-fit-cases", "--scaler", "ets"]) == 0
    fitted = next(iter(json.loads((out / "calibration.json").read_text())["fits"].values()))["scalers"]["ets"]
    theirs = fiducio.load_calibrator(out / fitted["file"])
    old = np.moveaxis(nib.load(str(pred / "case_0" / "case_0_trans.nii.gz")).get_fdata(dtype=np.float32), -1, 0)
    new = np.moveaxis(nib.load(str(out / "case_0" / "case_0_trans.nii.gz")).get_fdata(dtype=np.float32), -1, 0)
    expected = theirs.transform(log_probabilities(torch.from_numpy(old), False)[None])[0]
    np.testing.assert_allclose(new, expected.numpy(), atol=1e-5)
    assert evaluate([str(out), str(labels), "-o", str(tmp_path / "e"), "--bootstrap-samples", "0",
                     "--no-failure-detection", "--no-figures"]) == 0
    # a calibration of the folder that replaces it (--overwrite) removes the calibrator file with the rest
    assert calibrate(["--fit", str(pred), "--reference", str(labels), "-o", str(out), "--overwrite"]) == 0
    assert not (out / fitted["file"]).exists()


def test_posthoc_fiducio_sets_how_they_are_fitted_and_a_bad_setting_is_refused_at_start():
    from mcseg.calibration import PosthocConfig
    from mcseg.calibration.scaler_registry import FitOptions
    from mcseg.errors import ConfigError

    options = FitOptions(fiducio={"optimizer": "lbfgs", "max_iter": 20, "lambda_reg": 0.01})
    cmsap, ets = build_scaler("cmsap", options), build_scaler("ets", options)
    assert cmsap.fit(FitData(_voxels(500)))["config"] | {"optimizer": "lbfgs", "max_iter": 20, "lambda_reg": 0.01} \
        == cmsap.record["config"]
    assert "lambda_reg" not in ets.fit(FitData(_voxels(500)))["config"]  # ETS has no regulariser: not given it
    assert ets.record["config"]["optimizer"] == "lbfgs"
    assert build_scaler("ms").fit(FitData(_voxels(500)))["config"]["optimizer"] == "adam"  # {}: Fiducio's default
    with pytest.raises(ConfigError, match=r"posthoc.fiducio.optimiser': not a Fiducio fit setting"):
        PosthocConfig(fit=["cmsap"], apply=[], fiducio={"optimiser": "lbfgs"})
    with pytest.raises(ConfigError, match=r"posthoc.fiducio'=\{'optimizer': 'sgd'\}: cmsap refuses it"):
        PosthocConfig(fit=["temperature", "cmsap"], apply=[], fiducio={"optimizer": "sgd"})
