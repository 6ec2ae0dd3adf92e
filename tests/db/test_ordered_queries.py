"""The named queries of ordered webhook endpoints (migrations 0029, 0039), run directly: a pinned
key's limit, the head that keeps its place (its ``key_head`` flag), its release, giving a
delivery up, and a batch's runs in the batch's order. End to end with workers:
tests/webhooks/test_ordered.py."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq._db import migrate as migrations
from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.test_webhook_queries import _endpoint
from tests.db.test_webhook_retention_queries import _migrate_until

Conn = psycopg.Connection[dict[str, Any]]


def _deliver_def(db: Conn) -> None:
    db.execute("INSERT INTO notifyq.job (type, pool, concurrency_key_template, "
               "concurrency_limit) VALUES ('webhook.deliver', 'webhooks', "
               "'webhook:{endpoint_id}', 5)")


def _batch(db: Conn, q: Queries, n: int) -> list[dict[str, Any]]:
    """Sends ``n`` messages in one batch; their runs, in the claim's order."""
    sent = db.execute(q.webhook_message_send_many, {
        "event_types": ["a.b"] * n, "payloads": [f'{{"n": {i}}}' for i in range(n)],
        "endpoint_ids": [None] * n, "idempotency_keys": [None] * n}).fetchall()
    order = {row["message_id"]: row["ord"] for row in sent}
    runs = db.execute("SELECT r.*, d.message_id FROM notifyq.job_run r "
                      "JOIN notifyq.webhook_delivery d ON d.run_id = r.id "
                      "ORDER BY r.priority, r.run_at, r.id").fetchall()
    return [{**r, "n": order[r["message_id"]]} for r in runs]


def test_a_batchs_runs_are_claimed_in_the_batchs_order(db: Conn, q: Queries) -> None:
    _endpoint(db, q)
    _deliver_def(db)
    runs = _batch(db, q, 200)
    assert [r["n"] for r in runs] == list(range(1, 201))


def test_a_pinned_key_keeps_its_limit_through_resizing_until_unpinned(
        db: Conn, q: Queries) -> None:
    pinned = db.execute(q.key_concurrency_pin, {"key": "webhook:a", "limit": 1, "now": T0}
                        ).fetchone()
    assert pinned == {"key": "webhook:a", "concurrency_limit": 1}
    resized = db.execute(q.key_concurrency_resize, {
        "keys": ["webhook:a", "webhook:b"], "overloaded": [0, 0], "grow": [1, 1],
        "share_start": 5,
        "share_max": 100, "now": T0}).fetchall()
    assert resized == [{"key": "webhook:b", "concurrency_limit": 6}]  # a: left alone
    assert db.execute(q.key_concurrency_unpin, {"key": "webhook:b"}).fetchall() == []
    assert db.execute(q.key_concurrency_unpin, {"key": "webhook:a"}).fetchall() == [
        {"key": "webhook:a"}]
    left = db.execute("SELECT key, pinned FROM notifyq.key_concurrency").fetchall()
    assert left == [{"key": "webhook:b", "pinned": False}]


def test_a_running_delivery_of_an_ordered_endpoint_keeps_its_place_until_released(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    _deliver_def(db)
    head, *_ = _batch(db, q, 3)
    place = {"run_id": head["id"], "endpoint_id": endpoint, "now": T0}
    assert db.execute(q.webhook_delivery_keep_place, place).fetchall() == []  # not running
    db.execute("UPDATE notifyq.job_run SET status = 'running' WHERE id = %s", (head["id"],))
    assert db.execute(q.webhook_delivery_keep_place, place).fetchall() == []  # not ordered
    row = db.execute(q.webhook_endpoint_set_ordered, {"id": endpoint, "ordered": True,
                                                      "now": T0}).fetchone()
    assert row is not None
    assert row["ordered"]
    assert db.execute(q.webhook_delivery_keep_place, place).fetchall() == [{"id": head["id"]}]
    # snoozed: pending again, due later, and still the key's head
    db.execute("UPDATE notifyq.job_run SET status = 'pending', run_at = %s WHERE id = %s",
               (T0, head["id"]))
    claim_order = ("SELECT id, priority, key_head FROM notifyq.job_run "
                   "ORDER BY key_head DESC, priority, run_at, id")
    runs = db.execute(claim_order).fetchall()
    assert runs[0] == {"id": head["id"], "priority": 0, "key_head": True}  # its own priority
    assert [r["key_head"] for r in runs[1:]] == [False, False]
    released = db.execute(q.webhook_delivery_release_places, {
        "key": f"webhook:{endpoint}", "now": T0}).fetchall()
    assert released == [{"id": head["id"]}]
    assert db.execute("SELECT DISTINCT priority, key_head FROM notifyq.job_run").fetchall() == [
        {"priority": 0, "key_head": False}]
    assert db.execute(claim_order).fetchall()[0]["id"] != head["id"]  # back in run_at order


def test_giving_up_fails_a_waiting_delivery_cancels_its_run_and_wakes_the_pool(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    _deliver_def(db)
    first, second, _ = _batch(db, q, 3)
    db.execute("UPDATE notifyq.job_run SET status = 'running' WHERE id = %s", (second["id"],))
    db.execute("LISTEN notifyq")
    params = {"endpoint_id": endpoint, "reason": "poison", "now": T0, "channel": "notifyq"}
    given = db.execute(q.webhook_delivery_give_up, {**params,
                                                    "message_id": first["message_id"]}
                       ).fetchall()
    assert [r["run_id"] for r in given] == [first["id"]]
    assert [n.payload for n in db.notifies(timeout=1, stop_after=1)] == ["j:webhooks"]
    state = db.execute("SELECT d.status, d.last_error, r.status AS run FROM "
                       "notifyq.webhook_delivery d JOIN notifyq.job_run r ON r.id = d.run_id "
                       "WHERE d.message_id = %s", (first["message_id"],)).fetchone()
    assert state == {"status": "failed", "last_error": "poison", "run": "canceled"}
    # being attempted right now, or already over: nothing to give up
    for message in (second["message_id"], first["message_id"]):
        assert db.execute(q.webhook_delivery_give_up, {**params, "message_id": message}
                          ).fetchall() == []


@pytest.mark.anyio
async def test_the_migration_turns_a_head_kept_by_priority_into_a_flagged_head(
        empty_dsn: str, q: Queries) -> None:
    with psycopg.connect(empty_dsn, autocommit=True, row_factory=dict_row) as db:
        _migrate_until(db, q, 39)
        db.execute("SET search_path TO notifyq, public")
        endpoint = _endpoint(db, q)
        other = _endpoint(db, q)
        _deliver_def(db)
        db.execute("UPDATE webhook_endpoint SET ordered = true WHERE id = %s", (endpoint,))
        runs = _batch(db, q, 3)
        # 0029's head: a retry waiting at priority -1000, due after the others
        head = next(r for r in runs if r["concurrency_key"] == f"webhook:{endpoint}")
        db.execute("UPDATE job_run SET priority = -1000, run_at = run_at + interval '1 hour' "
                   "WHERE id = %s", (head["id"],))
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as conn:
        assert 39 in [m.version for m in await migrations.migrate(conn, "notifyq")]
    with psycopg.connect(empty_dsn, autocommit=True, row_factory=dict_row) as db:
        rows = db.execute("SELECT id, priority, key_head FROM notifyq.job_run "
                          "WHERE concurrency_key = %s ORDER BY key_head DESC, priority, run_at, id",
                          (f"webhook:{endpoint}",)).fetchall()
        assert rows[0] == {"id": head["id"], "priority": 0, "key_head": True}
        assert [(r["priority"], r["key_head"]) for r in rows[1:]] == [(0, False)] * 2
        others = db.execute("SELECT DISTINCT priority, key_head FROM notifyq.job_run "
                            "WHERE concurrency_key = %s", (f"webhook:{other}",)).fetchall()
        assert others == [{"priority": 0, "key_head": False}]
