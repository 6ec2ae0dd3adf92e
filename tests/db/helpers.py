"""Thin wrappers that run one named query with the parameters the runtime passes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from notifyq.db.queries import Queries
from notifyq.enqueue import EnqueueRequest, prepare

Conn = psycopg.Connection[dict[str, Any]]


def enqueue(conn: Conn, q: Queries, job_type: str = "t.a", input: Any = None,
            **kwargs: Any) -> dict[str, Any]:
    prepared = prepare(EnqueueRequest(job_type=job_type, input={} if input is None else input,
                                      **kwargs))
    row = conn.execute(q.job_run_enqueue, prepared.params(notify=False)).fetchone()
    assert row is not None
    return row


def claim(conn: Conn, q: Queries, now: datetime, *, pool: str = "default", limit: int = 10,
          worker_id: str = "w1", lease_s: float = 30.0) -> list[dict[str, Any]]:
    return conn.execute(q.job_run_claim, {
        "now": now, "pool": pool, "limit": limit, "worker_id": worker_id,
        "lease_s": lease_s}).fetchall()


def finish(conn: Conn, q: Queries, now: datetime, items: list[tuple[UUID, int, str]], *,
           output: str | None = None, error: str | None = None,
           run_at: datetime | None = None, refund: int = 0) -> list[dict[str, Any]]:
    n = len(items)
    return conn.execute(q.job_run_finish_many, {
        "now": now, "ids": [i[0] for i in items], "fences": [i[1] for i in items],
        "statuses": [i[2] for i in items], "outputs": [output] * n, "errors": [error] * n,
        "run_ats": [run_at] * n, "refunds": [refund] * n}).fetchall()


def get(conn: Conn, q: Queries, run_id: UUID) -> dict[str, Any]:
    row = conn.execute(q.job_run_get, {"id": run_id}).fetchone()
    assert row is not None
    return row


def count(conn: Conn, where: str = "true") -> int:
    row = conn.execute(f"SELECT count(*) AS n FROM notifyq.job_run WHERE {where}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row["n"])


def seconds(s: float) -> timedelta:
    return timedelta(seconds=s)
