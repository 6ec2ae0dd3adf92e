"""The measurement harness shared by every driver in ``bench/peers/``.

Each driver (``bench/peers/<peer>.py``) runs under its peer's own interpreter and virtualenv and
imports only this module, the peer's package and psycopg (every peer's venv has it). A driver
defines a :class:`Peer` subclass that says how *that* queue enqueues, runs a worker and proves a
drain in its own tables; the cells and the clocks are here, identical for all.

Cells (every cell is repeated ``repeats`` times on an emptied queue; ``bench/compare`` reports
the median):

* ``enqueue_1`` / ``enqueue_8``: the peer's single-job enqueue call from 1 and from 8 concurrent
  asyncio tasks; jobs/s.
* ``bulk``: the peer's bulk call in batches of 1,000; jobs/s.
* ``drain``: ``drain_n`` jobs enqueued untimed (bulk), the database ``ANALYZE``d (as
  autovacuum would have it on a user's), then one worker at concurrency 10 in this
  process; timed from the worker's start until every job is done (the peer's own burst mode
  when it has one, else the worker runs until SQL shows all done and is then stopped). Then SQL
  in the peer's own tables must show every job completed exactly once, and the handler must
  have run exactly ``drain_n`` times, or the cell fails.
* ``drain_defaults`` / ``drain_100`` (the peers that list them): the same drain with the
  worker at the peer's own defaults (nothing passed that its documentation leaves out), and at
  concurrency 100.
* ``latency_idle``: a running worker (concurrency 10), nothing else queued; ``latency_n`` jobs
  enqueued one by one 20-50 ms apart (seeded); latency = ``perf_counter`` at the handler's first
  line minus ``perf_counter`` right after the enqueue call returned (after its commit).
* ``latency_load``: the same, while a separate process (this driver's ``load`` command, same
  interpreter) enqueues ``load_rate`` other jobs/s with the peer's bulk call (batches of 20
  every 10 ms) for the worker to run too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import psycopg


@dataclass(frozen=True)
class Sizes:
    enqueue_n: int = 2000
    bulk_n: int = 20_000
    bulk_batch: int = 1000
    drain_n: int = 20_000
    concurrency: int = 10
    latency_n: int = 200
    load_rate: int = 2000
    repeats: int = 3
    cell_timeout_s: float = 150.0


QUICK = Sizes(enqueue_n=200, bulk_n=2000, drain_n=1000, latency_n=20, repeats=1,
              cell_timeout_s=60.0)

CELLS = ("enqueue_1", "enqueue_8", "bulk", "drain", "latency_idle", "latency_load")


class CellError(Exception):
    """A cell could not produce an honest number (e.g. a drain was not exactly-once)."""


# -- what the handlers report -------------------------------------------------------------------

class Probe:
    """Every peer's no-op handler calls :func:`started` with the job's ``i`` first thing."""

    executed = 0
    tracking = False
    starts: dict[int, float] = {}  # noqa: RUF012 - process-global on purpose


def started(i: Any) -> None:
    Probe.executed += 1
    if Probe.tracking and isinstance(i, int) and i >= 0:
        Probe.starts[i] = time.perf_counter()


# -- the peer interface ---------------------------------------------------------------------------

class Peer:
    """What a driver implements. ``i`` is a job's integer argument: >= 0 for measured jobs."""

    name = "?"
    #: the peer has a documented "run until the queue is empty, then return" worker mode
    has_burst = False
    #: the cells a plain ``run`` measures
    cells: tuple[str, ...] = CELLS

    async def extra_cell(self, cell: str, sizes: Sizes) -> Any:
        raise CellError(f"unknown cell {cell!r}")

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def meta(self) -> dict[str, Any]:
        """Versions and the settings in use, for the results."""
        return {}

    async def setup(self) -> None:
        """Install the peer's schema in the (fresh) database and open its client."""

    async def open_client(self) -> None:
        """Open an enqueue-only client (the ``load`` process; schema already there)."""
        await self.setup()

    async def close(self) -> None: ...

    async def reset(self) -> None:
        """Empty the peer's job tables."""
        raise NotImplementedError

    async def enqueue(self, i: int) -> None:
        raise NotImplementedError

    async def enqueue_from(self, callers: int) -> None:
        """Called before an ``enqueue_N`` cell: a peer whose documented single-caller path
        differs from its concurrent one (pgqueuer: one connection, or a pool) switches here."""

    async def enqueue_many(self, ids: list[int]) -> None:
        raise NotImplementedError

    async def start_worker(self, concurrency: int | None) -> None:
        """``concurrency`` None: the worker at the peer's own defaults."""
        raise NotImplementedError

    async def stop_worker(self) -> None:
        raise NotImplementedError

    async def burst(self, concurrency: int | None) -> None:
        """Run a worker until the queue is empty (peers with ``has_burst``); ``concurrency``
        None: at the peer's own defaults."""
        raise NotImplementedError

    async def done_count(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """How many jobs are finished successfully (SQL; for peers without burst)."""
        raise NotImplementedError

    async def verify(self, conn: psycopg.AsyncConnection[Any], n: int) -> dict[str, Any]:
        """SQL facts proving each of the ``n`` jobs completed exactly once; raise if not."""
        raise NotImplementedError


async def sql_one(conn: psycopg.AsyncConnection[Any], query: Any, params: Any = None) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    return row if row is None or len(row) > 1 else row[0]


def expect(facts: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    wrong = {k: (facts.get(k), v) for k, v in expected.items() if facts.get(k) != v}
    if wrong:
        raise CellError(f"drain not exactly-once: (got, expected) {wrong}; facts {facts}")
    return facts


# -- cells -----------------------------------------------------------------------------------------

async def _rate(n: int, go: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await go()
    return round(n / (time.perf_counter() - t0), 1)


async def cell_enqueue(peer: Peer, sizes: Sizes, callers: int) -> float:
    each = sizes.enqueue_n // callers
    await peer.enqueue_from(callers)

    async def caller(base: int, count: int) -> None:
        for k in range(count):
            await peer.enqueue(base + k)

    async def all_callers(count: int) -> None:
        await asyncio.gather(*(caller(c * count, count) for c in range(callers)))

    await peer.reset()
    await all_callers(max(5, 50 // callers))  # warm-up
    await peer.reset()
    return await _rate(each * callers, lambda: all_callers(each))


async def cell_bulk(peer: Peer, sizes: Sizes) -> float:
    n, b = sizes.bulk_n, sizes.bulk_batch
    batches = [list(range(s, min(s + b, n))) for s in range(0, n, b)]
    await peer.reset()
    await peer.enqueue_many(batches[0])  # warm-up
    await peer.reset()

    async def go() -> None:
        for batch in batches:
            await peer.enqueue_many(batch)
    return await _rate(n, go)


async def _enqueue_untimed(peer: Peer, n: int) -> None:
    for s in range(0, n, 1000):
        await peer.enqueue_many(list(range(s, min(s + 1000, n))))


async def cell_drain(peer: Peer, sizes: Sizes, concurrency: int | None,
                     n: int | None = None) -> dict[str, Any]:
    n = n or sizes.drain_n
    await peer.reset()
    await _enqueue_untimed(peer, n)
    Probe.executed = 0
    async with await psycopg.AsyncConnection.connect(peer.dsn, autocommit=True) as conn:
        # Every peer's tables analyzed, as autovacuum would have them on a user's database:
        # plans that only stats bring (good or bad) are part of what a user gets.
        await conn.execute("ANALYZE")
        t0 = time.perf_counter()
        if peer.has_burst:
            await peer.burst(concurrency)
        else:
            await peer.start_worker(concurrency)
            try:
                while await peer.done_count(conn) < n:  # noqa: ASYNC110 - SQL is the truth
                    await asyncio.sleep(0.02)
            finally:
                elapsed = time.perf_counter() - t0
                await peer.stop_worker()
        if peer.has_burst:
            elapsed = time.perf_counter() - t0
        facts = await peer.verify(conn, n)
    if Probe.executed != n:
        raise CellError(f"handler ran {Probe.executed} times for {n} jobs")
    return {"jobs_per_s": round(n / elapsed, 1), "seconds": round(elapsed, 3),
            "verified": {**facts, "handler_calls": Probe.executed}}


def _percentiles(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {"n": len(samples), "p50_ms": round(cuts[49], 2), "p95_ms": round(cuts[94], 2),
            "p99_ms": round(cuts[98], 2), "max_ms": round(samples[-1], 2)}


async def _wait_started(ids: set[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not ids <= Probe.starts.keys():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def cell_latency(peer: Peer, sizes: Sizes, driver: str, load: bool) -> dict[str, Any]:
    await peer.reset()
    Probe.starts = {}
    loader: subprocess.Popen[bytes] | None = None
    await peer.start_worker(sizes.concurrency)
    try:
        Probe.tracking = True
        for k in range(5):  # warm-up; also proves the worker is up and listening
            await peer.enqueue(10_000_000 + k)
            if not await _wait_started({10_000_000 + k}, 30):
                raise CellError("warm-up job did not start within 30 s")
        if load:
            seconds = sizes.latency_n * 0.035 + 30
            loader = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
                [sys.executable, "-P", driver, "load", "--dsn", peer.dsn,
                 "--rate", str(sizes.load_rate), "--seconds", str(seconds)],
                stdout=subprocess.PIPE)
            await asyncio.sleep(2.0)  # let the load reach its steady state
        rng = random.Random(7)
        committed: dict[int, float] = {}
        for k in range(sizes.latency_n):
            await asyncio.sleep(rng.uniform(0.020, 0.050))
            await peer.enqueue(k)
            committed[k] = time.perf_counter()
        complete = await _wait_started(set(committed), 20 if load else 30)
    finally:
        Probe.tracking = False
        load_info: dict[str, Any] = {}
        if loader is not None:
            loader.send_signal(signal.SIGTERM)
            try:
                out, _ = loader.communicate(timeout=30)
                load_info = json.loads(out.decode() or "{}")
            except (subprocess.TimeoutExpired, ValueError):
                loader.kill()
                loader.wait()
        await peer.stop_worker()
    samples = [(Probe.starts[k] - t) * 1000 for k, t in committed.items() if k in Probe.starts]
    out = _percentiles(samples) if len(samples) > 2 else {"n": len(samples)}
    out["missing"] = len(committed) - len(samples)
    if not complete:
        out["note"] = f"{out['missing']} jobs had not started 20 s after the last enqueue"
    if load_info:
        out["load"] = load_info
    return out


async def run_load(peer: Peer, rate: int, seconds: float) -> dict[str, Any]:
    """Enqueue ``rate`` jobs/s (i = -1) in batches of 20 every 10 ms until SIGTERM/``seconds``."""
    await peer.open_client()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    batch = max(1, rate // 100)
    sent = late = 0
    t0 = time.perf_counter()
    k = 0
    while not stop.is_set() and time.perf_counter() - t0 < seconds:
        await peer.enqueue_many([-1] * batch)
        sent += batch
        k += 1
        delay = t0 + k * 0.01 - time.perf_counter()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        else:
            late += 1
    elapsed = time.perf_counter() - t0
    await peer.close()
    return {"enqueued": sent, "seconds": round(elapsed, 2), "rate": round(sent / elapsed, 1),
            "late_batches": late}


async def _timed(coro: Awaitable[Any], limit_s: float) -> Any:
    return await asyncio.wait_for(coro, limit_s)


def _cell(peer: Peer, sizes: Sizes, cell: str, driver: str) -> Awaitable[Any]:
    """One repeat of ``cell``, not yet awaited."""
    cells: dict[str, Callable[[], Awaitable[Any]]] = {
        "enqueue_1": lambda: cell_enqueue(peer, sizes, 1),
        "enqueue_8": lambda: cell_enqueue(peer, sizes, 8),
        "bulk": lambda: cell_bulk(peer, sizes),
        "drain": lambda: cell_drain(peer, sizes, sizes.concurrency),
        "drain_defaults": lambda: cell_drain(peer, sizes, None),
        "drain_100": lambda: cell_drain(peer, sizes, 100),
        "latency_idle": lambda: cell_latency(peer, sizes, driver, load=False),
        "latency_load": lambda: cell_latency(peer, sizes, driver, load=True)}
    make = cells.get(cell)
    return make() if make is not None else peer.extra_cell(cell, sizes)


async def run_cells(peer: Peer, sizes: Sizes, cells: list[str], driver: str) -> dict[str, Any]:
    report: dict[str, Any] = {"peer": peer.name, "meta": peer.meta(), "sizes": asdict(sizes),
                              "cells": {}}
    await peer.setup()
    try:
        for cell in cells:
            runs: list[Any] = []
            errors: list[str] = []
            for _ in range(sizes.repeats):
                try:
                    coro = _cell(peer, sizes, cell, driver)
                    runs.append(await _timed(coro, sizes.cell_timeout_s))
                except (Exception, TimeoutError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}"[:500])
                    traceback.print_exc(file=sys.stderr)
                    await _recover(peer)
                    if isinstance(exc, TimeoutError):
                        break  # a timed-out cell would time out again: do not burn the budget
            report["cells"][cell] = {"runs": runs, "errors": errors}
            print(f"[{peer.name}] {cell}: {_brief(runs)} {errors or ''}", file=sys.stderr,
                  flush=True)
    finally:
        await peer.close()
    return report


async def _recover(peer: Peer) -> None:
    try:
        await asyncio.wait_for(peer.stop_worker(), 30)
    except Exception:
        traceback.print_exc(file=sys.stderr)


def _brief(runs: list[Any]) -> str:
    def one(r: Any) -> str:
        if isinstance(r, dict):
            return str(r.get("jobs_per_s") or r.get("p99_ms") or r)
        return str(r)
    return ", ".join(one(r) for r in runs)


def main(make_peer: Callable[[str], Peer], driver_file: str) -> None:
    parser = argparse.ArgumentParser(description="bench/compare driver (prints JSON)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--dsn", required=True)
    run.add_argument("--quick", action="store_true")
    run.add_argument("--repeats", type=int)
    run.add_argument("--cell", action="append", help="only these cells (repeatable)")
    run.add_argument("--out", help="write the JSON here (default stdout)")
    sub.add_parser("cells", help="print the cells a plain run measures (JSON)")
    ld = sub.add_parser("load")
    ld.add_argument("--dsn", required=True)
    ld.add_argument("--rate", type=int, default=2000)
    ld.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    if args.cmd == "cells":  # the class's own list: nothing is opened
        print(json.dumps(list(getattr(make_peer, "cells", CELLS))))
        return
    if args.cmd == "load":
        result = asyncio.run(run_load(make_peer(args.dsn), args.rate, args.seconds))
        print(json.dumps(result))
        return
    sizes = QUICK if args.quick else Sizes()
    if args.repeats:
        sizes = replace(sizes, repeats=args.repeats)
    peer = make_peer(args.dsn)
    cells = args.cell or list(peer.cells)
    report = asyncio.run(run_cells(peer, sizes, cells, os.path.abspath(driver_file)))
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        print(text)
