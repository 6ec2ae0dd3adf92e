"""Claim, drain and enqueue beside tens of millions of finished runs (issue 33 item 4).

    PYTHONPATH=. python3 bench/history.py [--finished 0,10000000,30000000] [--keep] [--reuse]
    PYTHONPATH=. python3 bench/history.py --smoke          # seconds: only that it runs

Creates the scratch database ``notifyq_bench_history`` (dropped at the end unless --keep; with
--reuse, the one a --keep run left, migrated again and grown from what it holds), migrated by
``notifyq migrate``. For each size of --finished, in ascending order, it grows the history to
that many finished runs with bench/dashboard_10m.sql (completed, failed, timed_out and canceled;
20 types, 6 pools, 1,000 tenants, 60.48 ms apart: 10 million span 7 days; each increment older
than the runs already there, so 30 million reuse the 10 million and load 20 more), then measures:

- ``before``: the hot statements on the table as loaded (VACUUM ANALYZE after the load), as the
  completer sends them (its session, generic plans, bench/statement_cost.py's calls), each
  ``--repeats`` times with auto_explain (ANALYZE, BUFFERS, no per-node timing) reporting to the
  client: the median duration and the median shared buffers (hit + read) of a call;
- ``drains``: ``--drains`` drains of ``--drain`` no-op runs at the defaults (notifyq/_bench.py's:
  one burst worker, concurrency 10, every run checked done exactly once), each after the runs
  of the one before are deleted and job_run is VACUUMed as autovacuum would (INDEX_CLEANUP
  auto), plus the CPU per run of the worker's process and of the database's backends; with
  --alternate, each alternated with a drain in an empty database beside (``..._empty``: the
  machine's load moves less within a pair than across a run of several minutes);
- ``after``: the statements again, on the table the drains and that VACUUM left (a queue in
  steady state rather than one freshly loaded);
- the sizes of job_run and of each of its indexes, and the load average.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dashboard import _admin, _migrate, load_runs  # noqa: E402
from bench.statement_cost import Q, _claim, _cycle, _insert_one  # noqa: E402
from notifyq._bench import JOB_TYPE, Bench, Sizes, _load_average  # noqa: E402
from tests.conftest import dsn_for  # noqa: E402
from tests.db.helpers import LIST_FILTERS  # noqa: E402

DATABASE = "notifyq_bench_history"
SMOKE = {"finished": [0, 3000], "drain": 300, "drains": 1, "repeats": 3}
_EXPLAIN = ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
            "SET auto_explain.log_timing = off", "SET auto_explain.log_format = json",
            "SET auto_explain.log_level = notice", "SET client_min_messages = notice")
_SIZES = """
SELECT c.relname AS name, pg_relation_size(c.oid) AS bytes
FROM pg_class c
WHERE c.oid = 'notifyq.job_run'::regclass
   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'notifyq.job_run'::regclass)
ORDER BY bytes DESC"""


class _BesideHistory(Bench):
    """notifyq/_bench.py's drain, with the history kept: between drains only the bench's own
    runs go (its verification counts only those), then job_run is VACUUMed as autovacuum
    would."""

    async def reset(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("DELETE FROM notifyq.job_run WHERE job_type LIKE 'bench.%'")
            await conn.execute("VACUUM notifyq.job_run")


def _grow(dsn: str, finished: int) -> int:
    """Loads finished runs older than every run there until job_run holds ``finished`` (a
    smaller size is left as it is); returns how many it holds."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*), extract(epoch FROM now() - min(created_at)) "
                           "FROM notifyq.job_run").fetchone()
    assert row is not None
    have, age_s = row[0], float(row[1] or 0)
    if finished > have:
        started = time.monotonic()
        load_runs(dsn, finished - have, live=0, before=f"{age_s + 0.1} seconds")
        print(f"# loaded {finished - have:,} finished runs in {time.monotonic() - started:.0f} s",
              flush=True)
        have = finished
    return have


def _plan_of(message: str) -> tuple[float, int]:
    """auto_explain's report: the statement's duration (ms) and its shared buffers."""
    found = re.match(r"duration: ([\d.]+) ms\s+plan:\s*(.*)", message, re.DOTALL)
    assert found, message[:200]
    plan = json.loads(found[2])["Plan"]
    return float(found[1]), int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def _statements(dsn: str, repeats: int) -> dict[str, dict[str, float]]:
    """Each hot statement ``repeats`` times after two warm-ups, on a backlog of pending runs
    enqueued for it (and deleted after)."""
    out: dict[str, dict[str, float]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO notifyq.job_run (job_type, input) SELECT %s, "
                     "jsonb_build_object('i', g) FROM generate_series(1, %s) g",
                     (JOB_TYPE, 40 * (repeats + 4)))
        conn.execute("ANALYZE notifyq.job_run")
        conn.execute(Q.worker_session_generic_plans)
        plans: list[tuple[float, int]] = []

        def explained(notice: psycopg.errors.Diagnostic) -> None:
            plans.append(_plan_of(notice.message_primary or ""))

        conn.add_notice_handler(explained)
        for setting in _EXPLAIN:
            conn.execute(setting)

        def measure(name: str, call: Callable[[], Any]) -> None:
            for _ in range(2):
                call()
            plans.clear()
            for _ in range(repeats):
                call()
            out[name] = {"ms": round(statistics.median(p[0] for p in plans), 3),
                         "buffers": statistics.median(p[1] for p in plans)}

        measure("claim_1", lambda: _claim(conn, 1))
        for batch in (10, 20):
            state = {"rows": _claim(conn, batch), "batch": batch}
            measure(f"cycle_{batch}", lambda state=state: _cycle(conn, state))
        measure("insert_one", lambda: _insert_one(conn))
        # The first page of the runs list, as the API and the dashboard send it: on a pooled
        # connection (plan_cache_mode "auto", sequential scans allowed), not the completer's.
        conn.execute("RESET plan_cache_mode")
        conn.execute("RESET enable_seqscan")
        measure("list_50", lambda: conn.execute(Q.job_run_list, {**LIST_FILTERS, "limit": 50}))
        conn.remove_notice_handler(explained)
        conn.execute("RESET ALL")
        conn.execute("DELETE FROM notifyq.job_run WHERE job_type = %s", (JOB_TYPE,))
    return out


async def _drains(dsns: dict[str, str], n: int, drains: int,
                  ) -> dict[str, list[dict[str, float]]]:
    """``drains`` drains in each database, alternated (A, B, A, B ...) when there are two: the
    load of a shared machine moves between drains less within a pair than across a run."""
    benches = {label: _BesideHistory(dsn, Sizes(drain_n=n)) for label, dsn in dsns.items()}
    out: dict[str, list[dict[str, float]]] = {label: [] for label in dsns}
    async with AsyncExitStack() as stack:
        for bench in benches.values():
            await stack.enter_async_context(bench.app)
            await bench._drain_once(max(200, n // 20), bench.sizes.drain_base)  # warm-up
        for _ in range(drains):
            for label, bench in benches.items():
                rate = await bench._drain_once(n, bench.sizes.drain_base)
                out[label].append({"runs_per_s": rate, **bench.cpu_us[bench.sizes.drain_base]})
        for bench in benches.values():
            await bench.reset()  # the last drain's runs go too, as before the statements
    return out


def _sizes(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(_SIZES).fetchall())


def measure(dsns: dict[str, str], finished: int, args: argparse.Namespace) -> dict[str, Any]:
    """The statements, drains (alternated with the empty database's, if any) and sizes of
    ``dsns["history"]``."""
    load = _load_average()
    dsn = dsns["history"]
    for each in dsns.values():
        with psycopg.connect(each, autocommit=True) as conn:
            conn.execute("DELETE FROM notifyq.job_run WHERE job_type LIKE 'bench.%'")
            conn.execute("VACUUM ANALYZE notifyq.job_run")
    report: dict[str, Any] = {"finished": finished, "load_average_start": load,
                              "before": _statements(dsn, args.repeats)}
    report["drains"] = anyio.run(_drains, dsns, args.drain, args.drains)
    report["after"] = _statements(dsn, args.repeats)
    report["sizes"] = _sizes(dsn)
    report["load_average_end"] = _load_average()
    return report


def _render(report: dict[str, Any]) -> str:
    lines = [f"## {report['finished']:,} finished runs (load {report['load_average_start']} -> "
             f"{report['load_average_end']})"]
    for when in ("before", "after"):
        lines += [f"  {when:6s} {name:10s} {cost['ms']:8.3f} ms  {cost['buffers']:7.0f} buffers"
                  for name, cost in report[when].items()]
    lines += [f"  drain {label:7s} {d['runs_per_s']:8.1f} runs/s  python "
              f"{d['python_us_per_run']} us/run  server {d['server_us_per_run']} us/run"
              for label, drains in report["drains"].items() for d in drains]
    lines += [f"  {name:32s} {size / 2**20:10.1f} MiB" for name, size in report["sizes"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finished", default="0,10000000,30000000",
                        help="sizes measured, comma-separated (grown in ascending order)")
    parser.add_argument("--drain", type=int, default=20_000, help="runs per drain")
    parser.add_argument("--drains", type=int, default=2, help="drains per size")
    parser.add_argument("--repeats", type=int, default=30, help="calls of each statement")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--reuse", action="store_true",
                        help="grow and measure the database a --keep run left")
    parser.add_argument("--json", type=Path, help="also write the reports here")
    parser.add_argument("--alternate", action="store_true",
                        help="alternate each drain with one in an empty database beside "
                             "(DATABASE_empty)")
    parser.add_argument("--database", help=f"the scratch database (default {DATABASE}, "
                        f"{DATABASE}_smoke with --smoke; the name must start with {DATABASE})")
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.finished.split(","))
    if args.smoke:
        sizes = SMOKE["finished"]
        args.drain, args.drains, args.repeats = SMOKE["drain"], SMOKE["drains"], SMOKE["repeats"]
        args.alternate = True
    database = args.database or (f"{DATABASE}_smoke" if args.smoke else DATABASE)
    if not database.startswith(DATABASE):
        parser.error(f"--database must start with {DATABASE} (it is dropped)")
    dsn = dsn_for(database)
    if not args.reuse:
        _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        _admin(f'CREATE DATABASE "{database}"')
    dsns = {"history": dsn}
    if args.alternate:
        dsns["empty"] = dsn_for(f"{database}_empty")
        _admin(f'DROP DATABASE IF EXISTS "{database}_empty" WITH (FORCE)')
        _admin(f'CREATE DATABASE "{database}_empty"')
    reports = []
    try:
        for each in dsns.values():
            _migrate(each)
        for size in sizes:
            have = _grow(dsn, size)
            if have > size + size // 100 + 1000:
                print(f"# {size:,}: the database holds {have:,} runs already, skipped")
                continue
            reports.append(measure(dsns, size, args))
            print(_render(reports[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(reports, indent=2))
    finally:
        if not args.keep:
            _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        _admin(f'DROP DATABASE IF EXISTS "{database}_empty" WITH (FORCE)')


if __name__ == "__main__":
    main()
