"""Migration 0007's semantics, run directly against PostgreSQL: unknown job types refused on every
enqueue path, late definitions applied to runs that took the table defaults, dedupe states, and
FIFO claims at equal priority and run_at."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from notifyq._db.queries import Queries
from notifyq._enqueue.ids import new_run_ids
from notifyq._enqueue.request import EnqueueRequest, prepare
from tests.db.conftest import T0
from tests.db.helpers import DEFINITION, Conn, claim, enqueue, finish, get, insert_one

UNKNOWN = "NQ422"


def register(db: Conn, q: Queries, job_type: str, **definition: Any) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": job_type, **definition})


def insert_ones(db: Conn, q: Queries, *types: str,
                accept: list[str] | None = None) -> list[dict[str, Any]]:
    """App.enqueue's INSERT, one per type, in one transaction."""
    with db.transaction():
        rows = [insert_one(db, q, EnqueueRequest(job_type=t), accept=t in (accept or ()))
                for t in types]
    return [r for r in rows if r is not None]


def insert_bulk(db: Conn, q: Queries, *types: str,
                accept: list[str] | None = None) -> list[dict[str, Any]]:
    records = [{"id": str(i), "job_type": t, "input": {}}
               for i, t in zip(new_run_ids(len(types)), types, strict=True)]
    return db.execute(q.job_run_insert_bulk, {"notify": False, "channel": "notifyq",
        "rows": json.dumps(records), "types": list(dict.fromkeys(types)),
        "accept_types": accept}).fetchall()


def copy_defaults(db: Conn, q: Queries, *types: str,
                  accept: list[str] | None = None) -> list[dict[str, Any]]:
    """App.enqueue_many's first statement for a batch it copies (the refusal is there)."""
    return db.execute(q.job_run_copy_defaults, {"types": list(dict.fromkeys(types)),
                                                "accept_types": accept}).fetchall()


def refused(db: Conn, fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(psycopg.Error) as caught:
        fn(db, *args, **kwargs)
    assert caught.value.sqlstate == UNKNOWN, caught.value
    return str(caught.value.diag.message_primary)


# -- unknown job types ---------------------------------------------------------------------------


def test_every_enqueue_path_accepts_any_type_while_no_worker_has_registered_one(
        db: Conn, q: Queries) -> None:
    enqueue(db, q, "never.registered")
    insert_ones(db, q, "never.registered")
    insert_bulk(db, q, "never.registered")
    assert [r["known"] for r in copy_defaults(db, q, "never.registered")] == [False]
    db.execute("SELECT notifyq.enqueue('never.registered', '{}')")
    assert db.execute("SELECT count(*) AS n FROM notifyq.job_run").fetchone() == {"n": 4}


def test_every_enqueue_path_refuses_a_type_no_worker_registered_once_one_has(
        db: Conn, q: Queries) -> None:
    register(db, q, "mail.send")
    message = refused(db, enqueue, q, "mail.sned")
    assert message == ("notifyq: unknown job type 'mail.sned': no worker has registered a "
                       "handler for it (registered: mail.send); check the job type, or enqueue "
                       "with allow_unknown_type to accept it before its worker starts")
    refused(db, insert_ones, q, "mail.send", "mail.sned")
    refused(db, insert_bulk, q, "mail.send", "mail.sned")
    refused(db, copy_defaults, q, "mail.send", "mail.sned")
    with pytest.raises(psycopg.Error) as sql_error:
        db.execute("SELECT notifyq.enqueue('mail.sned', '{}')")
    assert sql_error.value.sqlstate == UNKNOWN
    assert db.execute("SELECT count(*) AS n FROM notifyq.job_run").fetchone() == {"n": 0}
    # A registered type goes through every path.
    enqueue(db, q, "mail.send")
    insert_ones(db, q, "mail.send")
    insert_bulk(db, q, "mail.send")
    db.execute("SELECT notifyq.enqueue('mail.send', '{}')")
    assert db.execute("SELECT count(*) AS n FROM notifyq.job_run").fetchone() == {"n": 4}


def test_the_opt_out_accepts_an_unknown_type_on_every_path(db: Conn, q: Queries) -> None:
    register(db, q, "mail.send")
    enqueue(db, q, "later.type", allow_unknown_type=True)
    insert_ones(db, q, "mail.send", "later.type", accept=["later.type"])
    insert_bulk(db, q, "later.type", "mail.send", accept=["later.type"])
    assert len(copy_defaults(db, q, "later.type", "mail.send", accept=["later.type"])) == 2
    db.execute("SELECT notifyq.enqueue('later.type', '{}', allow_unknown_type => true)")
    counts = db.execute("SELECT job_type, count(*) AS n FROM notifyq.job_run GROUP BY job_type "
                        "ORDER BY job_type").fetchall()
    assert counts == [{"job_type": "later.type", "n": 4}, {"job_type": "mail.send", "n": 2}]
    # Accepting one type lets only that one through.
    refused(db, insert_ones, q, "later.type", "other.type", accept=["later.type"])
    refused(db, copy_defaults, q, "later.type", "other.type", accept=["later.type"])


def test_the_built_in_webhook_paths_enqueue_before_webhook_deliver_is_registered(
        db: Conn, q: Queries) -> None:
    register(db, q, "mail.send")
    endpoint = db.execute("INSERT INTO notifyq.webhook_endpoint (url) VALUES ('https://e.x') "
                          "RETURNING id").fetchone()
    assert endpoint is not None
    message = db.execute("SELECT notifyq.send_webhook('invoice.paid', '{}') AS id").fetchone()
    assert message is not None
    rows = db.execute(q.webhook_delivery_resend, {"message_id": message["id"],
                                                  "endpoint_id": None}).fetchall()
    assert len(rows) == 1


# -- definitions that arrive after the runs --------------------------------------------------------


def test_runs_enqueued_before_their_definition_take_its_defaults_when_it_appears(
        db: Conn, q: Queries) -> None:
    plain = enqueue(db, q, "late.type")
    explicit = enqueue(db, q, "late.type", pool="mine", priority=-5, max_attempts=2)
    (bulk,) = insert_ones(db, q, "late.type")
    assert (plain["max_attempts"], plain["pool"], plain["timeout_s"]) == (25, "default", None)
    register(db, q, "late.type", pool="slow", priority=3, max_attempts=4, timeout_s=9.5,
             version=2)
    register(db, q, "other.type")
    applied = db.execute(q.job_run_apply_definitions, {"now": None,
                                                       "channel": "notifyq"}).fetchall()
    assert [(r["pool"], r["runs"]) for r in applied] == [("mine", 1), ("slow", 2)]
    for run in (plain, bulk):
        row = get(db, q, run["id"])
        assert (row["pool"], row["priority"], row["max_attempts"], row["timeout_s"],
                row["job_version"], row["defaulted"]) == ("slow", 3, 4, 9.5, 2, None)
    row = get(db, q, explicit["id"])  # what the enqueuer gave stays
    assert (row["pool"], row["priority"], row["max_attempts"], row["timeout_s"]) == (
        "mine", -5, 2, 9.5)
    # Done once: a later definition change does not touch them again.
    register(db, q, "late.type", pool="slow", max_attempts=7)
    assert db.execute(q.job_run_apply_definitions, {"now": None,
                                                    "channel": "notifyq"}).fetchall() == []
    assert get(db, q, plain["id"])["max_attempts"] == 4


def test_a_run_enqueued_with_its_definition_in_place_is_not_marked_defaulted(
        db: Conn, q: Queries) -> None:
    register(db, q, "known.type", max_attempts=3)
    run = enqueue(db, q, "known.type")
    (many,) = insert_ones(db, q, "known.type")
    assert get(db, q, run["id"])["defaulted"] is None
    assert get(db, q, many["id"])["defaulted"] is None


# -- dedupe states --------------------------------------------------------------------------------


def test_a_dedupe_key_matches_live_and_completed_runs_but_not_failed_or_canceled_ones(
        db: Conn, q: Queries) -> None:
    first = enqueue(db, q, "t.d", dedupe_key="k")
    assert enqueue(db, q, "t.d", dedupe_key="k")["id"] == first["id"]  # pending
    (claimed,) = claim(db, q, T0)
    assert enqueue(db, q, "t.d", dedupe_key="k")["id"] == first["id"]  # running
    finish(db, q, T0, [(claimed["id"], claimed["fence"], "failed")])
    second = enqueue(db, q, "t.d", dedupe_key="k")  # failed: enqueued again
    assert second["id"] != first["id"]
    db.execute(q.job_run_cancel, {"tenant_ids": None, "id": second["id"], "now": None})
    third = enqueue(db, q, "t.d", dedupe_key="k")  # canceled: again
    assert third["id"] not in (first["id"], second["id"])
    (claimed,) = claim(db, q, T0)
    finish(db, q, T0, [(claimed["id"], claimed["fence"], "completed")])
    assert enqueue(db, q, "t.d", dedupe_key="k")["id"] == third["id"]  # completed, no window


def test_a_finished_run_matches_only_within_the_window_a_live_one_whatever_its_age(
        db: Conn, q: Queries) -> None:
    done = enqueue(db, q, "t.d", dedupe_key="done", dedupe_window_s=60)
    (claimed,) = claim(db, q, T0)
    finish(db, q, T0, [(claimed["id"], claimed["fence"], "completed")])
    live = enqueue(db, q, "t.d", dedupe_key="live", dedupe_window_s=60)
    db.execute("UPDATE notifyq.job_run SET created_at = now() - interval '2 minutes'")
    assert enqueue(db, q, "t.d", dedupe_key="done", dedupe_window_s=60)["id"] != done["id"]
    assert enqueue(db, q, "t.d", dedupe_key="live", dedupe_window_s=60)["id"] == live["id"]


def test_dedupe_states_from_the_call_or_the_definition_decide_what_matches(
        db: Conn, q: Queries) -> None:
    register(db, q, "t.strict", dedupe_states=["pending", "running", "waiting", "completed",
                                               "failed"])
    first = enqueue(db, q, "t.strict", dedupe_key="k")
    (claimed,) = claim(db, q, T0)
    finish(db, q, T0, [(claimed["id"], claimed["fence"], "failed")])
    assert enqueue(db, q, "t.strict", dedupe_key="k")["id"] == first["id"]  # failed matches
    fresh = enqueue(db, q, "t.strict", dedupe_key="k", dedupe_states=["pending"])
    assert fresh["id"] != first["id"]  # the call's states win
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="dedupe states"):
        db.execute("SELECT notifyq._enqueue('t.strict', '{}', p_dedupe_key => 'k', "
                   "p_dedupe_states => ARRAY['lost'])")


# -- FIFO -----------------------------------------------------------------------------------------


def test_the_claim_takes_runs_of_equal_priority_and_run_at_in_id_order(
        db: Conn, q: Queries) -> None:
    prepared = [prepare(EnqueueRequest(job_type="t.fifo", input={"i": i})) for i in range(50)]
    with db.transaction():  # one now(): every run_at equal
        for p in prepared:
            insert_one(db, q, p)
    order = [r["id"] for r in claim(db, q, T0, limit=20)]
    order += [r["id"] for _ in range(30) for r in claim(db, q, T0, limit=1)]
    assert order == [p.id for p in prepared]


def test_sql_made_run_ids_increase_in_the_order_they_are_made(db: Conn) -> None:
    rows = db.execute("SELECT notifyq.enqueue('t.fifo', jsonb_build_object('i', i)) AS id "
                      "FROM generate_series(1, 200) AS i").fetchall()
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids)
    assert {i.version for i in ids} == {7}
