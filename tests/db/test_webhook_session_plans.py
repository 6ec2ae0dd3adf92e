"""The deliverer's session (webhook_delivery_session_plans): each of its statements planned
once, generically, and kept while the tables grow or shrink. Planned on an empty database (never
analyzed), on 5 endpoints with 10 messages each and on 200 with 15 each (analyzed), every read
of a webhook table must look rows up by an index condition, with no sequential scan and no hash
or merge join: a plan kept from one size must not read a whole table or index at another.

Not held: a table analyzed with one row, where a whole-index read and a lookup cost the same
and the planner may take either. That plan reads the one row; autovacuum analyzes the table
again after 50 changes, which plans the session's statements anew."""

from __future__ import annotations

import pytest

from notifyq._db.queries import Queries
from tests.db.helpers import Conn, generic_plan, table_reads

STATEMENTS = ("webhook_delivery_load_many", "webhook_attempt_record_many",
              "webhook_attempt_record_succeeded", "key_concurrency_resize")
TABLES = ("webhook_delivery", "webhook_message", "webhook_endpoint", "webhook_secret",
          "key_concurrency")


def _deliveries(db: Conn, q: Queries, endpoints: int, messages: int) -> None:
    """``endpoints`` endpoints with a secret each, ``messages`` messages sent to each one,
    their shares resized once (a key_concurrency row each), then ANALYZE."""
    rows = db.execute("INSERT INTO notifyq.webhook_endpoint (url) "
                      "SELECT 'http://127.0.0.1:9/x' FROM generate_series(1, %s) "
                      "RETURNING id", (endpoints,)).fetchall()
    ids = [r["id"] for r in rows]
    db.execute("INSERT INTO notifyq.webhook_secret (id, endpoint_id, ciphertext) "
               "SELECT gen_random_uuid(), e, %s FROM unnest(%s::uuid[]) AS e", (b"c" * 60, ids))
    db.execute("INSERT INTO notifyq.key_concurrency (key, concurrency_limit) "
               "SELECT 'webhook:' || e, 5 FROM unnest(%s::uuid[]) AS e", (ids,))
    for endpoint in ids:
        db.execute(q.webhook_message_send_many, {
            "event_types": ["a.b"] * messages,
            "payloads": [f'{{"i": {i}}}' for i in range(messages)],
            "endpoint_ids": [endpoint] * messages,
            "idempotency_keys": [None] * messages}).fetchall()
    db.execute("ANALYZE")


@pytest.mark.parametrize("name", STATEMENTS)
@pytest.mark.parametrize(("endpoints", "messages"), [(0, 0), (5, 10), (200, 15)])
def test_the_deliverers_plans_look_every_row_up_by_index_at_any_size(
        db: Conn, q: Queries, name: str, endpoints: int, messages: int) -> None:
    if endpoints:
        _deliveries(db, q, endpoints, messages)
    plan = generic_plan(db, getattr(q, name), session=q.webhook_delivery_session_plans)
    for node in ("Seq Scan", "Hash Join", "Merge Join", "JIT:"):
        assert node not in plan, plan
    reads = [read for table in TABLES for read in table_reads(plan, table)]
    assert reads, plan
    for read, details in reads:
        assert any(d.startswith("Index Cond:") for d in details), (
            f"{read} has no index condition:\n{plan}")


def test_the_deliverers_session_plans_generically_without_jit(db: Conn, q: Queries) -> None:
    db.execute(q.webhook_delivery_session_plans)
    settings = db.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN ('plan_cache_mode', "
        "'enable_seqscan', 'enable_hashjoin', 'enable_mergejoin', 'jit') ORDER BY name"
    ).fetchall()
    assert {r["name"]: r["setting"] for r in settings} == {
        "enable_hashjoin": "off", "enable_mergejoin": "off", "enable_seqscan": "off",
        "jit": "off", "plan_cache_mode": "force_generic_plan"}
