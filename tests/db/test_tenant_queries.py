"""The tenant filter (``tenant_ids``, NULL for every tenant) of the queries behind the admin API
(issue 12, item 8): a run, endpoint or message of another tenant is no row, as if it did not
exist, and a bulk action leaves it alone."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import LIST_FILTERS, Conn, enqueue
from tests.db.test_webhook_queries import _send


def _runs(db: Conn, q: Queries) -> dict[str | None, Any]:
    return {t: enqueue(db, q, "t.a", tenant_id=t, allow_unknown_type=True)["id"]
            for t in ("a", "b", None)}


def test_job_run_get_in_tenants_finds_only_the_runs_of_those_tenants(db: Conn,
                                                                      q: Queries) -> None:
    runs = _runs(db, q)
    def get(run: Any, tenants: list[str] | None) -> Any:
        return db.execute(q.job_run_get_in_tenants, {"id": run, "tenant_ids": tenants}
                          ).fetchone()
    assert get(runs["a"], ["a"])["id"] == runs["a"]
    assert get(runs["b"], ["a"]) is None
    assert get(runs[None], ["a"]) is None  # a run of no tenant is no tenant's
    assert get(runs["b"], ["a", "b"])["id"] == runs["b"]
    assert all(get(run, None) is not None for run in runs.values())


def test_job_run_list_count_and_ids_keep_to_the_tenants_whatever_the_other_filters(
        db: Conn, q: Queries) -> None:
    runs = _runs(db, q)
    only_a = {**LIST_FILTERS, "tenant_ids": ["a"]}
    listed = db.execute(q.job_run_list, {**only_a, "limit": 10}).fetchall()
    assert [r["id"] for r in listed] == [runs["a"]]
    widened = db.execute(q.job_run_list, {**only_a, "tenant_id": "b", "limit": 10}).fetchall()
    assert widened == []
    statuses = {"statuses": ["pending"]}
    assert db.execute(q.job_run_count, {**only_a, **statuses, "cap": 10}).fetchone() == {"n": 1}
    ids = db.execute(q.job_run_list_ids, {**only_a, **statuses, "limit": 10}).fetchall()
    assert [r["id"] for r in ids] == [runs["a"]]


def test_single_and_bulk_changes_leave_the_runs_of_other_tenants_alone(db: Conn,
                                                                       q: Queries) -> None:
    runs = _runs(db, q)
    other = [runs["b"], runs[None]]
    assert db.execute(q.job_run_cancel, {"id": runs["b"], "now": T0, "tenant_ids": ["a"]}
                      ).fetchone() is None
    assert db.execute(q.job_run_cancel_many, {"ids": other, "now": T0, "tenant_ids": ["a"]}
                      ).fetchall() == []
    assert db.execute(q.job_run_reschedule_many, {"ids": other, "now": T0, "run_at": T0,
                                                  "tenant_ids": ["a"]}).fetchall() == []
    canceled = db.execute(q.job_run_cancel_many, {"ids": list(runs.values()), "now": T0,
                                                  "tenant_ids": ["a"]}).fetchall()
    assert [r["id"] for r in canceled] == [runs["a"]]
    for query in (q.job_run_retry_many, q.job_run_delete_many):
        assert db.execute(query, {"ids": list(runs.values()), "now": T0, "run_at": None,
                                  "tenant_ids": ["b"]}).fetchall() == []
    assert db.execute(q.job_run_retry, {"id": runs["a"], "now": T0, "tenant_ids": ["b"]}
                      ).fetchone() is None
    assert db.execute(q.job_run_get_for_update, {"id": runs["a"], "tenant_ids": ["b"]}
                      ).fetchone() is None


def _tenant_endpoint(db: Conn, q: Queries, tenant: str | None) -> Any:
    row = db.execute(q.webhook_endpoint_insert, {
        "url": "https://hooks.example/x", "description": "", "event_types": None,
        "headers": Jsonb({}), "enabled": True, "now": T0, "tenant_id": tenant,
        "rate_limit": None}).fetchone()
    assert row is not None
    assert row["tenant_id"] == tenant
    return row["id"]


def test_endpoints_and_messages_belong_to_the_tenant_of_their_endpoint(db: Conn,
                                                                       q: Queries) -> None:
    a, b = _tenant_endpoint(db, q, "a"), _tenant_endpoint(db, q, "b")
    def found(query: str, key: Any, tenants: list[str] | None) -> bool:
        return db.execute(query, {"id": key, "tenant_ids": tenants}).fetchone() is not None
    assert found(q.webhook_endpoint_in_tenants, a, ["a"])
    assert not found(q.webhook_endpoint_in_tenants, b, ["a"])
    assert found(q.webhook_endpoint_in_tenants, b, None)
    listed = db.execute(q.webhook_endpoint_list, {"after": None, "enabled": None, "limit": 10,
                                                  "now": T0, "tenant_ids": ["b"]}).fetchall()
    assert [e["id"] for e in listed] == [b]
    health = db.execute(q.webhook_endpoint_health, {"ids": None, "now": T0, "window_s": 60,
                                                    "limit": 10, "tenant_ids": ["a"]}).fetchall()
    assert [h["endpoint_id"] for h in health] == [a]
    to_a = _send(db, q, endpoint_id=a)["message_id"]
    fanned_out = _send(db, q)["message_id"]  # reached a and b: no tenant's
    assert found(q.webhook_message_in_tenants, to_a, ["a"])
    assert not found(q.webhook_message_in_tenants, to_a, ["b"])
    assert not found(q.webhook_message_in_tenants, fanned_out, ["a"])
    assert found(q.webhook_message_in_tenants, fanned_out, None)
    messages = db.execute(q.webhook_message_list, {
        "before": None, "limit": 10, "tenant_ids": ["a"], "event_type": None,
        "to_endpoint": None}).fetchall()
    assert [m["id"] for m in messages] == [to_a]


def test_a_signal_for_tenants_wakes_only_their_waiting_run_and_is_never_queued(
        db: Conn, q: Queries) -> None:
    runs = _runs(db, q)
    db.execute("UPDATE notifyq.job_run SET status = 'waiting', wait_kind = 'signal', "
               "wait_token = 'go', run_at = '2999-12-31' WHERE id = %s", (runs["b"],))
    db.execute("INSERT INTO notifyq.job_step (run_id, step_id, seq, kind, status, attempts, "
               "attempt, started_at) VALUES (%s, 'signal:go', 1, 'signal', 'running', 1, 1, "
               "now())", (runs["b"],))
    send = q.job_signal_send
    assert db.execute(send, {"token": "go", "payload": "{}", "tenant_ids": ["a"]}
                      ).fetchone() == {"woken": 0}
    assert db.execute("SELECT count(*) AS n FROM notifyq.job_signal").fetchone() == {"n": 0}
    assert db.execute(send, {"token": "go", "payload": "{}", "tenant_ids": ["b"]}
                      ).fetchone() == {"woken": 1}
    assert db.execute(send, {"token": "go", "payload": "{}", "tenant_ids": None}
                      ).fetchone() == {"woken": 0}  # nobody waits: queued, as before
    assert db.execute("SELECT count(*) AS n FROM notifyq.job_signal").fetchone() == {"n": 1}


def test_a_dedupe_key_finds_only_runs_of_the_same_tenant(db: Conn, q: Queries) -> None:
    def once(tenant: str | None) -> Any:
        return enqueue(db, q, "t.a", tenant_id=tenant, dedupe_key="order-7",
                       allow_unknown_type=True)["id"]
    first = {t: once(t) for t in ("a", "b", None)}
    assert len(set(first.values())) == 3  # one run per tenant, and one of no tenant
    assert {t: once(t) for t in ("a", "b", None)} == first  # each tenant's duplicate is its own
