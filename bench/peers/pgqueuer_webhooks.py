"""bench/webhooks.py's baseline: webhooks on pgqueuer, as a user would write them in an afternoon.

Run with bench/.venvs/pgqueuer-webhooks/bin/python (pgqueuer, asyncpg, httpx, standardwebhooks).
One pgqueuer job per (message, endpoint), enqueued in one batch call
(``Queries(AsyncpgDriver(conn)).enqueue(entrypoints, payloads, priorities)``, one transaction);
the worker is ``QueueManager(...).run(batch_size=..., max_concurrent_tasks=C)`` with one
``@qm.entrypoint("deliver")`` that signs the body with ``standardwebhooks.Webhook(secret).sign``
and POSTs it with one shared ``httpx.AsyncClient()`` (defaults), raising on a non-2xx answer.
No attempt log, no SSRF guard, no per-endpoint limit; secrets in clear in a table.

    python pgqueuer_webhooks.py install  --dsn DSN --endpoint URL SECRET [--endpoint ...]
    python pgqueuer_webhooks.py worker   --dsn DSN --concurrency C      # prints "ready"
    python pgqueuer_webhooks.py enqueue  --dsn DSN --messages N          # prints the commit time
    python pgqueuer_webhooks.py latency  --dsn DSN --samples N           # "sent <id> <t>" lines

Times are ``time.monotonic()`` (CLOCK_MONOTONIC, shared with the bench and the receiver).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import asyncpg  # noqa: E402
import httpx  # noqa: E402
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager  # noqa: E402
from standardwebhooks import Webhook  # noqa: E402

ENDPOINTS = "CREATE TABLE IF NOT EXISTS wh_endpoint (url text PRIMARY KEY, secret text NOT NULL)"


async def install(dsn: str, endpoints: list[list[str]]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
        await conn.execute(ENDPOINTS)
        await conn.executemany("INSERT INTO wh_endpoint VALUES ($1, $2)",
                               [tuple(e) for e in endpoints])
    finally:
        await conn.close()


async def worker(dsn: str, concurrency: int) -> None:
    conn = await asyncpg.connect(dsn)
    secrets = {r["url"]: Webhook(r["secret"]) for r in await conn.fetch(
        "SELECT url, secret FROM wh_endpoint")}
    client = httpx.AsyncClient()
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("deliver")
    async def deliver(job: Job) -> None:
        data = json.loads(job.payload or b"{}")
        body = data["body"]
        now = datetime.now(UTC)
        signature = secrets[data["url"]].sign(data["id"], now, body)
        response = await client.post(data["url"], content=body.encode(), headers={
            "content-type": "application/json", "webhook-id": data["id"],
            "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature})
        response.raise_for_status()

    print("ready", flush=True)
    await qm.run(batch_size=max(1, min(10, concurrency // 2)), max_concurrent_tasks=concurrency)


async def enqueue(dsn: str, messages: int) -> None:
    conn = await asyncpg.connect(dsn)
    urls = [r["url"] for r in await conn.fetch("SELECT url FROM wh_endpoint ORDER BY url")]
    payloads = []
    for i in range(messages):
        msg = f"msg_{uuid.uuid4().hex}"
        body = json.dumps({"type": "bench.fanout", "data": {"i": i}})
        payloads += [json.dumps({"id": msg, "url": url, "body": body}).encode() for url in urls]
    await Queries(AsyncpgDriver(conn)).enqueue(["deliver"] * len(payloads), payloads,
                                               [0] * len(payloads))
    print(time.monotonic(), flush=True)
    await conn.close()


async def latency(dsn: str, samples: int) -> None:
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    url = (await conn.fetchrow("SELECT url FROM wh_endpoint ORDER BY url"))["url"]
    for i in range(samples):
        msg = f"msg_{uuid.uuid4().hex}"
        body = json.dumps({"type": "bench.latency", "data": {"i": i}})
        called = time.monotonic()
        await queries.enqueue("deliver", json.dumps({"id": msg, "url": url,
                                                     "body": body}).encode())
        print(f"sent {msg} {called}", flush=True)
        await asyncio.sleep(random.uniform(0.02, 0.04))
    await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["install", "worker", "enqueue", "latency"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--endpoint", nargs=2, action="append", default=[])
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--messages", type=int, default=0)
    parser.add_argument("--samples", type=int, default=0)
    args = parser.parse_args()
    if args.command == "install":
        asyncio.run(install(args.dsn, args.endpoint))
    elif args.command == "worker":
        asyncio.run(worker(args.dsn, args.concurrency))
    elif args.command == "enqueue":
        asyncio.run(enqueue(args.dsn, args.messages))
    else:
        asyncio.run(latency(args.dsn, args.samples))


if __name__ == "__main__":
    main()
