"""Handlers for the tests of issue 11's semantics, run by real worker processes: one records the
order runs execute in, one waits for a signal and returns its payload, one with a dedupe policy
that can fail for good, one that always fails (retried as its policy says), and a durable one that
leaves a step timeline and a child behind for ``notifyq runs show``."""

from __future__ import annotations

import os

import psycopg

from notifyq import App, DedupePolicy, JobContext, Permanent, RetryPolicy

app = App()

ORDER_DDL = """
CREATE TABLE IF NOT EXISTS execution_order (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    label text NOT NULL
)
"""


@app.handler("order.record")
async def record(ctx: JobContext) -> None:
    async with await psycopg.AsyncConnection.connect(
        os.environ["NOTIFYQ_DATABASE_URL"], autocommit=True
    ) as conn:
        await conn.execute("INSERT INTO execution_order (label) VALUES (%s)",
                           (ctx.input["label"],))


@app.handler("signal.receive")
async def receive(ctx: JobContext) -> object:
    return await ctx.wait_for_signal(ctx.input["token"])


@app.handler("invoice.charge", retry=RetryPolicy(attempts=1),
             dedupe=DedupePolicy(key="invoice:{invoice}", window_s=3600))
async def charge(ctx: JobContext) -> dict[str, bool]:
    if ctx.input.get("fail"):
        raise Permanent(ValueError("card declined"))
    return {"charged": True}


@app.handler("flaky.always", retry=RetryPolicy(attempts=2, backoff="fixed", base_s=0.05),
             timeout_s=20)
async def always_fails(ctx: JobContext) -> None:
    raise RuntimeError(f"attempt {ctx.run.attempt} failed")


@app.handler("report.build", retry=RetryPolicy(attempts=3), timeout_s=45)
async def build(ctx: JobContext) -> dict[str, object]:
    rows = await ctx.step("load", lambda: [1, 2, 3])
    await ctx.checkpoint("loaded")
    total = await ctx.step("sum", lambda: sum(rows))
    child = await ctx.spawn_child("report.part", {"total": total})
    part = await ctx.wait_for(child)
    return {"total": total, "part": part}


@app.handler("report.part")
async def part(ctx: JobContext) -> int:
    return int(ctx.input["total"]) * 2
