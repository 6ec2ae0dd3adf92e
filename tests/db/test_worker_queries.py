"""The worker registry (0009): register, heartbeat, list the live ones, leave, reap."""

from __future__ import annotations

from typing import Any

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import DEFINITION, Conn, seconds


def _params(worker_id: str, now: Any, **over: Any) -> dict[str, Any]:
    return {"id": worker_id, "host": "h", "pid": 7, "version": "1.2.3", "pools": ["default"],
            "concurrency": 10, "running": 0, "now": now, "ttl_s": 30, "retry_slots": None,
            **over}


def _listed(db: Conn, q: Queries, now: Any) -> list[str]:
    return [r["id"] for r in db.execute(q.worker_list, {"now": now}).fetchall()]


def test_a_registered_worker_is_listed_until_its_registration_expires(db: Conn,
                                                                     q: Queries) -> None:
    db.execute(q.worker_register, _params("a", T0))
    db.execute(q.worker_register, _params("b", T0 + seconds(1), pools=["x", "y"]))
    rows = db.execute(q.worker_list, {"now": T0 + seconds(2)}).fetchall()
    assert [(r["id"], r["pools"], r["started_at"]) for r in rows] == [
        ("a", ["default"], T0), ("b", ["x", "y"], T0 + seconds(1))]
    assert _listed(db, q, T0 + seconds(30)) == ["b"]  # a's lease ran out at T0 + 30 s
    assert _listed(db, q, T0 + seconds(31)) == []


def test_a_heartbeat_renews_the_registration(db: Conn, q: Queries) -> None:
    db.execute(q.worker_register, _params("a", T0))
    renewed = db.execute(q.worker_heartbeat, _params("a", T0 + seconds(20), running=4))
    assert renewed.fetchall() == [{"id": "a"}]
    [row] = db.execute(q.worker_list, {"now": T0 + seconds(45)}).fetchall()
    assert (row["heartbeat_at"], row["started_at"]) == (T0 + seconds(20), T0)


def test_a_heartbeat_of_an_unknown_worker_returns_nothing_and_registering_again_works(
        db: Conn, q: Queries) -> None:
    assert db.execute(q.worker_heartbeat, _params("gone", T0)).fetchall() == []
    db.execute(q.worker_register, _params("gone", T0))
    db.execute(q.worker_register, _params("gone", T0 + seconds(5), running=2))  # no conflict
    [row] = db.execute(q.worker_list, {"now": T0 + seconds(6)}).fetchall()
    assert row["started_at"] == T0


def test_the_list_counts_the_runs_each_worker_holds_now_not_at_its_heartbeat(
        db: Conn, q: Queries) -> None:
    db.execute(q.worker_register, _params("a", T0, running=7))
    db.execute(q.worker_register, _params("b", T0))
    db.execute("INSERT INTO notifyq.job_run (job_type, input, status, leased_by) "
               "SELECT 't', '{}', s, w FROM (VALUES ('running', 'a'), ('running', 'a'), "
               "('running', 'c'), ('pending', NULL), ('completed', 'b')) AS v(s, w)")
    rows = db.execute(q.worker_list, {"now": T0 + seconds(1)}).fetchall()
    assert [(r["id"], r["running"]) for r in rows] == [("a", 2), ("b", 0)]


def test_leave_and_reap_remove_rows(db: Conn, q: Queries) -> None:
    for worker_id in ("a", "b", "c"):
        db.execute(q.worker_register, _params(worker_id, T0))
    db.execute(q.worker_heartbeat, _params("c", T0 + seconds(25)))
    db.execute(q.worker_leave, {"id": "a"})
    reaped = db.execute(q.worker_reap_expired, {"now": T0 + seconds(40)}).fetchall()
    assert reaped == [{"id": "b"}]  # a left, c renewed until T0 + 55 s
    assert _listed(db, q, T0 + seconds(40)) == ["c"]


def test_the_completers_session_plans_its_statements_once(db: Conn, q: Queries) -> None:
    db.execute(q.worker_session_generic_plans)
    assert db.execute("SHOW plan_cache_mode").fetchone() == {"plan_cache_mode":
                                                            "force_generic_plan"}
    # Plans that must hold at any table size reach job_run by index (see the statement).
    assert db.execute("SHOW enable_seqscan").fetchone() == {"enable_seqscan": "off"}
    # A prepared statement on such a session is planned generically from its first run.
    db.execute("PREPARE nq_t(text) AS SELECT count(*) FROM notifyq.job_run WHERE pool = $1")
    for _ in range(3):
        db.execute("EXECUTE nq_t('default')")
    assert db.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                      "WHERE name = 'nq_t'").fetchone() == {"generic_plans": 3,
                                                            "custom_plans": 0}


def test_job_pool_list_names_the_pools_of_job_types_and_of_live_workers(
        db: Conn, q: Queries) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": "mail.send", "pool": "mail"})
    db.execute(q.job_upsert, {**DEFINITION, "type": "mail.bulk", "pool": "mail"})
    db.execute(q.worker_register, _params("a", T0, pools=["default", "sms"]))
    db.execute(q.worker_register, _params("b", T0 - seconds(60), pools=["gone"]))
    rows = db.execute(q.job_pool_list, {"now": T0}).fetchall()
    assert [r["pool"] for r in rows] == ["default", "mail", "sms"]  # b's lease has run out
