"""Server time of every dashboard page on a table of 10 million runs (docs/dashboard.md).

    PYTHONPATH=. python bench/dashboard.py [--keep] [--reuse] [--runs 20000]

Creates the scratch database ``notifyq_bench_dashboard`` (dropped at the end unless --keep),
migrates it, loads bench/dashboard_10m.sql (one set-based INSERT of 10,000,000 runs over 7 days;
about 3 minutes and 4 GB), starts ``notifyq serve --no-worker`` on it, signs in and prints the
median and slowest of 10 requests per page after one warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import ADMIN_DSN, dsn_for
from tests.integration.serving import ADMIN, Served
from tests.ui.dashboard import Dashboard
from tests.vault import keys_env

DATABASE = "notifyq_bench_dashboard"
HERE = Path(__file__).parent


def _admin(sql: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def _migrate(dsn: str) -> None:
    subprocess.run([sys.executable, "-m", "notifyq", "migrate"], check=True,
                   env={**os.environ, "NOTIFYQ_DATABASE_URL": dsn}, stdout=subprocess.DEVNULL)


def _load(dsn: str, runs: int) -> None:
    _migrate(dsn)
    load_runs(dsn, runs, live=min(50_000, runs // 200))


def load_runs(dsn: str, runs: int, live: int, before: str = "0") -> None:
    """``runs`` runs into job_run by bench/dashboard_10m.sql (its indexes dropped and built
    again, VACUUM ANALYZE after): the newest ``live`` pending, running or waiting, every other
    one finished, the newest created ``before`` (an interval) ago."""
    subprocess.run(["psql", dsn, "-q", "-v", "ON_ERROR_STOP=1", "-v", f"runs={runs}",
                    "-v", f"live={live}", "-v", f"before={before}",
                    "-f", str(HERE / "dashboard_10m.sql")], check=True)


def _pages(dsn: str, runs: int) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        def one(sql: str) -> Any:
            row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
            assert row is not None
            return row[0]
        done = one("SELECT id FROM notifyq.job_run WHERE status = 'completed' "
                   "ORDER BY id DESC OFFSET 5000 LIMIT 1")
        deep = one(f"SELECT id FROM notifyq.job_run ORDER BY id LIMIT 1 "
                   f"OFFSET {min(3_000_000, runs * 3 // 10)}")
        since = one("SELECT to_char(now() - interval '3 days', 'YYYY-MM-DD\"T\"HH24:MI')")
        until = one("SELECT to_char(now() - interval '71 hours', 'YYYY-MM-DD\"T\"HH24:MI')")
    pages = {
        "overview": "/ui/", "overview panels": "/ui/overview/panels",
        "charts, 1 h": "/ui/overview/series.json",
        "charts, 2 h": "/ui/overview/series.json?minutes=120",
        "runs": "/ui/runs", "runs status=failed": "/ui/runs?status=failed",
        "runs status=pending": "/ui/runs?status=pending",
        "runs type=type.7": "/ui/runs?type=type.7", "runs tag=rare": "/ui/runs?tag=rare",
        "runs tenant=t42": "/ui/runs?tenant=t42",
        "runs status=timed_out&tenant=t42": "/ui/runs?status=timed_out&tenant=t42",
        "runs, an hour 3 days back": f"/ui/runs?from={since}&to={until}",
        "runs, id prefix": f"/ui/runs?q={str(done)[:8]}",
        "runs, id end (6 h of runs)": f"/ui/runs?q=\u2026{str(done)[-8:]}",
        "runs status=retrying": "/ui/runs?status=retrying", "job types": "/ui/types",
        "runs, 3M rows deep": f"/ui/runs?cursor={deep}", "run": f"/ui/runs/{done}",
        "webhooks": "/ui/webhooks", "keys": "/ui/keys", "schedules": "/ui/schedules"}
    # What the Runs page asks for once its list is shown: the tabs' counts.
    return pages | {f"{name}: counts": path.replace("/ui/runs", "/ui/runs/counts", 1)
                    for name, path in _counted(pages).items()}


def _counted(pages: dict[str, str]) -> dict[str, str]:
    return {name: path for name, path in pages.items()
            if (path == "/ui/runs" or path.startswith("/ui/runs?")) and "cursor=" not in path}


def _time(call: Callable[[], Any]) -> tuple[float, float]:
    call()
    times = []
    for _ in range(10):
        started = time.perf_counter()
        answer = call()
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.text[:300]
    return statistics.median(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--runs", type=int, default=10_000_000,
                        help="runs loaded (a smoke run: 20000)")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the database a --keep run left (migrated again), "
                             "without loading it again")
    args = parser.parse_args()
    dsn = dsn_for(DATABASE)
    if not args.reuse:
        _admin(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        _admin(f'CREATE DATABASE "{DATABASE}"')
    try:
        if args.reuse:
            _migrate(dsn)
        else:
            _load(dsn, args.runs)
        log = Path(tempfile.mkdtemp(prefix="notifyq-bench-dashboard-")) / "serve.log"
        with Served(dsn, log, args=["--no-worker"], env=keys_env(1, active=1)) as served, \
                Dashboard(served) as dashboard:
            assert dashboard.sign_in(ADMIN).status_code == 303
            for name, path in _pages(dsn, args.runs).items():
                median, worst = _time(lambda path=path: dashboard.get(path))
                print(f"{name:40s} {median:8.1f} ms  (slowest {worst:.1f} ms)", flush=True)
            bulk = {"action": "retry", "target": "filter", "type": "type.7"}
            median, worst = _time(lambda: dashboard.post("/ui/runs/bulk", bulk))
            print(f"{'bulk retry count, type=type.7':40s} {median:8.1f} ms  "
                  f"(slowest {worst:.1f} ms)")
    finally:
        if not args.keep:
            _admin(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


if __name__ == "__main__":
    main()
