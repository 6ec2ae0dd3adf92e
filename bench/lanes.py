"""Fresh webhooks during a retry storm: the latency of first attempts to a healthy endpoint while
another endpoint's deliveries keep failing, with the lanes (migration 0027) and without.

    python bench/lanes.py                  # both claims, with and without a storm (~2 min)
    python bench/lanes.py --quick          # a smoke run (CI)
    python bench/lanes.py --json

Each cell gets a fresh database, two real ``python -m notifyq worker --concurrency 10``
processes and a receiver on 127.0.0.1 (in this process, on its own thread): ``/failing``
answers 500 after ``--fail-ms`` (each attempt holds a slot that long), ``/healthy`` 200 at once.
A storm is ``--storm`` messages to the failing endpoint, retried every 0.5 s (no circuit
breaker), its share set to 50 (a busy endpoint's share before it starts failing). Once every one
of them has failed at least once, ``--fresh`` messages go to the healthy endpoint, one every
20 ms; each one's latency is from its ``send()`` to its arrival. ``--claim main`` installs
migration 0021's keyed claim (before the lanes) in the cell's database: the same workers, the
claim of the main branch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from notifyq import App, WebhookMessage  # noqa: E402
from tests import vault  # noqa: E402
from tests.conftest import ADMIN_DSN, dsn_for, fast_settings  # noqa: E402

FAIL = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nfail"
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
KEYS = f"1:{vault.b64(vault.KEY1)}"


class Receiver:
    """HTTP/1.1 keep-alive on 127.0.0.1: arrivals of /healthy by webhook-id (monotonic clock),
    a count of /failing."""

    def __init__(self, fail_s: float) -> None:
        self.fail_s = fail_s
        self.arrivals: dict[str, float] = {}
        self.failed = 0
        self.port = 0
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _run(self) -> None:
        async def main() -> None:
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await server.serve_forever()
        asyncio.run(main())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrival = time.monotonic()
                lines = head.split(b"\r\n")
                fields = {k.strip().lower(): v.strip() for k, _, v in
                          (line.partition(b":") for line in lines[1:])}
                await reader.readexactly(int(fields.get(b"content-length", b"0")))
                if lines[0].split(b" ")[1] == b"/failing":
                    self.failed += 1
                    await asyncio.sleep(self.fail_s)
                    writer.write(FAIL)
                else:
                    self.arrivals.setdefault(fields[b"webhook-id"].decode(), arrival)
                    writer.write(OK)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def _database() -> str:
    name = f"nq_lanes_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def _drop(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _main_claim() -> str:
    text = (ROOT / "db/migrations/0021_webhook_delivery_path.sql").read_text()
    start = text.index("CREATE OR REPLACE FUNCTION _claim_keyed")
    return text[start:text.index("-- The rows of a batch", start)]


def _worker(dsn: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_KEYS": KEYS,
           "NOTIFYQ_ACTIVE_KEY_VERSION": "1", "PYTHONPATH": str(ROOT),
           "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8",
           "NOTIFYQ_WEBHOOKS__BREAKER_FAILURES": "0", "NOTIFYQ_WEBHOOKS__JITTER": "0",
           "NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S": json.dumps([0] + [0.5] * 99),
           "NOTIFYQ_POOL_MAX_SIZE": "4"}
    return subprocess.Popen([sys.executable, "-m", "notifyq", "worker", "--app",
                             "tests.apps.webhooks:app", "--concurrency", "10"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def cell(claim: str, storm: int, fresh: int, fail_s: float) -> dict[str, Any]:
    name = _database()
    dsn = dsn_for(name)
    receiver = Receiver(fail_s)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        app = App(settings=fast_settings(dsn, keys=KEYS, active_key_version=1,
                                         webhooks={"allowed_networks": ["127.0.0.0/8"]}))
        async with app:
            await app.migrate()
            failing = await app.webhooks.create_endpoint(receiver.url("/failing"))
            healthy = await app.webhooks.create_endpoint(receiver.url("/healthy"))
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO notifyq.key_concurrency (key, concurrency_limit) "
                             "VALUES (%s, 50)", (f"webhook:{failing.id}",))
                if claim == "main":
                    conn.execute("SET search_path = notifyq, public")
                    conn.execute(_main_claim())  # type: ignore[arg-type]
            workers = [_worker(dsn), _worker(dsn)]
            with psycopg.connect(dsn, autocommit=True) as conn:
                while conn.execute(  # noqa: ASYNC110 - polled: another process's row
                        "SELECT count(*) FROM notifyq.worker").fetchone() != (2,):
                    await anyio.sleep(0.05)
            await anyio.sleep(1)  # past their first claims
            if storm:
                await app.webhooks.send_many([WebhookMessage("e", {"n": n},
                                                             endpoint_id=failing.id)
                                              for n in range(storm)])
                while receiver.failed < storm + 100:  # noqa: ASYNC110 - another thread's
                    await anyio.sleep(0.05)
            sent: dict[str, float] = {}
            failed_before = receiver.failed
            for n in range(fresh):
                started = time.monotonic()
                message = await app.webhooks.send("e", {"n": n}, endpoint_id=healthy.id)
                sent[message.id] = started
                await anyio.sleep(0.02)
            deadline = time.monotonic() + 120
            while len(receiver.arrivals) < fresh and (  # noqa: ASYNC110 - another thread's
                    time.monotonic() < deadline):
                await anyio.sleep(0.05)
            retries = receiver.failed - failed_before
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(20)
        _drop(name)
    waits = sorted((receiver.arrivals[m] - s) * 1000 for m, s in sent.items()
                   if m in receiver.arrivals)
    return {"claim": claim, "storm": storm, "delivered": len(waits), "fresh": fresh,
            "p50_ms": round(statistics.median(waits), 1) if waits else None,
            "p99_ms": round(waits[min(len(waits) - 1, int(len(waits) * 0.99))], 1)
            if waits else None,
            "retries_meanwhile": retries}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke)")
    parser.add_argument("--storm", type=int, default=1000)
    parser.add_argument("--fresh", type=int, default=200)
    parser.add_argument("--fail-ms", type=float, default=50.0)
    parser.add_argument("--claim", action="append", choices=["lanes", "main"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.storm, args.fresh = 100, 20
    results = []
    for claim in args.claim or ["lanes", "main"]:
        for storm in (0, args.storm):
            results.append(await cell(claim, storm, args.fresh, args.fail_ms / 1000))
            if not args.json:
                r = results[-1]
                print(f"claim {r['claim']:5}  storm {r['storm']:5}  fresh delivered "
                      f"{r['delivered']}/{r['fresh']}  p50 {r['p50_ms']} ms  p99 "
                      f"{r['p99_ms']} ms  failing attempts meanwhile "
                      f"{r['retries_meanwhile']}", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    anyio.run(main)
