"""Evaluation: the evaluator and its protocol (``evaluator``), its figures against several raters (``raters``), a split evaluated with a trained model
(``split``), the loop that feeds predictions to the evaluator (``cases``), the one evaluation of a predictor
that every path takes (``predictor``: a run's own test evaluation, ``evaluate.py``, ensembles, the post-hoc study),
a saved checkpoint re-evaluated (``checkpoint``), a deep ensemble of checkpoints (``ensemble``), the table of
figures (``figure_table``; ``figure_declaration``: one figure's record, with its direction, whether the report tests
it and its protocol text) and the scorers that compute them (``scorers``, ``challenge_scorers``), a suite under shift
(``shift``), what produced a result (``provenance``), and other tools' prediction folders: one class per format
and the one list of them (``formats``: nnU-Net, MONAI, mcseg; detect, read, write), evaluated through the same
per-case code (``folders``), and calibrated from their probabilities (``folder_posthoc``).

May import: inference, the layer below it (calibration, data, metrics, models, losses, ``rundir``) and
config/runtime; never training or an entry point. Modules import each other one way only:
``checkpoint`` -> ``predictor`` -> ``shift`` -> ``split`` -> ``cases`` -> ``evaluator`` -> ``raters``, and ``ensemble``
above them;
``folder_posthoc`` -> ``folders`` -> ``formats``, ``split`` (its file names), ``cases``, ``evaluator``.
"""
