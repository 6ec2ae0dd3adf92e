"""Thin wrappers that run one named query with the parameters the runtime passes."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from notifyq._db.queries import Queries
from notifyq._enqueue.request import EnqueueRequest, Prepared, prepare

Conn = psycopg.Connection[dict[str, Any]]


def enqueue(conn: Conn, q: Queries, job_type: str = "t.a", input: Any = None, *,
            allow_unknown_type: bool = False, **kwargs: Any) -> dict[str, Any]:
    prepared = prepare(EnqueueRequest(job_type=job_type, input={} if input is None else input,
                                      **kwargs))
    row = conn.execute(q.job_run_enqueue, prepared.params(
        notify=False, allow_unknown_type=allow_unknown_type)).fetchone()
    assert row is not None
    return row


def insert_one(conn: Conn, q: Queries, request: EnqueueRequest | Prepared, *,
               accept: bool = False, trace_context: str | None = None,
               notify: bool = False) -> dict[str, Any] | None:
    """``job_run_insert_one`` as App.enqueue runs it; its row with the run's id added (None:
    left out, too large)."""
    prepared = request if isinstance(request, Prepared) else prepare(request)
    row = conn.execute(q.job_run_insert_one, prepared.insert_params(
        accept=accept, trace_context=trace_context, notify=notify)).fetchone()
    return None if row is None else {**row, "id": prepared.id}


def claim(conn: Conn, q: Queries, now: datetime | None, *, pool: str = "default", limit: int = 10,
          worker_id: str = "w1", lease_s: float = 30.0, keyed: bool = False,
          ) -> list[dict[str, Any]]:
    """What a worker with nothing to write back sends: ``job_run_claim``, or with ``keyed`` (a
    pool with a concurrency-limited or rate-limited handler) ``job_run_claim_keyed_then_plain``."""
    return conn.execute(q.job_run_claim_keyed_then_plain if keyed else q.job_run_claim, {
        "now": now, "pool": pool, "limit": limit, "worker_id": worker_id,
        "lease_s": lease_s}).fetchall()


def finish(conn: Conn, q: Queries, now: datetime | None, items: list[tuple[UUID, int, str]], *,
           output: str | None = None, error: str | None = None,
           run_at: datetime | None = None, refund: int = 0) -> list[dict[str, Any]]:
    n = len(items)
    return conn.execute(q.job_run_finish_and_claim, {
        **NO_CLAIM, "now": now, "ids": [i[0] for i in items], "fences": [i[1] for i in items],
        "statuses": [i[2] for i in items], "outputs": [output] * n, "errors": [error] * n,
        "run_ats": [run_at] * n, "refunds": [refund] * n, **no_waits(n)}).fetchall()


def no_waits(n: int) -> dict[str, list[None]]:
    """The durable-wait columns of job_run_finish_and_claim for n outcomes that do not wait."""
    return {"wait_kinds": [None] * n, "wait_tokens": [None] * n, "waiting_ons": [None] * n}


NO_CLAIM: dict[str, Any] = {"pool": "default", "limit": 0, "worker_id": None, "lease_s": 0.0}
"""job_run_finish_and_claim's claim parameters for a statement that only writes back."""


DEFINITION = {"version": 1, "pool": "default", "priority": 0, "max_attempts": 25,
              "retry_policy": "{}", "timeout_s": None, "concurrency_key_template": None,
              "concurrency_collision": None, "concurrency_limit": None,
              "dedupe_key_template": None, "dedupe_window_s": None, "replay_from": "last_step",
              "scope_entity_type": None, "scope_id_template": None, "dedupe_states": None,
              "rate_limit": None, "rate_period_s": None, "rate_key_template": None}
"""job_upsert's parameters for a definition without policies."""


LIST_FILTERS = {"status": None, "job_type": None, "pool": None, "tag": None,
                "scope_entity_type": None, "scope_entity_id": None, "tenant_id": None,
                "trigger_source": None, "parent_run_id": None, "before_id": None,
                "min_id": None, "tenant_ids": None, "status_in": None, "due": None,
                "finished_within_s": None, "leased_by": None, "now": None,
                "id_suffix": None, "retried": None, "ids": None}


def get(conn: Conn, q: Queries, run_id: UUID) -> dict[str, Any]:
    row = conn.execute(q.job_run_get, {"id": run_id}).fetchone()
    assert row is not None
    return row


def count(conn: Conn, where: str = "true") -> int:
    row = conn.execute(f"SELECT count(*) AS n FROM notifyq.job_run WHERE {where}").fetchone()
    assert row is not None
    return int(row["n"])


def seconds(s: float) -> timedelta:
    return timedelta(seconds=s)


def generic_plan(conn: Conn, statement: str, *, session: str | None = None) -> str:
    """EXPLAIN of ``statement``'s generic plan: the one the completer's session keeps
    (``session=q.worker_session_generic_plans``: generic, planned once) or, by default, the
    one a pooled connection's "auto" may settle on after its first executions. Prepared with
    its named parameters as $1..$n, planned without their values."""
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    body = re.sub(r"%\((\w+)\)s", positional, statement)
    conn.execute(session or "SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE generic_plan_of AS {body}", prepare=False)
    try:
        nulls = ", ".join(["NULL"] * len(names))
        rows = conn.execute(f"EXPLAIN EXECUTE generic_plan_of({nulls})", prepare=False)
        return "\n".join(str(row["QUERY PLAN"]) for row in rows)
    finally:
        conn.execute("DEALLOCATE generic_plan_of", prepare=False)
        conn.execute("RESET ALL")


def table_reads(plan: str, table: str) -> list[tuple[str, list[str]]]:
    """Each way an EXPLAIN text reads ``table``, with the detail lines under it: its scan nodes,
    and for a bitmap heap scan of it the index scans under it (they carry the index and its
    condition; the heap scan's Recheck Cond may be only a partial index's predicate)."""
    reads: list[tuple[str, list[str]]] = []
    details: list[str] | None = None  # the current node's, if it reads the table
    in_bitmap = False  # under a bitmap heap scan of the table
    for number, line in enumerate(plan.splitlines()):
        text = line.strip()
        if not (number == 0 or text.startswith("->")):
            if details is not None:
                details.append(text)
            continue
        node = text.removeprefix("->  ")
        details = None
        if node.startswith("Bitmap Heap Scan"):
            in_bitmap = f" on {table} " in node
        elif node.startswith("Bitmap Index Scan"):
            if in_bitmap:
                details = []
                reads.append((node, details))
        elif not node.startswith(("BitmapAnd", "BitmapOr")):
            in_bitmap = False
            if "Scan" in node and f" on {table} " in node:
                details = []
                reads.append((node, details))
    return reads
