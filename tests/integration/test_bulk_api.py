"""``POST /v1/jobs/bulk`` over real HTTP: delete and reschedule beside cancel and retry, the dry
run's count, batches, and bad requests refused with problem+json (counts checked in SQL)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import READER, Served
from tests.support import scalar

Conn = psycopg.Connection[Any]
LATER = {"job_type": "api.later"}


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log") as server:
        yield server


def _later(sql: Conn, n: int) -> list[str]:
    """``n`` runs due tomorrow, of a type no worker handles: they stay pending."""
    rows = sql.execute("SELECT notifyq.enqueue('api.later', '{}', run_at => now() + interval "
                       "'1 day', allow_unknown_type => true) FROM generate_series(1, %s)", (n,))
    return [str(r[0]) for r in rows.fetchall()]


def _count(sql: Conn, where: str) -> int:
    return int(scalar(sql, f"SELECT count(*) FROM notifyq.job_run WHERE {where}"))


def test_bulk_reschedule_and_delete_by_filter_in_batches(served: Served, sql: Conn) -> None:
    _later(sql, 12)
    when = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    with served.client() as http:
        counted = http.post("/v1/jobs/bulk", json={"action": "reschedule", "dry_run": True,
                                                   "filter": LATER}).json()
        assert counted["matched"] == 12
        moved = http.post("/v1/jobs/bulk", json={
            "action": "reschedule", "filter": LATER, "run_at": when.isoformat(),
            "batch_size": 5}).json()
        assert (moved["changed"], moved["batches"], moved["remaining"]) == (12, 3, 0)
        assert _count(sql, f"run_at = '{when.isoformat()}'") == 12

        assert http.post("/v1/jobs/bulk", json={"action": "delete", "dry_run": True,
                                                "filter": LATER}).json()["matched"] == 0
        assert http.post("/v1/jobs/bulk", json={"action": "cancel", "filter": LATER}
                         ).json()["changed"] == 12
        deleted = http.post("/v1/jobs/bulk", json={
            "action": "delete", "filter": {"status": "canceled"}, "batch_size": 5}).json()
        assert (deleted["changed"], deleted["batches"]) == (12, 3)
    assert _count(sql, "true") == 0


def test_bulk_by_ids_and_bad_requests(served: Served, sql: Conn) -> None:
    ids = _later(sql, 3)
    with served.client() as http:
        refused = http.post("/v1/jobs/bulk", json={"action": "reschedule", "ids": ids})
        assert (refused.status_code, refused.json()["field"]) == (422, "run_at")
        assert http.post("/v1/jobs/bulk", json={
            "action": "delete", "ids": ids, "run_at": "2030-01-01T00:00:00Z"}).status_code == 422
        assert http.post("/v1/jobs/bulk", json={
            "action": "delete", "ids": ids, "batch_size": 0}).status_code == 422
        assert http.post("/v1/jobs/bulk", json={"action": "purge", "ids": ids}
                         ).status_code == 422
        assert http.post("/v1/jobs/bulk", json={"action": "delete", "ids": ids}
                         ).json()["changed"] == 0  # pending: not deletable
        moved = http.post("/v1/jobs/bulk", json={
            "action": "reschedule", "ids": ids[:2], "run_at": "2999-01-01T00:00:00Z"}).json()
        assert moved["changed"] == 2
    with served.client(READER) as http:
        assert http.post("/v1/jobs/bulk", json={"action": "delete", "ids": ids}
                         ).status_code == 403
    assert _count(sql, "run_at = '2999-01-01T00:00Z'") == 2
    assert _count(sql, "true") == 3
