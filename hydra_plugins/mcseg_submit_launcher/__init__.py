"""``hydra.launcher.wait=false`` for the submitit launchers (``hydra/launcher=slurm``, ``submitit_debug``):
submit a whole sweep and return. Hydra loads launchers only from the ``hydra_plugins`` namespace; the record of
submitted jobs and ``mcseg-sweep status`` are :mod:`mcseg.submitted`."""
