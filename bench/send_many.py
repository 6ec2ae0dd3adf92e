#!/usr/bin/env python3
"""``app.webhooks.send_many`` by the statement and by COPY, alternated in one run.

    PYTHONPATH=. python3 bench/send_many.py                    # 10,000 messages x 5 rounds
    PYTHONPATH=. python3 bench/send_many.py --batch 1000 --messages 10000 --rounds 7 --json
    PYTHONPATH=/work/main python3 bench/send_many.py --path statement --rounds 1   # a baseline

A fresh database with one endpoint subscribed to the event type (bench/webhooks.py's send_many
cell: payloads ``{"i": n, "note": 200 x "x"}``, one delivery each), no worker. Each round sends
``--messages`` messages in batches of ``--batch`` by the statement (``webhook_message_send_many``,
what every batch used before COPY: the COPY threshold raised out of reach) and then by COPY
(notifyq/_webhooks/fanout.py), on one autocommit connection of its own (each batch its own
transaction), so that its backend's CPU time (/proc) is the server's share. Reported per round
and path: messages/s (wall), the client's CPU and the server backend's CPU per message, and the
load average before the round.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time
from typing import Any

import anyio
import psycopg

from notifyq import App
from notifyq._settings import Settings
from notifyq._webhooks import service

ADMIN = os.environ.get("NOTIFYQ_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "nqbench_send_many"
EVENT = "invoice.paid"
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def recreate() -> str:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    return psycopg.conninfo.make_conninfo(ADMIN, dbname=DATABASE)


def backend_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


async def timed(app: App, conn: psycopg.AsyncConnection[Any], pid: int,
                batches: list[list[tuple[str, Any]]], *, copy: bool) -> dict[str, float]:
    service.COPY_MIN_MESSAGES = 300 if copy else 10**9
    n = sum(map(len, batches))
    wall, cpu, server = time.perf_counter(), time.process_time(), backend_cpu_s(pid)
    for batch in batches:
        await app.webhooks.send_many(batch, conn=conn)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"per_s": n / wall, "client_us": 1e6 * cpu / n,
            "server_us": 1e6 * (backend_cpu_s(pid) - server) / n}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    dsn = recreate()
    key = base64.b64encode(os.urandom(32)).decode()
    app = App(settings=Settings(database_url=dsn, keys=f"1:{key}", active_key_version=1,
                                log_level="WARNING",
                                webhooks={"allowed_networks": ["127.0.0.0/8"]}))  # type: ignore[arg-type]
    rounds: list[dict[str, Any]] = []
    async with app:
        await app.migrate()
        await app.webhooks.create_endpoint("http://127.0.0.1:9/many", event_types=[EVENT])
        payloads = [(EVENT, {"i": i, "note": "x" * 200}) for i in range(args.messages)]
        batches = [payloads[s:s + args.batch] for s in range(0, args.messages, args.batch)]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            pid = conn.info.backend_pid
            paths = {"both": (False, True), "statement": (False,), "copy": (True,)}[args.path]
            for copy in paths:  # warm-up
                await timed(app, conn, pid, batches[:1], copy=copy)
            for _ in range(args.rounds):
                for copy in paths:
                    load = os.getloadavg()[0]
                    result = await timed(app, conn, pid, batches, copy=copy)
                    rounds.append({"path": "copy" if copy else "statement", "load": load,
                                   **result})
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    return {"messages": args.messages, "batch": args.batch, "rounds": rounds}


def render(report: dict[str, Any]) -> str:
    lines = [f"send_many: {report['messages']:,} messages a round in batches of "
             f"{report['batch']:,}, one endpoint"]
    for r in report["rounds"]:
        lines.append(f"  {r['path']:<9} {r['per_s']:>8,.0f}/s  client {r['client_us']:5.1f} us"
                     f"  server {r['server_us']:5.1f} us a message  (load {r['load']:.1f})")
    for path in ("statement", "copy"):
        mine = [r for r in report["rounds"] if r["path"] == path]
        if not mine:
            continue
        rates = [r["per_s"] for r in mine]
        lines.append(f"{path}: median {statistics.median(rates):,.0f}/s "
                     f"({min(rates):,.0f}-{max(rates):,.0f}); client "
                     f"{statistics.median(r['client_us'] for r in mine):.1f} us, server "
                     f"{statistics.median(r['server_us'] for r in mine):.1f} us a message")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--path", choices=["both", "statement", "copy"], default="both",
                        help="statement only: also what a checkout without COPY runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = anyio.run(run, args)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
