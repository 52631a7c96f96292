"""``hydra/sweeper=optuna``: mcseg's Optuna sweeper (ask-and-tell, pruning, resumable and shared studies).

Hydra loads sweepers only from the ``hydra_plugins`` namespace, hence this package beside
``mcseg_study_sweeper``. The job's side of a trial (reporting and pruning) is :mod:`mcseg.trials`.
"""
