"""The public SQL entry point ``notifyq.enqueue(...)``: validation, defaults, dedupe."""

from __future__ import annotations

import psycopg
import pytest

from tests.db.helpers import Conn, count


def test_sql_enqueue_returns_the_new_run_id(db: Conn) -> None:
    row = db.execute("SELECT notifyq.enqueue('email.send', '{\"to\": \"a@b.c\"}') AS id"
                     ).fetchone()
    assert row is not None
    run = db.execute("SELECT * FROM notifyq.job_run WHERE id = %s", (row["id"],)).fetchone()
    assert run is not None
    assert (run["job_type"], run["input"], run["status"]) == (
        "email.send", {"to": "a@b.c"}, "pending")


def test_sql_enqueue_takes_named_arguments(db: Conn) -> None:
    row = db.execute(
        "SELECT notifyq.enqueue('report.build', '[]', run_at => '2031-01-01T00:00Z', "
        "priority => 5, pool => 'reports', max_attempts => 3, tags => ARRAY['n']) AS id"
    ).fetchone()
    assert row is not None
    run = db.execute("SELECT * FROM notifyq.job_run WHERE id = %s", (row["id"],)).fetchone()
    assert run is not None
    assert (run["priority"], run["pool"], run["max_attempts"], run["tags"]) == (
        5, "reports", 3, ["n"])
    assert run["run_at"].year == 2031


def test_sql_enqueue_with_a_dedupe_key_returns_the_existing_id(db: Conn) -> None:
    ids = [db.execute("SELECT notifyq.enqueue('report.build', '{}', dedupe_key => 'nightly') "
                      "AS id").fetchone() for _ in range(3)]
    assert len({r["id"] for r in ids if r}) == 1
    assert count(db) == 1


def test_sql_enqueue_dedupe_is_race_free_across_transactions(db: Conn, db2: Conn) -> None:
    with db.transaction():
        first = db.execute("SELECT notifyq.enqueue('t.a', '{}', dedupe_key => 'k') AS id"
                           ).fetchone()
        # db2 blocks on the advisory lock until db commits, then finds db's run.
        db2.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            db2.execute("SELECT notifyq.enqueue('t.a', '{}', dedupe_key => 'k')")
    second = db2.execute("SELECT notifyq.enqueue('t.a', '{}', dedupe_key => 'k') AS id"
                         ).fetchone()
    assert first == second
    assert count(db) == 1


@pytest.mark.parametrize(("call", "error", "message"), [
    ("SELECT notifyq.enqueue('t.a', jsonb_build_object('x', repeat('a', 65530)))",
     psycopg.errors.ProgramLimitExceeded, r"input is 65539 bytes; the limit is 65536 bytes"),
    ("SELECT notifyq.enqueue('t.a', '42')", psycopg.errors.InvalidParameterValue,
     "input must be a JSON object or array, got number"),
    ("SELECT notifyq.enqueue('t.a', 'null')", psycopg.errors.InvalidParameterValue,
     "input must be a JSON object or array, got null"),
    ("SELECT notifyq.enqueue('t.a', NULL)", psycopg.errors.InvalidParameterValue,
     "input must be a JSON object or array, got null"),
    ("SELECT notifyq.enqueue('Bad Type', '{}')", psycopg.errors.InvalidParameterValue,
     "invalid job type 'Bad Type'"),
    ("SELECT notifyq.enqueue(NULL, '{}')", psycopg.errors.InvalidParameterValue,
     "invalid job type NULL"),
    ("SELECT notifyq.enqueue('t.a', '{}', priority => 1001)",
     psycopg.errors.InvalidParameterValue, r"priority 1001 is out of range \[-1000, 1000\]"),
    ("SELECT notifyq.enqueue('t.a', '{}', priority => -1001)",
     psycopg.errors.InvalidParameterValue, "priority -1001 is out of range"),
    ("SELECT notifyq.enqueue('t.a', '{}', max_attempts => 0)",
     psycopg.errors.InvalidParameterValue, "max_attempts 0 is out of range"),
    ("SELECT notifyq.enqueue('t.a', '{}', run_at => '1990-01-01Z')",
     psycopg.errors.InvalidParameterValue, "run_at .* is out of range"),
    ("SELECT notifyq.enqueue('t.a', '{}', run_at => '3000-01-01Z')",
     psycopg.errors.InvalidParameterValue, "run_at .* is out of range"),
    # Checked by _enqueue since migration 0020 (the table's CHECKs on them are gone).
    ("SELECT notifyq.enqueue('t.a', '{}', pool => 'Bad Pool')",
     psycopg.errors.InvalidParameterValue, "invalid pool 'Bad Pool': it must match"),
    ("SELECT notifyq.enqueue('t.a', '{}', pool => repeat('p', 65))",
     psycopg.errors.InvalidParameterValue, "invalid pool 'p{65}'"),
    ("SELECT notifyq._enqueue('t.a', '{}', p_trigger_source => 'cron')",
     psycopg.errors.InvalidParameterValue,
     "trigger source 'cron' must be manual, schedule, event or parent"),
    ("SELECT notifyq._enqueue('t.a', '{}', p_parent_close_policy => 'orphan')",
     psycopg.errors.InvalidParameterValue,
     "parent close policy 'orphan' must be terminate, cancel or abandon"),
    ("SELECT notifyq._enqueue('t.a', '{}', p_concurrency_key => 'k', p_concurrency_limit => 0)",
     psycopg.errors.InvalidParameterValue, "concurrency limit 0 must be at least 1"),
])
def test_sql_enqueue_refuses_bad_input_and_writes_nothing(
        db: Conn, call: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match="notifyq: " + message):
        db.execute(call)
    assert count(db) == 0


def test_sql_enqueue_accepts_exactly_64_kib(db: Conn) -> None:
    # {"x": "..."} is 9 bytes around the string in jsonb's text form.
    db.execute("SELECT notifyq.enqueue('t.a', jsonb_build_object('x', repeat('a', 65527)))")
    assert count(db) == 1
    row = db.execute("SELECT octet_length(input::text) AS n FROM notifyq.job_run").fetchone()
    assert row == {"n": 65_536}


def test_python_and_sql_agree_on_the_size_of_an_input(db: Conn) -> None:
    from notifyq._enqueue.validate import encode_input

    value = {"b": [0] * 100, "a": {"nested": "é", "list": [1.5, "x"]}}
    row = db.execute("SELECT octet_length(%s::jsonb::text) AS n", (encode_input(value),)
                     ).fetchone()
    assert row == {"n": len(encode_input(value).encode())}


def test_sql_enqueue_inside_a_rolled_back_transaction_leaves_nothing(db: Conn) -> None:
    with db.transaction():
        db.execute("SELECT notifyq.enqueue('t.a', '{}')")
        assert count(db) == 1
        raise psycopg.Rollback  # leaves the block quietly, rolled back
    assert count(db) == 0
