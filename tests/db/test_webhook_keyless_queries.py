"""Webhook runs sent before any worker ever registered ``webhook.deliver`` (migration 0038),
run directly: every path that makes a delivery run keys it by its endpoint without the
definition, the keyed claim holds them to their endpoint's share, and the definition's share
and timeout reach them when it appears. End to end with worker processes:
tests/webhooks/test_sent_before_workers.py."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import DEFINITION, Conn
from tests.db.test_webhook_catalog_queries import _params
from tests.db.test_webhook_queries import _endpoint, _send

DELIVER = {**DEFINITION, "type": "webhook.deliver", "pool": "webhooks", "max_attempts": 100,
           "timeout_s": 45.0, "concurrency_key_template": "webhook:{endpoint_id}",
           "concurrency_limit": 5, "version": 3}
"""The definition a worker with webhooks writes (notifyq/_app.py, the built-in handler)."""


def _runs(db: Conn) -> list[dict[str, Any]]:
    return db.execute("SELECT r.id, r.pool, r.concurrency_key, r.concurrency_limit, "
                      "r.defaulted, r.timeout_s, r.job_version, d.endpoint_id "
                      "FROM notifyq.job_run r JOIN notifyq.webhook_delivery d "
                      "ON d.run_id = r.id ORDER BY r.id").fetchall()


def _send_many(db: Conn, q: Queries, n: int) -> None:
    db.execute(q.webhook_message_send_many, {
        "event_types": ["a.b"] * n, "payloads": [f'{{"n": {i}}}' for i in range(n)],
        "endpoint_ids": [None] * n, "idempotency_keys": [None] * n}).fetchall()


def test_runs_sent_before_any_definition_are_keyed_by_their_endpoint_with_a_share_of_one(
        db: Conn, q: Queries) -> None:
    a, b = _endpoint(db, q), _endpoint(db, q)
    _send(db, q)
    _send_many(db, q, 3)
    assert db.execute("SELECT count(*) AS n FROM notifyq.job").fetchone() == {"n": 0}
    runs = _runs(db)
    assert len(runs) == 8
    for run in runs:
        assert (run["pool"], run["concurrency_key"], run["concurrency_limit"],
                run["defaulted"], run["timeout_s"]) == (
            "webhooks", f"webhook:{run['endpoint_id']}", 1, 8, None)
    # The keyed claim sees them: one of each endpoint's four at a time.
    claimed = db.execute(q.job_run_claim_keyed, {"now": None, "pool": "webhooks", "limit": 100,
                                                 "worker_id": "w", "lease_s": 30.0}).fetchall()
    assert sorted(r["concurrency_key"] for r in claimed) == sorted(
        [f"webhook:{a}", f"webhook:{b}"])


def test_the_definition_gives_them_its_share_timeout_and_version_when_it_appears(
        db: Conn, q: Queries) -> None:
    _endpoint(db, q)
    _send_many(db, q, 2)
    db.execute(q.job_upsert, {**DELIVER, "retry_policy": Jsonb({})})
    applied = db.execute(q.job_run_apply_definitions, {"now": T0, "channel": "notifyq"}
                         ).fetchall()
    assert [(r["pool"], r["runs"]) for r in applied] == [("webhooks", 2)]
    for run in _runs(db):
        assert (run["concurrency_key"], run["concurrency_limit"], run["defaulted"],
                run["timeout_s"], run["job_version"]) == (
            f"webhook:{run['endpoint_id']}", 5, None, 45.0, 3)
    # Sent with the definition in place: its values at once, nothing left to apply.
    _send(db, q)
    assert {(r["concurrency_limit"], r["defaulted"]) for r in _runs(db)} == {(5, None)}
    assert db.execute(q.job_run_apply_definitions, {"now": T0, "channel": "notifyq"}
                      ).fetchall() == []


def test_resend_recover_and_replay_key_their_runs_without_a_definition(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q)["message_id"]
    resent = db.execute(q.webhook_delivery_resend, {"message_id": message,
                                                    "endpoint_id": None}).fetchall()
    db.execute("UPDATE notifyq.webhook_delivery SET status = 'failed', last_attempt_at = %s",
               (T0,))
    recovered = db.execute(q.webhook_delivery_recover, {"endpoint_id": endpoint, "since": T0,
                                                        "limit": 10, "now": T0}).fetchall()
    row = db.execute("SELECT now() - interval '1 second' AS since").fetchone()
    assert row is not None
    paused = _endpoint(db, q, enabled=False)
    _send(db, q)
    db.execute(q.webhook_delivery_replay_lock, {"endpoint_id": paused})
    replayed = db.execute(q.webhook_delivery_replay_missing,
                          _params(paused, row["since"], 10)).fetchall()
    keys = {r["id"]: r["concurrency_key"] for r in db.execute(
        "SELECT id, concurrency_key FROM notifyq.job_run").fetchall()}
    assert [keys[r["run_id"]] for r in (*resent, *recovered)] == [f"webhook:{endpoint}"] * 2
    assert [keys[r["run_id"]] for r in replayed] == [f"webhook:{paused}"] * 2
    assert db.execute("SELECT count(*) AS n FROM notifyq.job").fetchone() == {"n": 0}
