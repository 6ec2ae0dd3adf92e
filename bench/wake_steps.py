#!/usr/bin/env python3
"""bench/wake_steps.py: an in-process worker's wake-up (enqueue -> handler start) cut into steps.

    bench/wake_steps.py                     # 300 probes, under a 2,000 runs/s load
    bench/wake_steps.py --rate 0            # an idle worker
    bench/wake_steps.py --probes 500 --json

Like bench/compare's latency cells (same load driver: bench/peers/notifyq.py, batches of 20
every 10 ms from another process; probes 20-50 ms apart from this one, a worker at concurrency
10), but with timestamps around the worker's own steps, taken by wrapping private methods
(``Completer.claim``, ``Completer._statement``): a diagnostic, not a benchmark of record. Per
probe run:

- ``asked``: the enqueue returned -> the producer asked for the claim that took the run (the
  NOTIFY's way to the listener and the producer's turn; 0 when the claim was asked before the
  enqueue returned, and left out when the completer chained the claim itself);
- ``queued``: asked -> the claim's statement was sent (waiting for a free completer lane);
- ``statement``: sent -> answered;
- ``started``: answered -> the handler started;
- ``total``: the enqueue returned -> the handler started (bench/compare's figure).

Uses its own database ``notifyq_wake_steps`` (dropped and recreated, dropped at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from notifyq import App, JobContext  # noqa: E402
from notifyq._dispatch.completer import Claim, Completer  # noqa: E402
from notifyq._settings import load_settings  # noqa: E402

DATABASE = "notifyq_wake_steps"
STEPS = ("asked", "queued", "statement", "started", "total")


class Steps:
    """Timestamps of the probe runs' claims, from wrapped completer methods."""

    def __init__(self) -> None:
        self.claimed: dict[int, tuple[float | None, float, float]] = {}  # i -> asked, sent, back
        self.started: dict[int, float] = {}

    def install(self) -> None:
        claim, statement = Completer.claim, Completer._statement
        steps = self

        async def timed_claim(completer: Completer, request: Claim) -> Claim:
            if not request.queued:
                request.asked = time.perf_counter()  # type: ignore[attr-defined]
            return await claim(completer, request)

        async def timed_statement(completer: Completer, conn: Any, params: dict[str, Any],
                                  request: Claim | None) -> list[dict[str, Any]]:
            sent = time.perf_counter()
            rows = await statement(completer, conn, params, request)
            back = time.perf_counter()
            asked = getattr(request, "asked", None)
            for row in rows:
                i = (row["input"] or {}).get("i", -1) if row["claimed"] else -1
                if i >= 0:
                    steps.claimed[i] = (asked, sent, back)
            return rows

        Completer.claim = timed_claim  # type: ignore[method-assign]
        Completer._statement = timed_statement  # type: ignore[method-assign]


async def measure(dsn: str, rate: int, probes: int) -> list[dict[str, float]]:
    steps = Steps()
    steps.install()
    app = App(settings=load_settings(database_url=dsn))

    @app.handler("bench.noop")
    async def noop(ctx: JobContext) -> None:
        i = ctx.input.get("i", -1)
        if i >= 0:
            steps.started[i] = time.perf_counter()

    returned: dict[int, float] = {}
    async with app:
        await app.migrate()
        worker = asyncio.create_task(app.run_worker(concurrency=10))
        loader = None
        try:
            await asyncio.sleep(0.5)
            for k in range(5):  # warm-up
                await app.enqueue("bench.noop", {"i": -1 - k})
            if rate:
                loader = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
                    [sys.executable, "-P", str(ROOT / "bench/peers/notifyq.py"), "load",
                     "--dsn", dsn, "--rate", str(rate), "--seconds", str(probes * 0.035 + 30)],
                    stdout=subprocess.DEVNULL)
                await asyncio.sleep(2.0)  # the load's steady state
            rng = random.Random(7)
            for k in range(probes):
                await asyncio.sleep(rng.uniform(0.020, 0.050))
                await app.enqueue("bench.noop", {"i": k})
                returned[k] = time.perf_counter()
            deadline = time.monotonic() + 20
            while len(steps.started.keys() & returned.keys()) < probes:
                if time.monotonic() > deadline:
                    raise SystemExit("probe runs did not start within 20 s")
                await asyncio.sleep(0.05)
        finally:
            if loader is not None:
                loader.send_signal(signal.SIGTERM)
                loader.wait(30)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
    samples = []
    for k, t in returned.items():
        asked, sent, back = steps.claimed[k]
        sample = {"queued": sent - (asked or sent), "statement": back - sent,
                  "started": steps.started[k] - back, "total": steps.started[k] - t}
        if asked is not None:
            sample["asked"] = max(0.0, asked - t)
        samples.append({name: seconds * 1000 for name, seconds in sample.items()})
    return samples


def summary(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for step in STEPS:
        values = sorted(s[step] for s in samples if step in s)
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        out[step] = {"n": len(values), "p50_ms": round(cuts[49], 2),
                     "p90_ms": round(cuts[89], 2), "p99_ms": round(cuts[98], 2),
                     "max_ms": round(values[-1], 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rate", type=int, default=2000, help="load, runs/s (0: idle)")
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    dsn = psycopg.conninfo.make_conninfo(args.admin_dsn, dbname=DATABASE)
    try:
        result = summary(asyncio.run(measure(dsn, args.rate, args.probes)))
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    if args.json:
        print(json.dumps({"rate": args.rate, "probes": args.probes, "steps": result}))
        return
    print(f"wake-up in steps, {args.probes} probes, load {args.rate} runs/s (ms)")
    for step, cut in result.items():
        print(f"  {step:10} p50 {cut['p50_ms']:6.2f}  p90 {cut['p90_ms']:6.2f}  "
              f"p99 {cut['p99_ms']:6.2f}  max {cut['max_ms']:6.2f}  (n={cut['n']})")


if __name__ == "__main__":
    main()
