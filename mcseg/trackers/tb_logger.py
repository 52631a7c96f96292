"""TensorBoard scalars, figures and image/label/prediction overlays (a no-op when disabled)."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

# Distinct colours for up to 10 classes (background transparent).
_PALETTE = np.array(
    [[0, 0, 0], [230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48],
     [145, 30, 180], [70, 240, 240], [240, 50, 230], [210, 245, 60]], dtype=np.float32
) / 255


def overlay(image: np.ndarray, label: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """RGB ``3 x H x W`` of a grey image with a coloured label map on top."""
    lo, hi = np.percentile(image, (1, 99))
    grey = np.clip((image - lo) / max(hi - lo, 1e-6), 0, 1)
    rgb = np.repeat(grey[..., None], 3, axis=-1)
    colours = _PALETTE[label % len(_PALETTE)]
    mask = (label > 0)[..., None]
    rgb = np.where(mask, (1 - alpha) * rgb + alpha * colours, rgb)
    return np.moveaxis(rgb, -1, 0)


def heat(image: np.ndarray, uncertainty: np.ndarray) -> np.ndarray:
    """RGB ``3 x H x W``: the grey image under a red-yellow heat map of an uncertainty in [0, 1] (its opacity
    grows with the uncertainty, so certain voxels show the image)."""
    lo, hi = np.percentile(image, (1, 99))
    grey = np.clip((image - lo) / max(hi - lo, 1e-6), 0, 1)
    u = np.clip(uncertainty, 0, 1)
    colour = np.stack([np.ones_like(u), u, np.zeros_like(u)], axis=-1)  # red (low) to yellow (high)
    rgb = (1 - u[..., None]) * grey[..., None] + u[..., None] * colour
    return np.moveaxis(rgb, -1, 0)


def busiest_slice(label: np.ndarray) -> int | None:
    """Index (last axis) of the 3D label's slice with the most foreground; None for 2D."""
    if label.ndim == 2:
        return None
    return int(np.argmax((label > 0).reshape(-1, label.shape[-1]).sum(0)))


class TensorBoardLogger:
    """Every value at the trainer's global step. A resumed run calls :meth:`resume_at` before logging:
    TensorBoard then discards what the interrupted run logged at that step or later.

    Events that cannot be written (a full disk) stop TensorBoard logging with one warning, not the run:
    a checkpoint that cannot be written ends it, with one line naming the file."""

    def __init__(self, log_dir: Path | None) -> None:
        self.log_dir, self._writer, self._purge_step = log_dir, None, None
        self.error: str | None = None  # why logging stopped (a full disk), once it has

    def resume_at(self, step: int) -> None:
        if self._writer is not None:
            raise RuntimeError("TensorBoardLogger.resume_at must come before the first value is logged")
        self._purge_step = step

    @property
    def writer(self):
        """The SummaryWriter, opened at the first value (None when disabled)."""
        if self._writer is None and self.log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_event_writer_threads()
            self._writer = SummaryWriter(str(self.log_dir), purge_step=self._purge_step)
        return self._writer

    def _failed(self, exc: OSError) -> None:
        log.warning("cannot write TensorBoard events in %s (%s); TensorBoard logging stopped", self.log_dir, exc)
        self.error = f"{type(exc).__name__}: {exc}"
        self.log_dir, self._writer = None, None

    def scalars(self, values: dict[str, float], step: int) -> None:
        try:
            if self.writer is not None:
                for key, value in values.items():
                    if value is not None and np.isfinite(value):
                        self.writer.add_scalar(key, value, step)
        except OSError as exc:
            self._failed(exc)

    def figure(self, tag: str, fig, step: int) -> None:
        try:
            if self.writer is not None:
                self.writer.add_figure(tag, fig, step, close=True)
        except OSError as exc:
            self._failed(exc)

    def overlays(self, tag: str, cases: list, step: int) -> None:
        """``cases``: (CaseData, predicted label map tensor, normalised uncertainty map or None) triples; logs
        image, label, prediction and (when given) the uncertainty as a heat map, side by side."""
        try:
            if self.writer is None:
                return
            for case, pred, uncertainty in cases:
                pred = pred.numpy().astype(np.int64)
                label = case.label
                if pred.ndim == case.image.ndim:  # multi-label R x *S: show how many regions cover a voxel
                    pred, label = pred.sum(0), label.sum(0)
                z = busiest_slice(label)
                unc = None if uncertainty is None else uncertainty.float().numpy()
                image, label, pred, unc = ((a if z is None or a is None else a[..., z])
                                           for a in (case.image[0], label, pred, unc))
                panels = [overlay(image, np.zeros_like(label)), overlay(image, label), overlay(image, pred)]
                if unc is not None:
                    panels.append(heat(image, unc))
                self.writer.add_image(f"{tag}/{case.case_id}", torch.from_numpy(np.concatenate(panels, axis=2)), step)
        except OSError as exc:
            self._failed(exc)

    def hparams(self, hparams: dict, metrics: dict[str, float | None]) -> None:
        """The run's configuration and final figures in TensorBoard's HParams view (a sweep's runs side by side)."""
        try:
            if self.writer is None:
                return
            values = {k: v for k, v in metrics.items() if v is not None and np.isfinite(v)}
            self.writer.add_hparams(hparams, values, run_name="hparams")
        except OSError as exc:
            self._failed(exc)

    def close(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        except OSError as exc:
            self._failed(exc)


def _quiet_event_writer_threads() -> None:
    """TensorBoard's writer thread re-raises a write that failed (a full disk), which Python prints as a
    traceback; the logger meets the same error at its next call and says it in one warning instead."""
    previous = threading.excepthook
    if getattr(previous, "mcseg_quiet", False):
        return

    def hook(args) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard."):
            return
        previous(args)

    hook.mcseg_quiet = True
    threading.excepthook = hook
