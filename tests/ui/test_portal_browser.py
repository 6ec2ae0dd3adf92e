"""A customer in the portal, in a real headless Chromium against a real ``notifyq serve`` with
its worker: signs in by the link the application minted, adds an endpoint subscribed to one
event type of the catalog, rotates its secret, and resends a failed delivery to a real loopback
receiver, which verifies it with the secret the portal showed once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import Served
from tests.receiver import Receiver, Reply
from tests.support import scalar, wait_until
from tests.ui.test_browser import APP, LOOPBACK, _page, _shot
from tests.vault import keys_env
from tests.webhooks.conftest import verify

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.timeout(180)


def _delivery(sql: Conn, message: str) -> tuple[str, int]:
    row = sql.execute("SELECT status, attempts FROM notifyq.webhook_delivery "
                      "WHERE message_id = %s", (message,)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_customer_signs_in_by_link_adds_an_endpoint_rotates_its_secret_and_resends(
        browser: Any, dsn: str, logs: Path, sql: Conn, screenshots: Path) -> None:
    env = {**keys_env(1, active=1), **LOOPBACK, "NOTIFYQ_WEBHOOKS__PERMANENT_STATUSES": "[422]"}
    with Receiver() as receiver, Served(dsn, logs / "serve.log", args=["--app", APP],
                                        env=env) as served, served.client() as http:
        receiver.script("/acme", Reply(422, b"not yet"))  # then 200
        for name, text in (("invoice.paid", "an invoice was paid"),
                           ("invoice.voided", "an invoice was voided")):
            assert http.put(f"/v1/webhooks/event-types/{name}",
                            json={"description": text}).status_code == 200
        link = http.post("/v1/portal/links", json={"tenant_id": "acme", "ttl_s": 300}).json()

        page = _page(browser, served)
        page.goto(link["url"])
        page.wait_for_url(re.compile(r"/portal/$"))
        assert "#" not in page.url  # the code left the address bar
        assert page.locator("#tenant").inner_text().startswith("acme")
        _shot(page, screenshots, "portal-endpoints-empty")

        page.get_by_role("link", name="Add an endpoint").click()
        page.get_by_label("URL").fill(receiver.url("/acme"))
        page.get_by_label("Description").fill("billing")
        page.get_by_label("Only these:").check()
        page.get_by_label("invoice.paid").check()
        _shot(page, screenshots, "portal-endpoint-new")
        page.get_by_role("button", name="Add endpoint").click()
        page.wait_for_url(re.compile(r"/portal/endpoints/[0-9a-f-]+\?done=added$"))
        first = page.locator("#new-secret").inner_text()
        assert first.startswith("whsec_")
        assert page.locator("#endpoint-events").inner_text() == "invoice.paid"
        endpoint_id = page.url.split("/endpoints/")[1].split("?")[0]
        assert scalar(sql, "SELECT tenant_id FROM notifyq.webhook_endpoint WHERE id = %s",
                      (endpoint_id,)) == "acme"

        page.get_by_role("button", name="Rotate secret").click()
        page.wait_for_url("**?done=rotate")
        rotated = page.locator("#new-secret").inner_text()
        assert rotated.startswith("whsec_")
        assert rotated != first
        _shot(page, screenshots, "portal-secret-rotated")
        page.reload()
        assert page.locator("#new-secret").count() == 0  # shown once

        voided = http.post("/v1/webhooks/messages", json={"event_type": "invoice.voided",
                                                          "payload": {"id": 6}}).json()
        assert voided["deliveries"] == 0  # not subscribed
        paid = http.post("/v1/webhooks/messages", json={"event_type": "invoice.paid",
                                                        "payload": {"id": 7}}).json()
        wait_until(lambda: _is(sql, paid["id"], ("failed", 1)), timeout=30)  # the 422

        page.get_by_role("navigation").get_by_role("link", name="Messages").click()
        page.get_by_role("link", name=paid["id"]).click()
        page.wait_for_url(f"**/portal/messages/{paid['id']}")
        assert "422" in page.locator("#attempts").inner_text()
        page.get_by_role("button", name="Resend").click()
        page.wait_for_url("**?done=resend*")
        wait_until(lambda: _received(receiver, 2), timeout=30)
        resent = receiver.at("/acme")[1]
        assert verify(rotated, resent) == {"id": 7}  # signed with the secret shown once
        page.reload()
        attempts = page.locator("#attempts tbody tr")
        assert attempts.count() == 2
        assert "200" in attempts.nth(1).inner_text()
        _shot(page, screenshots, "portal-message-resent")
    assert first not in served.log()
    assert rotated not in served.log()


def _is(sql: Conn, message: str, expected: tuple[str, int]) -> None:
    assert _delivery(sql, message) == expected


def _received(receiver: Receiver, n: int) -> None:
    assert len(receiver.at("/acme")) == n
