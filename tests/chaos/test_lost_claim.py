"""A claim lost in a crash: PostgreSQL killed (``stop -m immediate``) right after a claim.

Claims commit with ``synchronous_commit = off`` (``job_run_finish_and_claim``), so a crash can
lose a claim whose holder already has the rows and their fences. Fences are random 63-bit
tokens, so the re-claim after recovery draws a fence the lost claim's holder does not have: its
late write-backs and heartbeats match nothing. With ``fence + 1`` the re-claim would have
issued the lost claim's very fence, and the stale write would have landed.

Opt-in like ``test_pg_restart.py`` (it stops the shared server)::

    NOTIFYQ_CHAOS_RESTART=1 python3 -m pytest -q -p no:xdist -m chaos_restart

``NOTIFYQ_CHAOS_CRASH_CMD`` and ``NOTIFYQ_CHAOS_START_CMD`` override the two commands
(default: ``pg_ctlcluster --skip-systemctl-redirect <version> main stop -m immediate`` and
``... start``); the restart lock of ``test_pg_restart.py`` keeps the two from overlapping.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq._db.queries import queries_for
from tests.apps.faults import FAULTS_DDL
from tests.chaos.test_pg_restart import Db, restart_lock  # noqa: F401 - a fixture
from tests.support import (
    Workers,
    assert_drained,
    check_exactly_once,
    enqueue_sql,
    scalar,
    status_counts,
    wait_until,
    worker_log_dir,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.chaos_restart,
]

Q = queries_for("notifyq")
NO_WRITES: dict[str, Any] = {
    "ids": [], "fences": [], "statuses": [], "outputs": [], "errors": [], "run_ats": [],
    "refunds": [], "wait_kinds": [], "wait_tokens": [], "waiting_ons": []}


def _pg_ctl(action: str, env_name: str) -> list[str]:
    custom = os.environ.get(env_name)
    if custom:
        return shlex.split(custom)
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    extra = ["-m", "immediate"] if action == "stop" else []
    return ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, *extra]


def crash_and_start() -> None:
    """Kill the server without a checkpoint (un-flushed async commits are lost), start it."""
    subprocess.run(_pg_ctl("stop", "NOTIFYQ_CHAOS_CRASH_CMD"), check=True, capture_output=True,
                   timeout=60)
    subprocess.run(_pg_ctl("start", "NOTIFYQ_CHAOS_START_CMD"), check=True, capture_output=True,
                   timeout=60)


def _connect(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row, connect_timeout=2)


def _claim(conn: psycopg.Connection[dict[str, Any]], worker_id: str,
           limit: int) -> list[dict[str, Any]]:
    return conn.execute(Q.job_run_finish_and_claim, {
        **NO_WRITES, "now": None, "pool": "default", "limit": limit, "worker_id": worker_id,
        "lease_s": 30.0}).fetchall()


def _complete(conn: psycopg.Connection[dict[str, Any]], claims: list[dict[str, Any]],
              output: str) -> list[dict[str, Any]]:
    n = len(claims)
    return conn.execute(Q.job_run_finish_and_claim, {
        "now": None, "ids": [c["id"] for c in claims], "fences": [c["fence"] for c in claims],
        "statuses": ["completed"] * n, "outputs": [output] * n, "errors": [None] * n,
        "run_ats": [None] * n, "refunds": [0] * n, "wait_kinds": [None] * n,
        "wait_tokens": [None] * n, "waiting_ons": [None] * n, "pool": "default", "limit": 0,
        "worker_id": None, "lease_s": 0.0}).fetchall()


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("restart_lock")
def test_a_claim_lost_in_a_crash_never_lets_its_holder_write(dsn: str) -> None:
    total = 400
    with _connect(dsn) as conn:
        enqueue_sql(conn, "t.lost", total)
        lost_holder = _claim(conn, "w-lost", total)  # claim only: commits asynchronously
        crash_and_start()
    assert len(lost_holder) == total

    conn = wait_until(lambda: _connect(dsn), timeout=60, interval=0.2)
    with conn:
        fences = {c["id"]: c["fence"] for c in lost_holder}
        counts = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'running' AND leased_by = 'w-lost') AS kept, "
            "count(*) FILTER (WHERE status = 'pending' AND attempts = 0) AS lost "
            "FROM notifyq.job_run").fetchone()
        assert counts is not None
        assert counts["kept"] + counts["lost"] == total  # the claim survived whole or not at all
        print(f"[lost claim] {counts['lost']} of {total} claimed runs lost their claim in the "
              f"crash, {counts['kept']} kept it")
        # The survivors' lease ends (as if w-lost died); then another worker claims them all.
        conn.execute("UPDATE notifyq.job_run SET lease_expires_at = now() - interval '1 s' "
                     "WHERE status = 'running'")
        conn.execute(Q.job_run_reap_expired, {"now": None, "limit": total})
        fresh = _claim(conn, "w-new", total)
        assert len(fresh) == total
        assert all(c["fence"] != fences[c["id"]] for c in fresh)

        # The lost claim's holder finishes late: heartbeats and write-backs match nothing.
        beats = conn.execute(Q.job_run_heartbeat_many, {
            "now": None, "lease_s": 30.0, "ids": list(fences),
            "fences": list(fences.values())}).fetchall()
        assert beats == []
        assert _complete(conn, lost_holder, '"stale"') == []
        assert len(_complete(conn, fresh, '"fresh"')) == total

        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed') AS completed, "
            "count(*) FILTER (WHERE output = '\"stale\"') AS stale, "
            "count(*) FILTER (WHERE output = '\"fresh\"') AS fresh, "
            "count(*) FILTER (WHERE leased_by IS NOT NULL) AS leased "
            "FROM notifyq.job_run").fetchone()
    assert row == {"completed": total, "stale": 0, "fresh": total, "leased": 0}


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("restart_lock")
def test_workers_lose_nothing_and_complete_nothing_twice_when_postgres_crashes_mid_drain(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    sql.execute(FAULTS_DDL)
    total = 3000
    enqueue_sql(sql, "faults.record", total)
    db = Db(dsn)
    with worker_log_dir() as logs, Workers(dsn, logs) as workers:
        try:
            for _ in range(2):
                workers.start()

            def draining() -> None:
                assert db.check(lambda c: scalar(
                    c, "SELECT count(*) FROM notifyq.job_run WHERE status = 'completed'")) > 0

            wait_until(draining, timeout=30, interval=0.01)
            t0 = time.monotonic()
            crash_and_start()  # claims in flight, some only in the WAL buffers
            wait_until(lambda: db.check(lambda c: assert_drained(c, total)), timeout=90,
                       interval=0.2)
            print(f"[lost claim] drained {time.monotonic() - t0:.1f} s after the crash")
            assert workers.exit_codes == [], workers.logs()
            assert workers.stop_all() == [0, 0], workers.logs()
        except BaseException:
            print(workers.logs())
            raise
    replays = db.check(lambda c: check_exactly_once(c, total))["replays"]
    print(f"[lost claim] {replays} runs re-executed after the crash, each completed once")
    assert db.check(status_counts) == {"completed": total}
    db.close()
