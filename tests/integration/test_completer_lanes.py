"""The completer's lanes (``worker.completer_connections``): up to that many statements in
flight at once, each on a connection of its own, opened only when statements overlap; and
still every run completed once. Counted in SQL and in pg_stat_activity."""

from __future__ import annotations

from functools import partial

import anyio
import pytest

from notifyq import App, JobContext
from notifyq._dispatch.completer import Completer
from notifyq._dispatch.worker import Worker
from tests.conftest import fast_settings
from tests.integration.inproc import listener_ready, scalar
from tests.support import eventually

pytestmark = pytest.mark.anyio

N = 3000


async def _drain(app: App, concurrency: int) -> tuple[list[int], Worker]:
    """Run N no-op runs with a burst worker; the completer's statements in flight, as each
    handler saw them."""
    worker: Worker | None = None
    seen: list[int] = []

    @app.handler("t.noop")
    async def noop(ctx: JobContext) -> None:
        assert worker is not None
        seen.append(worker.completer.in_flight)

    await app.enqueue_many([{"job_type": "t.noop", "input": {"i": i}} for i in range(N)])
    async with anyio.create_task_group() as tg:
        worker = await tg.start(partial(app.run_worker, concurrency=concurrency, burst=True))
    assert worker is not None
    return seen, worker


async def _completed_once(app: App) -> int:
    return int(await scalar(app, "SELECT count(*) FROM notifyq.job_run"
                                 " WHERE status = 'completed' AND attempts = 1"))


async def test_a_busy_worker_has_two_statements_in_flight_and_completes_each_run_once(
        dsn: str) -> None:
    app = App(settings=fast_settings(dsn))
    assert app.settings.worker.completer_connections == 2  # the default
    async with app:
        seen, worker = await _drain(app, concurrency=50)
        assert await _completed_once(app) == N
    assert len(seen) == N  # each handler ran once
    assert max(seen) == 2, sorted(set(seen))
    assert worker.completer.lease_lost == 0


async def test_with_one_completer_connection_statements_go_one_after_the_other(
        dsn: str) -> None:
    app = App(settings=fast_settings(dsn, worker={"completer_connections": 1}))
    async with app:
        seen, _ = await _drain(app, concurrency=50)
        assert await _completed_once(app) == N
    assert len(seen) == N
    assert max(seen) == 1


async def test_a_worker_opens_a_completer_connection_only_for_statements_that_overlap(
        dsn: str) -> None:
    # Woken by each enqueue's NOTIFY; no poll claim to overlap a write-back.
    app = App(settings=fast_settings(dsn, worker={"poll_interval_s": 60}))
    done: list[int] = []

    @app.handler("t.one")
    async def one(ctx: JobContext) -> None:
        done.append(ctx.input["i"])

    async def settled(worker: Worker, n: int) -> None:
        assert await scalar(app, "SELECT count(*) FROM notifyq.job_run"
                                 " WHERE status = 'completed'") == n
        # A write-back commits before its answer reaches the worker: the next enqueue's claim
        # would overlap the statement still in flight on the worker's side.
        assert worker.completer.in_flight == 0

    async with app, anyio.create_task_group() as tg:
        worker = await tg.start(partial(app.run_worker, concurrency=4))
        await listener_ready(app)
        for i in range(5):  # one at a time: a claim, then its write-back, mostly alone
            await app.enqueue("t.one", {"i": i})
            await eventually(partial(settled, worker, i + 1))
        # A claim the worker sends on its own after a write-back (its claim-ahead finding
        # nothing) may still meet the next enqueue's: then, and only then, a second lane
        # opens a connection. Mostly the statements go one at a time, on one connection.
        overlapped = worker.completer.most_held
        assert overlapped in (1, 2)
        assert await scalar(app, "SELECT count(*) FROM pg_stat_activity"
                                 " WHERE application_name = 'notifyq-completer'"
                                 " AND datname = current_database()") == overlapped
        tg.cancel_scope.cancel()
    assert done == list(range(5))


async def test_a_completer_needs_at_least_one_lane(app: App) -> None:
    with pytest.raises(ValueError, match="lanes must be at least 1, got 0"):
        Completer(await app.pool(), app._runtime.queries, app.clock, lanes=0)
