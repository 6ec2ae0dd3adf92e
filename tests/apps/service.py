"""A small app for the ``notifyq serve`` tests: handlers that need no tables of their own."""

from __future__ import annotations

from typing import Any

import anyio

from notifyq import App, ConcurrencyPolicy, JobContext, Permanent, RetryPolicy, Scope

app = App()


@app.handler("svc.echo")
async def echo(ctx: JobContext) -> Any:
    return ctx.input


@app.handler("svc.slow")
async def slow(ctx: JobContext) -> dict[str, float]:
    seconds = float(ctx.input.get("seconds", 0.2))
    await anyio.sleep(seconds)
    return {"slept": seconds}


@app.handler("svc.fail", retry=RetryPolicy(attempts=1))
async def fail(ctx: JobContext) -> None:
    ctx.log.warning("refusing this one")
    raise Permanent(ValueError("no"))


@app.handler("svc.exclusive", concurrency=ConcurrencyPolicy(key="acct:{acct}", collision="reject"),
             scope=Scope(entity="account", id_from="{acct}"))
async def exclusive(ctx: JobContext) -> None:
    await anyio.sleep(float(ctx.input.get("seconds", 0)))
