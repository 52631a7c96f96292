"""nnU-Net v2's own trainer with a shorter, bounded training: the nnU-Net side of scripts/peer_nnunet.sh
and scripts/nnunet_calibration.sh.

nnU-Net only finds trainer classes inside its package, so those scripts copy this file into the
nnunetv2 of their own virtual environment (never mcseg's). Everything is nnU-Net's default
(``nnUNetTrainer``: its plan, network, augmentation, SGD with Nesterov momentum 0.99, Dice + CE with
deep supervision, poly learning rate over ``num_epochs``) except the length of training:

- ``nnUNetTrainer_mcsegBudget`` (peer_nnunet.sh): epochs of ``MCSEG_PEER_ITERATIONS`` steps (default 10;
  nnU-Net's are 250: on 2 CPU cores a step takes about 7 s, and an epoch is the budget's unit, so a long
  one wastes up to its length), as many as fit in ``MCSEG_PEER_BUDGET_S`` seconds, counted from the
  start of the first epoch. The poly schedule is stretched over that number of epochs, estimated from
  the first epoch's duration, so the learning rate reaches zero at the budget instead of being cut at a
  high value. Not resumable (the number of epochs depends on the first one's duration).
- ``nnUNetTrainer_mcsegEpochs`` (nnunet_calibration.sh): a fixed ``MCSEG_NNUNET_EPOCHS`` epochs of
  ``MCSEG_NNUNET_ITERATIONS`` steps, so that the schedule is known in advance and training can be cut
  into pieces: ``checkpoint_latest.pth`` is written after every epoch (nnU-Net: every 50th), and a
  process that has trained ``MCSEG_NNUNET_PIECE_S`` seconds stops after its current epoch with exit
  status 75, before nnU-Net's final validation; ``nnUNetv2_train ... --c`` continues from there, as
  nnU-Net resumes any run. ``MCSEG_NNUNET_THREADS`` sets torch's threads (nnU-Net sets every core on
  the CPU). Each epoch appends a row to ``mcseg_progress.csv`` (losses, pseudo Dice, learning rate,
  seconds) and the seconds trained, summed over pieces, are in ``mcseg_budget.json``.
"""
import csv
import json
import os
import sys
from time import time

import torch

from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


class _EpochLoop(nnUNetTrainer):
    """nnU-Net's ``run_training`` with a hook after each epoch (``after_epoch``, True stops the loop)."""

    def after_epoch(self, started: float) -> bool:
        return False

    def run_training(self):
        self.on_train_start()
        started = time()
        while self.current_epoch < self.num_epochs:
            self.on_epoch_start()
            self.on_train_epoch_start()
            self.on_train_epoch_end([self.train_step(next(self.dataloader_train))
                                     for _ in range(self.num_iterations_per_epoch)])
            with torch.no_grad():
                self.on_validation_epoch_start()
                self.on_validation_epoch_end([self.validation_step(next(self.dataloader_val))
                                              for _ in range(self.num_val_iterations_per_epoch)])
            self.on_epoch_end()  # advances current_epoch
            if self.after_epoch(started):
                return
        self.on_train_end()
        self.training_finished(time() - started)

    def training_finished(self, seconds: float) -> None:
        pass


class nnUNetTrainer_mcsegBudget(_EpochLoop):
    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.budget_s = float(os.environ["MCSEG_PEER_BUDGET_S"])
        self.num_iterations_per_epoch = int(os.environ.get("MCSEG_PEER_ITERATIONS", "10"))
        self.num_val_iterations_per_epoch = max(1, self.num_iterations_per_epoch // 5)
        self.num_epochs = 10_000  # until the first epoch has been timed

    def after_epoch(self, started: float) -> bool:
        if self.current_epoch == 1:  # the budget in epochs, from the first one's duration
            self.num_epochs = max(1, int(self.budget_s // (time() - started)))
            self.lr_scheduler.max_steps = self.num_epochs
            self.print_to_log_file(f"mcseg budget: {self.budget_s:.0f} s -> {self.num_epochs} epochs "
                                   f"of {self.num_iterations_per_epoch} iterations")
        return False

    def training_finished(self, seconds: float) -> None:
        # what peer_nnunet.sh charges to the budget: training, not nnU-Net's start-up or final validation
        with open(os.path.join(self.output_folder, "mcseg_budget.json"), "w") as f:
            json.dump({"budget_s": self.budget_s, "train_s": seconds, "epochs": self.num_epochs,
                       "iterations_per_epoch": self.num_iterations_per_epoch}, f)


class nnUNetTrainer_mcsegEpochs(_EpochLoop):
    PIECE_ENDED = 75  # EX_TEMPFAIL: run again with --c

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = int(os.environ["MCSEG_NNUNET_EPOCHS"])
        self.num_iterations_per_epoch = int(os.environ.get("MCSEG_NNUNET_ITERATIONS", "50"))
        self.num_val_iterations_per_epoch = max(1, self.num_iterations_per_epoch // 5)
        self.piece_s = float(os.environ.get("MCSEG_NNUNET_PIECE_S", "inf"))
        self.save_every = 1

    def on_train_start(self):
        super().on_train_start()
        if os.environ.get("MCSEG_NNUNET_THREADS"):
            torch.set_num_threads(int(os.environ["MCSEG_NNUNET_THREADS"]))

    def _budget_file(self) -> str:
        return os.path.join(self.output_folder, "mcseg_budget.json")

    def _add_seconds(self, seconds: float, finished: bool) -> None:
        path = self._budget_file()
        record = json.load(open(path)) if os.path.isfile(path) else {"train_s": 0.0, "pieces": 0}
        record.update(train_s=record["train_s"] + seconds, pieces=record["pieces"] + 1, epochs=self.num_epochs,
                      epochs_done=self.current_epoch, iterations_per_epoch=self.num_iterations_per_epoch,
                      finished=finished, threads=torch.get_num_threads())
        with open(path + ".tmp", "w") as f:
            json.dump(record, f, indent=1)
        os.replace(path + ".tmp", path)

    def on_epoch_end(self):
        epoch = self.current_epoch
        super().on_epoch_end()
        last = lambda key: self.logger.get_value(key, -1)  # noqa: E731 (nnU-Net's logger, this epoch's entry)
        path = os.path.join(self.output_folder, "mcseg_progress.csv")
        new = not os.path.isfile(path)
        with open(path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["epoch", "train_loss", "val_loss", "pseudo_dice", "ema_pseudo_dice", "lr", "seconds"])
            writer.writerow([epoch, round(float(last("train_losses")), 5), round(float(last("val_losses")), 5),
                             " ".join(f"{d:.4f}" for d in last("dice_per_class_or_region")),
                             round(float(last("ema_fg_dice")), 5), f"{last('lrs'):.6g}",
                             round(last("epoch_end_timestamps") - last("epoch_start_timestamps"), 1)])

    def after_epoch(self, started: float) -> bool:
        if self.current_epoch >= self.num_epochs or time() - started < self.piece_s:
            return False
        self._add_seconds(time() - started, finished=False)
        self.print_to_log_file(f"mcseg piece: stopped after epoch {self.current_epoch} of {self.num_epochs} "
                               f"(checkpoint_latest.pth); continue with nnUNetv2_train ... --c")
        for loader in (self.dataloader_train, self.dataloader_val):
            if hasattr(loader, "_finish"):
                loader._finish()
        sys.stdout.flush()
        os._exit(self.PIECE_ENDED)  # nnUNetv2_train would otherwise go on to its final validation

    def training_finished(self, seconds: float) -> None:
        self._add_seconds(seconds, finished=True)
