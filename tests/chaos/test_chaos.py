"""Fault injection under load, with real worker processes (and one in-process clock test).

Each scenario runs a steady enqueue load while it injects faults, then stops the load, waits for
the queue to drain and proves in SQL that every committed run completed exactly once
(``check_exactly_once``). Each prints its recovery time: from the last fault to drained.
The PostgreSQL restart scenario lives in ``test_pg_restart.py`` (it must run alone).
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import App, JobContext, RetryPolicy
from notifyq._dispatch.worker import Worker
from tests.apps.faults import FAULTS_DDL
from tests.conftest import fast_settings
from tests.support import (
    Load,
    Workers,
    assert_drained,
    backends,
    check_exactly_once,
    eventually,
    scalar,
    status_counts,
    terminate,
    wait_until,
)

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.chaos


@pytest.fixture
def db(sql: Conn) -> Conn:
    sql.execute(FAULTS_DDL)
    return sql


def _wait_ready(db: Conn, n_listeners: int) -> None:
    def check() -> None:
        assert len(backends(db, "notifyq-listener")) == n_listeners
        assert scalar(db, "SELECT count(*) FROM notifyq.job WHERE type = 'faults.record'") == 1
    wait_until(check, timeout=20)


def _drain(db: Conn, load: Load, workers: Workers, last_fault: float, scenario: str) -> int:
    """Wait for every committed run to complete; report the recovery time; return the total."""
    total = int(scalar(db, "SELECT count(*) FROM notifyq.job_run"))
    assert load.committed <= total <= load.committed + load.uncertain, (
        load.committed, load.uncertain, total)
    backlog = total - status_counts(db).get("completed", 0)
    try:
        wait_until(lambda: assert_drained(db, total), timeout=45, interval=0.05)
    except AssertionError:
        print(workers.logs())
        raise
    recovery = time.monotonic() - last_fault
    for problem, n in sorted(workers.problems().items()):
        print(f"[{scenario}] worker log: {n} x {problem}")
    print(f"[{scenario}] {total} runs ({load.uncertain} uncertain enqueues, "
          f"{len(load.errors)} enqueue errors); backlog {backlog} at the last fault; "
          f"drained {recovery:.2f} s after it")
    return total


# Handlers take 0.3 s, so every worker holds a few runs at any time: a kill orphans leases.
SLOW = {"job_type": "faults.slow", "input": '{"seconds": 0.3}', "batch": 6, "every_s": 0.1}


def _db_time(db: Conn) -> Any:
    return scalar(db, "SELECT clock_timestamp()")


@pytest.mark.timeout(90)
def test_sigkill_a_worker_every_1_5_s_under_load(dsn: str, db: Conn, logs: Path) -> None:
    rng = random.Random(7)
    kills: list[tuple[int, Any]] = []
    with Workers(dsn, logs) as workers, Load(dsn, **SLOW) as load:  # type: ignore[arg-type]
        for _ in range(4):
            workers.start()
        _wait_ready(db, 4)
        load.start()
        for _ in range(10):
            time.sleep(1.5)  # the kill schedule
            victim = rng.choice(workers.alive)
            workers.kill(victim)
            kills.append((victim.pid, _db_time(db)))
            workers.replace_dead()
        last_fault = time.monotonic()
        load.stop()
        total = _drain(db, load, workers, last_fault, "sigkill x10")
        assert workers.exit_codes == [-9] * 10  # nothing crashed besides the kills
        _wait_ready(db, 4)  # the last replacement is up (SIGTERM before that kills it)
        assert workers.stop_all() == [0] * 4, workers.logs()
    replays = check_exactly_once(db, total)["replays"]
    # Per kill: how many runs the victim held, and how long until the last was completed by
    # another worker (the reaper's error names the dead worker; completion keeps the error).
    orphans, recoveries = [], []
    for pid, killed_at in kills:
        row = db.execute(
            "SELECT count(*), max(finished_at) FROM notifyq.job_run "
            "WHERE error->>'type' = 'LeaseExpired' AND error->>'message' LIKE %s",
            (f"%:{pid}:%",)).fetchone()
        assert row is not None
        n, done = row
        orphans.append(n)
        if n:
            recoveries.append((done - killed_at).total_seconds())
    print(f"[sigkill x10] runs orphaned per kill {orphans}; kill -> orphans completed: "
          f"min {min(recoveries):.2f} s, max {max(recoveries):.2f} s; {replays} runs "
          f"re-executed after their worker died mid-write-back")
    assert sum(orphans) > 0  # the kills did hit running work


@pytest.mark.timeout(90)
def test_terminate_every_notifyq_connection_repeatedly_under_load(
        dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs) as workers, Load(dsn, **SLOW) as load:  # type: ignore[arg-type]
        for _ in range(4):
            workers.start()
        _wait_ready(db, 4)
        load.start()
        terminated, reconnects = [], []
        for _ in range(6):
            terminated.append(terminate(db, "notifyq%"))
            t0 = time.monotonic()
            _wait_ready(db, 4)  # every worker's listener is back
            reconnects.append(time.monotonic() - t0)
            time.sleep(max(0.0, 2.0 - reconnects[-1]))  # the fault schedule
        last_fault = time.monotonic()
        load.stop()
        total = _drain(db, load, workers, last_fault, "terminate x6")
        print(f"[terminate x6] backends terminated per round {terminated}; all listeners "
              f"back after {', '.join(f'{r:.2f}' for r in reconnects)} s")
        assert min(terminated) >= 8  # at least every worker's listener and pool each time
        assert len(workers.alive) == 4, workers.logs()  # no worker died of it
        assert workers.exit_codes == []
        assert workers.stop_all() == [0] * 4, workers.logs()
    check_exactly_once(db, total)


@pytest.mark.timeout(60)
def test_a_stalled_listener_does_not_stop_enqueue_or_processing(
        dsn: str, db: Conn, logs: Path) -> None:
    # Two listeners that never consume: one never reads its socket, one sits idle in a
    # transaction (the backend then cannot deliver, so the NOTIFY queue cannot advance past it).
    stalled = psycopg.connect(dsn, autocommit=True, application_name="nq-test-stalled")
    idle_in_tx = psycopg.connect(dsn, application_name="nq-test-stalled-tx")
    try:
        stalled.execute("LISTEN notifyq")
        idle_in_tx.execute("LISTEN notifyq")
        idle_in_tx.commit()
        idle_in_tx.execute("SELECT 1")  # opens a transaction left open
        usage_before = scalar(db, "SELECT pg_notification_queue_usage()")
        with Workers(dsn, logs) as workers, Load(dsn, batch=5, every_s=0.02) as load:
            workers.start()
            workers.start()
            _wait_ready(db, 2)
            load.start()
            t0 = time.monotonic()
            wait_until(lambda: _at_least(load, 1000), timeout=30, interval=0.1)
            last_fault = time.monotonic()
            load.stop()
            assert load.errors == []
            total = _drain(db, load, workers, last_fault, "stalled listener")
            usage = scalar(db, "SELECT pg_notification_queue_usage()")
            print(f"[stalled listener] {load.committed} enqueues in "
                  f"{last_fault - t0:.1f} s, NOTIFY queue usage {usage_before:.2e} -> "
                  f"{usage:.2e}")
            assert workers.stop_all() == [0, 0], workers.logs()
        check_exactly_once(db, total)
    finally:
        stalled.close()
        idle_in_tx.close()


def _at_least(load: Load, n: int) -> None:
    assert load.committed >= n, load.committed


# -- clock skew (in-process workers) -------------------------------------------------------------


class SkewedClock:
    """A host clock one hour ahead; like SystemClock it lets the database decide ``now``."""

    def __init__(self, skew: timedelta) -> None:
        self.skew = skew

    def now(self) -> datetime:
        return datetime.now(UTC) + self.skew

    def db_now(self) -> datetime | None:
        return None

    def monotonic(self) -> float:
        return time.monotonic()


def _worker(app: App, *, pools: list[str], maintenance: bool) -> Worker:
    db = app._runtime.opened
    assert db is not None
    return Worker(db=db, queries=app._runtime.queries, clock=app.clock, settings=app.settings,
                  registry=app._registry, listen_dsn=app.settings.database_url,
                  concurrency=8, pools=pools, maintenance=maintenance)


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_skewed_host_clock_does_not_make_live_leases_look_expired(
        dsn: str, sql: Conn) -> None:
    """Worker A (true clock) runs 3 s handlers on a 1 s lease, kept alive by heartbeats.
    Worker B's host clock is an hour ahead and B alone runs the reaper. Lease expiry is decided
    by the database clock (``db_now()`` is None), so B must not reap A's live runs."""
    skew = timedelta(hours=1)
    true_app = App(settings=fast_settings(dsn, worker={"lease_s": 1.0}))
    skewed_app = App(settings=fast_settings(dsn, reaper={"interval_s": 0.05}),
                     clock=SkewedClock(skew))
    finished: list[int] = []

    @true_app.handler("skew.long")
    async def long(ctx: JobContext) -> None:
        await anyio.sleep(3)
        finished.append(ctx.run.attempt)

    async with true_app, skewed_app:
        a = _worker(true_app, pools=["default"], maintenance=False)
        b = _worker(skewed_app, pools=["skewed"], maintenance=True)
        runs = await true_app.enqueue_many([{"job_type": "skew.long"}] * 5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.run)
            tg.start_soon(b.run)

            async def b_leads_and_a_runs() -> None:
                assert b.elector.is_leader
                assert len(a.active) == 5
            await eventually(b_leads_and_a_runs, timeout=10)
            # The reaper query with B's host time would reap them all: the skew is real.
            with sql.transaction(force_rollback=True):
                would_reap = sql.execute(true_app._runtime.queries.job_run_reap_expired,
                                         {"now": b._clock.now(), "limit": 100}).fetchall()
            assert len(would_reap) == 5

            async def all_done() -> None:
                assert len(finished) == 5
                assert not a.active
            await eventually(all_done, timeout=15)
            a.stop()
            b.stop()

    assert finished == [1] * 5  # each ran once, never re-claimed
    rows = sql.execute("SELECT status, attempts, error FROM notifyq.job_run "
                       "WHERE id = ANY(%s)", ([r.id for r in runs],)).fetchall()
    assert rows == [("completed", 1, None)] * 5  # one claim each: attempts counts claims


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_skewed_host_clock_does_not_delay_retries(dsn: str, sql: Conn) -> None:
    """A retry after 0.2 s must become runnable 0.2 s later by the database clock, not an hour
    later because the worker's host clock runs ahead."""
    app = App(settings=fast_settings(dsn), clock=SkewedClock(timedelta(hours=1)))
    attempts: list[int] = []

    @app.handler("skew.flaky", retry=RetryPolicy(attempts=3, backoff="fixed", base_s=0.2))
    async def flaky(ctx: JobContext) -> None:
        attempts.append(ctx.run.attempt)
        if ctx.run.attempt == 1:
            raise RuntimeError("first attempt fails")

    async with app:
        run = await app.enqueue("skew.flaky")
        worker = _worker(app, pools=["default"], maintenance=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)

            async def completed() -> None:
                assert attempts == [1, 2]
                assert not worker.active
            try:
                await eventually(completed, timeout=10)
            finally:
                worker.stop()
    row = sql.execute("SELECT status, attempts, run_at <= now() FROM notifyq.job_run "
                      "WHERE id = %s", (run.id,)).fetchone()
    assert row == ("completed", 2, True)
