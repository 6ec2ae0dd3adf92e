"""A test app with periodic schedules for the process and HTTP tests: a cron schedule with
catch-up (every minute, UTC), a fast interval one, and a cron one in Berlin whose name holds a
``/`` (the API takes it whole)."""

from __future__ import annotations

from datetime import timedelta

from notifyq import App, JobContext

app = App()


@app.periodic(cron="* * * * *", name="minutely", catch_up=True)
@app.handler("sched.minutely")
async def minutely(ctx: JobContext) -> None:
    return None


@app.periodic(every=timedelta(milliseconds=200), name="fast")
@app.handler("sched.fast")
async def fast(ctx: JobContext) -> None:
    return None


@app.periodic(cron="*/15 9-17 * * MON-FRI", tz="Europe/Berlin")
@app.handler("sched.office")
async def office(ctx: JobContext) -> None:
    return None
