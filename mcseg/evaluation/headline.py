"""The summary keys of the headline figures, without importing torch: those of the table of figures
(:mod:`mcseg.evaluation.figure_table`) that show in ``headline`` (the console's headline, ``val/<key>`` during
training, ``score.<key>``, a sweep's ``optimized_metric``, ``trainer.monitor``). The table is built from the scorer
classes, which import torch (seconds); with this list ``train.py`` refuses a misspelt key right after Hydra composes
(docs/benchmarks.md, "Start-up"). tests/test_startup.py checks that it equals ``summary_keys("headline")``, so a
figure added to the headline is one entry here too.
"""
from __future__ import annotations

__all__ = ["HEADLINE_KEYS"]

HEADLINE_KEYS = ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece")
