"""The dashboard in a real headless Chromium against a real ``notifyq serve``: what an operator
does, step by step, with a screenshot of every page (see conftest for where they go)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import ADMIN, READER, Served
from tests.support import scalar, wait_until
from tests.vault import keys_env

Conn = psycopg.Connection[Any]
APP = "tests.apps.dashboard:app"
LOOPBACK = {"NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8"}
LIVE_S = 20_000  # ms: every live part refreshes within 3 s; room for a loaded machine

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log", args=["--app", APP],
                env={**keys_env(1, active=1), **LOOPBACK}) as server:
        yield server


def _page(browser: Any, served: Served, *, width: int = 1280, dark: bool = False) -> Any:
    context = browser.new_context(base_url=served.url, viewport={"width": width, "height": 900},
                                  color_scheme="dark" if dark else "light")
    return context.new_page()


def _sign_in(page: Any, token: str = ADMIN) -> None:
    page.goto("/ui/")
    page.wait_for_url(re.compile(r"/ui/signin"))
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/ui/$"))


def _shot(page: Any, screenshots: Path, name: str) -> None:
    page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)


def test_a_failing_run_appears_live_is_retried_and_completes(
        browser: Any, served: Served, screenshots: Path) -> None:
    page = _page(browser, served)
    page.goto("/ui/")
    _shot(page, screenshots, "signin")
    _sign_in(page)
    page.get_by_role("navigation").get_by_role("link", name="Runs").click()
    page.wait_for_url(re.compile(r"/ui/runs$"))
    with served.client() as http:
        run_id = http.post("/v1/jobs", json={"job_type": "ui.flaky"}).json()["id"]
    row = page.locator("tbody#rows tr", has=page.locator(f'a[href="/ui/runs/{run_id}"]'))
    row.locator(".badge", has_text="failed").wait_for(timeout=LIVE_S)  # no reload
    _shot(page, screenshots, "runs")
    row.get_by_role("link").click()
    page.wait_for_url(f"**/ui/runs/{run_id}")
    assert "the first attempt always fails" in page.locator(".error-box").inner_text()
    _shot(page, screenshots, "run-failed")
    page.get_by_role("button", name="Retry").click()
    page.locator("h1 .badge", has_text="completed").wait_for(timeout=LIVE_S)
    assert '"attempt": 2' in page.locator("#output").inner_text()
    _shot(page, screenshots, "run-completed")


def test_a_parent_with_children_waits_for_a_signal_sent_from_the_dashboard(
        browser: Any, served: Served, screenshots: Path) -> None:
    with served.client() as http:
        parent = http.post("/v1/jobs", json={"job_type": "ui.parent"}).json()["id"]
    page = _page(browser, served)
    _sign_in(page)
    page.goto(f"/ui/runs/{parent}")
    page.locator("#wait-token", has_text=f"approve:{parent}").wait_for(timeout=LIVE_S)
    children = page.locator("ul.tree li")
    assert children.count() == 2
    assert children.locator(".badge", has_text="completed").count() == 2
    kinds = page.locator(".timeline li .kind").all_inner_texts()
    assert kinds[:3] == ["step", "child", "child"]  # the plan, then the two spawns
    _shot(page, screenshots, "run-waiting")
    children.first.get_by_role("link").click()
    page.wait_for_url(re.compile(r"/ui/runs/[0-9a-f-]{36}$"))
    assert page.locator("h1").inner_text().startswith("ui.child")
    page.locator("dd", has_text="…").get_by_role("link").first.click()  # its parent
    page.wait_for_url(f"**/ui/runs/{parent}")
    page.get_by_label("Payload (JSON)").fill('{"by": "ops"}')
    page.get_by_role("button", name="Send signal").click()
    page.locator("p.notice", has_text="a waiting run received it").wait_for()
    page.locator("h1 .badge", has_text="completed").wait_for(timeout=LIVE_S)
    assert '"by": "ops"' in page.locator("#output").inner_text()


def test_an_endpoint_is_disabled_from_the_dashboard(browser: Any, served: Served,
                                                   sql: Conn, screenshots: Path) -> None:
    with served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": "http://127.0.0.1:9/hook", "description": "billing"}).json()
        message = http.post("/v1/webhooks/messages", json={
            "event_type": "invoice.paid", "payload": {"id": 7}}).json()
    wait_until(lambda: _attempts(sql), timeout=30)
    page = _page(browser, served)
    _sign_in(page)
    page.get_by_role("navigation").get_by_role("link", name="Webhooks").click()
    _shot(page, screenshots, "webhooks")
    page.get_by_role("link", name="http://127.0.0.1:9/hook").click()
    page.get_by_role("button", name="Disable").click()
    page.get_by_role("button", name="Disable and cancel pending deliveries").click()
    assert "disabled" in page.locator("#endpoint-state").inner_text()
    assert page.get_by_role("button", name="Enable").is_visible()
    _shot(page, screenshots, "webhook-endpoint")
    assert scalar(sql, "SELECT disabled_reason FROM notifyq.webhook_endpoint") == (
        "disabled in the dashboard")
    page.goto(f"/ui/webhooks/messages/{message['id']}")
    assert "connect" in page.locator("#attempts").inner_text()
    _shot(page, screenshots, "webhook-message")
    assert endpoint["secret"] not in page.content()


def _attempts(sql: Conn) -> None:
    assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_attempt") >= 1


def _active_is(dsn: str, version: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT version FROM notifyq.key_active").fetchone()
    assert row is not None, "no key version active yet"
    assert row[0] == version, row


def test_a_key_rotation_is_followed_to_100_percent(browser: Any, dsn: str, logs: Path,
                                                   screenshots: Path) -> None:
    with Served(dsn, logs / "first.log", args=["--app", APP],
                env={**keys_env(1, active=1), **LOOPBACK}) as first, first.client() as http:
        for n in range(40):
            created = http.post("/v1/webhooks/endpoints", json={"url": f"http://127.0.0.1:9/{n}"})
            assert created.status_code == 201, created.text
    with Served(dsn, logs / "second.log", args=["--app", APP],
                env={**keys_env(1, 2, active=2), **LOOPBACK}) as served:
        # serve promotes version 2 once every live key holder has it: the first serve's row
        # expires three key-check intervals after its last check. The page shows the rotation
        # to do from then on.
        wait_until(lambda: _active_is(dsn, 2), timeout=60)
        page = _page(browser, served)
        _sign_in(page)
        page.get_by_role("navigation").get_by_role("link", name="Keys").click()
        assert page.locator("#rotation-percent").inner_text() == "0.0 %"
        page.get_by_role("button", name="Rotate to version 2").click()
        page.locator("#rotation-percent", has_text="100.0 %").wait_for(timeout=LIVE_S)
        assert page.locator("#rotation-bar").get_attribute("value") == "100.0"
        on_v1 = page.locator("tr", has_text="decrypt-only").locator("td.num")
        # The table follows the rotation too: no column has a row left on version 1.
        assert on_v1.all_inner_texts() == ["0"] * on_v1.count()
        assert on_v1.count() >= 2
        _shot(page, screenshots, "keys")
        page.get_by_role("button", name="Retire").click()  # version 1: no row uses it now
        page.locator("p.notice", has_text="retired").wait_for()


def test_every_page_reads_well_at_phone_width_in_the_dark_and_by_keyboard(
        browser: Any, served: Served, screenshots: Path) -> None:
    with served.client() as http:
        http.post("/v1/jobs", json={"job_type": "ui.flaky"})
    page = _page(browser, served, width=390, dark=True)
    _sign_in(page, READER)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    for path, name in (("/ui/", "overview-phone-dark"), ("/ui/runs", "runs-phone-dark"),
                       ("/ui/schedules", "schedules-phone-dark")):
        page.goto(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, (path, width)  # no sideways scrolling of the page itself
        _shot(page, screenshots, name)
    assert page.get_by_role("button", name="Retry").count() == 0  # read-only
    wide = _page(browser, served)
    _sign_in(wide)
    wide.locator(".chart canvas").first.wait_for(timeout=LIVE_S)
    _shot(wide, screenshots, "overview")
    wide.goto("/ui/schedules")
    assert "ui.report" in wide.locator("table").inner_text()
    _shot(wide, screenshots, "schedules")
