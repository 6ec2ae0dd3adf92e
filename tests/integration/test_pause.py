"""Pausing a pool or a job type with real ``python -m notifyq worker`` processes: nothing paused
is claimed by any of them, runs already running finish, and a resume drains the rest. Every
outcome is counted in SQL (``check_exactly_once`` proves the drain ran each run once)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import App
from tests.apps.faults import FAULTS_DDL
from tests.integration.test_cli import ok
from tests.support import (
    Workers,
    backends,
    check_exactly_once,
    enqueue_sql,
    scalar,
    wait_until,
)

Conn = psycopg.Connection[Any]
POLL_S = 0.2  # Workers' NOTIFYQ_WORKER__POLL_INTERVAL_S
HOLD_S = 1.5  # how long paused work is watched: seven polls of every worker


@pytest.fixture
def db(sql: Conn) -> Conn:
    sql.execute(FAULTS_DDL)
    return sql


def _count(db: Conn, where: str, params: Any = None) -> int:
    return int(scalar(db, f"SELECT count(*) FROM notifyq.job_run WHERE {where}", params))


def _equals(actual: int, expected: int) -> None:
    assert actual == expected, (actual, expected)


def _listening(db: Conn, n: int) -> None:
    wait_until(lambda: _equals(len(backends(db, "notifyq-listener")), n), timeout=30)


def _holds(check: Any, seconds: float) -> None:
    """``check`` passes on every look for ``seconds`` (a property over time, not a sleep)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check()
        time.sleep(0.05)


def _never_claimed(db: Conn, job_type: str, n: int) -> None:
    _equals(_count(db, "job_type = %s AND status = 'pending' AND attempts = 0", (job_type,)), n)


@pytest.mark.timeout(120)
def test_a_paused_pool_is_claimed_by_no_worker_and_drains_after_resume(
        dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs, concurrency=4) as workers:
        for _ in range(3):
            workers.start()
        _listening(db, 3)
        enqueue_sql(db, "faults.slow", 6, input='{"seconds": 1.0}')
        wait_until(lambda: _equals(_count(db, "status = 'running'"), 6), timeout=20)

        ok(dsn, "pause", "pool", "default", "--reason", "test")
        enqueue_sql(db, "faults.record", 200)
        # The six running runs finish (completed, not released or canceled) ...
        wait_until(lambda: _equals(_count(db, "job_type = 'faults.slow' AND status = "
                                              "'completed' AND attempts = 1"), 6), timeout=20)
        # ... and for seven polls of each of the three workers, nothing new is claimed.
        _holds(lambda: _never_claimed(db, "faults.record", 200), HOLD_S)

        ok(dsn, "resume", "pool", "default")
        wait_until(lambda: _equals(_count(db, "status = 'completed'"), 206), timeout=60)
        check_exactly_once(db, 206)
    assert scalar(db, "SELECT count(*) FROM notifyq.pause") == 0


@pytest.mark.timeout(120)
def test_a_paused_type_waits_while_the_rest_of_its_pool_drains(
        dsn: str, db: Conn, logs: Path) -> None:
    async def pause() -> None:
        async with App(dsn) as app:
            await app.pause(job_type="faults.slow", reason="test")

    async def resume() -> bool:
        async with App(dsn) as app:
            return await app.resume(job_type="faults.slow")

    with Workers(dsn, logs, concurrency=4) as workers:
        for _ in range(3):
            workers.start()
        _listening(db, 3)
        anyio.run(pause)
        # The paused type's runs are enqueued first: older, so ahead in every claim's order.
        enqueue_sql(db, "faults.slow", 20, input='{"seconds": 0.01}')
        enqueue_sql(db, "faults.record", 300)
        wait_until(lambda: _equals(_count(db, "job_type = 'faults.record' AND status = "
                                              "'completed'"), 300), timeout=60)
        _holds(lambda: _never_claimed(db, "faults.slow", 20), HOLD_S)

        assert anyio.run(resume) is True
        wait_until(lambda: _equals(_count(db, "status = 'completed'"), 320), timeout=60)
        check_exactly_once(db, 320)
