"""Paused pools and job types (migration 0013): the pause queries, and the claim statements
(plain and keyed) leaving paused work pending."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import DEFINITION, Conn, claim, enqueue, get


def pause(db: Conn, q: Queries, kind: str, name: str, reason: str | None = None,
          ) -> dict[str, Any]:
    row = db.execute(q.pause_set, {"kind": kind, "name": name, "reason": reason,
                                   "now": T0}).fetchone()
    assert row is not None
    return row


def resume(db: Conn, q: Queries, kind: str, name: str) -> dict[str, Any] | None:
    return db.execute(q.pause_clear, {"kind": kind, "name": name}).fetchone()


def claim_keyed(db: Conn, q: Queries, pool: str = "default") -> list[dict[str, Any]]:
    return db.execute(q.job_run_claim_keyed, {"now": None, "pool": pool, "limit": 10,
                                              "worker_id": "w", "lease_s": 30.0}).fetchall()


def test_pause_set_is_idempotent_and_keeps_the_first_paused_at(db: Conn, q: Queries) -> None:
    first = pause(db, q, "pool", "mail", "deploy")
    assert (first["kind"], first["name"], first["reason"], first["created"]) == (
        "pool", "mail", "deploy", True)
    db.execute("UPDATE notifyq.pause SET paused_at = paused_at - interval '1 hour'")
    again = pause(db, q, "pool", "mail")
    assert again["created"] is False
    assert again["reason"] == "deploy"  # no new reason: the old one stays
    assert again["paused_at"] < first["paused_at"]
    assert pause(db, q, "pool", "mail", "load test")["reason"] == "load test"
    assert [(r["kind"], r["name"]) for r in db.execute(q.pause_list).fetchall()] == [
        ("pool", "mail")]


def test_pause_table_refuses_an_unknown_kind(db: Conn, q: Queries) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        pause(db, q, "tenant", "acme")


def test_pause_clear_returns_the_pools_to_wake(db: Conn, q: Queries) -> None:
    for job_type, pool in (("t.a", "mail"), ("t.b", "reports"), ("t.c", "mail")):
        db.execute(q.job_upsert, {**DEFINITION, "type": job_type, "pool": pool})
    pause(db, q, "pool", "mail")
    pause(db, q, "type", "t.b")
    assert resume(db, q, "pool", "nope") is None
    by_pool = resume(db, q, "pool", "mail")
    assert by_pool is not None
    assert by_pool["pools"] == ["mail"]
    by_type = resume(db, q, "type", "t.b")
    assert by_type is not None
    assert by_type["pools"] == ["mail", "reports"]
    assert db.execute(q.pause_list).fetchall() == []


def test_job_run_claim_leaves_a_paused_pool_pending(db: Conn, q: Queries) -> None:
    paused = [enqueue(db, q, "t.a", pool="mail")["id"] for _ in range(3)]
    other = enqueue(db, q, "t.a", pool="reports")["id"]
    pause(db, q, "pool", "mail")
    assert claim(db, q, T0, pool="mail") == []
    assert [r["id"] for r in claim(db, q, T0, pool="reports")] == [other]
    assert {get(db, q, i)["status"] for i in paused} == {"pending"}
    resume(db, q, "pool", "mail")
    assert sorted(r["id"] for r in claim(db, q, T0, pool="mail")) == sorted(paused)


def test_job_run_claim_skips_a_paused_type_and_claims_the_rest(db: Conn, q: Queries) -> None:
    # The paused type's runs are first in line (older, better priority): the claim reads past
    # them and takes the others.
    held = [enqueue(db, q, "t.held", priority=-5)["id"] for _ in range(5)]
    free = [enqueue(db, q, "t.free")["id"] for _ in range(3)]
    pause(db, q, "type", "t.held")
    assert sorted(r["id"] for r in claim(db, q, T0, limit=10)) == sorted(free)
    assert {get(db, q, i)["attempts"] for i in held} == {0}
    resume(db, q, "type", "t.held")
    assert sorted(r["id"] for r in claim(db, q, T0, limit=10)) == sorted(held)


def test_job_run_claim_keyed_obeys_pool_and_type_pauses(db: Conn, q: Queries) -> None:
    held = enqueue(db, q, "t.held", concurrency_key="k1")["id"]
    free = enqueue(db, q, "t.free", concurrency_key="k2")["id"]
    pause(db, q, "pool", "default")
    assert claim_keyed(db, q) == []
    resume(db, q, "pool", "default")
    pause(db, q, "type", "t.held")
    assert [r["id"] for r in claim_keyed(db, q)] == [free]
    assert get(db, q, held)["status"] == "pending"
    resume(db, q, "type", "t.held")
    assert [r["id"] for r in claim_keyed(db, q)] == [held]
