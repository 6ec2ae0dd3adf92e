"""Another transaction holds a running run's row locked (issue 31, item 1): the worker's
write-backs and heartbeats skip that row and go on with the others, the run's own write-back
and lease wait for the lock alone, and nothing is reported lost or reaped for a lock. In
process, with a real worker; the probe with a worker process under load is
tests/chaos/test_row_lock.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest

from notifyq import App, JobContext
from notifyq._dispatch.worker import Worker
from tests.conftest import fast_settings
from tests.integration.inproc import fetch, listener_ready, run_row, status_becomes
from tests.support import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@asynccontextmanager
async def worker_of(app: App) -> AsyncIterator[Worker]:
    async with anyio.create_task_group() as tg:
        worker: Worker = await tg.start(app.run_worker)
        await listener_ready(app)
        yield worker
        tg.cancel_scope.cancel()


async def _waits_for_a_lock(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")).fetchone()
    assert row is not None
    assert row[0] >= 1


@asynccontextmanager
async def row_locked(dsn: str, run_id: UUID) -> AsyncIterator[None]:
    """An application's transaction holding ``SELECT ... FOR UPDATE`` on the run's row."""
    async with await psycopg.AsyncConnection.connect(
            dsn, application_name="nq-test-row-lock") as conn:
        await conn.execute("SELECT FROM notifyq.job_run WHERE id = %s FOR UPDATE", (run_id,))
        yield
        await conn.rollback()


async def test_a_write_back_whose_row_is_locked_waits_alone_while_its_batch_is_written(
        dsn: str) -> None:
    # One completer lane: the two write-backs go in one statement (with two, they may split).
    app = App(settings=fast_settings(dsn, worker={"completer_connections": 1}))
    release = anyio.Event()

    @app.handler("t.gated")
    async def gated(ctx: JobContext) -> int:
        await release.wait()
        return int(ctx.input["n"])

    async with app:
        locked = await app.enqueue("t.gated", {"n": 1})
        other = await app.enqueue("t.gated", {"n": 2})
        async with worker_of(app) as worker:
            await status_becomes(app, other.id, "running")
            async with row_locked(dsn, locked.id):
                release.set()  # both finish at once: their write-backs go in one statement
                await status_becomes(app, other.id, "completed")
                assert (await run_row(app, locked.id))["status"] == "running"
                # Held until the locked run's write-back waits for the lock alone (skipped, and
                # skipped again 10 ms later): released sooner, a busy machine could let its
                # retry find the row free and write it the usual way.
                await eventually(lambda: _waits_for_a_lock(dsn))
            row = await status_becomes(app, locked.id, "completed")
            assert worker.completer.written_alone == 1
            assert worker.completer.lease_lost == 0
    assert (row["output"], row["attempts"], row["error"]) == (1, 1, None)


async def test_a_locked_runs_lease_outlives_the_lock_and_the_others_leases_are_extended_meanwhile(
        dsn: str) -> None:
    # Lease 1 s, heartbeat every 1/3 s, reaper every 0.2 s; the handlers work 3.5 s, and the
    # first run's row is locked until its lease has run out half a second ago.
    app = App(settings=fast_settings(dsn, worker={"lease_s": 1.0}))
    calls: Counter[int] = Counter()

    @app.handler("t.long")
    async def long(ctx: JobContext) -> None:
        calls[int(ctx.input["n"])] += 1
        await anyio.sleep(3.5)  # simulated work spanning several leases

    async with app:
        # The heartbeat takes its runs in id order: the locked one comes first.
        locked = await app.enqueue("t.long", {"n": 1})
        other = await app.enqueue("t.long", {"n": 2})
        async with worker_of(app):
            await status_becomes(app, other.id, "running")
            async with row_locked(dsn, locked.id):
                await eventually(lambda: _lease_ran_out(app, locked.id, ago_s=0.5), timeout=10)
                # Meanwhile the other run's lease was kept.
                assert not await _lease_ran_out_now(app, other.id)
                # Held until the locked run's lease extension waits for the lock alone: released
                # before (a busy machine's heartbeat late), the reaper could find the row free
                # and its lease out, and take it over first.
                await eventually(lambda: _waits_for_a_lock(dsn))
            rows = [await status_becomes(app, run.id, "completed") for run in (locked, other)]
    assert calls == {1: 1, 2: 1}
    assert [(r["attempts"], r["error"]) for r in rows] == [(1, None), (1, None)]


async def _lease_ran_out(app: App, run_id: UUID, *, ago_s: float) -> None:
    rows = await fetch(app, "SELECT lease_expires_at < clock_timestamp() - make_interval("
                            "secs => %s) AS out FROM notifyq.job_run WHERE id = %s",
                       ago_s, run_id)
    assert rows[0]["out"], rows


async def _lease_ran_out_now(app: App, run_id: UUID) -> Any:
    rows = await fetch(app, "SELECT lease_expires_at < clock_timestamp() AS out "
                            "FROM notifyq.job_run WHERE id = %s", run_id)
    return rows[0]["out"]
