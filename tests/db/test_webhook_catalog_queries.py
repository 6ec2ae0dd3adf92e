"""The event-type catalog's and replay-missing's named queries, run directly (the Python around
them: tests/webhooks/test_event_types.py and tests/webhooks/test_replay.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.test_webhook_queries import _endpoint, _send

Conn = psycopg.Connection[dict[str, Any]]


def test_event_types_are_upserted_listed_by_name_and_deleted(db: Conn, q: Queries) -> None:
    upsert = {"name": "b.paid", "description": "paid", "schema": Jsonb({"type": "object"}),
              "now": T0}
    row = db.execute(q.webhook_event_type_upsert, upsert).fetchone()
    assert row is not None
    assert (row["name"], row["schema"], row["created_at"]) == ("b.paid", {"type": "object"}, T0)
    db.execute(q.webhook_event_type_upsert, {**upsert, "name": "a.sent", "schema": None})
    later = T0 + timedelta(hours=1)
    db.execute(q.webhook_event_type_upsert, {**upsert, "description": "now paid",
                                              "schema": None, "now": later})
    listed = db.execute(q.webhook_event_type_list).fetchall()
    assert [(r["name"], r["description"], r["schema"], r["created_at"], r["updated_at"])
            for r in listed] == [("a.sent", "paid", None, T0, T0),
                                 ("b.paid", "now paid", None, T0, later)]
    assert db.execute(q.webhook_event_type_delete, {"name": "a.sent"}).fetchall() == [
        {"name": "a.sent"}]
    assert db.execute(q.webhook_event_type_delete, {"name": "a.sent"}).fetchall() == []


def _params(endpoint_id: Any, since: datetime, limit: int) -> dict[str, Any]:
    return {"endpoint_id": endpoint_id, "since": since, "limit": limit, "now": None,
            "from_id": f"msg_{int(since.timestamp() * 1000):012x}"}


def test_replay_missing_finds_what_an_endpoint_never_got_and_gives_each_one_delivery(
        db: Conn, q: Queries) -> None:
    row = db.execute("SELECT now() - interval '1 second' AS since").fetchone()
    assert row is not None
    since = row["since"]
    elsewhere = _endpoint(db, q, event_types=["a.b"])
    paused = _endpoint(db, q, event_types=["a.b"], enabled=False)
    missed = [_send(db, q)["message_id"] for _ in range(3)]  # while it was disabled
    _send(db, q, "c.d")  # a type it does not receive
    _send(db, q, endpoint_id=elsewhere)  # another endpoint's message
    [[count]] = [list(r.values()) for r in db.execute(
        q.webhook_delivery_missing_count, _params(paused, since, 10)).fetchall()]
    assert count == 3
    db.execute(q.webhook_delivery_replay_lock, {"endpoint_id": paused})
    first = db.execute(q.webhook_delivery_replay_missing, _params(paused, since, 2)).fetchall()
    assert [r["message_id"] for r in first] == sorted(missed)[:2]
    rest = db.execute(q.webhook_delivery_replay_missing, _params(paused, since, 10)).fetchall()
    assert [r["message_id"] for r in rest] == sorted(missed)[2:]
    assert db.execute(q.webhook_delivery_replay_missing,
                      _params(paused, since, 10)).fetchall() == []
    deliveries = db.execute("SELECT d.status, r.job_type, r.trigger_source FROM "
                            "notifyq.webhook_delivery d JOIN notifyq.job_run r ON r.id = "
                            "d.run_id WHERE d.endpoint_id = %s", (paused,)).fetchall()
    assert deliveries == [{"status": "pending", "job_type": "webhook.deliver",
                           "trigger_source": "manual"}] * 3
    # Nothing from before `since`.
    assert db.execute(q.webhook_delivery_missing_count, _params(
        _endpoint(db, q), since + timedelta(hours=1), 10)).fetchone() == {"missing": 0}
