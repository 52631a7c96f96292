"""One large volume's peak memory through mcseg's evaluation (``python scripts/benchmark.py eval-memory``): a
stand-in network on a phantom volume through ``evaluate_cases`` (sliding-window inference, softmax, every metric),
in bytes and in copies of its probability tensor, measured in a fresh process."""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_memory import current_rss, peak_memory, reset_host_peak, synchronize  # noqa: E402

from mcseg.config import EvalProtocol, InferenceConfig  # noqa: E402
from mcseg.data.cases import CaseData  # noqa: E402
from mcseg.evaluation.cases import evaluate_cases  # noqa: E402
from mcseg.evaluation.evaluator import Evaluator  # noqa: E402
from mcseg.inference.predict import SegmentationPredictor  # noqa: E402

BENCHMARK = ROOT / "scripts" / "benchmark.py"  # its ``eval-memory`` command runs :func:`eval_memory_main`


class IntensityEcho(torch.nn.Module):
    """A stand-in network for memory measurements: logits favour the class nearest to the
    voxel's intensity, so predictions have the sparse surfaces of a real segmentation."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        classes = torch.arange(self.num_classes, dtype=x.dtype, device=x.device).view(1, -1, *[1] * (x.ndim - 2))
        return -4.0 * (x - classes) ** 2  # B x K x *S, nothing larger on the way


def phantom_case(case_id: str, shape: tuple[int, ...], num_classes: int) -> CaseData:
    """Boxes of classes 1..K-1 in a volume of ``shape``; the image is the label plus smooth noise."""
    label = np.zeros(shape, np.uint8)
    quarter = [max(n // 4, 1) for n in shape]
    for k in range(1, num_classes):
        start = (k * quarter[0] // 2) % max(shape[0] - quarter[0], 1)
        label[start : start + quarter[0], quarter[1] : 3 * quarter[1], quarter[2] : 3 * quarter[2]] = k
    image = label.astype(np.float32)[None]
    image += 0.2 * np.sin(np.arange(shape[-1], dtype=np.float32) / 7.0)
    return CaseData(case_id, image, label, (1.0,) * len(shape), np.eye(4))


def evaluation_memory(shape: tuple[int, ...], num_classes: int, roi: list[int], sw_batch_size: int,
                      device: torch.device) -> dict:
    """Peak memory of one volume through ``evaluate_cases`` (sliding-window inference, softmax,
    every metric), in bytes and in copies of its probability tensor (K x *S float32)."""
    model = IntensityEcho(num_classes).to(device)
    cfg = InferenceConfig(sw_batch_size=sw_batch_size, roi_size=roi)
    predictor = SegmentationPredictor(model, 3, 16, lambda x: torch.softmax(x, 1), False, cfg, roi, "32", device)
    evaluator = Evaluator(num_classes, [f"class_{k}" for k in range(num_classes)],
                          EvalProtocol(bootstrap_samples=0))

    def identity(case, probs):
        return probs, case.label, case.spacing, case.affine

    evaluate_cases(predictor, [phantom_case("warmup", tuple(2 * r for r in roi), num_classes)], evaluator, identity)
    case = phantom_case("volume", shape, num_classes)
    probability_bytes = 4 * num_classes * int(np.prod(shape))
    before, record = current_rss(), {}
    with peak_memory(device, record):
        start = time.perf_counter()
        evaluate_cases(predictor, [case], evaluator, identity)
        synchronize(device)
        seconds = time.perf_counter() - start
    peak_extra = record["peak_host_mb"] * 2**20 - before
    if device.type == "cuda":  # the volume lives on the GPU; the host holds the input and the label
        peak_extra = record["peak_gpu_mb"] * 2**20
    return {"shape": list(shape), "classes": num_classes, "device": device.type, "roi_size": roi,
            "sw_batch_size": sw_batch_size, "seconds": round(seconds, 1),
            "probability_tensor_mb": round(probability_bytes / 2**20, 1),
            "peak_extra_mb": round(peak_extra / 2**20, 1),
            "copies_of_probability_tensor": round(peak_extra / probability_bytes, 2),
            "host_peak_resettable": reset_host_peak()}


def eval_memory_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmark.py eval-memory", description=evaluation_memory.__doc__)
    parser.add_argument("--shape", type=int, nargs=3, default=[512, 512, 300])
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--roi", type=int, nargs=3, default=[96, 96, 96])
    parser.add_argument("--sw-batch-size", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    result = evaluation_memory(tuple(args.shape), args.classes, args.roi, args.sw_batch_size, torch.device(args.device))
    print(json.dumps(result))
    return 0


def run_eval_memory_child(shape: list[int], classes: int, roi: list[int], sw_batch_size: int,
                          device: torch.device) -> dict:
    """:func:`evaluation_memory` in a fresh process (nothing else in its memory)."""
    import subprocess

    done = subprocess.run([sys.executable, str(BENCHMARK), "eval-memory", "--shape", *map(str, shape), "--classes",
                           str(classes), "--roi", *map(str, roi), "--sw-batch-size", str(sw_batch_size),
                           "--device", device.type], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"eval-memory failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
