"""What an operator does in the dashboard beyond the first look, in a real headless Chromium
against a real ``notifyq serve``: rotate a webhook secret and reload, pause an idle pool, chase
failing deliveries to a real receiver, read the runs on a phone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import Served
from tests.support import scalar
from tests.ui.test_browser import APP, LOOPBACK, _page, _shot, _sign_in
from tests.vault import keys_env

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log", args=["--app", APP],
                env={**keys_env(1, active=1), **LOOPBACK}) as server:
        yield server


def _secrets(sql: Conn, endpoint_id: str) -> int:
    return int(scalar(sql, "SELECT count(*) FROM notifyq.webhook_secret WHERE endpoint_id = %s",
                      (endpoint_id,)))


def test_a_rotated_secret_is_shown_once_and_a_reload_does_not_rotate_again(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    with served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": "http://127.0.0.1:9/hook"}).json()
    page = _page(browser, served)
    _sign_in(page)
    page.goto(f"/ui/webhooks/endpoints/{endpoint['id']}")
    page.get_by_role("button", name="Rotate secret").click()
    page.wait_for_url(f"**/ui/webhooks/endpoints/{endpoint['id']}?done=rotate")
    shown = page.locator("#new-secret").inner_text()
    assert shown.startswith("whsec_")
    assert shown != endpoint["secret"]
    assert _secrets(sql, endpoint["id"]) == 2
    _shot(page, screenshots, "webhook-secret-rotated")
    page.reload()
    assert page.locator("p.notice", has_text="Secret rotated").is_visible()
    assert page.locator("#new-secret").count() == 0
    assert shown not in page.content()
    assert page.locator("#secret-gone").is_visible()
    assert _secrets(sql, endpoint["id"]) == 2  # the reload rotated nothing


def test_at_phone_width_the_runs_filter_folds_and_the_first_run_is_on_the_first_screen(
        browser: Any, served: Served, screenshots: Path) -> None:
    with served.client() as http:
        http.post("/v1/jobs", json={"job_type": "ui.flaky"})
    page = browser.new_context(base_url=served.url, viewport={"width": 390, "height": 844},
                               color_scheme="light").new_page()
    _sign_in(page)
    page.goto("/ui/runs")
    first = page.locator("tbody#rows tr").first
    first.wait_for()
    box = first.bounding_box()
    assert box is not None
    assert box["y"] + box["height"] <= 844, box  # without scrolling
    assert not page.get_by_label("Type").is_visible()  # folded
    _shot(page, screenshots, "runs-phone")
    page.get_by_text("Filters", exact=True).click()
    page.get_by_label("Type").fill("ui.flaky")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/ui/runs?*type=ui.flaky*")
    assert page.locator("tbody#rows tr").count() == 1
    wide = _page(browser, served)
    _sign_in(wide)
    wide.goto("/ui/runs")
    assert wide.get_by_label("Type").is_visible()  # wider screens keep the form open


def test_an_idle_pool_is_paused_after_a_confirmation_that_keeps_its_reason(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    page = _page(browser, served)
    _sign_in(page)
    row = page.locator("#panels tbody tr", has=page.get_by_role("rowheader", name="webhooks"))
    row.wait_for()  # registered by the worker, no run in it: listed all the same
    assert row.locator("td.num").all_inner_texts()[:2] == ["0", "—"]
    row.get_by_role("button", name="Pause").click()
    page.locator("#confirm h1", has_text="Pause pool webhooks?").wait_for()
    assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 0  # nothing before the answer
    page.get_by_label("Reason").fill("receiver deploy")
    _shot(page, screenshots, "pool-pause-confirm")
    page.get_by_role("button", name="Pause webhooks").click()
    page.wait_for_url("**/ui/")
    state = row.locator("td.pool-state")
    assert "paused" in state.inner_text()
    assert "receiver deploy" in state.inner_text()
    assert state.locator("time").get_attribute("title").endswith("UTC")  # since when
    assert scalar(sql, "SELECT reason FROM notifyq.pause WHERE kind = 'pool' AND name = %s",
                  ("webhooks",)) == "receiver deploy"
    _shot(page, screenshots, "overview-paused")


def test_disabling_an_endpoint_asks_first_and_says_pending_deliveries_are_canceled(
        browser: Any, served: Served, sql: Conn) -> None:
    with served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": "http://127.0.0.1:9/hook"}).json()
    page = _page(browser, served)
    _sign_in(page)
    page.goto(f"/ui/webhooks/endpoints/{endpoint['id']}")
    page.get_by_role("button", name="Disable").click()
    assert "pending deliveries are canceled" in page.locator("#confirm").inner_text()
    assert scalar(sql, "SELECT disabled_at FROM notifyq.webhook_endpoint") is None
    page.get_by_role("link", name="Go back").click()
    page.wait_for_url(f"**/ui/webhooks/endpoints/{endpoint['id']}")
    page.get_by_role("button", name="Disable").click()
    page.get_by_role("button", name="Disable and cancel pending deliveries").click()
    page.wait_for_url("**?done=disable")
    assert scalar(sql, "SELECT disabled_at FROM notifyq.webhook_endpoint") is not None
