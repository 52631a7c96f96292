"""Which ``_target_`` a config may name: an allow-list, so a shared config cannot run code.

Hydra instantiates whatever a ``_target_`` names (``os.system`` included). mcseg only
instantiates callables under ``mcseg.``, ``torch.`` and ``monai.``, minus the parts of torch
that load or execute code, plus prefixes the *user* adds through the environment variable
``MCSEG_EXTRA_TARGETS`` (comma-separated, e.g. ``mylab.models.,segmentation_models_pytorch.``).
An environment variable, not a config key, so that a config file cannot widen the list.
"""
from __future__ import annotations

import os
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from mcseg.errors import ConfigError

ALLOWED_PREFIXES = ("mcseg.", "torch.", "monai.")
DENIED_PREFIXES = ("torch.hub.", "torch.load", "torch.package.", "torch.jit.load", "torch.utils.cpp_extension.",
                   "torch.utils.data.datapipes.", "monai.bundle.", "monai.apps.")


def allowed_prefixes() -> tuple[str, ...]:
    extra = [p.strip() for p in os.environ.get("MCSEG_EXTRA_TARGETS", "").split(",") if p.strip()]
    return ALLOWED_PREFIXES + tuple(extra)


def check_targets(node: Any, key: str = "") -> None:
    """Raise :class:`ConfigError` for any ``_target_`` (at any depth) outside the allow-list."""
    if isinstance(node, (DictConfig, dict)):
        items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else node.items()
        for k, value in items:
            path = f"{key}.{k}" if key else str(k)
            if k == "_target_":
                target = str(value)
                if not target.startswith(allowed_prefixes()) or target.startswith(DENIED_PREFIXES):
                    raise ConfigError(
                        f"config key '{path}': {target!r} is not an allowed target (allowed prefixes: "
                        f"{', '.join(allowed_prefixes())}; add your own with MCSEG_EXTRA_TARGETS)"
                    )
            else:
                check_targets(value, path)
    elif isinstance(node, (ListConfig, list, tuple)):
        for i, value in enumerate(node):
            check_targets(value, f"{key}[{i}]")


def instantiate_checked(node: Any, key: str, **kwargs) -> Any:
    """``hydra.utils.instantiate`` after :func:`check_targets` on the node."""
    if isinstance(node, dict):
        node = OmegaConf.create(node)
    check_targets(node, key)
    return instantiate(node, **kwargs)
