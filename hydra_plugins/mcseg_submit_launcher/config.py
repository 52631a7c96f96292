"""The submitit launchers' typed configs with ``wait`` (Hydra's ``submitit_slurm``/``submitit_local`` plus one key),
stored in Hydra's ConfigStore when Hydra scans its plugins, as Hydra's submitit plugin stores its own."""
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

_HERE = "hydra_plugins.mcseg_submit_launcher.submit_launcher"


@dataclass
class DetachableSlurmConf(SlurmQueueConf):
    _target_: str = f"{_HERE}.DetachableSlurmLauncher"
    wait: bool = True  # false: submit the sweep, write <sweep dir>/jobs.jsonl and return (mcseg-sweep status DIR)


@dataclass
class DetachableLocalConf(LocalQueueConf):
    _target_: str = f"{_HERE}.DetachableLocalLauncher"
    wait: bool = True


ConfigStore.instance().store(group="hydra/launcher", name="mcseg_submitit_slurm", node=DetachableSlurmConf(),
                             provider="mcseg")
ConfigStore.instance().store(group="hydra/launcher", name="mcseg_submitit_local", node=DetachableLocalConf(),
                             provider="mcseg")
