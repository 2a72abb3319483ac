"""Headless Chromium for the operations page's browser tests (tests/e2e/test_ui_browser.py).

Debian's ``chromium`` (``apt-get install chromium``; ``scripts/test`` installs
it when it is missing and apt is there) driven by Playwright for Python (the
``test`` extra), never a browser Playwright downloads. No Chromium, or no
Playwright, is a test failure that says how to install it -- never a skip.

Screenshots go to ``$LATTICE_TEST_SCREENSHOTS`` when set (the committed ones in
docs/images/ were made with ``LATTICE_TEST_SCREENSHOTS=docs/images``), else
to the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LATTICE, Deployment, Proc, free_port, wait_for
from tests.support.services import TEST_SCREENSHOTS_ENV as SCREENSHOTS_ENV

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""Flags that work on this machine (Playwright adds ``--headless`` and a fresh ``--user-data-dir``)."""

USER, PASSWORD = "ops", "choose-a-password"


def chromium_path() -> str:
    """The Chromium binary, or a test failure saying how to install it."""
    for candidate in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(
        "the browser tests need Chromium (chromium on the PATH): apt-get install -y chromium; "
        "scripts/test installs it when it is missing and apt is available",
        pytrace=False,
    )


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's ``Browser``), closed afterwards."""
    path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: pip install -e '.[test]'", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any, username: str = USER, password: str = PASSWORD) -> Any:
    """A page in a fresh context that answers the basic-auth challenge with these credentials."""
    context = browser.new_context(
        http_credentials={"username": username, "password": password}, viewport={"width": 1280, "height": 860}
    )
    context.set_default_timeout(30_000)
    return context.new_page()


class Ui:
    """A ``lattice ui`` process of a :class:`Deployment`, and where it listens."""

    def __init__(self, proc: Proc, port: int) -> None:
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str) -> str:
        return self.base + path


def start_ui(d: Deployment, *args: str) -> Ui:
    """Start ``lattice ui --port <free> ARGS...`` with basic auth ``ops:<password>`` and wait until it answers."""
    import httpx

    port = free_port()
    proc = d.start(
        [LATTICE, "ui", "--port", str(port), *args], "ui", env={"LATTICE_UI_BASIC_AUTH": f"{USER}:{PASSWORD}"}
    )
    proc.wait_log(r"lattice ui on http://", timeout=30)
    ui = Ui(proc, port)

    def answers() -> bool:
        if not proc.alive():
            raise AssertionError(f"lattice ui exited:\n{proc.log()[-3000:]}")
        try:
            return httpx.get(ui.url("/"), timeout=2).status_code == 401
        except httpx.HTTPError:
            return False

    wait_for(answers, 20, "lattice ui to answer")
    return ui


class Screenshots:
    """Saves full-page screenshots as ``ui-<name>.png`` (see the module doc)."""

    def __init__(self, tmp_path: Path) -> None:
        given = os.environ.get(SCREENSHOTS_ENV)
        self.directory = Path(given) if given else tmp_path / "screenshots"
        self.directory.mkdir(parents=True, exist_ok=True)

    def save(self, page: Any, name: str) -> Path:
        path = self.directory / f"ui-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000, path
        return path


__all__ = ["CHROMIUM_ARGS", "PASSWORD", "USER", "Screenshots", "Ui", "chromium", "new_page", "start_ui"]
