"""The app behind the dashboard's browser tests: a run that fails its first attempt (retried
from the dashboard, it completes), a parent that spawns children and then waits for a signal,
a slow child, and a periodic schedule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio

from notifyq import App, JobContext, Permanent, RetryPolicy

app = App()


@app.handler("ui.flaky", retry=RetryPolicy(attempts=1))
async def flaky(ctx: JobContext) -> dict[str, int]:
    if ctx.run.attempt == 1:
        raise Permanent(ValueError("the first attempt always fails"))
    return {"attempt": ctx.run.attempt}


@app.handler("ui.child")
async def child(ctx: JobContext) -> dict[str, Any]:
    await anyio.sleep(float(ctx.input.get("seconds", 0)))
    return {"n": ctx.input.get("n")}


@app.handler("ui.parent")
async def parent(ctx: JobContext) -> dict[str, Any]:
    total = await ctx.step("plan", lambda: 2)
    children = [await ctx.spawn_child("ui.child", {"n": n}) for n in range(total)]
    outputs = await ctx.wait_for(*children)
    approval = await ctx.wait_for_signal(f"approve:{ctx.run.id}")
    return {"children": outputs, "approval": approval}


@app.periodic(every=timedelta(hours=1))
@app.handler("ui.report")
async def report(ctx: JobContext) -> None:
    return None
