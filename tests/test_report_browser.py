"""report.html in a real browser: headless Chromium (Debian's chromium-headless-shell or chromium, which
scripts/setup.sh installs) driven by Playwright for Python. The page loads from disk with no console error and no
request leaving the file; a column header sorts its table; the slice slider changes the drawn image; an overlay's
checkbox hides it; a reliability bin shows its voxel count on hover. Without Playwright or Chromium the tests skip
saying why, and under CI=true they fail (tests/conftest.py, ``require``)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import in_ci, require
from tests.report_runs import built_report

sync_api = require("playwright.sync_api", "it drives the browser that report.html is tested in")

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The Chromium to drive: ``$MCSEG_CHROMIUM``, else the first of :data:`BROWSERS` on the PATH (or in Debian's
    /usr/lib/chromium); missing, a skip saying how to install it (an error under CI=true)."""
    found = os.environ.get("MCSEG_CHROMIUM") or next(
        (p for name in BROWSERS for p in (shutil.which(name), f"/usr/lib/chromium/{name}") if p and Path(p).is_file()),
        None)
    if found:
        return found
    why = ("no Chromium found (MCSEG_CHROMIUM, or one of " + ", ".join(BROWSERS) + " on the PATH): "
           "`apt-get install chromium-headless-shell` (scripts/setup.sh does it)")
    if in_ci():
        pytest.fail(f"{why}. Under CI={os.environ['CI']}: an error, not a skip", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = chromium()
    with sync_api.sync_playwright() as playwright:
        args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []  # root: no user namespaces
        launched = playwright.chromium.launch(executable_path=executable, args=args)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    return built_report(tmp_path_factory.mktemp("browser")) / "report.html"


def load(browser, path: Path):
    """A page of ``path`` opened; returns (page, console errors and page errors, URLs requested)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, requests = [], []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, errors, requests


def test_the_page_loads_with_no_error_and_requests_nothing_but_itself(browser, report, tmp_path):
    page, errors, requests = load(browser, report)
    assert errors == [] and requests == [report.as_uri()]
    assert page.locator("#stack").get_attribute("data-slice") is not None  # the script ran
    page.close()
    # the check can fail: the same page with a script error and an image from elsewhere
    bad = tmp_path / "bad.html"
    bad.write_text(report.read_text().replace("<body>", '<body><img src="https://example.invalid/x.png">'
                                              "<script>undefined_function();</script>", 1))
    page, errors, requests = load(browser, bad)
    assert any("undefined_function" in e for e in errors)
    assert any("example.invalid" in e for e in errors) or any("example.invalid" in r for r in requests)
    page.close()


def test_a_column_header_sorts_its_table(browser, report):
    page, errors, _ = load(browser, report)
    table = page.locator("table.sortable").first
    headers = table.locator("thead th").all_text_contents()
    column = headers.index("Dice")

    def values():
        return [float(t.split()[0]) for t in table.locator(f"tbody tr td:nth-child({column + 1})").all_text_contents()]

    def losses():
        return table.locator("tbody tr td:nth-child(1)").all_text_contents()

    before = losses()
    table.locator("thead th").nth(column).click()
    assert values() == sorted(values())
    table.locator("thead th").nth(column).click()
    assert values() == sorted(values(), reverse=True)
    assert losses() != before or values() != sorted(values())  # two rows of different Dice: one click reorders
    assert errors == []
    page.close()


def test_the_slider_changes_the_drawn_image(browser, report):
    page, errors, _ = load(browser, report)
    stack, slider = page.locator("#stack"), page.locator("#slice")
    first = stack.get_attribute("data-slice"), page.locator("#layer-image").get_attribute("src"), stack.screenshot()
    slider.focus()
    page.keyboard.press("Home" if int(slider.input_value()) > 0 else "End")
    after = stack.get_attribute("data-slice"), page.locator("#layer-image").get_attribute("src"), stack.screenshot()
    assert after[0] != first[0] and after[1] != first[1]
    assert after[2] != first[2]  # what is drawn changed, not only an attribute
    assert errors == []
    page.close()


def test_an_overlay_checkbox_hides_its_layer(browser, report):
    page, errors, _ = load(browser, report)
    layer, stack = page.locator("#layer-prediction"), page.locator("#stack")
    assert layer.is_visible()
    shown = stack.screenshot()
    page.locator("#show-prediction").uncheck()
    assert not layer.is_visible() and stack.screenshot() != shown
    page.locator("#show-prediction").check()
    assert layer.is_visible()
    page.locator("#case-select").select_option("1")  # another case keeps the choice of layers
    page.locator("#show-sure").uncheck()
    page.locator("#case-select").select_option("0")
    assert not page.locator("#layer-sure").is_visible() and page.locator("#layer-label").is_visible()
    assert errors == []
    page.close()


def test_a_reliability_bin_shows_its_voxel_count_on_hover(browser, report):
    page, errors, _ = load(browser, report)
    bins = page.locator("svg.reliability rect.bin")
    full = next(i for i in range(bins.count()) if int(bins.nth(i).get_attribute("data-count")) > 0)
    bins.nth(full).scroll_into_view_if_needed()
    bins.nth(full).hover()
    tooltip = page.locator("#tooltip")
    assert tooltip.is_visible()
    assert f"{bins.nth(full).get_attribute('data-count')} voxels" in tooltip.text_content()
    assert errors == []
    page.close()


@pytest.mark.slow
def test_a_folder_commands_page_loads_and_its_conformal_overlay_toggles(browser, tmp_path):
    """report.html of mcseg-conformal-folder's output (mcseg/report/folder_report.py): no console error, nothing
    requested but the file, the worst-Dice case listed first, and its "sure" overlay hidden by its checkbox."""
    from mcseg.conformal_folder import main as conformal
    from tests.test_folder_report import NAMES, make_folders

    found = make_folders(tmp_path)
    out = tmp_path / "conformal"
    assert conformal(["--fit", str(found["fit"]), "--reference", str(found["labels"]), "--apply", str(found["new"]),
                      "-o", str(out), *NAMES, "--alpha", "0.3", "--repeats", "0", "--images", str(found["images"]),
                      "--html-cases", "2"]) == 0
    report = out / "report.html"
    page, errors, requests = load(browser, report)
    assert errors == [] and requests == [report.as_uri()]
    options = page.locator("#case-select option").all_text_contents()
    dice = [float(t.split("Dice ")[1].split()[0]) for t in options]
    assert len(options) == 2 and dice == sorted(dice)
    layer, stack = page.locator("#layer-sure"), page.locator("#stack")
    assert layer.is_visible()
    shown = stack.screenshot()
    page.locator("#show-sure").uncheck()
    assert not layer.is_visible() and stack.screenshot() != shown
    assert errors == []
    page.close()
