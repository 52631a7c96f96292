"""Training: the loop and its step window (``trainer``, ``window``), distributed training
(``distributed``), checkpoints written and resumed (``checkpoint``), the pre-flight checks of a
relaunch (``relaunch``) and the loaders it builds (``loader``). It logs through the trackers
(:mod:`mcseg.trackers`, a package of its own beside it, which ``evaluate.py`` and sweeps also call).

May import: the trackers, evaluation, inference, the layer below them (calibration, data, metrics, models, losses,
``rundir``) and config/runtime; never an entry point (``train.py``, ``evaluate.py``, ``sweep.py``,
``cli.py``, ``report/``). Validation during training uses the evaluation path, not a second one.
"""
