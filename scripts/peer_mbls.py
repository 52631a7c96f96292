"""The file work of scripts/peer_mbls.sh: mcseg's 2D hippocampus slices in the layout the margin-loss
authors' hippocampus loader reads, a cap on their epoch, and the two training rates side by side.

    python scripts/peer_mbls.py export WORK DATA_ROOT PATCH [--split-from RUN_DIR]   (mcseg's venv)
    python scripts/peer_mbls.py h5 WORK                                               (the authors' venv)
    python scripts/peer_mbls.py rates WORK BATCH WARMUP

``export`` loads the cases as mcseg trains on them (the ``dataset=hippocampus`` preset: its
normalisation, its split, or the split of an mcseg run with ``--split-from``) and writes, per case,
``WORK/slices/<train|valid|test>/<case>.npz``: ``img`` (S x PATCH x PATCH float32) and ``mask``
(S x PATCH x PATCH uint8), every slice across the preset's ``slice_axis`` centred in a PATCH x PATCH
frame (padded with 0, the hippocampus crops are at most 43 x 59 x 47 voxels). All training cases are
written; validation and test keep their first case only, since neither side's validation or test is
timed. ``WORK/split.json`` (that split) is what the mcseg runs train on (``dataset.split.file``).
``h5`` turns them into ``WORK/hcmps/<train|valid>/<case>.h5`` with datasets ``img`` and ``mask``: what
the authors' ``calibrate/data/hcmps.py`` (``HippocampusDataset``) reads, slices along the first axis.
Their ``test`` folder stays empty: the test phase that ends their tools/train_net.py (the base
``Trainer.test``) feeds a whole S x H x W volume to the 2D network as S channels and fails (their
test runs are tools/test_net.py); over no volume it logs NaNs and the run ends cleanly.
``capped_train_val_loader`` is a Hydra target for the authors' config (their venv imports this file):
their own loaders, the training one cut to ``max_batches`` batches, since their epoch is every slice.
``rates`` reads both tools' logs under ``WORK`` and prints samples/s after the warm-up and the ratio.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from datetime import datetime
from pathlib import Path

import numpy as np

SPLIT_DIRS = {"train": "train", "val": "valid"}  # mcseg's split -> the authors' folder (their test: none)


# ----------------------------------------------------------------- export (mcseg's venv)
def case_slices(image: np.ndarray, label: np.ndarray, axis: int, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """A case's slices across ``axis``, each centred in a ``patch`` x ``patch`` frame: (S x P x P image,
    S x P x P label). ``image`` is 1 x *S (mcseg's channels first), ``label`` *S."""
    from mcseg.data.sampling import crop_or_pad

    if image.ndim != 4 or image.shape[0] != 1 or label.shape != image.shape[1:]:
        raise ValueError(f"expected a 1-channel 3D case, got image {image.shape}, label {label.shape}")
    image, label = np.moveaxis(image[0], axis, 0), np.moveaxis(np.asarray(label), axis, 0)
    start = [(n - patch) // 2 for n in image.shape[1:]]
    img = crop_or_pad(image.astype(np.float32), start, (patch, patch))
    mask = crop_or_pad(label.astype(np.uint8), start, (patch, patch))
    return np.ascontiguousarray(img), np.ascontiguousarray(mask)


def timed_split(split: dict[str, list[str]]) -> dict[str, list[str]]:
    """Every training case; the first validation and test case (untimed on both sides)."""
    return {"train": list(split["train"]), "val": list(split["val"][:1]), "test": list(split["test"][:1])}


def export(work: Path, data_root: Path, patch: int, split_from: Path | None = None) -> None:
    from hydra import compose, initialize_config_dir
    from mcseg.config import CONFIG_DIR
    from mcseg.data.build import build_dataset, resolve_split

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=["dataset=hippocampus", f"dataset.root={data_root}"])
    dataset = build_dataset(cfg.dataset)
    if split_from is not None:
        from peer_nnunet import read_split  # an mcseg run's split.json, checked as for nnU-Net

        split = read_split(split_from)
    else:  # the preset's split, as a run of it makes it
        (work / "preset").mkdir(parents=True, exist_ok=True)
        preset = resolve_split(dataset, cfg.dataset, work / "preset").refs
        split = {name: [r.case_id for r in part] for name, part in preset.items()}
    split = timed_split(split)
    (work / "split.json").write_text(json.dumps(split, indent=1))
    refs = {r.case_id: r for r in dataset.case_refs()}
    axis = int(cfg.dataset.sampling.slice_axis)
    slices = 0
    for name, folder_name in SPLIT_DIRS.items():
        cases = split[name]
        folder = work / "slices" / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.npz"):
            stale.unlink()
        for case_id in cases:
            case = dataset.load(refs[case_id])
            img, mask = case_slices(case.image, case.label, axis, patch)
            np.savez(folder / f"{case_id}.npz", img=img, mask=mask)
            slices += len(img) if name == "train" else 0
    print(f"export: {len(split['train'])} training cases ({slices} slices of {patch} x {patch}, across axis {axis}), "
          f"1 validation case -> {work / 'slices'}; split (also 1 test case, mcseg's) -> {work / 'split.json'}")


# ----------------------------------------------------------------- the authors' side (their venv)
def to_h5(work: Path) -> None:
    import h5py

    n = 0
    for folder in SPLIT_DIRS.values():
        out = work / "hcmps" / folder
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("*.h5"):
            stale.unlink()
        for npz in sorted((work / "slices" / folder).glob("*.npz")):
            arrays = np.load(npz)
            with h5py.File(out / f"{npz.stem}.h5", "w") as f:  # uncompressed, like a plain h5py dump
                f["img"], f["mask"] = arrays["img"], arrays["mask"]
            n += 1
    (work / "hcmps" / "test").mkdir(exist_ok=True)
    for stale in (work / "hcmps" / "test").glob("*.h5"):
        stale.unlink()
    if not n:
        sys.exit(f"{work / 'slices'}: nothing to convert (run `peer_mbls.py export` first)")
    print(f"h5: {n} cases -> {work / 'hcmps'}/<train|valid>/<case>.h5 (test/ left empty)")


class CappedLoader:
    """``loader``'s first ``n`` batches, with the ``len`` and ``dataset`` the authors' trainer reads."""

    def __init__(self, loader, n: int) -> None:
        self.loader, self.n, self.dataset = loader, int(n), loader.dataset

    def __len__(self) -> int:
        return min(self.n, len(self.loader))

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i >= self.n:
                return
            yield batch


def capped_train_val_loader(max_batches: int, **kwargs):
    """The authors' ``calibrate.data.hcmps.get_train_val_loader(**kwargs)``, its training loader capped."""
    from calibrate.data.hcmps import get_train_val_loader

    train, valid, display = get_train_val_loader(**kwargs)
    return CappedLoader(train, max_batches), valid, display


# ----------------------------------------------------------------- rates
_THEIR_ITER = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO\]\[[^\]]*\] - Train Iter\[(\d+)/(\d+)\]")
_MCSEG_EPOCH = re.compile(r"epoch (\d+)/(\d+) (\{.*\})\s*$")


def their_rate(log_text: str, batch: int, warmup: int) -> tuple[float, int]:
    """Samples/s of the authors' loop from its per-iteration log lines (``log_period=1``): from the end
    of iteration ``warmup`` to the last one logged; returns (rate, timed iterations)."""
    stamps = {}
    for line in log_text.splitlines():
        m = _THEIR_ITER.match(line)
        if m:
            stamps[int(m.group(2))] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    last = max(stamps, default=0)
    if warmup not in stamps or last <= warmup:
        raise ValueError(f"the authors' log has iterations {sorted(stamps)}: none after the warm-up ({warmup})")
    seconds = (stamps[last] - stamps[warmup]).total_seconds()
    return (last - warmup) * batch / seconds, last - warmup


def mcseg_rate(log_text: str, batch: int, steps_per_epoch: int) -> tuple[float, int]:
    """Samples/s of mcseg from its epoch lines' ``train/samples_per_s`` (each timed over the epoch's
    training steps only), the first epoch left out as the warm-up; returns (rate, timed steps)."""
    rates = [ast.literal_eval(m.group(3))["train/samples_per_s"]
             for m in map(_MCSEG_EPOCH.search, log_text.splitlines()) if m]
    if len(rates) < 2:
        raise ValueError(f"mcseg's log has {len(rates)} epoch line(s): none after the warm-up epoch")
    samples = steps_per_epoch * batch
    timed = rates[1:]
    return len(timed) * samples / sum(samples / r for r in timed), len(timed) * steps_per_epoch


def rates(work: Path, batch: int, warmup: int) -> dict:
    runs = {"authors": [], "mcseg": []}
    for run in sorted(p for p in (work / "runs").iterdir() if p.is_dir()):
        side, _, _ = run.name.partition("-")
        if side == "authors":
            rate, n = their_rate((run / "train_net.log").read_text(), batch, warmup)
        elif side == "mcseg":
            rate, n = mcseg_rate((run / "train.log").read_text(), batch, warmup)
        else:
            continue
        runs[side].append({"run": run.name, "samples_per_s": round(rate, 3), "timed_steps": n})
    if not runs["authors"] or not runs["mcseg"]:
        sys.exit(f"{work / 'runs'}: need authors-* and mcseg-* runs")
    mean = {side: sum(r["samples_per_s"] for r in v) / len(v) for side, v in runs.items()}
    result = {"batch": batch, "warmup_steps": warmup, "runs": runs, "mean_samples_per_s": mean,
              "ratio_mcseg_over_authors": mean["mcseg"] / mean["authors"]}
    # Pair r ran authors first when r is odd, mcseg first when even (peer_mbls.sh alternates the order).
    print("| pair | ran first | authors, samples/s | mcseg, samples/s | mcseg / authors | timed steps |")
    print("|---|---|---|---|---|---|")
    by_pair = {side: {r["run"].split("-")[1]: r for r in v} for side, v in runs.items()}
    for pair in sorted(set(by_pair["authors"]) & set(by_pair["mcseg"]), key=int):
        a, m = by_pair["authors"][pair], by_pair["mcseg"][pair]
        first = "authors" if int(pair) % 2 else "mcseg"
        print(f"| {pair} | {first} | {a['samples_per_s']:.2f} | {m['samples_per_s']:.2f} | "
              f"{m['samples_per_s'] / a['samples_per_s']:.3f} | {a['timed_steps']} / {m['timed_steps']} |")
    print(f"mean: authors {mean['authors']:.2f}, mcseg {mean['mcseg']:.2f} samples/s; "
          f"mcseg / authors = {result['ratio_mcseg_over_authors']:.3f}")
    (work / "rates.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    positional = {"export": [("work", Path), ("data_root", Path), ("patch", int)], "h5": [("work", Path)],
                  "rates": [("work", Path), ("batch", int), ("warmup", int)]}
    for command, arguments in positional.items():
        parser = sub.add_parser(command)
        for name, kind in arguments:
            parser.add_argument(name, type=kind)
    sub.choices["export"].add_argument("--split-from", type=Path, help="an mcseg run directory whose split.json to use")
    a = p.parse_args(argv)
    {"export": lambda: export(a.work, a.data_root, a.patch, a.split_from), "h5": lambda: to_h5(a.work),
     "rates": lambda: rates(a.work, a.batch, a.warmup)}[a.command]()


if __name__ == "__main__":
    main()
