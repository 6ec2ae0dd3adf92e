"""A worker's app for the dashboard's operations tests, in pool ``gated`` (which ``serve``
does not claim from): runs that block until a file exists, a durable run that sleeps for an
hour, and one that waits for a signal."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from notifyq import App, JobContext, RetryPolicy

app = App()


@app.handler("ui.gate", pool="gated")
def gate(ctx: JobContext) -> None:  # sync: runs in a thread
    while not Path(ctx.input["gate"]).exists():
        time.sleep(0.05)


@app.handler("ui.nap", pool="gated", retry=RetryPolicy(attempts=3))
async def nap(ctx: JobContext) -> str:
    await ctx.step("prepare", lambda: "ready")
    await ctx.sleep(timedelta(hours=1))
    return "rested"


@app.handler("ui.approval", pool="gated")
async def approval(ctx: JobContext) -> Any:
    return await ctx.wait_for_signal(f"approve:{ctx.run.id}")


@app.handler("ui.steps", pool="gated")
async def steps(ctx: JobContext) -> dict[str, Any]:
    first = await ctx.step("first", lambda: 1)
    second = await ctx.step("second", lambda: ctx.run.attempt)
    return {"first": first, "second": second}
