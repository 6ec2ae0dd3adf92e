"""bench/compare driver for procrastinate (run with bench/.venvs/procrastinate/bin/python -P).

Used as its documentation shows: ``App(connector=PsycopgConnector(conninfo=...))``, the schema
applied with ``app.schema_manager.apply_schema_async()``, an ``async`` task registered with
``@app.task``, ``task.defer_async(...)`` to enqueue one, ``task.batch_defer_async(...)`` for
bulk, and ``app.run_worker_async(concurrency=10, ...)`` as the worker (``wait=False`` is its
documented burst mode for the drain). Everything else at procrastinate's defaults.
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

import procrastinate  # noqa: E402
from _common import Peer, expect, main, sql_one, started  # noqa: E402


class Procrastinate(Peer):
    name = "procrastinate"
    has_burst = True

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

        @self.app.task(name="noop")
        async def noop(i: int) -> None:
            started(i)

        self.task = noop
        self._worker: asyncio.Task[None] | None = None

    def meta(self) -> dict[str, Any]:
        return {"version": metadata.version("procrastinate"),
                "psycopg": metadata.version("psycopg"),
                "python": sys.version.split()[0],
                "settings": "App(PsycopgConnector(conninfo)) defaults (pool per psycopg_pool "
                            "defaults); async task; defer_async / batch_defer_async; "
                            "run_worker_async(concurrency=10, install_signal_handlers=False); "
                            "drain: wait=False (burst); latency: wait=True, listen_notify "
                            "default (on), fetch_job_polling_interval default (5 s)"}

    async def setup(self) -> None:
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()

    async def open_client(self) -> None:
        await self.app.open_async()

    async def close(self) -> None:
        await self.stop_worker()
        await self.app.close_async()

    async def reset(self) -> None:
        await self.app.connector.execute_query_async(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers "
            "RESTART IDENTITY CASCADE")

    async def enqueue(self, i: int) -> None:
        await self.task.defer_async(i=i)

    async def enqueue_many(self, ids: list[int]) -> None:
        await self.task.batch_defer_async(*({"i": i} for i in ids))

    async def burst(self, concurrency: int) -> None:
        await self.app.run_worker_async(concurrency=concurrency, wait=False,
                                        install_signal_handlers=False)

    async def start_worker(self, concurrency: int) -> None:
        self._worker = asyncio.create_task(self.app.run_worker_async(
            concurrency=concurrency, wait=True, install_signal_handlers=False))
        await asyncio.sleep(0.5)

    async def stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
            self._worker = None

    async def verify(self, conn: Any, n: int) -> dict[str, Any]:
        total, ok = await sql_one(conn, "SELECT count(*), count(*) FILTER (WHERE status = "
                                  "'succeeded') FROM procrastinate_jobs")
        # procrastinate's own event log: one 'started' and one 'succeeded' event per job.
        started_once, succeeded_once, other = await sql_one(conn, """
            SELECT (SELECT count(*) FROM (SELECT job_id FROM procrastinate_events
                    WHERE type = 'started' GROUP BY job_id HAVING count(*) = 1) s),
                   (SELECT count(*) FROM (SELECT job_id FROM procrastinate_events
                    WHERE type = 'succeeded' GROUP BY job_id HAVING count(*) = 1) s),
                   (SELECT count(*) FROM procrastinate_events
                    WHERE type NOT IN ('deferred', 'started', 'succeeded'))""")
        facts = {"jobs": total, "succeeded": ok, "started_exactly_once": started_once,
                 "succeeded_exactly_once": succeeded_once, "other_events": other}
        return expect(facts, {"jobs": n, "succeeded": n, "started_exactly_once": n,
                              "succeeded_exactly_once": n, "other_events": 0})


if __name__ == "__main__":
    main(Procrastinate, __file__)
