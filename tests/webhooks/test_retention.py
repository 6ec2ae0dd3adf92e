"""Retention (issue 34 item 4): the leader's retainer makes webhook_attempt's partitions and drops
payloads past retention; a message without its payload keeps its deliveries and attempts and is
refused a resend from Python, the API and the command line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from notifyq import App, InvalidEnqueue, InvalidTransition, ManualClock
from notifyq._db.queries import queries_for
from notifyq._maintenance.retainer import Retainer
from tests.integration.inproc import running, scalar
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.test_api_cli import _cli, api  # noqa: F401 - the fixture

pytestmark = pytest.mark.anyio


async def _retainer(app: App, clock: ManualClock) -> Retainer:
    return Retainer(await app.pool(), app._runtime.queries, clock, app.settings.webhooks,
                    app.settings.purger)


async def _delivered(app: App, message_id: str) -> None:
    async def check() -> None:
        assert [d["status"] for d in (await app.webhooks.message(message_id))["deliveries"]] == [
            "succeeded"]
    await eventually(check)


async def test_a_payload_past_its_retention_is_dropped_and_its_resend_refused(
        wapp: App, receiver: Receiver) -> None:
    endpoint = await wapp.webhooks.create_endpoint(receiver.url())
    short = await wapp.webhooks.send("order.paid", {"id": 1}, payload_retention_s=60)
    kept = await wapp.webhooks.send("order.paid", {"id": 2})
    async with running(wapp):
        await _delivered(wapp, short.id)
        await _delivered(wapp, kept.id)
    clock = ManualClock(datetime.now(UTC) + timedelta(minutes=2))
    counts = await (await _retainer(wapp, clock)).run_once()
    assert counts["payloads_dropped"] == 1
    message = await wapp.webhooks.message(short.id)
    assert message["body"] == ""
    assert message["payload_dropped_at"] == clock.now()
    assert [d["endpoint_id"] for d in message["deliveries"]] == [endpoint.id]
    assert [a["status_code"] for a in await wapp.webhooks.attempts(short.id)] == [200]
    with pytest.raises(InvalidTransition, match=r"cannot be resent: its payload was dropped"):
        await wapp.webhooks.resend(short.id)
    assert len(await wapp.webhooks.resend(kept.id)) == 1  # 30 days by default
    with pytest.raises(InvalidEnqueue, match="payload_retention_s must be more than 0"):
        await wapp.webhooks.send("order.paid", {"id": 3}, payload_retention_s=0)


async def test_the_leader_makes_the_partitions_ahead(wapp: App) -> None:
    ahead = datetime.now(UTC) + timedelta(days=7)
    name = f"webhook_attempt_{ahead:%Y%m%d}"
    assert wapp.settings.database_url is not None
    async with await psycopg.AsyncConnection.connect(wapp.settings.database_url,
                                                     autocommit=True) as conn:
        await conn.execute(f"DROP TABLE notifyq.{name}")

    async def made_again() -> None:
        assert await scalar(wapp, "SELECT to_regclass(%s) IS NOT NULL",
                            f"notifyq.{name}") is True
    async with running(wapp):
        await eventually(made_again, timeout=20)


async def test_the_api_takes_a_retention_and_refuses_to_resend_a_dropped_payload(
        api: tuple[App, httpx.AsyncClient], receiver: Receiver) -> None:  # noqa: F811
    app, client = api
    await app.webhooks.create_endpoint(receiver.url())
    refused = await client.post("/v1/webhooks/messages", json={
        "event_type": "order.paid", "payload": {"id": 1}, "payload_retention_s": -1})
    assert refused.status_code == 422
    assert refused.json()["field"] == "payload_retention_s"
    sent = await client.post("/v1/webhooks/messages", json={
        "event_type": "order.paid", "payload": {"id": 1}, "payload_retention_s": 30})
    assert sent.status_code == 201, sent.text
    message_id = sent.json()["id"]
    async with running(app):
        await _delivered(app, message_id)
    await (await _retainer(app, ManualClock(datetime.now(UTC) + timedelta(minutes=1)))).run_once()
    got = (await client.get(f"/v1/webhooks/messages/{message_id}")).json()
    assert got["body"] == ""
    assert got["payload_dropped_at"] is not None
    attempts = await client.get(f"/v1/webhooks/messages/{message_id}/attempts")
    assert [a["status_code"] for a in attempts.json()["items"]] == [200]
    resend = await client.post(f"/v1/webhooks/messages/{message_id}/resend")
    assert resend.status_code == 409
    assert resend.headers["content-type"] == "application/problem+json"
    assert "its payload was dropped" in resend.json()["detail"]


def test_the_command_line_sends_with_a_retention_and_refuses_the_resend(
        dsn: str, receiver: Receiver) -> None:
    added = _cli(dsn, "endpoints", "add", receiver.url())
    assert added.returncode == 0, added.stderr
    sent = _cli(dsn, "send", "order.paid", "--payload", '{"id": 9}',
                "--payload-retention-s", "5")
    assert sent.returncode == 0, sent.stderr
    message_id = sent.stdout.strip()
    q = queries_for("notifyq")
    with psycopg.connect(dsn, autocommit=True) as conn:
        retain: Any = conn.execute("SELECT payload_retain_until - created_at FROM "
                                   "notifyq.webhook_message WHERE id = %s",
                                   (message_id,)).fetchone()
        assert retain == (timedelta(seconds=5),)
        conn.execute("UPDATE notifyq.webhook_delivery SET status = 'succeeded'")
        dropped = conn.execute(q.webhook_message_drop_payloads, {
            "now": datetime.now(UTC) + timedelta(seconds=6), "retention_s": 86_400.0,
            "limit": 10})
        assert dropped.rowcount == 1
    resent = _cli(dsn, "resend", message_id)
    assert resent.returncode != 0
    assert "cannot be resent: its payload was dropped" in resent.stderr
