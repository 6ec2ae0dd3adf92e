"""A long transaction that holds back vacuum (a held xmin), and throughput measured around it.

Shared by ``tests/chaos/test_held_xmin.py`` (a bounded 15 s hold, in CI) and ``bench/soak``
(the full one-minute hold). Throughput is counted in SQL from ``completion_log`` (a trigger row
per run that reaches ``completed``; ``tests.apps.faults.FAULTS_DDL``), so it is what PostgreSQL
saw, not what a worker believes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg


@contextmanager
def held_xmin(dsn: str) -> Iterator[int]:
    """Open a REPEATABLE READ transaction and keep its snapshot: every row version deleted or
    updated after it stays unremovable (vacuum and HOT pruning cannot reclaim it) until the
    transaction ends. Yields the backend's xmin."""
    conn = psycopg.connect(dsn, application_name="nq-test-held-xmin")
    try:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM notifyq.job_run")  # takes the snapshot
        xmin = conn.execute("SELECT backend_xmin::text::bigint FROM pg_stat_activity "
                            "WHERE pid = pg_backend_pid()").fetchone()
        yield int(xmin[0]) if xmin and xmin[0] is not None else -1
    finally:
        conn.rollback()
        conn.close()


@dataclass
class Window:
    name: str
    seconds: float
    completed: int
    enqueued: int
    backlog_end: int
    dead_tuples_end: int

    @property
    def rate(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0


@dataclass
class Meter:
    """Counts completions (``completion_log``) and runs (``job_run``) between marks."""

    conn: psycopg.Connection[Any]
    windows: list[Window] = field(default_factory=list)
    _t: float = 0.0
    _done: int = 0
    _runs: int = 0

    def _counts(self) -> tuple[int, int, int, int]:
        row = self.conn.execute("""
            SELECT (SELECT count(*) FROM completion_log),
                   (SELECT count(*) FROM notifyq.job_run),
                   (SELECT count(*) FROM notifyq.job_run WHERE status <> 'completed'),
                   (SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables
                    WHERE schemaname = 'notifyq' AND relname = 'job_run')""").fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2]), int(row[3] or 0)

    def start(self) -> None:
        self._done, self._runs, _, _ = self._counts()
        self._t = time.monotonic()

    def mark(self, name: str) -> Window:
        done, runs, backlog, dead = self._counts()
        now = time.monotonic()
        w = Window(name, now - self._t, done - self._done, runs - self._runs, backlog, dead)
        self.windows.append(w)
        self._t, self._done, self._runs = now, done, runs
        return w

    def report(self, prefix: str) -> str:
        return "; ".join(
            f"{prefix}{w.name}: {w.rate:,.0f} completed/s over {w.seconds:.1f} s "
            f"({w.enqueued / w.seconds if w.seconds else 0:,.0f} enqueued/s, backlog "
            f"{w.backlog_end}, n_dead_tup {w.dead_tuples_end})" for w in self.windows)


def before_during_after(meter: Meter, dsn: str, *, before_s: float, hold_s: float,
                        after_s: float, tick: Callable[[], None] | None = None,
                        tick_every_s: float = 1.0) -> int:
    """Measure ``before_s``, hold an xmin for ``hold_s`` (measured), then ``after_s``.
    ``tick`` (e.g. fault injection in the soak) is called every ``tick_every_s``.
    Returns the held xmin."""

    def wait(seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, tick_every_s))
            if tick is not None:
                tick()

    meter.start()
    wait(before_s)
    meter.mark("before")
    with held_xmin(dsn) as xmin:
        wait(hold_s)
        meter.mark("during held xmin")
    wait(after_s)
    meter.mark("after")
    return xmin
