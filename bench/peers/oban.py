"""bench/compare driver for oban, the Python package (needs Python >= 3.12; run with
bench/.venvs/oban/bin/python -P).

Used as its documentation shows: a pool from ``Oban.create_pool(dsn)`` (min 1, max 10), the
schema from ``oban.schema.install(pool)``, a ``@worker(queue="default")`` class with an
``async def process(self, job)``, a client instance ``Oban(pool=pool)`` whose
``enqueue(Noop.new(args))`` enqueues one and ``enqueue_many([...])`` a batch, and a server
instance ``Oban(pool=pool, queues={"default": 10})`` started with ``start()`` / ``stop()`` as
the worker. Everything else at defaults. Oban has no burst mode: the drain runs the worker until
SQL shows every job completed.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from _common import Peer, expect, main, sql_one, started  # noqa: E402
from oban import Oban, worker  # noqa: E402
from oban.schema import install  # noqa: E402


@worker(queue="default")
class Noop:
    async def process(self, job: Any) -> None:
        started(job.args.get("i"))


class ObanPeer(Peer):
    name = "oban"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.pool: Any = None
        self.client: Oban | None = None
        self.server: Oban | None = None
        self.server_pool: Any = None

    def meta(self) -> dict[str, Any]:
        return {"version": metadata.version("oban"), "psycopg": metadata.version("psycopg"),
                "python": sys.version.split()[0],
                "settings": "Oban.create_pool(dsn) defaults (1..10) for the client and another "
                            "for the worker; client Oban(pool) enqueue / enqueue_many; worker "
                            "Oban(pool, queues={'default': 10}, name='bench-worker').start(); "
                            "no burst mode: drain = worker until SQL shows all completed"}

    async def open_client(self) -> None:
        self.pool = await Oban.create_pool(self.dsn)
        self.client = Oban(pool=self.pool)

    async def setup(self) -> None:
        await self.open_client()
        await install(self.pool)

    async def close(self) -> None:
        await self.stop_worker()
        if self.pool is not None:
            await self.pool.close()

    async def reset(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute("TRUNCATE oban_jobs RESTART IDENTITY")

    async def enqueue(self, i: int) -> None:
        assert self.client is not None
        await self.client.enqueue(Noop.new({"i": i}))

    async def enqueue_many(self, ids: list[int]) -> None:
        assert self.client is not None
        await self.client.enqueue_many([Noop.new({"i": i}) for i in ids])

    async def start_worker(self, concurrency: int) -> None:
        self.server_pool = await Oban.create_pool(self.dsn)
        self.server = Oban(pool=self.server_pool, queues={"default": concurrency},
                           name="bench-worker")
        await self.server.start()

    async def stop_worker(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.server_pool is not None:
            await self.server_pool.close()
            self.server_pool = None

    async def done_count(self, conn: Any) -> int:
        return int(await sql_one(conn, "SELECT count(*) FROM oban_jobs "
                                 "WHERE state = 'completed'"))

    async def verify(self, conn: Any, n: int) -> dict[str, Any]:
        total, ok, once = await sql_one(conn, """
            SELECT count(*), count(*) FILTER (WHERE state = 'completed'),
                   count(*) FILTER (WHERE state = 'completed' AND attempt = 1)
            FROM oban_jobs""")
        facts = {"jobs": total, "completed": ok, "completed_attempt_1": once}
        return expect(facts, {"jobs": n, "completed": n, "completed_attempt_1": n})


if __name__ == "__main__":
    main(ObanPeer, __file__)
