"""Migration 0030's SQL: operator events recorded once where a state flips (the trigger on
webhook_endpoint), once per failure streak for endpoints failing for long, claimed once by
concurrent announcers, listed per tenant and pruned."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.test_webhook_queries import _attempt, _endpoint, _record_many, _send

Conn = psycopg.Connection[dict[str, Any]]


def _events(db: Conn, kind: str | None = None) -> list[dict[str, Any]]:
    return db.execute("SELECT * FROM notifyq.operator_event WHERE %(kind)s::text IS NULL "
                      "OR kind = %(kind)s ORDER BY id", {"kind": kind}).fetchall()


def _fail(db: Conn, q: Queries, endpoint: Any, now: Any, n: int = 1) -> None:
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status="pending")] * n,
                 now, breaker_failures=3, breaker_cooldown_s=60.0)


def test_disabling_an_endpoint_records_one_event_however_often_it_is_disabled(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    for reason in ("the endpoint answered 410 Gone", "disabled by hand"):
        db.execute(q.webhook_endpoint_disable, {"id": endpoint, "reason": reason, "now": T0})
    [event] = _events(db)
    assert (event["kind"], event["endpoint_id"], event["created_at"]) == (
        "endpoint.disabled", endpoint, T0)
    assert event["detail"]["cause"] == "gone"
    assert event["detail"]["reason"] == "the endpoint answered 410 Gone"
    db.execute(q.webhook_endpoint_enable, {"id": endpoint, "now": T0})
    db.execute(q.webhook_endpoint_disable, {"id": endpoint, "reason": "maintenance", "now": T0})
    db.execute(q.webhook_endpoint_enable, {"id": endpoint, "now": T0})
    db.execute(q.webhook_endpoint_disable, {
        "id": endpoint, "reason": "failing continuously since 2030-01-01T12:00:00+00:00",
        "now": T0})
    assert [e["detail"]["cause"] for e in _events(db, "endpoint.disabled")] == [
        "gone", "operator", "failing"]


def test_the_circuit_opening_and_closing_each_record_one_event_per_streak(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    _fail(db, q, endpoint, T0, n=2)
    assert _events(db) == []
    _fail(db, q, endpoint, T0, n=2)   # reaches 3: opens
    _fail(db, q, endpoint, T0 + timedelta(seconds=61))  # a failed probe: open again, same streak
    [opened] = _events(db)
    assert opened["kind"] == "endpoint.circuit_opened"
    assert opened["detail"]["consecutive_failures"] == 4
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=True, status="succeeded")],
                 T0 + timedelta(seconds=130), breaker_failures=3)
    assert [e["kind"] for e in _events(db)] == ["endpoint.circuit_opened",
                                               "endpoint.circuit_closed"]
    assert _events(db, "endpoint.circuit_closed")[0]["detail"]["cause"] == "success"


def test_endpoints_failing_for_long_are_recorded_once_per_streak(
        db: Conn, db2: Conn, q: Queries) -> None:
    failing, young = _endpoint(db, q), _endpoint(db, q)
    _fail(db, q, failing, T0)
    _fail(db, q, young, T0 + timedelta(minutes=50))
    params = {"now": T0 + timedelta(hours=1), "after_s": 3600.0}
    with db.transaction(), db2.transaction():  # two announcers at once: one row
        first = db.execute(q.operator_event_record_failing, params).fetchall()
        db2.execute("SET LOCAL lock_timeout = '200ms'")
        try:
            second = db2.execute(q.operator_event_record_failing, params).fetchall()
        except psycopg.errors.LockNotAvailable:
            second = []  # waits on the first's unique key; after its commit it inserts nothing
    assert len(first) == 1
    assert second == []
    assert db.execute(q.operator_event_record_failing, params).fetchall() == []
    [event] = _events(db, "endpoint.failing")
    assert event["endpoint_id"] == failing
    assert event["detail"]["failing_for_s"] == 3600
    message = _send(db, q, endpoint_id=failing)["message_id"]   # the streak ends...
    _record_many(db, q, [_attempt(message, failing, succeeded=True, status="succeeded")],
                 T0 + timedelta(hours=1))
    _fail(db, q, failing, T0 + timedelta(hours=2))              # ... and a new one starts
    later = {"now": T0 + timedelta(hours=3), "after_s": 3600.0}
    assert len(db.execute(q.operator_event_record_failing, later).fetchall()) == 2  # + young


def test_concurrent_claims_take_each_event_once_and_the_list_filters_by_tenant(
        db: Conn, db2: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    db.execute("UPDATE notifyq.webhook_endpoint SET tenant_id = 'acme' WHERE id = %s",
               (endpoint,))
    db.execute(q.webhook_endpoint_disable, {"id": endpoint, "reason": "x", "now": T0})
    [purge] = db.execute(q.operator_event_record, {
        "kind": "retention.purged", "endpoint_id": None, "detail": Jsonb({"runs_deleted": 3}),
        "dedupe_key": None, "now": T0}).fetchall()
    with db.transaction(), db2.transaction():
        mine = db.execute(q.operator_event_claim, {"now": T0, "limit": 10}).fetchall()
        theirs = db2.execute(q.operator_event_claim, {"now": T0, "limit": 10}).fetchall()
    assert sorted(e["kind"] for e in mine) == ["endpoint.disabled", "retention.purged"]
    assert theirs == []
    db.execute(q.operator_event_sent, {"ids": [purge["id"]], "message_ids": ["msg_1"]})
    listed = db.execute(q.operator_event_list, {
        "before": None, "kind": None, "endpoint_id": None, "tenant_ids": None,
        "limit": 10}).fetchall()
    assert [e["message_id"] for e in listed] == ["msg_1", None]   # newest first
    acme = db.execute(q.operator_event_list, {
        "before": None, "kind": None, "endpoint_id": None, "tenant_ids": ["acme"],
        "limit": 10}).fetchall()
    assert [(e["kind"], e["tenant_id"]) for e in acme] == [("endpoint.disabled", "acme")]
    assert db.execute(q.operator_event_list, {
        "before": None, "kind": None, "endpoint_id": None, "tenant_ids": ["other"],
        "limit": 10}).fetchall() == []


def test_emitted_events_past_their_retention_are_pruned(db: Conn, q: Queries) -> None:
    for n in range(2):
        db.execute(q.operator_event_record, {
            "kind": "retention.purged", "endpoint_id": None, "detail": Jsonb({}),
            "dedupe_key": f"k{n}", "now": T0 + timedelta(days=n)})
    assert db.execute(q.operator_event_record, {
        "kind": "retention.purged", "endpoint_id": None, "detail": Jsonb({}),
        "dedupe_key": "k0", "now": T0}).fetchall() == []   # the key was recorded before
    params = {"now": T0 + timedelta(days=1, hours=1), "retention_s": 86_400.0, "limit": 10}
    assert db.execute(q.operator_event_prune, params).rowcount == 0  # none emitted yet
    db.execute(q.operator_event_claim, {"now": T0, "limit": 10})
    assert db.execute(q.operator_event_prune, params).rowcount == 1
    assert [e["dedupe_key"] for e in _events(db)] == ["k1"]
