"""bench/compare's "pure SQL" row: this machine's ceiling for a claim + complete loop, with no
queue library and no handler at all (run in notifyq's environment: it needs only psycopg).

A minimal job table (bigserial id, status, attempts, jsonb payload, one partial index on the
pending rows); ``pending_n`` rows inserted untimed; then each connection loops: claim a batch
(``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT b) RETURNING id``) and mark
it done (``UPDATE ... WHERE id = ANY(...)``), two autocommit statements per batch, until
nothing is left. Verified: every row done with attempts = 1.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import psycopg  # noqa: E402
from _common import Peer, Sizes, expect, main, sql_one  # noqa: E402

DDL = """
CREATE TABLE IF NOT EXISTS ceiling_job (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    payload jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS ceiling_job_pending ON ceiling_job (id) WHERE status = 'pending';
"""
CLAIM = """
UPDATE ceiling_job SET status = 'running', attempts = attempts + 1
WHERE id IN (SELECT id FROM ceiling_job WHERE status = 'pending' ORDER BY id
             LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id"""
COMPLETE = "UPDATE ceiling_job SET status = 'done' WHERE id = ANY(%s)"
SHAPES = ((1, 10), (1, 100), (2, 100))  # (connections, batch)


class SqlCeiling(Peer):
    name = "sql"
    cells = tuple(f"ceiling_{c}conn_b{b}" for c, b in SHAPES)

    def meta(self) -> dict[str, Any]:
        return {"version": f"psycopg {psycopg.__version__}",
                "python": sys.version.split()[0],
                "settings": "claim (UPDATE ... FOR UPDATE SKIP LOCKED LIMIT b RETURNING) + "
                            "complete (UPDATE ... = ANY) per batch, autocommit, "
                            + ", ".join(f"{c} conn x batch {b}" for c, b in SHAPES)}

    async def setup(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute(DDL)

    async def reset(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE ceiling_job")

    async def stop_worker(self) -> None: ...

    async def extra_cell(self, cell: str, sizes: Sizes) -> Any:
        conns, batch = next((c, b) for c, b in SHAPES if cell == f"ceiling_{c}conn_b{b}")
        n = sizes.drain_n
        await self.reset()
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("INSERT INTO ceiling_job (payload) SELECT jsonb_build_object("
                               "'i', g) FROM generate_series(1, %s) g", (n,))
            await conn.execute("VACUUM ANALYZE ceiling_job")

            async def loop() -> None:
                async with await psycopg.AsyncConnection.connect(self.dsn,
                                                                 autocommit=True) as c:
                    while ids := [r[0] for r in await (await c.execute(CLAIM, (batch,)))
                                  .fetchall()]:
                        await c.execute(COMPLETE, (ids,))

            t0 = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(conns)))
            elapsed = time.perf_counter() - t0
            total, once = await sql_one(conn, "SELECT count(*), count(*) FILTER (WHERE "
                                        "status = 'done' AND attempts = 1) FROM ceiling_job")
        expect({"rows": total, "done_once": once}, {"rows": n, "done_once": n})
        return {"jobs_per_s": round(n / elapsed, 1), "connections": conns, "batch": batch}


if __name__ == "__main__":
    main(SqlCeiling, __file__)
