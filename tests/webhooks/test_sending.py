"""Sending: fan-out by event type, idempotency, SQL inside the caller's transaction, workers
delivering end to end, manual resend, recovery, and a worker SIGKILLed after the POST."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from notifyq import App
from notifyq._errors import InvalidEnqueue
from tests import vault
from tests.integration.inproc import fetch, running, status_becomes
from tests.receiver import Receiver, Reply
from tests.support import eventually, spawn_worker, stop, wait_until
from tests.webhooks.conftest import verify

pytestmark = pytest.mark.anyio


async def test_a_send_fans_out_to_every_enabled_endpoint_subscribed_to_the_event_type(
        wapp: App, receiver: Receiver) -> None:
    paid = await wapp.webhooks.create_endpoint(receiver.url("/paid"), event_types=["order.paid"])
    every = await wapp.webhooks.create_endpoint(receiver.url("/all"))
    await wapp.webhooks.create_endpoint(receiver.url("/refunds"), event_types=["order.refunded"])
    await wapp.webhooks.create_endpoint(receiver.url("/off"), enabled=False)
    sent = await wapp.webhooks.send("order.paid", {"id": 1})
    assert (sent.created, sent.deliveries) == (True, 2)
    rows = await fetch(wapp, "SELECT d.endpoint_id, r.job_type, r.pool, r.input "
                             "FROM notifyq.webhook_delivery d JOIN notifyq.job_run r "
                             "ON r.id = d.run_id WHERE d.message_id = %s", sent.id)
    assert {r["endpoint_id"] for r in rows} == {paid.id, every.id}
    assert {(r["job_type"], r["pool"]) for r in rows} == {("webhook.deliver", "webhooks")}
    async with running(wapp):
        await eventually(lambda: _count(receiver, 2))
    assert sorted(r.path for r in receiver.requests) == ["/all", "/paid"]
    assert {r.headers["webhook-id"] for r in receiver.requests} == {sent.id}
    verify(paid.secret, receiver.at("/paid")[0])
    verify(every.secret, receiver.at("/all")[0])


async def _count(receiver: Receiver, n: int) -> None:
    assert len(receiver.requests) == n


async def test_an_idempotency_key_returns_the_existing_message(wapp: App,
                                                               receiver: Receiver) -> None:
    await wapp.webhooks.create_endpoint(receiver.url())
    first = await wapp.webhooks.send("order.paid", {"id": 1}, idempotency_key="order-1")
    again = await wapp.webhooks.send("order.paid", {"id": 999}, idempotency_key="order-1")
    assert (again.id, again.created, again.deliveries) == (first.id, False, 1)
    runs = await fetch(wapp, "SELECT count(*) AS n FROM notifyq.job_run")
    assert runs[0]["n"] == 1


async def test_bad_sends_are_refused_at_the_edge(wapp: App) -> None:
    with pytest.raises(InvalidEnqueue, match="invalid event type"):
        await wapp.webhooks.send("bad type!", {})
    with pytest.raises(InvalidEnqueue, match="no webhook endpoint"):
        await wapp.webhooks.send("a.b", {}, endpoint_id="01a22cc2-1f7d-734a-8591-82be1a967c79")


async def test_sql_send_webhook_commits_and_rolls_back_with_the_callers_transaction(
        wapp: App, receiver: Receiver, dsn: str) -> None:
    await wapp.webhooks.create_endpoint(receiver.url())
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT notifyq.send_webhook('order.paid', '{\"n\": 1}')")
        conn.rollback()
        row = conn.execute("SELECT notifyq.send_webhook('order.paid', '{\"n\": 2}', "
                           "idempotency_key => 'k2')").fetchone()
        conn.commit()
    assert row is not None
    messages = await fetch(wapp, "SELECT id, body FROM notifyq.webhook_message")
    assert [(m["id"], m["body"]) for m in messages] == [(row[0], '{"n": 2}')]
    async with running(wapp):
        await eventually(lambda: _count(receiver, 1))
    assert receiver.requests[0].body == b'{"n": 2}'
    assert receiver.requests[0].headers["webhook-id"] == row[0]


async def test_a_worker_retries_on_the_webhook_schedule_until_the_receiver_accepts(
        wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(503), Reply(500))
    ep = await wapp.webhooks.create_endpoint(receiver.url())
    sent = await wapp.webhooks.send("order.paid", {"id": 1})
    run_id = (await fetch(wapp, "SELECT run_id FROM notifyq.webhook_delivery"))[0]["run_id"]
    async with running(wapp):
        row = await status_becomes(wapp, run_id, "completed")
    assert row["attempts"] <= 1  # the webhook schedule snoozes; generic attempts are not used
    attempts = await wapp.webhooks.attempts(sent.id)
    assert [a["status_code"] for a in attempts] == [503, 500, 200]
    assert {a["run_id"] for a in attempts} == {run_id}
    for request in receiver.requests:
        verify(ep.secret, request)


async def test_a_manual_resend_is_one_attempt_that_schedules_no_retry(
        wapp: App, receiver: Receiver) -> None:
    ep = await wapp.webhooks.create_endpoint(receiver.url())
    sent = await wapp.webhooks.send("order.paid", {"id": 1})
    async with running(wapp):
        await eventually(lambda: _count(receiver, 1))
        receiver.script("/hook", Reply(500))
        [resent] = await wapp.webhooks.resend(sent.id)
        row = await status_becomes(wapp, resent["run_id"], "completed")
    assert row["output"]["status_code"] == 500
    attempts = await wapp.webhooks.attempts(sent.id)
    assert [(a["trigger"], a["status_code"], a["next_attempt_at"]) for a in attempts] == [
        ("scheduled", 200, None), ("manual", 500, None)]
    assert [r.headers["webhook-id"] for r in receiver.requests] == [sent.id, sent.id]
    delivery = (await fetch(wapp, "SELECT status FROM notifyq.webhook_delivery"))[0]
    assert delivery["status"] == "succeeded"
    verify(ep.secret, receiver.requests[1])


async def test_recover_since_re_enqueues_the_failed_deliveries_of_an_endpoint(
        wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", *[Reply(500)] * 6)
    ep = await wapp.webhooks.create_endpoint(receiver.url())
    before = datetime.now(UTC) - timedelta(seconds=5)
    first = await wapp.webhooks.send("order.paid", {"id": 1})
    second = await wapp.webhooks.send("order.paid", {"id": 2})
    async with running(wapp):
        for sent in (first, second):
            await eventually(lambda sent=sent: _delivery_status(wapp, sent.id, "failed"))
        recovered = await wapp.webhooks.recover(ep.id, before)
        assert sorted(r["message_id"] for r in recovered) == sorted([first.id, second.id])
        for sent in (first, second):
            await eventually(lambda sent=sent: _delivery_status(wapp, sent.id, "succeeded"))
    assert await wapp.webhooks.recover(ep.id, before) == []  # nothing failed any more
    assert len(await wapp.webhooks.attempts(first.id)) == 4


async def _delivery_status(app: App, message_id: str, status: str) -> None:
    rows = await fetch(app, "SELECT status FROM notifyq.webhook_delivery WHERE message_id = %s",
                       message_id)
    assert rows[0]["status"] == status, rows


def _worker_env() -> dict[str, str]:
    return {"NOTIFYQ_KEYS": f"1:{vault.b64(vault.KEY1)}", "NOTIFYQ_ACTIVE_KEY_VERSION": "1",
            "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}


async def test_a_worker_killed_after_the_post_but_before_recording_resends_the_same_webhook_id(
        wapp: App, receiver: Receiver, dsn: str) -> None:
    ep = await wapp.webhooks.create_endpoint(receiver.url())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        victim = spawn_worker(dsn, "tests.apps.webhooks:app", extra_env=_worker_env())
        procs.append(victim)
        receiver.script("/hook", Reply(200, on_request=lambda: os.kill(victim.pid,
                                                                       signal.SIGKILL)))
        sent = await wapp.webhooks.send("order.paid", {"id": 1})
        wait_until(lambda: _assert(victim.poll() is not None), timeout=20)
        assert len(receiver.requests) == 1
        assert await wapp.webhooks.attempts(sent.id) == []  # the POST was never recorded
        procs.append(spawn_worker(dsn, "tests.apps.webhooks:app", extra_env=_worker_env()))
        await eventually(lambda: _delivery_status(wapp, sent.id, "succeeded"), timeout=30)
    finally:
        for proc in procs:
            stop(proc)
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == sent.id
    verify(ep.secret, first)
    verify(ep.secret, second)
    attempts = await wapp.webhooks.attempts(sent.id)
    assert [(a["attempt"], a["status_code"]) for a in attempts] == [(1, 200)]


def _assert(condition: bool) -> None:
    assert condition


