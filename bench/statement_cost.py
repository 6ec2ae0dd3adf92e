#!/usr/bin/env python3
"""Server instructions per statement: the worker's and the enqueue's, counted by callgrind.

Timings on a shared 2-core VM swing by 2x within minutes; instruction counts do not (the same
statement counts the same to well under 1 % run after run). This starts a scratch PostgreSQL
cluster under ``valgrind --tool=callgrind`` (each backend writes its own count when it exits),
migrates it with this checkout's migrations, and for each statement opens two connections: one
makes ``n`` calls after a warm-up, the other ``3 n`` after the same warm-up. The difference of
their backends' totals, over ``2 n``, is one call's server instructions, start-up, warm-up and
the client excluded. The completer's statements run on a session planned as the completer's
(``worker_session_generic_plans``), with the parameters the worker sends.

    bench/statement_cost.py                      # every statement (~4 min)
    bench/statement_cost.py insert_one claim_1   # some
    bench/statement_cost.py --json

Statements: ``insert_one`` (``App.enqueue``'s single INSERT), ``claim_1`` (an idle worker's
claim of one run), ``cycle_B`` for B in 1, 10, 20, 100 (``job_run_finish_and_claim`` writing
back B runs and claiming B), ``bulk_1000`` (``job_run_insert_bulk`` of 1,000 plain runs, per
run: ``enqueue_many`` below 300 runs), ``copy_1000`` (``enqueue_many``'s COPY of 1,000,
``job_run_copy_defaults`` included, per run), ``keyed_KxN`` (the keyed claim of a webhook
pool, ``job_run_claim_keyed``, over K concurrency keys with N pending runs each and a limit of 5
per key, then a bare UPDATE that finishes what it claimed, so every call finds its keys free),
``load_B`` / ``record_B`` (a webhook delivery's load of B deliveries and the record of their B
successful attempts, ``webhook_delivery_load_many`` / ``webhook_attempt_record_succeeded``),
``send_1`` (``webhooks.send`` to one endpoint) and ``send_many_1000`` (``send_many`` of 1,000
messages to one endpoint, per message).

Needs valgrind and PostgreSQL's server binaries (``pg_config --bindir``, else the newest
``/usr/lib/postgresql/*/bin``); as root, the cluster runs as user ``postgres``. Results and what
they led to: db/README.md ("Server instructions per statement").
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from notifyq._db import migrate as migrations  # noqa: E402
from notifyq._db.queries import Queries  # noqa: E402
from notifyq._dispatch.completer import _array_literal  # noqa: E402
from notifyq._enqueue.bulk import Batch  # noqa: E402
from notifyq._enqueue.copy import CHUNK_RUNS, _Rows  # noqa: E402
from notifyq._enqueue.request import EnqueueRequest  # noqa: E402

STATEMENTS = ("insert_one", "claim_1", "cycle_1", "cycle_10", "cycle_20", "cycle_100",
              "bulk_1000", "copy_1000", "keyed_1x3000", "keyed_20x1000",
              "load_1", "load_5", "load_20", "record_1", "record_5", "record_20",
              "send_1", "send_many_1000")
PORT = 5499
CLAIM = {"now": None, "pool": "default", "worker_id": "w", "lease_s": 30.0}
Q = Queries("notifyq")


def _bindir() -> Path:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             check=True).stdout.strip()
        if (Path(out) / "postgres").exists():
            return Path(out)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parts[-3]))
    if not found:
        sys.exit("statement_cost: no PostgreSQL server binaries (pg_config --bindir)")
    return Path(found[-1]).parent


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def cluster() -> Iterator[tuple[str, Path]]:
    """A scratch cluster under callgrind; yields its DSN and the directory of counts."""
    if shutil.which("valgrind") is None:
        sys.exit("statement_cost: valgrind is not installed (apt-get install valgrind)")
    bindir = _bindir()
    top = Path(tempfile.mkdtemp(prefix="nq-cost-"))
    counts = top / "counts"
    counts.mkdir()
    if os.geteuid() == 0:
        shutil.chown(top, "postgres")
        shutil.chown(counts, "postgres")
    subprocess.run(_as_owner([str(bindir / "initdb"), "-D", str(top / "data"), "-A", "trust",
                              "-U", "postgres"]), check=True, stdout=subprocess.DEVNULL)
    with (top / "data" / "postgresql.conf").open("a") as conf:
        conf.write(f"port = {PORT}\nunix_socket_directories = '{top}'\nlisten_addresses = ''\n"
                   "autovacuum = off\nmax_connections = 20\n")
    server = subprocess.Popen(_as_owner([
        "valgrind", "--tool=callgrind", "--trace-children=yes", "--vgdb=no",
        "--dump-instr=no", f"--callgrind-out-file={counts}/cg.%p",
        str(bindir / "postgres"), "-D", str(top / "data")]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dsn = f"postgresql://postgres@/postgres?host={top}&port={PORT}"
    try:
        for _ in range(600):
            with contextlib.suppress(psycopg.OperationalError):
                psycopg.connect(dsn, connect_timeout=2).close()
                break
            time.sleep(0.2)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("CREATE DATABASE cost")
        yield dsn.replace("/postgres?", "/cost?"), counts
    finally:
        server.terminate()
        server.wait(timeout=120)
        shutil.rmtree(top, ignore_errors=True)


def _total(counts: Path, pid: int) -> int:
    """A backend's instruction count, written by callgrind when it exits."""
    path = counts / f"cg.{pid}"
    for _ in range(1200):
        with contextlib.suppress(OSError):
            found = re.search(r"^(?:summary|totals): (\d+)", path.read_text(), re.MULTILINE)
            if found:
                return int(found.group(1))
        time.sleep(0.1)
    raise RuntimeError(f"no count from backend {pid}")


def per_call(dsn: str, counts: Path, setup: Callable[[psycopg.Connection[Any]], Any],
             call: Callable[[psycopg.Connection[Any], Any], None], n: int) -> float:
    totals = []
    for k in (n, 3 * n):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(Q.worker_session_generic_plans)
            state = setup(conn)
            for _ in range(k):
                call(conn, state)
            pid = conn.info.backend_pid
        totals.append(_total(counts, pid))
    return (totals[1] - totals[0]) / (2 * n)


def _reset(conn: psycopg.Connection[Any], pending: int = 0) -> None:
    conn.execute("TRUNCATE notifyq.job_run CASCADE")
    if pending:
        conn.execute("INSERT INTO notifyq.job_run (job_type, input) SELECT 'bench.noop', "
                     "jsonb_build_object('i', g) FROM generate_series(1, %s) g", (pending,))
    conn.execute("VACUUM ANALYZE notifyq.job_run")


def _insert_one(conn: psycopg.Connection[Any], _: Any = None) -> None:
    conn.execute(Q.job_run_insert_one, {
        "id": uuid.uuid4(), "job_type": "bench.noop", "input": '{"i": 1}', "pool": None,
        "priority": None, "run_at": None, "max_attempts": None, "tags": None,
        "scope_entity_type": None, "scope_entity_id": None, "tenant_id": None,
        "trace_context": None, "accept": True, "notify": True, "channel": "notifyq"}).fetchall()


def _claim(conn: psycopg.Connection[Any], limit: int) -> list[Any]:
    return conn.execute(Q.job_run_claim, {**CLAIM, "limit": limit}, binary=True).fetchall()


def _cycle(conn: psycopg.Connection[Any], state: dict[str, Any]) -> None:
    rows, k = state["rows"], len(state["rows"])
    got = conn.execute(Q.job_run_finish_and_claim, {
        **CLAIM, "limit": state["batch"], "ids": _array_literal(r[1] for r in rows),
        "fences": _array_literal(r[12] for r in rows),
        "statuses": _array_literal(["completed"] * k),
        "outputs": None, "errors": None, "run_ats": None, "refunds": _array_literal([0] * k),
        "wait_kinds": None, "wait_tokens": None, "waiting_ons": None}, binary=True).fetchall()
    state["rows"] = [r for r in got if r[0]]


def _keyed_backlog(conn: psycopg.Connection[Any], keys: int, each: int) -> None:
    conn.execute("TRUNCATE notifyq.job_run CASCADE")
    conn.execute("INSERT INTO notifyq.job_run (job_type, input, pool, concurrency_key, "
                 "concurrency_limit) SELECT 'webhook.deliver', jsonb_build_object('i', g), "
                 "'webhooks', 'webhook:' || (g %% %s), 5 FROM generate_series(1, %s) g",
                 (keys, keys * each))
    conn.execute("VACUUM ANALYZE notifyq.job_run")


def _keyed(conn: psycopg.Connection[Any], _: Any = None) -> None:
    ids = [r[0] for r in conn.execute(Q.job_run_claim_keyed, {
        **CLAIM, "pool": "webhooks", "limit": 100}).fetchall()]
    conn.execute("UPDATE notifyq.job_run SET status = 'completed', finished_at = now() "
                 "WHERE id = ANY (%s)", (ids,))


def _webhooks(conn: psycopg.Connection[Any], messages: int) -> dict[str, Any]:
    """An endpoint with a secret and ``messages`` sent to it; their (message, endpoint) pairs."""
    for table in ("webhook_message", "webhook_endpoint", "job_run"):
        conn.execute(f"TRUNCATE notifyq.{table} CASCADE")
    endpoint = conn.execute(
        "INSERT INTO notifyq.webhook_endpoint (url) VALUES ('http://127.0.0.1:9/x') "
        "RETURNING id").fetchone()[0]  # type: ignore[index]
    conn.execute("INSERT INTO notifyq.webhook_secret (id, endpoint_id, ciphertext) "
                 "VALUES (gen_random_uuid(), %s, %s)", (endpoint, b"c" * 60))
    ids = [r[1] for r in conn.execute(Q.webhook_message_send_many, {
        "event_types": ["a.b"] * messages,
        "payloads": [f'{{"i": {i}, "note": "{"x" * 200}"}}' for i in range(messages)],
        "endpoint_ids": [endpoint] * messages, "idempotency_keys": [None] * messages})]
    conn.execute("VACUUM ANALYZE")
    return {"endpoint": endpoint, "ids": ids, "at": 0}


def _take(state: dict[str, Any], n: int) -> list[str]:
    ids, at = state["ids"], state["at"]
    state["at"] = (at + n) % (len(ids) - n)
    return ids[at:at + n]


def _load(conn: psycopg.Connection[Any], state: dict[str, Any]) -> None:
    ids = _take(state, state["batch"])
    conn.execute(Q.webhook_delivery_load_many, {
        "message_ids": ids, "endpoint_ids": [state["endpoint"]] * len(ids),
        "now": None}).fetchall()


def _record(conn: psycopg.Connection[Any], state: dict[str, Any]) -> None:
    """The record of B successful attempts, as the deliverer sends it."""
    ids = _take(state, state["batch"])
    n = len(ids)
    conn.execute(Q.webhook_attempt_record_succeeded, {
        "message_ids": ids, "endpoint_ids": [state["endpoint"]] * n, "run_ids": [None] * n,
        "triggers": ["scheduled"] * n, "attempts": [1] * n, "webhook_timestamps": [1] * n,
        "urls": ["http://127.0.0.1:9/x"] * n, "status_codes": [200] * n,
        "durations_ms": [1.0] * n, "response_bodies": ["ok"] * n,
        "response_truncated": [False] * n, "counted": [1] * n, "now": None})


def _send(conn: psycopg.Connection[Any], state: dict[str, Any]) -> None:
    n = state["batch"]
    if n == 1:
        conn.execute(Q.webhook_message_send, {
            "event_type": "a.b", "payload": '{"i": 1, "note": "%s"}' % ("x" * 200),
            "endpoint_id": state["endpoint"], "idempotency_key": None}).fetchall()
        return
    conn.execute(Q.webhook_message_send_many, {
        "event_types": ["a.b"] * n,
        "payloads": [f'{{"i": {i}, "note": "{"x" * 200}"}}' for i in range(n)],
        "endpoint_ids": [state["endpoint"]] * n, "idempotency_keys": [None] * n}).fetchall()


def _bulk(conn: psycopg.Connection[Any], _: Any = None) -> None:
    batch = Batch(65_536)
    for i in range(1000):
        batch.add(EnqueueRequest(job_type="bench.noop", input={"i": i}), (None, None, None))
    _, params = batch.params()
    conn.execute(Q.job_run_insert_bulk, {**params, "accept_types": ["bench.noop"],
                                         "notify": True, "channel": "notifyq"}).fetchall()


def _copy(conn: psycopg.Connection[Any], _: Any = None) -> None:
    batch = Batch(65_536)
    for i in range(1000):
        batch.add(EnqueueRequest(job_type="bench.noop", input={"i": i}), (None, None, None))
    with conn.cursor(row_factory=dict_row) as cur:
        defaults = cur.execute(Q.job_run_copy_defaults, {
            "types": batch.types(), "accept_types": ["bench.noop"]}).fetchall()
        rows, ids = _Rows(defaults, None), batch.ids()
        with cur.copy(Q.job_run_copy) as copy:
            for start in range(0, 1000, CHUNK_RUNS):
                copy.write(rows.text(batch, ids, start, min(start + CHUNK_RUNS, 1000)))


def measure(dsn: str, counts: Path, name: str) -> float:
    if name == "insert_one":
        def setup(conn: psycopg.Connection[Any]) -> None:
            _reset(conn)
            for _ in range(20):
                _insert_one(conn)
        return per_call(dsn, counts, setup, _insert_one, 100)
    if name == "claim_1":
        def setup_claim(conn: psycopg.Connection[Any]) -> None:
            _reset(conn, pending=1000)
            for _ in range(10):
                _claim(conn, 1)
        return per_call(dsn, counts, setup_claim, lambda c, _: _claim(c, 1) and None, 100)
    if name == "bulk_1000":
        def setup_bulk(conn: psycopg.Connection[Any]) -> None:
            _reset(conn)
            _bulk(conn)
        return per_call(dsn, counts, setup_bulk, _bulk, 5) / 1000
    if name == "copy_1000":
        def setup_copy(conn: psycopg.Connection[Any]) -> None:
            _reset(conn)
            _copy(conn)
        return per_call(dsn, counts, setup_copy, _copy, 5) / 1000
    if name.startswith(("load_", "record_", "send_")):
        kind, _, size = name.rpartition("_")
        batch = int(size)
        step = {"load": _load, "record": _record, "send": _send, "send_many": _send}[kind]

        def setup_webhooks(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            state = {**_webhooks(conn, 1000), "batch": batch}
            for _ in range(5):
                step(conn, state)
            return state
        calls = 3 if batch >= 1000 else 20
        return per_call(dsn, counts, setup_webhooks, step, calls) / (
            batch if kind == "send_many" else 1)
    if name.startswith("keyed_"):
        keys, each = (int(x) for x in name.removeprefix("keyed_").split("x"))

        def setup_keyed(conn: psycopg.Connection[Any]) -> None:
            _keyed_backlog(conn, keys, each)
            for _ in range(3):
                _keyed(conn)
        return per_call(dsn, counts, setup_keyed, _keyed, 20)
    batch = int(name.removeprefix("cycle_"))

    def setup_cycle(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        _reset(conn, pending=batch * 400)
        state = {"rows": _claim(conn, batch), "batch": batch}
        for _ in range(10):
            _cycle(conn, state)
        return state
    return per_call(dsn, counts, setup_cycle, _cycle, 50 if batch >= 100 else 100)


async def _migrate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrations.migrate(conn, "notifyq")  # this checkout's migrations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("statements", nargs="*", metavar="STATEMENT",
                        help=f"some of: {', '.join(STATEMENTS)} (default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unknown = set(args.statements) - set(STATEMENTS)
    if unknown:
        parser.error(f"unknown statements: {', '.join(sorted(unknown))}")
    with cluster() as (dsn, counts):
        anyio.run(_migrate, dsn)
        out = {name: measure(dsn, counts, name) for name in args.statements or STATEMENTS}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print("| statement | server instructions per call |\n|---|---:|")
    for name, value in out.items():
        print(f"| {name}{' (per run)' if name.endswith('_1000') else ''} | {value:,.0f} |")


if __name__ == "__main__":
    main()
