"""Leader election, periodic ticks and job definitions, run directly."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import DEFINITION, Conn, count, seconds


def _attempt(db: Conn, q: Queries, leader_id: str, now: Any,
             ttl_s: float = 10) -> dict[str, Any]:
    row = db.execute(q.leader_attempt_elect, {"now": now, "name": "maintenance",
                                              "leader_id": leader_id, "ttl_s": ttl_s}).fetchone()
    assert row is not None
    return row


def _elect(db: Conn, q: Queries, leader_id: str, now: Any, ttl_s: float = 10) -> bool:
    return bool(_attempt(db, q, leader_id, now, ttl_s)["won"])


def _leader(db: Conn) -> dict[str, Any] | None:
    return db.execute("SELECT * FROM notifyq.leader WHERE name = 'maintenance'").fetchone()


def test_leader_attempt_elect_takes_a_free_role(db: Conn, q: Queries) -> None:
    assert _elect(db, q, "a", T0)
    row = _leader(db)
    assert row is not None
    assert (row["leader_id"], row["elected_at"], row["expires_at"]) == ("a", T0, T0 + seconds(10))


def test_leader_attempt_elect_refuses_while_another_leader_is_unexpired(db: Conn,
                                                                        q: Queries) -> None:
    assert _elect(db, q, "a", T0)
    assert not _elect(db, q, "b", T0 + seconds(9))
    row = _leader(db)
    assert row is not None
    assert row["leader_id"] == "a"


def test_leader_attempt_elect_renews_for_the_current_leader(db: Conn, q: Queries) -> None:
    assert _elect(db, q, "a", T0)
    assert _elect(db, q, "a", T0 + seconds(5))
    row = _leader(db)
    assert row is not None
    assert row["expires_at"] == T0 + seconds(15)
    assert row["elected_at"] == T0  # renewal keeps the election time


def test_leader_attempt_elect_takes_over_an_expired_role(db: Conn, q: Queries) -> None:
    assert _elect(db, q, "a", T0)
    assert _elect(db, q, "b", T0 + seconds(11))
    row = _leader(db)
    assert row is not None
    assert (row["leader_id"], row["elected_at"]) == ("b", T0 + seconds(11))
    assert not _elect(db, q, "a", T0 + seconds(12))


def test_leader_attempt_elect_tells_a_follower_when_the_leaders_role_runs_out(
        db: Conn, q: Queries) -> None:
    assert _attempt(db, q, "a", T0) == {"won": True, "expires_in_s": 10.0}
    assert _attempt(db, q, "b", T0 + seconds(7.5)) == {"won": False, "expires_in_s": 2.5}
    assert _attempt(db, q, "b", T0 + seconds(10.001))["won"]


def test_leader_resign_frees_the_role_only_for_its_holder(db: Conn, q: Queries) -> None:
    assert _elect(db, q, "a", T0)
    db.execute(q.leader_resign, {"name": "maintenance", "leader_id": "b"})
    assert _leader(db) is not None
    db.execute(q.leader_resign, {"name": "maintenance", "leader_id": "a"})
    assert _leader(db) is None
    assert _elect(db, q, "b", T0 + seconds(1))


def _register(db: Conn, q: Queries, name: str = "r.b@1000ms", **overrides: Any) -> None:
    db.execute(q.periodic_schedule_register, {
        "name": name, "job_type": "r.b", "every_ms": 1000, "cron": None, "tz": None,
        "catch_up": False, "input": '{"k": 1}', **overrides})


def _tick(db: Conn, q: Queries, tick_at: Any, name: str = "r.b@1000ms") -> list[dict[str, Any]]:
    return db.execute(q.periodic_tick_enqueue, {
        "name": name, "tick_at": tick_at, "run_id": uuid4(), "job_type": "r.b",
        "input": '{"k": 1}'}).fetchall()


def _schedule(db: Conn, name: str = "r.b@1000ms") -> dict[str, Any]:
    row = db.execute("SELECT * FROM notifyq.periodic_schedule WHERE name = %s",
                     (name,)).fetchone()
    assert row is not None
    return row


def test_periodic_tick_enqueue_enqueues_once_per_tick(db: Conn, q: Queries) -> None:
    _register(db, q)
    _register(db, q, "r.b@2000ms", every_ms=2000)
    first = _tick(db, q, T0)
    assert len(first) == 1
    assert _tick(db, q, T0) == []
    assert _tick(db, q, T0) == []
    assert len(_tick(db, q, T0 + seconds(1))) == 1
    assert len(_tick(db, q, T0, name="r.b@2000ms")) == 1
    assert count(db) == 3
    run = db.execute("SELECT * FROM notifyq.job_run WHERE id = %s", (first[0]["id"],)).fetchone()
    assert run is not None
    assert (run["trigger_source"], run["trigger_ref"], run["run_at"], run["input"]) == (
        "schedule", "r.b@1000ms", T0, {"k": 1})
    ticks = db.execute("SELECT count(*) AS n FROM notifyq.periodic_tick").fetchone()
    assert ticks == {"n": 3}
    assert _schedule(db)["last_tick_at"] == T0 + seconds(1)


def test_periodic_tick_enqueue_never_goes_back_before_the_last_tick(db: Conn, q: Queries) -> None:
    _register(db, q)
    assert len(_tick(db, q, T0 + seconds(5))) == 1
    assert _tick(db, q, T0 + seconds(4)) == []  # a slower node's older tick
    assert count(db) == 1


def test_periodic_tick_enqueue_needs_a_registered_schedule(db: Conn, q: Queries) -> None:
    assert _tick(db, q, T0) == []
    assert count(db) == 0


def test_a_paused_schedule_enqueues_nothing_and_resume_bars_the_paused_ticks(
        db: Conn, q: Queries) -> None:
    _register(db, q)
    assert db.execute(q.periodic_schedule_pause, {"name": "r.b@1000ms", "now": T0}
                      ).fetchone() == {"name": "r.b@1000ms", "paused_at": T0}
    again = db.execute(q.periodic_schedule_pause,
                       {"name": "r.b@1000ms", "now": T0 + seconds(9)}).fetchone()
    assert again == {"name": "r.b@1000ms", "paused_at": T0}  # the first pause stays
    assert _tick(db, q, T0 + seconds(1)) == []
    resumed = db.execute(q.periodic_schedule_resume,
                         {"name": "r.b@1000ms", "now": T0 + seconds(10)}).fetchone()
    assert resumed == {"name": "r.b@1000ms", "resumed_at": T0 + seconds(10)}
    assert _tick(db, q, T0 + seconds(2)) == []  # fell due while paused
    assert len(_tick(db, q, T0 + seconds(10))) == 1
    assert count(db) == 1
    # Resuming a running schedule moves nothing.
    db.execute(q.periodic_schedule_resume, {"name": "r.b@1000ms", "now": T0 + seconds(20)})
    assert _schedule(db)["resumed_at"] == T0 + seconds(10)


def test_pause_and_resume_of_an_unknown_schedule_return_no_row(db: Conn, q: Queries) -> None:
    for query in (q.periodic_schedule_pause, q.periodic_schedule_resume):
        assert db.execute(query, {"name": "nope", "now": T0}).fetchone() is None


def test_periodic_schedule_register_updates_the_definition_but_keeps_the_state(
        db: Conn, q: Queries) -> None:
    _register(db, q, "daily", cron="0 9 * * *", tz="UTC", every_ms=None)
    db.execute(q.periodic_schedule_pause, {"name": "daily", "now": T0})
    _register(db, q, "daily", cron="0 9 * * MON-FRI", tz="Europe/Berlin", every_ms=None,
              catch_up=True)
    row = _schedule(db, "daily")
    assert (row["cron"], row["tz"], row["catch_up"], row["paused_at"]) == (
        "0 9 * * MON-FRI", "Europe/Berlin", True, T0)


def test_periodic_schedule_trigger_enqueues_now_with_the_stored_input_and_claims_no_tick(
        db: Conn, q: Queries) -> None:
    _register(db, q)
    [run] = _tick(db, q, T0)
    run_id = uuid4()
    [row] = db.execute(q.periodic_schedule_trigger, {"name": "r.b@1000ms",
                                                     "run_id": run_id}).fetchall()
    assert (row["name"], row["known"], row["run_id"]) == ("r.b@1000ms", True, run_id)
    triggered = db.execute("SELECT job_type, input, trigger_source, trigger_ref "
                           "FROM notifyq.job_run WHERE id = %s", (run_id,)).fetchone()
    assert triggered == {"job_type": "r.b", "input": {"k": 1}, "trigger_source": "schedule",
                         "trigger_ref": "r.b@1000ms"}
    assert (_schedule(db)["last_tick_at"], _schedule(db)["last_run_id"]) == (T0, run["id"])
    assert db.execute(q.periodic_schedule_trigger, {"name": "nope",
                                                    "run_id": uuid4()}).fetchall() == []
    _register(db, q, "legacy", input=None)
    [legacy] = db.execute(q.periodic_schedule_trigger, {"name": "legacy",
                                                        "run_id": uuid4()}).fetchall()
    assert (legacy["known"], legacy["run_id"]) == (False, None)


def test_a_schedule_has_exactly_one_cadence(db: Conn, q: Queries) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="one_cadence"):
        _register(db, q, "both", cron="0 9 * * *", tz="UTC")


def test_periodic_schedule_state_and_list_read_the_rows(db: Conn, q: Queries) -> None:
    _register(db, q)
    _register(db, q, "daily", cron="0 9 * * *", tz="Europe/Berlin", every_ms=None)
    [run] = _tick(db, q, T0)
    state = db.execute(q.periodic_schedule_state, {"names": ["r.b@1000ms", "other"]}).fetchall()
    assert state == [{"name": "r.b@1000ms", "paused_at": None, "resumed_at": None,
                      "last_tick_at": T0}]
    listed = db.execute(q.periodic_schedule_list).fetchall()
    assert [(r["name"], r["cron"], r["tz"], r["last_run_id"], r["last_status"])
            for r in listed] == [("daily", "0 9 * * *", "Europe/Berlin", None, None),
                                 ("r.b@1000ms", None, None, run["id"], "pending")]


def test_periodic_tick_prune_deletes_ticks_older_than_a_day(db: Conn, q: Queries) -> None:
    _register(db, q)
    _tick(db, q, T0 - timedelta(days=2))
    _tick(db, q, T0 - timedelta(hours=2))
    db.execute(q.periodic_tick_prune, {"now": T0})
    rows = db.execute("SELECT tick_at FROM notifyq.periodic_tick").fetchall()
    assert rows == [{"tick_at": T0 - timedelta(hours=2)}]


def _upsert(db: Conn, q: Queries, **overrides: Any) -> None:
    params = {**DEFINITION, "type": "mail.send", "retry_policy": '{"attempts": 25}',
              **overrides}
    db.execute(q.job_upsert, params)


def test_job_upsert_inserts_then_updates_a_definition(db: Conn, q: Queries) -> None:
    _upsert(db, q)
    _upsert(db, q, version=2, max_attempts=3, timeout_s=1.5)
    rows = db.execute(q.job_list).fetchall()
    assert len(rows) == 1
    assert (rows[0]["version"], rows[0]["max_attempts"], rows[0]["timeout_s"]) == (2, 3, 1.5)


def test_job_upsert_leaves_an_unchanged_definition_untouched(db: Conn, q: Queries) -> None:
    _upsert(db, q)
    db.execute("UPDATE notifyq.job SET updated_at = '2001-01-01Z'")
    _upsert(db, q)
    row = db.execute("SELECT updated_at FROM notifyq.job").fetchone()
    assert row is not None
    assert row["updated_at"].year == 2001


def test_job_list_returns_definitions_ordered_by_type(db: Conn, q: Queries) -> None:
    for job_type in ("z.last", "a.first", "m.mid"):
        _upsert(db, q, type=job_type)
    assert [r["type"] for r in db.execute(q.job_list).fetchall()] == [
        "a.first", "m.mid", "z.last"]
