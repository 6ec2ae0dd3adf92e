"""Signals (issue 11, item 11), with real worker processes: a signal is consumed by the wait that
receives it, signals sent before anyone waits queue up and are received in order, one signal
wakes one run, and a signal nobody waited for expires."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import Workers, wait_until

APP = "tests.apps.semantics:app"
Conn = psycopg.Connection[Any]


@pytest.fixture
def sql(dsn: str) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def waiter(sql: Conn, token: str) -> Any:
    """A run that waits for ``token`` and returns the payload it receives."""
    row = sql.execute("SELECT notifyq.enqueue('signal.receive', jsonb_build_object('token', "
                      "%s::text))", (token,)).fetchone()
    assert row is not None
    return row[0]


def signal(sql: Conn, token: str, payload: str) -> int:
    row = sql.execute("SELECT notifyq.signal(%s, %s::jsonb)", (token, payload)).fetchone()
    assert row is not None
    return int(row[0])


def state(sql: Conn, run_id: Any) -> tuple[str, Any]:
    row = sql.execute("SELECT status, output FROM notifyq.job_run WHERE id = %s",
                      (run_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


def becomes(sql: Conn, run_id: Any, status: str, workers: Workers) -> Any:
    def check() -> Any:
        now, output = state(sql, run_id)
        assert now == status, (now, workers.logs())
        return output
    return wait_until(check, timeout=30)


def queued(sql: Conn, token: str) -> list[Any]:
    # In the order sent (each signal of these tests is its own transaction).
    return [r[0] for r in sql.execute("SELECT payload FROM notifyq.job_signal WHERE token = %s "
                                      "ORDER BY created_at", (token,)).fetchall()]


@pytest.mark.timeout(90)
def test_a_signal_is_consumed_by_the_wait_that_receives_it(dsn: str, sql: Conn,
                                                           logs: Path) -> None:
    with Workers(dsn, logs, app=APP) as workers:
        workers.start()
        first = waiter(sql, "approve:1")
        becomes(sql, first, "waiting", workers)
        assert signal(sql, "approve:1", '{"by": "ann"}') == 1
        assert becomes(sql, first, "completed", workers) == {"by": "ann"}
        # A later run waiting on the same token does not receive the old payload: it waits...
        second = waiter(sql, "approve:1")
        becomes(sql, second, "waiting", workers)
        # ...through the resumer's ticks too (a queued signal would wake it within 0.5 s).
        wait_until(lambda: _still_waiting(sql, second), timeout=5)
        assert signal(sql, "approve:1", '{"by": "bob"}') == 1
        assert becomes(sql, second, "completed", workers) == {"by": "bob"}
        assert queued(sql, "approve:1") == []  # both were delivered, none kept
        assert workers.stop_all() == [0]


def _still_waiting(sql: Conn, run_id: Any) -> None:
    """Passes once the resumer has run at least once since the run started waiting."""
    assert state(sql, run_id)[0] == "waiting"
    row = sql.execute("SELECT clock_timestamp() - updated_at > interval '1.5 seconds' "
                      "FROM notifyq.job_run WHERE id = %s", (run_id,)).fetchone()
    assert row == (True,)


@pytest.mark.timeout(90)
def test_signals_sent_before_anyone_waits_are_received_in_order_one_per_wait(
        dsn: str, sql: Conn, logs: Path) -> None:
    assert signal(sql, "batch:7", '{"n": 1}') == 0
    assert signal(sql, "batch:7", '{"n": 2}') == 0
    assert queued(sql, "batch:7") == [{"n": 1}, {"n": 2}]
    with Workers(dsn, logs, app=APP) as workers:
        workers.start()
        first = waiter(sql, "batch:7")
        assert becomes(sql, first, "completed", workers) == {"n": 1}
        second = waiter(sql, "batch:7")
        assert becomes(sql, second, "completed", workers) == {"n": 2}
        third = waiter(sql, "batch:7")
        becomes(sql, third, "waiting", workers)  # both signals were taken
        assert queued(sql, "batch:7") == []
        assert workers.stop_all() == [0]


@pytest.mark.timeout(90)
def test_one_signal_wakes_one_of_two_runs_waiting_on_a_token(dsn: str, sql: Conn,
                                                             logs: Path) -> None:
    with Workers(dsn, logs, app=APP) as workers:
        workers.start()
        runs = [waiter(sql, "shared"), waiter(sql, "shared")]
        for run in runs:
            becomes(sql, run, "waiting", workers)
        assert signal(sql, "shared", '{"n": 1}') == 1
        first = wait_until(lambda: _one_completed(sql, runs), timeout=30)
        (other,) = [r for r in runs if r != first]
        assert state(sql, other)[0] == "waiting"
        assert signal(sql, "shared", '{"n": 2}') == 1
        assert becomes(sql, other, "completed", workers) == {"n": 2}
        assert state(sql, first) == ("completed", {"n": 1})
        assert workers.stop_all() == [0]


def _one_completed(sql: Conn, runs: list[Any]) -> Any:
    done = [r for r in runs if state(sql, r)[0] == "completed"]
    assert len(done) == 1, [state(sql, r) for r in runs]
    return done[0]


@pytest.mark.timeout(90)
def test_a_signal_nobody_waited_for_expires_after_the_retention(dsn: str, sql: Conn,
                                                               logs: Path) -> None:
    assert signal(sql, "stale", '{"old": true}') == 0
    env = {"NOTIFYQ_PURGER__SIGNAL_RETENTION_S": "1", "NOTIFYQ_PURGER__INTERVAL_S": "0.2"}
    with Workers(dsn, logs, app=APP, extra_env=env) as workers:
        workers.start()

        def expired() -> None:
            assert queued(sql, "stale") == [], workers.logs()
        wait_until(expired, timeout=30)
        run = waiter(sql, "stale")
        becomes(sql, run, "waiting", workers)
        wait_until(lambda: _still_waiting(sql, run), timeout=5)
        assert signal(sql, "stale", '{"new": true}') == 1
        assert becomes(sql, run, "completed", workers) == {"new": True}
        assert workers.stop_all() == [0]
