"""Helpers for the in-process integration tests: run ``app.run_worker`` in a task group, wait
until its listener is LISTENing, and read the run table in SQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import psycopg
from psycopg.rows import dict_row

from notifyq import App
from tests.support import eventually


async def fetch(app: App, query: str, *params: Any) -> list[dict[str, Any]]:
    """Rows of ``query`` on the app's database, through a connection of its own."""
    dsn = app.settings.database_url
    assert dsn is not None
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                     row_factory=dict_row) as conn:
        cur = await conn.execute(query, params or None)
        return await cur.fetchall()


async def scalar(app: App, query: str, *params: Any) -> Any:
    rows = await fetch(app, query, *params)
    assert len(rows) == 1
    return next(iter(rows[0].values()))


async def listener_ready(app: App) -> None:
    """Wait until some worker of this database holds a LISTEN connection."""
    async def check() -> None:
        n = await scalar(app, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                              "current_database() AND application_name = 'notifyq-listener' "
                              "AND state = 'idle' AND query IN ('LISTEN \"notifyq\"', "
                              "'SELECT 1 AS ok')")
        assert n >= 1
    await eventually(check, timeout=10)


@asynccontextmanager
async def running(app: App, *, concurrency: int | None = None,
                  pools: list[str] | None = None) -> AsyncIterator[None]:
    """``app.run_worker`` in a task group for the block's duration, then a graceful stop."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run_worker, concurrency=concurrency, pools=pools))
        if app.settings.worker.listen:
            await listener_ready(app)
        yield
        tg.cancel_scope.cancel()


async def run_row(app: App, run_id: Any) -> dict[str, Any]:
    rows = await fetch(app, "SELECT * FROM notifyq.job_run WHERE id = %s", run_id)
    assert len(rows) == 1
    return rows[0]


async def status_becomes(app: App, run_id: Any, status: str, *,
                         within: float = 10.0) -> dict[str, Any]:
    async def check() -> dict[str, Any]:
        row = await run_row(app, run_id)
        assert row["status"] == status, row
        return row
    return await eventually(check, timeout=within)
