"""Data: reading and writing volumes with their geometry, dataset definitions, preprocessing and its
cache, splits, sampling, the corruptions of evaluation under shift, and the reference datasets other tools'
predictions are evaluated against (``reference``: labels, classes, nnU-Net's folds).

May import: config and runtime (``config``, ``errors``, ``targets``, ``runtime``, ``environment``,
``text``); never calibration, inference, evaluation, training or an entry point.
"""
