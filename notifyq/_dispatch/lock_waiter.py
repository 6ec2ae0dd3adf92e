"""Runs whose row another transaction holds locked (issue 31, item 1).

An application may lock a run's row for as long as its transaction lasts: ``SELECT ... FOR
UPDATE`` of a run it reads, ``app.cancel(run, conn=txn)`` in a long business transaction. The
worker's statements about many runs, the completer's write-backs and the heartbeat, skip such
rows (SKIP LOCKED) instead of waiting with every other run of their batch behind one lock. A run
a statement came back without was then either taken over by another worker (its write-back is
LeaseLost, its handler is stopped) or skipped for a lock: :meth:`LockWaiter.held` tells the two
apart, and the skipped run's statement is sent again alone, waiting for the lock
(:meth:`LockWaiter.alone`).

Waiting, not retrying now and then: the reaper's SKIP LOCKED passes over a row someone waits
for, so the run's write-back or lease extension lands the moment the lock goes, before a lease
that ran out behind the lock can be taken over (a lock held 30 s on a run with a 10 s lease had
it executed twice; tests/chaos/test_row_lock.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, LiteralString
from uuid import UUID

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries

LOCK_WAITERS = 4
"""Statements waiting for a row lock at once, each on a connection of the worker's pool (10 by
default, which the handlers' steps and the heartbeat need too); more wait their turn. A lock
that outlives a lease is an application's long transaction on one run or a few, not on many at
once."""


class LockWaiter:
    """One per worker, shared by its completer and its heartbeat."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConn], queries: Queries, *,
                 at_once: int = LOCK_WAITERS) -> None:
        if at_once < 1:
            raise ValueError(f"at_once must be at least 1, got {at_once}")
        self._pool = pool
        self._q = queries
        self._limiter = anyio.CapacityLimiter(at_once)

    async def held(self, conn: AsyncConn, runs: Iterable[tuple[UUID, int]]) -> set[UUID]:
        """Of ``runs`` (id, fence), those still running under that fence: a statement that
        came back without them skipped their row for a lock (job_run_leased_many)."""
        ids, fences = zip(*runs, strict=True)
        cur = await conn.execute(self._q.job_run_leased_many, {
            "ids": list(ids), "fences": list(fences)})
        return {row["id"] for row in await cur.fetchall()}

    async def alone(self, statement: LiteralString, params: dict[str, Any], *,
                    retry_for_s: float = 0.0) -> dict[str, Any] | None:
        """``statement`` about one run (it waits for the run's row lock) on a pooled
        connection, at most ``at_once`` at a time; its row, or None. Connection errors are
        retried for ``retry_for_s`` (the statements are fenced, so idempotent), then raised."""
        delay = 0.05
        deadline = anyio.current_time() + retry_for_s
        async with self._limiter:
            while True:
                try:
                    async with self._pool.connection() as conn:
                        cur = await conn.execute(statement, params, binary=True)
                        return await cur.fetchone()
                except psycopg.OperationalError:
                    if anyio.current_time() + delay > deadline:
                        raise
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)
