"""Other tools' prediction folders, one class per format, and the one list of them (:data:`FORMATS`).

Saved probabilities enter mcseg at the "probabilities" arrow (docs/protocol.md, "Evaluating predictions made by
another tool"): every case becomes ``C x *S`` probabilities in the reference label's file voxel order (x, y[, z]),
and from there they take the evaluator's path unchanged.

Formats (each a :class:`~mcseg.evaluation.formats.base.PredictionFormat`: ``detect``, ``read``,
``write``): nnU-Net v2's npz + pkl + label map (:mod:`.nnunet`), MONAI ``SaveImage``'s and mcseg's channel-last
NIfTI maps (:mod:`.channel_last`). Detection, ``--format`` and ``mcseg-calibrate-folder`` go through
:data:`FORMATS`: a new format is one class and one entry there.

Every check is one line (:class:`~mcseg.data.reference.FolderError`) naming the case, the file and the size of the
deviation: a stated format the folder contradicts, a case missing on either side, another grid than the label's
(shape after the axis order, spacing, affine), a channel count other than the task's, values outside [0, 1],
softmax channels that do not sum to 1, and each format's own (nnU-Net: the label map against its rule).
"""
from __future__ import annotations

from pathlib import Path

from mcseg.registry import unique
from mcseg.data.reference import FolderError, Task, case_volumes
from mcseg.evaluation.formats.base import CasePrediction, PredictionFormat
from mcseg.evaluation.formats.channel_last import ChannelLastFormat, McsegFormat, MonaiFormat
from mcseg.evaluation.formats.nnunet import NnUNetFormat

__all__ = ["FORMATS", "CasePrediction", "ChannelLastFormat", "McsegFormat", "MonaiFormat", "NnUNetFormat",
           "PredictionFormat", "checked_formats", "declared_classes", "detect_format", "format_names", "open_folder", "prediction_files"]

# every prediction format mcseg reads and writes, in the order detection lists them
FORMATS: list[type[PredictionFormat]] = [NnUNetFormat, MonaiFormat, McsegFormat]


def checked_formats() -> list[type[PredictionFormat]]:
    """:data:`FORMATS`, each name (``--format``) and file pattern once: a format whose name or pattern another has
    taken would take that one's files, so it is refused naming both (checked at import and at every use, since an
    entry may be added later)."""
    unique(FORMATS, lambda fmt: fmt.format, "prediction format")
    unique(FORMATS, lambda fmt: fmt.pattern(), "prediction file pattern")
    return FORMATS


checked_formats()


def format_names() -> list[str]:
    """The ``--format`` names of :data:`FORMATS` (read when a parser is built, so an entry added is offered)."""
    return [fmt.format for fmt in checked_formats()]


def _held(folder: Path, **options) -> dict[type[PredictionFormat], int]:
    """The formats whose case files ``folder`` holds, with how many."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: the prediction folder is not a folder")
    counts = {fmt: fmt.detect(folder, **options) for fmt in checked_formats()}
    return {fmt: n for fmt, n in counts.items() if n}


def prediction_files(folder: Path, **options) -> str | None:
    """What prediction files ``folder`` holds, e.g. ``4 <case>.npz (nnU-Net v2)``; None when it holds none."""
    try:
        found = [f"{n} {fmt.pattern(**options)} ({fmt.tool})" for fmt, n in _held(Path(folder), **options).items()]
        maps = len(case_volumes(Path(folder), derived_ok=True))
    except FolderError as exc:
        return f"files of a prediction folder ({exc})"
    return ", ".join(found) or (f"{maps} label map(s)" if maps else None)


def detect_format(folder: Path, stated: str = "auto", **options) -> type[PredictionFormat]:
    """The folder's format; a stated one the folder contradicts is an error naming what it holds."""
    folder = Path(folder)
    held = _held(folder, **options)
    alone = next((fmt for fmt in FORMATS if fmt.label_maps_alone), None)  # label maps, scored without calibration
    if stated != "auto":
        chosen = next((fmt for fmt in FORMATS if fmt.format == stated), None)
        if chosen is None:
            raise FolderError(f"--format {stated}: expected auto or one of {', '.join(format_names())}")
        if chosen is alone and not held and case_volumes(folder):
            return chosen
        if chosen not in held:
            listed = ", ".join(f"{n} {f.pattern(**options)} ({f.tool})" for f, n in held.items()) or \
                "no probability files"
            raise FolderError(f"{folder}: --format {stated} contradicts the folder: it holds {listed}, "
                              f"and no {chosen.pattern(**options)}")
        return chosen
    if not held and alone is not None and case_volumes(folder):
        return alone
    if len(held) != 1:
        listed = (", ".join(f"{n} {f.pattern(**options)}" for f, n in held.items()) or
                  "none of " + ", ".join(f.pattern(**options) for f in FORMATS))
        raise FolderError(f"{folder}: cannot tell the format ({listed}); pass --format {'|'.join(format_names())}")
    return next(iter(held))


def open_folder(path: str | Path, task: Task, fmt: str = "auto", monai_postfix: str = "trans",
                probs_dir: Path | None = None) -> PredictionFormat:
    """The prediction folder ``path`` in its format (detected, or stated and checked); ``probs_dir``: mcseg's
    ``<case>_probs`` in another folder than the label maps of ``path``."""
    if probs_dir is not None:
        if fmt not in ("auto", McsegFormat.format):
            raise FolderError(f"--probs is for mcseg's <case>_probs.nii.gz, not --format {fmt}")
        return McsegFormat(Path(path), task, probs_dir=probs_dir, monai_postfix=monai_postfix)
    return detect_format(Path(path), fmt, monai_postfix=monai_postfix)(Path(path), task, monai_postfix=monai_postfix)


def declared_classes(pred_dir: Path) -> Path | None:
    """The dataset.json a prediction folder comes with (nnU-Net's: in it, or up to two folders above); None for
    a folder of a format without one, or of no format."""
    try:
        fmt = detect_format(Path(pred_dir))
    except FolderError:
        return None
    return fmt.declared_classes(Path(pred_dir))
