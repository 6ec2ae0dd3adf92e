"""bench/compare driver for chancy (run with bench/.venvs/chancy/bin/python -P).

Used as its documentation shows: ``async with Chancy(dsn) as chancy``, ``chancy.migrate()``,
``chancy.declare(Queue("default", concurrency=10, executor=Chancy.Executor.Async, ...))``, a
job made with the ``@job()`` decorator, ``chancy.push(job)`` to enqueue one and
``chancy.push_many(jobs)`` (batches of 1,000, its default) for bulk, and
``async with Worker(chancy) as worker`` as the worker.

Settings: the queue's executor is chancy's documented ``Async`` executor (the handlers are
``async def`` no-ops, and it keeps the worker in one process; the default executor is a process
pool), and ``eager_polling=True``, its documented switch for queues with a backlog: at the
default (off) a worker with no incoming NOTIFYs fetches once per ``polling_interval`` (5 s), i.e.
at most 10 jobs per 5 s at concurrency 10 (a 1,000-job drain did not finish in 60 s). The
"chancy" logger is set to WARNING (its default handler logs an INFO line per job; notifyq's
bench silences its own INFO lines the same way). Everything else (notifications on, pool 1..10)
at defaults.
Chancy has no burst mode: the drain runs the worker until SQL shows every job succeeded.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from _common import Peer, expect, main, sql_one, started  # noqa: E402
from chancy import Chancy, Queue, Worker, job  # noqa: E402


@job(queue="default")
async def noop(i: int) -> None:
    started(i)


def _queue(concurrency: int) -> Queue:
    return Queue("default", concurrency=concurrency, executor=Chancy.Executor.Async,
                 eager_polling=True)


class ChancyPeer(Peer):
    name = "chancy"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.chancy = Chancy(dsn)
        self.chancy.log.setLevel(logging.WARNING)
        self._worker: Worker | None = None
        self._cm: Any = None

    def meta(self) -> dict[str, Any]:
        return {"version": metadata.version("chancy"), "psycopg": metadata.version("psycopg"),
                "python": sys.version.split()[0],
                "settings": "Chancy(dsn) defaults (pool 1..10, notifications on); "
                            "Queue('default', concurrency=10, executor=Chancy.Executor.Async, "
                            "eager_polling=True), polling_interval default (5 s); logger "
                            "'chancy' at WARNING; Worker(chancy, "
                            "register_signal_handlers=False); push / push_many (batch 1000); "
                            "no burst mode: drain = worker until SQL shows all succeeded"}

    async def setup(self) -> None:
        await self.chancy.__aenter__()
        await self.chancy.migrate()
        await self.chancy.declare(_queue(10), upsert=True)

    async def open_client(self) -> None:
        await self.chancy.__aenter__()

    async def close(self) -> None:
        await self.stop_worker()
        await self.chancy.__aexit__(None, None, None)

    async def reset(self) -> None:
        async with self.chancy.pool.connection() as conn:
            await conn.execute("TRUNCATE chancy_jobs")

    async def enqueue(self, i: int) -> None:
        await self.chancy.push(noop.job.with_kwargs(i=i))

    async def enqueue_many(self, ids: list[int]) -> None:
        async for _ in self.chancy.push_many([noop.job.with_kwargs(i=i) for i in ids]):
            pass

    async def start_worker(self, concurrency: int) -> None:
        if concurrency != 10:
            await self.chancy.declare(_queue(concurrency), upsert=True)
        self._cm = Worker(self.chancy, register_signal_handlers=False)
        self._worker = await self._cm.__aenter__()

    async def stop_worker(self) -> None:
        if self._cm is not None:
            with contextlib.suppress(Exception):
                await self._cm.__aexit__(None, None, None)
            self._cm = None
            self._worker = None

    async def done_count(self, conn: Any) -> int:
        return int(await sql_one(conn, "SELECT count(*) FROM chancy_jobs "
                                 "WHERE state = 'succeeded'"))

    async def verify(self, conn: Any, n: int) -> dict[str, Any]:
        total, ok, once = await sql_one(conn, """
            SELECT count(*), count(*) FILTER (WHERE state = 'succeeded'),
                   count(*) FILTER (WHERE state = 'succeeded' AND attempts = 1)
            FROM chancy_jobs""")
        facts = {"jobs": total, "succeeded": ok, "succeeded_attempts_1": once}
        return expect(facts, {"jobs": n, "succeeded": n, "succeeded_attempts_1": n})


if __name__ == "__main__":
    main(ChancyPeer, __file__)
