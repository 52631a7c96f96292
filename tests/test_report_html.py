"""report.html (mcseg/report/html.py): one self-contained page beside report.md, with report.md's tables, the
reliability bins' counts, and the per-case view bounded in size; what it draws without images is said on it.
The page in a real browser: tests/test_report_browser.py."""
from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest

from mcseg.report import cli
from mcseg.report.figures import pooled_reliability
from mcseg.report.html import markdown_html, write_html
from tests.report_runs import built_report


def _cases(page: str) -> list[dict]:
    found = re.search(r'<script type="application/json" id="case-data">(.*?)</script>', page, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return built_report(tmp_path_factory.mktemp("html"))


def test_the_page_is_beside_report_md_with_its_tables_and_requests_nothing(report):
    page, text = (report / "report.html").read_text(), (report / "report.md").read_text()
    tables = sum(1 for i, line in enumerate(text.splitlines()) if line.startswith("|")
                 and (i == 0 or not text.splitlines()[i - 1].startswith("|")))
    assert page.count('<table class="sortable">') == tables > 0
    assert "Wilcoxon signed-rank" in page and "Overrides common to all configurations" in page  # the protocol
    for attribute in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert attribute.startswith("data:"), f"the page refers to {attribute[:60]}"
    assert not re.search(r"https?://", page.split("<script>")[0].replace("http://www.w3.org/2000/svg", ""))
    assert "default-src 'none'" in page  # the page's own policy forbids any request
    assert '<img alt="reliability_selected.png" src="data:image/png;base64,' in page  # the figures, inline


def test_cases_are_drawn_worst_first_by_dice_at_most_n(report):
    cases = _cases((report / "report.html").read_text())
    assert len(cases) == 4
    dice = [c["dice"] for c in cases]
    assert dice == sorted(dice)
    assert {"image", "label", "prediction", "uncertainty", "sure", "possible"} <= set(cases[0]["layers"])
    assert cases[0]["background"] == "image" and not cases[0]["notes"]
    assert all(len(v) == len(cases[0]["slices"]) for v in cases[0]["layers"].values())


def test_the_reliability_bins_carry_the_pooled_voxel_counts(report, tmp_path):
    page = (report / "report.html").read_text()
    counts = [int(c) for c in re.findall(r'<rect class="bin" data-count="(\d+)"', page)]
    runs = sorted((report.parent / "runs").glob("margin*"))
    expected = pooled_reliability(runs, "test")[2]
    assert counts[-len(expected):] == [int(c) for c in expected] and sum(expected) > 0
    assert re.search(rf"{int(expected[-1])} voxels</title>", page)


def _rows(runs):
    from mcseg.report.collect import collect_runs
    from mcseg.report.table import build_rows

    return build_rows(collect_runs([runs], "test"), n_boot=0)


def test_the_size_options_bound_each_drawn_slice(report, tmp_path):
    from PIL import Image

    path = write_html(tmp_path, "# t", "t", _rows(report.parent / "runs"), "test", [], cases=1, max_size=12,
                      max_slices=3)
    (case,) = _cases(path.read_text())
    assert len(case["slices"]) == 3
    for layer in case["layers"].values():
        pixels = Image.open(io.BytesIO(base64.b64decode(layer[0].split(",", 1)[1])))
        assert max(pixels.size) == 12


def test_no_html_writes_no_page(report, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "write_html", lambda *a, **k: pytest.fail("report.html written with --no-html"))
    monkeypatch.setattr(cli, "reliability_histograms", lambda *a, **k: None)  # the figures are not under test
    assert cli.main([str(report.parent / "runs"), "--no-eval", "--bootstrap", "0", "--out", str(tmp_path),
                     "--no-html"]) == 0
    assert (tmp_path / "report.md").is_file() and not (tmp_path / "report.html").exists()


def test_without_images_the_probability_is_drawn_and_the_page_says_so(report, tmp_path):
    rows = _rows(report.parent / "runs")
    for row in rows:
        for run in row.runs:
            run.summaries[""]["provenance"]["dataset"]["root"] = None  # a run of data the report cannot find
    (case,) = _cases(write_html(tmp_path, "# t", "t", rows, "test", [], cases=1).read_text())
    assert case["background"] == "probability" and "label" not in case["layers"]
    assert any("foreground probability 1 - p_0 is drawn instead" in n for n in case["notes"])
    data = report.parent / "data"  # --images and --labels give them back
    (case,) = _cases(write_html(tmp_path, "# t", "t", rows, "test", [], cases=1, images=data / "imagesTr",
                                labels=data / "labelsTr").read_text())
    assert case["background"] == "image" and "label" in case["layers"]


def test_markdown_becomes_html_without_links_to_follow(tmp_path):
    text = "# T\n\nsee [the paper](https://example.org/x) and `code` **bold** <b>\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    out = markdown_html(text, tmp_path)
    assert "<h1>T</h1>" in out and "<code>code</code>" in out and "<strong>bold</strong>" in out
    assert "&lt;b&gt;" in out and "example.org" not in out and "href" not in out
    assert "<th>a</th><th>b</th>" in out and "<td>1</td><td>2</td>" in out and "---" not in out


def test_a_case_on_another_grid_is_drawn_without_the_mismatched_layer(report, tmp_path):
    """An image whose grid differs from the prediction's: the probability is drawn instead, the note names the
    file."""
    from mcseg.data.io import write_nifti
    from mcseg.evaluation.case_files import CaseFiles
    from mcseg.report.case_view import render_case

    run = report.parent / "runs" / "ce0"
    image = tmp_path / "other.nii.gz"
    write_nifti(image, np.zeros((5, 5, 5), np.float32), np.eye(4))
    predictions = run / "eval" / "test" / "predictions"
    files = CaseFiles("c0", "ce", 0.5, prediction=predictions / "c0.nii.gz",
                      probabilities=predictions / "c0_probs.nii.gz", image=image)
    case = render_case(files, 32, 4)
    assert case["background"] == "probability"
    assert any("other.nii.gz" in n and "differs" in n for n in case["notes"])


def test_cases_flagged_for_review_are_listed_first_where_a_run_has_statements(report, tmp_path):
    """A run whose evaluation has new-case statements (conformal.statements=true): its flagged cases come first
    in the case view, whatever their Dice, and the page says the order."""
    import shutil

    rows = _rows(report.parent / "runs")
    row = next(r for r in rows if r.selected and r.runs)
    run = row.runs[0]
    by_dice = sorted(run.per_case[""], key=lambda c: run.per_case[""][c]["dice"])
    best = by_dice[-1]  # the best case by Dice, flagged: drawn first
    folder = run.path / "eval" / "test" / "conformal" / "test-flags" / "statements"
    folder.mkdir(parents=True)
    try:
        rows_json = [{"case": c, "structure": "a", "review": c == best, "risk_score": 0.1 * i}
                     for i, c in enumerate(by_dice)]
        (folder / "statements.json").write_text(json.dumps({"rows": rows_json}))
        for r in rows:
            for other in r.runs:
                other.summaries[""]["conformal"] = {"test-flags": {}, **(other.summaries[""].get("conformal") or {})}
        page = write_html(tmp_path, "# t", "t", [row], "test", [], cases=3).read_text()
    finally:
        shutil.rmtree(folder.parent)
    cases = _cases(page)
    assert cases[0]["id"] == best and cases[0]["source"].endswith("FLAGGED for review")
    assert [c["id"] for c in cases[1:]] == [c for c in by_dice if c != best][:2]  # then worst Dice first
    assert "Cases (flagged for review first, then worst first by Dice)" in page
