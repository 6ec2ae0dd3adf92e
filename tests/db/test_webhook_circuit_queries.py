"""Migration 0015's SQL: per-endpoint concurrency keys on delivery runs, the circuit breaker
kept by the attempt record, parking and the half-open probe, and the ``invalid`` error kind."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import DEFINITION
from tests.db.test_webhook_queries import _attempt, _endpoint, _record_many, _send

Conn = psycopg.Connection[dict[str, Any]]
COOLDOWN = timedelta(seconds=60)


def _define_deliver(db: Conn, q: Queries, *, limit: int = 3) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": "webhook.deliver", "pool": "webhooks",
                              "concurrency_key_template": "webhook:{endpoint_id}",
                              "concurrency_collision": "queue", "concurrency_limit": limit})


def _fail(db: Conn, q: Queries, endpoint: Any, now: Any, n: int = 1) -> Any:
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status="pending")] * n,
                 now, breaker_failures=3, breaker_cooldown_s=COOLDOWN.total_seconds())
    return _circuit(db, endpoint)


def _circuit(db: Conn, endpoint: Any) -> Any:
    return db.execute("SELECT consecutive_failures, circuit_open_until "
                      "FROM notifyq.webhook_endpoint WHERE id = %s", (endpoint,)).fetchone()


def test_send_gives_each_run_its_endpoints_concurrency_key_and_limit(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    _send(db, q, endpoint_id=endpoint)  # no definition yet: keyed all the same (0038)
    _define_deliver(db, q, limit=3)
    _send(db, q, endpoint_id=endpoint)
    rows = db.execute("SELECT concurrency_key, concurrency_limit, defaulted "
                      "FROM notifyq.job_run ORDER BY id").fetchall()
    key = f"webhook:{endpoint}"
    assert rows == [{"concurrency_key": key, "concurrency_limit": 1, "defaulted": 8},
                    {"concurrency_key": key, "concurrency_limit": 3, "defaulted": None}]


def test_the_keyed_claim_runs_at_most_the_limit_of_one_endpoints_deliveries(
        db: Conn, q: Queries) -> None:
    _define_deliver(db, q, limit=2)
    slow, other = _endpoint(db, q), _endpoint(db, q)
    for _ in range(5):
        _send(db, q, endpoint_id=slow)
    _send(db, q, endpoint_id=other)
    claimed = db.execute(q.job_run_claim_keyed, {
        "pool": "webhooks", "limit": 10, "worker_id": "w", "lease_s": 30.0,
        "now": None}).fetchall()
    per_endpoint = sorted(r["input"]["endpoint_id"] == str(slow) for r in claimed)
    assert per_endpoint == [False, True, True]


def test_failures_in_a_row_open_the_circuit_and_a_success_closes_it(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    assert _fail(db, q, endpoint, T0, 2) == {"consecutive_failures": 2,
                                             "circuit_open_until": None}
    later = T0 + timedelta(seconds=5)
    assert _fail(db, q, endpoint, later) == {"consecutive_failures": 3,
                                            "circuit_open_until": later + COOLDOWN}
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status="pending"),
                         _attempt(message, endpoint, succeeded=True, status="succeeded")],
                 later, breaker_failures=3)
    assert _circuit(db, endpoint) == {"consecutive_failures": 0, "circuit_open_until": None}


def test_a_success_then_failures_in_one_batch_counts_only_the_failures_after_it(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    _fail(db, q, endpoint, T0, 2)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=True, status="succeeded"),
                         _attempt(message, endpoint, succeeded=False, status="pending")],
                 T0, breaker_failures=3)
    assert _circuit(db, endpoint) == {"consecutive_failures": 1, "circuit_open_until": None}


def test_a_breaker_of_zero_never_opens(db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    _record_many(db, q, [_attempt(message, endpoint, succeeded=False, status="pending")] * 9,
                 T0, breaker_failures=0)
    assert _circuit(db, endpoint) == {"consecutive_failures": 9, "circuit_open_until": None}


def test_park_moves_the_endpoints_pending_runs_to_the_end_of_the_cooldown(
        db: Conn, q: Queries) -> None:
    endpoint, other = _endpoint(db, q), _endpoint(db, q)
    _send(db, q, endpoint_id=endpoint)
    _send(db, q, endpoint_id=other)
    later = _send(db, q, endpoint_id=endpoint)
    far = T0 + timedelta(days=1)
    db.execute("UPDATE notifyq.job_run SET run_at = %s WHERE trigger_ref = %s",
               (far, later["message_id"]))
    parked = db.execute(q.webhook_delivery_park, {"endpoint_id": endpoint, "until": T0,
                                                  "now": T0}).fetchall()
    assert len(parked) == 1  # the other endpoint's run and the later one keep their time
    times = sorted(r["run_at"] for r in db.execute(
        "SELECT run_at FROM notifyq.job_run").fetchall())
    assert times[1:] == [T0, far]


def test_a_send_to_an_open_circuit_is_parked_until_it_may_be_tried(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    until = _fail(db, q, endpoint, T0, 3)["circuit_open_until"]
    sent = _send(db, q, endpoint_id=endpoint)
    run_at = db.execute("SELECT run_at FROM notifyq.job_run WHERE trigger_ref = %s",
                        (sent["message_id"],)).fetchone()
    assert run_at == {"run_at": until}


def test_after_the_cooldown_one_delivery_takes_the_probe_and_the_others_wait(
        db: Conn, q: Queries, db2: Conn) -> None:
    endpoint = _endpoint(db, q)
    until = _fail(db, q, endpoint, T0, 3)["circuit_open_until"]
    params = {"endpoint_id": endpoint, "probe_s": 20.0}
    held = db.execute(q.webhook_endpoint_circuit_hold, {**params, "now": T0}).fetchone()
    assert held == {"open_until": until, "probe": False}
    after = until + timedelta(seconds=1)
    probe = db.execute(q.webhook_endpoint_circuit_hold, {**params, "now": after}).fetchone()
    assert probe == {"open_until": after + timedelta(seconds=20), "probe": True}
    other = db2.execute(q.webhook_endpoint_circuit_hold, {**params, "now": after}).fetchone()
    assert other == {"open_until": after + timedelta(seconds=20), "probe": False}


def test_enable_closes_the_circuit(db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    _fail(db, q, endpoint, T0, 3)
    db.execute(q.webhook_endpoint_enable, {"id": endpoint, "now": T0})
    assert _circuit(db, endpoint) == {"consecutive_failures": 0, "circuit_open_until": None}


def test_an_attempt_that_could_not_be_sent_is_recorded_as_invalid(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    attempt = {**_attempt(message, endpoint, succeeded=False, status="failed"),
               "status_code": None, "error_kind": "invalid", "error": "headers: ..."}
    _record_many(db, q, [attempt], T0)
    with pytest.raises(psycopg.errors.CheckViolation):
        _record_many(db, q, [{**attempt, "error_kind": "bogus"}], T0)


def test_an_attempt_recorded_as_neither_leaves_the_streak_and_the_circuit_alone(
        db: Conn, q: Queries) -> None:
    # A 429 with Retry-After (migration 0028): recorded with succeeded NULL.
    endpoint = _endpoint(db, q)
    assert _fail(db, q, endpoint, T0, n=2) == {"consecutive_failures": 2,
                                               "circuit_open_until": None}
    message = _send(db, q, endpoint_id=endpoint)["message_id"]
    held = {**_attempt(message, endpoint, succeeded=False, status="pending", code=429),
            "succeeded": None}
    streak = _record_many(db, q, [held] * 3, T0 + timedelta(seconds=1), breaker_failures=3)
    assert _circuit(db, endpoint) == {"consecutive_failures": 2, "circuit_open_until": None}
    assert streak[0] == T0  # the streak the failures started, unchanged
    fresh = _endpoint(db, q)
    message = _send(db, q, endpoint_id=fresh)["message_id"]
    _record_many(db, q, [{**held, "message_id": message, "endpoint_id": fresh}], T0)
    row = db.execute("SELECT failing_since FROM notifyq.webhook_endpoint WHERE id = %s",
                     (fresh,)).fetchone()
    assert row == {"failing_since": None}  # no streak started
    attempts = db.execute("SELECT count(*) AS n FROM notifyq.webhook_attempt "
                          "WHERE status_code = 429").fetchone()
    assert attempts == {"n": 4}  # each still an attempt on record
