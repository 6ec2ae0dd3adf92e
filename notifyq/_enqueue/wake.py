"""Waking workers after an enqueue committed outside a caller's transaction.

Every transaction that notifies takes PostgreSQL's global notify lock at commit and holds it
through the commit's WAL flush, which capped 8 concurrent single-row enqueuers at ~3.3k
commits/s here against ~8k/s without NOTIFY; on a loaded machine the holders queue behind one
another (2026-12-01, load 7: 480/s folded against 248/s with a NOTIFY in every insert; the
numbers are in notifyq/_enqueue/write.py). Folding concurrent wake-ups into one NOTIFY per round
trip keeps enqueue near the plain-insert rate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import AsyncConnectionPool

from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._notifier import wake_payload

log = logging.getLogger("notifyq.notifier")


class WakeSender:
    """Sends ``j:<pool>`` wake-ups after commit, folding concurrent requests.

    A request made while a NOTIFY for the same pool is in flight is folded into one more NOTIFY
    sent right after it, so every enqueue is followed by a NOTIFY that left after its commit,
    and N concurrent enqueues cost about two NOTIFYs, not N.
    """

    def __init__(self, pool: AsyncConnectionPool[AsyncConn], queries: Queries) -> None:
        self._pool = pool
        self._q = queries
        self._in_flight = 0
        self._requested: dict[str, int] = {}
        self._sent: dict[str, int] = {}
        self._sending: set[str] = set()
        self.notifies_sent = 0

    @contextmanager
    def enqueueing(self) -> Iterator[bool]:
        """Around one enqueue: yields True when no other enqueue is in flight, and then the
        NOTIFY should ride in the insert's own transaction (one round trip instead of two:
        a lone enqueuer does not contend for the notify lock). Otherwise the caller sends the
        wake-up through :meth:`wake` after its commit, folded with the others'."""
        self._in_flight += 1
        try:
            yield self._in_flight == 1
        finally:
            self._in_flight -= 1

    async def wake(self, pools: set[str]) -> None:
        for pool in pools:
            self._requested[pool] = self._requested.get(pool, 0) + 1
        todo = [p for p in pools if p not in self._sending]
        if not todo:
            return
        self._sending.update(todo)
        try:
            while pending := [p for p in todo if self._sent.get(p, 0) < self._requested[p]]:
                marks = {p: self._requested[p] for p in pending}
                async with self._pool.connection() as conn:
                    await conn.execute(self._q.job_run_notify, {
                        "channel": self._q.schema, "payloads": [wake_payload(p) for p in pending]})
                self.notifies_sent += 1
                self._sent.update(marks)
        except psycopg.Error as exc:
            # Only a hint: the workers' poll picks the runs up anyway.
            log.warning("wake-up NOTIFY failed (%s); workers will find the run by polling",
                        type(exc).__name__)
        finally:
            self._sending.difference_update(todo)
