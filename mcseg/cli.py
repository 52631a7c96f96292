"""Console entry points: ``mcseg-train`` and ``mcseg-evaluate`` (the same as ``train.py``/``evaluate.py``)."""
from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from mcseg.config import CONFIG_DIR
from mcseg.identity import job_name

# ${mcseg_job:...} names sweep job directories (configs/hydra/default.yaml); registered on import,
# which also happens in the worker processes of the joblib and submitit launchers.
OmegaConf.register_new_resolver("mcseg_job", job_name, replace=True)


def refuse_early(cfg: DictConfig) -> None:
    """The checks of what ``train.py`` and ``evaluate.py`` share that need neither torch nor MONAI nor the data:
    the ``conformal`` node (:func:`mcseg.conformal.config.conformal_config`), the ``posthoc`` node (scaler names,
    voxels, objective, LTS settings, the names of Fiducio's settings:
    :class:`~mcseg.calibration.posthoc_config.PosthocConfig`) and a ``dataset.root`` that is not a folder
    (:func:`mcseg.data.roots.resolve_root`, as the dataset resolves it later); ``train()``, ``evaluate()`` and the
    dataset make them again with everything imported."""
    from mcseg.calibration.posthoc_config import PosthocConfig
    from mcseg.config import typed
    from mcseg.conformal.config import conformal_config
    from mcseg.data.roots import resolve_root

    conformal_config(cfg)
    typed(cfg.get("posthoc"), PosthocConfig, "posthoc")
    dataset = cfg.get("dataset") or {}
    if "root" in dataset:
        resolve_root(dataset.get("root"))


def train_checked(cfg: DictConfig) -> dict:
    """``train(cfg)`` after the checks that need neither torch nor MONAI nor the data (types, choices, ranges,
    unknown keys, the conformal and posthoc nodes, the ``score`` keys, ``optimized_metric`` and ``trainer.monitor``,
    a dataset root or a split file that cannot be read), so that a typo is refused within a second of Hydra
    composing, not after the imports of the training (docs/benchmarks.md, "Start-up")."""
    from mcseg.config import validate_train_config
    from mcseg.data.split import read_split_file
    from mcseg.training.config_checks import check_training_config

    validate_train_config(cfg, imports=False)
    refuse_early(cfg)
    check_training_config(cfg)
    split_file = (cfg.dataset.get("split") or {}).get("file")
    if split_file and not (Path(cfg.paths.output_dir) / "split.json").is_file():  # a resume reads its own
        read_split_file(split_file)
    from mcseg.train import train

    return train(cfg)


def evaluate_checked(cfg: DictConfig) -> dict:
    """``evaluate(cfg)`` after :func:`refuse_early`, the evaluation protocol and the split's name: a typo refused
    before torch is imported."""
    from mcseg.config import EvalProtocol, typed
    from mcseg.data.split import check_split_name

    refuse_early(cfg)
    typed(cfg.evaluation, EvalProtocol, "evaluation")
    check_split_name(cfg.split)
    from mcseg.evaluate import evaluate

    return evaluate(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def train_main(cfg: DictConfig):
    from mcseg.sweep import run_job

    result = run_job(train_checked, cfg, checks_itself=True)  # train begins its directory after its checks
    # Sweepers (Optuna) optimise the value named by `optimized_metric` (hparams_search presets);
    # a failed job returns None, which the Optuna sweeper records as a failed trial.
    metric = cfg.get("optimized_metric")
    return result.get(metric) if metric and result else None


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
def evaluate_main(cfg: DictConfig):
    from mcseg.sweep import run_job

    result = run_job(evaluate_checked, cfg)
    hc = HydraConfig.get()
    chosen = any(o.startswith("hydra.run.dir=") for o in hc.overrides.hydra)
    if cfg.get("ckpt") and result and hc.mode == RunMode.RUN and not chosen:
        from mcseg.evaluate import move_job_record

        # its results and their provenance are elsewhere: no timestamped job directory left behind
        move_job_record(Path(cfg.paths.output_dir), Path(result["provenance"]["output_dir"]))
