"""Graceful shutdown of an in-process worker: grace period, release, leadership."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import App, JobContext
from notifyq._db.pool import StopGrace
from tests.conftest import fast_settings
from tests.integration.inproc import fetch, run_row, running, scalar, status_becomes
from tests.support import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
async def short_grace_app(dsn: str) -> AsyncIterator[App]:
    application = App(settings=fast_settings(dsn, worker={"shutdown_grace_s": 0.3}))
    async with application:
        yield application


async def test_a_handler_outliving_the_grace_period_is_cancelled_and_its_run_released(
        short_grace_app: App) -> None:
    app = short_grace_app
    started = anyio.Event()
    cancelled = anyio.Event()

    @app.handler("t.long")
    async def long(ctx: JobContext) -> None:
        started.set()
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    run = await app.enqueue("t.long", {})
    async with running(app):
        with anyio.fail_after(10):
            await started.wait()
        assert (await run_row(app, run.id))["attempts"] == 1
    # running() returned: the worker has shut down.
    assert cancelled.is_set()
    row = await run_row(app, run.id)
    assert row["status"] == "pending"
    assert row["attempts"] == 0  # the interrupted attempt does not count
    assert row["leased_by"] is None
    assert row["lease_expires_at"] is None
    assert row["finished_at"] is None
    assert row["error"] is None
    assert await scalar(app, "SELECT run_at <= now() FROM notifyq.job_run") is True


async def test_a_handler_finishing_within_the_grace_period_completes(dsn: str) -> None:
    app = App(settings=fast_settings(dsn, worker={"shutdown_grace_s": 10.0}))
    started = anyio.Event()
    finished = anyio.Event()

    @app.handler("t.finishing")
    async def finishing(ctx: JobContext) -> str:
        started.set()
        await anyio.sleep(0.5)  # the work outlasts the start of shutdown, not the grace
        finished.set()
        return "finished"

    async with app:
        run = await app.enqueue("t.finishing", {})
        async with running(app):
            with anyio.fail_after(10):
                await started.wait()
            assert not finished.is_set()
        # Shutdown began while the handler was still working, and waited for it.
        assert finished.is_set()
        row = await run_row(app, run.id)
    assert row["status"] == "completed"
    assert row["output"] == "finished"
    assert row["attempts"] == 1


async def test_a_sync_handler_outliving_the_grace_period_is_released(
        short_grace_app: App) -> None:
    app = short_grace_app
    started = threading.Event()
    finish = threading.Event()

    @app.handler("t.blocking")
    def blocking(ctx: JobContext) -> str:
        started.set()
        finish.wait(30)  # a thread cannot be cancelled: the worker abandons it
        return "too late"

    run = await app.enqueue("t.blocking", {})
    try:
        async with running(app):
            await eventually(_is_set(started))
        row = await run_row(app, run.id)
        assert (row["status"], row["attempts"]) == ("pending", 0)
    finally:
        finish.set()


def _is_set(event: threading.Event):  # type: ignore[no-untyped-def]
    async def check() -> None:
        assert event.is_set()
    return check


async def test_shutdown_stops_claiming_and_resigns_leadership(short_grace_app: App) -> None:
    app = short_grace_app

    @app.handler("t.quick")
    async def quick(ctx: JobContext) -> None: ...

    first = await app.enqueue("t.quick", {})
    async with running(app):
        await status_becomes(app, first.id, "completed")

        async def leading() -> None:
            assert len(await fetch(app, "SELECT * FROM notifyq.leader")) == 1
        await eventually(leading)
    later = await app.enqueue("t.quick", {})
    assert await fetch(app, "SELECT * FROM notifyq.leader") == []
    assert (await run_row(app, later.id))["status"] == "pending"


async def test_several_running_handlers_are_all_released_at_shutdown(
        short_grace_app: App) -> None:
    app = short_grace_app
    running_now = 0

    @app.handler("t.many")
    async def many(ctx: JobContext) -> None:
        nonlocal running_now
        running_now += 1
        await anyio.sleep(60)

    await app.enqueue_many([{"job_type": "t.many"} for _ in range(5)])
    async with running(app, concurrency=5):
        async def all_running() -> None:
            assert running_now == 5
        await eventually(all_running)
    rows = await fetch(app, "SELECT status, attempts, count(*) AS n FROM notifyq.job_run "
                            "GROUP BY status, attempts")
    assert rows == [{"status": "pending", "attempts": 0, "n": 5}]


async def test_claimed_ahead_runs_are_leased_while_buffered_and_released_at_shutdown(
        dsn: str) -> None:
    app = App(settings=fast_settings(dsn, worker={"shutdown_grace_s": 0.3, "concurrency": 1,
                                                  "prefetch": 2}))
    started = anyio.Event()

    @app.handler("t.block")
    async def block(ctx: JobContext) -> None:
        started.set()
        await anyio.sleep(60)

    async with app:
        for _ in range(5):
            await app.enqueue("t.block", {})
        async with running(app, concurrency=1):
            with anyio.fail_after(10):
                await started.wait()

            async def one_running_two_buffered() -> None:
                rows = await fetch(app, "SELECT status, count(*) AS n, "
                                        "count(lease_expires_at) AS leased "
                                        "FROM notifyq.job_run GROUP BY status ORDER BY status")
                assert rows == [{"status": "pending", "n": 2, "leased": 0},
                                {"status": "running", "n": 3, "leased": 3}]

            await eventually(one_running_two_buffered)
        # Shut down: the buffered two never started, the running one was interrupted; all
        # three are back to pending with the attempt given back.
        rows = await fetch(app, "SELECT status, attempts, leased_by FROM notifyq.job_run")
    assert rows == [{"status": "pending", "attempts": 0, "leased_by": None}] * 5


async def test_a_stop_lets_the_producers_query_finish_instead_of_cancelling_it(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """An idle producer asks when the next scheduled run is due after every short claim; a stop
    used to cancel that query mid-flight, and psycopg then cancelled it on the server, warned
    ("query cancellation interrupted") and the pool dropped the connection. The query is held
    in flight here for real: it reads rate_window, which the test locks."""
    app = App(settings=fast_settings(dsn))
    async with app, await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute("LOCK TABLE notifyq.rate_window IN ACCESS EXCLUSIVE MODE")

        async def delay_query_waits() -> None:
            assert await scalar(app, "SELECT count(*) FROM pg_stat_activity "
                                     "WHERE datname = current_database() "
                                     "AND wait_event_type = 'Lock' "
                                     "AND query LIKE '%%rate_window%%'") == 1

        async def unlock_later() -> None:
            await anyio.sleep(0.5)
            await locker.rollback()

        caplog.set_level(logging.WARNING, logger="psycopg")
        async with anyio.create_task_group() as tg:
            async with running(app):
                await eventually(delay_query_waits, timeout=10)
                tg.start_soon(unlock_later)
                began = anyio.current_time()
            # running() returned: the worker stopped, once the query had its answer.
            assert 0.3 <= anyio.current_time() - began < 5
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []


async def test_a_statement_the_stop_lets_finish_is_cancelled_after_the_grace(dsn: str) -> None:
    """A server that never answers must not hold a stopping worker: past ``grace_s`` the
    statement is cancelled after all."""
    grace = StopGrace(grace_s=0.3)
    finished: list[str] = []

    async def periodic(conn: psycopg.AsyncConnection[Any]) -> None:
        with grace.finishing():
            try:
                await conn.execute("SELECT pg_sleep(30)")
            except anyio.get_cancelled_exc_class():
                finished.append("cancelled")
                raise
            finished.append("answered")

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher:
        began = anyio.current_time()
        async def sleeping() -> None:
            rows = await (await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND state = 'active'",
                (conn.info.backend_pid,))).fetchone()
            assert rows == (1,)

        async with anyio.create_task_group() as tg:
            tg.start_soon(periodic, conn)
            await eventually(sleeping, timeout=10)
            grace.stop()
            tg.cancel_scope.cancel()  # shielded: the statement goes on for the grace
        elapsed = anyio.current_time() - began
    assert finished == ["cancelled"]
    assert 0.3 <= elapsed < 5, elapsed
