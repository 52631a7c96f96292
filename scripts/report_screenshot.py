"""A screenshot of a report.html as headless Chromium draws it (docs/images/report_html*.png).

    python scripts/report_screenshot.py <report>/report.html docs/images/report_html.png [--case-view | --top SEL]

The page is opened from disk in Debian's chromium-headless-shell (or ``--browser``) through Playwright; ``--case-view``
takes the per-case view only (scrolled into view, the first case at its starting slice), else the window at the
page's top or, with ``--top SELECTOR``, at that element.
"""
from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--case-view", action="store_true")
    parser.add_argument("--top", help="a CSS selector of the element scrolled to the top of the screenshot "
                        "(e.g. \"h2:has-text('Reliability diagrams')\")")
    parser.add_argument("--browser", default=next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None))
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    if not args.page.is_file():
        parser.error(f"{args.page}: not found")
    if not args.browser:
        parser.error("no Chromium found: apt-get install chromium-headless-shell, or --browser <executable>")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.browser,
                                             args=["--no-sandbox"] if os.geteuid() == 0 else [])
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(args.page.resolve().as_uri())
        if args.case_view:
            page.locator("#viewer").scroll_into_view_if_needed()
            page.locator("#viewer").screenshot(path=str(args.out))
        else:
            if args.top:
                page.locator(args.top).first.evaluate("e => e.scrollIntoView()")
            page.screenshot(path=str(args.out))
        browser.close()
    print(args.out)


if __name__ == "__main__":
    main()
