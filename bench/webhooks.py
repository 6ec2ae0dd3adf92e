"""Webhook delivery side by side: notifyq against webhooks on pgqueuer + httpx.

    python bench/webhooks.py                     # 3 rounds, HTTP, both systems (~10 min)
    python bench/webhooks.py --https             # the same cells over HTTPS too
    python bench/webhooks.py --no-peer --rounds 1
    python bench/webhooks.py --quick             # a smoke run (CI): small sizes, one round
    python bench/webhooks.py --json

Three kinds of process per cell, as in a deployment, on one machine: this one sends; the worker
is a real ``python -m notifyq worker --concurrency C`` (configured through ``NOTIFYQ_*``) or
the baseline's worker (bench/peers/pgqueuer_webhooks.py in its own venv,
bench/.venvs/pgqueuer-webhooks); the receiver (bench/webhook_receiver.py) answers 200 at once
over keep-alive, prints each request's ``webhook-id`` and arrival on CLOCK_MONOTONIC, and checks
every tenth signature. Each cell gets a freshly created database.

**Throughput cells** (``endpoints`` x ``concurrency`` x scheme): E endpoints subscribed to one
event type, N messages (3,000 to one endpoint, 300 to 20) sent in one transaction of the
sender (notifyq: ``send_many``; the baseline: one batch ``enqueue``) while the worker is up
and idle; deliveries/s from the commit
to the last arrival. The receiver must see every (message, endpoint) exactly once, and no bad
signature, or the cell fails. CPU per delivery from the commit to the last arrival: the
worker process's (/proc/<pid>/stat) and PostgreSQL's (every backend of the cell's database,
sampled every 20 ms). The systems alternate cell by cell and round by round (A, B, A, B ...),
so a noisy minute hurts both; best and median per cell are reported, and the ratio of medians.

**Latency** (an idle worker at concurrency 10, one endpoint): one message at a time, 20-40 ms
apart; from the call (``app.webhooks.send`` / the baseline's ``enqueue``) to the arrival, and
how long notifyq's ``send()`` call itself takes. **send_many**: messages/s of
``app.webhooks.send_many`` (1 endpoint each, batches of 1,000), no worker running.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg

# This checkout's notifyq, as the worker processes get (PYTHONPATH), not an installed one.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from notifyq import App
from notifyq._settings import Settings
from tests.webhooks.test_error_kinds import _self_signed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = HERE / ".venvs" / "pgqueuer-webhooks"
PEER_REQUIREMENTS = ["pgqueuer", "asyncpg", "httpx", "standardwebhooks"]
KEY = base64.b64encode(os.urandom(32)).decode()
EVENT = "bench.fanout"
SYSTEMS = ("notifyq", "pgqueuer+httpx")


def log(msg: str) -> None:
    print(f"[webhooks {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the receiver ------------------------------------------------------------------------------

class Receiver:
    """bench/webhook_receiver.py in its own process; arrivals read by a thread."""

    def __init__(self, tls: tuple[Path, Path] | None) -> None:
        cmd = [sys.executable, str(HERE / "webhook_receiver.py")]
        if tls:
            cmd += ["--tls", str(tls[0]), str(tls[1])]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.arrivals: dict[tuple[str, str], float] = {}
        self.duplicates = 0
        self.bad: list[str] = []
        self.count = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if words[0] == "bad":
                self.bad.append(line.strip())
                continue
            key = (words[0], words[1])
            if key in self.arrivals:
                self.duplicates += 1
            else:
                self.arrivals[key] = float(words[2])
                self.count += 1

    def secret(self, path: str, secret: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"secret {path} {secret}\n")
        self.proc.stdin.flush()

    def reset(self) -> None:
        self.arrivals.clear()
        self.duplicates = 0
        self.bad.clear()
        self.count = 0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- databases and CPU -------------------------------------------------------------------------

def recreate(admin: str, database: str) -> str:
    """A fresh database; its URL (asyncpg, the baseline's driver, reads only URLs)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    url = urllib.parse.urlsplit(admin)
    return urllib.parse.urlunsplit(url._replace(path=f"/{database}"))


def drop(admin: str, database: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def process_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerCpu:
    """CPU seconds of every backend of one database, sampled every 20 ms by a thread (so
    backends that come and go count, all but their last 20 ms)."""

    def __init__(self, admin: str, database: str) -> None:
        self._admin, self._database = admin, database
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _read(self, conn: psycopg.Connection[Any]) -> dict[int, float]:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self._database,))]
        return {pid: process_cpu_s(pid) for pid in pids}

    def _sample(self) -> None:
        with psycopg.connect(self._admin, autocommit=True) as conn:
            self._first = self._read(conn)
            self._last = dict(self._first)
            while not self._stop.wait(0.02):
                for pid, cpu in self._read(conn).items():
                    if cpu > self._last.get(pid, 0.0):
                        self._last[pid] = cpu

    def __enter__(self) -> ServerCpu:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def spent_s(self) -> float:
        return sum(cpu - self._first.get(pid, 0.0) for pid, cpu in self._last.items())


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.002)


# -- cells -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    endpoints: int
    concurrency: int
    scheme: str

    @property
    def name(self) -> str:
        return f"{self.endpoints:>2} endpoint(s), c={self.concurrency}, {self.scheme}"


@dataclass
class Result:
    rate: float
    worker_us: float
    server_us: float


@dataclass
class Context:
    admin: str
    receiver: Receiver
    messages: int
    ca: Path | None
    tag: int = 0
    peer_python: str | None = None
    results: dict[str, dict[str, list[Result]]] = field(default_factory=dict)

    def url(self, path: str, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.receiver.port}{path}"

    def env(self) -> dict[str, str]:
        env = {**os.environ}
        if self.ca is not None:
            env["SSL_CERT_FILE"] = str(self.ca)
        return env


def notifyq_app(dsn: str) -> App:
    return App(settings=Settings(
        database_url=dsn, keys=f"1:{KEY}", active_key_version=1, log_level="WARNING",
        webhooks={"allowed_networks": ["127.0.0.0/8"]}))  # type: ignore[arg-type]


@contextmanager
def notifyq_worker(ctx: Context, dsn: str, concurrency: int) -> Iterator[subprocess.Popen[str]]:
    env = {**ctx.env(), "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_KEYS": f"1:{KEY}",
           "NOTIFYQ_ACTIVE_KEY_VERSION": "1", "NOTIFYQ_LOG_LEVEL": "WARNING",
           "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "notifyq", "worker", "--concurrency",
                             str(concurrency)], env=env, text=True)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: proc.poll() is not None or bool(conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'notifyq-listener'").fetchone()[0]),  # type: ignore[index]
                60, "the notifyq worker did not start")
        if proc.poll() is not None:
            raise RuntimeError(f"the notifyq worker exited with {proc.returncode}")
        time.sleep(0.5)  # its producers go idle after their first (empty) claims
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _measure(ctx: Context, database: str, worker_pid: int, expected: int,
             commit: Callable[[], float]) -> Result:
    """Run ``commit`` (returns its commit time); wait for ``expected`` arrivals; the rate and
    CPU per delivery from the commit to the last arrival."""
    receiver = ctx.receiver
    with ServerCpu(ctx.admin, database) as server:
        worker_before = process_cpu_s(worker_pid)
        committed = commit()
        wait_until(lambda: receiver.count >= expected, 300,
                   f"the receiver got {receiver.count} of {expected} deliveries")
        last = max(receiver.arrivals.values())
        worker = process_cpu_s(worker_pid) - worker_before
        time.sleep(0.05)  # the last sample
    if receiver.duplicates or receiver.bad or receiver.count != expected:
        raise RuntimeError(f"not exactly once: {receiver.count} of {expected}, "
                           f"{receiver.duplicates} duplicates, bad signatures {receiver.bad[:3]}")
    return Result(expected / (last - committed), worker / expected * 1e6,
                  server.spent_s / expected * 1e6)


def notifyq_cell(ctx: Context, cell: Cell) -> Result:
    database = "nqwh_notifyq"
    dsn = recreate(ctx.admin, database)
    ctx.receiver.reset()

    async def setup() -> None:
        async with notifyq_app(dsn) as app:
            await app.migrate()
            for n in range(cell.endpoints):
                path = f"/n{ctx.tag}/{n}"
                endpoint = await app.webhooks.create_endpoint(ctx.url(path, cell.scheme),
                                                              event_types=[EVENT])
                ctx.receiver.secret(path, endpoint.secret or "")

    anyio.run(setup)
    payloads = [{"i": i, "note": "x" * 200} for i in range(ctx.messages)]

    def commit() -> float:
        async def send() -> float:
            async with notifyq_app(dsn) as app:
                await app.webhooks.send_many([(EVENT, p) for p in payloads])
                return time.monotonic()
        return anyio.run(send)

    with notifyq_worker(ctx, dsn, cell.concurrency) as worker:
        result = _measure(ctx, database, worker.pid, ctx.messages * cell.endpoints, commit)
    drop(ctx.admin, database)
    return result


def peer(ctx: Context, *args: str) -> subprocess.Popen[str]:
    assert ctx.peer_python is not None
    return subprocess.Popen([ctx.peer_python, "-P", str(HERE / "peers" / "pgqueuer_webhooks.py"),
                             *args], env=ctx.env(), stdout=subprocess.PIPE, text=True)


def peer_cell(ctx: Context, cell: Cell) -> Result:
    database = "nqwh_pgqueuer"
    dsn = recreate(ctx.admin, database)
    ctx.receiver.reset()
    endpoints = []
    for n in range(cell.endpoints):
        path = f"/p{ctx.tag}/{n}"
        secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        ctx.receiver.secret(path, secret)
        endpoints += ["--endpoint", ctx.url(path, cell.scheme), secret]
    if peer(ctx, "install", "--dsn", dsn, *endpoints).wait() != 0:
        raise RuntimeError("the baseline's install failed")
    worker = peer(ctx, "worker", "--dsn", dsn, "--concurrency", str(cell.concurrency))
    try:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError("the baseline's worker did not start")
        time.sleep(0.5)

        def commit() -> float:
            out, _ = peer(ctx, "enqueue", "--dsn", dsn, "--messages",
                          str(ctx.messages)).communicate()
            return float(out.split()[-1])

        result = _measure(ctx, database, worker.pid, ctx.messages * cell.endpoints, commit)
    finally:
        worker.terminate()
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    drop(ctx.admin, database)
    return result


# -- latency and send_many ---------------------------------------------------------------------

def percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"p50_ms": round(statistics.median(values), 2),
            "p99_ms": round(values[max(0, int(len(values) * 0.99) - 1)], 2),
            "max_ms": round(values[-1], 2)}


def notifyq_latency(ctx: Context, samples: int) -> dict[str, Any]:
    database = "nqwh_notifyq"
    dsn = recreate(ctx.admin, database)
    ctx.receiver.reset()
    calls: list[float] = []
    arrivals: list[float] = []

    async def go() -> None:
        async with notifyq_app(dsn) as app:
            await app.migrate()
            await app.webhooks.create_endpoint(ctx.url(f"/l{ctx.tag}", "http"),
                                               event_types=["bench.latency"])
            with notifyq_worker(ctx, dsn, 10):
                for i in range(samples + 20):
                    started = time.monotonic()
                    sent = await app.webhooks.send("bench.latency", {"i": i})
                    returned = time.monotonic()
                    key = (f"/l{ctx.tag}", sent.id)
                    while key not in ctx.receiver.arrivals:  # noqa: ASYNC110 - another thread's
                        await anyio.sleep(0.0005)
                    if i >= 20:
                        calls.append((returned - started) * 1000)
                        arrivals.append((ctx.receiver.arrivals[key] - started) * 1000)
                    await anyio.sleep(random.uniform(0.02, 0.04))

    anyio.run(go)
    drop(ctx.admin, database)
    return {"send_call": percentiles(calls), "send_to_arrival": percentiles(arrivals)}


def peer_latency(ctx: Context, samples: int) -> dict[str, Any]:
    database = "nqwh_pgqueuer"
    dsn = recreate(ctx.admin, database)
    ctx.receiver.reset()
    path = f"/pl{ctx.tag}"
    if peer(ctx, "install", "--dsn", dsn, "--endpoint", ctx.url(path, "http"),
            "whsec_" + base64.b64encode(os.urandom(24)).decode()).wait() != 0:
        raise RuntimeError("the baseline's install failed")
    worker = peer(ctx, "worker", "--dsn", dsn, "--concurrency", "10")
    try:
        assert worker.stdout is not None
        worker.stdout.readline()
        time.sleep(0.5)
        out, _ = peer(ctx, "latency", "--dsn", dsn, "--samples", str(samples + 20)).communicate()
        sent = [(w[1], float(w[2])) for w in (line.split() for line in out.splitlines())]
        wait_until(lambda: ctx.receiver.count >= len(sent), 60, "latency arrivals")
        arrivals = [(ctx.receiver.arrivals[(path, msg)] - at) * 1000 for msg, at in sent[20:]]
    finally:
        worker.terminate()
        worker.wait()
    drop(ctx.admin, database)
    return {"send_to_arrival": percentiles(arrivals)}


def send_many_rate(ctx: Context, messages: int) -> float:
    database = "nqwh_notifyq"
    dsn = recreate(ctx.admin, database)

    async def go() -> float:
        async with notifyq_app(dsn) as app:
            await app.migrate()
            await app.webhooks.create_endpoint(ctx.url("/many", "http"), event_types=[EVENT])
            batch = [(EVENT, {"i": i, "note": "x" * 200}) for i in range(1000)]
            await app.webhooks.send_many(batch)  # warm-up
            started = time.perf_counter()
            for _ in range(messages // 1000):
                await app.webhooks.send_many(batch)
            return (messages // 1000) * 1000 / (time.perf_counter() - started)

    rate = anyio.run(go)
    drop(ctx.admin, database)
    return rate


# -- the run -----------------------------------------------------------------------------------

def ensure_peer_venv() -> str:
    python = VENV / "bin" / "python"
    marker = VENV / ".bench-installed"
    if marker.exists() and marker.read_text() == " ".join(PEER_REQUIREMENTS):
        return str(python)
    log(f"creating {VENV} and installing {' '.join(PEER_REQUIREMENTS)}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *PEER_REQUIREMENTS], check=True)
    marker.write_text(" ".join(PEER_REQUIREMENTS))
    return str(python)


def run(args: argparse.Namespace) -> dict[str, Any]:
    schemes = ["http", "https"] if args.https else ["http"]
    cells = [Cell(e, c, s) for s in schemes for e in args.endpoints for c in args.concurrency]
    systems = [s for s in SYSTEMS if args.peer or s == "notifyq"]
    report: dict[str, Any] = {"load_average_start": list(os.getloadavg()), "cells": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tls = _self_signed(Path(tmp)) if args.https else None
        receivers = {"http": Receiver(None)}
        if tls:
            receivers["https"] = Receiver(tls)
        ctx = Context(args.dsn, receivers["http"], args.messages, tls[0] if tls else None)
        if args.peer:
            ctx.peer_python = ensure_peer_venv()
        try:
            runners = {"notifyq": notifyq_cell, "pgqueuer+httpx": peer_cell}
            for round_ in range(args.rounds):
                for cell in cells:
                    order = systems if round_ % 2 == 0 else systems[::-1]
                    for system in order:
                        ctx.receiver = receivers[cell.scheme]
                        ctx.tag += 1
                        ctx.messages = (args.messages if cell.endpoints == 1
                                        else args.fanout_messages)
                        result = runners[system](ctx, cell)
                        log(f"round {round_ + 1} {cell.name} {system}: {result.rate:,.0f}/s, "
                            f"worker {result.worker_us:.0f} us, server {result.server_us:.0f} "
                            "us per delivery")
                        report["cells"].setdefault(cell.name, {}).setdefault(
                            system, []).append(result.__dict__)
            ctx.receiver = receivers["http"]
            if args.samples:  # --samples 0: no latency cells
                report["latency"] = {"notifyq": notifyq_latency(ctx, args.samples)}
                if args.peer:
                    report["latency"]["pgqueuer+httpx"] = peer_latency(ctx, args.samples)
            if args.send_many:  # --send-many 0: no send_many cell
                report["send_many_per_s"] = round(send_many_rate(ctx, args.send_many))
        finally:
            for receiver in receivers.values():
                receiver.stop()
    report["load_average_end"] = list(os.getloadavg())
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"load average {report['load_average_start']} -> {report['load_average_end']}",
             "", "| cell | system | deliveries/s best / median | worker us/delivery | "
             "PostgreSQL us/delivery |", "|---|---|---|---|---|"]
    for name, systems in report["cells"].items():
        medians = {}
        for system, runs in systems.items():
            rates = [r["rate"] for r in runs]
            medians[system] = statistics.median(rates)
            lines.append(f"| {name} | {system} | {max(rates):,.0f} / {medians[system]:,.0f} | "
                         f"{statistics.median(r['worker_us'] for r in runs):.0f} | "
                         f"{statistics.median(r['server_us'] for r in runs):.0f} |")
        if len(medians) == 2:
            lines.append(f"| {name} | ratio of medians | "
                         f"{medians['notifyq'] / medians['pgqueuer+httpx']:.2f}x | | |")
    for system, lat in report.get("latency", {}).items():
        for what, p in lat.items():
            lines.append(f"\n{system} {what}: " + ", ".join(f"{k} {v}" for k, v in p.items()))
    if "send_many_per_s" in report:
        lines.append(f"\nnotifyq send_many: {report['send_many_per_s']:,} messages/s")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "NOTIFYQ_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=3000,
                        help="messages of a cell with one endpoint")
    parser.add_argument("--fanout-messages", type=int, default=300,
                        help="messages of a cell with several endpoints (each to all)")
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--send-many", type=int, default=20_000)
    parser.add_argument("--https", action="store_true")
    parser.add_argument("--no-peer", dest="peer", action="store_false")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.messages, args.samples, args.send_many = 1, 200, 20, 2000
        args.fanout_messages = 20
        args.concurrency, args.endpoints = [10], [1, 20]
    report = run(args)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
