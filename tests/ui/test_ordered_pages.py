"""The dashboard's endpoint page for ordered endpoints: the order shown and set, and a pending
delivery given up (asked first), against a real ``notifyq serve``."""

from __future__ import annotations

from typing import Any

from tests.integration.serving import Served
from tests.support import scalar, wait_until
from tests.ui.dashboard import Dashboard
from tests.ui.test_routes import admin, reader, served  # noqa: F401 - fixtures

Conn = Any


def test_the_endpoint_page_sets_the_order_and_gives_up_a_waiting_delivery(
        served: Served, sql: Conn, admin: Dashboard, reader: Dashboard) -> None:  # noqa: F811
    with served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": "http://127.0.0.1:9/hook"}).json()
    page = f"/ui/webhooks/endpoints/{endpoint['id']}"
    assert "in parallel (up to its adaptive share)" in admin.get(page).text
    assert reader.post(f"{page}/order", {"ordered": "yes"}).status_code == 403
    ordered = admin.post(f"{page}/order", {"ordered": "yes"})
    assert ordered.status_code == 303
    shown = admin.get(ordered.headers["location"]).text
    assert "ordered: one delivery at a time, in send order" in shown
    assert "Deliver in parallel" in shown
    assert 'class="badge">ordered<' in admin.get("/ui/webhooks").text

    with served.client() as http:
        message = http.post("/v1/webhooks/messages", json={
            "event_type": "invoice.paid", "payload": {"id": 1}}).json()
    wait_until(lambda: _waiting_for_a_retry(sql, message["id"]), timeout=20)
    assert "Give up…" in admin.get(page).text
    asked = admin.post(f"{page}/give-up", {"message_id": message["id"]})
    assert asked.status_code == 200
    assert f"Give up message {message['id']}?" in asked.text
    given = admin.post(f"{page}/give-up", {"message_id": message["id"], "confirm": "yes"})
    assert given.status_code == 303
    assert "Delivery given up" in admin.get(given.headers["location"]).text
    status = scalar(sql, "SELECT status FROM notifyq.webhook_delivery WHERE message_id = %s",
                    [message["id"]])
    assert status == "failed"
    again = admin.post(f"{page}/give-up", {"message_id": message["id"], "confirm": "yes"})
    assert again.status_code == 409
    unordered = admin.post(f"{page}/order", {"ordered": "no"})
    assert "Deliveries go in parallel again" in admin.get(unordered.headers["location"]).text


def _waiting_for_a_retry(sql: Conn, message_id: str) -> None:
    """Its first attempt failed (nothing listens on port 9) and its run waits for the next."""
    row = sql.execute("SELECT d.attempts, r.status FROM notifyq.webhook_delivery d "
                      "JOIN notifyq.job_run r ON r.id = d.run_id WHERE d.message_id = %s",
                      [message_id]).fetchone()
    assert row is not None
    assert (row[0], row[1]) == (1, "pending")
