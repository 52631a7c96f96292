"""``hydra/sweeper=study``: Hydra's basic grid sweeper over a union of grids ("arms").

A loss study compares losses whose hyperparameters differ (CE has no margin), so it is a union
of grids, not one grid: ``arms: ["loss=ce", "loss=margin loss.margin=0,3,5"]`` with
``params: {seed: 0,1,2}`` runs 3 + 9 jobs. Hydra's basic sweeper expands one cartesian product
only, hence this subclass. Hydra loads sweepers only from the ``hydra_plugins`` namespace.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser


class StudySweeper(BasicSweeper):
    """The basic sweeper over a union of grids: each arm's grid crossed with ``params`` and the command line.

    Precedence for a key set in several places: ``params`` < arm < command line.
    """

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 arms: list[str] | dict[str, str | None] | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        if isinstance(arms, Mapping):  # named arms: a preset can replace or drop (null) one arm of its parent
            arms = [arm for arm in arms.values() if arm]
        if not arms:
            raise ValueError("hydra.sweeper.arms: a study sweep needs at least one arm (e.g. 'loss=ce')")
        self.arms = [arm.split() if isinstance(arm, str) else [str(a) for a in arm] for arm in arms]
        self._arguments: list[str] = []

    def sweep(self, arguments: list[str]) -> Any:
        self._arguments = list(arguments)
        return super().sweep(arguments)

    def split_arguments(self, overrides, max_batch_size):  # type: ignore[override]
        # The base class passes params + command line already parsed; re-parse with each arm between them.
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs: list[list[str]] = []
        for arm in self.arms:
            parsed = parser.parse_overrides(self._parse_config() + arm + self._arguments)
            jobs.extend(BasicSweeper.split_arguments(parsed, None)[0])
        return list(BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size))
