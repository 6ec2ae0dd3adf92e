"""Another transaction holds a row lock on running runs (issue 31, item 1), with a real worker
process draining a backlog.

A lock on a job_run row is an ordinary thing for an application to take: ``SELECT ... FOR
UPDATE`` on a run it reads, or ``app.cancel(run, conn=txn)`` inside a long business transaction.
It must delay that run only. Before, the worker's heartbeat and its batched write-back both
waited on the locked row (holding the locks they had taken on every other running run
meanwhile; the claim riding with a write-back waited too): the worker completed 0 runs/s while
the lock was held (191-198/s otherwise), leases ran out behind it, and runs were executed twice.

The probe: two slow runs of the worker's are locked for 30 s with ``lease_s=10`` while it drains
8,000 runs of 50 ms. One finishes while locked (its write-back meets the lock), the other is
still running when the lock goes (its heartbeats meet the lock, three leases' worth). On the code
before the fix: 107-111 completions/s, then 0/s from the first write-back that met the lock to
the end of the hold, and the still-running run reaped again and again. Completions are counted
in SQL per second of the hold (``completion_log``), and executions of one run beyond the first
in ``ledger_replay`` (the handlers write a ledger row with a unique run id).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.apps.faults import FAULTS_DDL
from tests.support import (
    Workers,
    assert_drained,
    check_exactly_once,
    enqueue_sql,
    scalar,
    wait_until,
)

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.chaos

HOLD_S = 30.0
LEASE_S = 10.0
BACKLOG = 8000  # 50 ms each at concurrency 8: ~160 runs/s, some 50 s of work


@pytest.mark.timeout(180)
def test_a_row_lock_held_30_s_on_running_runs_delays_only_those_runs(
        dsn: str, sql: Conn, logs: Path) -> None:
    sql.execute(FAULTS_DDL)
    # A backlog, then the two runs to lock, first in line (priority -1) though their ids are
    # the newest: the heartbeat, which locks its runs in id order, comes to them after every
    # other run the worker holds. No enqueue wakes the worker during the hold, as in a drain.
    enqueue_sql(sql, "faults.slow", BACKLOG, input='{"seconds": 0.05}')
    done_in_lock, still_running = [
        scalar(sql, "SELECT notifyq.enqueue('faults.slow', %s::jsonb, priority => -1)",
               (f'{{"seconds": {s}}}',)) for s in (5.0, HOLD_S + 3)]
    # The reaper looks every 0.3 s: a lease that runs out is taken over at once.
    env = {"NOTIFYQ_WORKER__LEASE_S": str(LEASE_S)}
    with Workers(dsn, logs, extra_env=env) as workers:
        workers.start()
        wait_until(lambda: _running(sql, [done_in_lock, still_running]), timeout=20)
        held_from, held_until = _hold_row_locks(dsn, [done_in_lock, still_running], HOLD_S)
        per_second = _completions_per_second(sql, held_from, held_until)
        print(f"[row lock {HOLD_S:.0f} s, lease {LEASE_S:.0f} s] completions/s while held: "
              f"{per_second}")
        # Each second of the hold (the first and last left out) the worker went on completing
        # runs: at least an eighth of the ~160/s it drains, where it completed none before.
        assert len(per_second) >= HOLD_S - 3, per_second
        assert min(per_second) >= 20, per_second
        total = BACKLOG + 2
        try:
            wait_until(lambda: assert_drained(sql, total), timeout=90, interval=0.2)
        except AssertionError:
            print(workers.logs())
            raise
        replays = int(scalar(sql, "SELECT count(*) FROM ledger_replay"))
        print(f"[row lock {HOLD_S:.0f} s] runs executed twice: {replays}; worker problems "
              f"{workers.problems()}")
        assert workers.stop_all() == [0], workers.logs()
    check_exactly_once(sql, total)
    assert replays == 0
    # The locked runs ran once, on their first claim: neither lease was taken over.
    attempts = sql.execute("SELECT attempts, error FROM notifyq.job_run WHERE id = ANY(%s)",
                           ([done_in_lock, still_running],)).fetchall()
    assert attempts == [(1, None), (1, None)]


def _running(conn: Conn, ids: list[Any]) -> None:
    rows = conn.execute("SELECT count(*) FROM notifyq.job_run WHERE id = ANY(%s) "
                        "AND status = 'running'", (ids,)).fetchone()
    assert rows is not None
    assert rows[0] == len(ids)


def _hold_row_locks(dsn: str, run_ids: list[Any], hold_s: float) -> tuple[Any, Any]:
    """Lock the runs' rows in a transaction of another client for ``hold_s``; returns the
    database times the locks were taken and released."""
    with psycopg.connect(dsn, application_name="nq-test-row-lock") as locker:
        locked = scalar(locker, "SELECT count(*) FROM (SELECT FROM notifyq.job_run "
                                "WHERE id = ANY(%s) FOR UPDATE) AS l", (run_ids,))
        assert locked == len(run_ids)
        taken = scalar(locker, "SELECT clock_timestamp()")
        time.sleep(hold_s)  # the fault: a business transaction that takes its time
        released = scalar(locker, "SELECT clock_timestamp()")
        locker.rollback()
    return taken, released


def _completions_per_second(conn: Conn, start: Any, end: Any) -> list[int]:
    """Runs completed in each whole second between ``start`` + 1 s and ``end`` - 1 s."""
    rows = conn.execute("""
        SELECT s, count(c.run_id)
        FROM generate_series(1, floor(extract(epoch FROM %(end)s - %(start)s))::int - 2) AS s
        LEFT JOIN completion_log c
               ON c.at >= %(start)s + make_interval(secs => s)
              AND c.at < %(start)s + make_interval(secs => s + 1)
        GROUP BY s ORDER BY s""", {"start": start, "end": end}).fetchall()
    return [int(n) for _, n in rows]
