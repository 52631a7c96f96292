"""Data: reading and writing volumes with their geometry, dataset definitions, preprocessing and its
cache, splits, sampling, and the corruptions of evaluation under shift.

May import: config and runtime (``config``, ``errors``, ``targets``, ``runtime``, ``environment``,
``text``); never calibration, inference, evaluation, training or an entry point.
"""
