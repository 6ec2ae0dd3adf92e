"""The dashboard's browser tests: a headless Chromium (Debian's package, driven by Playwright;
never `playwright install`) for each test, and a directory for screenshots,
kept and named in the summary at the end of the run when ``NOTIFYQ_UI_SCREENSHOTS`` names it,
else removed at the end."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("NOTIFYQ_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
_SHOTS: list[Path] = []


@pytest.fixture(scope="session")
def screenshots() -> Iterator[Path]:
    """Where the tests' screenshots go: ``NOTIFYQ_UI_SCREENSHOTS`` keeps them there (named in
    the summary); without it they go to a temporary directory removed at the end of the
    session, so a test run leaves nothing behind in /tmp."""
    chosen = os.environ.get("NOTIFYQ_UI_SCREENSHOTS")
    if chosen:
        path = Path(chosen)
        path.mkdir(parents=True, exist_ok=True)
        _SHOTS.append(path)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="notifyq-ui-screenshots-") as scratch:
        yield Path(scratch)


@pytest.fixture
def browser(template_db: str) -> Iterator[Any]:
    """A Chromium for one test (about a second to start). Playwright's sync API keeps an
    asyncio loop running in this thread while it is open: any longer and the async tests that
    the same pytest process runs next could not start theirs (nor the template database's
    ``anyio.run``, hence after it)."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for path in _SHOTS:
        terminalreporter.write_line(f"dashboard screenshots: {path}")
