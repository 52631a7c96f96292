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

from mcseg.config import _accepted_parameters, fits, validate_train_config
from mcseg.errors import ConfigError
from mcseg.signatures import static_parameters

from .conftest import CONFIG_DIR, ROOT, TINY_2D, run_cli

# What no entry point imports before its command needs it: seconds each on 2 busy cores (docs/benchmarks.md)
HEAVY = ("monai", "matplotlib", "scipy.signal", "scipy.stats", "ignite", "tensorboard", "torch.utils.tensorboard",
         "optuna", "highdicom", "pydicom", "playwright", "mlflow", "wandb", "pandas", "sklearn")
# Hydra (train.py, evaluate.py), sweep and DICOM commands: not even torch before their command runs
TORCH_FREE = ("mcseg.cli", "mcseg.sweep", "mcseg.submitted", "mcseg.dicom_export")
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
