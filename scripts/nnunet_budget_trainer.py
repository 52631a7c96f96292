"""nnU-Net v2's own trainer, stopped by a wall-clock budget: the nnU-Net side of scripts/peer_nnunet.sh.

nnU-Net only finds trainer classes inside its package, so peer_nnunet.sh copies this file into the
nnunetv2 of its own virtual environment (never mcseg's). Everything is nnU-Net's default
(``nnUNetTrainer``: its plan, network, augmentation, SGD with Nesterov momentum 0.99, Dice + CE with
deep supervision, poly learning rate) except the length of training: epochs of
``MCSEG_PEER_ITERATIONS`` steps (default 10; nnU-Net's are 250: on 2 CPU cores a step takes about 7 s,
and an epoch is the budget's unit, so a long one wastes up to its length), and as many of them as fit in
``MCSEG_PEER_BUDGET_S`` seconds, counted from the start of the first epoch. The poly schedule is
stretched over that number of epochs, estimated from the first epoch's duration, so the learning
rate reaches zero at the budget instead of being cut at a high value. The time it trained is written to
``mcseg_budget.json`` in the fold's folder.
"""
import json
import os
from time import time

import torch

from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


class nnUNetTrainer_mcsegBudget(nnUNetTrainer):
    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.budget_s = float(os.environ["MCSEG_PEER_BUDGET_S"])
        self.num_iterations_per_epoch = int(os.environ.get("MCSEG_PEER_ITERATIONS", "10"))
        self.num_val_iterations_per_epoch = max(1, self.num_iterations_per_epoch // 5)
        self.num_epochs = 10_000  # until the first epoch has been timed

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
            if self.current_epoch == 1:  # the budget in epochs, from the first one's duration
                self.num_epochs = max(1, int(self.budget_s // (time() - started)))
                self.lr_scheduler.max_steps = self.num_epochs
                self.print_to_log_file(f"mcseg budget: {self.budget_s:.0f} s -> {self.num_epochs} epochs "
                                       f"of {self.num_iterations_per_epoch} iterations")
        self.on_train_end()
        # what peer_nnunet.sh charges to the budget: training, not nnU-Net's start-up or final validation
        with open(os.path.join(self.output_folder, "mcseg_budget.json"), "w") as f:
            json.dump({"budget_s": self.budget_s, "train_s": time() - started, "epochs": self.num_epochs,
                       "iterations_per_epoch": self.num_iterations_per_epoch}, f)
