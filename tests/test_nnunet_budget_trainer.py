"""scripts/nnunet_budget_trainer.py, the nnU-Net trainers of scripts/peer_nnunet.sh and nnunet_calibration.sh,
on a stand-in for nnU-Net's trainer (the set-up installs only nnU-Net's export code, not its training code).

The stand-in does what nnU-Net 2.8's ``nnUNetTrainer`` does around the hooks the script overrides: it logs each
epoch's values through ``self.logger`` and advances ``current_epoch`` in ``on_epoch_end``. Its logger offers only
what nnU-Net 2.8's ``MetaLogger`` offers (``log``, ``get_value``; no ``my_fantastic_logging`` dict, which the
local logger it wraps holds), so a trainer reading the values any other way fails here as it failed in nnU-Net.
Time is a fake clock: one second per training step."""
from __future__ import annotations

import csv
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAINER_MODULE = "nnunetv2.training.nnUNetTrainer.nnUNetTrainer"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class StandInMetaLogger:
    """nnU-Net 2.8's MetaLogger as the trainer sees it: ``log(key, value, step)`` and ``get_value(key, step)``."""

    KEYS = ("mean_fg_dice", "ema_fg_dice", "dice_per_class_or_region", "train_losses", "val_losses", "lrs",
            "epoch_start_timestamps", "epoch_end_timestamps")  # nnU-Net's LocalLogger's

    def __init__(self) -> None:
        self._values: dict[str, list] = {key: [] for key in self.KEYS}

    def log(self, key: str, value, step: int) -> None:
        values = self._values[key]
        assert len(values) == step, f"{key}: logged at step {step} after {len(values)} values"
        values.append(value)

    def get_value(self, key: str, step):
        values = self._values[key]
        return values if step is None else values[step]


def stand_in_trainer(clock: Clock) -> type:
    class nnUNetTrainer:  # noqa: N801 (nnU-Net's name)
        def __init__(self, plans, configuration, fold, dataset_json, device=None):
            self.output_folder = plans["output_folder"]
            self.logger = StandInMetaLogger()
            self.current_epoch = 0
            self.num_epochs, self.num_iterations_per_epoch, self.num_val_iterations_per_epoch = 1000, 250, 50
            self.save_every = 50
            self.lr_scheduler = types.SimpleNamespace(max_steps=1000)
            self.dataloader_train = self.dataloader_val = iter(lambda: "batch", None)
            self.log_lines: list[str] = []
            self.train_ended = False

        def print_to_log_file(self, *args):
            self.log_lines.append(" ".join(str(a) for a in args))

        def on_train_start(self):
            pass

        def on_epoch_start(self):
            self.logger.log("epoch_start_timestamps", clock(), self.current_epoch)

        def on_train_epoch_start(self):
            self.logger.log("lrs", 0.01 * (1 - self.current_epoch / self.num_epochs) ** 0.9, self.current_epoch)

        def train_step(self, batch):
            clock.now += 1.0
            return {"loss": 1.0 - 0.1 * self.current_epoch}

        def on_train_epoch_end(self, outputs):
            self.logger.log("train_losses", sum(o["loss"] for o in outputs) / len(outputs), self.current_epoch)

        def on_validation_epoch_start(self):
            pass

        def validation_step(self, batch):
            return {"loss": 0.9 - 0.1 * self.current_epoch}

        def on_validation_epoch_end(self, outputs):
            e = self.current_epoch
            dice = [0.5 + 0.1 * e, 0.4 + 0.1 * e]
            self.logger.log("mean_fg_dice", sum(dice) / 2, e)
            self.logger.log("dice_per_class_or_region", dice, e)
            self.logger.log("val_losses", outputs[0]["loss"], e)
            previous = self.logger.get_value("ema_fg_dice", None)
            self.logger.log("ema_fg_dice", previous[-1] * 0.9 + 0.1 * sum(dice) / 2 if previous else sum(dice) / 2, e)

        def on_epoch_end(self):
            self.logger.log("epoch_end_timestamps", clock(), self.current_epoch)
            self.current_epoch += 1

        def on_train_end(self):
            self.train_ended = True

    return nnUNetTrainer


@pytest.fixture
def script(monkeypatch):
    """The script imported against the stand-in, its clock, and its os._exit recorded instead of exiting."""
    clock = Clock()
    module = types.ModuleType(TRAINER_MODULE)
    module.nnUNetTrainer = stand_in_trainer(clock)
    monkeypatch.setitem(sys.modules, TRAINER_MODULE, module)
    path = ROOT / "scripts" / "nnunet_budget_trainer.py"
    spec = importlib.util.spec_from_file_location("nnunet_budget_trainer", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    monkeypatch.setattr(loaded, "time", clock)

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(loaded.os, "_exit", exit_)
    for name in ("MCSEG_NNUNET_EPOCHS", "MCSEG_NNUNET_ITERATIONS", "MCSEG_NNUNET_PIECE_S", "MCSEG_NNUNET_THREADS",
                 "MCSEG_PEER_BUDGET_S", "MCSEG_PEER_ITERATIONS"):
        monkeypatch.delenv(name, raising=False)
    return loaded, clock


def _trainer(cls, out: Path):
    out.mkdir(exist_ok=True)
    return cls({"output_folder": str(out)}, "3d_fullres", 0, {})


def _progress(out: Path) -> list[dict]:
    with open(out / "mcseg_progress.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_epochs_trainer_writes_each_epochs_values_read_through_the_logger(script, tmp_path, monkeypatch):
    module, clock = script
    monkeypatch.setenv("MCSEG_NNUNET_EPOCHS", "3")
    monkeypatch.setenv("MCSEG_NNUNET_ITERATIONS", "2")
    trainer = _trainer(module.nnUNetTrainer_mcsegEpochs, tmp_path)
    assert (trainer.num_epochs, trainer.num_iterations_per_epoch, trainer.num_val_iterations_per_epoch) == (3, 2, 1)
    trainer.run_training()
    assert trainer.train_ended and trainer.current_epoch == 3
    rows = _progress(tmp_path)
    assert [r["epoch"] for r in rows] == ["0", "1", "2"]
    assert [float(r["train_loss"]) for r in rows] == pytest.approx([1.0, 0.9, 0.8])
    assert [float(r["val_loss"]) for r in rows] == pytest.approx([0.9, 0.8, 0.7])
    assert [r["pseudo_dice"] for r in rows] == ["0.5000 0.4000", "0.6000 0.5000", "0.7000 0.6000"]
    # .9 ema + .1 mean (.45 .55 .65)
    assert [float(r["ema_pseudo_dice"]) for r in rows] == pytest.approx([0.45, 0.46, 0.479])
    assert [float(r["lr"]) for r in rows] == pytest.approx([0.01 * (1 - e / 3) ** 0.9 for e in range(3)], rel=1e-5)
    assert [float(r["seconds"]) for r in rows] == [2.0, 2.0, 2.0]  # two steps of one second
    budget = json.loads((tmp_path / "mcseg_budget.json").read_text())
    assert budget["train_s"] == 6.0 and budget["pieces"] == 1 and budget["finished"] is True
    assert (budget["epochs"], budget["epochs_done"], budget["iterations_per_epoch"]) == (3, 3, 2)


def test_epochs_trainer_stops_a_piece_after_its_epoch_and_the_next_piece_continues(script, tmp_path, monkeypatch):
    module, clock = script
    monkeypatch.setenv("MCSEG_NNUNET_EPOCHS", "3")
    monkeypatch.setenv("MCSEG_NNUNET_ITERATIONS", "2")
    monkeypatch.setenv("MCSEG_NNUNET_PIECE_S", "3")  # a piece ends after the epoch that passes 3 s
    first = _trainer(module.nnUNetTrainer_mcsegEpochs, tmp_path)
    with pytest.raises(SystemExit) as stopped:
        first.run_training()
    assert stopped.value.code == module.nnUNetTrainer_mcsegEpochs.PIECE_ENDED == 75
    assert first.current_epoch == 2 and not first.train_ended
    assert any("stopped after epoch 2 of 3" in line for line in first.log_lines)
    budget = json.loads((tmp_path / "mcseg_budget.json").read_text())
    assert (budget["train_s"], budget["pieces"], budget["epochs_done"], budget["finished"]) == (4.0, 1, 2, False)
    # nnUNetv2_train --c: nnU-Net restores the epoch and the logger from checkpoint_latest.pth
    monkeypatch.setenv("MCSEG_NNUNET_PIECE_S", "inf")
    second = _trainer(module.nnUNetTrainer_mcsegEpochs, tmp_path)
    second.current_epoch, second.logger = first.current_epoch, first.logger
    second.run_training()
    assert second.train_ended and [r["epoch"] for r in _progress(tmp_path)] == ["0", "1", "2"]
    budget = json.loads((tmp_path / "mcseg_budget.json").read_text())
    assert (budget["train_s"], budget["pieces"], budget["epochs_done"], budget["finished"]) == (6.0, 2, 3, True)


def test_budget_trainer_fits_the_epochs_and_the_schedule_to_the_budget(script, tmp_path, monkeypatch):
    module, clock = script
    monkeypatch.setenv("MCSEG_PEER_BUDGET_S", "11")
    monkeypatch.setenv("MCSEG_PEER_ITERATIONS", "2")
    trainer = _trainer(module.nnUNetTrainer_mcsegBudget, tmp_path)
    trainer.run_training()
    # the first epoch took 2 s: 11 s hold 5 epochs, and the poly schedule ends with the fifth
    assert trainer.num_epochs == 5 and trainer.current_epoch == 5 and trainer.lr_scheduler.max_steps == 5
    assert trainer.train_ended
    assert json.loads((tmp_path / "mcseg_budget.json").read_text()) == {
        "budget_s": 11.0, "train_s": 10.0, "epochs": 5, "iterations_per_epoch": 2}
    assert any("11 s -> 5 epochs of 2 iterations" in line for line in trainer.log_lines)
