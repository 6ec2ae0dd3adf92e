"""Run ids are UUIDv7 whoever makes them (Python or the SQL default), so they sort by time."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from notifyq._enqueue.ids import new_run_id

Conn = psycopg.Connection[dict[str, Any]]


def test_python_run_ids_are_version_7_and_sort_by_creation_time() -> None:
    first = new_run_id()
    time.sleep(0.002)  # ids within one millisecond are not ordered; across milliseconds they are
    second = new_run_id()
    assert (first.version, first.variant) == (7, "specified in RFC 4122")
    assert first < second
    assert abs(int(first.hex[:12], 16) - time.time_ns() // 1_000_000) < 5_000


def test_sql_uuid7_has_the_same_layout_and_interleaves_with_python_ids(db: Conn) -> None:
    python_before = new_run_id()
    time.sleep(0.002)
    row = db.execute("SELECT notifyq.uuid7() AS id").fetchone()
    time.sleep(0.002)
    python_after = new_run_id()
    assert row is not None
    sql_id = row["id"]
    assert (sql_id.version, sql_id.variant) == (7, "specified in RFC 4122")
    assert python_before < sql_id < python_after


def test_runs_enqueued_from_sql_get_time_ordered_ids(db: Conn) -> None:
    ids = []
    for _ in range(3):
        found = db.execute("SELECT notifyq.enqueue('t.ids', '{}') AS id").fetchone()
        assert found is not None
        ids.append(found["id"])
        time.sleep(0.002)
    assert ids == sorted(ids)
    assert all(i.version == 7 for i in ids)
