"""Why does a temperature lower the entropy's voxel AUROC on nnU-Net's files? (docs/results.md, "Calibrating nnU-Net")

Reads an nnU-Net folder of test predictions (``--save_probabilities``), the same folder after
``mcseg-calibrate-folder`` (temperature ``T``) and the labels, with mcseg's own readers, and scores failure
detection as ``mcseg-evaluate-folder`` does (region union_foreground, error voxels: the tool's label map differs
from the label, maps normalised, pooled AUROC over 65536 bins: mcseg.metrics.failure.PooledAUROC). Scored:

- ``raw file``, ``T file``: the two folders as evaluated (must equal their summary.json);
- ``T from raw, clamp c``: softmax(ln max(p, c) / T) from the raw file, for several clamps ``c``
  (mcseg's own is 2^-126; zeros kept: c = 0, ln 0 = -inf, so an exact zero stays 0);
- ``top-2 entropy``: the entropy of the two largest probabilities renormalised, raw and after T. On two
  classes a temperature cannot change the ranking (it divides the one log-odds by T), so any fall of the
  full entropy that the top-2 entropy does not share comes from the third class.

It also gives the third class's share of the entropy summed over the region, counts, inside the region, the exact zeros (and values below float32's smallest normal number) per class,
and the third class's probability (the smallest of three) in error and correct voxels, raw and after T.

    python scripts/nnunet_entropy_auroc.py /work/runs/nnunet/test /work/runs/nnunet/test_temperature \\
        /work/runs/nnunet/labelsTs --temperature 2.65 \\
        --dataset-json /work/runs/nnunet/nnUNet_raw/Dataset904_Hippocampus/dataset.json \\
        --out docs/results/nnunet_calibration/entropy_auroc_retrained.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mcseg.config import EvalProtocol  # noqa: E402
from mcseg.data.reference import read_reference  # noqa: E402
from mcseg.evaluation.evaluator import Evaluator  # noqa: E402
from mcseg.evaluation.folder_posthoc import FLOOR  # noqa: E402
from mcseg.evaluation.folders import read_case, select_cases  # noqa: E402
from mcseg.evaluation.formats import declared_classes, open_folder  # noqa: E402
from mcseg.metrics.failure import PooledAUROC, auroc  # noqa: E402
from mcseg.metrics.uncertainty import entropy  # noqa: E402

CLAMPS = {"2^-126": FLOOR, "1e-12": 1e-12, "1e-8": 1e-8, "1e-6": 1e-6, "0 (zeros kept)": 0.0}


def scaled(probs: torch.Tensor, temperature: float, clamp: float) -> torch.Tensor:
    """softmax(ln max(p, clamp) / T) in float64, stored as float32 as a written file would be."""
    logits = probs.double().clamp_min(clamp).log() if clamp > 0 else probs.double().log()
    return torch.softmax(logits / temperature, 0).float()


def top2_entropy(probs: torch.Tensor) -> torch.Tensor:
    top = probs.double().topk(2, dim=0).values
    return entropy(top / top.sum(0, keepdim=True))


def maps_of(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The normalised maps as mcseg scores them (entropy / ln C, 1 - max p / (1 - 1/C)), plus the top-2 entropy
    / ln 2 and the smallest class's probability."""
    c = probs.shape[0]
    return {"entropy": entropy(probs) / torch.log(torch.tensor(float(c))),
            "one_minus_max_p": (1 - probs.max(0).values) / (1 - 1 / c),
            "top2_entropy": (top2_entropy(probs) / torch.log(torch.tensor(2.0))).float(),
            "smallest_p": probs.min(0).values,
            "third_class_term": (entropy(torch.stack([probs.min(0).values, 1 - probs.min(0).values]))
                                 / torch.log(torch.tensor(float(c))))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("calibrated", type=Path)
    parser.add_argument("labels", type=Path)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--dataset-json", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    reference = read_reference(args.labels, None, None, args.dataset_json, channels_hint=None,
                               declared=declared_classes(args.raw))
    raw = open_folder(args.raw, reference.task, "auto", "trans", None)
    cal = open_folder(args.calibrated, reference.task, "auto", "trans", None)
    protocol = EvalProtocol()
    evaluator = Evaluator(reference.task.channels, reference.task.class_names, protocol, reference.task.multilabel)
    variants = ["raw file", "T file", *(f"T from raw, clamp {k}" for k in CLAMPS)]
    names = ["entropy", "one_minus_max_p", "top2_entropy", "smallest_p", "third_class_term"]
    pooled = {(v, n): PooledAUROC() for v in variants for n in names}
    classes = reference.task.class_names
    zeros = {c: 0 for c in classes}
    subnormal = {c: 0 for c in classes}
    counts = {"voxels": 0, "errors": 0, "voxels_with_an_exact_zero": 0, "errors_with_an_exact_zero": 0}
    smallest = {v: {"error": [], "correct": []} for v in ("raw file", "T file")}
    shares = {v: {"entropy": 0.0, "third_class_term": 0.0} for v in smallest}  # sums over the region
    cases = select_cases([raw], reference, None, False)
    for case in cases:
        label_vol, label, probs, prediction, _ = read_case([raw], reference, case)
        _, _, probs_t, prediction_t, _ = read_case([cal], reference, case)
        pred = prediction if prediction is not None else probs.argmax(0)
        region = evaluator.region_of(label, pred, label_vol.spacing, protocol.region)
        errors = (pred != label)[region]
        inside = probs[:, region]
        for k, c in enumerate(classes):
            zeros[c] += int((inside[k] == 0).sum())
            subnormal[c] += int((inside[k] < FLOOR).sum())
        has_zero = (inside == 0).any(0)
        counts["voxels"] += int(region.sum())
        counts["errors"] += int(errors.sum())
        counts["voxels_with_an_exact_zero"] += int(has_zero.sum())
        counts["errors_with_an_exact_zero"] += int((has_zero & errors).sum())
        files = {"raw file": probs, "T file": probs_t}
        files.update({f"T from raw, clamp {k}": scaled(probs, args.temperature, c) for k, c in CLAMPS.items()})
        for v, p in files.items():
            maps = maps_of(p)
            for n in names:
                pooled[(v, n)].update(maps[n][region].float(), errors)
            if v in smallest:
                for k in shares[v]:
                    shares[v][k] += float(maps[k][region].double().sum())
                s = maps["smallest_p"][region]
                smallest[v]["error"].append(s[errors])
                smallest[v]["correct"].append(s[~errors])
    quantiles = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    result = {
        "folders": {"raw": str(args.raw), "calibrated": str(args.calibrated), "labels": str(args.labels)},
        "temperature": args.temperature, "cases": len(cases), "region": protocol.region,
        "counts": counts, "exact_zeros_per_class": zeros, "below_2^-126_per_class": subnormal,
        "pooled_auroc": {v: {n: pooled[(v, n)].aggregate() for n in names} for v in variants},
        "third_class_share_of_entropy": {v: d["third_class_term"] / d["entropy"] for v, d in shares.items()},
        "smallest_p_quantiles_10_50_90": {
            v: {k: [float(q) for q in torch.quantile(torch.cat(x).double()[:16_000_000], quantiles)]
                for k, x in d.items()} for v, d in smallest.items()},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
