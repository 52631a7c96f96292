"""The per-case view of report.html: a case's volumes as stacks of small images, one stack per layer.

Each case is drawn on its last voxel axis (the axial one of an RAS-like NIfTI), at most ``max_slices`` slices
evenly spread over it (the slider starts at the slice with the most label and prediction), each slice resampled
(nearest voxel) to at most ``max_size`` pixels on its longer side, the pixel aspect ratio set from the voxel
spacing. Layers: the background (the image windowed to the 1st-99th percentile of its drawn voxels, as JPEG;
without an image the foreground probability 1 - p_0, else the prediction, and the page says so), then RGBA PNG
overlays: the label (outlines, one colour per class), the prediction (filled, alpha 0.35), the uncertainty (the
predictive entropy over log K in 32 levels, magma, alpha by value, below 1/64 transparent), the conformal
"possible" (orange outline) and "sure" (green fill) masks. A layer whose grid differs from the prediction's is
left out and named. Volumes are sampled as soon as they are read: the work after reading grows with the pixels
drawn, not with the voxels.
"""
from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass, field

import numpy as np

from mcseg.evaluation.case_files import CaseFiles

LAYERS = ("label", "prediction", "uncertainty", "possible", "sure")
CLASS_COLOURS = np.array([(0, 0, 0), (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
                          (140, 86, 75), (227, 119, 194), (188, 189, 34), (23, 190, 207)], dtype=np.uint8)
TRUTH_COLOURS = np.array([(0, 0, 0), (255, 255, 0), (0, 255, 255), (255, 0, 255), (255, 255, 255)], dtype=np.uint8)


def _read(path):
    import nibabel as nib

    img = nib.load(str(path))
    return np.asanyarray(img.dataobj), tuple(float(z) for z in img.header.get_zooms()[:3])


def _labels(array: np.ndarray, shape: tuple[int, ...], take) -> np.ndarray:
    """A label map on the sampled grid of ``shape`` (``take``): as it is, or of channel-last region masks the
    highest region set per voxel; another grid is refused."""
    if array.shape == shape:
        return np.rint(take(_three(array))).astype(np.int64)
    if array.shape[:-1] == shape:  # multilabel, channel last: 1 + the last region set (0: none)
        on = take(array.reshape(*_three(array[..., 0]).shape, array.shape[-1])) > 0.5
        return np.where(on.any(-1), on.shape[-1] - np.argmax(on[..., ::-1], -1), 0)
    raise ValueError(f"grid {array.shape} differs from the prediction's {shape}")


def _three(array: np.ndarray) -> np.ndarray:
    return array[..., None] if array.ndim == 2 else array


def _uri(pixels: np.ndarray, fmt: str) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    image = Image.fromarray(pixels)
    if fmt == "JPEG":
        image.save(buffer, "JPEG", quality=80)
    else:
        image.save(buffer, "PNG", optimize=True)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def _outline(mask: np.ndarray) -> np.ndarray:
    """The mask's voxels with a 4-neighbour outside it (a 2D slice)."""
    padded = np.pad(mask, 1)
    inner = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return mask & ~inner


def _rgba(shape, colour_of: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    out = np.zeros((*shape, 4), dtype=np.uint8)
    out[..., :3], out[..., 3] = colour_of, alpha
    return out


def _magma(values: np.ndarray) -> np.ndarray:
    from matplotlib import colormaps

    return (colormaps["magma"](values)[..., :3] * 255).astype(np.uint8)


class _Grid:
    """Where a case is sampled (module docstring): the in-plane indices ``xs``, ``ys`` and the ``slices``."""

    def __init__(self, shape, spacing, max_size: int, max_slices: int):
        nx, ny, depth = shape[0], shape[1], shape[2]
        scale = min(1.0, max_size / max(nx, ny))
        self.xs = np.linspace(0, nx - 1, max(1, round(nx * scale))).round().astype(int)
        self.ys = np.linspace(0, ny - 1, max(1, round(ny * scale))).round().astype(int)
        self.slices = np.unique(np.linspace(0, depth - 1, min(depth, max_slices)).round().astype(int))
        sx, sy = spacing[0] or 1.0, spacing[1] or 1.0
        self.size = (len(self.xs), len(self.ys))  # (width, height) in pixels
        physical = (nx * sx, ny * sy)
        self.display = (round(400 * physical[0] / max(physical)), round(400 * physical[1] / max(physical)))

    def take(self, volume: np.ndarray) -> np.ndarray:
        """The sampled voxels of a volume (``X x Y x Z [x C]``): what every later step works on."""
        return np.asarray(volume[self.xs][:, self.ys][:, :, self.slices])

    @staticmethod
    def cut(sampled: np.ndarray, index: int) -> np.ndarray:
        """The ``index``-th sampled slice, x to the right, y up."""
        return sampled[:, :, index].T[::-1]


@dataclass
class CaseVolumes:
    """One case's volumes as the view draws them (None: not found): ``probabilities`` ``X x Y x Z x K`` (channel
    last), ``prediction`` a label map (or channel-last region masks), ``label``, ``image``, ``uncertainty`` (the
    predictive entropy in nats), the conformal ``sure`` / ``possible`` masks (one per class); ``names``: the file
    each came from, for the notes; ``notes``: what the caller says of the case (e.g. its review flag)."""

    case: str
    source: str
    dice: float
    spacing: tuple[float, ...]
    probabilities: np.ndarray | None = None
    prediction: np.ndarray | None = None
    label: np.ndarray | None = None
    image: np.ndarray | None = None
    uncertainty: np.ndarray | None = None
    sure: list[np.ndarray] = field(default_factory=list)
    possible: list[np.ndarray] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_case_volumes(files: CaseFiles) -> CaseVolumes:
    """The volumes of the files of a case (:mod:`mcseg.evaluation.case_files`)."""
    def read(path):
        return None if path is None else _read(path)[0]

    spacing = _read(files.prediction if files.prediction is not None else files.probabilities)[1]
    image = read(files.image)
    return CaseVolumes(files.case, files.source, files.dice, spacing, read(files.probabilities), read(files.prediction),
                       read(files.label), image[..., 0] if image is not None and image.ndim == 4 else image,
                       read(files.uncertainty), [read(p) for p in files.sure], [read(p) for p in files.possible],
                       {k: getattr(files, k).name for k in ("label", "image", "uncertainty")
                        if getattr(files, k) is not None})


def render_case(files: CaseFiles, max_size: int = 160, max_slices: int = 32) -> dict:
    """The case of ``files`` as the page draws it (:func:`render_volumes`)."""
    return render_volumes(read_case_volumes(files), max_size, max_slices)


def render_volumes(case: CaseVolumes, max_size: int = 160, max_slices: int = 32) -> dict:
    """The case as the page draws it (module docstring): its slices' data URIs per layer, the notes on what is
    drawn instead or left out, and its title."""
    notes = list(case.notes)
    probs, raw = case.probabilities, case.prediction
    if probs is not None:
        spatial = probs.shape[:-1]
    else:
        spatial = raw.shape if raw.ndim <= 3 else raw.shape[:-1]  # 4D: channel-last region masks
    shape = _three(np.empty(spatial, dtype=bool)).shape
    grid = _Grid(shape, case.spacing, max_size, max_slices)
    take = grid.take
    if probs is not None:
        probs = take(probs.reshape(*shape, probs.shape[-1])).astype(np.float32)
    pred = _labels(raw, spatial, take) if raw is not None else np.argmax(probs, -1)
    layers: dict[str, np.ndarray] = {"prediction": pred}
    if case.label is None:
        notes.append("no label found: layer not drawn")
    else:
        try:
            layers["label"] = _labels(case.label, spatial, take)
        except ValueError as exc:
            notes.append(f"label {case.names.get('label', '')}: {exc}: not drawn")
    uncertainty = _uncertainty(case, probs, shape, take, notes)
    if uncertainty is not None:
        layers["uncertainty"] = uncertainty
    for kind in ("sure", "possible"):
        masks = [_three(m) for m in getattr(case, kind)]
        if not masks:
            notes.append(f"no conformal {kind} mask: layer not drawn")
        elif any(m.shape != shape for m in masks):
            notes.append(f"conformal {kind} mask grid differs from the prediction's {shape}: not drawn")
        else:
            classes = np.zeros(pred.shape, dtype=np.int64)
            for k, mask in enumerate(masks, start=1):
                classes[(take(mask) > 0) & (classes == 0)] = k
            layers[kind] = classes
    background, kind = _background(case, probs, pred, shape, take, notes)
    weight = (pred > 0).sum((0, 1)) + ((layers["label"] > 0).sum((0, 1)) if "label" in layers else 0)
    count = len(grid.slices)
    return {"id": case.case, "source": case.source,
            "dice": None if math.isnan(case.dice) else round(case.dice, 4), "background": kind, "notes": notes,
            "slices": [int(z) for z in grid.slices], "start": int(np.argmax(weight)), "size": grid.size,
            "display": grid.display,
            "layers": {"image": [_uri(grid.cut(background, i), "JPEG") for i in range(count)],
                       **{name: [_uri(_overlay(name, grid.cut(layers[name], i)), "PNG") for i in range(count)]
                          for name in LAYERS if name in layers}}}


def _uncertainty(case: CaseVolumes, probs, shape, take, notes) -> np.ndarray | None:
    """The predictive entropy over log K (in [0, 1]): the saved map, else from the saved probabilities."""
    if case.uncertainty is not None:
        entropy = _three(case.uncertainty)
        if entropy.shape != shape:
            notes.append(f"uncertainty {case.names.get('uncertainty', '')}: grid {entropy.shape} differs from "
                         f"{shape}: not drawn")
            return None
        entropy = take(entropy).astype(np.float32)
        k = probs.shape[-1] if probs is not None else 2
        return np.clip(entropy / math.log(max(k, 2)), 0, 1)
    if probs is None:
        notes.append("no uncertainty map or probabilities saved (evaluation.save_uncertainty, "
                      "inference.save_probabilities): layer not drawn")
        return None
    p = np.clip(probs, 1e-7, 1)
    return np.clip(-(p * np.log(p)).sum(-1) / math.log(max(p.shape[-1], 2)), 0, 1)


def _background(case: CaseVolumes, probs, pred, shape, take, notes) -> tuple[np.ndarray, str]:
    """The image windowed to uint8, else the foreground probability, else the prediction (said in ``notes``)."""
    if case.image is not None:
        image = _three(case.image)
        if image.shape == shape:
            image = take(image).astype(np.float32)
            lo, hi = np.percentile(image, (1, 99))
            return (np.clip((image - lo) / max(hi - lo, 1e-6), 0, 1) * 255).astype(np.uint8), "image"
        notes.append(f"image {case.names.get('image', '')}: grid {image.shape} differs from the prediction's {shape}")
    if probs is not None:
        notes.append("no image found (report --images): the foreground probability 1 - p_0 is drawn instead")
        return ((1 - probs[..., 0]) * 255).clip(0, 255).astype(np.uint8), "probability"
    notes.append("no image or probabilities found (report --images): the prediction is drawn instead")
    return (255 * (pred > 0)).astype(np.uint8), "prediction"


def _overlay(name: str, values: np.ndarray) -> np.ndarray:
    """An RGBA slice of layer ``name`` (module docstring)."""
    if name == "uncertainty":  # 32 levels, below 1/64 transparent: small PNGs of maps that are nowhere zero
        levels = np.round(values * 32) / 32
        shown = levels > 0
        return _rgba(values.shape, _magma(levels) * shown[..., None], (levels * 230 * shown).astype(np.uint8))
    classes = np.clip(values.astype(np.int64), 0, None)
    if name == "label":
        edge = np.zeros(values.shape, dtype=bool)
        for k in np.unique(classes[classes > 0]):
            edge |= _outline(classes == k)
        return _rgba(values.shape, TRUTH_COLOURS[np.where(edge, 1 + (classes - 1) % 4, 0)], edge * 255)
    if name == "prediction":
        return _rgba(values.shape, CLASS_COLOURS[classes % len(CLASS_COLOURS)], (classes > 0) * 90)
    if name == "sure":
        return _rgba(values.shape, np.array([44, 200, 44], np.uint8), (classes > 0) * 140)
    edge = _outline(classes > 0)  # possible
    return _rgba(values.shape, np.array([255, 140, 0], np.uint8), edge * 255)
