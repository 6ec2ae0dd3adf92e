"""PostgreSQL restarted under load, twice, with real worker processes.

Restarting the server breaks every other test running against it, so this module is opt-in
(``NOTIFYQ_CHAOS_RESTART=1``) and CI runs it in its own pytest invocation, after the main one::

    NOTIFYQ_CHAOS_RESTART=1 python3 -m pytest -q -p no:xdist -m chaos_restart

The restart command defaults to ``pg_ctlcluster --skip-systemctl-redirect <version> main restart``
(fast shutdown: every connection is cut, open transactions roll back); set
``NOTIFYQ_CHAOS_RESTART_CMD`` to restart another cluster, e.g. a private one on another port
named by ``NOTIFYQ_TEST_ADMIN_DSN``. An exclusive ``flock`` on /tmp/notifyq-pg-restart.lock keeps
two restart tests from overlapping.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq._db.queries import Queries
from tests.apps.faults import FAULTS_DDL
from tests.conftest import ADMIN_DSN
from tests.db.helpers import claim, enqueue, finish
from tests.support import (
    Load,
    Workers,
    assert_drained,
    backends,
    check_exactly_once,
    scalar,
    status_counts,
    wait_until,
    worker_log_dir,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.chaos_restart,
]

LOCK = Path("/tmp/notifyq-pg-restart.lock")  # noqa: S108 - a fixed name other runs agree on


def _restart_cmd() -> list[str]:
    custom = os.environ.get("NOTIFYQ_CHAOS_RESTART_CMD")
    if custom:
        return shlex.split(custom)
    versions = sorted(os.listdir("/etc/postgresql"))
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "restart"]


@pytest.fixture
def restart_lock() -> Iterator[None]:
    with LOCK.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Db:
    """Assertions in SQL over a connection that is reopened after the server restarts."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def __call__(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
        return self._conn

    def check(self, fn: Any) -> Any:
        """Run ``fn(conn)``; a connection error becomes an AssertionError (retry later)."""
        try:
            return fn(self())
        except psycopg.OperationalError as exc:
            self._conn = None
            raise AssertionError(f"database unavailable: {exc}") from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _ready(conn: psycopg.Connection[Any], n: int) -> None:
    assert len(backends(conn, "notifyq-listener")) == n


@pytest.mark.timeout(120)
def test_postgres_restarted_twice_under_load(dsn: str, sql: psycopg.Connection[Any],
                                             restart_lock: None) -> None:
    sql.execute(FAULTS_DDL)
    db = Db(dsn)
    load = Load(dsn, "faults.slow", input='{"seconds": 0.3}', batch=6, every_s=0.1)
    with worker_log_dir() as logs, Workers(dsn, logs) as workers, load:
        try:
            for _ in range(4):
                workers.start()
            wait_until(lambda: db.check(lambda c: _ready(c, 4)), timeout=20)
            load.start()
            outages = []
            for _ in range(2):
                time.sleep(3.0)  # the fault schedule: load runs, then the server goes away
                t0 = time.monotonic()
                subprocess.run(_restart_cmd(), check=True, capture_output=True, timeout=60)
                restarted = last_fault = time.monotonic()
                wait_until(lambda: db.check(lambda c: _ready(c, 4)), timeout=20)
                outages.append((restarted - t0, time.monotonic() - restarted))
            time.sleep(2.0)  # more load after the last restart
            load.stop()

            total = int(db.check(lambda c: scalar(c, "SELECT count(*) FROM notifyq.job_run")))
            assert load.committed <= total <= load.committed + load.uncertain
            wait_until(lambda: db.check(lambda c: assert_drained(c, total)), timeout=45,
                       interval=0.1)
            drained = time.monotonic() - last_fault
            for problem, n in sorted(workers.problems().items()):
                print(f"[pg restart] worker log: {n} x {problem}")
            print(f"[pg restart] {total} runs ({load.uncertain} uncertain enqueues); restarts "
                  f"took {', '.join(f'{a:.1f}' for a, _ in outages)} s; listeners back "
                  f"{', '.join(f'{b:.2f}' for _, b in outages)} s after; drained "
                  f"{drained:.2f} s after the last restart (load ran for 2 s of that)")
            assert len(workers.alive) == 4, workers.logs()
            assert workers.exit_codes == [], workers.logs()
            assert workers.stop_all() == [0] * 4, workers.logs()
        except BaseException:
            print(workers.logs())
            raise
    replays = db.check(lambda c: check_exactly_once(c, total))["replays"]
    print(f"[pg restart] {replays} runs re-executed (their write-back was cut by the restart)")
    status = db.check(status_counts)
    assert status == {"completed": total}
    db.close()


def _crash_cmd() -> list[str]:
    """Restart without a shutdown checkpoint: what is not flushed to WAL is gone, as in a
    power cut (``NOTIFYQ_CHAOS_CRASH_CMD`` for another cluster)."""
    custom = os.environ.get("NOTIFYQ_CHAOS_CRASH_CMD")
    if custom:
        return shlex.split(custom)
    return [*_restart_cmd(), "-m", "immediate"]


def _state_after_restart(db: Db, run_id: Any) -> Any:
    look = "SELECT status, fence, attempts FROM notifyq.job_run WHERE id = %s"
    return wait_until(lambda: db.check(lambda c: c.execute(look, [run_id]).fetchone()),
                      timeout=30)


@pytest.mark.timeout(180)
def test_a_claim_lost_in_a_crash_never_matches_the_next_one(dsn: str,
                                                           restart_lock: None) -> None:
    """An idle worker's claim commits asynchronously. A crash right after it loses the claim
    (the run is pending again under its old fence) while the worker that got it may still be
    running the handler; the next claim must hand out a fence that worker's write-back can
    never match. With `fence = previous + 1` both claims got the same fence and the lost
    claim's write was accepted over the new holder's."""
    q = Queries("notifyq")
    db = Db(dsn)
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        # The WAL writer flushes asynchronous commits every wal_writer_delay: at its longest,
        # a crash half a second after the claim finds it unflushed.
        admin.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        admin.execute("SELECT pg_reload_conf()")
    try:
        lost = None
        for _ in range(5):
            conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
            run = enqueue(conn, q)  # committed synchronously: survives the crash
            [first] = claim(conn, q, None)  # now=None: the database's
            assert first["id"] == run["id"]
            conn.close()
            subprocess.run(_crash_cmd(), check=True, capture_output=True, timeout=60)
            after = _state_after_restart(db, run["id"])
            if after == ("pending", run["fence"], 0):
                lost = run, first
                break
            assert after == ("running", first["fence"], 1)  # flushed in time: try again
        assert lost is not None, "no claim was lost in 5 crashes: nothing was tested"
        run, first = lost
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            [second] = claim(conn, q, None, worker_id="w2")
            assert second["id"] == run["id"]
            assert second["fence"] != first["fence"]
            # The lost claim's holder finishes its handler and writes back: fenced out.
            stale = [(run["id"], first["fence"], "completed")]
            assert finish(conn, q, None, stale, output='{"by": "lost claim"}') == []
            done = finish(conn, q, None, [(run["id"], second["fence"], "completed")],
                          output='{"by": "w2"}')
            assert [r["status"] for r in done] == ["completed"]
            row = conn.execute("SELECT status, output, attempts FROM notifyq.job_run "
                               "WHERE id = %s", [run["id"]]).fetchone()
        assert row == {"status": "completed", "output": {"by": "w2"}, "attempts": 1}
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET wal_writer_delay")
            admin.execute("SELECT pg_reload_conf()")
        db.close()
