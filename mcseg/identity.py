"""What a run is: its Hydra job (overrides, group choices, sweep), its configuration key and its directory name.

The report groups runs by :func:`describe_run`'s configuration key, ``train()`` records :func:`run_identity` in
``result.json`` and the trackers, and sweep job directories are named by :func:`job_name` (resolver ``mcseg_job``).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig


def hydra_job() -> tuple[bool, list[str], int | None]:
    """(inside a multirun?, this job's overrides, job number) from Hydra's runtime config."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False, [], None
    hc = HydraConfig.get()
    num = hc.job.get("num") if hc.mode == RunMode.MULTIRUN else None
    return hc.mode == RunMode.MULTIRUN, list(hc.overrides.task), num


# Overrides that do not change what a run computes: runs differing only in these are the same configuration.
NOT_CONFIGURATION = ("seed", "trainer.device", "trainer.resume", "trainer.auto_resume", "trainer.progress_bar",
                     "task_name", "paths.", "hydra.", "hydra/", "logger", "tags")


# Left out of job directory names. The resume overrides say how to launch a job, not what it is: the
# same sweep run again with trainer.auto_resume=true must find each job's directory. So do the trackers
# (logger=[tensorboard,mlflow], logger.images=0): where a job is logged, not what it computes.
JOB_NAME_EXCLUDE = ("experiment", "hparams_search", "debug", "trainer.device", "trainer.resume=",
                    "trainer.auto_resume=", "hydra.", "hydra/", "paths.", "logger")
JOB_NAME_MAX = 120


def job_name(overrides) -> str:
    """A short, readable name for a sweep job's directory from its overrides (resolver ``mcseg_job``).

    The loss and its hyperparameters first (``loss.margin=5`` shown as ``margin=5``), then the
    seed, then other overrides; longer than JOB_NAME_MAX characters, it is cut and ends with a hash of the whole, so
    names stay unique and within file-system limits (255 bytes).
    """
    import hashlib

    items = [str(o).lstrip("+~") for o in overrides if not str(o).lstrip("+~").startswith(JOB_NAME_EXCLUDE)]

    def rank(item: str) -> tuple[int, str]:
        key = item.split("=", 1)[0]
        return (0 if key == "loss" else 1 if key.startswith("loss.") else 2 if key == "seed" else 3, key)

    parts = [item.removeprefix("loss.") if item.startswith("loss.") else item for item in sorted(items, key=rank)]
    name = ",".join(parts).replace("/", "-") or "defaults"
    if len(name) > JOB_NAME_MAX:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[:JOB_NAME_MAX - 9]}~{digest}"
    return name


def describe_run(overrides: list[str], choices: dict, loss: dict, dataset: str, seed: int) -> dict:
    """What a run is, for reports: its configuration key (its overrides minus seed and the like), loss, seed."""
    configuration = sorted(o.lstrip("+~") for o in overrides
                           if not o.lstrip("+~").split("=")[0].startswith(NOT_CONFIGURATION))
    return {
        "configuration": " ".join(configuration) or "(defaults)",
        "overrides": list(overrides),
        "loss_name": choices.get("loss") or str(loss.get("_target_", "?")).rsplit(".", 1)[-1],
        "loss": loss,
        "dataset": dataset,
        "seed": int(seed),
    }


def sweep_dir_of_job() -> Path | None:
    """The folder of the sweep this job belongs to (its ``trackers.json`` names the trackers' parent run); None
    outside a multirun."""
    from hydra.core.hydra_config import HydraConfig

    multirun, _, _ = hydra_job()
    return Path(str(HydraConfig.get().sweep.dir)) if multirun else None


def run_identity(cfg: DictConfig) -> dict:
    """:func:`describe_run` of the running job (Hydra's overrides and group choices, the resolved loss)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    _, overrides, _ = hydra_job()
    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    return describe_run(overrides, choices, OmegaConf.to_container(cfg.loss, resolve=True),
                        str(cfg.dataset.get("name")), cfg.seed)
