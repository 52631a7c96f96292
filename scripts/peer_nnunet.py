"""The file work of scripts/peer_nnunet.sh: one mcseg run's split in nnU-Net v2's layout, and the two results side
by side (nnU-Net's probabilities are read by mcseg-evaluate-folder --format nnunet, from its npz and pkl).

    python scripts/peer_nnunet.py convert RUN_DIR DATA_ROOT WORK DATASET_ID
    python scripts/peer_nnunet.py splits RUN_DIR PREPROCESSED_DATASET_DIR
    python scripts/peer_nnunet.py compare RUN_DIR NNUNET_SUMMARY TIMES_JSON
    python scripts/peer_nnunet.py table RESULTS

``convert`` links the run's training and validation cases into ``WORK/nnUNet_raw/DatasetNNN_Hippocampus``
(``imagesTr/<case>_0000.nii.gz``, ``labelsTr``; the test cases into ``imagesTs``, their labels into
``WORK/labelsTs`` with a dataset.json for mcseg-evaluate-folder). ``splits`` writes nnU-Net's
``splits_final.json`` with one fold: the run's training cases train, its validation cases validate,
so both tools learn from and select on the same cases and neither sees the test split.
``table`` writes RESULTS/table.md from the small tables scripts/nnunet_calibration.sh keeps (the mcseg run's
test evaluation in ``mcseg/``, nnU-Net's ``validation/``, ``test/`` and ``test_temperature/``), with the columns of
the uncertainty study (scripts/uncertainty_study.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path



def read_split(run_dir: Path) -> dict[str, list[str]]:
    """The split of an mcseg run directory (its split.json), or a split.json itself."""
    path = run_dir if run_dir.is_file() else run_dir / "split.json"
    if not path.is_file():
        sys.exit(f"{path}: missing; RUN_DIR must be an mcseg run directory (it writes split.json when it starts) "
                 "or a split.json")
    split = json.loads(path.read_text())
    missing = [k for k in ("train", "val", "test") if not split.get(k)]
    if missing:
        sys.exit(f"{path}: no {', '.join(missing)} cases")
    return split


def _link(src: Path, dst: Path) -> None:
    if not src.is_file():
        sys.exit(f"{src}: missing (the run's split names a case the data folder does not hold)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    dst.symlink_to(src.resolve())


def convert(run_dir: Path, data_root: Path, work: Path, dataset_id: int) -> None:
    split = read_split(run_dir)
    source = json.loads((data_root / "dataset.json").read_text())
    raw = work / "nnUNet_raw" / f"Dataset{dataset_id:03d}_Hippocampus"
    for case in split["train"] + split["val"]:
        _link(data_root / "imagesTr" / f"{case}.nii.gz", raw / "imagesTr" / f"{case}_0000.nii.gz")
        _link(data_root / "labelsTr" / f"{case}.nii.gz", raw / "labelsTr" / f"{case}.nii.gz")
    for case in split["test"]:
        _link(data_root / "imagesTr" / f"{case}.nii.gz", raw / "imagesTs" / f"{case}_0000.nii.gz")
        _link(data_root / "labelsTr" / f"{case}.nii.gz", work / "labelsTs" / f"{case}.nii.gz")
    labels = {name.lower(): int(value) for value, name in source["labels"].items()}
    (raw / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "MRI"}, "labels": labels,
        "numTraining": len(split["train"]) + len(split["val"]), "file_ending": ".nii.gz",
    }, indent=1))
    # the same class names as nnU-Net's dataset.json (mcseg-evaluate-folder checks that both sides agree)
    (work / "labelsTs" / "dataset.json").write_text(json.dumps({"labels": {str(v): k for k, v in labels.items()}},
                                                               indent=1))
    print(f"convert: {len(split['train'])} train + {len(split['val'])} val cases -> {raw}; "
          f"{len(split['test'])} test cases -> {raw / 'imagesTs'}")


def splits(run_dir: Path, preprocessed: Path) -> None:
    split = read_split(run_dir)
    preprocessed.mkdir(parents=True, exist_ok=True)
    (preprocessed / "splits_final.json").write_text(json.dumps([{"train": split["train"], "val": split["val"]}],
                                                               indent=1))
    print(f"splits: fold 0 = the run's {len(split['train'])} training / {len(split['val'])} validation cases")


def _row(name: str, summary: dict, minutes: float | None) -> str:
    per_class = summary["per_class"]
    dice = " / ".join(f"{per_class[c]['dice']['mean']:.3f}" for c in summary["classes"])
    time = f"{minutes:.1f}" if minutes is not None else "-"
    return (f"| {name} | {time} | {dice} / {summary['mean_foreground_dice']:.3f} | "
            f"{summary['mean_foreground_hd95_mm']:.2f} | {summary['mean_ece']:.3f} | {summary['mean_classwise_ece']:.3f} |")


def compare(run_dir: Path, nnunet_summary: Path, times: Path) -> None:
    minutes = json.loads(times.read_text())
    mcseg = json.loads((run_dir / "eval" / "test" / "summary.json").read_text())
    nnunet = json.loads(nnunet_summary.read_text())
    print("| tool | training wall time (min) | test Dice per class / mean | HD95 mean (mm) | ECE | classwise ECE |")
    print("|---|---|---|---|---|---|")
    print(_row(f"mcseg ({run_dir.name})", mcseg, minutes.get("mcseg")))
    print(_row("nnU-Net v2 3d_fullres, same budget", nnunet, minutes.get("nnunet_train")))
    print(f"nnU-Net: planning and preprocessing {minutes.get('nnunet_prepare', float('nan')):.1f} min, "
          f"start-up and final validation {minutes.get('nnunet_startup_validate', float('nan')):.1f} min, "
          f"test prediction {minutes.get('nnunet_predict', float('nan')):.1f} min (not in the budget)")


def table(results: Path) -> str:
    """RESULTS/table.md: the mcseg run raw and scaled beside nnU-Net's validation and test, raw and scaled."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from uncertainty_study import _rows, _scaled
    from uncertainty_study import table as markdown

    def summary(name: str) -> dict | None:
        path = results / name / "summary.json"
        return json.loads(path.read_text()) if path.is_file() else None

    budget = json.loads((results / "budget.json").read_text()) if (results / "budget.json").is_file() else {}
    nnunet = (f"nnU-Net v2 3d_fullres, {budget.get('epochs', '?')} epochs of {budget.get('iterations_per_epoch', '?')} "
              f"iterations")
    rows = []
    for label, predictor, s in (("mcseg, experiment=hippocampus_cpu", "test", summary("mcseg")),
                                ("mcseg, experiment=hippocampus_cpu", "test + T (its validation)",
                                 _scaled(summary("mcseg") or {})),
                                (nnunet, "validation (fold 0, its own)", summary("validation")),
                                (nnunet, "test", summary("test")),
                                (nnunet, "test + T (fit on its validation)", summary("test_temperature"))):
        if s is not None:
            rows += _rows(label, predictor, [s], 0.0)
    text = markdown(rows)
    (results / "table.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert")
    c.add_argument("run_dir", type=Path)
    c.add_argument("data_root", type=Path)
    c.add_argument("work", type=Path)
    c.add_argument("dataset_id", type=int)
    s = sub.add_parser("splits")
    s.add_argument("run_dir", type=Path)
    s.add_argument("preprocessed", type=Path)
    tb = sub.add_parser("table")
    tb.add_argument("results", type=Path)
    cm = sub.add_parser("compare")
    cm.add_argument("run_dir", type=Path)
    cm.add_argument("nnunet_summary", type=Path)
    cm.add_argument("times", type=Path)
    a = p.parse_args(argv)
    if a.command == "convert":
        convert(a.run_dir, a.data_root, a.work, a.dataset_id)
    elif a.command == "splits":
        splits(a.run_dir, a.preprocessed)
    elif a.command == "table":
        print(table(a.results))
    else:
        compare(a.run_dir, a.nnunet_summary, a.times)


if __name__ == "__main__":
    main()
