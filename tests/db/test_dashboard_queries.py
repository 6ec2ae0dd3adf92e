"""The named queries the dashboard (and the /v1 routes beside it) read: the run filter's count
and ids, bulk cancel and retry, the per-pool overview, the per-minute series, leaders,
schedules' latest ticks, webhook health and message lists."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

from notifyq._control import _planned
from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import LIST_FILTERS, Conn, claim, enqueue, finish
from tests.db.test_webhook_queries import _attempt, _endpoint, _record_many, _send

FILTER = dict(LIST_FILTERS)
NO_MESSAGE_FILTER = {"tenant_ids": None, "event_type": None, "to_endpoint": None}


def _runs(db: Conn, q: Queries, n: int, job_type: str = "t.a") -> list[UUID]:
    return [enqueue(db, q, job_type, {"i": i}, run_at=T0, allow_unknown_type=True)["id"]
            for i in range(n)]


def _fail(db: Conn, q: Queries, now: Any, n: int) -> list[UUID]:
    claimed = claim(db, q, now, limit=n)
    finish(db, q, now, [(r["id"], r["fence"], "failed") for r in claimed])
    return [r["id"] for r in claimed]


def test_count_and_ids_follow_the_list_filter_within_the_actions_statuses(
        db: Conn, q: Queries) -> None:
    ids = _runs(db, q, 5) + _runs(db, q, 2, "t.b")
    params = {**FILTER, "job_type": "t.a", "statuses": ["pending", "waiting", "running"]}
    assert db.execute(q.job_run_count, {"tenant_ids": None,
                                        **params, "cap": 100}).fetchone() == {"n": 5}
    assert db.execute(q.job_run_count, {"tenant_ids": None,
                                        **params, "cap": 3}).fetchone() == {"n": 3}
    assert db.execute(q.job_run_count, {"tenant_ids": None,
                                        **params, "statuses": ["failed"], "cap": 100}
                      ).fetchone() == {"n": 0}
    page = db.execute(q.job_run_list_ids, {"tenant_ids": None, **params, "limit": 3}).fetchall()
    assert [r["id"] for r in page] == sorted(ids[:5], reverse=True)[:3]
    after = db.execute(q.job_run_list_ids, {"tenant_ids": None,
                                            **params, "limit": 10, "before_id": page[-1]["id"]})
    assert len(after.fetchall()) == 2
    bounded = db.execute(q.job_run_list_ids, {"tenant_ids": None,
                                              **params, "limit": 10, "min_id": ids[3]})
    assert {r["id"] for r in bounded.fetchall()} == set(ids[3:5])


def test_cancel_many_and_retry_many_change_only_runs_they_apply_to(db: Conn, q: Queries) -> None:
    pending = _runs(db, q, 3)
    failed = _fail(db, q, T0 + timedelta(seconds=1), 2)
    canceled = db.execute(q.job_run_cancel_many, {"tenant_ids": None, "ids": [*pending, *failed],
                                                  "now": T0}).fetchall()
    assert {r["id"] for r in canceled} == set(pending) - set(failed)
    assert {r["status"] for r in canceled} == {"canceled"}
    retried = db.execute(q.job_run_retry_many, {"tenant_ids": None, "ids": [*pending, *failed],
                                                "now": T0}).fetchall()
    assert {r["id"] for r in retried} == set(pending)  # all now failed or canceled
    assert {r["status"] for r in retried} == {"pending"}


def test_cancel_many_asks_a_running_run_to_stop(db: Conn, q: Queries) -> None:
    [run_id] = _runs(db, q, 1)
    claim(db, q, T0 + timedelta(seconds=1))
    [row] = db.execute(q.job_run_cancel_many, {"tenant_ids": None,
                                               "ids": [run_id], "now": T0}).fetchall()
    assert row["status"] == "running"
    assert db.execute("SELECT cancel_requested_at FROM notifyq.job_run").fetchone() == {
        "cancel_requested_at": T0}


def test_delete_many_deletes_only_finished_runs_with_their_steps(db: Conn, q: Queries) -> None:
    pending = _runs(db, q, 2)
    failed = _fail(db, q, T0 + timedelta(seconds=1), 1)
    db.execute("INSERT INTO notifyq.job_step (run_id, step_id, seq, kind, status) "
               "VALUES (%s, 's', 1, 'step', 'completed')", (failed[0],))
    deleted = db.execute(q.job_run_delete_many, {"tenant_ids": None,
                                                 "ids": [*pending, *failed]}).fetchall()
    assert [(r["id"], r["status"]) for r in deleted] == [(failed[0], "failed")]
    assert db.execute("SELECT count(*) AS n FROM notifyq.job_run").fetchone() == {"n": 1}
    assert db.execute("SELECT count(*) AS n FROM notifyq.job_step").fetchone() == {"n": 0}


def test_reschedule_many_moves_only_pending_runs(db: Conn, q: Queries) -> None:
    failed = _fail(db, q, T0 + timedelta(seconds=1), 1)
    pending = _runs(db, q, 2)
    later = T0 + timedelta(days=1)
    moved = db.execute(q.job_run_reschedule_many, {"tenant_ids": None,
                                                   "ids": [*pending, *failed], "run_at": later,
                                                   "now": T0}).fetchall()
    assert {r["id"] for r in moved} == set(pending)
    rows = db.execute("SELECT status, run_at, updated_at FROM notifyq.job_run WHERE id = ANY(%s)",
                      (pending,)).fetchall()
    assert rows == [{"status": "pending", "run_at": later, "updated_at": T0}] * 2


def test_the_pool_overview_counts_live_runs_and_the_last_hours_failures(
        db: Conn, q: Queries) -> None:
    now = T0 + timedelta(minutes=10)
    _runs(db, q, 4)
    _fail(db, q, now - timedelta(minutes=5), 1)
    claim(db, q, now - timedelta(minutes=1), limit=1)
    enqueue(db, q, "t.a", {}, run_at=now + timedelta(hours=1), allow_unknown_type=True)
    enqueue(db, q, "t.a", {}, run_at=T0, pool="other", allow_unknown_type=True)
    rows = db.execute(q.job_run_pool_overview, {"now": now}).fetchall()
    assert rows == [
        {"pool": "default", "runnable": 2, "scheduled": 1, "running": 1, "waiting": 0,
         "failed_last_hour": 1, "oldest_runnable_age_s": 600.0},
        {"pool": "other", "runnable": 1, "scheduled": 0, "running": 0, "waiting": 0,
         "failed_last_hour": 0, "oldest_runnable_age_s": 600.0}]
    later = db.execute(q.job_run_pool_overview, {"now": now + timedelta(hours=2)}).fetchall()
    assert later[0]["failed_last_hour"] == 0


def test_the_type_overview_counts_live_runs_by_state_and_the_last_hours_finished(
        db: Conn, q: Queries) -> None:
    now = T0 + timedelta(minutes=10)
    _runs(db, q, 4)
    _fail(db, q, now - timedelta(minutes=5), 1)
    claim(db, q, now - timedelta(minutes=1), limit=1)
    enqueue(db, q, "t.a", {}, run_at=now + timedelta(hours=1), allow_unknown_type=True)
    retry = enqueue(db, q, "t.b", {}, run_at=now + timedelta(hours=1), allow_unknown_type=True)
    db.execute("UPDATE notifyq.job_run SET attempts = 1 WHERE id = %s", (retry["id"],))
    rows = db.execute(q.job_run_type_overview, {"now": now}).fetchall()
    assert rows == [
        {"job_type": "t.a", "pending": 2, "scheduled": 1, "retrying": 0, "running": 1,
         "waiting": 0, "completed_last_hour": 0, "failed_last_hour": 1,
         "canceled_last_hour": 0},
        {"job_type": "t.b", "pending": 0, "scheduled": 0, "retrying": 1, "running": 0,
         "waiting": 0, "completed_last_hour": 0, "failed_last_hour": 0,
         "canceled_last_hour": 0}]


def test_the_list_filter_tells_retried_runs_from_new_ones(
        db: Conn, q: Queries) -> None:
    due = _runs(db, q, 1)[0]
    later = enqueue(db, q, "t.a", {}, run_at=T0 + timedelta(hours=1), allow_unknown_type=True)
    retry = enqueue(db, q, "t.a", {}, run_at=T0 + timedelta(hours=1), allow_unknown_type=True)
    db.execute("UPDATE notifyq.job_run SET attempts = 1 WHERE id = %s", (retry["id"],))

    def listed(**filters: Any) -> set[UUID]:
        rows = db.execute(q.job_run_list, {**FILTER, "now": T0, "limit": 10, **filters})
        return {r["id"] for r in rows.fetchall()}
    assert listed(due="now") == {due}
    assert listed(due="later", retried=False) == {later["id"]}
    assert listed(due="later", retried=True) == {retry["id"]}
    params = {**FILTER, "now": T0, "due": "later", "statuses": ["pending"]}
    assert db.execute(q.job_run_count, {**params, "cap": 10}).fetchone() == {"n": 2}
    assert len(db.execute(q.job_run_list_ids, {**params, "limit": 10}).fetchall()) == 2


def test_the_series_has_every_minute_with_completions_failures_and_latency(
        db: Conn, q: Queries) -> None:
    _runs(db, q, 3)
    started = T0 + timedelta(seconds=30)
    claimed = claim(db, q, started, limit=3)
    done_at = T0 + timedelta(minutes=2, seconds=5)
    finish(db, q, done_at, [(r["id"], r["fence"], "completed") for r in claimed[:2]])
    finish(db, q, done_at, [(claimed[2]["id"], claimed[2]["fence"], "failed")])
    rows = db.execute(q.job_run_series, {"now": T0 + timedelta(minutes=3), "minutes": 5}
                      ).fetchall()
    assert [r["minute"] for r in rows] == [T0 + timedelta(minutes=m) for m in range(-1, 4)]
    by_minute = {r["minute"]: r for r in rows}
    busy = by_minute[T0 + timedelta(minutes=2)]
    assert (busy["completed"], busy["failed"]) == (2, 1)
    assert busy["latency_p50_s"] == pytest.approx(30.0)
    assert by_minute[T0]["completed"] == 0
    assert by_minute[T0]["latency_p50_s"] is None


def test_leader_list_says_whether_the_lease_is_alive(db: Conn, q: Queries) -> None:
    db.execute(q.leader_attempt_elect, {"now": T0, "name": "maintenance", "leader_id": "w1",
                                        "ttl_s": 15})
    [alive] = db.execute(q.leader_list, {"now": T0 + timedelta(seconds=5)}).fetchall()
    assert (alive["leader_id"], alive["alive"]) == ("w1", True)
    [gone] = db.execute(q.leader_list, {"now": T0 + timedelta(seconds=20)}).fetchall()
    assert gone["alive"] is False


def test_endpoint_health_counts_recent_attempts_and_names_the_last_failure(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    quiet = _endpoint(db, q)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status=None)],
                 T0 - timedelta(days=2))
    _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status=None),
                         _attempt(message, endpoint, succeeded=True, status="succeeded")], T0)
    rows = db.execute(q.webhook_endpoint_health, {"tenant_ids": None,
                                                  "ids": None, "now": T0, "window_s": 86400,
                                                  "limit": 10}).fetchall()
    health = {r["endpoint_id"]: r for r in rows}
    assert (health[endpoint]["attempts"], health[endpoint]["succeeded"]) == (2, 1)
    assert health[endpoint]["last_status_code"] in (200, 500)
    assert health[endpoint]["last_failure_status_code"] == 500
    assert (health[quiet]["attempts"], health[quiet]["last_attempt_at"]) == (0, None)
    one = db.execute(q.webhook_endpoint_health, {"tenant_ids": None, "ids": [quiet], "now": T0,
                                                 "window_s": 86400, "limit": 10}).fetchall()
    assert [r["endpoint_id"] for r in one] == [quiet]


def test_messages_list_newest_first_overall_and_per_endpoint(db: Conn, q: Queries) -> None:
    first, second = _endpoint(db, q), _endpoint(db, q)
    sent = [_send(db, q, endpoint_id=first)["message_id"] for _ in range(3)]
    other = _send(db, q, endpoint_id=second)["message_id"]
    everything = db.execute(q.webhook_message_list, {**NO_MESSAGE_FILTER,
                                                     "before": None, "limit": 10}).fetchall()
    assert [m["id"] for m in everything] == [other, *reversed(sent)]
    assert everything[0]["deliveries"] == 1
    page = db.execute(q.webhook_message_list, {**NO_MESSAGE_FILTER,
                                               "before": other, "limit": 2}).fetchall()
    assert [m["id"] for m in page] == [sent[2], sent[1]]
    mine = db.execute(q.webhook_delivery_list_by_endpoint, {
        "endpoint_id": first, "before": None, "limit": 10, "now": None}).fetchall()
    assert [m["id"] for m in mine] == list(reversed(sent))
    assert {m["status"] for m in mine} == {"pending"}


def _messages(db: Conn, q: Queries, **filters: Any) -> list[dict[str, Any]]:
    return db.execute(q.webhook_message_list, {
        **NO_MESSAGE_FILTER, "before": None, "limit": 10, **filters}).fetchall()


def test_message_lists_count_retrying_deliveries_and_filter_by_event_type_and_endpoint(
        db: Conn, q: Queries) -> None:
    first, second = _endpoint(db, q), _endpoint(db, q)
    retried = _send(db, q, "order.created", endpoint_id=first)["message_id"]
    other = _send(db, q, "invoice.paid", endpoint_id=second)["message_id"]
    _record_many(db, q, [_attempt(retried, first, succeeded=False, status="pending")], T0)
    counts = {m["id"]: (m["failed"], m["retrying"]) for m in _messages(db, q)}
    assert counts == {retried: (0, 1), other: (0, 0)}  # a 500 being retried is not "failed"
    assert [m["id"] for m in _messages(db, q, event_type="invoice.paid")] == [other]
    assert [m["id"] for m in _messages(db, q, to_endpoint=first)] == [retried]
    assert _messages(db, q, event_type="invoice.paid", to_endpoint=first) == []


def test_pending_deliveries_have_their_next_attempt_and_are_held_while_the_circuit_is_open(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    run_at = db.execute("SELECT run_at FROM notifyq.job_run").fetchone()
    assert run_at is not None

    def next_and_held(now: Any) -> list[tuple[Any, Any]]:
        listed = db.execute(q.webhook_delivery_list, {"message_id": message, "now": now})
        by_endpoint = db.execute(q.webhook_delivery_list_by_endpoint, {
            "endpoint_id": endpoint, "before": None, "limit": 10, "now": now})
        return [(r["next_attempt_at"], r["held_until"])
                for r in [*listed.fetchall(), *by_endpoint.fetchall()]]

    assert next_and_held(T0) == [(run_at["run_at"], None)] * 2
    db.execute("UPDATE notifyq.webhook_endpoint SET circuit_open_until = %s",
               (T0 + timedelta(seconds=60),))
    assert next_and_held(T0) == [(run_at["run_at"], T0 + timedelta(seconds=60))] * 2
    assert next_and_held(T0 + timedelta(seconds=61)) == [(run_at["run_at"], None)] * 2
    db.execute("UPDATE notifyq.job_run SET status = 'running'")
    assert next_and_held(T0) == [(None, None)] * 2  # an attempt is under way


def test_read_no_jit_switches_jit_off_for_the_transaction_only(db: Conn, q: Queries) -> None:
    with db.transaction():
        db.execute(q.job_run_read_no_jit)
        assert db.execute("SHOW jit").fetchone() == {"jit": "off"}
    assert db.execute("SHOW jit").fetchone() != {"jit": "off"} or (
        db.execute("SELECT boot_val FROM pg_settings WHERE name = 'jit'").fetchone()
        == {"boot_val": "off"})


def test_count_timeout_stops_a_statement_of_this_transaction_only(db: Conn, q: Queries) -> None:
    import psycopg

    with db.transaction():
        db.execute(q.job_run_count_timeout, {"ms": "50ms"})
        assert db.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "50ms"}
        with pytest.raises(psycopg.errors.QueryCanceled), db.transaction():
            db.execute("SELECT pg_sleep(2)")
    assert db.execute("SHOW statement_timeout").fetchone() != {"statement_timeout": "50ms"}


def test_count_plan_is_the_counts_plan_with_the_planners_estimate_under_its_limit(
        db: Conn, q: Queries) -> None:
    _runs(db, q, 6)
    _runs(db, q, 2, "t.b")
    db.execute("ANALYZE notifyq.job_run")
    params = {**FILTER, "job_type": "t.a", "statuses": ["pending"], "cap": 3}
    explained = db.execute(q.job_run_count_plan, params).fetchall()[0]["QUERY PLAN"]
    cost, estimate = _planned(explained)
    assert cost > 0
    assert estimate == 6  # not the count's cap: the rows under its LIMIT
    assert db.execute(q.job_run_count, params).fetchone() == {"n": 3}
