"""The steps between two reads of the training state: loss sum and non-finite steps on the device.

A training step must not wait for the GPU. :class:`TrainingWindow` therefore keeps what the
trainer needs to know about each step on the device: the running loss sum and, per step, a
code saying whether its loss or gradient norm was non-finite. Only the ids of the step and
of its training cases stay on the host. :meth:`TrainingWindow.close` reads everything back
at once (one synchronisation; under torchrun one all-gather across ranks): once per logging
interval and before every checkpoint, so a checkpoint never holds the result of a bad step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mcseg.training.distributed import DistContext

FINITE, NONFINITE_LOSS, NONFINITE_GRADIENT = 0, 1, 2
WHAT = {NONFINITE_LOSS: "loss", NONFINITE_GRADIENT: "gradient"}


def nonfinite_code(loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
    """Device scalar: ``FINITE``, ``NONFINITE_LOSS`` or ``NONFINITE_GRADIENT`` (no host read)."""
    loss_bad = ~torch.isfinite(loss)
    grad_bad = ~torch.isfinite(grad_norm)
    return torch.where(loss_bad, NONFINITE_LOSS, torch.where(grad_bad, NONFINITE_GRADIENT, FINITE))


@dataclass
class BadStep:
    """The first non-finite step of a window: its step in the epoch, what and whose cases."""

    step: int
    what: str
    cases: list[str]
    rank: int


@dataclass
class WindowReport:
    steps: int  # steps in the window (the same on every rank)
    loss_sum: float  # the window's summed loss, averaged over ranks
    mean_loss: float | None  # loss_sum / steps
    stop: bool  # a stop (SIGTERM) was requested on some rank
    bad: BadStep | None = field(default=None)


class TrainingWindow:
    """Accumulates steps on the device; :meth:`close` reads them back once."""

    def __init__(self, device: torch.device, dist: DistContext | None = None) -> None:
        self.device, self.dist = device, dist or DistContext()
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.codes: list[torch.Tensor] = []
        self.steps: list[int] = []
        self.cases: list[list[str]] = []

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, loss: torch.Tensor, code: torch.Tensor, case_ids) -> None:
        """Record step ``step`` (of the epoch): its detached loss and :func:`nonfinite_code`."""
        self.loss_sum += loss
        self.codes.append(code)
        self.steps.append(step)
        self.cases.append(sorted(set(case_ids)))

    def close(self, stop_requested: bool = False) -> WindowReport:
        """Read the window back (the one host synchronisation) and start a new one.

        Under torchrun every rank must call this at the same step: the ranks' windows are
        gathered, the loss is averaged over all of them and a bad step on any rank is
        reported on every rank (with that rank's cases), so all ranks stop together.
        """
        n = len(self.steps)
        codes = torch.stack(self.codes).to(torch.float64) if n else torch.zeros(0, dtype=torch.float64,
                                                                              device=self.device)
        flag = torch.full((1,), float(stop_requested), dtype=torch.float64, device=self.device)
        packed = torch.cat([self.loss_sum.reshape(1), flag, codes])
        table = self.dist.all_gather(packed).cpu().tolist()  # world x (2 + n)
        loss_sum = sum(row[0] for row in table) / len(table)
        report = WindowReport(steps=n, loss_sum=loss_sum, mean_loss=loss_sum / n if n else None,
                              stop=any(row[1] > 0 for row in table))
        bad = [(j, rank) for j in range(n) for rank, row in enumerate(table) if row[2 + j] != FINITE]
        if bad:
            j, rank = bad[0]
            cases = self.dist.all_gather_object(self.cases[j])[rank]
            report.bad = BadStep(self.steps[j], WHAT[int(table[rank][2 + j])], cases, rank)
        self.loss_sum.zero_()
        self.codes, self.steps, self.cases = [], [], []
        return report
