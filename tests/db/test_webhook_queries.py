"""The webhook named queries, run directly (SQL behaviour; the Python around them is tested in
tests/webhooks)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from notifyq._db.queries import Queries
from tests.db.conftest import T0

Conn = psycopg.Connection[dict[str, Any]]


def _endpoint(db: Conn, q: Queries, *, event_types: list[str] | None = None,
              enabled: bool = True) -> Any:
    row = db.execute(q.webhook_endpoint_insert, {
        "url": "https://hooks.example/x", "description": "d", "event_types": event_types,
        "headers": Jsonb({"X-A": "1"}), "enabled": enabled, "now": T0,
        "tenant_id": None, "rate_limit": None}).fetchone()
    assert row is not None
    db.execute(q.webhook_secret_insert, {"id": uuid.uuid4(), "endpoint_id": row["id"],
                                         "ciphertext": b"c" * 40, "now": T0})
    return row["id"]


def _send(db: Conn, q: Queries, event_type: str = "a.b", *, endpoint_id: Any = None,
          key: str | None = None) -> dict[str, Any]:
    row = db.execute(q.webhook_message_send, {
        "event_type": event_type, "payload": Jsonb({"n": 1}), "endpoint_id": endpoint_id,
        "idempotency_key": key}).fetchone()
    assert row is not None
    return row


def _attempt(message_id: str, endpoint_id: Any, *, succeeded: bool, status: str | None,
             counted: int = 1, code: int | None = None, error_kind: str | None = None,
             duration_ms: float = 1.5) -> dict[str, Any]:
    code = code if code is not None or error_kind else (200 if succeeded else 500)
    return {"message_id": message_id, "endpoint_id": endpoint_id, "run_id": None,
            "trigger": "scheduled" if counted else "manual", "attempt": 1,
            "webhook_timestamp": 1, "url": "u", "status_code": code,
            "error_kind": error_kind, "error": None if succeeded else "failed",
            "duration_ms": duration_ms,
            "response_body": "ok", "response_truncated": False, "next_attempt_at": None,
            "delivery_status": status, "counted": counted, "succeeded": succeeded}


def _record_many(db: Conn, q: Queries, attempts: list[dict[str, Any]],
                 now: Any, *, breaker_failures: int = 0,
                 breaker_cooldown_s: float = 60.0) -> list[Any]:
    """Each attempt's failing_since, in order (the circuit breaker off unless given)."""
    columns = {"message_id": "message_ids", "endpoint_id": "endpoint_ids",
               "run_id": "run_ids", "trigger": "triggers", "attempt": "attempts",
               "webhook_timestamp": "webhook_timestamps", "url": "urls",
               "status_code": "status_codes", "error_kind": "error_kinds", "error": "errors",
               "duration_ms": "durations_ms", "response_body": "response_bodies",
               "response_truncated": "response_truncated",
               "next_attempt_at": "next_attempt_ats", "delivery_status": "delivery_statuses",
               "counted": "counted", "succeeded": "succeeded"}
    params: dict[str, Any] = {plural: [a[name] for a in attempts]
                              for name, plural in columns.items()}
    rows = db.execute(q.webhook_attempt_record_many, {
        **params, "now": now, "breaker_failures": breaker_failures,
        "breaker_cooldown_s": breaker_cooldown_s}).fetchall()
    assert sorted(r["ord"] for r in rows) == list(range(1, len(attempts) + 1))
    return [r["failing_since"] for r in sorted(rows, key=lambda r: r["ord"])]


def _record(db: Conn, q: Queries, message_id: str, endpoint_id: Any, *, succeeded: bool,
            now: Any, status: str | None, counted: int = 1) -> dict[str, Any]:
    attempt = _attempt(message_id, endpoint_id, succeeded=succeeded, status=status,
                       counted=counted)
    return {"failing_since": _record_many(db, q, [attempt], now)[0]}


def test_endpoints_are_inserted_listed_updated_disabled_enabled_and_deleted(
        db: Conn, q: Queries) -> None:
    first = _endpoint(db, q)
    second = _endpoint(db, q, enabled=False)
    got = db.execute(q.webhook_endpoint_get, {"id": first, "now": T0}).fetchone()
    assert got is not None
    assert (got["valid_secrets"], got["headers"]) == (1, {"X-A": "1"})
    listed = db.execute(q.webhook_endpoint_list, {"tenant_ids": None,
                                                  "after": None, "enabled": None, "limit": 10,
                                                  "now": T0}).fetchall()
    assert [r["id"] for r in listed] == [first, second]
    enabled = db.execute(q.webhook_endpoint_list, {"tenant_ids": None,
                                                   "after": None, "enabled": True,
                                                   "limit": 10, "now": T0}).fetchall()
    assert [r["id"] for r in enabled] == [first]
    after = db.execute(q.webhook_endpoint_list, {"tenant_ids": None,
                                                 "after": first, "enabled": None, "limit": 10,
                                                 "now": T0}).fetchall()
    assert [r["id"] for r in after] == [second]

    updated = db.execute(q.webhook_endpoint_update, {
        "id": first, "url": None, "description": "new", "set_event_types": True,
        "event_types": ["x.y"], "headers": None, "now": T0, "set_rate_limit": True,
        "rate_limit": 7}).fetchone()
    assert updated is not None
    assert (updated["description"], updated["event_types"], updated["url"]) == (
        "new", ["x.y"], "https://hooks.example/x")
    kept = db.execute(q.webhook_endpoint_update, {
        "id": first, "url": None, "description": None, "set_event_types": False,
        "event_types": None, "headers": None, "now": T0, "set_rate_limit": False,
        "rate_limit": None}).fetchone()
    assert kept is not None
    assert (kept["event_types"], kept["rate_limit"]) == (["x.y"], 7)

    off = db.execute(q.webhook_endpoint_disable, {"id": first, "reason": "one", "now": T0}
                     ).fetchone()
    again = db.execute(q.webhook_endpoint_disable, {"id": first, "reason": "two",
                                                    "now": T0 + timedelta(hours=1)}).fetchone()
    assert off is not None
    assert again is not None
    assert (again["disabled_reason"], again["disabled_at"]) == ("one", T0)
    on = db.execute(q.webhook_endpoint_enable, {"id": first, "now": T0}).fetchone()
    assert on is not None
    assert (on["disabled_at"], on["disabled_reason"], on["failing_since"]) == (None, None, None)
    assert db.execute(q.webhook_endpoint_delete, {"id": first}).fetchone() is not None
    assert db.execute(q.webhook_endpoint_delete, {"id": first}).fetchone() is None
    assert db.execute("SELECT count(*) AS n FROM notifyq.webhook_secret").fetchone() == {"n": 1}


def test_a_rotation_expires_the_current_secrets_at_the_end_of_the_grace_period(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    expires = db.execute(q.webhook_secret_expiry, {"now": T0, "grace_s": 60.0}).fetchone()
    assert expires == {"expires_at": T0 + timedelta(seconds=60)}
    db.execute(q.webhook_secret_expire, {"endpoint_id": endpoint,
                                         "expires_at": expires["expires_at"]})
    db.execute(q.webhook_secret_insert, {"id": uuid.uuid4(), "endpoint_id": endpoint,
                                         "ciphertext": b"n" * 40, "now": T0})
    count = q.webhook_endpoint_get
    assert db.execute(count, {"id": endpoint, "now": T0 + timedelta(seconds=59)}
                      ).fetchone()["valid_secrets"] == 2  # type: ignore[index]
    assert db.execute(count, {"id": endpoint, "now": T0 + timedelta(seconds=60)}
                      ).fetchone()["valid_secrets"] == 1  # type: ignore[index]


def test_send_fans_out_by_event_type_and_is_idempotent_by_key(db: Conn, q: Queries) -> None:
    everything = _endpoint(db, q)
    paid = _endpoint(db, q, event_types=["order.paid"])
    _endpoint(db, q, event_types=["order.refunded"])
    _endpoint(db, q, enabled=False)
    sent = _send(db, q, "order.paid", key="k")
    assert (sent["created"], sent["deliveries"]) == (True, 2)
    assert sent["message_id"].startswith("msg_")
    again = _send(db, q, "order.paid", key="k")
    assert (again["message_id"], again["created"], again["deliveries"]) == (
        sent["message_id"], False, 2)
    only = _send(db, q, "order.refunded", endpoint_id=everything)
    assert only["deliveries"] == 1
    deliveries = db.execute(q.webhook_delivery_list, {"message_id": sent["message_id"],
                                                      "now": None}
                            ).fetchall()
    assert {d["endpoint_id"] for d in deliveries} == {everything, paid}
    message = db.execute(q.webhook_message_get, {"id": sent["message_id"]}).fetchone()
    assert message is not None
    assert message["body"] == '{"n": 1}'
    runs = db.execute("SELECT job_type, pool, input FROM notifyq.job_run").fetchall()
    assert len(runs) == 3
    assert {(r["job_type"], r["pool"]) for r in runs} == {("webhook.deliver", "webhooks")}


def test_send_many_writes_a_batch_like_send_in_one_statement(db: Conn, q: Queries) -> None:
    everything = _endpoint(db, q)
    paid = _endpoint(db, q, event_types=["order.paid"])
    _endpoint(db, q, enabled=False)
    db.execute("INSERT INTO notifyq.job (type, pool, concurrency_key_template, "
               "concurrency_limit) VALUES ('webhook.deliver', 'webhooks', "
               "'webhook:{endpoint_id}', 5)")
    before = _send(db, q, "order.paid", key="k0")
    rows = db.execute(q.webhook_message_send_many, {
        "event_types": ["order.paid", "x.y", "x.y", "order.paid"],
        "payloads": ['{"n": 1}', '[2]', '{"n": 3}', '{"n": 4}'],
        "endpoint_ids": [None, paid, None, None], "idempotency_keys": [None, None, "k0", "k1"],
    }).fetchall()
    assert [(r["ord"], r["created"], r["deliveries"]) for r in rows] == [
        (1, True, 2), (2, True, 1), (3, False, 2), (4, True, 2)]
    assert rows[2]["message_id"] == before["message_id"]
    runs = db.execute("SELECT r.concurrency_key, r.concurrency_limit, d.endpoint_id "
                      "FROM notifyq.webhook_delivery d JOIN notifyq.job_run r ON r.id = d.run_id "
                      "WHERE d.message_id = %s ORDER BY r.id", (rows[0]["message_id"],)
                      ).fetchall()
    assert [(r["concurrency_key"], r["concurrency_limit"]) for r in runs] == [
        (f"webhook:{e}", 5) for e in sorted((everything, paid))]


def test_send_many_by_copy_reads_its_fan_out_once_then_copies_the_rows(db: Conn,
                                                                        q: Queries) -> None:
    everything = _endpoint(db, q)
    paid = _endpoint(db, q, event_types=["order.paid"])
    _endpoint(db, q, event_types=["other"])
    off = _endpoint(db, q, enabled=False)
    [plain] = db.execute(q.webhook_endpoint_fan_out, {"event_types": ["x.y"],
                                                      "endpoint_ids": []}).fetchall()
    assert (plain["id"], plain["defined"], plain["concurrency_key_template"],
            plain["enabled"], plain["run_at"] == plain["now"]) == (
        everything, False, None, True, True)
    rows = db.execute(q.webhook_endpoint_fan_out, {"event_types": ["order.paid"],
                                                   "endpoint_ids": [off]}).fetchall()
    assert [(r["id"], r["enabled"]) for r in rows] == sorted(
        [(everything, True), (paid, True), (off, False)], key=lambda r: str(r[0]))
    before = _send(db, q, "order.paid", key="k0")
    with db.transaction():
        db.execute(q.webhook_message_lock_keys, {"keys": ["k1", "k0", "k1"]})
        locks = db.execute("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' "
                           "AND pid = pg_backend_pid()").fetchone()
        known = db.execute(q.webhook_message_by_keys, {"keys": ["k0", "k1"]}).fetchall()
        with db.cursor() as cur:
            with cur.copy(q.webhook_message_copy) as copy:
                copy.write('msg_1\tx.y\t{"n": 1}\t\\N\tk1\n')
            run_id = uuid.uuid4()
            with cur.copy(q.webhook_delivery_copy_runs) as copy:
                copy.write(f'{run_id}\twebhook.deliver\t1\t{{"message_id": "msg_1", '
                           f'"endpoint_id": "{everything}"}}\twebhooks\t0\t{T0.isoformat()}'
                           f"\t100\t\\N\t{{}}\tevent\tmsg_1\t\\N\twebhook:{everything}\t5\t\\N\n")
            with cur.copy(q.webhook_delivery_copy) as copy:
                copy.write(f"msg_1\t{everything}\t{run_id}\n")
    assert locks == {"n": 2}
    assert [(k["key"], k["id"], k["deliveries"]) for k in known] == [
        ("k0", before["message_id"], 2)]
    [row] = db.execute("SELECT m.body, m.idempotency_key, d.status, r.input, r.pool, "
                       "r.concurrency_key, r.trigger_source, r.trigger_ref, r.status AS run "
                       "FROM notifyq.webhook_message m "
                       "JOIN notifyq.webhook_delivery d ON d.message_id = m.id "
                       "JOIN notifyq.job_run r ON r.id = d.run_id WHERE m.id = 'msg_1'"
                       ).fetchall()
    assert row == {"body": '{"n": 1}', "idempotency_key": "k1", "status": "pending",
                   "input": {"message_id": "msg_1", "endpoint_id": str(everything)},
                   "pool": "webhooks", "concurrency_key": f"webhook:{everything}",
                   "trigger_source": "event", "trigger_ref": "msg_1", "run": "pending"}


def test_load_reads_message_endpoint_delivery_and_valid_secrets_in_one_row(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    sent = _send(db, q)
    other = _send(db, q)
    keys = {"message_ids": [sent["message_id"], "msg_missing", other["message_id"]],
            "endpoint_ids": [endpoint, endpoint, endpoint], "now": T0}
    rows = db.execute(q.webhook_delivery_load_many, keys).fetchall()
    assert sorted((r["ord"], r["message_id"]) for r in rows) == [
        (1, sent["message_id"]), (3, other["message_id"])]
    row = rows[0]
    assert (row["status"], row["attempts"], len(row["ciphertexts"])) == ("pending", 0, 1)
    db.execute("UPDATE notifyq.webhook_secret SET expires_at = %s", (T0,))
    row = db.execute(q.webhook_delivery_load_many, keys).fetchall()[0]
    assert (row["secret_ids"], row["ciphertexts"]) == ([], [])


def test_recording_attempts_tracks_the_failure_streak_and_the_delivery(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q)["message_id"]
    first = _record(db, q, message, endpoint, succeeded=False, now=T0, status="pending")
    assert first["failing_since"] == T0
    later = _record(db, q, message, endpoint, succeeded=False, now=T0 + timedelta(hours=1),
                    status="pending")
    assert later["failing_since"] == T0
    ok = _record(db, q, message, endpoint, succeeded=True, now=T0 + timedelta(hours=2),
                 status="succeeded")
    assert ok["failing_since"] is None
    delivery = db.execute(q.webhook_delivery_list,
                          {"message_id": message, "now": None}).fetchone()
    assert delivery is not None
    assert (delivery["status"], delivery["attempts"]) == ("succeeded", 3)
    attempts = db.execute(q.webhook_attempt_list, {"message_id": message, "limit": 10}
                          ).fetchall()
    assert [a["status_code"] for a in attempts] == [500, 500, 200]


def test_a_batch_of_attempts_updates_each_delivery_once_and_its_last_outcome_decides(
        db: Conn, q: Queries) -> None:
    a, b = _endpoint(db, q), _endpoint(db, q)
    first, second = _send(db, q)["message_id"], _send(db, q)["message_id"]
    since = _record_many(db, q, [
        _attempt(first, a, succeeded=False, status="pending"),
        _attempt(second, a, succeeded=False, status="pending"),
        _attempt(first, b, succeeded=False, status="pending"),
        _attempt(first, a, succeeded=False, status=None, counted=0),  # a manual resend
    ], T0)
    assert since == [T0, T0, T0, T0]
    deliveries = {(r["message_id"], r["endpoint_id"]): r for r in db.execute(
        "SELECT * FROM notifyq.webhook_delivery").fetchall()}
    assert deliveries[(first, a)]["attempts"] == 1
    assert deliveries[(first, a)]["status"] == "pending"
    assert db.execute("SELECT count(*) AS n FROM notifyq.webhook_attempt").fetchone() == {
        "n": 4}

    # Later: on a, a failure then a success (the success is last: the streak ends); on b, a
    # success then a failure (the streak restarts now, not at T0).
    later = T0 + timedelta(hours=1)
    since = _record_many(db, q, [
        _attempt(second, a, succeeded=False, status="pending"),
        _attempt(first, b, succeeded=True, status="succeeded"),
        _attempt(first, a, succeeded=True, status="succeeded"),
        _attempt(second, b, succeeded=False, status="pending"),
    ], later)
    assert since == [None, None, None, later]
    streaks = {r["id"]: r["failing_since"] for r in db.execute(
        "SELECT id, failing_since FROM notifyq.webhook_endpoint").fetchall()}
    assert (streaks[a], streaks[b]) == (None, later)
    assert db.execute("SELECT status FROM notifyq.webhook_delivery WHERE message_id = %s "
                      "AND endpoint_id = %s", (first, b)).fetchone() == {"status": "succeeded"}


def test_cancel_pending_stops_the_endpoints_deliveries_and_their_waiting_runs(
        db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    messages = [_send(db, q)["message_id"] for _ in range(2)]
    canceled = db.execute(q.webhook_delivery_cancel_pending, {
        "endpoint_id": endpoint, "reason": "gone", "now": T0}).fetchall()
    assert len(canceled) == 2
    statuses = db.execute("SELECT DISTINCT status FROM notifyq.job_run").fetchall()
    assert statuses == [{"status": "canceled"}]
    for message in messages:
        row = db.execute(q.webhook_delivery_list,
                         {"message_id": message, "now": None}).fetchone()
        assert row is not None
        assert (row["status"], row["last_error"]) == ("canceled", "gone")


def test_skip_cancels_only_a_pending_delivery(db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    message = _send(db, q)["message_id"]
    params = {"message_id": message, "endpoint_id": endpoint, "reason": "off", "now": T0}
    assert db.execute(q.webhook_delivery_skip, params).rowcount == 1
    assert db.execute(q.webhook_delivery_skip, params).rowcount == 0


def test_resend_enqueues_one_manual_run_per_delivery(db: Conn, q: Queries) -> None:
    a, b = _endpoint(db, q), _endpoint(db, q)
    message = _send(db, q)["message_id"]
    rows = db.execute(q.webhook_delivery_resend, {"message_id": message,
                                                  "endpoint_id": None}).fetchall()
    assert sorted(r["endpoint_id"] for r in rows) == sorted([a, b])
    one = db.execute(q.webhook_delivery_resend, {"message_id": message,
                                                 "endpoint_id": a}).fetchall()
    assert [r["endpoint_id"] for r in one] == [a]
    run = db.execute("SELECT input, trigger_source FROM notifyq.job_run WHERE id = %s",
                     (one[0]["run_id"],)).fetchone()
    assert run is not None
    assert run["input"]["trigger"] == "manual"
    assert run["trigger_source"] == "manual"


def test_recover_restarts_failed_deliveries_since_a_time(db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q)
    old, new = (_send(db, q)["message_id"] for _ in range(2))
    _record(db, q, old, endpoint, succeeded=False, now=T0 - timedelta(days=1), status="failed")
    _record(db, q, new, endpoint, succeeded=False, now=T0, status="failed")
    rows = db.execute(q.webhook_delivery_recover, {"endpoint_id": endpoint, "since": T0,
                                                   "limit": 100, "now": T0}).fetchall()
    assert [r["message_id"] for r in rows] == [new]
    delivery = db.execute(q.webhook_delivery_list, {"message_id": new, "now": None}).fetchone()
    assert delivery is not None
    assert (delivery["status"], delivery["attempts"], delivery["run_id"]) == (
        "pending", 0, rows[0]["run_id"])


def test_attempts_are_numbered_per_trigger_and_counted_per_run(db: Conn, q: Queries) -> None:
    a, b = _endpoint(db, q), _endpoint(db, q)
    message = _send(db, q)["message_id"]
    scheduled, manual, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def attempt(endpoint: Any, run: Any, number: int, *, counted: int = 1) -> dict[str, Any]:
        return {**_attempt(message, endpoint, succeeded=False, status=None, counted=counted),
                "run_id": run, "attempt": number}
    # Two scheduled attempts to a, a manual resend (which stores the scheduled count, 2), a
    # third scheduled attempt, a second resend; one scheduled attempt to b.
    for batch in ([attempt(a, scheduled, 1), attempt(b, other, 1)], [attempt(a, scheduled, 2)],
                  [attempt(a, manual, 2, counted=0)], [attempt(a, scheduled, 3)],
                  [attempt(a, manual, 3, counted=0)]):
        _record_many(db, q, batch, T0)
    listed = db.execute(q.webhook_attempt_list, {"message_id": message, "limit": 10}).fetchall()
    assert [(r["endpoint_id"], r["trigger"], r["attempt"]) for r in listed] == [
        (a, "scheduled", 1), (b, "scheduled", 1), (a, "scheduled", 2), (a, "manual", 1),
        (a, "scheduled", 3), (a, "manual", 2)]
    counted = db.execute(q.webhook_attempt_count_by_run, {
        "message_ids": [message], "run_ids": [scheduled, manual, uuid.uuid4()]}).fetchall()
    assert {r["run_id"]: r["n"] for r in counted} == {scheduled: 3, manual: 2}


def test_header_values_are_sealed_listed_while_in_clear_and_read_back(
        db: Conn, q: Queries) -> None:
    clear = _endpoint(db, q)  # written with clear header values, as before 0014
    empty = db.execute(q.webhook_endpoint_insert, {
        "url": "https://hooks.example/y", "description": "", "event_types": None,
        "headers": Jsonb({}), "enabled": True, "now": T0, "tenant_id": None,
        "rate_limit": None}).fetchone()
    assert empty is not None
    unsealed = db.execute(q.webhook_endpoint_list_unsealed, {"limit": 10}).fetchall()
    assert unsealed == [{"id": clear, "headers": {"X-A": "1"}}]
    row = db.execute(q.webhook_endpoint_seal_headers, {
        "id": clear, "headers": Jsonb({"X-A": "********"}), "header_values": b"\x01" * 40,
    }).fetchone()
    assert row is not None
    assert (row["headers"], bytes(row["header_values"])) == ({"X-A": "********"}, b"\x01" * 40)
    assert db.execute(q.webhook_endpoint_list_unsealed, {"limit": 10}).fetchall() == []
    stored = db.execute(q.webhook_endpoint_header_values, {"id": clear}).fetchone()
    assert stored is not None
    assert bytes(stored["header_values"]) == b"\x01" * 40
    assert db.execute(q.webhook_endpoint_seal_headers, {
        "id": uuid.uuid4(), "headers": Jsonb({}), "header_values": None}).fetchone() is None


def test_resizing_shares_halves_per_overload_grows_by_its_steps_and_keeps_the_bounds(
        db: Conn, q: Queries) -> None:
    def resize(grow: int = 1, **overloaded: int) -> dict[str, int]:
        rows = db.execute(q.key_concurrency_resize, {
            "keys": list(overloaded), "overloaded": list(overloaded.values()),
            "grow": [0 if n else grow for n in overloaded.values()],
            "share_start": 5, "share_max": 7, "now": T0}).fetchall()
        return {r["key"]: r["concurrency_limit"] for r in rows}

    assert resize(a=0, b=1) == {"a": 6, "b": 2}  # from the start (5): +1, halved
    assert resize(a=0) == {"a": 7}
    assert resize(a=0) == {}  # at the ceiling: nothing written
    assert resize(a=2, b=1) == {"a": 1, "b": 1}  # halved twice; halved once
    assert resize(b=3) == {}  # never below 1
    row = db.execute("SELECT concurrency_limit, updated_at FROM notifyq.key_concurrency "
                     "WHERE key = 'a'").fetchone()
    assert row == {"concurrency_limit": 1, "updated_at": T0}
    assert resize(grow=3, a=0) == {"a": 4}  # the steps that waited, written at once
    assert resize(grow=9, a=0) == {"a": 7}  # never above the ceiling


def test_recording_successes_clears_only_a_failing_endpoints_streak(db: Conn, q: Queries) -> None:
    healthy, failing = _endpoint(db, q), _endpoint(db, q)
    first, second = _send(db, q)["message_id"], _send(db, q)["message_id"]
    _record_many(db, q, [_attempt(first, failing, succeeded=False, status="pending")] * 2, T0,
                 breaker_failures=2)
    before = db.execute("SELECT xmin::text AS x FROM notifyq.webhook_endpoint WHERE id = %s",
                        (healthy,)).fetchone()
    pairs = [(first, healthy), (second, healthy), (first, failing)]
    db.execute(q.webhook_attempt_record_succeeded, {
        "message_ids": [m for m, _ in pairs], "endpoint_ids": [e for _, e in pairs],
        "run_ids": [None] * 3, "triggers": ["scheduled"] * 3, "attempts": [1] * 3,
        "webhook_timestamps": [1] * 3, "urls": ["u"] * 3, "status_codes": [204] * 3,
        "durations_ms": [2.0] * 3, "response_bodies": [""] * 3,
        "response_truncated": [False] * 3, "counted": [1] * 3, "now": T0})
    rows = db.execute("SELECT id, failing_since, consecutive_failures, circuit_open_until, "
                      "xmin::text AS x FROM notifyq.webhook_endpoint").fetchall()
    state = {r["id"]: r for r in rows}
    assert (state[failing]["failing_since"], state[failing]["consecutive_failures"],
            state[failing]["circuit_open_until"]) == (None, 0, None)
    assert before is not None
    assert state[healthy]["x"] == before["x"]  # untouched: no write to a healthy endpoint
    deliveries = db.execute("SELECT message_id, endpoint_id, status, attempts, "
                            "last_status_code FROM notifyq.webhook_delivery").fetchall()
    assert {(d["message_id"], d["endpoint_id"]): (d["status"], d["attempts"],
                                                  d["last_status_code"])
            for d in deliveries} == {(first, healthy): ("succeeded", 1, 204),
                                     (second, healthy): ("succeeded", 1, 204),
                                     (first, failing): ("succeeded", 3, 204),
                                     (second, failing): ("pending", 0, None)}
    codes = db.execute("SELECT status_code FROM notifyq.webhook_attempt WHERE status_code = 204"
                       ).fetchall()
    assert len(codes) == 3


def test_both_records_commit_without_waiting_for_the_wal_flush(db: Conn, q: Queries) -> None:
    """The run's write-back, sent after and committed synchronously, makes them durable."""
    endpoint = _endpoint(db, q)
    first, second = _send(db, q)["message_id"], _send(db, q)["message_id"]

    def commit_mode() -> str:
        row = db.execute("SHOW synchronous_commit").fetchone()
        assert row is not None
        return str(row["synchronous_commit"])

    assert commit_mode() == "on"
    with db.transaction():  # set_config(..., true) lasts until the transaction ends
        _record_many(db, q, [_attempt(first, endpoint, succeeded=False, status="pending")], T0)
        assert commit_mode() == "off"
    assert commit_mode() == "on"
    with db.transaction():
        db.execute(q.webhook_attempt_record_succeeded, {
            "message_ids": [second], "endpoint_ids": [endpoint], "run_ids": [None],
            "triggers": ["scheduled"], "attempts": [1], "webhook_timestamps": [1],
            "urls": ["u"], "status_codes": [200], "durations_ms": [1.0],
            "response_bodies": [""], "response_truncated": [False], "counted": [1],
            "now": T0})
        assert commit_mode() == "off"
    statuses = db.execute("SELECT message_id, status FROM notifyq.webhook_delivery "
                          "ORDER BY message_id").fetchall()
    assert {(r["message_id"], r["status"]) for r in statuses} == {
        (first, "pending"), (second, "succeeded")}
