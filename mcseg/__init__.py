"""mcseg: train and evaluate medical segmentation networks with calibration losses (see README.md).

Layers, imports pointing only down and no two modules importing each other: entry points
(``train.py``, ``evaluate.py``, ``cli.py``, ``sweep.py``, ``report/``, ``evaluate_folder.py``,
``calibrate_folder.py``) -> ``training/`` (the loop, distributed training, checkpoints, relaunch checks) -> ``evaluation/`` (the
evaluator, a split, a checkpoint, an ensemble, a suite under shift, provenance) -> ``inference/``
(whole-volume prediction and its members, predictors built from a config or a checkpoint) ->
``calibration/``, ``data/``, ``metrics/``, ``models/``, ``losses/``, ``rundir.py`` (run
directories: ownership, finding them) and ``trials.py`` (a job's Optuna trial: reports, pruning) -> config, runtime and shared services (``config.py``,
``errors.py``, ``targets.py``, ``runtime.py``, ``environment.py``, ``text.py``, ``files.py``: writing files,
``identity.py``: what a run is, ``signatures.py``: a target's parameters read from its source). Two entry points
that need the same construction share a builder below them
(``inference/build.py``, ``evaluation/checkpoint.py``; ``training/build.py`` builds what ``train()`` fits, which
``scripts/benchmark.py`` times) instead of importing each other. ``tests/test_layers.py`` checks both rules.
"""
