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
from tests.receiver import Receiver, Reply
from tests.support import scalar, wait_until
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


def test_an_idle_pool_is_paused_after_a_confirmation_and_shows_why_and_since_when(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    page = _page(browser, served)
    _sign_in(page)
    row = page.locator("#panels tbody tr", has=page.get_by_role("rowheader", name="webhooks"))
    row.wait_for()  # registered by the worker, no run in it: listed all the same
    assert row.locator("td.num").all_inner_texts()[:2] == ["0", "—"]
    row.get_by_role("button", name="Pause").click()
    page.locator("#confirm h1", has_text="Pause pool webhooks?").wait_for()
    assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 0  # nothing before the answer
    _shot(page, screenshots, "pool-pause-confirm")
    page.get_by_role("button", name="Pause webhooks").click()
    page.wait_for_url("**/ui/")
    state = row.locator("td.pool-state")
    assert "paused" in state.inner_text()
    assert "paused from the dashboard" in state.inner_text()  # why
    assert state.locator("time").get_attribute("title").endswith("UTC")  # since when
    assert scalar(sql, "SELECT reason FROM notifyq.pause WHERE kind = 'pool' AND name = %s",
                  ("webhooks",)) == "paused from the dashboard"
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


def _delivery(sql: Conn, message: dict[str, Any]) -> tuple[str, int]:
    row = sql.execute("SELECT status, attempts FROM notifyq.webhook_delivery "
                      "WHERE message_id = %s", (message["id"],)).fetchone()
    assert row is not None
    return row[0], row[1]


def _is(sql: Conn, message: dict[str, Any], status: str, attempts: int) -> None:
    assert _delivery(sql, message) == (status, attempts)


def _circuit_open(sql: Conn, endpoint: dict[str, Any]) -> None:
    assert scalar(sql, "SELECT circuit_open_until > now() FROM notifyq.webhook_endpoint "
                       "WHERE id = %s", (endpoint["id"],)) is True


def test_failing_deliveries_show_retries_and_the_open_circuit_and_failed_ones_are_resent(
        browser: Any, dsn: str, logs: Path, sql: Conn, screenshots: Path) -> None:
    env = {**keys_env(1, active=1), **LOOPBACK,
           "NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S": "[0, 3600]",
           "NOTIFYQ_WEBHOOKS__PERMANENT_STATUSES": "[422]",
           "NOTIFYQ_WEBHOOKS__BREAKER_FAILURES": "2",
           "NOTIFYQ_WEBHOOKS__BREAKER_COOLDOWN_S": "600"}
    with Receiver() as receiver, Served(dsn, logs / "serve.log", args=["--app", APP],
                                        env=env) as served, served.client() as http:
        receiver.script("/orders", *[Reply(500, b"oops")] * 10)
        receiver.script("/billing", Reply(422, b"not yet"))  # then 200
        orders = http.post("/v1/webhooks/endpoints", json={
            "url": receiver.url("/orders"), "event_types": ["order.created"],
            "description": "orders"}).json()
        billing = http.post("/v1/webhooks/endpoints", json={
            "url": receiver.url("/billing"), "event_types": ["invoice.paid"],
            "description": "billing"}).json()
        first = http.post("/v1/webhooks/messages", json={
            "event_type": "order.created", "payload": {"n": 1}}).json()
        wait_until(lambda: _is(sql, first, "pending", 1), timeout=30)  # a 500, retried in 1 h

        page = _page(browser, served)
        _sign_in(page)
        page.goto("/ui/webhooks/messages")
        row = page.locator("tr", has=page.get_by_role("link", name=first["id"]))
        # 1 delivery, 0 failed, 1 retrying: the 500 no longer hides behind "Failed 0"
        assert row.locator("td.num").all_inner_texts()[:3] == ["1", "0", "1"]
        page.goto(f"/ui/webhooks/endpoints/{orders['id']}")
        delivery = page.locator("tr", has=page.get_by_role("link", name=first["id"]))
        assert "retrying" in delivery.inner_text()
        assert delivery.locator(".next-attempt time").inner_text().startswith("in ")
        assert delivery.locator(".held").count() == 0

        second = http.post("/v1/webhooks/messages", json={
            "event_type": "order.created", "payload": {"n": 2}}).json()
        wait_until(lambda: _circuit_open(sql, orders), timeout=30)  # two failures in a row
        page.reload()
        held = page.locator("tbody .held")
        assert held.count() == 2, page.locator("tbody").inner_text()
        assert held.first.inner_text().startswith("held: circuit open, next probe in ")
        _shot(page, screenshots, "webhook-endpoint-held")

        paid = http.post("/v1/webhooks/messages", json={
            "event_type": "invoice.paid", "payload": {"n": 3}}).json()
        wait_until(lambda: _is(sql, paid, "failed", 1), timeout=30)  # 422: no retry
        page.goto("/ui/webhooks/messages")
        page.get_by_label("Event type").fill("invoice.paid")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url("**/ui/webhooks/messages?type=invoice.paid*")
        assert _listed(page) == [paid["id"]]
        page.get_by_label("Event type").fill("")
        page.get_by_label("Endpoint").select_option(label=f"{receiver.url('/orders')} (orders)")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(f"**endpoint={orders['id']}")
        assert _listed(page) == [second["id"], first["id"]]
        _shot(page, screenshots, "webhook-messages-filtered")

        page.goto(f"/ui/webhooks/endpoints/{billing['id']}")
        page.get_by_role("button", name="Resend failed").click()
        page.locator("p.notice", has_text="Failed deliveries resent: 1 run").wait_for()
        wait_until(lambda: _is(sql, paid, "succeeded", 1), timeout=30)
        assert len(receiver.at("/billing")) == 2


def _listed(page: Any) -> list[str]:
    return [link.inner_text() for link in page.locator("tbody a.mono").all()]


def test_an_endpoint_is_sent_what_it_missed_after_a_count_and_a_confirmation(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    with Receiver() as receiver, served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": receiver.url("/late"), "event_types": ["order.paid"],
            "enabled": False}).json()
        sent = sorted(http.post("/v1/webhooks/messages", json={
            "event_type": "order.paid", "payload": {"n": n}}).json()["id"] for n in range(3))
        assert http.patch(f"/v1/webhooks/endpoints/{endpoint['id']}",
                          json={"enabled": True}).status_code == 200
        page = _page(browser, served)
        _sign_in(page)
        page.goto(f"/ui/webhooks/endpoints/{endpoint['id']}")
        page.get_by_role("button", name="Replay missed…").click()
        assert page.locator("h1").inner_text().startswith(
            f"Send {receiver.url('/late')} what it missed since ")
        assert "It never got 3 message(s) sent since then" in page.locator(
            "#confirm").inner_text()
        _shot(page, screenshots, "webhook-replay-confirm")
        assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_delivery "
                           "WHERE endpoint_id = %s", (endpoint["id"],)) == 0  # counted only
        page.get_by_role("button", name="Send the missed messages").click()
        page.locator("p.notice",
                     has_text="Missed messages sent, a delivery each: 3 runs").wait_for()

        def arrived() -> None:
            assert len(receiver.at("/late")) == 3
        wait_until(arrived, timeout=30)
        assert sorted(r.headers["webhook-id"] for r in receiver.at("/late")) == sent
        page.get_by_role("button", name="Replay missed…").click()
        page.locator("p.notice", has_text="Nothing to replay").wait_for()
        assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_delivery "
                           "WHERE endpoint_id = %s", (endpoint["id"],)) == 3
