"""Rate limits and fair claiming with real ``python -m notifyq worker`` processes: the limit
holds across workers (checked in SQL over every start), a rate-limited backlog does not hold up
the rest of the pool, and in a fair pool one tenant's run starts in the first claim while
another tenant's backlog of thousands drains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.apps.faults import FAULTS_DDL
from tests.support import Workers, check_exactly_once, scalar, wait_until

Conn = psycopg.Connection[Any]

# tests.apps.faults: faults.rated and faults.rated_by_account start at most 5 per 0.5 s.
LIMIT, PERIOD_S = 5, 0.5


@pytest.fixture
def db(sql: Conn) -> Conn:
    sql.execute(FAULTS_DDL)
    return sql


def _completed(db: Conn, where: str, n: int) -> None:
    done = scalar(db, f"SELECT count(*) FROM notifyq.job_run WHERE status = 'completed' "
                      f"AND {where}")
    assert done == n, (done, n)


def _busiest_window(db: Conn, where: str) -> int:
    """The most starts of the selected runs in any PERIOD_S-long interval (each run was started
    once: attempts is checked to be 1 by the caller, so claimed_at is its one start)."""
    return int(scalar(db, f"""
        WITH s AS (SELECT claimed_at AS at FROM notifyq.job_run WHERE {where})
        SELECT max((SELECT count(*) FROM s b
                    WHERE b.at >= a.at AND b.at < a.at + make_interval(secs => %s)))
        FROM s a""", (PERIOD_S,)))


@pytest.mark.timeout(120)
def test_a_rate_limit_holds_across_workers_and_does_not_hold_up_the_pool(
        dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs, concurrency=4) as workers:
        for _ in range(3):
            workers.start()
        workers.wait_registered()  # their definitions (with the limit) are stored
        db.execute("SELECT notifyq.enqueue('faults.rated', '{}') FROM generate_series(1, 30)")
        db.execute("SELECT notifyq.enqueue('faults.record', '{}') FROM generate_series(1, 30)")
        wait_until(lambda: _completed(db, "job_type = 'faults.record'", 30), timeout=30)
        # The plain runs, enqueued behind the whole rated backlog, are done while it still
        # drains at its pace.
        assert scalar(db, "SELECT count(*) FROM notifyq.job_run WHERE job_type = 'faults.rated' "
                          "AND status = 'pending'") > 0
        wait_until(lambda: _completed(db, "job_type = 'faults.rated'", 30), timeout=30)
        assert workers.stop_all() == [0, 0, 0]

    check_exactly_once(db, 60)
    assert scalar(db, "SELECT max(attempts) FROM notifyq.job_run") == 1
    rated = "job_type = 'faults.rated'"
    assert _busiest_window(db, rated) == LIMIT  # the limit, reached and never passed
    # 30 starts at 5 per 0.5 s: the last one at least 2.5 s after the first.
    span = scalar(db, f"SELECT extract(epoch FROM max(claimed_at) - min(claimed_at)) "
                      f"FROM notifyq.job_run WHERE {rated}")
    assert span >= (30 / LIMIT - 1) * PERIOD_S
    starters = scalar(db, "SELECT count(DISTINCT worker_pid) FROM ledger l "
                          "JOIN notifyq.job_run r ON r.id = l.run_id WHERE r.job_type = "
                          "'faults.rated'")
    assert starters >= 2  # the limit was shared by several workers, not one worker's pace


@pytest.mark.timeout(120)
def test_each_key_of_a_template_has_its_own_window(dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs, concurrency=8) as workers:
        workers.start()
        workers.start()
        workers.wait_registered()
        db.execute("SELECT notifyq.enqueue('faults.rated_by_account', "
                   "jsonb_build_object('account', a)) "
                   "FROM generate_series(1, 10), unnest(ARRAY['a', 'b']) AS a")
        wait_until(lambda: _completed(db, "job_type = 'faults.rated_by_account'", 20),
                   timeout=30)
        assert workers.stop_all() == [0, 0]

    check_exactly_once(db, 20)
    for account in ("a", "b"):
        assert _busiest_window(db, f"input->>'account' = '{account}'") == LIMIT
    # Both keys ran side by side: the busiest window of the two together saw both limits.
    assert _busiest_window(db, "job_type = 'faults.rated_by_account'") == 2 * LIMIT


@pytest.mark.timeout(180)
def test_in_a_fair_pool_a_tenant_starts_in_the_first_claim_past_a_backlog(
        dsn: str, db: Conn, logs: Path) -> None:
    backlog = 3000
    db.execute("SELECT notifyq.enqueue('faults.record', '{}', tenant_id => 'big') "
               "FROM generate_series(1, %s)", (backlog,))
    db.execute("SELECT notifyq.enqueue('faults.record', '{}', tenant_id => 'small')")
    concurrency = 4  # the first claim asks for concurrency + prefetch = 8 runs (before the
    # worker has measured anything, prefetch is the concurrency)
    with Workers(dsn, logs, concurrency=concurrency,
                 extra_env={"NOTIFYQ_WORKER__FAIR_POOLS": "default"}) as workers:
        workers.start()
        workers.start()
        wait_until(lambda: _completed(db, "TRUE", backlog + 1), timeout=120)
        assert workers.stop_all() == [0, 0]

    check_exactly_once(db, backlog + 1)
    small = "(SELECT claimed_at FROM notifyq.job_run WHERE tenant_id = 'small')"
    before = scalar(db, f"SELECT count(*) FROM notifyq.job_run "
                        f"WHERE tenant_id = 'big' AND claimed_at < {small}")
    # Its worker's first claim took it (at most the other worker's first batch went before).
    assert before <= 2 * concurrency, before
