#!/usr/bin/env python3
"""Retention without bloat (migration 0031): what dropping old attempts costs, and the size of
webhook_attempt over simulated days with retention on and off.

On a scratch database (dropped at the end) it measures, in order:

1. **migration**: ``--migrate-rows`` attempts in today's unpartitioned table (migrations up to
   0030), spread over ``--days`` days; first one day of them removed the old way (``DELETE``, for
   comparison), then migration 0031 timed (the table becomes the first partition: no copy).
2. **record**: ``webhook_attempt_record_succeeded`` of one attempt, ``--records`` times, on the
   unpartitioned table (before 0031) and on the partitioned one (after), ms per statement.
3. **days**: ``--attempts`` attempts inserted set-based (``generate_series``), ``--attempts /
   --days`` per simulated day, each day followed by the leader's retention pass
   (``webhook_attempt_partitions_make`` / ``_drop`` with ``--retention-days``, and the payload drop
   of ``webhook_message_drop_payloads`` in its batches): the pass's time, the partitions and
   estimated rows it dropped, and webhook_attempt's size on disk that day, with retention and as
   it would be without (the sum of every day's partition).
4. **reads**: the attempt list of a message and the endpoint health query on the full table.

    python bench/retention.py                 # 10M attempts over 14 days (about 15 min, 3 GB)
    python bench/retention.py --quick         # a smoke run (seconds)

Results: bench/RESULTS.md ("Retention").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from notifyq._db import migrate as migrations  # noqa: E402
from notifyq._db.queries import Queries  # noqa: E402

Q = Queries("notifyq")
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DAY = timedelta(days=1)
MESSAGES = 10_000
"""Messages (one delivery each) the synthetic attempts belong to."""
Conn = psycopg.Connection[dict[str, Any]]


@contextmanager
def scratch(admin: str) -> Iterator[str]:
    name = f"nq_bench_retention_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield psycopg.conninfo.make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate(conn: Conn, *, until: int | None = None) -> None:
    conn.execute(Q.migration_schema_create)
    conn.execute(Q.migration_ledger_create)
    applied = {r["version"] for r in conn.execute(
        "SELECT version FROM notifyq.schema_migration").fetchall()}
    for m in migrations.available():
        if m.version in applied:
            continue
        if until is not None and m.version >= until:
            break
        with conn.transaction():
            conn.execute(Q.migration_search_path_set, {"schema_name": "notifyq"})
            conn.execute(m.sql, prepare=False)
            conn.execute(Q.migration_record, {"version": m.version, "name": m.name,
                                              "checksum": m.checksum})
    conn.execute("RESET search_path")


def messages(conn: Conn, start: datetime, days: int) -> Any:
    """An endpoint and MESSAGES messages spread over the days, one succeeded delivery each."""
    endpoint = conn.execute(
        "INSERT INTO notifyq.webhook_endpoint (url) VALUES ('https://hooks.example/b') "
        "RETURNING id").fetchone()
    assert endpoint is not None
    conn.execute(
        "INSERT INTO notifyq.webhook_message (id, event_type, body, created_at) "
        "SELECT 'msg_' || lpad(i::text, 12, '0'), 'bench.e', '{\"n\": 1}', "
        "       %(start)s + (i::float8 / %(n)s) * %(span)s "
        "FROM generate_series(0, %(n)s - 1) i",
        {"start": start, "n": MESSAGES, "span": days * DAY})
    conn.execute(
        "INSERT INTO notifyq.webhook_delivery (message_id, endpoint_id, status) "
        "SELECT id, %s, 'succeeded' FROM notifyq.webhook_message", (endpoint["id"],))
    return endpoint["id"]


def attempts(conn: Conn, endpoint: Any, day: datetime, n: int) -> float:
    """``n`` attempts spread over ``day``, set-based; returns the seconds it took."""
    started = time.perf_counter()
    conn.execute(
        "INSERT INTO notifyq.webhook_attempt (message_id, endpoint_id, trigger, attempt, "
        "  webhook_timestamp, url, status_code, duration_ms, response_body, created_at) "
        "SELECT 'msg_' || lpad((i %% %(m)s)::text, 12, '0'), %(e)s, 'scheduled', 1, 0, "
        "       'https://hooks.example/b', 200, 12.5, 'ok', "
        "       %(day)s + (i::float8 / %(n)s) * interval '1 day' "
        "FROM generate_series(0, %(n)s - 1) i",
        {"m": MESSAGES, "e": endpoint, "day": day, "n": n})
    return time.perf_counter() - started


def size(conn: Conn) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint AS b "
        "FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace "
        "WHERE s.nspname = 'notifyq' AND c.relname LIKE 'webhook\\_attempt%%' "
        "  AND c.relkind = 'r'").fetchone()
    return int(row["b"]) if row else 0


def partition_sizes(conn: Conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT p.name, pg_total_relation_size(('notifyq.' || quote_ident(p.name))::regclass) "
        "AS b FROM notifyq._webhook_attempt_partitions() p").fetchall()
    return {r["name"]: int(r["b"]) for r in rows}


def record_ms(conn: Conn, endpoint: Any, n: int) -> float:
    """ms per ``webhook_attempt_record_succeeded`` of one attempt."""
    params = {"now": None, "endpoint_ids": [endpoint], "run_ids": [None],
              "triggers": ["scheduled"], "attempts": [1], "webhook_timestamps": [0],
              "urls": ["https://hooks.example/b"], "status_codes": [200],
              "durations_ms": [10.0], "response_bodies": ["ok"], "response_truncated": [False],
              "counted": [1]}
    # The statement's own cost, not the WAL flush of its commit (which is the same before
    # and after, and on a VM's disk ten times larger).
    conn.execute("SET synchronous_commit = off")
    for i in range(50):  # warm-up: plans cached, pages in memory
        conn.execute(Q.webhook_attempt_record_succeeded,
                     {**params, "message_ids": [f"msg_{i:012d}"]})
    started = time.perf_counter()
    for i in range(n):
        conn.execute(Q.webhook_attempt_record_succeeded,
                     {**params, "message_ids": [f"msg_{i % MESSAGES:012d}"]})
    elapsed = time.perf_counter() - started
    conn.execute("RESET synchronous_commit")
    return elapsed * 1000 / n


def retention_pass(conn: Conn, now: datetime, retention_days: int,
                   batch: int) -> dict[str, Any]:
    """What the Retainer does on one tick, timed."""
    started = time.perf_counter()
    made = conn.execute(Q.webhook_attempt_partitions_make, {"now": now, "days": 7}).fetchone()
    dropped = conn.execute(Q.webhook_attempt_partitions_drop, {
        "now": now, "retention_s": retention_days * 86_400.0, "limit": 31}).fetchall()
    partitions_s = time.perf_counter() - started
    payloads = 0
    while True:
        n = conn.execute(Q.webhook_message_drop_payloads, {
            "now": now, "retention_s": retention_days * 86_400.0, "limit": batch}).rowcount
        payloads += n
        if n < batch:
            break
    return {"made": made["made"] if made else 0, "dropped": len(dropped),
            "rows_dropped": sum(r["estimated_rows"] for r in dropped),
            "partitions_ms": partitions_s * 1000, "payloads": payloads,
            "pass_ms": (time.perf_counter() - started) * 1000}


def explain_ms(conn: Conn, query: str, params: dict[str, Any]) -> tuple[float, str]:
    """Execution time, and how webhook_attempt's partitions were read (those read by a
    sequential scan named: the planner's choice for an empty or tiny partition)."""
    rows = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()
    assert rows is not None
    plan = next(iter(rows.values()))[0]
    scans: list[tuple[str, str]] = []

    def walk(node: dict[str, Any]) -> None:
        if "webhook_attempt" in node.get("Relation Name", ""):
            scans.append((node["Node Type"], node["Relation Name"]))
        for child in node.get("Plans", []):
            walk(child)
    walk(plan["Plan"])
    seq = sorted({rel for kind, rel in scans if kind == "Seq Scan"})
    index = sum(1 for kind, _ in scans if kind != "Seq Scan")
    return plan["Execution Time"], (f"{index} index scans, sequential: "
                                    f"{', '.join(seq) or 'none'}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"attempts": args.attempts, "days": args.days,
                           "retention_days": args.retention_days}
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    with scratch(args.admin) as dsn, psycopg.connect(dsn, autocommit=True,
                                                     row_factory=dict_row) as conn:
        migrate(conn, until=31)
        start = today - args.days * DAY
        endpoint = messages(conn, start, 2 * args.days)
        per_day = args.migrate_rows // args.days
        for d in range(args.days):
            attempts(conn, endpoint, start + d * DAY, per_day)
        conn.execute("VACUUM ANALYZE notifyq.webhook_attempt")
        started = time.perf_counter()
        deleted = conn.execute("DELETE FROM notifyq.webhook_attempt WHERE created_at < %s",
                               (start + DAY,)).rowcount
        out["delete_one_day"] = {"rows": deleted,
                                 "ms": (time.perf_counter() - started) * 1000}
        out["record_before_ms"] = record_ms(conn, endpoint, args.records)
        count = conn.execute("SELECT count(*) AS n FROM notifyq.webhook_attempt").fetchone()
        started = time.perf_counter()
        migrate(conn)
        out["migration"] = {"rows": count["n"] if count else 0,
                            "ms": (time.perf_counter() - started) * 1000}
        out["record_after_ms"] = record_ms(conn, endpoint, args.records)
        # Days of traffic after the migration: the legacy partition, then one per day.
        conn.execute("UPDATE notifyq.webhook_message SET created_at = created_at + %s",
                     (args.days * DAY,))
        per_day = args.attempts // args.days
        out["per_day"] = per_day
        grown: dict[str, int] = {}
        days = []
        for d in range(1, args.days + 1):
            day = today + d * DAY
            conn.execute(Q.webhook_attempt_partitions_make, {"now": day, "days": 1})
            insert_s = attempts(conn, endpoint, day, per_day)
            conn.execute("ANALYZE notifyq.webhook_attempt")
            grown.update(partition_sizes(conn))
            tick = retention_pass(conn, day + DAY, args.retention_days, args.batch)
            days.append({"day": d, "insert_s": round(insert_s, 1), **{
                k: round(v, 1) if isinstance(v, float) else v for k, v in tick.items()},
                "size_mb": round(size(conn) / 2**20, 1),
                "size_without_mb": round(sum(grown.values()) / 2**20, 1)})
            print(json.dumps(days[-1]), file=sys.stderr, flush=True)
        out["days_run"] = days
        message = f"msg_{MESSAGES - 1:012d}"
        out["attempt_list"] = explain_ms(conn, Q.webhook_attempt_list,
                                         {"message_id": message, "limit": 1000})
        out["endpoint_health"] = explain_ms(conn, Q.webhook_endpoint_health, {
            "ids": [endpoint], "now": today + (args.days + 1) * DAY, "window_s": 86_400.0,
            "limit": 10, "tenant_ids": None})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--retention-days", type=int, default=7)
    parser.add_argument("--migrate-rows", type=int, default=1_000_000)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=2000,
                        help="payload drops per statement (purger.batch_size)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small numbers")
    parser.add_argument("--admin", default=ADMIN, help="a DSN allowed to CREATE DATABASE")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.attempts, args.days, args.retention_days = 40_000, 4, 2
        args.migrate_rows, args.records = 8_000, 200
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"migration 0031 on {out['migration']['rows']:,} attempts: "
          f"{out['migration']['ms']:,.0f} ms (a DELETE of one day, "
          f"{out['delete_one_day']['rows']:,} rows: {out['delete_one_day']['ms']:,.0f} ms)")
    print(f"webhook_attempt_record_succeeded, 1 attempt: {out['record_before_ms']:.3f} ms "
          f"before, {out['record_after_ms']:.3f} ms after ({args.records:,} statements)")
    print(f"{out['per_day']:,} attempts a day, retention {args.retention_days} days:")
    print("day  insert_s  pass_ms  dropped  rows_dropped  payloads  size_MB  without_MB")
    for d in out["days_run"]:
        print(f"{d['day']:>3}  {d['insert_s']:>8}  {d['pass_ms']:>7}  {d['dropped']:>7}  "
              f"{d['rows_dropped']:>12,}  {d['payloads']:>8}  {d['size_mb']:>7}  "
              f"{d['size_without_mb']:>10}")
    for name in ("attempt_list", "endpoint_health"):
        ms, scans = out[name]
        print(f"{name}: {ms:.2f} ms ({scans})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
