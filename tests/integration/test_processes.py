"""Real ``python -m notifyq worker`` processes, killed and cut off from the database on purpose.

Every test proves its outcome in SQL (``tests.support.check_exactly_once``): each run
completed, exactly one ledger row per run (UNIQUE, written by the handler), exactly one
transition to ``completed`` per run (a trigger's log), nothing left ``running`` or leased.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
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
    assert_drained,
    backends,
    check_exactly_once,
    enqueue_sql,
    scalar,
    status_counts,
    terminate,
    wait_until,
)

Conn = psycopg.Connection[Any]


@pytest.fixture
def db(sql: Conn) -> Conn:
    sql.execute(FAULTS_DDL)
    return sql


def _running_by(conn: Conn, pid: int) -> int:
    return int(scalar(conn, "SELECT count(*) FROM notifyq.job_run WHERE status = 'running' "
                            "AND split_part(leased_by, ':', 2)::int = %s", (pid,)))


def _wait_listening(conn: Conn, n: int = 1, name: str = "notifyq-listener") -> list[int]:
    def check() -> list[int]:
        pids = [pid for pid, _ in backends(conn, name)]
        assert len(pids) == n, pids
        return pids
    return wait_until(check, timeout=20)


def _wait_handlers_registered(conn: Conn, job_type: str) -> None:
    wait_until(lambda: _assert(scalar(conn, "SELECT count(*) FROM notifyq.job WHERE type = %s",
                                      (job_type,)) == 1), timeout=20)


def _assert(cond: bool, msg: object = "") -> None:
    assert cond, msg


def _sized(rows: dict[int, dict[str, Any]], n: int) -> dict[int, dict[str, Any]]:
    assert len(rows) == n, rows
    return rows


@pytest.mark.timeout(120)
def test_four_workers_drain_5000_runs_exactly_once(dsn: str, db: Conn, logs: Path) -> None:
    total = 5000
    with Workers(dsn, logs, concurrency=8) as workers:
        for _ in range(4):
            workers.start()
        _wait_listening(db, 4)

        async def enqueue() -> None:
            async with App(dsn) as app:
                for _ in range(total // 1000):
                    await app.enqueue_many([{"job_type": "faults.record"}] * 1000)

        t0 = time.monotonic()
        anyio.run(enqueue)
        wait_until(lambda: assert_drained(db, total), timeout=90, interval=0.2)
        elapsed = time.monotonic() - t0
        print(f"4x8 workers drained {total} runs in {elapsed:.1f} s ({total / elapsed:.0f}/s)")
        assert workers.stop_all() == [0, 0, 0, 0], workers.logs()
    check_exactly_once(db, total)
    assert check_exactly_once(db, total)["replays"] == 0
    per_worker = db.execute("SELECT worker_pid, count(*) FROM ledger GROUP BY 1").fetchall()
    assert len(per_worker) == 4, per_worker  # every process took a share


@pytest.mark.timeout(90)
def test_sigkill_with_50_running_runs_they_are_reaped_and_completed_once(
        dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs) as workers:
        victim = workers.start(concurrency=64)
        _wait_handlers_registered(db, "faults.slow")
        ids = enqueue_sql(db, "faults.slow", 50, input='{"seconds": 3}')
        wait_until(lambda: _assert(_running_by(db, victim.pid) == 50, status_counts(db)),
                   timeout=20)

        workers.kill(victim)
        killed_at = time.monotonic()
        assert _running_by(db, victim.pid) == 50  # SIGKILL: the leases stay behind
        # With a 30 s poll, the survivor picks the reaped runs up this fast only because the
        # reaper NOTIFYs their pool.
        survivor = workers.start(concurrency=64,
                                 extra_env={"NOTIFYQ_WORKER__POLL_INTERVAL_S": "30"})

        def reaped() -> None:
            assert _running_by(db, victim.pid) == 0
        wait_until(reaped, timeout=20)
        reaped_after = time.monotonic() - killed_at
        wait_until(lambda: assert_drained(db, 50), timeout=30, interval=0.1)
        recovered = time.monotonic() - killed_at
        print(f"50 runs of a SIGKILLed worker reaped after {reaped_after:.1f} s, "
              f"all completed after {recovered:.1f} s")
        assert recovered < 15  # not the 27-33 s poll
        assert workers.stop_all() == [-9, 0], workers.logs()

    assert check_exactly_once(db, 50)["replays"] == 0
    rows = db.execute("SELECT attempts, count(*) FROM notifyq.job_run "
                      "WHERE id = ANY(%s) GROUP BY 1", (ids,)).fetchall()
    assert rows == [(2, 50)]  # claimed twice; only the second claim's write counted
    pids = db.execute("SELECT DISTINCT worker_pid FROM ledger").fetchall()
    assert pids == [(survivor.pid,)]


@pytest.mark.timeout(90)
def test_listener_killed_reconnects_and_wakeups_are_instant_again(
        dsn: str, db: Conn, logs: Path) -> None:
    # A 30 s poll: anything that completes within a few seconds was woken by a NOTIFY (or by
    # the listener's reconnect, which makes producers look at the table at once).
    with Workers(dsn, logs, extra_env={"NOTIFYQ_WORKER__POLL_INTERVAL_S": "30"}) as workers:
        workers.start()
        [listener] = _wait_listening(db)
        _wait_handlers_registered(db, "faults.record")

        def latency(n: int) -> float:
            done = scalar(db, "SELECT count(*) FROM notifyq.job_run")
            t0 = time.monotonic()
            enqueue_sql(db, "faults.record", n)
            wait_until(lambda: assert_drained(db, done + n), timeout=15, interval=0.01)
            return time.monotonic() - t0

        before = latency(1)
        assert terminate(db, "notifyq-listener") == 1
        cut_at = time.monotonic()
        enqueue_sql(db, "faults.record", 20)  # while the listener is down or reconnecting
        [new_listener] = _wait_listening(db)
        assert new_listener != listener
        wait_until(lambda: assert_drained(db, 21), timeout=15, interval=0.05)
        recovered = time.monotonic() - cut_at
        after = latency(1)
        print(f"wake-up latency before {before * 1000:.0f} ms, after reconnect "
              f"{after * 1000:.0f} ms; runs enqueued during the cut done after {recovered:.2f} s")
        assert after < 5.0  # the poll would take 27-33 s
        assert workers.stop_all() == [0], workers.logs()
    check_exactly_once(db, 22)


@pytest.fixture
def listen_role(dsn: str) -> Any:
    """A login role for the listener DSN only, so a test can lock the listener out (NOLOGIN)
    while the worker's pool keeps working."""
    role = f"nq_listen_{uuid.uuid4().hex[:8]}"
    admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield role
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_jobs_run_by_polling_while_the_listener_cannot_reconnect(
        dsn: str, db: Conn, logs: Path, listen_role: str) -> None:
    listen_dsn = psycopg.conninfo.make_conninfo(dsn, user=listen_role)
    env = {"NOTIFYQ_LISTEN_DATABASE_URL": listen_dsn, "NOTIFYQ_WORKER__POLL_INTERVAL_S": "0.5"}
    with Workers(dsn, logs, extra_env=env) as workers:
        workers.start()
        _wait_listening(db)
        db.execute(f"ALTER ROLE {listen_role} NOLOGIN")
        assert terminate(db, "notifyq-listener") == 1
        cut_at = time.monotonic()
        enqueue_sql(db, "faults.record", 30)
        wait_until(lambda: assert_drained(db, 30), timeout=15, interval=0.05)
        print(f"30 runs done by polling {time.monotonic() - cut_at:.2f} s after the listener "
              f"was cut off")
        assert backends(db, "notifyq-listener") == []  # it really was polling
        db.execute(f"ALTER ROLE {listen_role} LOGIN")
        _wait_listening(db)  # reconnects (backoff is at most 5 s)
        print(f"listener back after {time.monotonic() - cut_at:.2f} s")
        assert workers.stop_all() == [0], workers.logs()
    check_exactly_once(db, 30)


def test_poll_only_workers_complete_everything(dsn: str, db: Conn, logs: Path) -> None:
    env = {"NOTIFYQ_WORKER__LISTEN": "false"}
    with Workers(dsn, logs, extra_env=env) as workers:
        workers.start()
        workers.start()
        _wait_handlers_registered(db, "faults.record")
        enqueue_sql(db, "faults.record", 500)
        wait_until(lambda: assert_drained(db, 500), timeout=30, interval=0.1)
        assert backends(db, "notifyq-listener") == []
        assert len(backends(db, "notifyq")) >= 2  # the pools are there: the workers run
        assert workers.stop_all() == [0, 0], workers.logs()
    check_exactly_once(db, 500)


@pytest.mark.timeout(90)
def test_poison_job_is_dead_lettered_while_a_supervisor_restarts_workers(
        dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs, concurrency=4) as workers:
        workers.start()
        workers.start()
        _wait_handlers_registered(db, "faults.poison")
        [poison] = enqueue_sql(db, "faults.poison", 1, max_attempts=3)
        normal = enqueue_sql(db, "faults.record", 5)

        def supervised() -> None:
            workers.replace_dead()  # the supervisor: restart what crashed
            status = scalar(db, "SELECT status FROM notifyq.job_run WHERE id = %s", (poison,))
            done = scalar(db, "SELECT count(*) FROM notifyq.job_run WHERE id = ANY(%s) "
                              "AND status = 'completed'", (normal,))
            assert (status, done) == ("failed", 5), (status, done, workers.exit_codes)
        wait_until(supervised, timeout=60, interval=0.1)
        workers.replace_dead()
        assert workers.exit_codes == [1, 1, 1]  # one crash per attempt, then dead-lettered
        assert workers.stop_all() == [0, 0], workers.logs()

    row = db.execute("SELECT status, attempts, error->>'type', leased_by FROM notifyq.job_run "
                     "WHERE id = %s", (poison,)).fetchone()
    assert row == ("failed", 3, "LeaseExpired", None)
    check_exactly_once(db, 5, job_types=("faults.record",))


@pytest.mark.timeout(90)
def test_hanging_handlers_time_out_and_the_worker_keeps_going(
        dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs, concurrency=4) as workers:
        workers.start()
        _wait_handlers_registered(db, "faults.hang_sync")
        hung = [*enqueue_sql(db, "faults.hang"), *enqueue_sql(db, "faults.hang_sync")]
        enqueue_sql(db, "faults.record", 50)

        def timed_out() -> None:
            rows = db.execute("SELECT status, attempts FROM notifyq.job_run WHERE id = ANY(%s)",
                              (hung,)).fetchall()
            assert rows == [("timed_out", 2)] * 2, rows
        wait_until(timed_out, timeout=20)
        # Two abandoned threads still block forever; the worker goes on regardless.
        enqueue_sql(db, "faults.record", 50)
        wait_until(lambda: _assert(status_counts(db).get("completed") == 100, status_counts(db)),
                   timeout=20)
        assert workers.stop_all() == [0], workers.logs()  # and still shuts down cleanly
    check_exactly_once(db, 100, job_types=("faults.record",))
    errors = db.execute("SELECT DISTINCT error->>'type' FROM notifyq.job_run WHERE id = ANY(%s)",
                        (hung,)).fetchall()
    assert errors == [("TimeoutError",)]


@pytest.mark.timeout(60)
def test_sigterm_releases_running_runs_and_another_worker_finishes_them(
        dsn: str, db: Conn, logs: Path) -> None:
    env = {"NOTIFYQ_WORKER__SHUTDOWN_GRACE_S": "0.5"}
    with Workers(dsn, logs, extra_env=env) as workers:
        leaving = workers.start(concurrency=20)
        _wait_handlers_registered(db, "faults.slow")
        ids = enqueue_sql(db, "faults.slow", 20, input='{"seconds": 30}')
        wait_until(lambda: _assert(_running_by(db, leaving.pid) == 20, status_counts(db)),
                   timeout=20)
        t0 = time.monotonic()
        leaving.terminate()
        assert leaving.wait(15) == 0
        print(f"SIGTERM with 20 running handlers: exited after {time.monotonic() - t0:.2f} s")
        # Released at once, not left to expire: pending again, the attempt given back.
        rows = db.execute("SELECT status, attempts, leased_by FROM notifyq.job_run "
                          "WHERE id = ANY(%s)", (ids,)).fetchall()
        assert rows == [("pending", 0, None)] * 20
        db.execute("UPDATE notifyq.job_run SET input = '{\"seconds\": 0.1}' WHERE id = ANY(%s)",
                   (ids,))
        workers.start(concurrency=20)
        wait_until(lambda: assert_drained(db, 20), timeout=20)
        assert workers.stop_all() == [0, 0], workers.logs()
    check_exactly_once(db, 20)
    assert db.execute("SELECT DISTINCT attempts FROM notifyq.job_run").fetchall() == [(1,)]


def test_a_second_sigterm_during_shutdown_does_not_abandon_running_runs(
        dsn: str, db: Conn, logs: Path) -> None:
    env = {"NOTIFYQ_WORKER__SHUTDOWN_GRACE_S": "1.5"}
    with Workers(dsn, logs, extra_env=env) as workers:
        leaving = workers.start(concurrency=5)
        _wait_handlers_registered(db, "faults.slow")
        ids = enqueue_sql(db, "faults.slow", 5, input='{"seconds": 30}')
        wait_until(lambda: _assert(_running_by(db, leaving.pid) == 5), timeout=20)
        leaving.terminate()
        # A loaded CI machine took more than 10 s to log it.
        wait_until(lambda: _assert("waiting up to" in workers.logs()), timeout=30)
        leaving.terminate()  # an impatient operator: the second one must not kill it
        assert leaving.wait(15) == 0, workers.logs()
        rows = db.execute("SELECT status, attempts, leased_by FROM notifyq.job_run "
                          "WHERE id = ANY(%s)", (ids,)).fetchall()
        assert rows == [("pending", 0, None)] * 5
        assert "still shutting down" in workers.logs()


@pytest.mark.timeout(90)
def test_sigterm_while_the_database_is_unreachable_exits_in_bounded_time(
        dsn: str, db: Conn, logs: Path) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    env = {"NOTIFYQ_WORKER__SHUTDOWN_GRACE_S": "0.5"}
    with Workers(dsn, logs, extra_env=env) as workers:
        stuck = workers.start(concurrency=10)
        _wait_handlers_registered(db, "faults.slow")
        ids = enqueue_sql(db, "faults.slow", 10, input='{"seconds": 30}')
        wait_until(lambda: _assert(_running_by(db, stuck.pid) == 10), timeout=20)
        admin = psycopg.connect(psycopg.conninfo.make_conninfo(dsn, dbname="postgres"),
                                autocommit=True)
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        try:
            terminate(db, "notifyq%")
            t0 = time.monotonic()
            stuck.terminate()
            try:
                code: int | None = stuck.wait(30)  # grace 0.5 s + write deadline 15 s + margin
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - t0
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            admin.close()
        print(f"SIGTERM with the database unreachable: exited {code} after {took:.1f} s")
        assert code == 0, workers.logs()
        # Its runs could not be released: their leases expire and another worker takes over.
        db.execute("UPDATE notifyq.job_run SET input = '{\"seconds\": 0.1}' WHERE id = ANY(%s)",
                   (ids,))
        workers.start(concurrency=10)
        wait_until(lambda: assert_drained(db, 10), timeout=30)
        assert workers.stop_all() == [code, 0], workers.logs()
    check_exactly_once(db, 10)


@pytest.mark.timeout(60)
def test_a_frozen_listener_backend_is_detected_and_replaced(
        dsn: str, db: Conn, logs: Path) -> None:
    """A listener whose server side stops answering (a half-open connection: failover, NAT
    timeout; here the backend is SIGSTOPped) must be noticed by the listener's ping and
    replaced, or wake-ups stop for good and only the poll is left."""
    with Workers(dsn, logs, extra_env={"NOTIFYQ_WORKER__POLL_INTERVAL_S": "30"}) as workers:
        workers.start()
        [frozen] = _wait_listening(db)
        _wait_handlers_registered(db, "faults.record")
        os.kill(frozen, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            def replaced() -> None:
                pids = [pid for pid, _ in backends(db, "notifyq-listener")]
                assert any(pid != frozen for pid in pids), pids
            wait_until(replaced, timeout=30, interval=0.1)
            replaced_after = time.monotonic() - t0
        finally:
            os.kill(frozen, signal.SIGCONT)
        t1 = time.monotonic()
        enqueue_sql(db, "faults.record", 1)
        wait_until(lambda: assert_drained(db, 1), timeout=10, interval=0.01)
        print(f"frozen listener replaced after {replaced_after:.1f} s; next wake-up "
              f"{(time.monotonic() - t1) * 1000:.0f} ms")
        assert workers.stop_all() == [0], workers.logs()
    check_exactly_once(db, 1)


@pytest.mark.timeout(60)
def test_the_worker_registry_follows_starts_clean_stops_and_crashes(dsn: str, db: Conn,
                                                                    logs: Path) -> None:
    def registered() -> dict[int, dict[str, Any]]:
        with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
            return {r["pid"]: r for r in cur.execute("SELECT * FROM notifyq.worker")}

    with Workers(dsn, logs, concurrency=3) as workers:
        crashed, stopped, kept = (workers.start(concurrency=c) for c in (3, 4, 5))
        rows = wait_until(lambda: _sized(registered(), 3), timeout=20)
        assert {pid: (r["concurrency"], r["pools"]) for pid, r in rows.items()} == {
            crashed.pid: (3, ["default"]), stopped.pid: (4, ["default"]),
            kept.pid: (5, ["default"])}
        first_beat = rows[kept.pid]["heartbeat_at"]
        listed = json.loads(ok(dsn, "workers", "--json"))["items"]
        assert sorted(w["pid"] for w in listed) == sorted(rows)
        text = ok(dsn, "workers")
        assert f":{kept.pid}:" in text
        assert "0/5" in text

        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(15) == 0
        assert stopped.pid not in registered()  # a clean stop leaves at once

        workers.kill(crashed)  # no shutdown code: only the reaper can tell
        assert crashed.pid in registered()
        wait_until(lambda: _assert(crashed.pid not in registered()), timeout=20)
        kept_row = registered()[kept.pid]
        assert kept_row["heartbeat_at"] > first_beat  # renewed all along, so never reaped
