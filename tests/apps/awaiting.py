"""Handlers for the awaiting and replay tests, run by real worker processes.

``replay.*`` run three durable steps ``a``, ``b``, ``c``; each logs its execution to
``step_exec`` (counted in SQL by the tests) and fails while ``replay_broken`` names it.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import psycopg

from notifyq import App, JobContext, Permanent, RetryPolicy

app = App()

REPLAY_DDL = """
CREATE TABLE IF NOT EXISTS step_exec (run_id uuid NOT NULL, step text NOT NULL);
CREATE TABLE IF NOT EXISTS replay_broken (step text PRIMARY KEY);
"""
STEPS = ("a", "b", "c")


@app.handler("await.echo")
async def echo(ctx: JobContext) -> Any:
    await anyio.sleep(float(ctx.input.get("seconds", 0)))
    return ctx.input


@app.handler("await.fail", retry=RetryPolicy(attempts=1))
async def fail(ctx: JobContext) -> None:
    raise Permanent(ValueError("bad address"))


async def _execute(ctx: JobContext, step: str) -> int:
    async with await psycopg.AsyncConnection.connect(
            os.environ["NOTIFYQ_DATABASE_URL"], autocommit=True) as conn:
        await conn.execute("INSERT INTO step_exec VALUES (%s, %s)", (ctx.run.id, step))
        broken = await (await conn.execute("SELECT 1 FROM replay_broken WHERE step = %s",
                                           (step,))).fetchone()
        if broken:
            raise RuntimeError(f"step {step} is broken")
        row = await (await conn.execute(
            "SELECT count(*) FROM step_exec WHERE run_id = %s AND step = %s",
            (ctx.run.id, step))).fetchone()
    return int(row[0]) if row else 0


@app.handler("replay.steps", retry=RetryPolicy(attempts=1))
async def three_steps(ctx: JobContext) -> dict[str, int]:
    return await _three_steps(ctx)


@app.handler("replay.scratch", retry=RetryPolicy(attempts=1), replay_from="scratch")
async def three_steps_from_scratch(ctx: JobContext) -> dict[str, int]:
    return await _three_steps(ctx)


async def _three_steps(ctx: JobContext) -> dict[str, int]:
    done = {}
    for step in STEPS:
        async def run(step: str = step) -> int:
            return await _execute(ctx, step)
        done[step] = await ctx.step(step, run)
    return done

