"""A durable handler for the process tests: five steps, each logging its execution to
``step_ledger``; step 3 sleeps long enough for a test to SIGKILL the worker mid-step."""

from __future__ import annotations

import os

import anyio
import psycopg

from notifyq import App, JobContext

app = App()

STEP_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS step_ledger (
    run_id uuid NOT NULL,
    step integer NOT NULL,
    worker_pid integer NOT NULL,
    finished boolean NOT NULL
)
"""


async def _log(ctx: JobContext, step: int, finished: bool) -> None:
    async with await psycopg.AsyncConnection.connect(
        os.environ["NOTIFYQ_DATABASE_URL"], autocommit=True
    ) as conn:
        await conn.execute("INSERT INTO step_ledger VALUES (%s, %s, %s, %s)",
                           (ctx.run.id, step, os.getpid(), finished))


@app.handler("durable.five-steps")
async def five_steps(ctx: JobContext) -> list[int]:
    results = []
    for step in range(1, 6):
        async def work(step: int = step) -> int:
            await _log(ctx, step, finished=False)
            if step == 3:
                await anyio.sleep(float(ctx.input.get("slow_s", 0)))
            await _log(ctx, step, finished=True)
            return step
        results.append(await ctx.step(f"step-{step}", work))
    return results
