"""Naive NumPy reference implementations (loops over bins, explicit sorting) and test data."""
from __future__ import annotations

import numpy as np
import torch


def bins_reference(values: np.ndarray, n_bins: int) -> np.ndarray:
    """(lo, hi] bins; exact for float32 inputs (v * M is exact in float64)."""
    return np.clip(np.ceil(values.astype(np.float64) * n_bins) - 1, 0, n_bins - 1).astype(np.int64)


def binned_ece_reference(values: np.ndarray, hits: np.ndarray, bins: np.ndarray, n_bins: int) -> tuple[float, float]:
    """(ECE, MCE) by a loop over bins: sum_b n_b/N |acc_b - conf_b| and max_b |acc_b - conf_b|."""
    ece, mce, n = 0.0, -1.0, len(values)
    for b in range(n_bins):
        sel = bins == b
        if sel.any():
            gap = abs(hits[sel].mean() - values[sel].astype(np.float64).mean())
            ece += sel.sum() / n * gap
            mce = max(mce, gap)
    return ece, mce


def calibration_reference(probs: np.ndarray, label: np.ndarray, n_bins: int) -> dict:
    """ECE, MCE, classwise ECE, NLL, Brier of K x N probabilities, N labels."""
    k = probs.shape[0]
    conf, pred = probs.max(0), probs.argmax(0)
    ece, mce = binned_ece_reference(conf, (pred == label).astype(float), bins_reference(conf, n_bins), n_bins)
    class_ece = [binned_ece_reference(probs[c], (label == c).astype(float), bins_reference(probs[c], n_bins),
                                      n_bins)[0] for c in range(k)]
    onehot = np.eye(k)[label].T
    p_true = probs[label, np.arange(label.size)].astype(np.float64)
    return {"ece": ece, "mce": mce, "class_ece": class_ece, "classwise_ece": float(np.mean(class_ece)),
            "nll": float(-np.log(np.maximum(p_true, 1e-12)).mean()),
            "brier": float(((probs.astype(np.float64) - onehot) ** 2).sum(0).mean())}


def adaptive_ece_reference(conf: np.ndarray, hits: np.ndarray, n_bins: int) -> float:
    """AdaECE by full sorting: thresholds r_(ceil(bN/M)), bins (t_{b-1}, t_b]."""
    n = conf.size
    s = np.sort(conf)
    thresholds = np.array([s[-(-b * n // n_bins) - 1] for b in range(1, n_bins)])
    bins = np.searchsorted(thresholds, conf, side="left")
    return binned_ece_reference(conf, hits, bins, n_bins)[0]


def random_probs(k: int, shape: tuple[int, ...], seed: int, scale: float = 2.0,
                 dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(k, *shape, generator=g, dtype=torch.float64) * scale, 0).to(dtype)
    label = torch.randint(0, k, shape, generator=g)
    return probs, label


def blobs(shape: tuple[int, ...], k: int, seed: int, n_blobs: int = 2) -> torch.Tensor:
    """Label map with ``n_blobs`` random ellipsoids per foreground class (later ones on top)."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1).astype(float)
    out = np.zeros(shape, dtype=np.int64)
    for c in range(1, k):
        for _ in range(n_blobs):
            centre = rng.uniform(0.2, 0.8, len(shape)) * np.array(shape)
            radii = rng.uniform(0.08, 0.25, len(shape)) * np.array(shape)
            out[(((grid - centre) / radii) ** 2).sum(-1) <= 1] = c
    return torch.from_numpy(out)
