"""Writing outcomes back: batched, fenced, and never reported done before the commit.

Executors hand their outcome to :meth:`Completer.write` and wait. The completer's loop takes
whatever has queued up (at most ``batch_max``) and writes it with one statement; under load the
batch fills while the previous statement is in flight, at idle a write goes out alone at once.
Rows the statement did not return were taken over by another worker: those writers get
:class:`~notifyq._errors.LeaseLost`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import anyio
import psycopg
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._dispatch.outcome import Outcome
from notifyq._errors import CompleterClosedError, LeaseLost

log = logging.getLogger("notifyq.completer")




@dataclass(eq=False)
class _Pending:
    run_id: UUID
    fence: int
    outcome: Outcome
    done: anyio.Event = field(default_factory=anyio.Event)
    written: bool = False
    failure: BaseException | None = None


class Completer:
    """Batches fenced write-backs; one per worker process."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock, *,
                 batch_max: int = 500, on_written: Callable[[str, str], None] | None = None,
                 retry_for_s: float = 30.0) -> None:
        self._pool = pool
        self._q = queries
        self._clock = clock
        self._batch_max = batch_max
        self._on_written = on_written
        self._retry_for_s = retry_for_s
        self._send: MemoryObjectSendStream[_Pending]
        self._receive: MemoryObjectReceiveStream[_Pending]
        self._send, self._receive = anyio.create_memory_object_stream[_Pending](10_000)
        self.batches = 0
        self.lease_lost = 0

    async def write(self, run_id: UUID, fence: int, outcome: Outcome) -> None:
        """Persist ``outcome``; return once committed. Raises LeaseLost when fenced out."""
        item = _Pending(run_id, fence, outcome)
        try:
            await self._send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise CompleterClosedError("completer is closed") from None
        await item.done.wait()
        if item.failure is not None:
            raise item.failure
        if not item.written:
            self.lease_lost += 1
            raise LeaseLost(f"run {run_id} is no longer leased with fence {fence}")

    def close(self) -> None:
        """Stop accepting writes; :meth:`run` returns once the queued ones are written."""
        self._send.close()

    async def run(self) -> None:
        async with self._receive:
            async for first in self._receive:
                batch = [first]
                while len(batch) < self._batch_max:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        try:
            rows = await self._execute(batch)
        except Exception as exc:
            for item in batch:
                item.failure = exc
                item.done.set()
            return
        written = {row["id"]: row for row in rows}
        for item in batch:
            row = written.get(item.run_id)
            item.written = row is not None
            if row is not None and self._on_written is not None:
                self._on_written(row["pool"], row["status"])
            item.done.set()

    async def _execute(self, batch: list[_Pending]) -> list[dict[str, Any]]:
        params = {
            "now": self._clock.db_now(),
            "ids": [i.run_id for i in batch],
            "fences": [i.fence for i in batch],
            "statuses": [i.outcome.status.value for i in batch],
            "outputs": [i.outcome.output for i in batch],
            "errors": [i.outcome.error for i in batch],
            "run_ats": [i.outcome.run_at for i in batch],
            "refunds": [i.outcome.refund for i in batch],
            "wait_kinds": [i.outcome.wait_kind for i in batch],
            "wait_tokens": [i.outcome.wait_token for i in batch],
            "waiting_ons": [i.outcome.waiting_on for i in batch],
        }
        delay = 0.05
        deadline = anyio.current_time() + self._retry_for_s
        while True:
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(self._q.job_run_finish_many, params)
                    rows = await cur.fetchall()
            except psycopg.OperationalError as exc:
                # The database is restarting or the connection was killed. A retried batch that
                # had in fact committed matches nothing the second time (reported as lease
                # lost, harmlessly): the fence makes the write idempotent.
                if anyio.current_time() + delay > deadline:
                    raise
                log.warning("write-back failed (%s); retrying in %.2f s", type(exc).__name__, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                self.batches += 1
                return rows
