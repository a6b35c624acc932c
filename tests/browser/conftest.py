"""Fixtures for the admin UI's tests in a real browser: headless Chromium from Debian's package, driven by
Playwright's Python package (``executable_path``: Playwright never downloads a browser here).

Without Chromium or Playwright the tests are skipped, unless ``GATEWAY_TEST_STRICT=1`` (``make test``
sets it, after ``scripts/system-deps.sh test`` installed Chromium), which makes that a failure.
``GATEWAY_CHROMIUM`` names another Chromium binary. Each test gets a fresh browser context (no cookies)
whose teardown fails on any console error or uncaught exception, which includes Content-Security-Policy
violations. Screenshots go to ``build/screenshots/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import ROOT

SCREENSHOTS = ROOT / "build" / "screenshots"


def _chromium() -> str | None:
    wanted = os.environ.get("GATEWAY_CHROMIUM")
    if wanted:
        return wanted if Path(wanted).exists() else None
    for candidate in ("/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _unavailable(why: str) -> None:
    if os.environ.get("GATEWAY_TEST_STRICT") == "1":
        pytest.fail(f"{why} (scripts/system-deps.sh test and pip install -e '.[test]' install it)")
    pytest.skip(why)


# Package scope, not session: while Playwright's sync API runs, this thread has a running event loop, and
# every later test that starts one of its own (asyncio.run) would fail. It stops after tests/browser/.
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed")
    executable = _chromium()
    if executable is None:
        _unavailable("chromium is not installed")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Console:
    """What the page said on its console, and the exceptions it did not catch."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def on_console(self, message: Any) -> None:
        # The API's refusals (401 before sign-in, 403, 404 for a route this gateway lacks) are logged by
        # the browser as failed loads: they are what the tests provoke, not faults of the page.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {message.text}")

    def on_page_error(self, error: Any) -> None:
        self.errors.append(f"uncaught: {error}")


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
    context.set_default_timeout(10_000)
    tab = context.new_page()
    console = Console()
    tab.on("console", console.on_console)
    tab.on("pageerror", console.on_page_error)
    try:
        yield tab
    finally:
        context.close()
    assert not console.errors, "the page logged errors:\n" + "\n".join(console.errors)


@pytest.fixture
def shot(page: Any) -> Callable[[str], Path]:
    """``shot(name)`` saves the whole page as ``build/screenshots/<name>.png``."""

    def save(name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
