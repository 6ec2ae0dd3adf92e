"""``send_many`` of 300 messages or more goes by COPY (notifyq/_webhooks/fanout.py): the same
rows as the statement, the same answers, refusals and idempotency, all or nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from notifyq import App, WebhookMessage
from notifyq._errors import InvalidEnqueue
from notifyq._webhooks import service
from notifyq._webhooks.fanout import COPY_MIN_MESSAGES, jsonb_bodies
from tests.integration.inproc import fetch, running
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.conftest import verify

pytestmark = pytest.mark.anyio

PAYLOADS: list[Any] = [
    {"z": 1, "a": {"yy": [1, {"bb": None, "a": True}], "b": "tab\there"}},
    ["back\\slash", "new\nline", {"é": 1, "e": 2, "ee": 3}],
    {"i": 7, "note": "quote \" and \u001f", "price": 12.5, "big": 10**20},
    {"": [], "same": {}, "x": -3},
]


def _batch(prefix: str, explicit: Any, disabled: Any, n: int = 320) -> list[WebhookMessage]:
    """A batch mixing types, explicit endpoints, keys repeated and known, retention."""
    types = ["order.paid", "order.refunded", "other"]
    out = []
    for i in range(n):
        out.append(WebhookMessage(
            types[i % 3], PAYLOADS[i % len(PAYLOADS)],
            endpoint_id=explicit if i % 17 == 5 else disabled if i % 41 == 7 else None,
            idempotency_key=(f"{prefix}-old" if i == 9 else f"{prefix}-{i % 50}" if i % 7 == 0
                             else None),
            payload_retention_s=3600.0 if i % 13 == 0 else None))
    return out


async def _rows(app: App, message_ids: list[str], prefix: str) -> list[dict[str, Any]]:
    """The batch's messages with their deliveries and runs, ids and times replaced by what
    they must equal, in id order."""
    return await fetch(app, """
        SELECT m.event_type, m.body, m.endpoint_id, substr(m.idempotency_key, %s) AS key,
               m.payload_retain_until - m.created_at AS retained, m.payload_dropped_at,
               to_jsonb(d) - '{message_id,run_id,created_at,updated_at}'::text[] AS delivery,
               d.created_at = m.created_at AS delivery_now,
               to_jsonb(r) - '{id,input,trigger_ref,run_at,created_at,updated_at}'::text[] AS run,
               r.input = jsonb_build_object('message_id', m.id, 'endpoint_id', d.endpoint_id)
                   AS input_is_its_own,
               r.trigger_ref = m.id AS ref_is_its_message,
               r.run_at = greatest(m.created_at, e.circuit_open_until) AS run_at_as_sql,
               r.created_at = m.created_at AS run_now
        FROM notifyq.webhook_message m
        LEFT JOIN notifyq.webhook_delivery d ON d.message_id = m.id
        LEFT JOIN notifyq.webhook_endpoint e ON e.id = d.endpoint_id
        LEFT JOIN notifyq.job_run r ON r.id = d.run_id
        WHERE m.id = ANY (%s)
        ORDER BY m.id, d.endpoint_id""", len(prefix) + 2, message_ids)


async def _endpoints(app: App) -> tuple[Any, Any]:
    """Endpoints with filters, one with an open circuit, one disabled, one of a tenant;
    returns (one to name explicitly, the disabled one)."""
    w = app.webhooks
    paid = await w.create_endpoint("http://127.0.0.1:9/paid", event_types=["order.paid"])
    await w.create_endpoint("http://127.0.0.1:9/all")
    await w.create_endpoint("http://127.0.0.1:9/refunds", event_types=["order.refunded"],
                            tenant_id="t1")
    opened = await w.create_endpoint("http://127.0.0.1:9/open", event_types=["other"])
    off = await w.create_endpoint("http://127.0.0.1:9/off", enabled=False)
    await fetch(app, "UPDATE notifyq.webhook_endpoint SET circuit_open_until = now() + "
                     "interval '1 hour' WHERE id = %s RETURNING id", opened.id)
    return paid.id, off.id


@pytest.mark.parametrize("defined", [True, False], ids=["defined", "no definition"])
async def test_copy_writes_the_rows_and_answers_the_statement_writes(
        wapp: App, monkeypatch: pytest.MonkeyPatch, defined: bool) -> None:
    explicit, disabled = await _endpoints(wapp)
    if defined:  # a worker registers webhook.deliver (its concurrency key and limit)
        async with running(wapp):
            pass
    answers, rows, sent_ids = {}, {}, {}
    for prefix, threshold in (("s", 10**9), ("c", COPY_MIN_MESSAGES)):
        monkeypatch.setattr(service, "COPY_MIN_MESSAGES", threshold)
        old = await wapp.webhooks.send("order.paid", {"n": 0}, idempotency_key=f"{prefix}-old")
        sent = await wapp.webhooks.send_many(_batch(prefix, explicit, disabled))
        answers[prefix] = [(s.created, s.deliveries, s.id == old.id) for s in sent]
        rows[prefix] = await _rows(wapp, [s.id for s in sent if s.created], prefix)
        sent_ids[prefix] = next(s.id for s in sent if s.created)
        assert [s.id for s in sent if s.created] == sorted(s.id for s in sent if s.created)
    if not defined:
        # COPY keys the runs by endpoint without a definition (a share of 1, `defaulted` 8,
        # as migration 0038 has the statement do); before 0038 the statement left them unkeyed.
        for r in rows["c"]:
            if r["run"] is not None:
                assert (r["run"]["concurrency_key"], r["run"]["concurrency_limit"],
                        r["run"]["defaulted"]) == (
                    f"webhook:{r['delivery']['endpoint_id']}", 1, 8)
        statement = {(r["run"]["concurrency_key"], r["run"]["defaulted"])
                     for r in rows["s"] if r["run"] is not None}
        if statement == {(None, None)}:
            for r in rows["s"] + rows["c"]:
                if r["run"] is not None:
                    for column in ("concurrency_key", "concurrency_limit", "defaulted"):
                        r["run"].pop(column)
    assert answers["c"] == answers["s"]
    assert rows["c"] == rows["s"]
    assert len(rows["c"]) > 320
    checks = ("delivery_now", "input_is_its_own", "ref_is_its_message", "run_at_as_sql",
              "run_now")
    assert {tuple(r[c] for c in checks) for r in rows["c"] if r["run"] is not None} == {
        (True,) * len(checks)}
    if defined:
        assert {(r["run"]["concurrency_key"], r["run"]["concurrency_limit"])
                for r in rows["c"] if r["run"] is not None} == {
            (f"webhook:{r['delivery']['endpoint_id']}", 5)
            for r in rows["c"] if r["run"] is not None}
    for prefix in ("s", "c"):  # runs in the batch's order, then by endpoint id, like the ids
        ids = await fetch(wapp, "SELECT d.run_id FROM notifyq.webhook_delivery d "
                                "JOIN notifyq.webhook_message m ON m.id = d.message_id "
                                "WHERE m.created_at = (SELECT created_at FROM "
                                "notifyq.webhook_message WHERE id = %s) "
                                "ORDER BY m.id, d.endpoint_id", sent_ids[prefix])
        assert [r["run_id"] for r in ids] == sorted(r["run_id"] for r in ids)


async def test_bodies_are_what_jsonb_prints(wapp: App) -> None:
    payloads = [*PAYLOADS, {"ü": 1, "z": 2}, {"bb": 1, "a": 2, "ccc": {"d": [], "cc": 0}}]
    texts = [service._payload_text(p) for p in payloads]
    bodies = jsonb_bodies(payloads, texts)
    printed = await fetch(wapp, "SELECT t::jsonb::text AS body FROM unnest(%s::text[]) t",
                          texts)
    assert bodies == [r["body"] for r in printed]
    # What jsonb prints otherwise and is not followed here: the statement's to write.
    for odd in ({"f": 1e-7}, {"f": -0.0}, {1: "int key"}):
        assert jsonb_bodies([odd], [service._payload_text(odd)]) is None


async def test_repeated_keys_answer_the_first_or_the_known_message(wapp: App) -> None:
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/paid", event_types=["a.b"])
    before = await wapp.webhooks.send("a.b", {"n": 0}, idempotency_key="k0")
    batch = [WebhookMessage("a.b", {"n": n}, idempotency_key=f"k{n % 3}") if n < 6
             else WebhookMessage("x.y", {"n": n}) for n in range(400)]
    sent = await wapp.webhooks.send_many(batch)
    assert [(s.created, s.deliveries) for s in sent[:6]] == [
        (False, 2), (True, 2), (True, 2), (False, 2), (False, 2), (False, 2)]
    assert [sent[0].id, sent[3].id, sent[4].id, sent[5].id] == [
        before.id, before.id, sent[1].id, sent[2].id]
    assert {(s.created, s.deliveries) for s in sent[6:]} == {(True, 1)}
    counts = await fetch(wapp, "SELECT (SELECT count(*) FROM notifyq.webhook_message) AS m, "
                               "(SELECT count(*) FROM notifyq.webhook_delivery) AS d")
    assert counts == [{"m": 1 + 2 + 394, "d": 2 + 4 + 394}]
    again = await wapp.webhooks.send_many([WebhookMessage("a.b", {}, idempotency_key="k1")]
                                          * 300)
    assert {(s.id, s.created, s.deliveries) for s in again} == {(sent[1].id, False, 2)}


async def test_a_refused_message_refuses_the_batch_naming_its_place(wapp: App) -> None:
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    good = [WebhookMessage("a.b", {"n": n}) for n in range(600)]
    missing = "01a22cc2-1f7d-734a-8591-82be1a967c79"
    cases = [
        (449, WebhookMessage("a.b", {}, endpoint_id=missing), "no webhook endpoint"),
        (300, WebhookMessage("a.b", {}, idempotency_key="k" * 257),
         "idempotency_key must be 1 to 256 characters"),
        (350, WebhookMessage("a.b", 7),  # type: ignore[arg-type]
         "webhook payload must be a JSON object or array"),
        (500, WebhookMessage("a" * 129, {}), "invalid event type"),
        (420, WebhookMessage("a.b", {"big": "x" * 262_144}), "webhook payload is"),
    ]
    for place, bad, message in cases:
        with pytest.raises(InvalidEnqueue, match=rf"^message {place + 1}: {message}"):
            await wapp.webhooks.send_many([*good[:place], bad, *good[place:]])
    counts = await fetch(wapp, "SELECT (SELECT count(*) FROM notifyq.webhook_message) AS m, "
                               "(SELECT count(*) FROM notifyq.job_run) AS r")
    assert counts == [{"m": 0, "r": 0}]


async def test_a_copied_batch_rolls_back_with_the_callers_transaction(wapp: App,
                                                                       dsn: str) -> None:
    await wapp.webhooks.create_endpoint("http://127.0.0.1:9/all")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await wapp.webhooks.send_many([("a.b", {"n": n}) for n in range(500)], conn=conn)
        await conn.rollback()
        kept = await wapp.webhooks.send_many(
            [WebhookMessage("a.b", {"n": n}, idempotency_key=f"k{n}") for n in range(300)],
            conn=conn)
        await conn.commit()
    rows = await fetch(wapp, "SELECT (SELECT count(*) FROM notifyq.webhook_message) AS m, "
                             "(SELECT count(*) FROM notifyq.job_run) AS r, "
                             "(SELECT count(*) FROM notifyq.webhook_delivery) AS d, "
                             "(SELECT min(id) FROM notifyq.webhook_message) AS first")
    assert rows == [{"m": 300, "r": 300, "d": 300, "first": kept[0].id}]


async def test_a_copied_batch_is_delivered_once_each_and_signed(wapp: App,
                                                                  receiver: Receiver) -> None:
    endpoints = [await wapp.webhooks.create_endpoint(receiver.url(f"/e{n}"), event_types=[t])
                 for n, t in enumerate(["a.b", "c.d"])]
    batch = [WebhookMessage(("a.b", "c.d")[n % 2], {"n": n}) for n in range(COPY_MIN_MESSAGES)]
    batch += [WebhookMessage("c.d", {"n": "to e0"}, endpoint_id=endpoints[0].id)]
    sent = await wapp.webhooks.send_many(batch)
    async with running(wapp, concurrency=20):
        async def all_arrived() -> None:
            assert len(receiver.requests) == len(batch)
        await eventually(all_arrived, timeout=60)
    pairs = [(r.path, r.headers["webhook-id"]) for r in receiver.requests]
    assert sorted(pairs) == sorted([(f"/e{n % 2}", s.id) for n, s in enumerate(sent[:-1])]
                                   + [("/e0", sent[-1].id)])
    for n, endpoint in enumerate(endpoints):
        verify(endpoint.secret, receiver.at(f"/e{n}")[0])
    done = await fetch(wapp, "SELECT count(*) AS n FROM notifyq.webhook_delivery "
                             "WHERE status = 'succeeded' AND attempts = 1")
    assert done == [{"n": len(batch)}]
