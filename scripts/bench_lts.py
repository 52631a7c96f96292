"""LTS on a folder of saved probabilities (#58 item 5): the fit's wall and CPU time and its NLL over every voxel of
the fit cases, for the settings chosen from the data's size (``LTSConfig``'s unset keys) and for given ones
(e.g. the defaults before #58: 64^3 patches, 50 steps an epoch, up to 200 epochs).

    python scripts/bench_lts.py PRED_DIR REFERENCE --cases N --label chosen -o out.json [--lts KEY=VALUE ...]

Reads the cases as ``mcseg-calibrate-folder`` does (ln p of the saved probabilities), fits with
:func:`mcseg.calibration.lts.fit_lts` on one torch thread and appends one record to ``-o`` (a JSON list).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from mcseg.calibration.lts import CaseLogits, LTSConfig, fit_lts, heldout_nll
from mcseg.data.reference import read_reference
from mcseg.evaluation.folder_posthoc import log_probabilities
from mcseg.evaluation.folders import read_case
from mcseg.evaluation.formats import open_folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pred_dir", type=Path)
    p.add_argument("reference", type=Path)
    p.add_argument("--cases", type=int, help="the first N cases (sorted) only")
    p.add_argument("--label", required=True)
    p.add_argument("--lts", nargs="*", default=[], metavar="KEY=VALUE", help="LTSConfig settings (JSON values)")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    reference = read_reference(args.reference)
    folder = open_folder(args.pred_dir, reference.task)
    names = folder.cases()[: args.cases]
    cases = []
    for case in names:
        _, label, probs, _, _ = read_case([folder], reference, case)
        cases.append(CaseLogits(case, log_probabilities(probs, reference.task.multilabel), label))
    settings = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.lts)}
    cfg = LTSConfig(**settings)
    wall, cpu = time.perf_counter(), time.process_time()
    net, record = fit_lts(cases, cfg)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    result = {"label": args.label, "settings": settings, "cases": len(cases),
              "voxels": sum(int(c.label.numel()) for c in cases), "fit_wall_s": round(wall, 1),
              "fit_cpu_s": round(cpu, 1), "nll_fit_cases_before": heldout_nll(None, cases),
              "nll_fit_cases_after": heldout_nll(net, cases), "heldout_nll_before": record["nll_before"],
              "heldout_nll_after": record["nll_after"], "epochs": record["epochs"], "best_epoch": record["best_epoch"],
              "config": record["config"], "chosen": record["chosen"], "load_1min": os.getloadavg()[0],
              "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "machine": platform.node()[:0] or
              platform.machine(), "python": sys.version.split()[0], "torch": torch.__version__}
    runs = json.loads(args.output.read_text()) if args.output.exists() else []
    args.output.write_text(json.dumps(runs + [result], indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "config"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
