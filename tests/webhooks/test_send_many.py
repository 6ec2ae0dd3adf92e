"""``app.webhooks.send_many``: many messages in one transaction, fanned out set-based, in the
order given, all or nothing, idempotency keys as ``send`` has them, one NOTIFY."""

from __future__ import annotations

import anyio
import psycopg
import pytest

from notifyq import App, WebhookMessage
from notifyq._errors import InvalidEnqueue
from tests.integration.inproc import fetch, running
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.conftest import deliverer, verify, webhook_settings

pytestmark = pytest.mark.anyio


async def test_a_batch_fans_out_like_send_in_the_order_given(wapp: App) -> None:
    paid = await wapp.webhooks.create_endpoint("http://127.0.0.1:9/paid",
                                               event_types=["order.paid"])
    every = await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/off", enabled=False)
    sent = await wapp.webhooks.send_many([
        ("order.paid", {"n": 1}),
        WebhookMessage("order.refunded", {"n": 2}),
        WebhookMessage("order.paid", [3], endpoint_id=paid.id),
    ])
    assert [(s.created, s.deliveries) for s in sent] == [(True, 2), (True, 1), (True, 1)]
    rows = await fetch(wapp, "SELECT m.id, m.body, d.endpoint_id, r.pool "
                             "FROM notifyq.webhook_message m "
                             "JOIN notifyq.webhook_delivery d ON d.message_id = m.id "
                             "JOIN notifyq.job_run r ON r.id = d.run_id ORDER BY r.id")
    assert [(r["id"], r["endpoint_id"]) for r in rows] == [
        (sent[0].id, e) for e in sorted((paid.id, every.id))] + [
        (sent[1].id, every.id), (sent[2].id, paid.id)]
    assert [r["body"] for r in rows][2:] == ['{"n": 2}', "[3]"]
    assert {r["pool"] for r in rows} == {"webhooks"}


async def test_idempotency_keys_hold_inside_a_batch_and_across_batches(wapp: App) -> None:
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    before = await wapp.webhooks.send("a.b", {"n": 0}, idempotency_key="k0")
    sent = await wapp.webhooks.send_many([
        WebhookMessage("a.b", {"n": 1}, idempotency_key="k1"),
        WebhookMessage("a.b", {"n": 2}, idempotency_key="k0"),
        WebhookMessage("a.b", {"n": 3}, idempotency_key="k1"),
        WebhookMessage("a.b", {"n": 4}),
    ])
    assert [(s.created, s.deliveries) for s in sent] == [(True, 1), (False, 1), (False, 1),
                                                         (True, 1)]
    assert sent[1].id == before.id
    assert sent[2].id == sent[0].id
    bodies = await fetch(wapp, "SELECT body FROM notifyq.webhook_message ORDER BY id")
    assert [b["body"] for b in bodies] == ['{"n": 0}', '{"n": 1}', '{"n": 4}']
    again = await wapp.webhooks.send_many([WebhookMessage("a.b", {"n": 5}, idempotency_key="k1")])
    assert (again[0].id, again[0].created) == (sent[0].id, False)


async def test_one_bad_message_refuses_the_whole_batch_naming_its_place(wapp: App) -> None:
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    good = [("a.b", {"n": n}) for n in range(1500)]
    with pytest.raises(InvalidEnqueue, match=r"^message 1203: invalid event type 'bad type!'"):
        await wapp.webhooks.send_many([*good[:1202], ("bad type!", {}), *good[1202:]])
    with pytest.raises(InvalidEnqueue, match=r"^message 2: webhook payload must be a JSON "
                                             r"object or array"):
        await wapp.webhooks.send_many([("a.b", {}), ("a.b", 7)])
    with pytest.raises(InvalidEnqueue, match=r"^message 3: payload is not JSON-serializable"):
        await wapp.webhooks.send_many([("a.b", {}), ("a.b", {}), ("a.b", {"x": {1, 2}})])
    with pytest.raises(InvalidEnqueue, match=r"^message 1: no webhook endpoint"):
        await wapp.webhooks.send_many([WebhookMessage(
            "a.b", {}, endpoint_id="01a22cc2-1f7d-734a-8591-82be1a967c79")])
    counts = await fetch(wapp, "SELECT (SELECT count(*) FROM notifyq.webhook_message) AS m, "
                               "(SELECT count(*) FROM notifyq.job_run) AS r")
    assert counts == [{"m": 0, "r": 0}]


async def test_a_batch_in_the_callers_transaction_rolls_back_with_it(wapp: App,
                                                                      dsn: str) -> None:
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await wapp.webhooks.send_many([("a.b", {"n": n}) for n in range(3)], conn=conn)
        await conn.rollback()
        kept = await wapp.webhooks.send_many([("a.b", {"n": 9})], conn=conn)
        await conn.commit()
    rows = await fetch(wapp, "SELECT id FROM notifyq.webhook_message")
    assert [r["id"] for r in rows] == [kept[0].id]


async def test_a_batch_wakes_the_workers_with_one_notification(wapp: App, dsn: str) -> None:
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        await wapp.webhooks.send_many([("a.b", {"n": n}) for n in range(2500)])
        heard = []
        with anyio.move_on_after(1.0):
            async for note in listener.notifies():
                heard.append(note.payload)
    assert heard == ["j:webhooks"]


async def test_a_batch_is_delivered_once_each_and_signed(wapp: App, receiver: Receiver) -> None:
    endpoints = [await wapp.webhooks.create_endpoint(receiver.url(f"/e{n}")) for n in range(3)]
    sent = await wapp.webhooks.send_many([("a.b", {"n": n}) for n in range(40)])
    async with running(wapp, concurrency=10):
        async def all_arrived() -> None:
            assert len(receiver.requests) == 120
        await eventually(all_arrived, timeout=30)
    pairs = {(r.path, r.headers["webhook-id"]) for r in receiver.requests}
    assert pairs == {(f"/e{n}", s.id) for n in range(3) for s in sent}
    for n, endpoint in enumerate(endpoints):
        verify(endpoint.secret, receiver.at(f"/e{n}")[0])
    done = await fetch(wapp, "SELECT count(*) AS n FROM notifyq.webhook_delivery "
                             "WHERE status = 'succeeded' AND attempts = 1")
    assert done == [{"n": 120}]


async def test_a_claims_deliveries_are_loaded_in_one_statement(dsn: str,
                                                               receiver: Receiver) -> None:
    app = App(settings=webhook_settings(dsn, endpoint_concurrency=10))
    async with app:
        await app.webhooks.create_endpoint(receiver.url("/e"))
        async with running(app, concurrency=20):  # a claim takes up to 10 (half the slots)
            await anyio.sleep(0.3)  # idle, so that one claim takes the whole batch
            await app.webhooks.send_many([("a.b", {"n": n}) for n in range(10)])

            async def all_arrived() -> None:
                assert len(receiver.requests) == 10
            await eventually(all_arrived, timeout=30)
        # The claim's ten runs were prefetched together: one load, not one per delivery.
        assert deliverer(app)._loads.batches == 1
