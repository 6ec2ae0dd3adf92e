"""Claim-ahead on a real worker: with ``worker.prefetch`` unset, a worker whose runs are long
holds few runs beyond its busy slots (they stay claimable by other workers); set, it holds that
many. Counted in SQL: a claimed run is ``running`` whether it executes or waits in the buffer."""

from __future__ import annotations

from functools import partial
from typing import Any
from uuid import UUID

import anyio
import pytest

from notifyq import App, JobContext
from notifyq._dispatch.worker import Worker
from tests.conftest import fast_settings
from tests.integration.inproc import fetch, running, scalar

pytestmark = pytest.mark.anyio

CONCURRENCY = 4


async def _held_over(app: App, finished: set[UUID], start_s: float,
                     until_s: float) -> list[int]:
    """Runs claimed and not finished (executing or buffered), sampled every 50 ms for
    ``until_s`` after the call; the samples taken from ``start_s`` on. A run whose handler
    returned (``finished``) is not held even while SQL still shows it running: its write-back
    can be a statement late (its row skipped while the heartbeat held it, then sent again)."""
    samples: list[tuple[float, int]] = []
    began = anyio.current_time()
    with anyio.move_on_after(until_s):
        while True:
            rows = await fetch(app, "SELECT id FROM notifyq.job_run WHERE status = 'running'")
            samples.append((anyio.current_time() - began,
                            sum(1 for row in rows if row["id"] not in finished)))
            await anyio.sleep(0.05)
    return [held for at, held in samples if at >= start_s]


@pytest.mark.parametrize(("prefetch", "settings"), [(None, {}), (4, {"prefetch": 4})],
                         ids=["adaptive", "fixed"])
async def test_a_worker_with_long_runs_claims_ahead_only_what_its_prefetch_says(
        dsn: str, prefetch: int | None, settings: dict[str, Any]) -> None:
    # One completer lane: with two (the default) a finished run's write-back may still be
    # uncommitted on one lane when the other's claim commits (its slot was freed when the
    # handler returned), and SQL counts that run as running too: a CI run saw 9 for 4 + 4.
    # Lanes have their own tests (tests/integration/test_completer_lanes.py).
    app = App(settings=fast_settings(dsn, worker={**settings, "completer_connections": 1}))
    finished: set[UUID] = set()

    @app.handler("t.slow")
    async def slow(ctx: JobContext) -> None:
        await anyio.sleep(1.0)
        finished.add(ctx.run.id)

    async with app:
        await app.enqueue_many([{"job_type": "t.slow", "input": {}} for _ in range(40)])
        async with running(app, concurrency=CONCURRENCY):
            # The first claim, before anything was measured, holds concurrency + concurrency;
            # the first runs finish after a second.
            held = await _held_over(app, finished, 2.5, 5.0)
    assert len(held) >= 10
    if prefetch is None:
        # 4 runs a second with statements of a few ms want one run ahead.
        assert max(held) <= CONCURRENCY + 2, held
    else:
        assert max(held) == CONCURRENCY + prefetch, held


async def test_a_busy_workers_handlers_run_while_its_next_statement_is_in_flight(
        dsn: str) -> None:
    # Statement k writes back batch k-1 and claims batch k+1 while the handlers run batch k
    # (notifyq/_dispatch/completer.py). Before, a slot ran its whole batch between statements:
    # no handler ever saw one in flight, and the server and the handlers took turns.
    # One lane: with two (the default), the second lane also sends write-backs alone while
    # the first carries the claim (tests/integration/test_completer_lanes.py).
    app = App(settings=fast_settings(dsn, worker={"prefetch": 12, "completer_connections": 1}))
    worker: Worker | None = None
    in_flight: list[bool] = []

    @app.handler("t.noop")
    async def noop(ctx: JobContext) -> None:
        assert worker is not None
        in_flight.append(worker.completer.in_flight > 0)

    n = 600
    async with app:
        await app.enqueue_many([{"job_type": "t.noop", "input": {}} for _ in range(n)])
        async with anyio.create_task_group() as tg:
            worker = await tg.start(partial(app.run_worker, concurrency=CONCURRENCY,
                                            burst=True))
        assert await scalar(app, "SELECT count(*) FROM notifyq.job_run"
                                 " WHERE status = 'completed' AND attempts = 1") == n
    assert len(in_flight) == n
    assert sum(in_flight) >= 0.8 * n, sum(in_flight)
    # Each statement carried a claim (the producer's next one, queued by the completer as a
    # full batch came back), not write-backs alone and then the claim alone.
    ran: Worker | None = worker  # mypy does not narrow a variable a closure reads
    assert ran is not None
    claims = sum(p.claims for p in ran.producers.values())
    assert ran.completer.batches <= claims + 2, (ran.completer.batches, claims)
    assert claims < n / 4  # batches, not a statement a run


async def test_a_worker_of_fast_handlers_claims_ahead_up_to_its_cap(dsn: str) -> None:
    # No-op handlers finish as fast as the worker claims them: the window follows what the
    # handlers could do (the cap: 20 a slot), not the rate the window itself allows.
    app = App(settings=fast_settings(dsn))
    worker: Worker | None = None
    prefetches: list[int] = []

    @app.handler("t.noop")
    async def noop(ctx: JobContext) -> None:
        assert worker is not None
        prefetches.append(worker.claim_ahead.prefetch)

    n = 4000
    async with app:
        await app.enqueue_many([{"job_type": "t.noop", "input": {}} for _ in range(n)])
        async with anyio.create_task_group() as tg:
            worker = await tg.start(partial(app.run_worker, concurrency=CONCURRENCY,
                                            burst=True))
        assert await scalar(app, "SELECT count(*) FROM notifyq.job_run"
                                 " WHERE status = 'completed' AND attempts = 1") == n
    assert len(prefetches) == n
    assert prefetches[0] == CONCURRENCY  # before any estimate
    assert max(prefetches) == 20 * CONCURRENCY
