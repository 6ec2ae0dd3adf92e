"""bench/compare driver for pgqueuer (run with bench/.venvs/pgqueuer/bin/python -P).

Used as its documentation shows: an asyncpg connection wrapped in ``AsyncpgDriver``; the schema
installed with ``Queries(driver).install()``; a ``QueueManager(Queries(driver))`` with an
``@qm.entrypoint("noop")`` async handler; ``Queries.enqueue(entrypoint, payload)`` to enqueue one
(``enqueue_1`` on its quick start's single connection, ``Queries(AsyncpgDriver(conn))``;
``enqueue_8`` on an ``AsyncpgPoolDriver``, since the single connection's driver lock would
serialize 8 callers) and the same call with lists for bulk (on the pool); ``qm.run(...)`` as
the worker, ``mode=drain`` (its documented burst mode) for the drain.

Concurrency 10: pgqueuer has no single "concurrency" knob; ``max_concurrent_tasks`` is the hard
cap on a worker's in-flight jobs and must be at least twice ``batch_size``, so the worker runs
with ``max_concurrent_tasks=10, batch_size=5``. Everything else at defaults. ``drain_defaults``
runs ``qm.run(mode=drain)`` with nothing else (``batch_size=10``, no cap), ``drain_100`` with
``max_concurrent_tasks=100`` at the default batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import asyncpg  # noqa: E402
from _common import CELLS, Peer, expect, main, sql_one, started  # noqa: E402
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Job, Queries, QueueManager  # noqa: E402
from pgqueuer.types import QueueExecutionMode  # noqa: E402

BATCH_SIZE = 5
DEFAULT_BATCH_SIZE = 10
"""``QueueManager.run``'s default ``batch_size`` (pgqueuer 1.6)."""


class PgQueuerPeer(Peer):
    name = "pgqueuer"
    has_burst = True
    cells = (*CELLS, "drain_defaults", "drain_100")

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.pool: asyncpg.Pool | None = None
        self.client: Queries | None = None
        self._worker: asyncio.Task[None] | None = None
        self._qm: QueueManager | None = None
        self._conn: asyncpg.Connection | None = None
        self._single: asyncpg.Connection | None = None
        self._pooled: Queries | None = None

    def meta(self) -> dict[str, Any]:
        return {"version": metadata.version("pgqueuer"),
                "asyncpg": metadata.version("asyncpg"),
                "python": sys.version.split()[0],
                "settings": f"worker: QueueManager(Queries(AsyncpgDriver(conn))).run("
                            f"batch_size={BATCH_SIZE}, max_concurrent_tasks=10) (the cap must be "
                            ">= 2 x batch_size); drain: mode=drain; enqueue: "
                            "Queries(AsyncpgPoolDriver(asyncpg pool, defaults)).enqueue; "
                            "everything else default"}

    async def open_client(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn)
        self.client = self._pooled = Queries(AsyncpgPoolDriver(self.pool))

    async def enqueue_from(self, callers: int) -> None:
        if callers > 1:
            self.client = self._pooled
            return
        if self._single is None:
            self._single = await asyncpg.connect(self.dsn)
        self.client = Queries(AsyncpgDriver(self._single))

    async def setup(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()
        await self.open_client()

    async def close(self) -> None:
        await self.stop_worker()
        if self._single is not None:
            await self._single.close()
        if self.pool is not None:
            await self.pool.close()

    async def reset(self) -> None:
        assert self.pool is not None
        await self.pool.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics "
                                "RESTART IDENTITY")

    async def enqueue(self, i: int) -> None:
        assert self.client is not None
        await self.client.enqueue("noop", str(i).encode())

    async def enqueue_many(self, ids: list[int]) -> None:
        assert self._pooled is not None
        await self._pooled.enqueue(["noop"] * len(ids), [str(i).encode() for i in ids],
                                  [0] * len(ids))

    async def _make_qm(self) -> QueueManager:
        self._conn = await asyncpg.connect(self.dsn)
        qm = QueueManager(Queries(AsyncpgDriver(self._conn)))

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            started(int(job.payload or b"-1"))

        return qm

    @staticmethod
    def _worker_args(concurrency: int | None) -> dict[str, Any]:
        """``qm.run``'s arguments: none at its defaults (``batch_size=10``, no cap); below 20
        slots a cap with a batch half its size (the cap must be at least twice the batch);
        from 20 a cap at the default batch."""
        if concurrency is None:
            return {}
        if concurrency < 2 * DEFAULT_BATCH_SIZE:
            return {"batch_size": BATCH_SIZE, "max_concurrent_tasks": concurrency}
        return {"max_concurrent_tasks": concurrency}

    async def burst(self, concurrency: int | None) -> None:
        qm = await self._make_qm()
        try:
            await qm.run(**self._worker_args(concurrency), mode=QueueExecutionMode.drain)
        finally:
            await self._close_conn()

    async def start_worker(self, concurrency: int | None) -> None:
        self._qm = await self._make_qm()
        self._worker = asyncio.create_task(self._qm.run(**self._worker_args(concurrency)))
        await asyncio.sleep(0.5)

    async def stop_worker(self) -> None:
        if self._worker is not None and self._qm is not None:
            self._qm.shutdown.set()
            try:
                await asyncio.wait_for(self._worker, 20)
            except (TimeoutError, Exception):
                self._worker.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._worker
            self._worker = None
            self._qm = None
        await self._close_conn()

    async def _close_conn(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def verify(self, conn: Any, n: int) -> dict[str, Any]:
        # pgqueuer deletes a finished job from ``pgqueuer`` and writes its final status to
        # ``pgqueuer_log``: exactly once = one 'successful' row per job id, nothing left.
        left, ok_rows, ok_jobs, bad = await sql_one(conn, """
            SELECT (SELECT count(*) FROM pgqueuer),
                   (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'),
                   (SELECT count(DISTINCT job_id) FROM pgqueuer_log
                    WHERE status = 'successful'),
                   (SELECT count(*) FROM pgqueuer_log
                    WHERE status NOT IN ('queued', 'picked', 'successful'))""")
        facts = {"left_in_queue": left, "successful_rows": ok_rows, "successful_jobs": ok_jobs,
                 "other_final_statuses": bad}
        return expect(facts, {"left_in_queue": 0, "successful_rows": n, "successful_jobs": n,
                              "other_final_statuses": 0})

    async def done_count(self, conn: Any) -> int:
        return int(await sql_one(conn, "SELECT count(*) FROM pgqueuer_log "
                                 "WHERE status = 'successful'"))


if __name__ == "__main__":
    main(PgQueuerPeer, __file__)
