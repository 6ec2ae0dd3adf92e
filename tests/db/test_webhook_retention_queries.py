"""Retention without bloat (migration 0031), its named queries run directly: webhook_attempt's
daily partitions made ahead and dropped past retention, the default partition's leftovers
deleted, message payloads dropped with their metadata kept; and the migration itself, on a
database that already holds attempts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq._db import migrate as migrations
from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.test_webhook_queries import _attempt, _endpoint, _record_many, _send

Conn = psycopg.Connection[dict[str, Any]]
DAY = 86_400.0


def _partitions(db: Conn) -> dict[str, Any]:
    rows = db.execute("SELECT name, upper_bound FROM notifyq._webhook_attempt_partitions()")
    return {r["name"]: r["upper_bound"] for r in rows.fetchall()}


def _where(db: Conn) -> dict[str, int]:
    """Attempts per partition."""
    rows = db.execute("SELECT tableoid::regclass::text AS p, count(*)::integer AS n "
                      "FROM notifyq.webhook_attempt GROUP BY 1").fetchall()
    return {r["p"].removeprefix("notifyq."): r["n"] for r in rows}


def _day(at: datetime) -> str:
    return f"webhook_attempt_{at.astimezone(UTC):%Y%m%d}"


def test_partitions_are_made_ahead_once_per_day(db: Conn, q: Queries) -> None:
    start = datetime.now(UTC) + timedelta(days=40)
    made = db.execute(q.webhook_attempt_partitions_make, {"now": start, "days": 3}).fetchone()
    assert made == {"made": 4}  # start's day and the 3 after it
    parts = _partitions(db)
    for n in range(4):
        assert _day(start + timedelta(days=n)) in parts
    assert parts[_day(start)] == datetime.combine(
        (start + timedelta(days=1)).date(), datetime.min.time(), UTC)
    again = db.execute(q.webhook_attempt_partitions_make, {"now": start, "days": 3}).fetchone()
    assert again == {"made": 0}
    # the migration made today and 7 days ahead
    assert _day(datetime.now(UTC) + timedelta(days=7)) in parts


def test_attempts_go_to_their_day_and_retention_drops_old_days_keeping_new_ones(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    soon = datetime.now(UTC) + timedelta(days=3)  # today is the legacy partition's last day
    later = soon + timedelta(days=7)
    db.execute(q.webhook_attempt_partitions_make, {"now": later, "days": 1})
    for at in (soon, later):
        _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status=None)], at)
    assert _where(db) == {_day(soon): 1, _day(later): 1}

    dropped = db.execute(q.webhook_attempt_partitions_drop, {
        "now": later, "retention_s": 5 * DAY, "limit": 100}).fetchall()
    names = [r["name"] for r in dropped]
    assert names[0] == "webhook_attempt_legacy"  # the oldest bound first
    assert _day(soon) in names
    assert _day(later) not in names
    assert all(r["upper_bound"] <= later - timedelta(days=5) for r in dropped)
    assert _where(db) == {_day(later): 1}
    assert _day(later) in _partitions(db)
    # the message and its delivery stay; the attempt lists still read what is left
    listed = db.execute(q.webhook_attempt_list, {"message_id": message, "limit": 10}).fetchall()
    assert [r["created_at"] for r in listed] == [later]
    assert db.execute("SELECT count(*) AS n FROM notifyq.webhook_delivery").fetchone() == {"n": 1}


def test_attempts_with_no_partition_land_in_the_default_one_and_are_deleted_past_retention(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    for at in (T0, T0 + timedelta(days=20)):  # 2030: no partition was made for these days
        _record_many(db, q, [_attempt(message, endpoint, succeeded=True, status="succeeded")],
                     at)
    assert _where(db) == {"webhook_attempt_default": 2}
    # a day whose rows wait in the default partition gets no partition of its own
    assert db.execute(q.webhook_attempt_partitions_make,
                      {"now": T0, "days": 0}).fetchone() == {"made": 0}
    deleted = db.execute(q.webhook_attempt_purge_default, {
        "now": T0 + timedelta(days=31), "retention_s": 30 * DAY, "limit": 10})
    assert deleted.rowcount == 1
    assert _where(db) == {"webhook_attempt_default": 1}


def test_payloads_past_retention_are_dropped_and_the_metadata_kept(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    short, kept, pending = (_send(db, q, endpoint_id=endpoint)["message_id"] for _ in range(3))
    for message in (short, kept):
        _record_many(db, q, [_attempt(message, endpoint, succeeded=True, status="succeeded")],
                     None)
    db.execute(q.webhook_message_retain_until, {"ids": [short], "retention_s": 3600})

    def drop(at: datetime) -> int:
        return db.execute(q.webhook_message_drop_payloads, {
            "now": at, "retention_s": 30 * DAY, "limit": 100}).rowcount

    now = datetime.now(UTC)
    assert drop(now) == 0
    assert drop(now + timedelta(hours=2)) == 1  # its own retention: 1 hour
    assert drop(now + timedelta(days=31)) == 1  # the default; `pending` waits for its delivery
    rows = {r["id"]: r for r in db.execute(
        "SELECT id, body, payload_dropped_at FROM notifyq.webhook_message").fetchall()}
    assert (rows[short]["body"], rows[kept]["body"]) == ("", "")
    assert rows[short]["payload_dropped_at"] == now + timedelta(hours=2)
    assert rows[pending]["body"] == '{"n": 1}'
    assert rows[pending]["payload_dropped_at"] is None
    assert db.execute("SELECT count(*) AS n FROM notifyq.webhook_attempt").fetchone() == {"n": 2}
    statuses = db.execute("SELECT message_id, status FROM notifyq.webhook_delivery").fetchall()
    assert sorted(r["status"] for r in statuses) == ["pending", "succeeded", "succeeded"]


def test_recover_and_replay_leave_messages_without_a_payload_alone(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status="failed")], None)
    db.execute("UPDATE notifyq.webhook_message SET body = '', payload_dropped_at = now()")
    recovered = db.execute(q.webhook_delivery_recover, {
        "endpoint_id": endpoint, "since": T0 - timedelta(days=3650), "limit": 10,
        "now": None}).fetchall()
    assert recovered == []
    db.execute("UPDATE notifyq.webhook_delivery SET status = 'canceled'")
    missing = db.execute(q.webhook_delivery_missing_count, {
        "endpoint_id": endpoint, "since": T0 - timedelta(days=3650), "from_id": "msg_",
        "limit": 10}).fetchone()
    assert missing == {"missing": 0}


def _migrate_until(conn: Conn, q: Queries, version: int) -> None:
    conn.execute(q.migration_schema_create)
    conn.execute(q.migration_ledger_create)
    for migration in migrations.available():
        if migration.version >= version:
            break
        with conn.transaction():
            conn.execute(q.migration_search_path_set, {"schema_name": "notifyq"})
            conn.execute(migration.sql, prepare=False)
            conn.execute(q.migration_record, {"version": migration.version,
                                              "name": migration.name,
                                              "checksum": migration.checksum})


@pytest.mark.anyio
async def test_the_migration_keeps_every_existing_attempt(empty_dsn: str, q: Queries) -> None:
    with psycopg.connect(empty_dsn, autocommit=True, row_factory=dict_row) as db:
        _migrate_until(db, q, 31)
        db.execute("SET search_path TO notifyq, public")
        endpoint = _endpoint(db, q)
        message = _send(db, q, endpoint_id=endpoint)["message_id"]
        now = datetime.now(UTC)
        times = [now - timedelta(days=40), now - timedelta(days=1), now, T0]
        for at in times:
            _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status=None)], at)
        before = db.execute("SELECT id, created_at, status_code FROM webhook_attempt "
                            "ORDER BY id").fetchall()
        assert len(before) == 4
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as conn:
        assert 31 in [m.version for m in await migrations.migrate(conn, "notifyq")]
    with psycopg.connect(empty_dsn, autocommit=True, row_factory=dict_row) as db:
        after = db.execute("SELECT id, created_at, status_code FROM notifyq.webhook_attempt "
                           "ORDER BY id").fetchall()
        assert after == before
        assert _where(db) == {"webhook_attempt_legacy": 4}  # not copied: the same table
        parts = _partitions(db)
        assert parts["webhook_attempt_legacy"] > T0  # up to the day after its newest row
        # new attempts are numbered after the old ones and the lists read both
        _record_many(db, q, [_attempt(message, endpoint, succeeded=True, status="succeeded")],
                     None)
        listed = db.execute(q.webhook_attempt_list, {"message_id": message,
                                                     "limit": 10}).fetchall()
        assert [r["id"] for r in listed] == [r["id"] for r in before] + [before[-1]["id"] + 1]
        kind = db.execute("SELECT relkind FROM pg_class WHERE oid = "
                          "'notifyq.webhook_attempt'::regclass").fetchone()
        assert kind == {"relkind": "p"}
