"""Console entry points: ``mcseg-train`` and ``mcseg-evaluate`` (the same as ``train.py``/``evaluate.py``)."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")
# Errors that are the user's input, not a bug: one clear line and a non-zero exit.
# OSError covers a full disk and unwritable output directories (the message names the path).
USER_ERRORS = (ValueError, OSError, FloatingPointError)
EXIT_INTERRUPTED = 143  # 128 + SIGTERM, what schedulers expect from a terminated job


def run_reporting_errors(fn, cfg: DictConfig):
    from mcseg.errors import TrainingInterrupted

    try:
        return fn(cfg)
    except TrainingInterrupted as exc:
        logging.getLogger("mcseg").warning("%s", exc)
        print(f"interrupted: {exc}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except USER_ERRORS as exc:
        if os.environ.get("MCSEG_TRACEBACK"):
            raise
        logging.getLogger("mcseg").error("%s: %s", type(exc).__name__, exc)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def train_main(cfg: DictConfig):
    from mcseg.train import train

    result = run_reporting_errors(train, cfg)
    # Sweepers (Optuna) optimise the value named by hparams_search's `optimized_metric`, if any.
    metric = cfg.get("optimized_metric")
    return result.get(metric) if metric else None


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
def evaluate_main(cfg: DictConfig):
    from mcseg.evaluate import evaluate

    run_reporting_errors(evaluate, cfg)
