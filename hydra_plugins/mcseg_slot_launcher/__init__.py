"""``hydra/launcher=slots``: Hydra's joblib launcher with a pool of device slots (one job per GPU, or CPU slots).

Hydra loads launchers only from the ``hydra_plugins`` namespace, hence this package beside mcseg's sweepers.
The slots themselves (what a job sees, how a worker takes one) are :mod:`mcseg.slots`.
"""
