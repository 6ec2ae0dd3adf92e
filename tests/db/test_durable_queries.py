"""The durable-run queries and the run-update trigger, run directly against PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from notifyq._db.queries import Queries
from notifyq._enqueue.ids import new_run_id
from tests.db.conftest import T0
from tests.db.helpers import (
    NO_CLAIM,
    Conn,
    claim,
    count,
    enqueue,
    finish,
    get,
    no_waits,
    seconds,
)


def claim_keyed(db: Conn, q: Queries, *, limit: int = 10, now: Any = None) -> list[dict[str, Any]]:
    return db.execute(q.job_run_claim_keyed, {"now": now, "pool": "default", "limit": limit,
                                              "worker_id": "w", "lease_s": 30.0}).fetchall()


def record(db: Conn, q: Queries, run: dict[str, Any], step_id: str, **kw: Any) -> Any:
    params = {"run_id": run["id"], "fence": run["fence"], "step_id": step_id, "seq": 1,
              "kind": "step", "status": "completed", "output": '"out"', "error": None,
              "attempts": 1, "attempt": run["attempts"], "started_at": T0, "now": None, **kw}
    return db.execute(q.job_step_record, params).fetchone()


def spawn(db: Conn, q: Queries, parent: dict[str, Any], step_id: str = "child:1", *,
          policy: str = "terminate", fence: int | None = None) -> dict[str, Any] | None:
    return db.execute(q.job_run_spawn_child, {
        "run_id": parent["id"], "fence": parent["fence"] if fence is None else fence,
        "job_type": "t.child", "input": "{}", "run_at": None, "priority": None, "tags": None,
        "child_id": new_run_id(), "close_policy": policy, "step_id": step_id, "seq": 1,
        "attempt": parent["attempts"]}).fetchone()


def claimed(db: Conn, q: Queries, job_type: str = "t.a") -> dict[str, Any]:
    enqueue(db, q, job_type)
    (run,) = claim(db, q, None, limit=1, worker_id="w")
    return run


# -- keyed claims -----------------------------------------------------------------------------


def test_job_run_claim_keyed_claims_keyed_runs_then_plain_ones_within_the_limit(
        db: Conn, q: Queries) -> None:
    for _ in range(3):
        enqueue(db, q, concurrency_key="a", concurrency_limit=2)
    plain = [enqueue(db, q) for _ in range(4)]
    # Not keyed: the plain claim alone, the keyed runs left (one-time filter, no _claim_keyed).
    [alone] = claim(db, q, None, limit=1, worker_id="w")
    assert alone["id"] == plain[0]["id"]
    first = claim(db, q, None, limit=4, worker_id="w", keyed=True)
    # The key's two, then plain runs in their order for the rest of the limit.
    assert [r["id"] for r in first[2:]] == [r["id"] for r in plain[1:3]]
    assert [(r["claimed"], r["status"]) for r in first] == [(True, "running")] * 4
    assert count(db, "status = 'running' AND concurrency_key = 'a'") == 2
    assert count(db, "status = 'running' AND concurrency_key IS NULL") == 3
    assert all(r["fence"] != 0 and r["attempts"] == 1 for r in first)
    # The key is full: only the last plain run is left to claim.
    assert [r["id"] for r in claim(db, q, None, keyed=True)] == [plain[3]["id"]]
    assert claim(db, q, None, keyed=True) == []


def test_job_run_claim_keyed_commits_asynchronously_with_only_keyed_runs_claimed(
        db: Conn, q: Queries) -> None:
    enqueue(db, q, concurrency_key="a")
    with db.transaction():
        [row] = claim(db, q, None, keyed=True)
        mode = db.execute("SHOW synchronous_commit").fetchone()
        assert mode is not None
        assert mode["synchronous_commit"] == "off"
    assert row["claimed"] is True


def test_job_run_claim_keyed_claims_at_most_the_limit_per_key(db: Conn, q: Queries) -> None:
    for _ in range(3):
        enqueue(db, q, concurrency_key="a", concurrency_limit=2)
    enqueue(db, q, concurrency_key="b")
    first = claim_keyed(db, q)
    assert sorted(r["concurrency_key"] for r in first) == ["a", "a", "b"]
    assert claim_keyed(db, q) == []  # both keys at their limit
    assert claim(db, q, None, limit=10, worker_id="w") == []
    done = next(r for r in first if r["concurrency_key"] == "a")
    finish(db, q, T0, [(done["id"], done["fence"], "completed")])
    (again,) = claim_keyed(db, q)
    assert again["concurrency_key"] == "a"


def test_job_run_claim_keyed_skips_a_key_another_transaction_is_deciding(db: Conn, db2: Conn,
                                                                        q: Queries) -> None:
    enqueue(db, q, concurrency_key="hot")
    with db2.transaction():
        db2.execute("SELECT pg_advisory_xact_lock(hashtext('notifyq.concurrency'), "
                    "hashtext('hot'))")
        assert claim_keyed(db, q) == []  # skipped, not waited for
    assert len(claim_keyed(db, q)) == 1


# -- steps ------------------------------------------------------------------------------------


def test_job_step_record_is_fenced_and_listed_in_order(db: Conn, q: Queries) -> None:
    run = claimed(db, q)
    assert record(db, q, run, "b", seq=2) is not None
    assert record(db, q, run, "a", seq=1, output='{"x": 1}') is not None
    assert record(db, q, run, "stale", fence=run["fence"] - 1) is None
    rows = db.execute(q.job_step_list, {"run_id": run["id"]}).fetchall()
    assert [(r["step_id"], r["seq"], r["output"]) for r in rows] == [("a", 1, {"x": 1}),
                                                                     ("b", 2, "out")]
    assert record(db, q, run, "a", seq=1, output='{"x": 2}', attempts=2) is not None
    (first,) = [r for r in db.execute(q.job_step_list, {"run_id": run["id"]}) if r["step_id"]
                == "a"]
    assert (first["output"], first["attempts"]) == ({"x": 2}, 3)


# -- children, the trigger and close policies -------------------------------------------------


def test_job_run_spawn_child_inserts_a_child_and_memoizes_the_spawn(db: Conn, q: Queries) -> None:
    parent = claimed(db, q)
    row = spawn(db, q, parent)
    assert row is not None
    child = get(db, q, row["id"])
    assert (child["parent_run_id"], child["root_run_id"], child["trigger_source"],
            child["parent_close_policy"]) == (parent["id"], parent["id"], "parent", "terminate")
    assert get(db, q, parent["id"])["has_children"] is True
    (step,) = db.execute(q.job_step_list, {"run_id": parent["id"]}).fetchall()
    assert (step["kind"], step["output"]) == ("child", {"run_id": str(row["id"])})
    assert spawn(db, q, parent, "child:2", fence=parent["fence"] + 1) is None  # fenced


def test_a_child_belongs_to_its_parents_tenant(db: Conn, q: Queries) -> None:
    plain = spawn(db, q, claimed(db, q))  # a parent without a tenant: a child without one
    assert plain is not None
    assert get(db, q, plain["id"])["tenant_id"] is None
    db.execute("DELETE FROM notifyq.job_run")
    enqueue(db, q, "t.a", tenant_id="acme")
    (parent,) = claim(db, q, None, limit=1, worker_id="w")
    row = spawn(db, q, parent)
    assert row is not None
    assert get(db, q, row["id"])["tenant_id"] == "acme"


def test_a_finishing_child_wakes_its_waiting_parent_and_status_many_reads_them(
        db: Conn, q: Queries) -> None:
    parent = claimed(db, q, "t.parent")
    kid = spawn(db, q, parent)
    assert kid is not None
    db.execute(q.job_run_finish_and_claim, {**NO_CLAIM,
        "now": None, "ids": [parent["id"]], "fences": [parent["fence"]], "statuses": ["waiting"],
        "outputs": [None], "errors": [None], "run_ats": [T0 + timedelta(days=365)],
        "refunds": [1], "wait_kinds": ["children"], "wait_tokens": [None],
        "waiting_ons": ["{" + str(kid["id"]) + "}"]})
    assert get(db, q, parent["id"])["status"] == "waiting"
    (child_claim,) = claim(db, q, T0 + timedelta(days=400))
    finish(db, q, T0, [(child_claim["id"], child_claim["fence"], "completed")],
           output='{"v": 1}')
    woken = get(db, q, parent["id"])
    assert (woken["status"], woken["children_done"]) == ("pending", [kid["id"]])
    rows = db.execute(q.job_run_status_many, {"ids": [kid["id"]]}).fetchall()
    assert [(r["status"], r["output"]) for r in rows] == [("completed", {"v": 1})]


def test_a_parent_deciding_to_wait_after_its_children_finished_does_not_wait(
        db: Conn, q: Queries) -> None:
    parent = claimed(db, q, "t.parent")
    kid = spawn(db, q, parent)
    assert kid is not None
    db.execute("UPDATE notifyq.job_run SET status = 'completed', finished_at = now() "
               "WHERE id = %s", (kid["id"],))
    db.execute(q.job_run_finish_and_claim, {**NO_CLAIM,
        "now": None, "ids": [parent["id"]], "fences": [parent["fence"]], "statuses": ["waiting"],
        "outputs": [None], "errors": [None], "run_ats": [T0 + timedelta(days=365 * 900)],
        "refunds": [1], "wait_kinds": ["children"], "wait_tokens": [None],
        "waiting_ons": ["{" + str(kid["id"]) + "}"]})
    row = get(db, q, parent["id"])
    assert row["status"] == "pending"
    now = db.execute("SELECT now() AS now").fetchone()
    assert now is not None
    assert row["run_at"] <= now["now"]  # runnable now, not at the wait's far-future run_at


@pytest.mark.parametrize(("policy", "expected"), [("terminate", "canceled"),
                                                 ("cancel", "canceled"),
                                                 ("abandon", "pending")])
def test_a_parent_finishing_applies_the_close_policy_to_pending_children(
        db: Conn, q: Queries, policy: str, expected: str) -> None:
    parent = claimed(db, q, "t.parent")
    kid = spawn(db, q, parent, policy=policy)
    assert kid is not None
    finish(db, q, T0, [(parent["id"], parent["fence"], "completed")])
    assert get(db, q, kid["id"])["status"] == expected


def test_cancel_policy_asks_a_running_child_to_stop_and_terminate_stops_it(db: Conn,
                                                                         q: Queries) -> None:
    parent = claimed(db, q, "t.parent")
    soft = spawn(db, q, parent, "child:1", policy="cancel")
    hard = spawn(db, q, parent, "child:2", policy="terminate")
    assert soft is not None
    assert hard is not None
    claim(db, q, T0 + timedelta(days=400))  # both children running
    finish(db, q, T0, [(parent["id"], parent["fence"], "failed")])
    soft_row, hard_row = get(db, q, soft["id"]), get(db, q, hard["id"])
    assert soft_row["status"] == "running"
    assert soft_row["cancel_requested_at"] is not None
    assert (hard_row["status"], hard_row["leased_by"]) == ("canceled", None)


# -- signals and resumes ----------------------------------------------------------------------


def wait_for_signal(db: Conn, q: Queries, run: dict[str, Any], token: str) -> None:
    """What ctx.wait_for_signal leaves behind: its wait step (running), then the run waiting."""
    record(db, q, run, f"signal:{token}", kind="signal", status="running",
           output='{"deadline": null}')
    db.execute(q.job_run_finish_and_claim, {**NO_CLAIM,
        "now": None, "ids": [run["id"]], "fences": [run["fence"]], "statuses": ["waiting"],
        "outputs": [None], "errors": [None], "run_ats": [T0 + timedelta(days=365)],
        "refunds": [1], "wait_kinds": ["signal"], "wait_tokens": [token], "waiting_ons": [None]})


def signal_step(db: Conn, run: dict[str, Any], token: str) -> Any:
    return db.execute("SELECT status, output FROM notifyq.job_step WHERE run_id = %s "
                      "AND step_id = %s", (run["id"], f"signal:{token}")).fetchone()


def queued(db: Conn, token: str) -> list[Any]:
    rows = db.execute("SELECT payload FROM notifyq.job_signal WHERE token = %s ORDER BY id",
                      (token,)).fetchall()
    return [r["payload"] for r in rows]


def test_job_signal_send_hands_each_signal_to_one_waiting_run_longest_waiting_first(
        db: Conn, q: Queries) -> None:
    first, second = claimed(db, q), claimed(db, q)
    wait_for_signal(db, q, first, "tok")
    wait_for_signal(db, q, second, "tok")
    send = q.job_signal_send
    assert db.execute(send, {"tenant_ids": None,
                             "token": "tok", "payload": '{"a": 1}'}).fetchone() == {"woken": 1}
    assert get(db, q, first["id"])["status"] == "pending"
    assert signal_step(db, first, "tok") == {"status": "completed", "output": {"payload": {"a": 1}}}
    assert get(db, q, second["id"])["status"] == "waiting"  # one signal, one run
    assert db.execute(send, {"tenant_ids": None,
                             "token": "tok", "payload": '{"a": 2}'}).fetchone() == {"woken": 1}
    assert signal_step(db, second, "tok")["output"] == {"payload": {"a": 2}}
    assert queued(db, "tok") == []  # delivered, so not kept
    # Nobody waits any more: the next signals queue up, in order.
    assert db.execute(send, {"tenant_ids": None,
                             "token": "tok", "payload": '{"a": 3}'}).fetchone() == {"woken": 0}
    assert db.execute(send, {"tenant_ids": None,
                             "token": "tok", "payload": '{"a": 4}'}).fetchone() == {"woken": 0}
    assert queued(db, "tok") == [{"a": 3}, {"a": 4}]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="1 to 512"):
        db.execute(send, {"tenant_ids": None, "token": "", "payload": "{}"})


def consume(db: Conn, q: Queries, run: dict[str, Any], token: str, *,
            fence: int | None = None) -> Any:
    return db.execute(q.job_signal_consume, {
        "run_id": run["id"], "fence": run["fence"] if fence is None else fence, "token": token,
        "step_id": f"signal:{token}", "seq": 1, "attempt": run["attempts"],
        "started_at": T0}).fetchone()


def test_job_signal_consume_takes_the_oldest_queued_signal_once_under_the_fence(
        db: Conn, q: Queries) -> None:
    for n in (1, 2):
        db.execute(q.job_signal_send, {"tenant_ids": None,
                                       "token": "tok", "payload": json.dumps({"n": n})})
    first, second, third = claimed(db, q), claimed(db, q), claimed(db, q)
    assert consume(db, q, first, "tok", fence=first["fence"] + 1) is None  # lost its lease
    assert queued(db, "tok") == [{"n": 1}, {"n": 2}]
    assert consume(db, q, first, "tok") == {"payload": {"n": 1}}
    assert signal_step(db, first, "tok") == {"status": "completed", "output": {"payload": {"n": 1}}}
    assert consume(db, q, second, "tok") == {"payload": {"n": 2}}
    assert consume(db, q, third, "tok") is None
    assert signal_step(db, third, "tok") is None
    assert queued(db, "tok") == []


def test_job_signal_purge_expired_deletes_only_signals_past_the_retention(
        db: Conn, q: Queries) -> None:
    db.execute("INSERT INTO notifyq.job_signal (token, payload, created_at) VALUES "
               "('old', '{}', %s), ('old', '{}', %s), ('new', '{}', %s)",
               (T0 - timedelta(days=8), T0 - timedelta(days=7, seconds=1), T0 - seconds(60)))
    purge = {"now": T0, "retention_s": 7 * 86_400.0, "limit": 1}
    assert db.execute(q.job_signal_purge_expired, purge).rowcount == 1  # bounded batches
    assert db.execute(q.job_signal_purge_expired, purge).rowcount == 1
    assert db.execute(q.job_signal_purge_expired, purge).rowcount == 0
    assert [r["token"] for r in db.execute("SELECT token FROM notifyq.job_signal")] == ["new"]


def test_job_run_resume_due_resumes_elapsed_sleeps_and_missed_signals_only(
        db: Conn, q: Queries) -> None:
    sleeper, signaled, waiting = (claimed(db, q) for _ in range(3))
    db.execute(q.job_run_finish_and_claim, {**NO_CLAIM,
        "now": None, "ids": [sleeper["id"], signaled["id"], waiting["id"]],
        "fences": [sleeper["fence"], signaled["fence"], waiting["fence"]],
        "statuses": ["waiting"] * 3, "outputs": [None] * 3, "errors": [None] * 3,
        "run_ats": [T0, T0 + timedelta(days=365), T0 + timedelta(days=365)],
        "refunds": [1] * 3, "wait_kinds": ["sleep", "signal", "signal"],
        "wait_tokens": [None, "sent", "unsent"], "waiting_ons": [None] * 3})
    db.execute("INSERT INTO notifyq.job_signal (token, payload) VALUES ('sent', '{}')")
    rows = db.execute(q.job_run_resume_due, {"now": T0 + seconds(1), "limit": 10}).fetchall()
    assert {r["id"] for r in rows} == {sleeper["id"], signaled["id"]}
    assert get(db, q, waiting["id"])["status"] == "waiting"
    assert get(db, q, sleeper["id"])["attempts"] == 0  # waits do not use attempts


def test_finish_many_records_the_wait_on_the_run(db: Conn, q: Queries) -> None:
    run = claimed(db, q)
    other: UUID = new_run_id()
    db.execute(q.job_run_finish_and_claim, {**NO_CLAIM,
        "now": None, "ids": [run["id"]], "fences": [run["fence"]], "statuses": ["waiting"],
        "outputs": [None], "errors": [None], "run_ats": [T0 + timedelta(days=1)],
        "refunds": [1], "wait_kinds": ["children"], "wait_tokens": [None],
        "waiting_ons": ["{" + str(other) + "}"]})
    row = get(db, q, run["id"])
    assert (row["status"], row["wait_kind"], row["waiting_on"]) == ("waiting", "children", [other])
    assert no_waits(1) == {"wait_kinds": [None], "wait_tokens": [None], "waiting_ons": [None]}
