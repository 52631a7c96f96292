"""From the ``dataset`` config node to a dataset, its split, and the checks a run's inputs pass at start.

Below training and evaluation, so that ``mcseg-data`` and the entry points build datasets the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from mcseg.config import SamplingConfig, SplitConfig, typed
from mcseg.data.base import SegmentationDataset
from mcseg.data.cases import CaseRef
from mcseg.data.raters import check_target_has_raters
from mcseg.data.split import load_split, make_dataset_split, save_split
from mcseg.data.validate import validate_cases
from mcseg.errors import ConfigError
from mcseg.targets import instantiate_checked


def build_dataset(node: DictConfig) -> SegmentationDataset:
    """Instantiate the dataset of a ``dataset`` node (its ``split``/``sampling`` keys are not its arguments)."""
    try:  # a mandatory value can surface while resolving (``???``) or once passed on (oc.env's default)
        args = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
        args.pop("split", None)
        args.pop("sampling", None)
        return instantiate_checked(args, "dataset", _convert_="all")
    except MissingMandatoryValue as exc:
        raise ConfigError(f"dataset.{exc.full_key} is not set: give dataset.{exc.full_key}=...") from None


def record_dataset_facts(cfg: DictConfig, dataset: SegmentationDataset) -> None:
    """Write what the dataset found (classes, channels) back into the config the model reads."""
    with open_dict(cfg):
        cfg.dataset.num_classes = dataset.num_classes
        cfg.dataset.in_channels = dataset.in_channels
        cfg.dataset.class_names = list(dataset.class_names)


@dataclass
class Splits:
    refs: dict[str, list[CaseRef]]

    def __getitem__(self, name: str) -> list[CaseRef]:
        if name == "all":
            return [r for part in ("train", "val", "test") for r in self.refs[part]]
        if name not in self.refs:
            raise ValueError(f"split={name!r}: expected train, val, test or all")
        return self.refs[name]


def resolve_split(dataset: SegmentationDataset, node: DictConfig, run_dir: Path) -> Splits:
    """:func:`choose_split`, saved as ``<run>/split.json``."""
    splits = choose_split(dataset, node, run_dir)
    save_splits(splits, run_dir)
    return splits


def save_splits(splits: Splits, run_dir: Path) -> None:
    """``<run>/split.json``: the case ids of each split (written once the launch is accepted)."""
    save_split({name: [r.case_id for r in refs] for name, refs in splits.refs.items()}, Path(run_dir) / "split.json")


def choose_split(dataset: SegmentationDataset, node: DictConfig, run_dir: Path) -> Splits:
    """Reuse ``<run>/split.json`` (resume), else ``dataset.split.file``, else make one by seed; nothing is written
    (a launch refused by its checks must not leave a split that its corrected rerun would take as its own)."""
    cfg = typed(node.get("split"), SplitConfig, "dataset.split")
    refs = dataset.case_refs()
    if not refs:
        raise FileNotFoundError(f"dataset {dataset.name}: no cases found")
    by_id = {r.case_id: r for r in refs}
    ids = list(by_id)
    run_split = run_dir / "split.json"
    if run_split.is_file():
        split = load_split(run_split, ids)
    elif cfg.file:
        split = load_split(cfg.file, ids)
    else:
        split = make_dataset_split(dataset, ids, cfg.val_fraction, cfg.test_fraction, cfg.seed)
    return Splits({name: [by_id[c] for c in split[name]] for name in split})


def check_run_inputs(cfg: DictConfig, dataset: SegmentationDataset, splits: Splits) -> None:
    """What a training run checks once its split is known, before loading or training anything:
    the headers of every case of every split (:func:`~mcseg.data.validate.validate_cases`), that post-hoc
    calibration and the test evaluation's conformal pass have validation cases to be fitted on, and that a rater
    target has raters to use."""
    check_target_has_raters(dataset.raters["target"], splits["all"], dataset.name)
    fit = list((cfg.get("posthoc") or {}).get("fit") or [])
    if not splits["val"]:
        split = cfg.dataset.get("split") or {}
        source = f"dataset.split.file={split.get('file')}" if split.get("file") else \
            f"dataset.split.val_fraction={split.get('val_fraction')}"
        if fit:
            raise ConfigError(f"config key 'posthoc.fit'={fit}: post-hoc scalers are fitted on the validation split, "
                              f"which is empty ({source}); set posthoc.fit=[] posthoc.apply=[] or give validation "
                              f"cases")
        if (cfg.get("conformal") or {}).get("enabled"):
            raise ConfigError(f"config key 'conformal.enabled'=true: the test evaluation's conformal thresholds and "
                              f"margins are fitted on the validation split, which is empty ({source}); give "
                              f"validation cases or set conformal.enabled=false")
    trainer = cfg.get("trainer") or {}
    capped = trainer.get("val_max_cases") and not trainer.get("full_val_every")  # then only those are fitted on
    n_val = min(len(splits["val"]), trainer.get("val_max_cases")) if capped else len(splits["val"])
    if "lts" in fit and n_val < 2:
        raise ConfigError(f"config key 'posthoc.fit'={fit}: lts needs at least 2 validation cases (one is held out "
                          f"for early stopping), this run fits on {n_val}; give more validation cases "
                          f"(dataset.split.val_fraction, trainer.val_max_cases) or remove lts")
    validate_cases(dataset, splits["all"], "training")


def sampling_config(node: DictConfig) -> SamplingConfig:
    """The typed ``sampling`` node of a ``dataset`` node."""
    return typed(node.get("sampling"), SamplingConfig, "dataset.sampling")
