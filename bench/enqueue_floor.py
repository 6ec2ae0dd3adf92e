#!/usr/bin/env python3
"""One enqueue from one task, taken apart against its floors and against pgqueuer.

    python3 bench/enqueue_floor.py                        # 5 rounds, 600 calls a part
    python3 bench/enqueue_floor.py --before /tmp/nq-main  # also another copy of notifyq
    python3 bench/enqueue_floor.py --rounds 3 --n 400 --json

Each round runs one process per side, their order rotated round by round (A, B, C, then B, C,
A ...), on one scratch database (``nqfloor``, dropped afterwards) that holds notifyq's schema
and pgqueuer's tables side by side:

- notifyq's side (this interpreter; ``--before DIR`` adds the same side with notifyq imported
  from DIR, e.g. a ``git archive`` of main): psycopg ``SELECT 1`` (the round-trip floor of the
  driver), a bare 4-column ``INSERT INTO notifyq.job_run`` (one autocommit statement, the
  table's floor), ``job_run_insert_one`` as the enqueuer sends it, ``App.enqueue`` from 1
  and from 8 tasks, and ``app.webhooks.send`` to one endpoint (no worker: nothing delivered);
- pgqueuer's side (``bench/.venvs/pgqueuer``, made by ``bench/compare``; left out without it):
  asyncpg ``SELECT 1``, the same bare INSERT through asyncpg, and pgqueuer 1.6's documented
  path, ``Queries(AsyncpgDriver(conn)).enqueue(...)`` on one connection, from 1 task and from 8
  (serialized by the driver's lock), and from 8 on an ``AsyncpgPoolDriver`` (what bench/compare
  drives).

Per part: calls/s, and per call the wall time, this process's CPU (``time.process_time``), the
database's backends' CPU (``/proc/<pid>/stat``) and the p50 / p99 of one call. The tables are
emptied before each part. Results: bench/RESULTS.md (2026-12-07).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ADMIN = os.environ.get("NOTIFYQ_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DB = "nqfloor"
PGQ_PYTHON = HERE / ".venvs" / "pgqueuer" / "bin" / "python"
BARE = ("INSERT INTO notifyq.job_run (id, job_type, input, pool) "
        "VALUES ($1, 'bench.noop', $2, 'default')")
TICK = os.sysconf("SC_CLK_TCK")
# The send() part's encryption key: one for every process of a run (the database remembers it).
KEY = base64.b64encode(hashlib.sha256(b"bench/enqueue_floor.py").digest()).decode()


def dsn_of(db: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + db


def backend_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            pass
    return total


async def timed(name: str, n: int, callers: int, call: Any, *, pids: Any,
                reset: Any) -> dict[str, Any]:
    """``n`` calls of ``call(i)`` split over ``callers`` tasks, after a warm-up of n/10."""
    took: list[float] = []

    async def run(count: int) -> None:
        async def one(k: int) -> None:
            for i in range(k):
                t = time.perf_counter()
                await call(i)
                took.append(time.perf_counter() - t)
        await asyncio.gather(*(one(count // callers) for _ in range(callers)))

    await reset()
    await run(max(callers * 5, n // 10))
    took.clear()
    before_pids = await pids()
    server = backend_cpu_s(before_pids)
    cpu, wall = time.process_time(), time.perf_counter()
    await run(n)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server = backend_cpu_s(before_pids) - server
    return {"part": name, "callers": callers, "per_s": round(n / wall),
            "wall_us": round(wall / n * 1e6, 1), "client_cpu_us": round(cpu / n * 1e6, 1),
            "server_cpu_us": round(server / n * 1e6, 1),
            "p50_us": round(statistics.median(took) * 1e6),
            "p99_us": round(statistics.quantiles(took, n=100)[98] * 1e6)}


# -- notifyq's side (psycopg) ----------------------------------------------------------------

async def notifyq_side(dsn: str, n: int) -> list[dict[str, Any]]:
    import psycopg

    from notifyq import App, JobContext
    from notifyq._enqueue.ids import new_run_id
    from notifyq._settings import Settings

    app = App(settings=Settings(
        database_url=dsn, keys=f"1:{KEY}", active_key_version=1, log_level="WARNING",
        webhooks={"allowed_networks": ["127.0.0.0/8"]}))  # type: ignore[arg-type]

    @app.handler("bench.noop")
    async def noop(ctx: JobContext) -> None:
        return None

    q = app._runtime.queries
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
    admin = await psycopg.AsyncConnection.connect(dsn, autocommit=True)

    async def pids() -> list[int]:
        cur = await admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                                  "current_database() AND pid <> pg_backend_pid()")
        return [r[0] for r in await cur.fetchall()]

    async def reset() -> None:
        await admin.execute("TRUNCATE notifyq.job_run, notifyq.webhook_message CASCADE")

    bare = BARE.replace("$1", "%s").replace("$2", "%s")

    async def select1(i: int) -> None:
        await conn.execute("SELECT 1")

    async def insert_bare(i: int) -> None:
        await conn.execute(bare, (new_run_id(), f'{{"i": {i}}}'))

    async def insert_one(i: int) -> None:
        params = {"id": new_run_id(), "job_type": "bench.noop", "input": f'{{"i": {i}}}',
                  "pool": None, "priority": None, "run_at": None, "max_attempts": None,
                  "tags": None, "scope_entity_type": None, "scope_entity_id": None,
                  "tenant_id": None, "trace_context": None, "accept": True, "notify": True,
                  "channel": q.schema}
        async with conn.cursor() as cur:
            await cur.execute(q.job_run_insert_one, params)
            await cur.fetchone()

    async def enqueue(i: int) -> None:
        await app.enqueue("bench.noop", {"i": i})

    endpoint = await app.webhooks.create_endpoint("http://127.0.0.1:9/floor",
                                                  event_types=["bench.floor"])

    async def send(i: int) -> None:
        await app.webhooks.send("bench.floor", {"i": i}, endpoint_id=endpoint.id)

    out = []
    try:
        for name, callers, call in (("psycopg SELECT 1", 1, select1),
                                    ("psycopg bare INSERT", 1, insert_bare),
                                    ("psycopg job_run_insert_one", 1, insert_one),
                                    ("App.enqueue", 1, enqueue),
                                    ("App.enqueue", 8, enqueue),
                                    ("webhooks.send", 1, send)):
            out.append(await timed(name, n, callers, call, pids=pids, reset=reset))
    finally:
        await app.close()
        await conn.close()
        await admin.close()
    return out


# -- pgqueuer's side (asyncpg) ---------------------------------------------------------------

async def pgqueuer_side(dsn: str, n: int) -> list[dict[str, Any]]:
    import uuid

    import asyncpg
    from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Queries

    conn = await asyncpg.connect(dsn)
    admin = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))  # pgqueuer's quick start
    pool = await asyncpg.create_pool(dsn)
    pooled = Queries(AsyncpgPoolDriver(pool))

    async def pids() -> list[int]:
        rows = await admin.fetch("SELECT pid FROM pg_stat_activity WHERE datname = "
                                 "current_database() AND pid <> pg_backend_pid()")
        return [r[0] for r in rows]

    async def reset() -> None:
        await admin.execute("TRUNCATE notifyq.job_run CASCADE")
        await admin.execute("TRUNCATE pgqueuer, pgqueuer_log RESTART IDENTITY")

    async def select1(i: int) -> None:
        await conn.fetchval("SELECT 1")

    async def insert_bare(i: int) -> None:
        await conn.execute(BARE, uuid.uuid4(), f'{{"i": {i}}}')

    async def enqueue(i: int) -> None:
        await queries.enqueue("noop", str(i).encode())

    async def enqueue_pooled(i: int) -> None:
        await pooled.enqueue("noop", str(i).encode())

    out = []
    try:
        for name, callers, call in (("asyncpg SELECT 1", 1, select1),
                                    ("asyncpg bare INSERT", 1, insert_bare),
                                    ("pgqueuer enqueue, one connection", 1, enqueue),
                                    ("pgqueuer enqueue, one connection", 8, enqueue),
                                    ("pgqueuer enqueue, pool", 8, enqueue_pooled)):
            out.append(await timed(name, n, callers, call, pids=pids, reset=reset))
    finally:
        await pool.close()
        await conn.close()
        await admin.close()
    return out


# -- the rounds --------------------------------------------------------------------------------

def setup() -> None:
    import psycopg
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    subprocess.run([sys.executable, "-m", "notifyq", "migrate"], check=True, cwd=ROOT,
                   env={**os.environ, "NOTIFYQ_DATABASE_URL": dsn_of(DB),
                        "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    if not PGQ_PYTHON.exists():
        return
    subprocess.run([str(PGQ_PYTHON), "-c", (
        "import asyncio, asyncpg\nfrom pgqueuer import AsyncpgDriver, Queries\n"
        f"async def go():\n    c = await asyncpg.connect({dsn_of(DB)!r})\n"
        "    await Queries(AsyncpgDriver(c)).install()\n    await c.close()\n"
        "asyncio.run(go())")], check=True)


def teardown() -> None:
    import psycopg
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def child(label: str, python: str, pythonpath: str | None, side: str,
          n: int) -> list[dict[str, Any]]:
    env = {**os.environ}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([python, "-P", __file__, "--side", side, "--n", str(n)],
                          env=env, capture_output=True, text=True, check=False, cwd="/")
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    out = proc.stdout
    rows: list[dict[str, Any]] = json.loads(out)
    for row in rows:
        row["side"] = label
    return rows


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--before", metavar="DIR", help="also a copy of notifyq from DIR")
    parser.add_argument("--side", choices=("notifyq", "pgqueuer"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.side == "notifyq":
        print(json.dumps(asyncio.run(notifyq_side(dsn_of(DB), args.n))))
        return
    if args.side == "pgqueuer":
        print(json.dumps(asyncio.run(pgqueuer_side(dsn_of(DB), args.n))))
        return
    sides = [("notifyq", sys.executable, str(ROOT), "notifyq")]
    if args.before:
        sides.append(("before", sys.executable, args.before, "notifyq"))
    if PGQ_PYTHON.exists():
        sides.append(("pgqueuer", str(PGQ_PYTHON), None, "pgqueuer"))
    else:
        print(f"pgqueuer's side left out: no {PGQ_PYTHON} (bench/compare --peer pgqueuer "
              "makes it)", file=sys.stderr)
    setup()
    rows: list[dict[str, Any]] = []
    loads = [load()]
    try:
        for r in range(args.rounds):
            k = r % len(sides)
            for label, python, path, side in sides[k:] + sides[:k]:
                rows += child(label, python, path, side, args.n)
            loads.append(load())
            print(f"round {r + 1}/{args.rounds} done, load {loads[-1]}", file=sys.stderr)
    finally:
        teardown()
    if args.json:
        print(json.dumps({"rows": rows, "load": loads}))
        return
    report(rows, loads)


def report(rows: list[dict[str, Any]], loads: list[str]) -> None:
    keys = list(dict.fromkeys((r["side"], r["part"], r["callers"]) for r in rows))
    print(f"load average (1/5/15) per round: {'; '.join(loads)}")
    print("| side | part | callers | calls/s median (range) | wall us | client CPU us "
          "| server CPU us | p50 / p99 us |")
    print("|---|---|---:|---|---:|---:|---:|---|")
    for side, part, callers in keys:
        cell = [r for r in rows if (r["side"], r["part"], r["callers"]) == (side, part, callers)]
        rate = [r["per_s"] for r in cell]

        def med(key: str, cell: list[dict[str, Any]] = cell) -> str:
            return f"{statistics.median(r[key] for r in cell):.0f}"
        print(f"| {side} | {part} | {callers} | {statistics.median(rate):,.0f} "
              f"({min(rate):,}-{max(rate):,}) | {med('wall_us')} | {med('client_cpu_us')} "
              f"| {med('server_cpu_us')} | {med('p50_us')} / {med('p99_us')} |")


if __name__ == "__main__":
    main()
