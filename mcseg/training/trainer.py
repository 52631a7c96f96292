"""The training loop: epochs of random samples, validation on whole volumes, checkpoints.

Loss objects may take part through optional hooks (a general callback mechanism, used by
losses with state such as CALS): ``on_train_epoch_start(epoch)``, ``on_validation_start()``,
``on_validation_batch(logits, target)`` and ``on_validation_end(epoch)``. Their state is
checkpointed through ``loss.state_dict()``.

Resumability: samples are a pure function of (seed, epoch, index), so a run restored from
``last.pt`` (RNG states, optimiser, scheduler, loss state and the position inside the
epoch) continues exactly where the checkpoint was taken. SIGTERM (what SLURM sends before
pre-emption) or SIGINT (Ctrl-C) writes ``last.pt`` at the next step boundary, or after the
current case of a validation, and stops the run (:class:`~mcseg.errors.TrainingInterrupted`);
a second Ctrl-C stops at once. Under torchrun the ranks agree on the stop one step after any of
them was signalled (:class:`~mcseg.training.distributed.StopVote`). Inside an Optuna sweep each
running validation is reported to the job's trial, whose pruner may end the run after that
epoch's checkpoints (:class:`~mcseg.trials.TrialPruned`, :mod:`mcseg.trials`).

Epochs are numbered from 1 wherever a user sees them (log, ``history``, ``best_epoch``,
messages); TensorBoard's x axis is the global step for every scalar, so that a resumed run
purges what the interrupted one wrote after its checkpoint. Inside, ``epoch`` arguments are
0-based and a checkpoint's ``epoch`` is the number of epochs completed.

Throughput: a step never waits for the device. The loss and a per-step non-finite code stay
on the device (:class:`~mcseg.training.window.TrainingWindow`) and are read back once per
logging interval and before every checkpoint; with ``trainer.nonfinite=skip`` each step is
checked on the host instead (one synchronisation per step, the price of skipping exactly the
bad step). ``trainer.compile`` and ``trainer.channels_last`` apply to the training module
only; checkpoints and inference use the plain model. Under torchrun (``dist``) the training
module is wrapped in DistributedDataParallel, and validation, checkpoints and the trackers are
rank 0's while the other ranks wait at a barrier (:mod:`mcseg.training.distributed`).
"""
from __future__ import annotations

import logging
import math
import signal
import threading
import time
from pathlib import Path

import torch
from tqdm import tqdm

from mcseg.config import resume_mismatch
from mcseg.training.checkpoint import restore_rng_states, rng_states, save_checkpoint
from mcseg.inference.build import load_checkpoint, load_model_weights
from mcseg.training.loader import stop_workers, to_device
from mcseg.training.distributed import StopVote, wrap_model
from mcseg.training.settings import TrainerSettings, TrainingParts
from mcseg.evaluation.evaluator import Evaluator, reliability_figure
from mcseg.evaluation.figure_table import summary_keys
from mcseg.inference.volume import autocast_context
from mcseg.evaluation.cases import evaluate_cases
from mcseg.training.window import FINITE, WHAT, BadStep, TrainingWindow, nonfinite_code
from mcseg.errors import NonFiniteLossError, TrainingInterrupted
from mcseg.trials import TrialPruned, TrialReporter
from mcseg.losses.base import target_checks
from mcseg.losses.deep_supervision import deep_supervision_loss
from mcseg.models import supervision_outputs
from mcseg.environment import environment_record
from mcseg.runtime import keep_threads_of, share_cpu, to_channels_last, use_channels_last

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # the main process owns the stop (loader workers ignore them)


def call_hook(obj, name: str, *args) -> None:
    hook = getattr(obj, name, None)
    if callable(hook):
        hook(*args)


class Trainer:
    """Runs epochs; owns model, loss, optimiser, scheduler and the run's checkpoints."""

    def __init__(self, settings: TrainerSettings, parts: TrainingParts) -> None:
        """``settings``: what the config says (:class:`~mcseg.training.settings.TrainerSettings`, checked when
        made); ``parts``: the objects built from it (:class:`~mcseg.training.settings.TrainingParts`)."""
        self.settings = settings
        self.cfg, self.run_dir = settings.trainer, settings.run_dir
        self.num_classes, self.class_names = settings.num_classes, list(settings.class_names)
        self.protocol, self.config_container = settings.protocol, settings.config_container
        self.images = settings.images
        model, predictor = parts.model, parts.predictor
        self.model, self.loss_fn, self.optimizer = model, parts.loss_fn, parts.optimizer
        self.scheduler, self.loader, self.sampler = parts.scheduler, parts.loader, parts.sampler
        self.predictor, self.restore = predictor, parts.restore
        self.val_cases = parts.val_cases  # every one, or trainer.val_max_cases when loaded (no full_val_every)
        self.trackers = parts.trackers
        self.device = predictor.device
        self.dist = parts.dist
        self.channels_last = use_channels_last(self.cfg.channels_last, self.device, predictor.model_dims, model)
        self.train_module = self._training_module(model)
        self._targets_checked = False  # the loss checks label values on a run's first step only
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.epoch = 0  # epochs completed
        self.step_in_epoch = 0  # batches completed in the current epoch (mid-epoch checkpoints)
        self.epoch_loss_sum = 0.0
        self.global_step = 0
        self.nonfinite_skips = 0
        self.best_value: float | None = None
        self.best_epoch: int | None = None
        self.history: list[dict] = []
        self.provenance: dict = {}  # split case ids and dataset identity, stored in every checkpoint (set by train)
        self._stop_signal: int | None = None  # the first SIGTERM/SIGINT received
        self.vote = StopVote(self.dist)
        self.trial: TrialReporter | None = None  # the Optuna trial of a sweep's job (set by mcseg.train.train)

    @property
    def _stop_requested(self) -> bool:
        return self._stop_signal is not None

    def _training_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` as the training step calls it: channels-last, DDP, compiled, as configured."""
        if self.channels_last:
            to_channels_last(model, self.predictor.model_dims)
        module = wrap_model(model, self.dist, self.device)
        if self.cfg.compile:
            module = torch.compile(module)
        return module

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "loss": self.loss_fn.state_dict(),
            "scaler": None,  # bf16 autocast needs no gradient scaler
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "epoch_loss_sum": self.epoch_loss_sum,
            "global_step": self.global_step,
            "nonfinite_skips": self.nonfinite_skips,
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "history": self.history,
            "rng": rng_states(),
            "config": self.config_container,
            **self.provenance,
        }

    def resume(self, path: Path) -> None:
        # Read on the host: the RNG states must stay CPU tensors, and load_state_dict places the rest
        # (Adam's step counters stay on the host as in a fresh run, its moments follow the parameters).
        state = load_checkpoint(path)
        mismatch = resume_mismatch(state["config"], self.config_container)
        if mismatch:
            raise ValueError(f"{path}: cannot resume with {mismatch}; resume with the run's own config")
        load_model_weights(self.model, state["model"], path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.loss_fn.load_state_dict(state.get("loss", {}))
        self.epoch, self.global_step = int(state["epoch"]), int(state.get("global_step", 0))
        self.step_in_epoch = int(state.get("step_in_epoch", 0))
        self.epoch_loss_sum = float(state.get("epoch_loss_sum", 0.0))
        self.nonfinite_skips = int(state.get("nonfinite_skips", 0))
        self.best_value, self.best_epoch = state.get("best_value"), state.get("best_epoch")
        self.history = list(state.get("history", []))
        restore_rng_states(state["rng"])
        self._check_resumed_environment(state.get("environment"), path)
        self.trackers.resume_at(self.global_step + 1)  # drop what the interrupted run logged after this checkpoint
        log.info("resumed %s in epoch %d after %d steps of it (best %s at epoch %s)", path, self.epoch + 1,
                 self.step_in_epoch, self.best_value, self.best_epoch)

    def _check_resumed_environment(self, recorded: dict | None, path: Path) -> None:
        """A deterministic run resumes on its own thread count; other code or libraries are said, since the
        result can then differ from an uninterrupted run's."""
        if not recorded:
            return
        if self.cfg.deterministic and self.device.type == "cpu":
            keep_threads_of(recorded.get("cpu_threads"), str(path))
        now = environment_record(self.device, self.cfg.deterministic)
        for name in ("code", "libraries"):
            if recorded.get(name) != now[name]:
                log.warning("%s was written by other %s (%s; now %s): the resumed run may differ from an "
                            "uninterrupted one", path, name, recorded.get(name), now[name])

    def _improved(self, value: float) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value > self.best_value if self.cfg.monitor_mode == "max" else value < self.best_value

    # ----------------------------------------------------------------- loop
    def fit(self) -> None:
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, self._request_stop) for s in STOP_SIGNALS}
        try:
            while self.epoch < self.cfg.max_epochs:
                self._run_epoch(self.epoch)
        finally:
            stop_workers(self.loader)
            for s, handler in previous.items():
                signal.signal(s, handler)
        if self.dist.is_main and not (self.ckpt_dir / "best.pt").is_file():
            log.warning("monitor %s was never finite; best.pt is the last epoch", self.cfg.monitor)
            save_checkpoint(self.ckpt_dir / "best.pt", self.state_dict())
        self.dist.barrier()

    def _request_stop(self, signum, frame) -> None:
        if self._stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once, without a checkpoint
        self._stop_signal = self._stop_signal or signum
        log.warning("%s received: writing a checkpoint at the next step and stopping%s", signal.Signals(signum).name,
                    " (Ctrl-C again stops at once)" if signum == signal.SIGINT else "")

    def _run_epoch(self, epoch: int) -> None:
        train_metrics = self.train_epoch(epoch)
        metrics = {"epoch": epoch + 1, **train_metrics}
        last = epoch + 1 == self.cfg.max_epochs
        validated = (epoch + 1) % self.cfg.val_every == 0 or last
        if validated:
            if self.dist.is_main:
                metrics.update(self.validate(epoch))
            self._share_loss_state()
        every = self.cfg.full_val_every
        if every and ((epoch + 1) % every == 0 or last) and self.dist.is_main:
            metrics.update(self.validate(epoch, full=True))
        # Every rank, also those that waited for rank 0's validation: a stop asked for meanwhile
        # (torchrun kills 30 s after its SIGTERM) ends the run before the epoch is recorded.
        if self.vote.now(self._stop_requested):
            self._save_last()  # the epoch's steps are done: resuming validates it again
            self._interrupted(epoch)
        self.trackers.scalars({k: v for k, v in metrics.items() if k != "epoch"}, self.global_step)
        self.scheduler.step()
        self.epoch, self.step_in_epoch, self.epoch_loss_sum = epoch + 1, 0, 0.0
        self.history.append(metrics)
        if self.dist.is_main:
            monitored = metrics.get(self.cfg.monitor)
            if self.cfg.monitor in metrics and self._improved(monitored):
                self.best_value, self.best_epoch = float(monitored), epoch + 1
                save_checkpoint(self.ckpt_dir / "best.pt", self.state_dict())
            save_checkpoint(self.ckpt_dir / "last.pt", self.state_dict())
            self.trackers.flush()  # what a resume would not log again
            shown = {k: round(v, 4) for k, v in metrics.items() if k != "epoch" and isinstance(v, float)}
            log.info("epoch %d/%d %s", epoch + 1, self.cfg.max_epochs, shown)
        self.dist.barrier()
        if validated and self.trial is not None:
            self._report_trial(epoch + 1, metrics)

    def _report_trial(self, epoch: int, metrics: dict) -> None:
        """Report the validation to the sweep's Optuna trial; its pruner's stop (rank 0's verdict, on every rank)
        ends the run with :class:`~mcseg.trials.TrialPruned`, after this epoch's checkpoints."""
        pruned = self.trial.report(epoch, metrics) if self.dist.is_main else None
        pruned = self.dist.broadcast_object(pruned)
        if pruned:
            log.info("%s", pruned)
            raise TrialPruned(pruned)

    def _share_loss_state(self) -> None:
        """Rank 0's loss state (updated by its validation hooks, e.g. CALS) on every rank."""
        if self.dist.enabled:
            state = {k: v.cpu() for k, v in self.loss_fn.state_dict().items()} if self.dist.is_main else None
            self.loss_fn.load_state_dict(self.dist.broadcast_object(state))

    def _save_last(self) -> None:
        if self.dist.is_main:
            save_checkpoint(self.ckpt_dir / "last.pt", self.state_dict())
            self.trackers.flush()
        self.dist.barrier()

    def _nonfinite_message(self, bad: BadStep, epoch: int) -> str:
        where = f" on rank {bad.rank}" if self.dist.enabled else ""
        return (f"non-finite {bad.what} at epoch {epoch + 1}, step {bad.step} "
                f"(batch of training cases {bad.cases}{where})")

    def _last_good(self) -> str:
        """Where a run stopped by a non-finite step can resume from, or that it cannot (no checkpoint yet)."""
        last = self.ckpt_dir / "last.pt"
        if last.is_file():
            return f"the last good checkpoint is {last}"
        return f"no checkpoint has been written yet in {self.ckpt_dir}: nothing to resume from"

    def train_epoch(self, epoch: int) -> dict:
        self.train_module.train()
        first_step = self.step_in_epoch
        self.sampler.set_epoch(epoch, skip=first_step * self.loader.batch_size)
        if first_step == 0:
            call_hook(self.loss_fn, "on_train_epoch_start", epoch)
        window = TrainingWindow(self.device, self.dist)
        n_samples, start = 0, time.perf_counter()
        stop_agreed = False  # a stop every rank knows of (single process: asked for)

        def close() -> float | None:
            """Read the window back; raise on a non-finite step; return the mean loss."""
            nonlocal stop_agreed
            report = window.close(self._stop_requested)
            self.epoch_loss_sum += report.loss_sum
            stop_agreed = stop_agreed or report.stop
            if report.bad is not None:
                raise NonFiniteLossError(f"{self._nonfinite_message(report.bad, epoch)}; {self._last_good()}")
            return report.mean_loss

        bar = tqdm(self.loader, desc=f"epoch {epoch + 1}", leave=False, dynamic_ncols=True,
                   disable=not (self.cfg.progress_bar and self.dist.is_main))
        for step, batch in enumerate(bar, start=first_step):
            share_cpu(self.device)  # a busy machine: fewer torch threads (mcseg.runtime.AdaptiveThreads)
            result = self._train_step(batch, epoch, step)
            self.step_in_epoch = step + 1
            if result is not None:
                window.add(step, *result, batch["case_id"])
                n_samples += batch["image"].shape[0]
                self.global_step += 1
                if self.global_step % self.cfg.log_every_n_steps == 0:
                    value = close()
                    rate = n_samples / (time.perf_counter() - start)
                    bar.set_postfix(loss=f"{value:.4f}", samples_s=f"{rate:.1f}")
                    self.trackers.scalars({"train/loss_step": value}, self.global_step)
            stop_agreed = self.vote.step(self._stop_requested) or stop_agreed
            every = self.cfg.checkpoint_every_n_steps
            if stop_agreed or (every and self.step_in_epoch % every == 0):
                close()  # never checkpoint the result of a non-finite step
                self._save_last()
                if stop_agreed:
                    self._interrupted(epoch)
        close()
        if stop_agreed:  # torchrun: the ranks agreed on a stop at the epoch's last read
            self._save_last()
            self._interrupted(epoch)
        seconds = time.perf_counter() - start
        mean_loss = self.epoch_loss_sum / max(self.step_in_epoch, 1)
        lr = self.optimizer.param_groups[0]["lr"]
        return {"train/loss": mean_loss, "train/lr": lr,
                "train/samples_per_s": n_samples * self.dist.world_size / max(seconds, 1e-9)}

    def _interrupted(self, epoch: int):
        signum = self._stop_signal or signal.SIGTERM  # torchrun: another rank was signalled
        raise TrainingInterrupted(
            f"stopped by {signal.Signals(signum).name} at epoch {epoch + 1}, step {self.step_in_epoch}; "
            f"{self.ckpt_dir / 'last.pt'} written: rerun with trainer.resume=true", signum,
        )

    def _train_step(self, batch: dict, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One optimiser step; returns the detached loss and its non-finite code (device tensors, see
        :func:`~mcseg.training.window.nonfinite_code`), or None when ``nonfinite=skip`` skipped the step."""
        image, label = to_device(batch, self.device, self.channels_last)
        self.optimizer.zero_grad(set_to_none=True)
        with target_checks(self.loss_fn, not self._targets_checked):  # a host read: first step only
            loss = self.forward_loss(image, label)
        self._targets_checked = True
        loss.backward()
        code = nonfinite_code(loss.detach(), self._grad_norm())
        if self.cfg.nonfinite == "skip":
            # The exact per-step check: one host synchronisation (and under torchrun one all-reduce) per step.
            kind = int(self.dist.all_reduce_max(code))
            if kind != FINITE:
                self._skip(BadStep(step, WHAT[kind], sorted(set(batch.get("case_id", []))), self.dist.rank), epoch)
                return None
        self.optimizer.step()
        return loss.detach(), code

    def forward_loss(self, image: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch: the network's final output and any deep-supervision heads
        (:func:`~mcseg.models.supervision_outputs`), weighted as nnU-Net does."""
        with autocast_context(self.device, self.cfg.precision):
            output = self.train_module(image)
        return deep_supervision_loss(self.loss_fn, supervision_outputs(output, self.predictor.model_dims), label)

    def _grad_norm(self) -> torch.Tensor:
        """The gradients' total norm (device scalar), clipped to ``trainer.grad_clip`` if set."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.cfg.grad_clip:
            return torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        return torch.nn.utils.get_total_norm([p.grad for p in params])

    def _skip(self, bad: BadStep, epoch: int) -> None:
        message = self._nonfinite_message(bad, epoch)
        self.optimizer.zero_grad(set_to_none=True)
        if self.nonfinite_skips >= self.cfg.max_nonfinite_skips:
            raise NonFiniteLossError(f"{message}; trainer.max_nonfinite_skips={self.cfg.max_nonfinite_skips} "
                                     f"steps already skipped; {self._last_good()}")
        self.nonfinite_skips += 1
        log.warning("%s: step skipped (%d of at most %d)", message, self.nonfinite_skips,
                    self.cfg.max_nonfinite_skips)

    def validate(self, epoch: int, full: bool = False) -> dict:
        """Segment the validation volumes; Dice, HD95 and calibration through the evaluator.

        The running validation (``val/*``) takes the first ``trainer.val_max_cases`` cases and
        drives the loss's validation hooks (CALS); ``full`` takes every case (``val_full/*``),
        without hooks, so a loss's state is updated once per epoch whatever the schedule.
        """
        evaluator = Evaluator(self.num_classes, self.class_names, self.protocol, self.predictor.multilabel)
        cases = self.val_cases if full else self.val_cases[: self.cfg.val_max_cases or None]
        if not full:
            call_hook(self.loss_fn, "on_validation_start")
        hook = None if full else getattr(self.loss_fn, "on_validation_batch", None)
        images = 0 if full else self.images
        # one plain pass, as nnU-Net validates: test-time mirroring or members would multiply each validation's cost
        kept = evaluate_cases(self.predictor.plain(), self._until_stopped(cases), evaluator, self.restore,
                              on_logits=hook, keep=images)
        if self._stop_requested:
            return {}  # cut short: the caller checkpoints and stops, and a resumed run validates again
        if not full:
            call_hook(self.loss_fn, "on_validation_end", epoch)
        summary = evaluator.summary()
        prefix = "val_full" if full else "val"
        metrics = {f"{prefix}/{k}": float(summary[k]) for k in summary_keys("headline") if summary.get(k) is not None}
        if images:
            self.trackers.overlays("val", kept, self.global_step)
            self.trackers.figure("val/reliability", reliability_figure(evaluator), self.global_step)
        return metrics

    def _until_stopped(self, cases: list):
        """``cases`` until a stop is asked for: a validation never holds up a stop for long."""
        for case in cases:
            if self._stop_requested:
                return
            yield case

    def load_best(self) -> dict:
        """Load best.pt's weights and loss state; return the checkpoint (for its provenance)."""
        path = self.ckpt_dir / "best.pt"
        state = load_checkpoint(path)  # on the host: only the weights are copied to the device
        load_model_weights(self.model, state["model"], path)
        self.loss_fn.load_state_dict(state.get("loss", {}))
        return state
