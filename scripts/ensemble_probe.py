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
from mcseg.engine.build import build_predictor, restore_model
from mcseg.engine.checkpoint import load_checkpoint
from mcseg.engine.inference import InferenceConfig
from mcseg.metrics.overlap import dice


def load_run(run: Path, device: torch.device):
    state = load_checkpoint(run / "checkpoints" / "best.pt")
    cfg = OmegaConf.create(state["config"])
    model, loss_fn = restore_model(cfg, state, run, device)
    predictor = build_predictor(cfg, model, loss_fn, device, typed(cfg.inference, InferenceConfig, "inference"),
                                cfg.trainer.precision)
    return cfg, predictor, json.loads((run / "split.json").read_text())


def foreground_dice(probs: torch.Tensor, label: torch.Tensor, num_classes: int) -> float:
    return float(dice(probs.argmax(0), label, num_classes)[1:].nanmean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two run directories")
    device = torch.device("cpu")
    loaded = [load_run(run, device) for run in args.runs]
    splits = {json.dumps(split["val"]) for _, _, split in loaded}
    if len(splits) != 1:
        parser.error("the runs do not share one validation split (their split.json differ)")
    cfg = loaded[0][0]
    dataset = build_dataset(cfg.dataset)
    by_id = {r.case_id: r for r in dataset.case_refs()}
    refs = [by_id[c] for c in loaded[0][2]["val"]]
    dataset.prepare(refs)
    singles = [[] for _ in loaded]
    pairs: dict[tuple[int, int], list[float]] = {}
    everything = []
    for ref in refs:
        case = dataset.load(ref)
        label = torch.as_tensor(np.asarray(case.label), dtype=torch.int64)
        k = int(cfg.dataset.num_classes)
        probs = [predictor.probabilities(predictor.logits(case)) for _, predictor, _ in loaded]
        for i, p in enumerate(probs):
            singles[i].append(foreground_dice(p, label, k))
        for i, j in itertools.combinations(range(len(probs)), 2):
            pairs.setdefault((i, j), []).append(foreground_dice((probs[i] + probs[j]) / 2, label, k))
        everything.append(foreground_dice(torch.stack(probs).mean(0), label, k))
    print(f"validation split: {len(refs)} cases; mean foreground Dice")
    for i, run in enumerate(args.runs):
        print(f"  [{i}] {np.mean(singles[i]):.4f}  {run}")
    for (i, j), values in pairs.items():
        print(f"  [{i}]+[{j}] {np.mean(values):.4f}")
    print(f"  all {len(loaded)}: {np.mean(everything):.4f}")


if __name__ == "__main__":
    main()
