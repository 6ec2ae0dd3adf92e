"""The key_* and encrypted_column_* named queries, run directly on a migrated database."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from notifyq import Keyring
from notifyq._crypto.ciphertext import Context, version_of
from notifyq._crypto.keyring import check_value
from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import claim, enqueue

Conn = psycopg.Connection[dict[str, Any]]
K1, K2 = os.urandom(32), os.urandom(32)


def _fill(template: str, pk_type: str = "bigint") -> str:
    """What ColumnQueries does for public.vault(id, secret)."""
    return sql.SQL(template).format(
        table=sql.Identifier("public", "vault"), pk=sql.Identifier("id"),
        column=sql.Identifier("secret"), pk_type=sql.SQL(pk_type)).as_string(None)


def _vault(db: Conn, n: int, ring: Keyring) -> None:
    db.execute("CREATE TABLE vault (id bigint PRIMARY KEY, secret bytea, note text)")
    for i in range(1, n + 1):
        db.execute("INSERT INTO vault (id, secret) VALUES (%s, %s)",
                   (i, ring.encrypt(b"s%d" % i, Context("public.vault", "secret", str(i)))))


def test_key_versions_are_registered_once_listed_and_retired(db: Conn, q: Queries) -> None:
    params = {"now": T0, "versions": [1, 2], "check_values": [check_value(K1), check_value(K2)]}
    db.execute(q.key_version_register, params)
    db.execute(q.key_version_register, {**params, "check_values": [b"x", b"y"]})
    rows = db.execute(q.key_version_list).fetchall()
    assert [(r["version"], bytes(r["check_value"]), r["retired_at"]) for r in rows] == [
        (1, check_value(K1), None), (2, check_value(K2), None)]
    retired = db.execute(q.key_version_retire, {"version": 1, "now": T0}).fetchone()
    assert retired == {"version": 1, "retired_at": T0}
    again = db.execute(q.key_version_retire, {"version": 1, "now": None}).fetchone()
    assert again == {"version": 1, "retired_at": T0}
    assert db.execute(q.key_version_retire, {"version": 9, "now": None}).fetchone() is None


def test_the_rotation_lock_is_a_transaction_scoped_advisory_lock(db: Conn, q: Queries) -> None:
    def advisory() -> int:
        row = db.execute("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' "
                         "AND pid = pg_backend_pid()").fetchone()
        assert row is not None
        return int(row["n"])
    with db.transaction():
        db.execute(q.key_rotation_lock)
        assert advisory() == 1
    assert advisory() == 0


def test_rotations_are_found_while_active_and_the_latest_is_reported(db: Conn,
                                                                     q: Queries) -> None:
    assert db.execute(q.key_rotation_find_active).fetchone() is None
    assert db.execute(q.key_rotation_latest, {"now": T0}).fetchone() is None
    run = enqueue(db, q, "secret.reencrypt", {"target_version": 2})
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 2, "now": T0})
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 3, "now": T0})
    active = db.execute(q.key_rotation_find_active).fetchone()
    assert active == {"run_id": run["id"], "target_version": 2, "status": "pending"}
    db.execute("UPDATE notifyq.job_run SET status = 'completed' WHERE id = %s", (run["id"],))
    assert db.execute(q.key_rotation_find_active).fetchone() is None
    latest = db.execute(q.key_rotation_latest, {"now": T0}).fetchone()
    assert latest is not None
    assert (latest["run_id"], latest["target_version"], latest["status"]) == (
        run["id"], 2, "completed")


def test_a_rotation_is_found_by_its_run_and_an_unregistered_run_is_not(db: Conn,
                                                                      q: Queries) -> None:
    run = enqueue(db, q, "secret.reencrypt", {"target_version": 2})
    assert db.execute(q.key_rotation_get, {"run_id": run["id"]}).fetchone() is None
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 2, "now": T0})
    assert db.execute(q.key_rotation_get, {"run_id": run["id"]}).fetchone() == {
        "run_id": run["id"], "target_version": 2}


def test_progress_starts_once_checkpoints_passes_and_finishes(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, "secret.reencrypt", {"target_version": 2})
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 2, "now": T0})
    key = {"run_id": run["id"], "column_name": "public.vault.secret", "now": T0}
    first = db.execute(q.key_rotation_progress_start, key).fetchall()
    assert len(first) == 1
    assert (first[0]["pass"], first[0]["last_pk"], first[0]["reencrypted"]) == (1, None, 0)
    row = db.execute(q.key_rotation_progress_checkpoint, {
        **key, "last_pk": "500", "attempted": 500, "reencrypted": 498,
        "conflicts": 2}).fetchone()
    assert row is not None
    assert (row["last_pk"], row["pass_changes"], row["reencrypted"], row["conflicts"],
            row["batches"]) == ("500", 500, 498, 2, 1)
    again = db.execute(q.key_rotation_progress_start, key).fetchall()
    assert [r["last_pk"] for r in again] == ["500"]
    row = db.execute(q.key_rotation_progress_next_pass, key).fetchone()
    assert row is not None
    assert (row["pass"], row["last_pk"], row["pass_changes"], row["reencrypted"]) == (
        2, None, 0, 498)
    row = db.execute(q.key_rotation_progress_finish, key).fetchone()
    assert row is not None
    assert row["finished_at"] == T0
    listed = db.execute(q.key_rotation_progress_list, {"run_id": run["id"]}).fetchall()
    assert [r["column_name"] for r in listed] == ["public.vault.secret"]


def test_failures_are_recorded_once_listed_and_counted(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, "secret.reencrypt", {"target_version": 2})
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 2, "now": T0})
    params = {"run_id": run["id"], "column_name": "public.vault.secret",
              "row_pks": ["7", "9"], "reasons": ["DecryptionFailed: a", "UnknownKeyVersion: b"]}
    db.execute(q.key_rotation_failure_record, params)
    db.execute(q.key_rotation_failure_record, params)
    rows = db.execute(q.key_rotation_failure_list, {"run_id": run["id"], "limit": 10})
    assert [(r["row_pk"], r["reason"]) for r in rows.fetchall()] == [
        ("7", "DecryptionFailed: a"), ("9", "UnknownKeyVersion: b")]
    assert db.execute(q.key_rotation_failure_count, {"run_id": run["id"]}).fetchone() == {
        "n": 2}


def test_lock_timeout_is_set_for_the_transaction_only(db: Conn, q: Queries) -> None:
    with db.transaction():
        db.execute(q.key_rotation_lock_timeout, {"lock_timeout": "100ms"})
        assert db.execute("SHOW lock_timeout").fetchone() == {"lock_timeout": "100ms"}
    assert db.execute("SHOW lock_timeout").fetchone() == {"lock_timeout": "0"}


def test_describe_reports_the_types_of_an_encrypted_columns_table(db: Conn, q: Queries) -> None:
    _vault(db, 0, Keyring({1: K1}, active=1))
    rows = db.execute(q.encrypted_column_describe, {
        "table": '"public"."vault"', "names": ["id", "secret"]}).fetchall()
    assert sorted((r["name"], r["type"]) for r in rows) == [("id", "bigint"),
                                                            ("secret", "bytea")]
    assert db.execute(q.encrypted_column_describe, {
        "table": "public.nope", "names": ["id"]}).fetchall() == []


def test_pages_follow_the_primary_key_and_skip_rows_on_the_target(db: Conn, q: Queries) -> None:
    old = Keyring({1: K1}, active=1)
    _vault(db, 10, old)
    new = Keyring({1: K1, 2: K2}, active=2)
    db.execute("UPDATE vault SET secret = %s WHERE id = 3",
               (new.encrypt(b"s3", Context("public.vault", "secret", "3")),))
    db.execute("UPDATE vault SET secret = NULL WHERE id = 4")
    first = db.execute(_fill(q.encrypted_column_page_first),
                       {"version": 2, "limit": 3}).fetchall()
    assert [r["pk"] for r in first] == [1, 2, 5]
    after = db.execute(_fill(q.encrypted_column_page_after),
                       {"version": 2, "limit": 3, "after": "5"}).fetchall()
    assert [r["pk"] for r in after] == [6, 7, 8]
    counts = db.execute(_fill(q.encrypted_column_version_counts)).fetchall()
    assert counts == [{"version": 1, "n": 8}, {"version": 2, "n": 1}]


def test_swap_many_replaces_only_rows_still_holding_the_old_value(db: Conn, q: Queries) -> None:
    _vault(db, 3, Keyring({1: K1}, active=1))
    olds = {r["id"]: bytes(r["secret"]) for r in db.execute("SELECT * FROM vault").fetchall()}
    db.execute("UPDATE vault SET secret = 'writer' WHERE id = 2")
    cur = db.execute(_fill(q.encrypted_column_swap_many), {
        "pks": [1, 2, 3], "olds": [olds[1], olds[2], olds[3]], "news": [b"n1", b"n2", b"n3"]})
    assert cur.rowcount == 2
    rows = db.execute("SELECT id, secret FROM vault ORDER BY id").fetchall()
    assert [bytes(r["secret"]) for r in rows] == [b"n1", b"writer", b"n3"]


def test_key_version_of_in_sql_agrees_with_python(db: Conn) -> None:
    ring = Keyring({1: K1, 7: K2}, active=7)
    samples = [ring.encrypt(b"x", Context("a.b", "c", "1")), b"", b"\x01\x00\x00\x00\x07",
               b"\x02" + bytes(40), b"\x01\xff\xff\xff\xff" + bytes(40),
               Keyring({1: K1}, active=1).encrypt(b"", Context("a.b", "c", "1"))]
    for blob in samples:
        row = db.execute("SELECT notifyq.key_version_of(%s::bytea) AS v", (blob,)).fetchone()
        assert row == {"v": version_of(blob)}
    assert [version_of(b) for b in samples] == [7, 0, 0, 0, 0, 1]


def test_the_watch_poll_says_how_long_a_due_run_waits_and_how_far_each_column_is(
        db: Conn, q: Queries) -> None:
    run = enqueue(db, q, "secret.reencrypt", {"target_version": 2}, run_at=T0)
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 2, "now": T0})
    key = {"run_id": run["id"], "column_name": "public.vault.secret", "now": T0}
    db.execute(q.key_rotation_progress_start, key)
    db.execute(q.key_rotation_progress_checkpoint, {
        **key, "last_pk": "300", "attempted": 298, "reencrypted": 297, "conflicts": 1})
    db.execute(q.key_rotation_failure_record, {**key, "row_pks": ["7", "9"],
                                               "reasons": ["a", "b"]})
    db.execute(q.key_rotation_progress_start, {**key, "column_name": "public.other.token"})
    db.execute(q.key_rotation_progress_finish, {**key, "column_name": "public.other.token"})

    pending = db.execute(q.key_rotation_watch, {"run_id": run["id"],
                                                "now": T0 + timedelta(seconds=7)}).fetchone()
    assert pending is not None
    assert (pending["status"], pending["pool"], pending["unclaimed_s"],
            pending["lease_lapsed_s"]) == ("pending", "default", 7.0, None)
    assert pending["columns"] == [
        {"column": "public.other.token", "pass": 1, "reencrypted": 0, "conflicts": 0,
         "finished": True, "undecryptable": 0},
        {"column": "public.vault.secret", "pass": 1, "reencrypted": 297, "conflicts": 1,
         "finished": False, "undecryptable": 2}]

    claim(db, q, T0 + timedelta(seconds=8), lease_s=2)
    running = db.execute(q.key_rotation_watch, {"run_id": run["id"],
                                                "now": T0 + timedelta(seconds=15)}).fetchone()
    assert running is not None
    assert (running["status"], running["unclaimed_s"], running["lease_lapsed_s"]) == (
        "running", None, 5.0)
    assert db.execute(q.key_rotation_watch, {"run_id": "01a22cc2-1f7d-734a-8591-82be1a967c79",
                                             "now": T0}).fetchone() is None


def test_encrypted_columns_are_recorded_once_and_listed_the_users_before_notifyqs(
        db: Conn, q: Queries) -> None:
    params = {"now": T0, "tables": ["public.vault", "notifyq.webhook_secret", "public.a"],
              "columns": ["secret", "ciphertext", "token"], "pks": ["id", "id", "uid"],
              "builtins": [False, True, False]}
    db.execute(q.encrypted_column_record, params)
    db.execute(q.encrypted_column_record, {**params, "pks": ["other", "other", "other"],
                                           "now": T0 + timedelta(hours=1)})
    rows = db.execute(q.encrypted_column_list).fetchall()
    assert [(r["table_name"], r["column_name"], r["pk"], r["builtin"]) for r in rows] == [
        ("public.a", "token", "uid", False), ("public.vault", "secret", "id", False),
        ("notifyq.webhook_secret", "ciphertext", "id", True)]
    assert db.execute("SELECT DISTINCT registered_at FROM notifyq.encrypted_column"
                      ).fetchall() == [{"registered_at": T0}]


# -- promotion, key holders, throttle and pause (0023) ---------------------------------------------

def _versions(db: Conn, q: Queries, *keys: tuple[int, bytes]) -> None:
    db.execute(q.key_version_register, {"now": T0, "versions": [v for v, _ in keys],
                                        "check_values": [check_value(k) for _, k in keys]})


def _holder(db: Conn, q: Queries, holder_id: str, keys: dict[int, bytes], *,
            encrypts_with: int | None = 1, now: datetime = T0, ttl_s: float = 30.0,
            interval_s: float = 10.0, role: str = "worker") -> None:
    db.execute(q.key_holder_record, {
        "id": holder_id, "role": role, "host": "h", "pid": int(holder_id[-1]),
        "versions": list(keys), "check_values": [check_value(k) for k in keys.values()],
        "encrypts_with": encrypts_with, "interval_s": interval_s, "ttl_s": ttl_s, "now": now})


def _promote(db: Conn, q: Queries, version: int, *, force: bool = False,
             first_time: bool = False, now: datetime = T0) -> dict[str, Any]:
    with db.transaction():
        db.execute(q.key_rotation_lock)
        row = db.execute(q.key_active_promote, {
            "version": version, "force": force, "first_time": first_time, "by": "test",
            "now": now, "channel": "nq_test_keys"}).fetchone()
    assert row is not None
    return row


def test_holders_are_recorded_renewed_listed_while_alive_and_reaped_after(db: Conn,
                                                                          q: Queries) -> None:
    _holder(db, q, "h:1", {1: K1})
    _holder(db, q, "h:2", {1: K1, 2: K2}, now=T0 + timedelta(seconds=20))
    _holder(db, q, "h:1", {1: K1, 2: K2}, encrypts_with=2, now=T0 + timedelta(seconds=25))
    live = db.execute(q.key_holder_list, {"now": T0 + timedelta(seconds=40)}).fetchall()
    assert [(r["id"], r["versions"], r["encrypts_with"], r["started_at"]) for r in live] == [
        ("h:1", [1, 2], 2, T0), ("h:2", [1, 2], 1, T0 + timedelta(seconds=20))]
    later = T0 + timedelta(seconds=52)
    assert [r["id"] for r in db.execute(q.key_holder_list, {"now": later}).fetchall()] == ["h:1"]
    assert db.execute(q.key_holder_reap_expired, {"now": later}).fetchall() == [{"id": "h:2"}]
    db.execute(q.key_holder_leave, {"id": "h:1"})
    assert db.execute(q.key_holder_list, {"now": T0}).fetchall() == []


def test_promotion_is_refused_naming_the_live_processes_without_the_versions_check_value(
        db: Conn, q: Queries) -> None:
    _versions(db, q, (1, K1), (2, K2))
    _holder(db, q, "h:1", {1: K1, 2: K2})
    _holder(db, q, "h:2", {1: K1})
    _holder(db, q, "h:3", {1: K1, 2: os.urandom(32)})  # another key under 2: not held
    _holder(db, q, "h:4", {1: K1}, ttl_s=1)  # gone by now
    refused = _promote(db, q, 2, now=T0 + timedelta(seconds=5))
    assert refused["outcome"] == "lacking"
    assert [p["id"] for p in refused["lacking"]] == ["h:2", "h:3"]
    assert refused["lacking"][0] == {"id": "h:2", "role": "worker", "host": "h", "pid": 2,
                                     "versions": [1]}
    assert db.execute(q.key_active_get).fetchone() is None

    forced = _promote(db, q, 2, force=True, now=T0 + timedelta(seconds=6))
    assert (forced["outcome"], forced["previous"]) == ("promoted", None)
    assert forced["promoted_at"] == T0 + timedelta(seconds=6)
    assert db.execute(q.key_active_get).fetchone() == {
        "version": 2, "promoted_at": T0 + timedelta(seconds=6), "promoted_by": "test",
        "forced": True}
    listed = db.execute(q.key_version_list).fetchall()
    assert [(r["version"], r["active"], r["promoted_at"]) for r in listed] == [
        (1, False, None), (2, True, T0 + timedelta(seconds=6))]


def test_promotion_answers_unknown_retired_unchanged_and_not_first_without_writing(
        db: Conn, q: Queries) -> None:
    _versions(db, q, (1, K1), (2, K2), (3, os.urandom(32)))
    assert _promote(db, q, 9)["outcome"] == "unknown"
    db.execute(q.key_version_retire, {"version": 3, "now": T0})
    assert _promote(db, q, 3)["outcome"] == "retired"
    assert _promote(db, q, 1)["outcome"] == "promoted"  # no live holder: nobody lacks it
    assert _promote(db, q, 1)["outcome"] == "unchanged"
    assert _promote(db, q, 2)["outcome"] == "promoted"
    back = _promote(db, q, 1, first_time=True)
    assert (back["outcome"], back["previous"]) == ("not_first", 2)
    assert _promote(db, q, 1)["outcome"] == "promoted"  # an operator may go back
    assert db.execute(q.key_active_get).fetchone()["version"] == 1  # type: ignore[index]


def test_promotion_waits_for_a_rotation_to_another_version_and_announces_itself(
        db: Conn, db2: Conn, q: Queries) -> None:
    _versions(db, q, (1, K1), (2, K2))
    _promote(db, q, 1)
    run = enqueue(db, q, "secret.reencrypt", {"target_version": 1})
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 1, "now": T0})
    blocked = _promote(db, q, 2)
    assert blocked["outcome"] == "rotating"
    assert blocked["rotation"] == {"run_id": str(run["id"]), "target_version": 1,
                                   "status": "pending"}
    db.execute("UPDATE notifyq.job_run SET status = 'completed' WHERE id = %s", (run["id"],))
    db2.execute("LISTEN nq_test_keys")
    assert _promote(db, q, 2)["outcome"] == "promoted"
    notes = list(db2.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["k:2"]
    db.execute(q.key_announce, {"channel": "nq_test_keys", "version": 1})
    assert [n.payload for n in db2.notifies(timeout=2, stop_after=1)] == ["k:1"]


def test_stale_writers_are_live_processes_on_another_version_until_their_next_check_is_due(
        db: Conn, q: Queries) -> None:
    _holder(db, q, "h:1", {1: K1, 2: K2}, encrypts_with=1, interval_s=10)
    _holder(db, q, "h:2", {1: K1, 2: K2}, encrypts_with=2, interval_s=10)
    _holder(db, q, "h:3", {1: K1}, encrypts_with=None, interval_s=10)  # encrypts nothing
    params = {"version": 2, "now": T0 + timedelta(seconds=5)}
    assert [r["id"] for r in db.execute(q.key_holder_stale_writers, params)] == ["h:1"]
    params["now"] = T0 + timedelta(seconds=10)  # h:1 checks again before its next encrypt
    assert db.execute(q.key_holder_stale_writers, params).fetchall() == []


def test_a_rotation_is_throttled_paused_and_resumed_with_its_paused_time_added_up(
        db: Conn, q: Queries) -> None:
    assert db.execute(q.key_rotation_pause, {"now": T0}).fetchall() == []
    run = enqueue(db, q, "secret.reencrypt", {"target_version": 2})
    db.execute(q.key_rotation_register, {"run_id": run["id"], "target_version": 2, "now": T0})
    key = {"run_id": run["id"]}
    assert db.execute(q.key_rotation_control, key).fetchone() == {"rate_per_s": None,
                                                                  "paused": False}
    db.execute(q.key_rotation_throttle, {**key, "rate_per_s": 250.0})
    assert db.execute(q.key_rotation_resume, {"now": T0}).fetchall() == []  # not paused
    paused = db.execute(q.key_rotation_pause, {"now": T0}).fetchall()
    assert [(r["run_id"], r["paused_at"]) for r in paused] == [(run["id"], T0)]
    db.execute(q.key_rotation_pause, {"now": T0 + timedelta(seconds=3)})  # keeps the first
    assert db.execute(q.key_rotation_control, key).fetchone() == {"rate_per_s": 250.0,
                                                                  "paused": True}
    watched = db.execute(q.key_rotation_watch, {**key, "now": T0}).fetchone()
    assert watched is not None
    assert watched["paused"]
    # The run snoozed while paused: pending, due in an hour.
    db.execute("UPDATE notifyq.job_run SET run_at = %s WHERE id = %s",
               (T0 + timedelta(hours=1), run["id"]))
    resumed = db.execute(q.key_rotation_resume, {"now": T0 + timedelta(seconds=8)}).fetchone()
    assert resumed == {"run_id": run["id"], "target_version": 2, "pool": "default",
                       "status": "pending", "woken": True}
    row = db.execute("SELECT run_at FROM notifyq.job_run WHERE id = %s", (run["id"],)).fetchone()
    assert row == {"run_at": T0 + timedelta(seconds=8)}
    latest = db.execute(q.key_rotation_latest, {"now": T0}).fetchone()
    assert latest is not None
    assert (latest["paused_at"], latest["paused_s"], latest["rate_per_s"]) == (None, 8.0, 250.0)
    db.execute(q.key_rotation_throttle, {**key, "rate_per_s": None})
    assert db.execute(q.key_rotation_control, key).fetchone() == {"rate_per_s": None,
                                                                  "paused": False}
