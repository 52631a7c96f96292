"""The members' spread as the scale of the normalised volume interval (statement ``volume_members``): the spread
against an independent count of each member's masks, the interval against a hand computation, its coverage over
random splits of synthetic cases, and the refusals when members are asked for but absent."""
from __future__ import annotations

import csv
import json
import math

import nibabel as nib
import numpy as np
import pytest

from mcseg.new_cases import main as new_cases
from mcseg.statements.intervals import available, scores
from mcseg.statements.table import read_table
from mcseg.statements.validity import split_rows, summarise_rows
from tests.statements.conftest import CALIBRATION, NEW, SPACING
from tests.statements.test_validity import synthetic_table
from tests.tool_outputs import make_monai

NAMES = ["--class-names", "background", "left", "right"]


@pytest.fixture(scope="module")
def members(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("members")
    return {"fit": [make_monai(root / f"fit_{m}", folders["fit_labels"], noise=1.6, seed=10 + m) for m in range(3)],
            "new": [make_monai(root / f"new_{m}", folders["root"] / "new_labels", noise=1.6, seed=20 + m)
                    for m in range(3)]}


def _run(folders, out, *extra):
    return new_cases(["--fit", str(folders["fit"]), "--reference", str(folders["labels"]), "--apply",
                      str(folders["new"]), "-o", str(out), *NAMES, *extra])


def _members(option, folders):
    return [option, *map(str, folders)]


def _spread(member_dirs, case):
    """An independent spread: each member file's arg-max counted per class, in mL with the fixture's spacing."""
    volumes = []
    for folder in member_dirs:
        probs = np.asarray(nib.load(str(folder / case / f"{case}_trans.nii.gz")).dataobj)
        labels = probs.reshape(*probs.shape[:3], -1).argmax(-1)
        volumes.append([(labels == k).sum() * np.prod(SPACING) / 1000 for k in (1, 2)])
    return np.std(np.array(volumes), axis=0, ddof=1)


def test_members_spread_scales_the_interval(folders, members, tmp_path):
    out = tmp_path / "out"
    assert _run(folders, out, "--alpha", "0.2", *_members("--fit-members", members["fit"]),
                *_members("--apply-members", members["new"])) == 0
    calibration, new = read_table(out / "calibration_cases.csv"), read_table(out / "new_cases.csv")
    for table, dirs, cases in ((calibration, members["fit"], CALIBRATION), (new, members["new"], NEW)):
        for i in (0, 5):
            assert np.allclose(table.figures["volume_members_sd_ml"][i], _spread(dirs, cases[i]), rtol=1e-6)
    assert calibration.figures["volume_members_sd_ml"].max() > 0
    # the interval by hand: the 17th smallest of |V_true - V| / max(sd, voxel), k = ceil(21 x 0.8)
    f = calibration.figures
    with (out / "statements.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for k, structure in enumerate(calibration.structures):
        voxel = f["voxel_ml"][0, k]  # the file's float32 zooms
        s = np.abs(f["volume_true_ml"][:, k] - f["volume_mask_ml"][:, k]) / np.maximum(
            f["volume_members_sd_ml"][:, k], voxel)
        q = np.sort(s)[16]
        for i in range(len(NEW)):
            row = rows[2 * i + k]
            assert row["structure"] == structure
            half = q * max(new.figures["volume_members_sd_ml"][i, k], voxel)
            assert math.isclose(float(row["volume_members_upper_ml"]), float(row["volume_mask_ml"]) + half,
                                rel_tol=1e-9)
            assert math.isclose(float(row["volume_members_lower_ml"]), max(float(row["volume_mask_ml"]) - half, 0),
                                abs_tol=1e-12)
            assert row["volume_members_covered"] == str(
                float(row["volume_members_lower_ml"]) <= float(row["volume_true_ml"])
                <= float(row["volume_members_upper_ml"]))
    record = json.loads((out / "statements.json").read_text())
    assert record["normalised_volume_scales"]["volume_members"].startswith("members' sd")
    assert record["normalised_volume_scales"]["volume_normalised"].startswith("Poisson-binomial sd")
    assert record["members"]["fit"] == [str(d.resolve()) for d in members["fit"]]


@pytest.mark.slow
def test_members_of_unlabelled_new_cases_are_read_on_their_images(folders, members, tmp_path):
    """New cases without labels: the members read on their images' grid give the same intervals."""
    found = []
    for name, reference, extra in (("labelled", folders["labels"], []),
                                   ("blind", folders["fit_labels"], ["--images", str(folders["images"])])):
        assert new_cases(["--fit", str(folders["fit"]), "--reference", str(reference), "--apply", str(folders["new"]),
                          "-o", str(tmp_path / name), *NAMES, *extra, *_members("--fit-members", members["fit"]),
                          *_members("--apply-members", members["new"])]) == 0
        with (tmp_path / name / "statements.csv").open() as handle:
            found.append(list(csv.DictReader(handle)))
    for key in ("volume_members_sd_ml", "volume_members_lower_ml", "volume_members_upper_ml"):
        assert [r[key] for r in found[0]] == [r[key] for r in found[1]]


def test_without_members_the_scale_is_the_poisson_binomial_one(folders, tmp_path):
    out = tmp_path / "out"
    assert _run(folders, out) == 0
    record = json.loads((out / "statements.json").read_text())
    assert list(record["normalised_volume_scales"]) == ["volume_normalised"]
    assert record["members"].startswith("none")
    assert "volume_members_upper_ml" not in next(csv.DictReader((out / "statements.csv").open()))


def test_members_asked_for_but_absent_are_refused(folders, members, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(folders, out, *_members("--fit-members", members["fit"])) == 2
    assert "--fit-members without --apply-members" in capsys.readouterr().err and not out.exists()
    assert _run(folders, out, *_members("--fit-members", members["fit"][:1]),
                *_members("--apply-members", members["new"][:1])) == 2
    assert "one member has no spread" in capsys.readouterr().err and not out.exists()
    # the new cases' members given for the calibration cases: they hold none of them
    assert _run(folders, out, *_members("--fit-members", members["new"][:2]),
                *_members("--apply-members", members["new"][:2])) == 2
    err = capsys.readouterr().err
    assert f"member folder {members['new'][0]} has no prediction of case {CALIBRATION[0]}" in err
    assert not out.exists()
    # a table without the members' spread cannot give the members' statement
    table = synthetic_table(30)
    assert "volume_members" not in available(table)
    with pytest.raises(ValueError, match="volume_members.*needs volume_members_sd_ml.*--fit-members"):
        scores(table, "volume_members")


def test_members_interval_covers_on_average_over_splits():
    table = synthetic_table(300, seed=1)
    rng = np.random.default_rng(2)
    spread = rng.uniform(0.05, 0.4, (300, 1))  # members that see the error's scale, with noise
    table.figures["volume_members_sd_ml"] = spread
    table.figures["volume_true_ml"] = table.figures["volume_mask_ml"] + spread * rng.normal(size=(300, 1))
    rows = split_rows(table, 60, [0.1, 0.2], repeats=60, seed=0)
    summary = {(e["alpha"], e["statement"]): e for e in summarise_rows(rows)}
    for alpha in (0.1, 0.2):
        entry = summary[alpha, "volume_members"]
        assert 1 - alpha - 3 * entry["se"] - 0.01 <= entry["mean_coverage"] <= 1 - alpha + 1 / 61 + 3 * entry["se"]
        # the scale that sees the noise gives narrower intervals than the absolute score
        assert entry["mean_width"] < summary[alpha, "volume"]["mean_width"]


@pytest.mark.slow  # 30 cases with 3 members each, twice; tests/test_folder_workers.py covers the plain route fast
def test_two_workers_write_the_bytes_of_one_with_members_images_and_weights(folders, members, tmp_path):
    """--workers 2 on the route where each case reads most: the members' masks, new cases without labels (their
    grid from --images), the image statistics of --shift weighted; every file as with one worker."""
    from tests.test_case_workers import written_bytes

    outs = []
    for workers in ("1", "2"):
        out = tmp_path / workers / "out"
        assert new_cases(["--fit", str(folders["fit"]), "--reference", str(folders["fit_labels"]), "--apply",
                          str(folders["new"]), "-o", str(out), *NAMES, "--images", str(folders["images"]),
                          "--fit-images", str(folders["images"]), "--shift", "weighted", "--figure", "--no-html",
                          *_members("--fit-members", members["fit"]), *_members("--apply-members", members["new"]),
                          "--workers", workers]) == 0
        outs.append(written_bytes(out))
    assert "statements.png" in outs[0] and outs[0].keys() == outs[1].keys()
    for name in outs[0]:
        assert outs[0][name] == outs[1][name], name
