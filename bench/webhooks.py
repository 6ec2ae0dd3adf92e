"""Webhook delivery: end-to-end latency and throughput to a fast local receiver.

    python bench/webhooks.py [--samples 300] [--messages 4000] [--concurrency 50] [--dsn ...]

Drops and recreates the scratch database ``notifyq_bench_webhooks``. Three processes, as in a
deployment: this one sends; the worker is a real ``python -m notifyq worker`` (configured through
``NOTIFYQ_*``: the keyring, ``webhooks.allowed_networks=127.0.0.0/8``, ``--concurrency``); the
receiver is a bare asyncio HTTP/1.1 server on 127.0.0.1 answering 200 at once (keep-alive) that
prints each request's ``webhook-id`` and its arrival time on CLOCK_MONOTONIC, which is shared by
every process on the machine.

- ``latency``: an idle worker; one message at a time, 20-40 ms apart; latency = arrival at the
  receiver minus the moment ``app.webhooks.send(...)`` was called (so it includes the send's
  own transaction, the NOTIFY, the claim, the load + decrypt + sign, the POST and nothing
  after), and minus the moment it returned (committed). p50/p90/p99/max of each.
- ``throughput``: N messages fanned out to 1 and to 20 endpoints, sent in one transaction while
  the worker is up and idle: deliveries per second from that commit to the last arrival.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import threading
import time

import anyio
import psycopg

from notifyq import App
from notifyq._settings import Settings

DATABASE = "notifyq_bench_webhooks"
KEY = base64.b64encode(os.urandom(32)).decode()

RECEIVER = r'''
import asyncio, sys, time
out = sys.stdout
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            now = time.monotonic()
            length, msg = 0, b""
            for line in head.split(b"\r\n"):
                low = line.lower()
                if low.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
                elif low.startswith(b"webhook-id:"):
                    msg = line.split(b":", 1)[1].strip()
            if length:
                await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            out.write(f"{msg.decode()} {now}\n")
            out.flush()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
'''


class Receiver:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.arrivals: dict[str, float] = {}
        self.count = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg, at = line.split()
            self.arrivals[msg] = float(at)
            self.count += 1

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _recreate(admin: str) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return psycopg.conninfo.make_conninfo(admin, dbname=DATABASE)


def _app(dsn: str) -> App:
    return App(settings=Settings(
        database_url=dsn, keys=f"1:{KEY}", active_key_version=1, log_level="WARNING",
        webhooks={"allowed_networks": ["127.0.0.0/8"]}))  # type: ignore[arg-type]


class Worker:
    """``python -m notifyq worker`` in its own process, configured like the sender's App."""

    def __init__(self, dsn: str, concurrency: int) -> None:
        env = {**os.environ, "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_KEYS": f"1:{KEY}",
               "NOTIFYQ_ACTIVE_KEY_VERSION": "1", "NOTIFYQ_LOG_LEVEL": "WARNING",
               "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8"}
        self.dsn = dsn
        self.proc = subprocess.Popen([sys.executable, "-m", "notifyq", "worker",
                                      "--concurrency", str(concurrency)], env=env)

    async def ready(self) -> None:
        """Once its listener is connected (a NOTIFY now wakes it)."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            while not (await (await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'notifyq-listener'")).fetchone() or (0,))[0]:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the worker exited with {self.proc.returncode}")
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)  # its producers go idle after their first (empty) claims

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _wait(check: object, timeout: float = 120.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the receiver did not get every message")
        await anyio.sleep(0.001)


async def latency(dsn: str, receiver: Receiver, samples: int) -> dict[str, dict[str, float]]:
    app = _app(dsn)
    async with app:
        await app.webhooks.create_endpoint(f"http://127.0.0.1:{receiver.port}/lat",
                                           event_types=["bench.latency"])
        worker = Worker(dsn, 10)
        try:
            await worker.ready()
            return await _latency_samples(app, receiver, samples)
        finally:
            worker.stop()


async def _latency_samples(app: App, receiver: Receiver,
                           samples: int) -> dict[str, dict[str, float]]:
    from_call, from_commit = [], []
    for i in range(samples + 20):
        started = time.monotonic()
        sent = await app.webhooks.send("bench.latency", {"i": i})
        committed = time.monotonic()
        await _wait(lambda sent=sent: sent.id in receiver.arrivals)
        if i >= 20:  # warm-up excluded
            from_call.append((receiver.arrivals[sent.id] - started) * 1000)
            from_commit.append((receiver.arrivals[sent.id] - committed) * 1000)
        await anyio.sleep(0.02 + 0.02 * (i % 2))
    return {"from send() called": _percentiles(from_call),
            "from send() returned (committed)": _percentiles(from_commit)}


def _percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"p50_ms": statistics.median(values),
            "p90_ms": values[int(len(values) * 0.90) - 1],
            "p99_ms": values[int(len(values) * 0.99) - 1], "max_ms": values[-1]}


async def throughput(dsn: str, receiver: Receiver, messages: int, endpoints: int,
                     concurrency: int) -> float:
    app = _app(dsn)
    event = f"bench.fanout{endpoints}"
    async with app:
        for n in range(endpoints):
            await app.webhooks.create_endpoint(f"http://127.0.0.1:{receiver.port}/t{n}",
                                               event_types=[event])
        per = messages // endpoints
        target = receiver.count + per * endpoints
        worker = Worker(dsn, concurrency)
        try:
            await worker.ready()
            async with (await app.pool()).connection() as conn:
                async with conn.transaction():
                    for i in range(per):
                        await app.webhooks.send(event, {"i": i}, conn=conn)
                started = time.monotonic()  # committed: every delivery is runnable from now
            await _wait(lambda: receiver.count >= target)
            elapsed = time.monotonic() - started
        finally:
            worker.stop()
    return per * endpoints / elapsed


async def _migrate(dsn: str) -> None:
    async with _app(dsn) as app:
        await app.migrate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "NOTIFYQ_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    dsn = _recreate(args.dsn)
    anyio.run(_migrate, dsn)
    receiver = Receiver()
    try:
        for origin, lat in anyio.run(latency, dsn, receiver, args.samples).items():
            print(f"latency to the receiver, {origin} (idle worker): " + ", ".join(
                f"{k} {v:.2f}" for k, v in lat.items()))
        for endpoints in (1, 20):
            rate = anyio.run(throughput, dsn, receiver, args.messages, endpoints,
                             args.concurrency)
            print(f"throughput, {endpoints:>2} endpoint(s), concurrency {args.concurrency}: "
                  f"{rate:,.0f} deliveries/s")
    finally:
        receiver.stop()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
