"""PgBouncer restarted twice under a drain (issue 31, item 7): two worker processes claim,
complete and heartbeat through a real PgBouncer in transaction mode, LISTEN straight to
PostgreSQL (docs/deploying.md), and the pool goes away under them, once by its immediate
shutdown (SIGTERM: every client and server connection cut, open transactions rolled back) and
once by SIGKILL. Nothing is lost and nothing runs twice, counted in SQL: the ledger (one row per
execution that reached the end, UNIQUE run id), ``ledger_replay`` (executions after a lost
write-back) and ``completion_log`` (a trigger on every transition to completed).

The ledger writes go straight to PostgreSQL (``FAULTS_LEDGER_DSN``): they count what notifyq
did, and must not fail with the pool under test."""

from __future__ import annotations

import signal
import time
from functools import partial
from typing import Any

import psycopg
import pytest

from tests.apps.faults import FAULTS_DDL
from tests.conftest import dsn_for
from tests.integration.pgbouncer import PgBouncer
from tests.support import (
    Workers,
    backends,
    check_exactly_once,
    enqueue_sql,
    scalar,
    status_counts,
    wait_until,
    worker_log_dir,
)

pytestmark = pytest.mark.chaos

RUNS = 3000


def _completed(sql: psycopg.Connection[Any]) -> int:
    return int(scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE status = 'completed'"))


def _at_least(sql: psycopg.Connection[Any], n: int) -> None:
    assert _completed(sql) >= n


@pytest.mark.timeout(180)
def test_pgbouncer_restarted_twice_under_a_drain_loses_nothing_and_runs_nothing_twice(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    sql.execute(FAULTS_DDL)
    with PgBouncer(dsn_for("postgres")) as bouncer, worker_log_dir() as logs, Workers(
            bouncer.dsn(dsn), logs, concurrency=10, extra_env={
                "NOTIFYQ_LISTEN_DATABASE_URL": dsn,
                "NOTIFYQ_DATABASE_TRANSACTION_POOLING": "true",
                "FAULTS_LEDGER_DSN": dsn,
                # longer than an outage, so a lease never expires while its write-back waits
                "NOTIFYQ_WORKER__LEASE_S": "10"}) as workers:
        try:
            for _ in range(2):
                workers.start()
            wait_until(lambda: _listening(sql, 2), timeout=20)
            # committed before the drain, straight to PostgreSQL: the truth to count against
            enqueue_sql(sql, "faults.record", RUNS)
            started = time.monotonic()
            outages = []
            for fraction, how in ((0.25, signal.SIGTERM), (0.6, signal.SIGKILL)):
                wait_until(partial(_at_least, sql, int(RUNS * fraction)), timeout=60,
                           interval=0.01)
                before = _completed(sql)
                cut = time.monotonic()
                bouncer.restart(how)
                outages.append((how.name, before, time.monotonic() - cut))
            wait_until(lambda: _drained(sql), timeout=90, interval=0.1)
            took = time.monotonic() - started
            for problem, n in sorted(workers.problems().items()):
                print(f"[pgbouncer restart] worker log: {n} x {problem}")
            print(f"[pgbouncer restart] {RUNS} runs drained in {took:.1f} s through PgBouncer "
                  + "; ".join(f"{name} after {done} completed, back in {gap:.2f} s"
                              for name, done, gap in outages))
            assert len(workers.alive) == 2, workers.logs()
            assert workers.stop_all() == [0, 0], workers.logs()
        except BaseException:
            print(workers.logs())
            print(bouncer.log()[-4000:])
            raise
    facts = check_exactly_once(sql, RUNS)
    assert facts == {"replays": 0}  # no handler ran twice: no write-back was lost for good
    assert status_counts(sql) == {"completed": RUNS}
    assert bouncer.starts == 3


def _listening(sql: psycopg.Connection[Any], n: int) -> None:
    assert len(backends(sql, "notifyq-listener")) == n


def _drained(sql: psycopg.Connection[Any]) -> None:
    assert status_counts(sql) == {"completed": RUNS}
