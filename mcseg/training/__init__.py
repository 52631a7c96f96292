"""Training: the loop and its step window (``trainer``, ``window``), distributed training
(``distributed``), checkpoints written and resumed (``checkpoint``), the pre-flight checks of a
relaunch (``relaunch``), the loaders it builds (``loader``), the TensorBoard logger (``tb_logger``) and the
trackers behind one interface (``loggers``: TensorBoard, CSV, MLflow, wandb), which ``evaluate.py`` and sweeps
also call.

May import: evaluation, inference, the layer below them (calibration, data, metrics, models, losses,
``rundir``) and config/runtime; never an entry point (``train.py``, ``evaluate.py``, ``sweep.py``,
``cli.py``, ``report/``). Validation during training uses the evaluation path, not a second one.
"""
