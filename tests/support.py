"""Helpers for tests: wait for a condition instead of sleeping; run worker processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psycopg

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]


async def eventually(check: Callable[[], Awaitable[T]], *, timeout: float = 10.0,  # noqa: ASYNC109
                     interval: float = 0.02) -> T:
    """Retry ``check`` (an async callable that raises AssertionError) until it passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await anyio.sleep(interval)


def wait_until(check: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05) -> T:
    """Synchronous ``eventually`` for tests that drive processes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(interval)


def spawn_worker(dsn: str, app: str = "tests.apps.ledger:app", *, concurrency: int = 8,
                 extra_env: dict[str, str] | None = None, args: list[str] | None = None,
                 ) -> subprocess.Popen[bytes]:
    """Start ``python -m notifyq worker`` as a real process against ``dsn``."""
    env = {
        **os.environ,
        "NOTIFYQ_DATABASE_URL": dsn,
        "NOTIFYQ_ENV": "test",
        "NOTIFYQ_WORKER__POLL_INTERVAL_S": "0.2",
        "NOTIFYQ_WORKER__LEASE_S": "2",
        "NOTIFYQ_WORKER__SHUTDOWN_GRACE_S": "2",
        "NOTIFYQ_REAPER__INTERVAL_S": "0.3",
        "NOTIFYQ_LEADER__TTL_S": "1",
        "PYTHONPATH": str(ROOT),
        **(extra_env or {}),
    }
    cmd = [sys.executable, "-m", "notifyq", "worker", "--app", app,
           "--concurrency", str(concurrency), *(args or [])]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen[Any], timeout: float = 15.0) -> int:
    """SIGTERM (once), wait, SIGKILL past the timeout; closes the process's pipes."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


# -- process fleets and SQL checks for the process / chaos tests ----------------------------------

FAULTS_APP = "tests.apps.faults:app"


class Workers:
    """A fleet of ``python -m notifyq worker`` processes whose stderr goes to files (a pipe
    nobody reads would block a chatty worker). Use as a context manager: every process still
    alive at exit is killed."""

    def __init__(self, dsn: str, log_dir: Path, *, app: str = FAULTS_APP, concurrency: int = 8,
                 extra_env: dict[str, str] | None = None) -> None:
        self.dsn = dsn
        self.app = app
        self.concurrency = concurrency
        self.extra_env = {"NOTIFYQ_POOL_MAX_SIZE": "4", **(extra_env or {})}
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.kills = 0
        self.exit_codes: list[int] = []

    def start(self, *, concurrency: int | None = None,
              extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "NOTIFYQ_DATABASE_URL": self.dsn,
            "NOTIFYQ_ENV": "test",
            "NOTIFYQ_WORKER__POLL_INTERVAL_S": "0.2",
            "NOTIFYQ_WORKER__LEASE_S": "2",
            "NOTIFYQ_WORKER__SHUTDOWN_GRACE_S": "2",
            "NOTIFYQ_REAPER__INTERVAL_S": "0.3",
            "NOTIFYQ_LEADER__TTL_S": "1",
            "PYTHONPATH": str(ROOT),
            **self.extra_env,
            **(extra_env or {}),
        }
        cmd = [sys.executable, "-m", "notifyq", "worker", "--app", self.app,
               "--concurrency", str(concurrency or self.concurrency)]
        self.started += 1
        with (self.log_dir / f"worker-{self.started}.log").open("wb") as log:
            proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=log)
        self.procs.append(proc)
        return proc

    @property
    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL: no shutdown code runs, leases stay behind."""
        proc.kill()
        proc.wait(10)
        self.kills += 1

    def stop_one(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM one worker (after every live one has its handler in place, see
        :meth:`stop_all`) and wait for its graceful exit; it leaves the fleet."""
        self.wait_registered()
        code = stop(proc)
        self.procs.remove(proc)
        return code

    def replace_dead(self) -> int:
        """Start one process for every one that exited; returns how many."""
        dead = [p for p in self.procs if p.poll() is not None]
        for proc in dead:
            self.procs.remove(proc)
            self.exit_codes.append(proc.returncode)
            self.start()
        return len(dead)

    def stop_all(self) -> list[int | None]:
        """SIGTERM everything, then wait (SIGKILL after 15 s); returns the exit codes. A worker
        still importing has no SIGTERM handler yet and would die of the signal (-15): first wait
        (up to 20 s) until every live one has recorded itself in the worker registry, which it
        does after its handler is in place."""
        self.wait_registered()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()  # once: a second SIGTERM would kill it mid-shutdown
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(15))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes

    def wait_registered(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                alive = {p.pid for p in self.alive}
                rows = conn.execute("SELECT pid FROM notifyq.worker").fetchall()
                if alive <= {pid for (pid,) in rows}:
                    return
                time.sleep(0.05)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def logs(self, tail: int = 4000) -> str:
        out = []
        for path in sorted(self.log_dir.glob("worker-*.log")):
            text = path.read_text(errors="replace")
            out.append(f"--- {path.name}\n{text[-tail:]}")
        return "\n".join(out)

    def problems(self) -> dict[str, int]:
        """WARNING/ERROR/CRITICAL log lines and tracebacks of all processes, counted by logger
        and message (run ids and numbers blanked out)."""
        import re

        counts: dict[str, int] = {}
        for path in sorted(self.log_dir.glob("worker-*.log")):
            for line in path.read_text(errors="replace").splitlines():
                m = re.match(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) (.*)$", line)
                key = m.group(1) + " " + m.group(2) if m else (
                    "Traceback" if line.startswith("Traceback") else None)
                if key:
                    key = re.sub(r"0x[0-9a-f]+|[0-9a-f]{8}-[0-9a-f-]{27}|\d+(\.\d+)?", "#",
                                 key)[:160]
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()


def pid_of(worker_id: str) -> int:
    """``host:pid:token`` -> pid."""
    return int(worker_id.split(":")[-2])


def scalar(conn: Any, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def status_counts(conn: Any) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM notifyq.job_run GROUP BY status")
    return dict(rows.fetchall())


def assert_drained(conn: Any, total: int) -> None:
    """``wait_until`` check: all ``total`` runs completed."""
    counts = status_counts(conn)
    assert counts == {"completed": total}, counts


def check_exactly_once(conn: Any, total: int, *, job_types: tuple[str, ...] | None = None,
                       ) -> dict[str, int]:
    """Every run of ``job_types`` (default: all) completed exactly once, proven in SQL:

    * every run is ``completed`` and none is left ``running`` or leased;
    * ``ledger`` (UNIQUE run id, written by the handler) has exactly one row per run;
    * ``completion_log`` (a trigger on the transition to completed) has one row per run: a run
      never completed twice, and the completing write carried the run's final fence.

    Returns the number of replays (executions after a lost write-back) for reporting.
    """
    where = "TRUE" if job_types is None else "job_type = ANY(%(types)s)"
    params = {"types": list(job_types or ())}
    q = f"""
        WITH r AS (SELECT * FROM notifyq.job_run WHERE {where})
        SELECT (SELECT count(*) FROM r),
               (SELECT count(*) FROM r WHERE status = 'completed'),
               (SELECT count(*) FROM r WHERE status = 'running'),
               (SELECT count(*) FROM r WHERE leased_by IS NOT NULL OR lease_expires_at IS NOT NULL),
               (SELECT count(*) FROM ledger l JOIN r ON r.id = l.run_id),
               (SELECT count(*) FROM ledger l WHERE NOT EXISTS (SELECT 1 FROM notifyq.job_run j
                                                              WHERE j.id = l.run_id)),
               (SELECT count(*) FROM completion_log c JOIN r ON r.id = c.run_id),
               (SELECT count(DISTINCT c.run_id) FROM completion_log c JOIN r ON r.id = c.run_id),
               (SELECT count(*) FROM completion_log c JOIN r ON r.id = c.run_id
                WHERE c.fence <> r.fence OR c.attempts <> r.attempts),
               (SELECT count(*) FROM ledger_replay p JOIN r ON r.id = p.run_id),
               (SELECT count(*) FROM ledger_replay p JOIN r ON r.id = p.run_id
                WHERE p.attempt < 2)
    """
    row = conn.execute(q, params).fetchone()
    (runs, completed, running, leased, ledger_rows, stray, completions, distinct_completions,
     stale_completions, replays, bad_replays) = row
    facts = {"runs": runs, "completed": completed, "running": running, "leased": leased,
             "ledger": ledger_rows, "stray_ledger": stray, "completions": completions,
             "distinct_completions": distinct_completions,
             "stale_completions": stale_completions, "replays": replays,
             "first_attempt_replays": bad_replays}
    expected = {**facts, "runs": total, "completed": total, "running": 0, "leased": 0,
                "ledger": total, "stray_ledger": 0, "completions": total,
                "distinct_completions": total, "stale_completions": 0,
                "first_attempt_replays": 0}
    assert facts == expected, facts
    return {"replays": replays}


def backends(conn: Any, application_name: str = "notifyq%") -> list[tuple[int, str]]:
    """(pid, application_name) of this database's client backends named like the pattern."""
    rows = conn.execute(
        "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE %s AND pid <> pg_backend_pid()", (application_name,))
    return [(pid, name) for pid, name in rows.fetchall()]


def terminate(conn: Any, application_name: str = "notifyq%") -> int:
    """pg_terminate_backend every matching backend of this database; returns how many."""
    rows = conn.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE %s "
        "AND pid <> pg_backend_pid()", (application_name,))
    return int(rows.fetchone()[0])


def enqueue_sql(conn: Any, job_type: str, n: int = 1, *, input: str = "{}",
                max_attempts: int | None = None) -> list[Any]:
    """Enqueue ``n`` runs in one transaction through the SQL entry point (one NOTIFY)."""
    rows = conn.execute(
        "SELECT notifyq.enqueue(%s, %s::jsonb, max_attempts => %s) "
        "FROM generate_series(1, %s)", (job_type, input, max_attempts, n))
    return [r[0] for r in rows.fetchall()]


class Load:
    """A steady enqueue load from a thread: ``batch`` runs of ``job_type`` every ``every_s``,
    through its own connection (application_name ``nq-test-load``, so the notifyq fault
    injections leave it alone), reconnecting after errors.

    An enqueue that failed may or may not have committed (the connection died around the
    commit): those are counted in ``uncertain``; the truth is the table afterwards.
    """

    def __init__(self, dsn: str, job_type: str = "faults.record", *, batch: int = 20,
                 every_s: float = 0.1, input: str = "{}") -> None:
        self.dsn = dsn
        self.job_type = job_type
        self.input = input
        self.batch = batch
        self.every_s = every_s
        self.committed = 0
        self.uncertain = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        import psycopg

        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2,
                                           application_name="nq-test-load")
                enqueue_sql(conn, self.job_type, self.batch, input=self.input)
                self.committed += self.batch
            except psycopg.Error as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
                if conn is not None:
                    self.uncertain += self.batch
                    conn.close()
                    conn = None
            self._stop.wait(self.every_s)  # pacing, not waiting for an outcome
        if conn is not None:
            conn.close()

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def worker_log_dir() -> Iterator[Path]:
    """A directory for worker logs outside pytest's basetemp (another pytest session on the same
    machine may prune basetemp directories while this one still writes there)."""
    keep = os.environ.get("NOTIFYQ_TEST_WORKER_LOGS")  # a directory: keep the logs there
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix="workers-", dir=keep))
        return
    with tempfile.TemporaryDirectory(prefix="notifyq-workers-") as path:
        yield Path(path)
