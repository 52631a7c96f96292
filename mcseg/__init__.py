"""mcseg: train and evaluate medical segmentation networks with calibration losses (see README.md).

Layers, imports pointing only down: entry points (``train.py``, ``evaluate.py``, ``cli.py``,
``sweep.py``, ``report/``, ``evaluate_folder.py``) -> engine (``engine/``: trainer, inference,
evaluation, checkpoints, the builders both entry points share) and post-hoc calibration
(``calibration/``, which the engine may call, never the reverse) -> ``data/``, ``models/``,
``losses/``, ``metrics/`` -> config schemas and small utilities (``config.py``, ``errors.py``,
``targets.py``, ``runtime.py``). Two entry points that need the same construction share a
builder below them (``inference/build.py``, ``evaluation/checkpoint.py``) instead of importing
each other.
"""
