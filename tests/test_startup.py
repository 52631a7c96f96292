"""Issue #58 items 1-2: an entry point imports only what its command uses, and ``train.py`` refuses a typo before
torch is imported. Not timed (scripts/bench_startup.py measures): each test looks at which modules a fresh
interpreter holds."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mcseg.cli import train_checked
from mcseg.config import _accepted_parameters, fits, validate_train_config
from mcseg.errors import ConfigError
from mcseg.signatures import static_parameters

from .conftest import CONFIG_DIR, ROOT, TINY_2D, run_cli

# What no entry point imports before its command needs it: seconds each on 2 busy cores (docs/benchmarks.md);
# scipy: any of its modules that uses scipy.ndimage or the array API pulls numpy.f2py (about 1 s; scipy 1.17)
HEAVY = ("monai", "matplotlib", "scipy", "ignite", "tensorboard", "torch.utils.tensorboard",
         "optuna", "highdicom", "pydicom", "playwright", "mlflow", "wandb", "pandas", "sklearn")
# Hydra (train.py, evaluate.py), sweep and DICOM commands: not even torch before their command runs
# and the config checks they run before their command (mcseg.cli.train_checked, evaluate_checked)
TORCH_FREE = ("mcseg.cli", "mcseg.sweep", "mcseg.submitted", "mcseg.dicom_export", "mcseg.training.config_checks",
              "mcseg.calibration.posthoc_config")
ENTRY_POINTS = ("mcseg.evaluate_folder", "mcseg.calibrate_folder", "mcseg.conformal_folder", "mcseg.new_cases",
                "mcseg.report.cli", "mcseg.data.check", "mcseg.evaluate", "mcseg.train")


def _python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def test_entry_points_import_no_heavy_module_they_do_not_use():
    """One interpreter: the torch-free entry points first (nothing heavy, not torch), then every other one (the
    folder commands, mcseg-report, evaluate() and train() themselves: torch, but none of :data:`HEAVY`)."""
    done = _python(f"""
        import importlib, json, sys
        heavy = {HEAVY!r}
        seen = {{}}
        for name in {TORCH_FREE!r}:
            importlib.import_module(name)
        seen["torch-free"] = [m for m in heavy + ("torch",) if m in sys.modules]
        for name in {ENTRY_POINTS!r}:
            importlib.import_module(name)
            seen[name] = [m for m in heavy if m in sys.modules]
        print(json.dumps(seen))
    """)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {name: [] for name in ("torch-free",) + ENTRY_POINTS}


def test_train_refuses_a_wrong_type_before_importing_torch(tmp_path, monkeypatch):
    """``train.py optim.lr=abc``: one line naming the key, written nothing, and torch never imported (the
    interpreter's own import log, ``PYTHONPROFILEIMPORTTIME``, lists every module it imported)."""
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    done = run_cli("train.py", TINY_2D + ["optim.lr=abc", f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode == 1
    assert "error: config key 'optim.lr'='abc': expected a number or a Tensor (parameter lr of torch.optim.Adam)" \
        in done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "hydra" in imported and "omegaconf" in imported  # the log is there
    assert "torch" not in imported and "monai" not in imported


BAD = [  # override, the message train.py prints (as the checks after the imports print it)
    ("optim.lr=abc", "config key 'optim.lr'='abc': expected a number or a Tensor (parameter lr of torch.optim.Adam)"),
    ("trainer.precision=fp16", "config key 'trainer.precision': expected bf16 or 32, got 'fp16'"),
    ("evaluation.region=borders", "config key 'evaluation.region': expected one of label_foreground, union_foreground, "
                                  "all, boundary, got 'borders'"),
    ("model.channels=16", "config key 'model.channels'=16: expected a list of integers (parameter channels of "
                          "monai.networks.nets.UNet)"),
    ("loss.ignore_index=abc", "config key 'loss.ignore_index'='abc': expected an integer or null (parameter "
                              "ignore_index of mcseg.losses.CELoss)"),
    ("scheduler.power=abc", None),
    ("evaluation.n_bins=0", "config key 'evaluation.n_bins': expected an integer >= 1, got 0"),
]
MISSING_FILE = ("+dataset.split.file=/no/such/split.json", "dataset.split.file=/no/such/split.json: cannot read split ")
# in a fresh interpreter: a wrong type, a bad choice, a range and a missing file (each Hydra composition ~0.5 s)
FRESH = [BAD[0], BAD[1], BAD[-1], MISSING_FILE]


def test_config_checks_refuse_before_torch_is_imported(tmp_path):
    """:func:`mcseg.cli.train_checked` (what ``train.py`` runs once Hydra composed) on a wrong type, a bad choice,
    a value out of range and a missing file: each refused naming its key, in an interpreter that never imported
    torch."""
    done = _python(f"""
        import json, sys
        from hydra import compose, initialize_config_dir
        from omegaconf import open_dict
        from mcseg.cli import train_checked
        out = {{}}
        for override in {[o for o, _ in FRESH]!r}:
            with initialize_config_dir(config_dir={CONFIG_DIR!r}, version_base="1.3"):
                cfg = compose(config_name="train", overrides={TINY_2D!r} + [override])
            with open_dict(cfg):
                cfg.paths.output_dir = {str(tmp_path / "run")!r}
            try:
                train_checked(cfg)
            except Exception as exc:
                out[override] = f"{{type(exc).__name__}}: {{exc}}"
        out["torch imported"] = "torch" in sys.modules
        print(json.dumps(out))
    """)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out.pop("torch imported") is False
    for override, message in FRESH:
        assert message in out[override], (override, out[override])
    assert not (tmp_path / "run").exists()


# what only the training or the evaluation refused once torch, MONAI and the data were loaded (issue #58 item 2):
# the conformal node (mcseg.conformal.config), a dataset root that is not a directory (mcseg.data.roots); each
# override list composed on its own (the dataset's: hippocampus, whose root is a folder)
LATE = [
    (["conformal.alpha=2"], "config key 'conformal.alpha': expected 0 < alpha < 1, got 2"),
    # a tracker's settings: refused before torch already on main (mcseg.config.check_logger), kept so here
    (["logger=wandb", "logger.wandb.mode=sometimes"], "config key 'logger.wandb.mode'='sometimes'"),
    (["dataset=hippocampus", "dataset.root=/no/such/folder"],
     "dataset.root=/no/such/folder: directory /no/such/folder does not exist"),
]
# evaluate.py's: the root as above, the evaluation protocol (mcseg.config.EvalProtocol) and the split's name
LATE_EVALUATE = [
    LATE[-1],
    (["evaluation.region=borders"], "config key 'evaluation.region': expected one of label_foreground, "
                                    "union_foreground, all, boundary, got 'borders'"),
    (["split=tset"], "split='tset': expected one of train, val, test or all"),
]


def test_conformal_and_dataset_root_refused_before_torch_is_imported(tmp_path):
    """:func:`mcseg.cli.train_checked` on a bad conformal node and a missing dataset root, and
    :func:`mcseg.cli.evaluate_checked` on the root, the evaluation protocol and the split: refused naming the key, in an interpreter that never imported
    torch (before issue #58 item 2: by ``train()`` and the dataset, after the imports)."""
    done = _python(f"""
        import json, sys
        from hydra import compose, initialize_config_dir
        from omegaconf import open_dict
        from mcseg.cli import train_checked
        out = []

        def check(checked, cfg):  # the refusal's text (or "accepted"), then whether torch got imported
            try:
                checked(cfg)
                out.append("accepted")
            except Exception as exc:
                out.append(f"{{type(exc).__name__}}: {{exc}}")
            out.append("torch" in sys.modules)

        for overrides in {[o for o, _ in LATE]!r}:
            tiny = [] if overrides[0].startswith("dataset=") else {TINY_2D!r}
            with initialize_config_dir(config_dir={CONFIG_DIR!r}, version_base="1.3"):
                cfg = compose(config_name="train", overrides=tiny + overrides)
            with open_dict(cfg):
                cfg.paths.output_dir = {str(tmp_path / "run")!r}
            check(train_checked, cfg)
        from mcseg.cli import evaluate_checked  # evaluate.py's checks before its imports
        for overrides in {[o for o, _ in LATE_EVALUATE]!r}:
            with initialize_config_dir(config_dir={CONFIG_DIR!r}, version_base="1.3"):
                cfg = compose(config_name="evaluate", overrides=["ckpt=/no/such.pt"] + overrides)
            check(evaluate_checked, cfg)
        print(json.dumps(out))
    """)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    for i, (overrides, message) in enumerate(LATE + LATE_EVALUATE):
        assert message in out[2 * i], (overrides, out[2 * i])
        assert out[2 * i + 1] is False, f"{overrides}: torch imported before the refusal"
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_a_bad_conformal_node_before_importing_torch(tmp_path, monkeypatch):
    """``evaluate.py ckpt=... conformal.alpha=2``: one line naming the key, and torch never imported (the import
    log, as for ``train.py``); before issue #58 item 2 ``evaluate()`` refused it after importing torch."""
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    done = run_cli("evaluate.py", [f"ckpt={tmp_path / 'no_such.pt'}", "conformal.alpha=2",
                                   f"hydra.run.dir={tmp_path / 'job'}"])
    assert done.returncode == 1
    assert "error: config key 'conformal.alpha': expected 0 < alpha < 1, got 2" in done.stderr, done.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "hydra" in imported and "torch" not in imported


@pytest.mark.parametrize("override", [o for o, _ in BAD if not o.startswith("+")])
def test_the_early_checks_say_what_the_later_ones_say(make_cfg, override):
    """The same message from the checks before the imports as from those after them (``imports=True``)."""
    cfg = make_cfg(TINY_2D + [override])
    messages = []
    for imports in (False, True):
        with pytest.raises(ConfigError) as raised:
            validate_train_config(cfg, imports=imports)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]


def _target_nodes() -> list:
    """Every ``_target_`` node of configs/ (mcseg, torch, MONAI) as (target, its keys and values)."""
    import yaml

    found: dict[str, list[dict]] = {}

    def walk(node):
        if isinstance(node, dict):
            if "_target_" in node:
                found.setdefault(node["_target_"], []).append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    for path in sorted(Path(CONFIG_DIR).rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            walk(doc)
    # MONAI's targets: its import takes seconds (docs/benchmarks.md, "Start-up")
    return [pytest.param(t, found[t], marks=[pytest.mark.slow] if t.startswith("monai.") else [], id=t)
            for t in sorted(found) if t.startswith(("mcseg.", "torch.", "monai."))]


@pytest.mark.parametrize("target,nodes", _target_nodes())
def test_the_source_gives_the_parameters_the_import_gives(target, nodes):
    """For every ``_target_`` of configs/: :func:`static_parameters` finds the names the imported class or function
    takes, the same answer on ``**kwargs``, and accepts each value its configs give (as the imported check does)."""
    found = static_parameters(target)
    if found is None:
        pytest.skip(f"{target}: its source does not say for certain (not checked before the imports)")
    params, open_ended = found
    imported, imported_open = _accepted_parameters(target, "key")
    assert set(imported) - {"self"} <= set(params) and set(params) - set(imported) <= {"self"}
    assert open_ended == imported_open
    for node in nodes:
        for key, value in node.items():
            if key in params and params[key].annotation is not params[key].empty and \
                    not (isinstance(value, str) and "${" in value):
                assert fits(value, params[key].annotation) == fits(value, imported[key].annotation), (key, value)


# what build_run refused only after torch, MONAI and Fiducio were imported (the scaler registry and the table of
# figures are built from classes that import them), and optimized_metric, not checked at all before: refused by
# mcseg.training.config_checks from torch-free tables (mcseg.calibration.scaler_names, mcseg.evaluation.headline)
POSTHOC = [
    (["posthoc.fit=[temprature]"], "config key 'posthoc.fit': unknown scaler 'temprature' (expected temperature, "),
    (["posthoc.voxels=foreground"], "config key 'posthoc.voxels': expected one of balanced, all, region, got "
                                    "'foreground'"),
    (["posthoc.fit=[vector]", "posthoc.apply=[vector]", "posthoc.voxels=all", "posthoc.objective=ece"],
     "config key 'posthoc.objective'=ece: scaler 'vector' is fitted by nll only"),
    (["+posthoc.lts.learning_rate=0.1"], "config key 'posthoc.lts.learning_rate': not an LTS setting"),
    (["posthoc.fit=[temperature,lts]", "posthoc.lts.holdout=2"],
     "config key 'posthoc.lts': LTS: holdout=2 must lie in (0, 1)"),
    (["posthoc.fit=[cmsap]", "posthoc.apply=[]", "+posthoc.fiducio.optimiser=lbfgs"],
     "config key 'posthoc.fiducio.optimiser': not a Fiducio fit setting (expected optimizer, lr, "),
    (["posthoc.apply=[temperature,vector]"], "config key 'posthoc.apply'=['temperature', 'vector']: each applied "
                                             "scaler must also be in posthoc.fit"),
]
SELECTION = [
    (["+score.mean_dice=1"], "config key 'score.mean_dice': not a validation metric (expected mean_foreground_dice, "
                             "mean_foreground_hd95_mm, mean_ece, mean_classwise_ece)"),
    (["score.mean_ece=abc"], "config key 'score.mean_ece'='abc': expected a number"),
    (["+optimized_metric=val/dice"], "config key 'optimized_metric'=val/dice: not a figure train() returns "
                                     "(expected score, or <prefix>/<key> with a prefix of val, val_full, best_val"),
    (["trainer.monitor=val/dice"], "config key 'trainer.monitor'=val/dice: not a validation metric"),
]


@pytest.mark.parametrize("overrides,message", POSTHOC + SELECTION, ids=[o[-1] for o, _ in POSTHOC + SELECTION])
def test_posthoc_score_and_selection_refused_by_the_early_checks(make_cfg, overrides, message, monkeypatch):
    """:func:`mcseg.cli.train_checked` on a misspelt scaler, voxel sample, objective, LTS or Fiducio setting, an
    applied scaler not fitted, a ``score`` key or weight, ``optimized_metric`` and ``trainer.monitor``: refused
    naming its key before ``train()`` is called (before: by ``build_run`` after the imports; ``optimized_metric``
    and the weights never). The next test checks that these checks import no torch."""
    import mcseg.train

    monkeypatch.setattr(mcseg.train, "train", lambda cfg: pytest.fail(f"{overrides}: train() reached"))
    with pytest.raises(ConfigError) as raised:
        train_checked(make_cfg(TINY_2D + overrides))
    assert message in str(raised.value)


def test_posthoc_and_selection_checks_import_no_torch(tmp_path):
    """In a fresh interpreter: ``optimized_metric`` refused, and sound sweep and post-hoc settings accepted by
    :func:`mcseg.training.config_checks.check_training_config`, without torch ever imported; then a misspelt scaler
    refused by :func:`mcseg.cli.train_checked` and :func:`mcseg.cli.evaluate_checked` (a name without a line in the
    torch-free table is looked up in the scaler registry, which imports torch: a scaler added as one class and one
    registry entry is accepted)."""
    done = _python(f"""
        import json, sys
        from hydra import compose, initialize_config_dir
        from omegaconf import open_dict
        from mcseg.cli import evaluate_checked, train_checked
        from mcseg.training.config_checks import check_training_config
        out = []

        def check(checked, name, overrides):
            with initialize_config_dir(config_dir={CONFIG_DIR!r}, version_base="1.3"):
                cfg = compose(config_name=name, overrides=overrides)
            with open_dict(cfg):
                cfg.paths.output_dir = {str(tmp_path / "run")!r}
            try:
                checked(cfg)
                out.append("accepted")
            except Exception as exc:
                out.append(f"{{type(exc).__name__}}: {{exc}}")

        check(train_checked, "train", {TINY_2D!r} + {SELECTION[2][0]!r})
        for metric in ("score", "val/mean_ece", "best_val_full/mean_foreground_dice", "test_temperature/mean_ece"):
            check(check_training_config, "train", {TINY_2D!r} + [f"+optimized_metric={{metric}}"])
        check(check_training_config, "train", {TINY_2D!r} + ["posthoc.fit=[temperature,lts,cmsap]",
                                                           "posthoc.apply=[lts]"])
        out.append("torch" in sys.modules)
        check(train_checked, "train", {TINY_2D!r} + {POSTHOC[0][0]!r})
        check(evaluate_checked, "evaluate", ["ckpt=/no/such.pt", "posthoc.apply=[temprature]"])
        print(json.dumps(out))
    """)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert SELECTION[2][1] in out[0], out[0]
    assert out[1:7] == ["accepted"] * 5 + [False]
    assert POSTHOC[0][1] in out[7] and "config key 'posthoc.apply': unknown scaler 'temprature'" in out[8], out[7:]
    assert not (tmp_path / "run").exists()


def test_the_torch_free_tables_equal_the_registries():
    """The scaler names and facts the early checks read (:data:`mcseg.calibration.scaler_names.SCALER_FACTS`) are
    those of the scaler classes (:data:`~mcseg.calibration.scaler_registry.SCALER_TYPES`, in order), and the
    headline keys (:data:`mcseg.evaluation.headline.HEADLINE_KEYS`)
    those of the table of figures: neither list can drift from what it mirrors."""
    from mcseg.calibration.scaler_names import SCALER_FACTS, ScalerFacts
    from mcseg.calibration.scaler_registry import SCALER_TYPES
    from mcseg.evaluation.figure_table import summary_keys
    from mcseg.evaluation.headline import HEADLINE_KEYS

    # a line is optional (a scaler without one is looked up in the registry: one class and one entry), but each
    # line is its class's facts
    assert set(SCALER_FACTS) <= set(SCALER_TYPES)
    for name, cls in ((name, SCALER_TYPES[name]) for name in SCALER_FACTS):
        assert SCALER_FACTS[name] == ScalerFacts(cls.preserves_argmax, cls.fitted_on, tuple(cls.objectives),
                                                 cls.softmax_only, hasattr(cls, "calibrator_class")), name
    assert HEADLINE_KEYS == summary_keys("headline")
