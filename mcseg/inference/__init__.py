"""Inference: whole-volume and sliding-window prediction (``volume``), the members of one prediction
(``members``: TTA views, MC-dropout samples), the predictors that pool them and ensembles of
networks (``predict``), and a predictor built from a config or a checkpoint (``build``, which also
reads checkpoints).

May import: calibration, data, metrics, models, losses and config/runtime; never evaluation, training
or an entry point. It returns probabilities; scoring them is evaluation's job.
"""
