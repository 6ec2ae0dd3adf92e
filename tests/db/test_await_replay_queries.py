"""Awaiting a run (the awaited mark and its completion NOTIFY, migration 0011) and replaying a
durable run from a step, run directly against PostgreSQL."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import Conn, claim, enqueue, finish, get


def listener(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("LISTEN notifyq")
    return conn


def received(conn: psycopg.Connection[Any], timeout: float = 0.5, *,
             kind: str = "d:") -> list[str]:
    """The payloads of ``kind`` that came within ``timeout`` (``d:`` a run's final status,
    ``j:`` a pool's wake-up)."""
    return [n.payload for n in conn.notifies(timeout=timeout) if n.payload.startswith(kind)]


def awaiting(db: Conn, q: Queries, run_id: UUID) -> dict[str, Any] | None:
    return db.execute(q.job_run_await, {"id": run_id, "channel": "notifyq"}).fetchone()


def record_step(db: Conn, q: Queries, run: dict[str, Any], step_id: str, seq: int) -> None:
    row = db.execute(q.job_step_record, {
        "run_id": run["id"], "fence": run["fence"], "step_id": step_id, "seq": seq,
        "kind": "step", "status": "completed", "output": f'"{step_id}"', "error": None,
        "attempts": 1, "attempt": run["attempts"], "started_at": T0, "now": None}).fetchone()
    assert row is not None


def finished_with_steps(db: Conn, q: Queries, steps: list[str],
                        status: str = "completed") -> dict[str, Any]:
    enqueue(db, q, "t.durable")
    (run,) = claim(db, q, T0)
    for seq, step_id in enumerate(steps, start=1):
        record_step(db, q, run, step_id, seq)
    assert finish(db, q, T0, [(run["id"], run["fence"], status)], output='"done"')
    return run


# -- awaiting ---------------------------------------------------------------------------------


def test_job_run_await_marks_the_run_and_returns_it(db: Conn, q: Queries) -> None:
    run = enqueue(db, q)
    row = awaiting(db, q, run["id"])
    assert row is not None
    assert (row["id"], row["status"], row["awaited"]) == (run["id"], "pending", True)
    assert awaiting(db, q, UUID(int=1)) is None


def test_job_run_await_wakes_the_pool_of_a_run_still_pending_and_due(
        db: Conn, q: Queries, dsn: str) -> None:
    """The mark locks the row for its transaction, and a claim passes over a locked row (SKIP
    LOCKED): a worker whose claim did sees the run again by this wake-up (issue 31, item 6)."""
    with listener(dsn) as listening:
        due = enqueue(db, q, pool="mail")
        later = enqueue(db, q, pool="later", run_at=T0.replace(year=2100))
        started = enqueue(db, q, pool="busy")
        claim(db, q, T0, pool="busy")
        rows = [awaiting(db, q, r["id"]) for r in (due, later, started)]
        assert [r["woke"] if r else "-" for r in rows] == [1, None, None]
        assert received(listening, kind="j:") == ["j:mail"]


def test_an_awaited_run_notifies_its_id_when_it_finishes(db: Conn, q: Queries, dsn: str) -> None:
    with listener(dsn) as listening:
        awaited = enqueue(db, q)
        enqueue(db, q)  # finishes with it, not awaited
        awaiting(db, q, awaited["id"])
        running = claim(db, q, T0)
        assert len(running) == 2
        finish(db, q, T0, [(r["id"], r["fence"], "completed") for r in running])
        # Only the awaited run notifies; the other one finishes silently.
        assert received(listening) == [f"d:{awaited['id']}"]


def test_a_retry_of_an_awaited_run_does_not_notify_until_its_final_status(
        db: Conn, q: Queries, dsn: str) -> None:
    with listener(dsn) as listening:
        run = enqueue(db, q)
        awaiting(db, q, run["id"])
        (claimed,) = claim(db, q, T0)
        finish(db, q, T0, [(run["id"], claimed["fence"], "pending")], run_at=T0)
        assert received(listening, 0.3) == []
        (again,) = claim(db, q, T0)
        finish(db, q, T0, [(run["id"], again["fence"], "failed")], error='{"message": "x"}')
        assert received(listening) == [f"d:{run['id']}"]


def test_canceling_an_awaited_pending_run_notifies(db: Conn, q: Queries, dsn: str) -> None:
    with listener(dsn) as listening:
        run = enqueue(db, q)
        awaiting(db, q, run["id"])
        canceled = db.execute(q.job_run_cancel, {"tenant_ids": None,
                                                 "id": run["id"], "now": T0}).fetchone()
        assert canceled is not None
        assert canceled["status"] == "canceled"
        assert received(listening) == [f"d:{run['id']}"]


# -- replay from a step -----------------------------------------------------------------------


def test_job_step_replay_from_drops_the_step_and_later_ones_and_carries_the_earlier(
        db: Conn, q: Queries) -> None:
    run = finished_with_steps(db, q, ["a", "b", "c"])
    counts = db.execute(q.job_step_replay_from, {
        "run_id": run["id"], "seq": 2, "attempt": run["attempts"] + 1}).fetchone()
    assert counts == {"dropped": 2, "kept": 1}
    steps = db.execute(q.job_step_list, {"run_id": run["id"]}).fetchall()
    assert [(s["step_id"], s["attempt"]) for s in steps] == [("a", run["attempts"] + 1)]


def test_job_run_replay_puts_a_finished_run_back_in_line(db: Conn, q: Queries) -> None:
    run = finished_with_steps(db, q, ["a"], status="failed")
    replayed = db.execute(q.job_run_replay, {"id": run["id"], "now": T0}).fetchone()
    assert replayed is not None
    assert (replayed["status"], replayed["run_at"]) == ("pending", T0)
    assert (replayed["output"], replayed["error"]) == (None, None)
    assert replayed["finished_at"] is None
    assert replayed["max_attempts"] >= replayed["attempts"] + 1


def test_job_run_replay_leaves_a_live_run_alone(db: Conn, q: Queries) -> None:
    run = enqueue(db, q)
    assert db.execute(q.job_run_replay, {"id": run["id"], "now": T0}).fetchone() is None
    assert get(db, q, run["id"])["status"] == "pending"


def test_job_run_get_for_update_holds_the_row_until_the_transaction_ends(
        db: Conn, q: Queries, dsn: str) -> None:
    run = enqueue(db, q)
    with psycopg.connect(dsn, row_factory=dict_row) as other:  # not autocommit: one transaction
        locked = other.execute(q.job_run_get_for_update, {"tenant_ids": None,
                                                          "id": run["id"]}).fetchone()
        assert locked is not None
        assert locked["id"] == run["id"]
        skipped = db.execute("SELECT id FROM notifyq.job_run WHERE id = %s FOR UPDATE SKIP LOCKED",
                             (run["id"],)).fetchall()
        assert skipped == []
        other.rollback()
    assert db.execute("SELECT id FROM notifyq.job_run WHERE id = %s FOR UPDATE SKIP LOCKED",
                      (run["id"],)).fetchall() == [{"id": run["id"]}]
