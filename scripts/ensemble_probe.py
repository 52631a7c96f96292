"""How much would an ensemble of finished runs gain? Scored on their shared validation split only.

For the given run directories (trained on the same dataset and split), the selected checkpoint of
each (``checkpoints/best.pt``) predicts every validation case with the run's own inference settings;
the softmax probabilities are averaged over every pair of runs and over all of them (nnU-Net's
ensembling of folds: the mean of the probabilities, then the arg-max), and the mean foreground Dice
(per case, then over cases) of each single run, each pair and the whole ensemble is printed.

It answers a question of recipe design (issue #15: does a budget split between several models beat
one model trained for the whole budget?) on the validation split, never on the test split.

    python scripts/ensemble_probe.py RUN_DIR RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from mcseg.config import typed
from mcseg.data.build import build_dataset
from mcseg.inference.build import build_predictor, restore_model
from mcseg.training.checkpoint import load_checkpoint
from mcseg.inference.volume import InferenceConfig
from mcseg.metrics.overlap import dice


def load_run(run: Path, device: torch.device):
    state = load_checkpoint(run / "checkpoints" / "best.pt")
    cfg = OmegaConf.create(state["config"])
    model, loss_fn = restore_model(cfg, state, run, device)
    predictor = build_predictor(cfg, model, loss_fn, device, typed(cfg.inference, InferenceConfig, "inference"),
                                cfg.trainer.precision)
    return cfg, predictor, json.loads((run / "split.json").read_text())


def foreground_dice(probs: torch.Tensor, label: torch.Tensor, num_classes: int) -> float:
    """The case's Dice averaged over its foreground classes (a class absent from label and prediction: left out)."""
    return float(dice(probs.argmax(0), label, num_classes)[1:].nanmean())


def probe(runs: list[Path], device: torch.device = torch.device("cpu")) -> dict:
    """Mean foreground Dice on the runs' shared validation split: ``single`` (one per run), ``pairs``
    (``{(i, j): value}``), ``all`` (every run averaged) and ``n_cases``."""
    loaded = [load_run(run, device) for run in runs]
    if len({json.dumps(split["val"]) for _, _, split in loaded}) != 1:
        raise ValueError(f"{', '.join(map(str, runs))}: the runs do not share one validation split "
                         "(their split.json differ); an ensemble probe needs the same cases for every run")
    cfg = loaded[0][0]
    num_classes = int(cfg.dataset.num_classes)
    dataset = build_dataset(cfg.dataset)
    by_id = {r.case_id: r for r in dataset.case_refs()}
    refs = [by_id[c] for c in loaded[0][2]["val"]]
    dataset.prepare(refs)
    single: list[list[float]] = [[] for _ in loaded]
    pairs: dict[tuple[int, int], list[float]] = {}
    everything = []
    for ref in refs:
        case = dataset.load(ref)
        label = torch.as_tensor(np.asarray(case.label), dtype=torch.int64)
        probs = [predictor.probabilities(predictor.logits(case)) for _, predictor, _ in loaded]
        for i, p in enumerate(probs):
            single[i].append(foreground_dice(p, label, num_classes))
        for i, j in itertools.combinations(range(len(probs)), 2):
            pairs.setdefault((i, j), []).append(foreground_dice((probs[i] + probs[j]) / 2, label, num_classes))
        everything.append(foreground_dice(torch.stack(probs).mean(0), label, num_classes))
    return {"single": [float(np.nanmean(v)) for v in single],
            "pairs": {k: float(np.nanmean(v)) for k, v in pairs.items()},
            "all": float(np.nanmean(everything)), "n_cases": len(refs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two run directories")
    result = probe(args.runs)
    print(f"validation split: {result['n_cases']} cases; mean foreground Dice")
    for i, run in enumerate(args.runs):
        print(f"  [{i}] {result['single'][i]:.4f}  {run}")
    for (i, j), value in result["pairs"].items():
        print(f"  [{i}]+[{j}] {value:.4f}")
    print(f"  all {len(args.runs)}: {result['all']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
