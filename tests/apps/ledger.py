"""A test app whose handlers write a ledger row per completed execution.

``ledger`` has a UNIQUE run id: a second completion of the same run would fail its insert, so a
count in SQL proves each run's handler finished exactly once. The ledger insert happens in the
handler, so it counts executions that reached the end, not write-backs.
"""

from __future__ import annotations

import os

import anyio
import psycopg

from notifyq import App, JobContext

app = App()


async def _record(ctx: JobContext) -> None:
    async with await psycopg.AsyncConnection.connect(
        os.environ["NOTIFYQ_DATABASE_URL"], autocommit=True
    ) as conn:
        await conn.execute(
            "INSERT INTO ledger (run_id, worker_pid) VALUES (%s, %s)", (ctx.run.id, os.getpid()))


@app.handler("ledger.write")
async def write(ctx: JobContext) -> dict[str, int]:
    await _record(ctx)
    return {"pid": os.getpid()}


@app.handler("ledger.slow")
async def slow(ctx: JobContext) -> dict[str, int]:
    await anyio.sleep(float(ctx.input.get("seconds", 5)))
    await _record(ctx)
    return {"pid": os.getpid()}


LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ledger (
    run_id uuid PRIMARY KEY,
    worker_pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
