"""The Runs page in a real headless Chromium against a real ``notifyq serve``: short ids that
tell the runs of a burst apart and find them again, the copy button, the state tabs with their
counts, the per-job-type view."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import Served
from tests.ui.test_browser import APP, LOOPBACK, _page, _shot, _sign_in
from tests.vault import keys_env

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log", args=["--app", APP],
                env={**keys_env(1, active=1), **LOOPBACK}) as server:
        yield server


def _burst(served: Served, n: int, **fields: Any) -> list[str]:
    """``n`` runs enqueued in one batch (ids made in one millisecond), due tomorrow."""
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    jobs = [{"job_type": "ui.child", "run_at": tomorrow, **fields} for _ in range(n)]
    with served.client() as http:
        answer = http.post("/v1/jobs/batch", json={"jobs": jobs})
    assert answer.status_code == 201, answer.text
    return [r["id"] for r in answer.json()["items"]]


def _listed(page: Any) -> list[str]:
    return [str(href).rsplit("/", 1)[-1]
            for href in page.locator("tbody#rows a.mono").evaluate_all(
                "links => links.map(a => a.getAttribute('href'))")]


def test_runs_of_a_burst_show_distinct_short_ids_that_find_them_and_copy_whole(
        browser: Any, served: Served, screenshots: Path) -> None:
    ids = _burst(served, 60)
    assert len({i[:13] for i in ids}) == 1  # the same time prefix: one millisecond
    page = _page(browser, served)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    _sign_in(page)
    page.goto("/ui/runs")
    shown = page.locator("tbody#rows a.mono").all_inner_texts()
    assert len(shown) == 50
    assert len(set(shown)) == 50, shown  # the newest 50 of the burst, each told apart
    picked = ids[17]
    short = page.locator(f'tbody#rows a[href="/ui/runs/{picked}"]').inner_text()
    page.get_by_label("Run id").fill(short)  # pasted as shown
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/ui/runs\?"))
    assert _listed(page) == [picked]
    page.get_by_label("Run id").fill(f"{picked[:8]}…{picked[-4:]}")  # as lists showed it before
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/ui/runs\?"))
    assert _listed(page) == [picked]
    page.goto(f"/ui/runs/{short}")  # a run's address with the short id
    page.wait_for_url(f"**/ui/runs/{picked}")
    page.get_by_role("button", name=f"Copy id {picked}").click()
    page.locator("button.copy[data-copied]").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == picked
    _shot(page, screenshots, "run-copied")


def test_without_a_clipboard_the_copy_button_shows_the_whole_id_selected(
        browser: Any, served: Served) -> None:
    [run] = _burst(served, 1)
    page = _page(browser, served)
    page.add_init_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    _sign_in(page)
    page.goto("/ui/runs")
    page.get_by_role("button", name=f"Copy id {run}").click()
    field = page.get_by_label("Id to copy")
    assert field.input_value() == run
    assert page.evaluate("window.getSelection().toString() || "
                         "document.activeElement.value.substring("
                         "document.activeElement.selectionStart, "
                         "document.activeElement.selectionEnd)") == run
