"""From the ``dataset`` config node to a split, loaded cases and a training loader."""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue
from torch.utils.data import DataLoader

from mcseg.config import SamplingConfig, SplitConfig, typed
from mcseg.errors import ConfigError
from mcseg.data.base import SegmentationDataset
from mcseg.data.cases import CaseData, CaseRef
from mcseg.data.sampling import EpochSampler, PatchDataset
from mcseg.data.split import load_split, make_dataset_split, save_split
from mcseg.targets import instantiate_checked

log = logging.getLogger(__name__)


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


def default_workers() -> int:
    return max(0, min(8, (os.cpu_count() or 1) - 1))


def load_cases(dataset: SegmentationDataset, refs: list[CaseRef], workers: int | None = None) -> list[CaseData]:
    """Load cases in threads (file decompression releases the GIL)."""
    workers = workers or max(1, os.cpu_count() or 1)
    if workers <= 1 or len(refs) <= 1:
        return [dataset.load(r) for r in refs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(dataset.load, refs))


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
    """Reuse ``<run>/split.json`` (resume), else ``dataset.split.file``, else make one by seed; save it."""
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
    save_split(split, run_split)
    return Splits({name: [by_id[c] for c in split[name]] for name in split})


def build_train_loader(
    cases: list[CaseData], node: DictConfig, seed: int, pin_memory: bool
) -> tuple[DataLoader, EpochSampler]:
    s = typed(node.get("sampling"), SamplingConfig, "dataset.sampling")
    dataset = PatchDataset(
        cases, s.dims, s.patch_size, s.samples_per_epoch, s.foreground_ratio, s.flip_axes, s.intensity,
        s.slice_axis, seed, augment=node.get("augment"),
    )
    sampler = EpochSampler(s.samples_per_epoch)
    workers = default_workers() if s.num_workers is None else s.num_workers
    loader = DataLoader(
        dataset, batch_size=s.batch_size, sampler=sampler, num_workers=workers, pin_memory=pin_memory,
        persistent_workers=workers > 0, drop_last=s.samples_per_epoch >= s.batch_size,
        prefetch_factor=4 if workers > 0 else None,
        # Its own generator: worker seeding must not consume the global RNG (exact resumes).
        generator=torch.Generator().manual_seed(seed),
    )
    return loader, sampler


def sampling_config(node: DictConfig) -> SamplingConfig:
    return typed(node.get("sampling"), SamplingConfig, "dataset.sampling")


def to_device(batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (batch["image"].to(device, non_blocking=True), batch["label"].to(device, non_blocking=True))
