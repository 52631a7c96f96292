"""Runs ``train.py`` with a SIGKILL planted at a chosen point (used by test_reliability.py).

MCSEG_KILL_AT_STEP=N   kill the process just before the N-th optimiser step (1-based)
MCSEG_KILL_IN_SAVE=N   kill it in the middle of writing the N-th checkpoint (half a file on disk)
MCSEG_TERM_AT_STEP=N   send SIGTERM to itself before the N-th step (pre-emption)
MCSEG_GROUP_SIGNAL_AT_STEP=N  send MCSEG_GROUP_SIGNAL (TERM or INT) to its whole process group, loader
                       workers included, before the N-th step (what SLURM and torchrun's agent do);
                       start the wrapper in a session of its own; under torchrun only rank
                       MCSEG_SIGNAL_RANK (default 0) sends it
MCSEG_TERM_IN_VALIDATION=N  send SIGTERM to itself while validating the N-th validation case of the run
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from mcseg.training import checkpoint, trainer  # noqa: E402

kill_step = int(os.environ.get("MCSEG_KILL_AT_STEP", 0))
term_step = int(os.environ.get("MCSEG_TERM_AT_STEP", 0))
group_step = int(os.environ.get("MCSEG_GROUP_SIGNAL_AT_STEP", 0))
group_signal = getattr(signal, "SIG" + os.environ.get("MCSEG_GROUP_SIGNAL", "TERM"))
kill_save = int(os.environ.get("MCSEG_KILL_IN_SAVE", 0))
term_case = int(os.environ.get("MCSEG_TERM_IN_VALIDATION", 0))
counts = {"step": 0, "save": 0, "case": 0}

original_step = trainer.Trainer._train_step


def planted_step(self, batch, epoch, step):
    counts["step"] += 1
    if counts["step"] == kill_step:
        os.kill(os.getpid(), signal.SIGKILL)
    if counts["step"] == term_step:
        os.kill(os.getpid(), signal.SIGTERM)
    if counts["step"] == group_step and os.environ.get("RANK", "0") == os.environ.get("MCSEG_SIGNAL_RANK", "0"):
        os.killpg(os.getpgid(0), group_signal)
    return original_step(self, batch, epoch, step)


original_save = torch.save


def planted_save(obj, f, *args, **kwargs):
    counts["save"] += 1
    if counts["save"] == kill_save:
        original_save(obj, f, *args, **kwargs)  # f: the open temporary file (mcseg.files.torch_save)
        f.flush()
        f.truncate(f.tell() // 2)  # leave a truncated file, as a kill mid-write would
        os.kill(os.getpid(), signal.SIGKILL)
    return original_save(obj, f, *args, **kwargs)


original_validate = trainer.Trainer.validate


def planted_validate(self, epoch, full=False):
    def until_stopped(cases):
        for case in original_until(self, cases):
            counts["case"] += 1
            if counts["case"] == term_case:
                os.kill(os.getpid(), signal.SIGTERM)
            yield case

    self._until_stopped = until_stopped
    return original_validate(self, epoch, full)


original_until = trainer.Trainer._until_stopped
trainer.Trainer._train_step = planted_step
trainer.Trainer.validate = planted_validate
checkpoint.torch.save = planted_save

from mcseg.cli import train_main  # noqa: E402

train_main()
