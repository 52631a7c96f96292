"""Sliding-window inference of one volume: mcseg's predict_logits against plain MONAI, same network and settings.

    python scripts/bench_sliding_window.py [X Y Z [REPEATS]]   # default 256 256 160, 5 repeats; JSON lines

The network is MONAI UNet 3D (the model=unet default: 16-256 channels, 2 residual units, instance norm),
3 classes, random weights, in eval mode under torch.inference_mode; on CUDA both paths run in bf16
autocast. Three window settings (48x64x48 batch 16, the 3D recipe's patch; 96^3 batch 4; 128^3 batch 2),
overlap 0.5, gaussian blend. Median of REPEATS after 2 warm-ups; peak GPU memory of the timed runs.
Issue #39 measured it on an H200 (docs/benchmarks.md, "GPU acceptance check on an NVIDIA H200").
"""
import json, statistics, sys, time
from pathlib import Path

import torch
from monai.inferers import sliding_window_inference
from monai.networks.nets import UNet
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mcseg.inference.volume import predict_logits
from mcseg.config import InferenceConfig

shape = [int(v) for v in (sys.argv[1:4] or [256, 256, 160])]
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 5
torch.manual_seed(0)
model = UNet(3, 1, 3, [16, 32, 64, 128, 256], [2, 2, 2, 2], num_res_units=2, norm="instance").to(dev).eval()
image = torch.randn(1, *shape, device=dev)
prec = "bf16" if dev.type == "cuda" else "32"

def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()

def timed(fn):
    with torch.inference_mode():
        for _ in range(2):
            fn()
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    return {"median_s": round(statistics.median(ts), 4), "runs_s": [round(t, 4) for t in ts],
            "peak_gpu_mb": None if peak is None else round(peak, 1)}

out = {"shape": shape, "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "precision": prec,
       "network": "MONAI UNet 3D 16-256, 2 res units, instance norm, 3 classes", "cases": []}
for roi, swb in (([48, 64, 48], 16), ([96, 96, 96], 4), ([128, 128, 128], 2)):
    cfg = InferenceConfig(sw_batch_size=swb, overlap=0.5, blend_mode="gaussian", roi_size=roi)
    mc = timed(lambda: predict_logits(model, image, 3, 16, cfg, roi, prec))
    def plain():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            return sliding_window_inference(image[None], roi, swb, model, overlap=0.5, mode="gaussian")[0].float()
    pl = timed(plain)
    rec = {"roi": roi, "sw_batch_size": swb, "overlap": 0.5, "mcseg_predict_logits": mc, "plain_monai": pl,
           "ratio_plain_over_mcseg": round(pl["median_s"] / mc["median_s"], 3)}
    print(json.dumps(rec), flush=True)
    out["cases"].append(rec)
print("RESULT " + json.dumps(out), flush=True)
