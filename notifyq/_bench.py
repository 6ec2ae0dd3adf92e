"""``notifyq bench``: what notifyq does on this machine, next to what PostgreSQL alone does.

A benchmark, not a test: it creates its own scratch database (dropped and recreated; named
``notifyq_bench`` unless told otherwise, and the name must start with that so a typo cannot
drop a real database), migrates it, measures, prints a table (or JSON) and drops the database.

Sections (``--only`` picks some):

- ``enqueue``: ``App.enqueue`` (outside any transaction of the caller) with 1 and 8 concurrent
  enqueuers, with the CPU per enqueue of this process and of the database's backends, and in
  the same run the two PostgreSQL baselines the wake-up design is judged by: 8 connections
  doing plain single-row INSERTs, and 8 doing INSERT + NOTIFY per transaction (every such
  commit takes PostgreSQL's database-wide notify lock).
- ``bulk``: ``App.enqueue_many`` in batches of 1,000, with the CPU per run.

The report's meta carries the load average at the start and the end: on a shared machine a
rate means little without it.
- ``drain``: pre-enqueued no-op runs drained by one in-process burst worker, at concurrency 10
  and at the best of a few higher settings; afterwards SQL must show every run completed with
  ``attempts = 1`` (exactly once), or the bench fails.
- ``latency``: an idle worker; runs enqueued 20-50 ms apart; latency = handler start minus the
  moment ``await app.enqueue(...)`` returned (so it leaves out the NOTIFY round trip after the
  commit: it can only flatter notifyq by that much). Both clocks are this process's
  ``perf_counter``.
- ``sql``: the worker's own claim and write-back statements in a bare loop of 100-row batches,
  with no handler machinery: the ceiling the drain could reach on this machine.

Honesty rules: a warm-up before every measurement, excluded; the table is emptied (TRUNCATE)
before each; cheap measurements are repeated and the median reported.

The baselines' scratch table and the verification queries are the only SQL strings in
``notifyq/`` outside ``db/queries``: they measure PostgreSQL itself, not a notifyq query.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any, LiteralString
from uuid import UUID

import anyio
import psycopg
from psycopg import sql

from notifyq._app import App
from notifyq._context import JobContext
from notifyq._enqueue.request import EnqueueRequest
from notifyq._errors import BenchError
from notifyq._policies import ConcurrencyPolicy, RateLimit
from notifyq._settings import load_settings
from notifyq._version import VERSION

SECTIONS = ("enqueue", "bulk", "drain", "latency", "sql", "durable", "policies")
DEFAULT_DATABASE = "notifyq_bench"
DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
JOB_TYPE = "bench.noop"
STEPS_TYPE = "bench.steps"
KEYED_TYPE = "bench.keyed"
KEYED_POOL = "bench.keyed"
"""The keyed handler's own pool: a pool with a concurrency-limited (or rate-limited) handler
claims with two statements per cycle (the keyed claim, then the plain one), and the drain and
latency sections measure the default pool a user gets, without one (the policies section
measures the keyed path). Their workers serve ``default`` alone: a second producer, woken at
every finish in burst mode, would take the free slots for claims of its own empty pool."""
RATED_TYPE = "bench.rated"
POLICY_MODES = ("off", "fair", "rate_limited")
"""The policies section's drains: a pool with no keyed handler (the plain claim alone), the
same pool claimed fairly (runs spread over 10 tenants), and a type with a rate limit far above
the drain rate (every claim goes through the keyed claim and its window; none waits)."""

_BASELINE_DDL: LiteralString = """
CREATE TABLE IF NOT EXISTS bench_plain (
    id bigserial PRIMARY KEY,
    input jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)"""
_BASELINE_INSERT: LiteralString = "INSERT INTO bench_plain (input) VALUES (%s::jsonb)"
_BASELINE_INSERT_NOTIFY: LiteralString = """
WITH i AS (INSERT INTO bench_plain (input) VALUES (%s::jsonb) RETURNING id)
SELECT pg_notify('notifyq_bench', 'j:default') FROM i"""
_RESET: LiteralString = "TRUNCATE {schema}.job_run CASCADE; TRUNCATE bench_plain"
_ANALYZE: LiteralString = "ANALYZE {schema}.job_run"
# The bench's own runs (every type it registers starts with "bench."): bench/history.py drains
# beside millions of other runs.
_VERIFY: LiteralString = """
SELECT count(*) AS total,
       count(*) FILTER (WHERE status = 'completed' AND attempts = 1) AS once
FROM {schema}.job_run WHERE job_type LIKE 'bench.%'"""
_BACKENDS: LiteralString = """
SELECT pid FROM pg_stat_activity WHERE datname = current_database()"""




@dataclass(frozen=True)
class Sizes:
    enqueue_n: int = 3000
    bulk_n: int = 50_000
    bulk_batch: int = 1000
    drain_n: int = 20_000
    drain_base: int = 10
    drain_tries: tuple[int, ...] = (50, 100, 200)
    latency_n: int = 200
    sql_n: int = 50_000
    sql_batch: int = 100
    sql_connections: tuple[int, ...] = (1, 4)
    durable_n: int = 1000
    durable_steps: int = 10
    keyed_queued: int = 10_000
    keyed_claims: int = 50
    policies_n: int = 10_000
    repeats: int = 3


QUICK = Sizes(enqueue_n=200, bulk_n=3000, drain_n=1000, drain_tries=(50,), latency_n=15,
              sql_n=2000, sql_connections=(1, 2), durable_n=50, durable_steps=3,
              keyed_queued=300, keyed_claims=5, policies_n=500, repeats=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", help="server/admin DSN used to create the scratch database "
                        "(default: NOTIFYQ_DATABASE_URL, else " + DEFAULT_ADMIN_DSN + ")")
    parser.add_argument("--database", default=DEFAULT_DATABASE,
                        help=f"scratch database, dropped and recreated (default {DEFAULT_DATABASE};"
                        f" must start with {DEFAULT_DATABASE})")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", action="append", choices=SECTIONS, metavar="NAME",
                        help="run only this section (repeatable): " + ", ".join(SECTIONS))
    parser.add_argument("--repeats", type=int, help="repeats of the cheap measurements "
                        "(median reported; default 3, 1 with --quick)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_bench(args: argparse.Namespace) -> int:
    if not args.database.startswith(DEFAULT_DATABASE):
        raise BenchError(f"--database {args.database!r} must start with {DEFAULT_DATABASE!r} "
                         "(the bench drops and recreates it)")
    sizes = QUICK if args.quick else Sizes()
    if args.repeats is not None:
        if args.repeats < 1:
            raise BenchError(f"--repeats must be at least 1, got {args.repeats}")
        sizes = replace(sizes, repeats=args.repeats)
    admin = args.dsn or os.environ.get("NOTIFYQ_DATABASE_URL") or DEFAULT_ADMIN_DSN
    sections = [s for s in SECTIONS if not args.only or s in args.only]
    logging.getLogger("notifyq").setLevel(logging.WARNING)  # the worker's start/stop lines
    report = anyio.run(_run, admin, args.database, sizes, sections, args.keep)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0


async def _run(admin: str, database: str, sizes: Sizes, sections: list[str],
               keep: bool) -> dict[str, Any]:
    dsn = _recreate(admin, database)
    try:
        bench = Bench(dsn, sizes)
        async with bench.app:
            await bench.setup()
            report: dict[str, Any] = {"meta": await bench.meta(database),
                                      "sizes": asdict(sizes)}
            for name in sections:
                report[name] = await getattr(bench, name)()
            report["meta"]["load_average_end"] = _load_average()
        return report
    finally:
        if not keep:
            _drop(admin, database)


def _recreate(admin: str, database: str) -> str:
    _drop(admin, database)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return psycopg.conninfo.make_conninfo(admin, dbname=database)


def _drop(admin: str, database: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(database)))


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def _load_average() -> list[float]:
    """1, 5 and 15 minute load averages (the machine's, not only this bench's): with other
    work on the machine the rates mean little, so every report carries them."""
    return [round(x, 2) for x in os.getloadavg()]


class Bench:
    """One measurement per method; each returns a JSON-ready dict of numbers."""

    def __init__(self, dsn: str, sizes: Sizes) -> None:
        self.dsn = dsn
        self.sizes = sizes
        self.app = App(settings=load_settings(database_url=dsn, pool_max_size=16))
        self.executed = 0
        self.cpu_us: dict[int, dict[str, float]] = {}
        self.started: dict[UUID, float] = {}
        self._timing = False
        self._progress = anyio.Event()

        @self.app.handler(STEPS_TYPE)
        async def steps(ctx: JobContext) -> None:
            for i in range(int(ctx.input["steps"])):
                await ctx.step(f"s{i}", lambda: None)

        @self.app.handler(KEYED_TYPE, pool=KEYED_POOL, concurrency=ConcurrencyPolicy(key="{k}"))
        async def keyed(ctx: JobContext) -> None:
            return None

        @self.app.handler(JOB_TYPE)
        async def noop(ctx: JobContext) -> None:
            self.executed += 1
            if self._timing:
                self.started[ctx.run.id] = time.perf_counter()
                self._progress.set()

    async def setup(self) -> None:
        await self.app.migrate()
        async with (await self.app.pool()).connection() as conn:
            await conn.execute(_BASELINE_DDL)

    async def meta(self, database: str) -> dict[str, Any]:
        async with (await self.app.pool()).connection() as conn:
            row = await (await conn.execute("SHOW server_version")).fetchone()
        return {"notifyq": VERSION, "postgresql": row["server_version"] if row else "?",
                "python": platform.python_version(), "cpus": os.cpu_count(),
                "platform": platform.platform(terse=True), "database": database,
                "load_average_start": _load_average()}

    async def reset(self) -> None:
        async with (await self.app.pool()).connection() as conn:
            await conn.execute(self._sql(_RESET))

    def _sql(self, text: LiteralString) -> sql.Composed:
        return sql.SQL(text).format(schema=sql.Identifier(self.app.settings.schema_name))

    async def _repeat(self, measure: Callable[[], Awaitable[float]]) -> float:
        """Median of ``repeats`` measurements, each on an emptied table."""
        results = []
        for _ in range(self.sizes.repeats):
            await self.reset()
            results.append(await measure())
        return _median(results)

    async def _repeat_cpu(self, measure: Callable[[], Awaitable[float]]
                          ) -> tuple[float, dict[str, float | None]]:
        """:meth:`_repeat`, and the medians of the CPU per job that :meth:`_timed` recorded
        (None: too little server CPU for /proc's clock ticks, or the server is not local)."""
        self._cpu_samples: list[tuple[float, float]] = []
        rate = await self._repeat(measure)
        server = _median([s[1] for s in self._cpu_samples])
        return rate, {"python_us": _median([s[0] for s in self._cpu_samples]),
                      "server_us": server or None}

    async def _timed(self, n: int, go: Callable[[], Awaitable[Any]]) -> float:
        """``_rate(n, go)``, recording this process's and the database's backends' CPU per job
        (warm-ups stay outside it)."""
        python_s = time.process_time()
        async with self._server_cpu() as server:
            rate = await _rate(n, go)
        python_s = time.process_time() - python_s
        self._cpu_samples.append((python_s / n * 1e6, server[0] / n * 1e6))
        return rate

    # -- (6) durable runs: the cost of a memoized step, and of skipping busy concurrency keys --

    async def durable(self) -> dict[str, Any]:
        n, k = self.sizes.durable_n, self.sizes.durable_steps
        plain = await self._repeat(lambda: self._drain_steps(n, 0))
        stepped = await self._repeat(lambda: self._drain_steps(n, k))
        per_step_us = (1 / stepped - 1 / plain) / k * 1e6
        return {"n": n, "steps_per_run": k, "runs_per_s_no_steps": plain,
                "runs_per_s_with_steps": stepped, "us_per_step": round(per_step_us, 1),
                **await self._keyed_skip_rate()}

    async def _drain_steps(self, n: int, steps: int) -> float:
        await self.app.enqueue_many([{"job_type": STEPS_TYPE, "input": {"steps": steps}}
                                     for _ in range(n)])
        started = time.perf_counter()
        await self.app.run_worker(concurrency=10, burst=True, pools=["default"])
        return n / (time.perf_counter() - started)

    async def _keyed_skip_rate(self) -> dict[str, Any]:
        """One key at its limit (a run holds it) and `keyed_queued` runs queued behind it: each
        keyed claim must look past all of them and claim nothing."""
        await self.reset()
        queued, claims = self.sizes.keyed_queued, self.sizes.keyed_claims
        await self.app.enqueue_many([{"job_type": KEYED_TYPE, "input": {"k": "hot"},
                                      "concurrency_key": "hot"} for _ in range(queued + 1)])
        q = self.app._runtime.queries
        params = {"now": None, "pool": KEYED_POOL, "limit": 10, "worker_id": "bench",
                  "lease_s": 60.0}
        async with (await self.app.pool()).connection() as conn:
            params["limit"] = 1
            held = await (await conn.execute(q.job_run_claim_keyed, params)).fetchall()
            params["limit"] = 10
            started = time.perf_counter()
            for _ in range(claims):
                if await (await conn.execute(q.job_run_claim_keyed, params)).fetchall():
                    raise BenchError("a keyed claim took a run past its concurrency limit")
            elapsed = time.perf_counter() - started
        return {"keyed_queued": queued, "keyed_held": len(held),
                "keyed_claims_per_s": round(claims / elapsed, 1),
                "keyed_skipped_per_s": round(claims * queued / elapsed)}

    # -- (1) single enqueue, with the PostgreSQL baselines ---------------------------------

    async def enqueue(self) -> dict[str, Any]:
        n = self.sizes.enqueue_n
        one, one_cpu = await self._repeat_cpu(lambda: self._enqueue_rate(n, 1))
        eight, eight_cpu = await self._repeat_cpu(lambda: self._enqueue_rate(n, 8))
        return {
            "n": n,
            "notifyq_1": one,
            "notifyq_8": eight,
            "cpu_us_per_enqueue": {"notifyq_1": one_cpu, "notifyq_8": eight_cpu},
            "plain_insert_8": await self._repeat(lambda: self._baseline_rate(
                n, 8, _BASELINE_INSERT)),
            "insert_notify_8": await self._repeat(lambda: self._baseline_rate(
                n, 8, _BASELINE_INSERT_NOTIFY)),
        }

    async def _enqueue_rate(self, n: int, concurrency: int) -> float:
        """``n`` sequential ``await app.enqueue(...)`` calls split over ``concurrency`` tasks,
        each outside any transaction of the caller (the issue's "single enqueue")."""
        async def enqueuer(count: int) -> None:
            for i in range(count):
                await self.app.enqueue(JOB_TYPE, {"i": i})

        await _concurrently(enqueuer, concurrency, max(20, n // 20))  # warm-up
        return await self._timed(n, lambda: _concurrently(enqueuer, concurrency,
                                                          n // concurrency))

    async def _baseline_rate(self, n: int, concurrency: int, statement: LiteralString) -> float:
        conns = [await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                 for _ in range(concurrency)]
        try:
            async def inserter(count: int, conn: psycopg.AsyncConnection[Any]) -> None:
                for i in range(count):
                    await conn.execute(statement, (json.dumps({"i": i}),))

            async def all_of(count: int) -> None:
                async with anyio.create_task_group() as tg:
                    for conn in conns:
                        tg.start_soon(inserter, count, conn)

            await all_of(max(20, n // 20) // concurrency)  # warm-up (and statement preparing)
            return await _rate(n, lambda: all_of(n // concurrency))
        finally:
            for conn in conns:
                await conn.close()

    # -- (2) bulk enqueue ------------------------------------------------------------------

    async def bulk(self) -> dict[str, Any]:
        n, size = self.sizes.bulk_n, self.sizes.bulk_batch
        batches = [[EnqueueRequest(job_type=JOB_TYPE, input={"i": i})
                    for i in range(start, min(start + size, n))] for start in range(0, n, size)]

        async def measure() -> float:
            await self.app.enqueue_many(batches[0])  # warm-up
            await self.reset()

            async def go() -> None:
                for batch in batches:
                    await self.app.enqueue_many(batch)
            return await self._timed(n, go)

        rate, cpu = await self._repeat_cpu(measure)
        return {"n": n, "batch": size, "jobs_per_s": rate, "cpu_us_per_run": cpu}

    # -- (3) drain -------------------------------------------------------------------------

    async def drain(self) -> dict[str, Any]:
        await self.reset()
        await self._drain_once(max(200, self.sizes.drain_n // 20), self.sizes.drain_base)
        rates = {c: await self._drain_once(self.sizes.drain_n, c)
                 for c in (self.sizes.drain_base, *self.sizes.drain_tries)}
        best = max(self.sizes.drain_tries, key=lambda c: rates[c])
        return {"n": self.sizes.drain_n, "verified_exactly_once": True,
                f"concurrency_{self.sizes.drain_base}": rates[self.sizes.drain_base],
                "best": {"concurrency": best, "jobs_per_s": rates[best]},
                "by_concurrency": {str(c): r for c, r in rates.items()},
                "cpu_by_concurrency": {str(c): self.cpu_us[c] for c in rates}}

    async def _drain_once(self, n: int, concurrency: int) -> float:
        """Enqueue ``n`` runs (untimed), drain them with a burst worker (timed), verify."""
        await self.reset()
        await self._enqueue_untimed(n)
        self.executed = 0
        python_s = time.process_time()
        async with self._server_cpu() as server:
            rate = await _rate(n, lambda: self.app.run_worker(concurrency=concurrency,
                                                              pools=["default"],
                                                              burst=True))
        python_s = time.process_time() - python_s
        self.cpu_us[concurrency] = {"python_us_per_run": round(python_s / n * 1e6, 1),
                                    "server_us_per_run": round(server[0] / n * 1e6, 1)}
        await self._verify(n)
        return round(rate, 1)

    @asynccontextmanager
    async def _server_cpu(self) -> AsyncIterator[list[float]]:
        """CPU seconds the bench database's backends use inside the block (0 when PostgreSQL
        runs on another host: their /proc entries are not here), appended to the list it
        yields on exit. Sampled every 20 ms, so backends that start or end inside the block
        count too (a worker's listener and its completer's connection): all but their last
        20 ms."""
        first = await self._backend_cpu_s()
        last = dict(first)
        spent: list[float] = []

        async def sample() -> None:
            while True:
                await anyio.sleep(0.02)
                _keep_highest(last, await self._backend_cpu_s())

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            yield spent
            tg.cancel_scope.cancel()
        _keep_highest(last, await self._backend_cpu_s())
        spent.append(sum(cpu - first.get(pid, 0.0) for pid, cpu in last.items()))

    async def _backend_cpu_s(self) -> dict[int, float]:
        async with (await self.app.pool()).connection() as conn:
            rows = await (await conn.execute(_BACKENDS)).fetchall()
        return {row["pid"]: _process_cpu_s(row["pid"]) for row in rows}

    async def _verify(self, n: int) -> None:
        async with (await self.app.pool()).connection() as conn:
            row = await (await conn.execute(self._sql(_VERIFY))).fetchone()
        assert row is not None  # noqa: S101 - an aggregate always returns a row
        if row["total"] != n or row["once"] != n or self.executed != n:
            raise BenchError(
                f"drain did not run every run exactly once: {row['total']} rows, "
                f"{row['once']} completed with attempts = 1, {self.executed} handler calls; "
                f"expected {n} of each")

    # -- (7) rate limits and fair claiming: what they cost the drain -------------------------

    async def policies(self) -> dict[str, Any]:
        """Drains at the default concurrency with each POLICY_MODES app, interleaved
        ``repeats`` times (medians), each on an emptied table and verified."""
        n, base = self.sizes.policies_n, self.sizes.drain_base
        rates: dict[str, list[float]] = {mode: [] for mode in POLICY_MODES}
        cpu: dict[str, list[dict[str, float]]] = {mode: [] for mode in POLICY_MODES}
        for _ in range(self.sizes.repeats):
            for mode in POLICY_MODES:
                rate, used = await self._policy_drain(mode, n, base)
                rates[mode].append(rate)
                cpu[mode].append(used)
        out: dict[str, Any] = {"n": n, "concurrency": base, "verified_exactly_once": True}
        for mode in POLICY_MODES:
            out[mode] = {"jobs_per_s": _median(rates[mode]), "runs": rates[mode],
                         **{k: _median([c[k] for c in cpu[mode]]) for k in cpu[mode][0]}}
        return out

    async def _policy_drain(self, mode: str, n: int, concurrency: int,
                            ) -> tuple[float, dict[str, float]]:
        worker = {"fair_pools": ["default"]} if mode == "fair" else {}
        app = App(settings=load_settings(database_url=self.dsn, pool_max_size=16,
                                         worker=worker))
        job_type = RATED_TYPE if mode == "rate_limited" else JOB_TYPE
        done = 0

        async def noop(ctx: JobContext) -> None:
            nonlocal done
            done += 1

        app.handler(job_type, rate_limit=RateLimit(limit=10_000, period_s=1.0)
                    if mode == "rate_limited" else None)(noop)
        async with app:
            await self.reset()
            # An empty burst stores the definition (the rate limit) before the enqueues.
            await app.run_worker(concurrency=concurrency, burst=True)
            for start in range(0, n, 1000):
                await app.enqueue_many([
                    EnqueueRequest(job_type=job_type, input={"i": i},
                                   tenant_id=f"t{i % 10}" if mode == "fair" else None)
                    for i in range(start, min(start + 1000, n))])
            python_s = time.process_time()
            async with self._server_cpu() as server:
                rate = await _rate(n, lambda: app.run_worker(concurrency=concurrency,
                                                             burst=True))
            python_s = time.process_time() - python_s
            server_s = server[0]
        async with (await self.app.pool()).connection() as conn:
            row = await (await conn.execute(self._sql(_VERIFY))).fetchone()
        if row is None or row["total"] != n or row["once"] != n or done != n:
            raise BenchError(f"policies drain ({mode}) did not run every run exactly once")
        return round(rate, 1), {"python_us_per_run": round(python_s / n * 1e6, 1),
                                "server_us_per_run": round(server_s / n * 1e6, 1)}

    # -- (4) wake latency ------------------------------------------------------------------

    async def latency(self) -> dict[str, Any]:
        await self.reset()
        self.started = {}
        self._timing = True
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(self.app.run_worker, concurrency=10, pools=["default"]))
                for _ in range(5):  # warm-up: also proves the worker is up and listening
                    run = await self.app.enqueue(JOB_TYPE, {})
                    await self._wait_started({run.id})
                samples = await self._latency_samples()
                tg.cancel_scope.cancel()
        finally:
            self._timing = False
        samples.sort()
        cuts = statistics.quantiles(samples, n=100, method="inclusive")
        return {"n": len(samples), "p50_ms": round(cuts[49], 2), "p95_ms": round(cuts[94], 2),
                "p99_ms": round(cuts[98], 2), "max_ms": round(samples[-1], 2)}

    async def _latency_samples(self) -> list[float]:
        committed: dict[UUID, float] = {}
        rng = random.Random(7)  # noqa: S311 - spacing, not security
        for _ in range(self.sizes.latency_n):
            await anyio.sleep(rng.uniform(0.020, 0.050))
            run = await self.app.enqueue(JOB_TYPE, {})
            committed[run.id] = time.perf_counter()
        await self._wait_started(set(committed))
        return [(self.started[k] - t) * 1000 for k, t in committed.items()]

    async def _wait_started(self, ids: set[UUID]) -> None:
        with anyio.fail_after(30):
            while not ids <= self.started.keys():
                self._progress = anyio.Event()
                await self._progress.wait()

    # -- (5) the SQL ceiling ---------------------------------------------------------------

    async def sql(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.sizes.sql_n, "batch": self.sizes.sql_batch}
        for conns in self.sizes.sql_connections:
            out[f"connections_{conns}"] = await self._repeat(partial(self._sql_rate, conns))
        return out

    async def _sql_rate(self, connections: int) -> float:
        n = self.sizes.sql_n
        await self._enqueue_untimed(max(200, n // 20))
        await self._claim_complete(connections)  # warm-up
        await self.reset()
        await self._enqueue_untimed(n)
        rate = await _rate(n, lambda: self._claim_complete(connections))
        self.executed = n  # no handler here: _verify checks the rows only
        await self._verify(n)
        return rate

    async def _enqueue_untimed(self, n: int) -> None:
        """A backlog of ``n`` runs, analyzed as autovacuum analyzes a user's: a drain measured
        on a table the planner has never seen can miss a plan that only stats bring (a claim
        that scanned the whole table did, until 2026-12-01)."""
        for start in range(0, n, 1000):
            await self.app.enqueue_many([{"job_type": JOB_TYPE, "input": {"i": i}}
                                         for i in range(start, min(start + 1000, n))])
        async with (await self.app.pool()).connection() as conn:
            await conn.execute(self._sql(_ANALYZE))

    async def _claim_complete(self, connections: int) -> None:
        """The worker's statement in a bare loop: each one writes back the previous batch as
        completed and claims the next, as a busy worker's completer does. A write-back the
        statement skipped goes in the next one again, as the completer's does: another
        connection's claim may hold the row for its statement (it locks a row it passed over
        as just claimed, then drops it)."""
        q, db = self.app._runtime.queries, await self.app.pool()

        async def loop() -> None:
            rows: list[dict[str, Any]] = []
            async with db.connection() as conn:
                while True:
                    k = len(rows)
                    sent = rows
                    claim = {"now": None, "pool": "default", "limit": self.sizes.sql_batch,
                             "worker_id": "bench", "lease_s": 30.0}
                    rows = await (await conn.execute(q.job_run_finish_and_claim, {
                        **claim, "ids": [r["id"] for r in rows],
                        "fences": [r["fence"] for r in rows], "statuses": ["completed"] * k,
                        "outputs": [None] * k, "errors": [None] * k, "run_ats": [None] * k,
                        "refunds": [0] * k, "wait_kinds": [None] * k,
                        "wait_tokens": [None] * k, "waiting_ons": [None] * k,
                    }) if k else await conn.execute(q.job_run_claim,
                                                    {**claim, "keyed": False})).fetchall()
                    written = {r["id"] for r in rows if not r["claimed"]}
                    rows = [r for r in rows if r["claimed"]]
                    rows += [r for r in sent if r["id"] not in written]
                    if not rows and not k:
                        return

        async def all_loops() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(connections):
                    tg.start_soon(loop)

        await all_loops()


def _keep_highest(last: dict[int, float], now: dict[int, float]) -> None:
    """Each backend's latest CPU reading (one read as 0 exited between the query and /proc)."""
    for pid, cpu in now.items():
        if cpu > last.get(pid, 0.0):
            last[pid] = cpu


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a local process; 0 if it is gone (or not local)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def _concurrently(worker: Callable[[int], Coroutine[Any, Any, None]], tasks: int,
                        each: int) -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(worker, each)


async def _rate(n: int, go: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await go()
    return n / (time.perf_counter() - start)


# -- rendering -------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    m = report["meta"]
    s = report["sizes"]
    lines = [f"notifyq bench: notifyq {m['notifyq']}, PostgreSQL {m['postgresql']}, Python "
             f"{m['python']}, {m['cpus']} CPUs ({m['platform']}); medians of {s['repeats']} "
             "where repeated, warm-up excluded",
             "load average (1/5/15 min) at the start " + _load_text(m.get("load_average_start"))
             + ", at the end " + _load_text(m.get("load_average_end")), ""]
    rows: list[tuple[str, str, str]] = []
    if "enqueue" in report:
        e = report["enqueue"]
        rows += [
            ("enqueue", f"App.enqueue, 1 enqueuer (N={e['n']})", _rate_text(e["notifyq_1"])),
            ("", "  CPU per enqueue: Python / PostgreSQL backends",
             _cpu_text(e["cpu_us_per_enqueue"]["notifyq_1"])),
            ("", "App.enqueue, 8 enqueuers", _rate_text(e["notifyq_8"])),
            ("", "  CPU per enqueue: Python / PostgreSQL backends",
             _cpu_text(e["cpu_us_per_enqueue"]["notifyq_8"])),
            ("", "baseline: plain INSERT, 8 connections", _rate_text(e["plain_insert_8"])),
            ("", "baseline: INSERT+NOTIFY per tx, 8 conns",
             _rate_text(e["insert_notify_8"])),
        ]
    if "bulk" in report:
        b = report["bulk"]
        rows.append(("bulk", f"enqueue_many, batches of {b['batch']} (N={b['n']})",
                     _rate_text(b["jobs_per_s"])))
        rows.append(("", "  CPU per run: Python / PostgreSQL backends",
                     _cpu_text(b["cpu_us_per_run"])))
    if "drain" in report:
        d = report["drain"]
        base = s["drain_base"]
        rows.append(("drain", f"burst worker, concurrency {base} (N={d['n']})",
                     _rate_text(d["by_concurrency"][str(base)])))
        tried = "/".join(str(c) for c in s["drain_tries"])
        cpu = d["cpu_by_concurrency"][str(base)]
        rows.append(("", f"  CPU per run at {base}: Python (whole process) / PostgreSQL "
                     "backends", f"{cpu['python_us_per_run']:,.0f} / "
                     f"{cpu['server_us_per_run']:,.0f} us"))
        rows.append(("", f"best of concurrency {tried}: {d['best']['concurrency']}",
                     _rate_text(d["best"]["jobs_per_s"])))
        rows.append(("", "verified in SQL: all completed, attempts = 1", "yes"))
    if "latency" in report:
        lat = report["latency"]
        rows.append(("latency", f"enqueue commit -> handler start (N={lat['n']})",
                     f"p50 {lat['p50_ms']:.1f} ms"))
        rows += [("", "", f"p95 {lat['p95_ms']:.1f} ms"), ("", "", f"p99 {lat['p99_ms']:.1f} ms"),
                 ("", "", f"max {lat['max_ms']:.1f} ms")]
    if "sql" in report:
        q = report["sql"]
        for key in sorted(k for k in q if k.startswith("connections_")):
            conns = key.removeprefix("connections_")
            rows.append(("sql" if key == min(k for k in q if k.startswith("connections_"))
                         else "", f"claim+complete loop, {q['batch']}-row batches, {conns} conn",
                         _rate_text(q[key])))
    if "durable" in report:
        du = report["durable"]
        rows += [
            ("durable", f"drain, {du['steps_per_run']} memoized steps per run (N={du['n']})",
             f"{du['runs_per_s_with_steps']:,.0f} runs/s"),
            ("", "same runs without steps", f"{du['runs_per_s_no_steps']:,.0f} runs/s"),
            ("", "overhead per memoized step", f"{du['us_per_step']:,.0f} us"),
            ("", f"keyed claim past {du['keyed_queued']:,} queued runs of a busy key",
             f"{du['keyed_skipped_per_s']:,} skipped/s"),
        ]
    if "policies" in report:
        po = report["policies"]
        labels = {"off": "no rate limit, plain claim", "fair": "fair claim, 10 tenants",
                  "rate_limited": "rate limit 10,000/s (not reached)"}
        for i, mode in enumerate(POLICY_MODES):
            r = po[mode]
            rows.append(("policies" if i == 0 else "",
                         f"drain, concurrency {po['concurrency']}, {labels[mode]} (N={po['n']})",
                         f"{_rate_text(r['jobs_per_s'])}; CPU {r['python_us_per_run']:,.0f} / "
                         f"{r['server_us_per_run']:,.0f} us"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)] if rows else [0, 0, 0]
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
    return "\n".join(lines)


def _rate_text(jobs_per_s: float) -> str:
    return f"{jobs_per_s:,.0f} jobs/s"


def _cpu_text(cpu: dict[str, float | None]) -> str:
    server = cpu["server_us"]
    return f"{cpu['python_us']:,.1f} / {'?' if server is None else f'{server:,.1f}'} us"


def _load_text(load: list[float] | None) -> str:
    return "?" if not load else " / ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: notifyq bench")
