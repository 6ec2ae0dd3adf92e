"""Typed rows: each typed query's columns are exactly its row type's fields, and the row
factories build the public objects from them."""

from __future__ import annotations

import uuid
from dataclasses import fields
from typing import Any

import psycopg
import pytest

from notifyq._control import PoolBacklog, StatusCount, StepRow
from notifyq._db.queries import Queries
from notifyq._db.rows import run_row
from notifyq._run import RUN_FIELDS, Run, RunStatus
from notifyq._webhooks.rows import AttemptRow, DeliveryRow, MessageRow, Recovered, Resent
from notifyq._webhooks.service import SentMessage
from tests.db.conftest import T0
from tests.db.helpers import LIST_FILTERS, enqueue

Conn = psycopg.Connection[dict[str, Any]]
ANY_ID = uuid.UUID(int=1)

# Each typed query with parameters that match nothing: the columns are known all the same.
TYPED = [
    ("job_step_list", {"run_id": ANY_ID}, set(StepRow.__annotations__)),
    ("webhook_message_get", {"id": "m"}, set(MessageRow.__annotations__)),
    ("webhook_delivery_list", {"message_id": "m", "now": None},
     set(DeliveryRow.__annotations__)),
    ("webhook_attempt_list", {"message_id": "m", "limit": 1}, set(AttemptRow.__annotations__)),
    ("webhook_delivery_resend", {"message_id": "m", "endpoint_id": None},
     set(Resent.__annotations__)),
    ("webhook_delivery_recover", {"endpoint_id": ANY_ID, "since": T0, "limit": 1, "now": None},
     set(Recovered.__annotations__)),
    ("job_run_count_by_status", {}, {f.name for f in fields(StatusCount)}),
    ("job_run_oldest_runnable", {"now": None}, {f.name for f in fields(PoolBacklog)}),
]


def test_a_sent_message_is_built_from_the_columns_of_webhook_message_send_in_order(
        db: Conn, q: Queries) -> None:
    cur = db.execute(q.webhook_message_send, {"event_type": "e.t", "payload": "{}",
                                              "endpoint_id": None, "idempotency_key": None})
    assert cur.description is not None
    assert [c.name for c in cur.description] == ["message_id", "created", "deliveries"]
    assert [f.name for f in fields(SentMessage)] == ["id", "created", "deliveries"]


@pytest.mark.parametrize(("name", "params", "expected"), TYPED, ids=[t[0] for t in TYPED])
def test_a_typed_query_returns_exactly_the_fields_of_its_row_type(
        db: Conn, q: Queries, name: str, params: dict[str, Any], expected: set[str]) -> None:
    cur = db.execute(getattr(q, name), params)
    assert cur.description is not None
    assert sorted(c.name for c in cur.description) == sorted(expected)


def test_the_queries_that_make_runs_return_every_field_of_a_run(db: Conn, q: Queries) -> None:
    run_id = enqueue(db, q)["id"]
    for query, params in [
        (q.job_run_get, {"id": run_id}),
        (q.job_run_list, {"tenant_ids": None, **LIST_FILTERS, "limit": 10}),
        (q.job_run_list_children, {"tenant_ids": None, "parent_run_id": run_id, "limit": 10}),
        (q.job_run_cancel, {"tenant_ids": None, "id": run_id, "now": None}),
        (q.job_run_retry, {"tenant_ids": None, "id": run_id, "now": None}),
    ]:
        cur = db.execute(query, params)
        assert cur.description is not None
        assert set(RUN_FIELDS) <= {c.name for c in cur.description}


def test_run_row_builds_the_run_a_dict_row_describes(db: Conn, q: Queries) -> None:
    run_id = enqueue(db, q, tags=["a"])["id"]
    with db.cursor(row_factory=run_row) as cur:
        run = cur.execute(q.job_run_get, {"id": run_id}).fetchone()
    row = db.execute(q.job_run_get, {"id": run_id}).fetchone()
    assert row is not None
    assert run == Run.from_row(row)
    assert run is not None
    assert run.status is RunStatus.PENDING
    assert run.tags == ["a"]


def test_run_row_refuses_a_query_without_every_field_of_a_run(db: Conn) -> None:
    with db.cursor(row_factory=run_row) as cur, pytest.raises(
            TypeError, match=r"needs the columns \[.*'job_type'.*\]"):
        cur.execute("SELECT id, 'pending' AS status FROM notifyq.job_run")
