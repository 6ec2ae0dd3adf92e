"""The job_run named queries, run directly against a fresh migrated database."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq._db.queries import Queries
from notifyq._enqueue.request import EnqueueRequest, Prepared, prepare
from tests.db.conftest import T0
from tests.db.helpers import (
    DEFINITION,
    LIST_FILTERS,
    NO_CLAIM,
    Conn,
    claim,
    count,
    enqueue,
    finish,
    generic_plan,
    get,
    insert_one,
    no_waits,
    seconds,
    table_reads,
)

# -- enqueue --------------------------------------------------------------------------------------

def test_job_run_enqueue_inserts_a_pending_run_with_defaults(db: Conn, q: Queries) -> None:
    row = enqueue(db, q, "mail.send", {"to": "a@b.c"}, tags=["x"])
    assert row["status"] == "pending"
    assert row["input"] == {"to": "a@b.c"}
    assert (row["pool"], row["priority"], row["max_attempts"], row["attempts"]) == (
        "default", 0, 25, 0)
    assert row["tags"] == ["x"]
    assert row["trigger_source"] == "manual"
    assert count(db) == 1


def test_job_run_enqueue_applies_the_stored_job_definition(db: Conn, q: Queries) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": "mail.send", "version": 3, "pool": "mail",
                              "priority": 7, "max_attempts": 4, "timeout_s": 2.5})
    row = enqueue(db, q, "mail.send")
    assert (row["job_version"], row["pool"], row["priority"], row["max_attempts"],
            row["timeout_s"]) == (3, "mail", 7, 4, 2.5)
    explicit = enqueue(db, q, "mail.send", pool="other", priority=-3, max_attempts=9)
    assert (explicit["pool"], explicit["priority"], explicit["max_attempts"]) == ("other", -3, 9)


def test_job_run_enqueue_with_a_dedupe_key_returns_the_existing_run(db: Conn, q: Queries) -> None:
    first = enqueue(db, q, "mail.send", {"n": 1}, dedupe_key="welcome:42")
    second = enqueue(db, q, "mail.send", {"n": 2}, dedupe_key="welcome:42")
    other_type = enqueue(db, q, "mail.other", {"n": 3}, dedupe_key="welcome:42")
    assert second["id"] == first["id"]
    assert second["input"] == {"n": 1}
    assert other_type["id"] != first["id"]
    assert count(db) == 2


def test_job_run_insert_one_applies_the_definition_defaults_and_returns_only_what_it_applied(
        db: Conn, q: Queries) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": "t.def", "version": 2, "pool": "p1",
                              "priority": 5, "max_attempts": 3, "timeout_s": 1.5})
    prepared = [prepare(EnqueueRequest(job_type=t, input={"i": i}, tags=["b"] if i else None,
                                       priority=1 if i == 2 else None))
                for i, t in enumerate(["t.def", "t.plain", "t.def"])]
    with db.transaction():  # now() is the transaction's
        first, plain, third = (insert_one(db, q, p, accept=p.request.job_type == "t.plain")
                               for p in prepared)
        now = db.execute("SELECT now() AS now").fetchone()
    assert first is not None
    assert plain is not None
    assert third is not None
    assert now is not None
    assert first == {"id": prepared[0].id, "pool": "p1", "priority": 5, "max_attempts": 3,
                     "timeout_s": 1.5, "created_at": now["now"], "notified": None}
    assert (plain["pool"], plain["priority"], plain["max_attempts"], plain["timeout_s"]) == (
        "default", 0, 25, None)
    assert third["priority"] == 1
    stored = {r["id"]: r for r in db.execute(
        "SELECT id, job_version, input, tags, run_at FROM notifyq.job_run").fetchall()}
    assert stored[prepared[0].id]["job_version"] == 2
    assert stored[prepared[0].id]["tags"] == []
    assert stored[prepared[1].id]["input"] == {"i": 1}
    assert stored[prepared[1].id]["tags"] == ["b"]
    assert stored[prepared[2].id]["run_at"] == now["now"]


def test_job_run_insert_one_notifies_the_runs_pool_when_asked(dsn: str, db: Conn,
                                                             q: Queries) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN notifyq")
        row = insert_one(db, q, EnqueueRequest(job_type="t.a", pool="mail"), accept=True,
                         notify=True)
        assert row is not None
        assert row["notified"] == 1
        insert_one(db, q, EnqueueRequest(job_type="t.a", pool="quiet"), accept=True)
        got = [n.payload for n in listener.notifies(timeout=0.5)]
    assert got == ["j:mail"]


def test_job_run_insert_bulk_inserts_compact_records_and_returns_the_definitions_applied(
        db: Conn, q: Queries) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": "t.def", "version": 2, "pool": "p1",
                              "priority": 5, "max_attempts": 3, "timeout_s": 1.5})
    ids = [uuid4() for _ in range(3)]
    records = [{"id": ids[0].hex, "job_type": "t.def", "input": {"i": 0}},  # keys left out
               {"id": str(ids[1]), "job_type": "t.plain", "tags": ["b"], "input": [1]},
               {"id": ids[2].hex, "job_type": "t.def", "priority": 1, "input": {"i": 2}}]
    with db.transaction():  # now() is the transaction's
        summary = db.execute(q.job_run_insert_bulk, {"notify": False, "channel": "notifyq",
            "rows": json.dumps(records), "types": ["t.def", "t.plain"],
            "accept_types": ["t.plain"]}).fetchall()
        now = db.execute("SELECT now() AS now").fetchone()
    assert now is not None
    assert [(s["type"], s["pool"], s["priority_default"], s["max_attempts"], s["timeout_s"])
            for s in summary] == [("t.def", "p1", 5, 3, 1.5), ("t.plain", None, None, None, None)]
    assert {(s["inserted"], s["now"]) for s in summary} == {(3, now["now"])}
    rows = {r["id"]: r for r in db.execute(
        "SELECT id, job_version, pool, priority, max_attempts, timeout_s, tags, input, run_at, "
        "created_at FROM notifyq.job_run").fetchall()}
    first, plain, third = (rows[i] for i in ids)
    assert (first["job_version"], first["pool"], first["priority"], first["max_attempts"],
            first["timeout_s"], first["tags"]) == (2, "p1", 5, 3, 1.5, [])
    assert (plain["pool"], plain["priority"], plain["max_attempts"], plain["tags"],
            plain["input"]) == ("default", 0, 25, ["b"], [1])
    assert third["priority"] == 1
    assert first["run_at"] == first["created_at"] == now["now"]



def test_job_run_copy_defaults_gives_what_the_insert_would_join_for_each_type(
        db: Conn, q: Queries) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": "t.def", "version": 2, "pool": "p1",
                              "priority": 5, "max_attempts": 3, "timeout_s": 1.5,
                              "scope_entity_type": "order"})
    db.execute(q.job_upsert, {**DEFINITION, "type": "t.scoped", "scope_entity_type": "order",
                              "scope_id_template": "{o}"})
    db.execute(q.job_upsert, {**DEFINITION, "type": "t.rated", "rate_limit": 5,
                              "rate_period_s": 1.0, "rate_key_template": "{a}"})
    with db.transaction():
        rows = db.execute(q.job_run_copy_defaults, {
            "types": ["t.def", "t.plain", "t.scoped", "t.rated"],
            "accept_types": ["t.plain"]}).fetchall()
        now = db.execute("SELECT now() AS now").fetchone()
    assert now is not None
    assert sorted((r["type"], r["version"], r["pool"], r["priority_default"], r["max_attempts"],
                   r["timeout_s"], r["scope_entity_type"], r["known"], r["templated"])
                  for r in rows) == [
        ("t.def", 2, "p1", 5, 3, 1.5, "order", True, False),
        ("t.plain", None, None, None, None, None, None, False, False),
        ("t.rated", 1, "default", 0, 25, None, None, True, True),
        ("t.scoped", 1, "default", 0, 25, None, "order", True, True)]
    assert {r["now"] for r in rows} == {now["now"]}
    with pytest.raises(psycopg.Error) as refused:  # unknown, not accepted: as the INSERT
        db.execute(q.job_run_copy_defaults, {"types": ["t.def", "t.plain"],
                                             "accept_types": None})
    assert refused.value.sqlstate == "NQ422"


def test_job_run_copy_writes_rows_in_the_column_order_copy_py_sends(
        db: Conn, q: Queries) -> None:
    run_id, later = uuid4(), T0 + timedelta(days=1)
    with db.cursor() as cur, cur.copy(q.job_run_copy) as copy:
        copy.write_row((run_id, '{"a": [1, "\\t"]}', "t.c", 3, "p", -2, 4, 2.5, "order", 7,
                        later, T0, ["x", "y z"], "o-1", "acme", '{"traceparent": "00-1"}'))
    row = db.execute("SELECT * FROM notifyq.job_run WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    assert {k: row[k] for k in (
        "input", "job_type", "job_version", "pool", "priority", "max_attempts", "timeout_s",
        "scope_entity_type", "defaulted", "run_at", "created_at", "tags", "scope_entity_id",
        "tenant_id", "trace_context", "status", "attempts")} == {
        "input": {"a": [1, "\t"]}, "job_type": "t.c", "job_version": 3, "pool": "p",
        "priority": -2, "max_attempts": 4, "timeout_s": 2.5, "scope_entity_type": "order",
        "defaulted": 7, "run_at": later, "created_at": T0, "tags": ["x", "y z"],
        "scope_entity_id": "o-1", "tenant_id": "acme",
        "trace_context": {"traceparent": "00-1"}, "status": "pending", "attempts": 0}


def test_job_run_insert_bulk_notifies_each_pool_of_the_batch_once_on_commit(
        dsn: str, db: Conn, q: Queries) -> None:
    records: list[dict[str, Any]] = [
        {"id": str(uuid4()), "job_type": "t.a", "pool": pool, "input": {}}
        for pool in ("a", "b", "a", "default")]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN notifyq")
        with db.transaction():
            summary = db.execute(q.job_run_insert_bulk, {
                "notify": True, "channel": "notifyq", "rows": json.dumps(records),
                "types": ["t.a"], "accept_types": ["t.a"]}).fetchall()
            assert list(listener.notifies(timeout=0.2)) == []  # not before the commit
        got = sorted(n.payload for n in listener.notifies(timeout=0.5))
    assert [s["notified"] for s in summary] == [3]
    assert got == ["j:a", "j:b", "j:default"]

TRACE = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'


def test_a_trace_context_goes_in_with_the_record_and_comes_back_with_the_claim(
        db: Conn, q: Queries) -> None:
    traced, plain = (prepare(EnqueueRequest(job_type="t.a", input={"i": i})) for i in range(2))
    insert_one(db, q, traced, accept=True, trace_context=TRACE)
    insert_one(db, q, plain, accept=True)
    bulk_id = uuid4()
    db.execute(q.job_run_insert_bulk, {"notify": False, "channel": "notifyq",
        "rows": json.dumps([{"id": str(bulk_id), "trace_context": json.loads(TRACE),
                             "job_type": "t.a", "input": {}}]),
        "types": ["t.a"], "accept_types": ["t.a"]})
    claimed = {r["id"]: r["trace_context"] for r in claim(db, q, T0 + timedelta(hours=1))}
    assert claimed == {traced.id: json.loads(TRACE), plain.id: None, bulk_id: json.loads(TRACE)}


def test_job_run_trace_context_set_fills_a_run_without_one_and_keeps_an_existing_one(
        db: Conn, q: Queries) -> None:
    keyed = enqueue(db, q, dedupe_key="k", allow_unknown_type=True)
    cur = db.execute(q.job_run_trace_context_set, {"id": keyed["id"], "trace_context": TRACE})
    assert cur.rowcount == 1
    other = TRACE.replace("b7ad", "c8be")
    cur = db.execute(q.job_run_trace_context_set, {"id": keyed["id"], "trace_context": other})
    assert cur.rowcount == 0
    stored = db.execute("SELECT trace_context FROM notifyq.job_run WHERE id = %s",
                        (keyed["id"],)).fetchone()
    assert stored == {"trace_context": json.loads(TRACE)}


def test_job_run_insert_bulk_inserts_nothing_when_an_input_is_too_large_as_jsonb_prints_it(
        db: Conn, q: Queries) -> None:
    records = [{"id": str(uuid4()), "job_type": "t.a", "input": {"n": [1e300] * 250}},
               {"id": str(uuid4()), "job_type": "t.a", "input": {"n": 1}}]
    summary = db.execute(q.job_run_insert_bulk, {"notify": False, "channel": "notifyq",
        "rows": json.dumps(records), "types": ["t.a"], "accept_types": None}).fetchall()
    assert [s["inserted"] for s in summary] == [0]
    assert count(db) == 0


def test_job_run_notify_sends_one_notification_per_payload(dsn: str, db: Conn,
                                                           q: Queries) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(q.notifier_listen)
        db.execute(q.job_run_notify, {"channel": "notifyq", "payloads": ["j:a", "c:x"]})
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert sorted(got) == ["c:x", "j:a"]


# -- claim ----------------------------------------------------------------------------------------

def test_job_run_claim_takes_best_priority_then_oldest_run_at(db: Conn, q: Queries) -> None:
    late_urgent = enqueue(db, q, input={"n": "late_urgent"}, priority=-5, run_at=T0 - seconds(1))
    early_normal = enqueue(db, q, input={"n": "early_normal"}, run_at=T0 - seconds(60))
    later_normal = enqueue(db, q, input={"n": "later_normal"}, run_at=T0 - seconds(30))
    early_urgent = enqueue(db, q, input={"n": "early_urgent"}, priority=-5,
                           run_at=T0 - seconds(10))
    enqueue(db, q, input={"n": "future"}, priority=-1000, run_at=T0 + seconds(1))
    enqueue(db, q, input={"n": "other_pool"}, pool="other", run_at=T0 - seconds(90))
    order = [claim(db, q, T0, limit=1)[0]["id"] for _ in range(4)]
    assert order == [early_urgent["id"], late_urgent["id"], early_normal["id"],
                     later_normal["id"]]
    assert claim(db, q, T0) == []
    assert count(db, "status = 'pending'") == 2


@pytest.mark.parametrize("statement", ["job_run_claim", "job_run_finish_and_claim"])
def test_one_claim_returns_its_runs_in_claim_order(db: Conn, q: Queries, statement: str) -> None:
    """The worker starts a claim's runs in the order they come back, and the claimed rows are
    updated in whatever order the scan meets them: ids grow with time, so the latest enqueued
    (here the most urgent) come last unless the statement sorts them."""
    normal = [enqueue(db, q, input={"n": i}, run_at=T0 - seconds(60))["id"] for i in range(3)]
    urgent = [enqueue(db, q, input={"n": i}, priority=-5, run_at=T0 - seconds(10))["id"]
              for i in range(3)]
    if statement == "job_run_claim":
        rows = claim(db, q, T0)
    else:  # a cycle with a write-back in it, as a busy worker sends
        held = enqueue(db, q, pool="held", run_at=T0 - seconds(90))
        [running] = claim(db, q, T0, pool="held")
        rows = [r for r in db.execute(q.job_run_finish_and_claim, {
            **NO_CLAIM, "now": T0, "pool": "default", "limit": 10, "worker_id": "w1",
            "lease_s": 30.0, "ids": [held["id"]], "fences": [running["fence"]],
            "statuses": ["completed"], "outputs": [None], "errors": [None], "run_ats": [None],
            "refunds": [0], **no_waits(1)}).fetchall() if r["claimed"]]
    assert [r["id"] for r in rows] == urgent + normal


def test_job_run_claim_leases_the_run_and_draws_a_new_fence(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [claimed] = claim(db, q, T0, worker_id="w-a", lease_s=30)
    assert claimed["id"] == run["id"]
    assert claimed["attempts"] == 1
    assert claimed["fence"] not in (0, run["fence"])
    row = get(db, q, run["id"])
    assert row["status"] == "running"
    assert row["leased_by"] == "w-a"
    assert row["claimed_at"] == T0
    assert row["started_at"] == T0
    assert row["lease_expires_at"] == T0 + seconds(30)
    # Back to pending (a retry), claimed again: the fence moves on, started_at stays.
    finish(db, q, T0, [(run["id"], claimed["fence"], "pending")], run_at=T0)
    [again] = claim(db, q, T0 + seconds(5), worker_id="w-b")
    assert again["attempts"] == 2
    assert again["fence"] not in (0, claimed["fence"])
    assert get(db, q, run["id"])["started_at"] == T0


def test_job_run_claim_respects_the_limit(db: Conn, q: Queries) -> None:
    for _ in range(5):
        enqueue(db, q, run_at=T0)
    assert len(claim(db, q, T0, limit=3)) == 3
    assert len(claim(db, q, T0, limit=3)) == 2


def test_job_run_claim_skips_rows_locked_by_a_concurrent_claim(db: Conn, db2: Conn,
                                                               q: Queries) -> None:
    for _ in range(3):
        enqueue(db, q, run_at=T0)
    with db.transaction():
        first = claim(db, q, T0, limit=2)
        # db's transaction is still open and holds its rows: db2 must skip them, not wait.
        second = claim(db2, q, T0, limit=2)
    assert len(first) == 2
    assert len(second) == 1
    assert {r["id"] for r in first}.isdisjoint({r["id"] for r in second})


def test_concurrent_claims_never_return_the_same_run(dsn: str, db: Conn, q: Queries) -> None:
    prepared = [prepare(EnqueueRequest(job_type="t.a", input={"i": i})) for i in range(300)]
    with db.transaction():
        for p in prepared:
            insert_one(db, q, p)
    claimed: list[list[Any]] = [[] for _ in range(4)]
    barrier = threading.Barrier(4)

    def worker(slot: int) -> None:
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            barrier.wait()
            while rows := claim(conn, q, T0 + timedelta(days=1), limit=7,
                                worker_id=f"w{slot}"):
                claimed[slot].extend(r["id"] for r in rows)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    every = [run_id for ids in claimed for run_id in ids]
    assert len(every) == 300
    assert len(set(every)) == 300
    assert count(db, "status = 'running' AND attempts = 1 AND fence <> 0") == 300


def test_job_run_claim_commits_asynchronously_and_a_write_back_synchronously(
        db: Conn, q: Queries) -> None:
    # set_config(..., true) lasts until the transaction ends: read it before it does.
    for _ in range(2):
        enqueue(db, q, run_at=T0)
    with db.transaction():
        [c] = claim(db, q, T0, limit=1)
        assert _commit_mode(db) == "off"
    with db.transaction():
        rows = db.execute(q.job_run_finish_and_claim, {
            "now": T0, "ids": [c["id"]], "fences": [c["fence"]], "statuses": ["completed"],
            "outputs": [None], "errors": [None], "run_ats": [None], "refunds": [0],
            **no_waits(1), "pool": "default", "limit": 1, "worker_id": "w1",
            "lease_s": 30.0}).fetchall()
        assert _commit_mode(db) == "on"
    assert sorted((r["claimed"], r["status"]) for r in rows) == [
        (False, "completed"), (True, "running")]


def _commit_mode(db: Conn) -> str:
    row = db.execute("SHOW synchronous_commit").fetchone()
    assert row is not None
    return str(row["synchronous_commit"])


CLAIMING = ("job_run_claim", "job_run_claim_keyed_then_plain", "job_run_finish_and_claim")


def test_the_three_claiming_statements_share_one_plain_claim(db: Conn, q: Queries) -> None:
    from notifyq._db.queries import fragments, named_queries

    bodies = named_queries()["job_run"]
    shared = fragments()["job_run_claim_plain"]
    assert "FOR UPDATE SKIP LOCKED" in shared
    assert "_new_fence()" in shared
    for name in CLAIMING:
        assert "{job_run_claim_plain}" in bodies[name], name
        assert "picked AS (" not in bodies[name], name  # written once, in the fragment
        assert "claim_limit AS (" in bodies[name], name
    assert "_claim_keyed" not in bodies["job_run_claim"]
    assert "unnest" not in bodies["job_run_claim"]
    # And the same columns come back, named and typed alike (the completer reads all three).
    described = []
    for name in CLAIMING:
        cur = db.execute(getattr(q, name), {
            **NO_CLAIM, "now": T0, "pool": "default", "limit": 0, "ids": [], "fences": [],
            "statuses": [], "outputs": [], "errors": [], "run_ats": [], "refunds": [],
            **no_waits(0)})
        assert cur.description is not None
        described.append([(d.name, d.type_code) for d in cur.description])
    assert described[0] == described[1] == described[2]


@pytest.mark.parametrize("name", [*CLAIMING, "job_run_heartbeat_many", "job_step_record",
                                  "job_signal_consume", "job_run_spawn_child",
                                  "job_run_finish_one", "job_run_heartbeat_one",
                                  "job_run_leased_many"])
@pytest.mark.parametrize("backlog", [0, 50, 20_000])
def test_the_hot_plans_never_read_job_run_whole_at_any_size(
        db: Conn, q: Queries, name: str, backlog: int) -> None:
    """A generic plan is made with the statistics of the moment and kept as the table grows
    or shrinks; the completer's session keeps one per statement (worker_session_generic_plans)
    and a pooled connection's "auto" may settle on one. Each way of reaching the rows once went
    wrong at one table size and was kept at another: a hash join over a sequential scan of
    job_run on an analyzed backlog (100,000 pending runs drained at 306 runs/s instead of
    3,251); a sequential scan planned on an empty table (wake-up p99 under 2,000 runs/s 0.5-0.9
    s); a merge or hash join reading the whole primary key, planned on a small table (p99
    0.2-2.2 s); a walk of every running run through job_run_running_idx (27 ms a write-back
    with 2,000 runs running). So no plan here walks the running runs, and every read of job_run
    in the completer's statements has an index condition (the claim's by pool, the others by
    id). The fenced writes on pooled connections are held to that on a large table only: on a
    table of a page or two their generic plan is a sequential scan (see db/README.md)."""
    if backlog:
        db.execute("INSERT INTO notifyq.job_run (id, job_type, input) "
                   "SELECT gen_random_uuid(), 't.a', '{}' FROM generate_series(1, %s)",
                   (backlog,))
        db.execute("ANALYZE notifyq.job_run")
    completers = name in CLAIMING
    plan = generic_plan(db, getattr(q, name),
                        session=q.worker_session_generic_plans if completers else None)
    reads = table_reads(plan, "job_run")
    assert reads, plan
    for read, details in reads:
        assert "job_run_running_idx" not in read, plan
        if completers or backlog >= 20_000:
            assert any(d.startswith("Index Cond:") for d in details), (
                f"{read} has no index condition:\n{plan}")


@pytest.mark.parametrize("name", CLAIMING)
def test_the_completers_plans_never_compile_with_jit_whatever_their_cost(
        db: Conn, q: Queries, name: str) -> None:
    """A generic plan's estimated cost grows with the backlog analyzed when it was made: on
    201,000 pending runs the claim's came to 173,717, above jit_above_cost (100,000), and JIT
    compiled 46 functions at every execution of the kept plan: 172 ms a claim of one run,
    0.3 ms without JIT (2026-12-07, bench/RESULTS.md). Here every plan counts as costly enough
    (jit_above_cost 0), and the completer's session still plans none with JIT."""
    db.execute("SET jit_above_cost = 0")
    plan = generic_plan(db, getattr(q, name), session=q.worker_session_generic_plans)
    assert "JIT:" not in plan, plan


# -- finish ---------------------------------------------------------------------------------------

def test_job_run_finish_many_writes_each_outcome_in_one_statement(db: Conn, q: Queries) -> None:
    runs = [enqueue(db, q, run_at=T0) for _ in range(3)]
    claims = {r["id"]: r["fence"] for r in claim(db, q, T0)}
    a, b, c = (r["id"] for r in runs)
    rows = db.execute(q.job_run_finish_and_claim, {**NO_CLAIM,
        "now": T0 + seconds(1), "ids": [a, b, c], "fences": [claims[a], claims[b], claims[c]],
        "statuses": ["completed", "failed", "pending"],
        "outputs": ['{"ok": true}', None, None],
        "errors": [None, '{"message": "x"}', '{"message": "y"}'],
        "run_ats": [None, None, T0 + seconds(60)], "refunds": [0, 0, 1],
        **no_waits(3)}).fetchall()
    assert {r["id"]: r["status"] for r in rows} == {a: "completed", b: "failed", c: "pending"}
    done, dead, later = get(db, q, a), get(db, q, b), get(db, q, c)
    assert done["output"] == {"ok": True}
    assert done["finished_at"] == T0 + seconds(1)
    assert done["leased_by"] is None
    assert done["lease_expires_at"] is None
    assert dead["error"] == {"message": "x"}
    assert dead["finished_at"] == T0 + seconds(1)
    assert later["run_at"] == T0 + seconds(60)
    assert later["finished_at"] is None
    assert later["attempts"] == 0  # refunded


def test_job_run_finish_many_with_a_stale_fence_matches_no_row(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [first] = claim(db, q, T0, lease_s=1)
    db.execute(q.job_run_reap_expired, {"now": T0 + seconds(2), "limit": 10})
    [second] = claim(db, q, T0 + seconds(2), worker_id="w2")
    assert second["fence"] != first["fence"]
    stale = finish(db, q, T0 + seconds(3), [(run["id"], first["fence"], "completed")],
                   output='{"by": "w1"}')
    assert stale == []
    fresh = finish(db, q, T0 + seconds(3), [(run["id"], second["fence"], "completed")],
                   output='{"by": "w2"}')
    assert [r["id"] for r in fresh] == [run["id"]]
    assert get(db, q, run["id"])["output"] == {"by": "w2"}
    # A second write with the right fence finds the run no longer running.
    assert finish(db, q, T0 + seconds(4), [(run["id"], second["fence"], "failed")]) == []
    assert count(db, "status = 'completed'") == 1


def test_job_run_finish_many_cancels_instead_of_going_back_to_pending_after_a_cancel_request(
        db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [c] = claim(db, q, T0)
    db.execute(q.job_run_cancel, {"tenant_ids": None, "id": run["id"], "now": T0})
    rows = finish(db, q, T0 + seconds(1), [(run["id"], c["fence"], "pending")], run_at=T0,
                  refund=1)
    assert [r["status"] for r in rows] == ["canceled"]
    row = get(db, q, run["id"])
    assert (row["status"], row["finished_at"], row["attempts"]) == (
        "canceled", T0 + seconds(1), 0)
    assert claim(db, q, T0 + seconds(2)) == []


def test_job_run_finish_many_completes_a_run_that_finished_despite_a_cancel_request(
        db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [c] = claim(db, q, T0)
    db.execute(q.job_run_cancel, {"tenant_ids": None, "id": run["id"], "now": T0})
    rows = finish(db, q, T0, [(run["id"], c["fence"], "completed")], output="1")
    assert [r["status"] for r in rows] == ["completed"]


# -- another transaction holds a run's row locked (issue 31, item 1) ------------------------------

def _lock_rows(conn: Conn, *run_ids: Any) -> None:
    """An application's lock on runs (``SELECT ... FOR UPDATE`` in its open transaction)."""
    conn.execute("SELECT count(*) FROM (SELECT FROM notifyq.job_run WHERE id = ANY(%s) "
                 "FOR UPDATE) AS locked", (list(run_ids),))


def _waits_for_the_lock(conn: Conn, statement: str, params: dict[str, Any]) -> None:
    """``statement`` waits for a row lock: under a lock timeout it fails instead of returning."""
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '100ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            conn.execute(statement, params)


def test_job_run_finish_and_claim_skips_a_locked_run_and_writes_back_the_rest(
        db: Conn, db2: Conn, q: Queries) -> None:
    a, b = enqueue(db, q, run_at=T0), enqueue(db, q, run_at=T0)
    enqueue(db, q, run_at=T0)
    fences = {r["id"]: r["fence"] for r in claim(db, q, T0, limit=2)}
    with db2.transaction():
        _lock_rows(db2, a["id"])
        rows = db.execute(q.job_run_finish_and_claim, {
            **NO_CLAIM, "now": T0, "limit": 1, "worker_id": "w1", "lease_s": 30.0,
            "ids": [a["id"], b["id"]], "fences": [fences[a["id"]], fences[b["id"]]],
            "statuses": ["completed"] * 2, "outputs": [None] * 2, "errors": [None] * 2,
            "run_ats": [None] * 2, "refunds": [0] * 2, **no_waits(2)}).fetchall()
    # b written and the third run claimed, at once; a left as it was, not waited for.
    assert [(r["claimed"], r["id"]) for r in rows if not r["claimed"]] == [(False, b["id"])]
    assert len([r for r in rows if r["claimed"]]) == 1
    assert get(db, q, a["id"])["status"] == "running"
    # Still held under its fence: told apart from a run taken over, and written alone.
    held = db.execute(q.job_run_leased_many, {
        "ids": [a["id"], b["id"]], "fences": [fences[a["id"]], fences[b["id"]]]}).fetchall()
    assert held == [{"id": a["id"]}]
    alone = db.execute(q.job_run_finish_one, {
        "now": T0, "ids": [a["id"]], "fences": [fences[a["id"]]], "statuses": ["completed"],
        "outputs": ['{"alone": true}'], "errors": [None], "run_ats": [None], "refunds": [0],
        **no_waits(1)}).fetchall()
    assert alone == [{"id": a["id"], "pool": "default", "status": "completed"}]
    assert get(db, q, a["id"])["output"] == {"alone": True}


def test_job_run_finish_one_waits_for_the_lock_and_stays_fenced(
        db: Conn, db2: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [c] = claim(db, q, T0)
    params = {"now": T0, "ids": [run["id"]], "fences": [c["fence"]], "statuses": ["completed"],
              "outputs": [None], "errors": [None], "run_ats": [None], "refunds": [0],
              **no_waits(1)}
    with db2.transaction():
        _lock_rows(db2, run["id"])
        _waits_for_the_lock(db, q.job_run_finish_one, params)
    stale = {**params, "fences": [c["fence"] + 1]}
    assert db.execute(q.job_run_finish_one, stale).fetchall() == []
    assert [r["status"] for r in db.execute(q.job_run_finish_one, params)] == ["completed"]


def test_job_run_leased_many_tells_a_run_still_held_from_one_taken_over(
        db: Conn, q: Queries) -> None:
    kept, taken = enqueue(db, q, run_at=T0), enqueue(db, q, run_at=T0)
    fences = {r["id"]: r["fence"] for r in claim(db, q, T0, lease_s=1)}
    db.execute(q.job_run_heartbeat_many, {"now": T0 + seconds(1), "lease_s": 10,
                                          "ids": [kept["id"]], "fences": [fences[kept["id"]]]})
    db.execute(q.job_run_reap_expired, {"now": T0 + seconds(2), "limit": 10})
    rows = db.execute(q.job_run_leased_many, {
        "ids": [kept["id"], taken["id"]],
        "fences": [fences[kept["id"]], fences[taken["id"]]]}).fetchall()
    assert rows == [{"id": kept["id"]}]


def test_job_run_heartbeat_many_skips_a_locked_run_and_heartbeat_one_waits_for_it(
        db: Conn, db2: Conn, q: Queries) -> None:
    a, b = enqueue(db, q, run_at=T0), enqueue(db, q, run_at=T0)
    fences = {r["id"]: r["fence"] for r in claim(db, q, T0, lease_s=10)}
    with db2.transaction():
        _lock_rows(db2, a["id"])
        rows = db.execute(q.job_run_heartbeat_many, {
            "now": T0 + seconds(5), "lease_s": 10, "ids": [a["id"], b["id"]],
            "fences": [fences[a["id"]], fences[b["id"]]]}).fetchall()
        assert rows == [{"id": b["id"], "cancel_requested": False}]
        one = {"now": T0 + seconds(5), "lease_s": 10, "id": a["id"], "fence": fences[a["id"]]}
        _waits_for_the_lock(db, q.job_run_heartbeat_one, one)
    assert get(db, q, b["id"])["lease_expires_at"] == T0 + seconds(15)
    assert get(db, q, a["id"])["lease_expires_at"] == T0 + seconds(10)
    assert db.execute(q.job_run_heartbeat_one, one).fetchall() == [
        {"id": a["id"], "cancel_requested": False}]
    assert get(db, q, a["id"])["lease_expires_at"] == T0 + seconds(15)
    stale = {**one, "fence": fences[a["id"]] + 1}
    assert db.execute(q.job_run_heartbeat_one, stale).fetchall() == []


# -- heartbeat ------------------------------------------------------------------------------------

def test_job_run_heartbeat_many_extends_only_leases_held_with_the_fence(db: Conn,
                                                                        q: Queries) -> None:
    a, b = enqueue(db, q, run_at=T0), enqueue(db, q, run_at=T0)
    fences = {r["id"]: r["fence"] for r in claim(db, q, T0, lease_s=10)}
    rows = db.execute(q.job_run_heartbeat_many, {
        "now": T0 + seconds(5), "lease_s": 10, "ids": [a["id"], b["id"]],
        "fences": [fences[a["id"]], fences[b["id"]] + 7]}).fetchall()
    assert rows == [{"id": a["id"], "cancel_requested": False}]
    assert get(db, q, a["id"])["lease_expires_at"] == T0 + seconds(15)
    assert get(db, q, b["id"])["lease_expires_at"] == T0 + seconds(10)


def test_job_run_heartbeat_many_reports_cancel_requests(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [c] = claim(db, q, T0)
    db.execute(q.job_run_cancel, {"tenant_ids": None, "id": run["id"], "now": T0})
    rows = db.execute(q.job_run_heartbeat_many, {
        "now": T0, "lease_s": 10, "ids": [run["id"]], "fences": [c["fence"]]}).fetchall()
    assert rows == [{"id": run["id"], "cancel_requested": True}]


# -- reaper ---------------------------------------------------------------------------------------

def test_job_run_reap_expired_puts_expired_runs_back_to_pending(db: Conn, q: Queries) -> None:
    expired, alive = enqueue(db, q, run_at=T0), enqueue(db, q, run_at=T0)
    claim(db, q, T0, limit=1, lease_s=5, worker_id="dead-worker")
    claim(db, q, T0, limit=1, lease_s=60)
    rows = db.execute(q.job_run_reap_expired, {"now": T0 + seconds(6), "limit": 10}).fetchall()
    assert rows == [{"id": expired["id"], "pool": "default", "status": "pending"}]
    row = get(db, q, expired["id"])
    assert row["run_at"] == T0 + seconds(6)
    assert row["attempts"] == 1
    assert row["error"]["type"] == "LeaseExpired"
    assert "dead-worker" in row["error"]["message"]
    assert row["error"]["retryable"] is True
    assert row["finished_at"] is None
    assert get(db, q, alive["id"])["status"] == "running"


def test_job_run_reap_expired_rechecks_expiry_against_a_fresh_heartbeat(db: Conn,
                                                                         q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [c] = claim(db, q, T0, lease_s=5)
    db.execute(q.job_run_heartbeat_many, {"now": T0 + seconds(4), "lease_s": 5,
                                          "ids": [run["id"]], "fences": [c["fence"]]})
    assert db.execute(q.job_run_reap_expired, {"now": T0 + seconds(6), "limit": 10}
                      ).fetchall() == []
    assert get(db, q, run["id"])["status"] == "running"


def test_job_run_reap_expired_fails_runs_out_of_attempts(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0, max_attempts=1)
    claim(db, q, T0, lease_s=1)
    rows = db.execute(q.job_run_reap_expired, {"now": T0 + seconds(2), "limit": 10}).fetchall()
    assert [r["status"] for r in rows] == ["failed"]
    row = get(db, q, run["id"])
    assert row["error"]["retryable"] is False
    assert row["finished_at"] == T0 + seconds(2)


def test_job_run_reap_expired_cancels_runs_with_a_cancel_request(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    claim(db, q, T0, lease_s=1)
    db.execute(q.job_run_cancel, {"tenant_ids": None, "id": run["id"], "now": T0})
    rows = db.execute(q.job_run_reap_expired, {"now": T0 + seconds(2), "limit": 10}).fetchall()
    assert [r["status"] for r in rows] == ["canceled"]
    assert get(db, q, run["id"])["finished_at"] == T0 + seconds(2)


def test_job_run_reap_expired_stops_at_the_batch_limit(db: Conn, q: Queries) -> None:
    for _ in range(5):
        enqueue(db, q, run_at=T0)
    claim(db, q, T0, lease_s=1)
    later = T0 + seconds(2)
    assert len(db.execute(q.job_run_reap_expired, {"now": later, "limit": 3}).fetchall()) == 3
    assert len(db.execute(q.job_run_reap_expired, {"now": later, "limit": 3}).fetchall()) == 2
    assert count(db, "status = 'pending'") == 5


# -- purge ----------------------------------------------------------------------------------------

def _finished(db: Conn, q: Queries, status: str, age: timedelta) -> None:
    run = enqueue(db, q)
    db.execute("UPDATE notifyq.job_run SET status = %s, finished_at = %s WHERE id = %s",
               (status, T0 - age, run["id"]))


def _purge(db: Conn, q: Queries, limit: int = 100) -> int:
    cur = db.execute(q.job_run_purge_finished, {
        "now": T0, "limit": limit, "completed_retention_s": 86_400.0,
        "failed_retention_s": 7 * 86_400.0, "canceled_retention_s": 3_600.0})
    return cur.rowcount


def test_job_run_purge_finished_honours_each_status_retention(db: Conn, q: Queries) -> None:
    _finished(db, q, "completed", timedelta(days=2))    # past 1 day: deleted
    _finished(db, q, "completed", timedelta(hours=2))   # kept
    _finished(db, q, "failed", timedelta(days=2))       # dead-letter kept 7 days
    _finished(db, q, "failed", timedelta(days=8))       # deleted
    _finished(db, q, "timed_out", timedelta(days=8))    # deleted, failed retention
    _finished(db, q, "canceled", timedelta(hours=2))    # past 1 hour: deleted
    _finished(db, q, "canceled", timedelta(minutes=2))  # kept
    enqueue(db, q)                                      # pending: never purged
    assert _purge(db, q) == 4
    remaining = db.execute("SELECT status, count(*) AS n FROM notifyq.job_run GROUP BY status "
                           "ORDER BY status").fetchall()
    assert {r["status"]: r["n"] for r in remaining} == {
        "canceled": 1, "completed": 1, "failed": 1, "pending": 1}


def test_job_run_purge_finished_deletes_at_most_the_batch_limit_oldest_first(
        db: Conn, q: Queries) -> None:
    for days in (2, 3, 4, 5, 6):
        _finished(db, q, "completed", timedelta(days=days))
    assert _purge(db, q, limit=2) == 2
    ages = db.execute("SELECT %s - finished_at AS age FROM notifyq.job_run ORDER BY age",
                      (T0,)).fetchall()
    assert [r["age"] for r in ages] == [timedelta(days=2), timedelta(days=3), timedelta(days=4)]
    assert _purge(db, q, limit=2) == 2
    assert _purge(db, q, limit=2) == 1


# -- get / list / control -------------------------------------------------------------------------

def test_job_run_get_returns_nothing_for_an_unknown_id(db: Conn, q: Queries) -> None:
    assert db.execute(q.job_run_get, {"id": uuid4()}).fetchone() is None


def _list(db: Conn, q: Queries, **filters: Any) -> list[dict[str, Any]]:
    params = {**LIST_FILTERS, "limit": 50, **filters}
    return db.execute(q.job_run_list, params).fetchall()


def test_job_run_list_pages_newest_first_by_keyset(db: Conn, q: Queries) -> None:
    # One transaction: every run has the same created_at; the time-ordered id alone pages.
    with db.transaction():
        ids = {enqueue(db, q, input={"i": i})["id"] for i in range(7)}
    seen: list[Any] = []
    before = None
    while True:
        page = _list(db, q, limit=3, before_id=before)
        if not page:
            break
        seen.extend(r["id"] for r in page)
        before = page[-1]["id"]
    assert len(seen) == 7
    assert set(seen) == ids
    assert seen == sorted(seen, reverse=True)


def test_job_run_list_filters_by_status_type_pool_and_tag(db: Conn, q: Queries) -> None:
    a = enqueue(db, q, "t.a", pool="p1", tags=["red", "big"])
    b = enqueue(db, q, "t.b", pool="p1", tags=["blue"])
    c = enqueue(db, q, "t.a", pool="p2")
    db.execute(q.job_run_cancel, {"tenant_ids": None, "id": c["id"], "now": T0})
    assert {r["id"] for r in _list(db, q, job_type="t.a")} == {a["id"], c["id"]}
    assert {r["id"] for r in _list(db, q, pool="p1")} == {a["id"], b["id"]}
    assert {r["id"] for r in _list(db, q, tag="red")} == {a["id"]}
    assert {r["id"] for r in _list(db, q, status="canceled")} == {c["id"]}
    assert _list(db, q, status="pending", pool="p2") == []


def test_job_run_list_filters_by_statuses_due_time_and_finish_time(db: Conn,
                                                                   q: Queries) -> None:
    due = enqueue(db, q, run_at=T0 - seconds(1))
    later = enqueue(db, q, run_at=T0 + seconds(60))
    recent, old = enqueue(db, q, run_at=T0), enqueue(db, q, run_at=T0)
    db.execute("UPDATE notifyq.job_run SET status = 'failed', finished_at = %s WHERE id = %s",
               (T0 - seconds(3599), recent["id"]))
    db.execute("UPDATE notifyq.job_run SET status = 'timed_out', finished_at = %s "
               "WHERE id = %s", (T0 - seconds(3601), old["id"]))
    at = {"now": T0}
    assert {r["id"] for r in _list(db, q, status="pending", due="now", **at)} == {due["id"]}
    assert {r["id"] for r in _list(db, q, status="pending", due="later", **at)} == {later["id"]}
    failed = _list(db, q, status_in=["failed", "timed_out"], **at)
    assert {r["id"] for r in failed} == {recent["id"], old["id"]}
    assert {r["id"] for r in _list(db, q, status_in=["failed", "timed_out"],
                                   finished_within_s=3600, **at)} == {recent["id"]}


def test_job_run_list_finds_a_run_by_how_its_id_ends(db: Conn, q: Queries) -> None:
    with db.transaction():  # one millisecond: the ids share their start
        ids = [enqueue(db, q, input={"i": i})["id"] for i in range(5)]
    ending = str(ids[2])[-8:]
    assert [r["id"] for r in _list(db, q, id_suffix=ending)] == [ids[2]]
    assert [r["id"] for r in _list(db, q, id_suffix=ending, min_id=ids[3])] == []
    params = {**LIST_FILTERS, "id_suffix": ending, "statuses": ["pending"]}
    assert db.execute(q.job_run_count, {**params, "cap": 10}).fetchone() == {"n": 1}
    assert [r["id"] for r in db.execute(q.job_run_list_ids, {**params, "limit": 10})] == [ids[2]]
    for digits in (1, 2, 7, 12):  # whole bytes compared as bytes, an odd digit as text
        ending = str(ids[2])[-digits:]
        expected = sorted((i for i in ids if str(i).endswith(ending)), reverse=True)
        assert [r["id"] for r in _list(db, q, id_suffix=ending)] == expected, ending
    assert [r["id"] for r in _list(db, q, ids=[ids[0], ids[3]])] == [ids[3], ids[0]]
    assert _list(db, q, ids=[]) == []


def test_job_run_cancel_cancels_pending_runs_at_once(db: Conn, q: Queries) -> None:
    run = enqueue(db, q)
    row = db.execute(q.job_run_cancel, {"tenant_ids": None, "id": run["id"], "now": T0}).fetchone()
    assert row is not None
    assert (row["status"], row["finished_at"], row["cancel_requested_at"]) == ("canceled", T0, T0)


def test_job_run_cancel_only_requests_it_for_running_runs(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    claim(db, q, T0)
    row = db.execute(q.job_run_cancel, {"tenant_ids": None,
                                        "id": run["id"], "now": T0 + seconds(1)}).fetchone()
    assert row is not None
    assert row["status"] == "running"
    assert row["finished_at"] is None
    assert row["cancel_requested_at"] == T0 + seconds(1)
    # Asking twice keeps the first request time.
    again = db.execute(q.job_run_cancel, {"tenant_ids": None,
                                          "id": run["id"], "now": T0 + seconds(9)}).fetchone()
    assert again is not None
    assert again["cancel_requested_at"] == T0 + seconds(1)


def test_job_run_cancel_matches_nothing_for_finished_runs(db: Conn, q: Queries) -> None:
    run = enqueue(db, q, run_at=T0)
    [c] = claim(db, q, T0)
    finish(db, q, T0, [(run["id"], c["fence"], "completed")])
    assert db.execute(q.job_run_cancel, {"tenant_ids": None,
                                         "id": run["id"], "now": T0}).fetchone() is None


def test_job_run_retry_puts_a_dead_run_back_with_room_for_one_attempt(db: Conn,
                                                                      q: Queries) -> None:
    run = enqueue(db, q, run_at=T0, max_attempts=1)
    [c] = claim(db, q, T0)
    finish(db, q, T0, [(run["id"], c["fence"], "failed")], error='{"message": "x"}')
    row = db.execute(q.job_run_retry, {"tenant_ids": None,
                                       "id": run["id"], "now": T0 + seconds(5)}).fetchone()
    assert row is not None
    assert (row["status"], row["run_at"], row["finished_at"]) == (
        "pending", T0 + seconds(5), None)
    assert (row["attempts"], row["max_attempts"]) == (1, 2)
    assert len(claim(db, q, T0 + seconds(5))) == 1


@pytest.mark.parametrize("status", ["canceled", "timed_out"])
def test_job_run_retry_accepts_canceled_and_timed_out_runs(db: Conn, q: Queries,
                                                           status: str) -> None:
    run = enqueue(db, q)
    db.execute("UPDATE notifyq.job_run SET status = %s WHERE id = %s", (status, run["id"]))
    row = db.execute(q.job_run_retry, {"tenant_ids": None, "id": run["id"], "now": T0}).fetchone()
    assert row is not None
    assert row["status"] == "pending"


@pytest.mark.parametrize("status", ["pending", "running", "completed"])
def test_job_run_retry_matches_nothing_for_live_or_completed_runs(db: Conn, q: Queries,
                                                                  status: str) -> None:
    run = enqueue(db, q)
    db.execute("UPDATE notifyq.job_run SET status = %s WHERE id = %s", (status, run["id"]))
    assert db.execute(q.job_run_retry, {"tenant_ids": None,
                                        "id": run["id"], "now": T0}).fetchone() is None


# -- stats / scheduling ---------------------------------------------------------------------------

def test_job_run_count_by_status_groups_by_type_pool_and_status(db: Conn, q: Queries) -> None:
    for _ in range(3):
        enqueue(db, q, "t.a")
    enqueue(db, q, "t.a", pool="p2")
    c = enqueue(db, q, "t.b")
    db.execute(q.job_run_cancel, {"tenant_ids": None, "id": c["id"], "now": T0})
    rows = db.execute(q.job_run_count_by_status).fetchall()
    assert [(r["job_type"], r["pool"], r["status"], r["count"]) for r in rows] == [
        ("t.a", "default", "pending", 3), ("t.a", "p2", "pending", 1),
        ("t.b", "default", "canceled", 1)]


def test_job_run_oldest_runnable_reports_queue_latency_per_pool(db: Conn, q: Queries) -> None:
    enqueue(db, q, run_at=T0 - seconds(30))
    enqueue(db, q, run_at=T0 - seconds(5))
    enqueue(db, q, run_at=T0 + seconds(60))  # not runnable yet
    enqueue(db, q, pool="p2", run_at=T0 - seconds(2))
    rows = db.execute(q.job_run_oldest_runnable, {"now": T0}).fetchall()
    assert rows == [{"pool": "default", "runnable": 2, "oldest_age_s": 30.0},
                    {"pool": "p2", "runnable": 1, "oldest_age_s": 2.0}]


def test_job_run_next_run_at_gives_seconds_to_the_earliest_future_run(db: Conn,
                                                                      q: Queries) -> None:
    def delay(pool: str = "default") -> Any:
        row = db.execute(q.job_run_next_run_at, {"pool": pool, "now": T0}).fetchone()
        assert row is not None
        return row["delay_s"]

    assert delay() is None
    enqueue(db, q, run_at=T0 - seconds(10))  # runnable now: not "next"
    assert delay() is None
    enqueue(db, q, run_at=T0 + seconds(2.5))
    enqueue(db, q, run_at=T0 + seconds(40))
    enqueue(db, q, pool="p2", run_at=T0 + seconds(1))
    assert delay() == pytest.approx(2.5)
    assert delay("p2") == pytest.approx(1.0)


# -- notifier -------------------------------------------------------------------------------------

def test_notifier_listen_receives_enqueue_wakeups_and_ping_answers(dsn: str, db: Conn,
                                                                   q: Queries) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as listener:
        listener.execute(q.notifier_listen)
        assert listener.execute(q.notifier_ping).fetchone() == {"ok": 1}
        row = db.execute("SELECT notifyq.enqueue('t.a', '{}', pool => 'p9') AS id").fetchone()
        assert row is not None
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert got == ["j:p9"]


def test_error_json_from_python_round_trips_through_jsonb(db: Conn, q: Queries) -> None:
    from notifyq._run import error_json
    run = enqueue(db, q, run_at=T0)
    [c] = claim(db, q, T0)
    finish(db, q, T0, [(run["id"], c["fence"], "failed")],
           error=error_json(ValueError("bad\x00byte"), 1, False))
    assert json.dumps(get(db, q, run["id"])["error"]["message"]) == '"bad\\ufffdbyte"'


def test_job_run_insert_one_leaves_out_an_input_too_large_as_jsonb_prints_it(
        db: Conn, q: Queries) -> None:
    # Python refuses it before any statement (encode_input measures as jsonb prints); the
    # statement must leave it out on its own too, for callers that skip that check.
    value = {"n": [1e300] * 250}
    big = Prepared(EnqueueRequest(job_type="t.a", input=value), json.dumps(value), uuid4())
    small = prepare(EnqueueRequest(job_type="t.a", input={"n": 1}))
    assert insert_one(db, q, big) is None
    assert insert_one(db, q, small) is not None
    assert count(db) == 1
    size = db.execute(q.job_run_input_size, {"input": big.input_json}).fetchone()
    assert size is not None
    assert size["size"] > 65_536
