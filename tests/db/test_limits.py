"""The database states the same limits as Python (notifyq/_limits.py, and the webhook limits in
notifyq/_webhooks/endpoints.py): read from the catalog of a migrated database (CHECK
constraints, the current body of every plpgsql function) and from the named queries, so that
changing a limit on one side only fails here.

What only Python checks (SQL states nothing to compare): the number and length of tags, the
length of dedupe and concurrency keys, tenant ids, scope types and ids and step ids, the
concurrency limit's upper bound, and the upper bound of a job definition's max_attempts (its
runs take at most the run limit: job_run_apply_definitions clamps it).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from notifyq._db.queries import Queries
from notifyq._limits import (
    CONCURRENCY_LIMIT_RANGE,
    JOB_TYPE,
    MAX_ATTEMPTS_RANGE,
    MAX_INPUT_BYTES,
    MAX_JOB_TYPE_LEN,
    MAX_POOL_LEN,
    MAX_SIGNAL_TOKEN_LEN,
    POOL,
    PRIORITY_RANGE,
    RUN_AT_RANGE,
)
from notifyq._run import RUN_STATUSES
from notifyq._webhooks.endpoints import (
    EVENT_TYPE,
    MAX_EVENT_TYPE_LEN,
    MAX_IDEMPOTENCY_KEY_LEN,
    MAX_PAYLOAD_BYTES,
    MAX_URL_LENGTH,
)

Conn = psycopg.Connection[dict[str, Any]]
Bounds = tuple[int | None, int | None]


def _unbounded(pattern: re.Pattern[str]) -> str:
    """Python's ``^A B{0,N}$`` as the database writes it: ``^A B*$`` plus a length test (a
    bounded repetition costs PostgreSQL's regex engine 6-12 us a row, migration 0005)."""
    sql, count = re.subn(r"\{0,\d+\}\$$", "*$", pattern.pattern)
    assert count == 1, pattern.pattern
    return sql


def _checks(db: Conn) -> dict[str, str]:
    rows = db.execute("""
        SELECT conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint
        WHERE connamespace = 'notifyq'::regnamespace AND contype = 'c'""").fetchall()
    return {r["conname"]: r["definition"] for r in rows}


def _function(db: Conn, name: str) -> str:
    rows = db.execute("""
        SELECT pg_get_functiondef(p.oid) AS body FROM pg_proc p
        WHERE p.pronamespace = 'notifyq'::regnamespace AND p.proname = %s""",
                      (name,)).fetchall()
    assert len(rows) == 1, f"{name}: {len(rows)} functions"
    return str(rows[0]["body"])


def _bounds(definition: str, expression: str) -> Bounds:
    """The bounds a CHECK puts on ``expression`` (None where it puts none)."""
    low = high = None
    for op, value in re.findall(rf"\({re.escape(expression)} (>=|<=|>|<) '?(-?\d+)'?",
                                definition):
        number = int(value)
        if op in (">=", ">"):
            low = number + (op == ">")
        else:
            high = number - (op == "<")
    return low, high


# job_run's own input CHECKs went in migration 0020 (their rules are the enqueue function's,
# below); the job definition keeps its own.
CHECK_BOUNDS: list[tuple[str, str, Bounds]] = [
    ("job_max_attempts_check", "max_attempts", (MAX_ATTEMPTS_RANGE[0], None)),
    ("job_concurrency_limit_check", "concurrency_limit", (CONCURRENCY_LIMIT_RANGE[0], None)),
    ("job_signal_token_check", "length(token)", (1, MAX_SIGNAL_TOKEN_LEN)),
    ("webhook_endpoint_url_check", "length(url)", (1, MAX_URL_LENGTH)),
]


@pytest.mark.parametrize(("name", "expression", "expected"), CHECK_BOUNDS,
                         ids=[c[0] for c in CHECK_BOUNDS])
def test_a_check_constraint_states_the_python_limit(db: Conn, name: str, expression: str,
                                                     expected: Bounds) -> None:
    definition = _checks(db)[name]
    assert _bounds(definition, expression) == expected, definition


def test_job_run_keeps_only_the_checks_of_its_state_machine(db: Conn) -> None:
    """Input rules are checked where input enters (migration 0020): each CHECK of job_run cost
    every statement that writes it 16-62k server instructions, whatever it set."""
    assert {name for name in _checks(db) if name.startswith("job_run_")} == {
        "job_run_status_check", "job_run_attempts_check"}


def test_the_enqueue_wrapper_states_the_pool_rule(db: Conn) -> None:
    body = " ".join(_function(db, "_enqueue").split())
    assert (f"p_pool !~ '{_unbounded(POOL)}' OR length(p_pool) > {MAX_POOL_LEN}) THEN"
            in body)
    assert f"it must match {POOL.pattern}'" in body


def test_the_status_checks_name_the_run_statuses(db: Conn) -> None:
    checks = _checks(db)
    for name in ("job_run_status_check", "job_dedupe_states_check"):
        assert tuple(re.findall(r"'(\w+)'::text", checks[name])) == RUN_STATUSES, name


def test_the_enqueue_function_states_the_python_limits(db: Conn) -> None:
    body = _function(db, "_enqueue_row")  # _enqueue wraps it (migration 0015)
    (low_p, high_p), (low_a, high_a) = PRIORITY_RANGE, MAX_ATTEMPTS_RANGE
    start, end = RUN_AT_RANGE
    for stated in [
        f"p_job_type !~ '{_unbounded(JOB_TYPE)}'",
        f"OR length(p_job_type) > {MAX_JOB_TYPE_LEN} THEN",
        f"it must match {JOB_TYPE.pattern}'",
        f"IF size > {MAX_INPUT_BYTES} THEN",
        f"the limit is {MAX_INPUT_BYTES} bytes",
        f"p_priority NOT BETWEEN {low_p} AND {high_p} THEN",
        f"priority % is out of range [{low_p}, {high_p}]",
        f"p_max_attempts NOT BETWEEN {low_a} AND {high_a} THEN",
        f"max_attempts % is out of range [{low_a}, {high_a}]",
        f"p_run_at < '{start:%Y-%m-%d}+00'::timestamptz OR p_run_at >= '{end:%Y-%m-%d}+00'",
        f"run_at % is out of range [{start:%Y-%m-%d}, {end:%Y-%m-%d})",
        f"p_concurrency_limit < {CONCURRENCY_LIMIT_RANGE[0]} THEN",
        f"p_dedupe_states <@ ARRAY[{', '.join(repr(s) for s in RUN_STATUSES)}]",
    ]:
        assert stated in " ".join(body.split()), stated


def test_the_signal_function_states_the_token_limit(db: Conn) -> None:
    # signal() calls _signal (migration 0016), which checks the token.
    assert f"length(p_token) NOT BETWEEN 1 AND {MAX_SIGNAL_TOKEN_LEN} THEN" in _function(
        db, "_signal")


def test_the_send_webhook_function_states_the_webhook_limits(db: Conn) -> None:
    body = " ".join(_function(db, "_send_webhook").split())
    for stated in [
        f"p_event_type !~ '{_unbounded(EVENT_TYPE)}' OR length(p_event_type) > "
        f"{MAX_EVENT_TYPE_LEN} THEN",
        f"it must match {EVENT_TYPE.pattern}'",
        f"IF octet_length(body_) > {MAX_PAYLOAD_BYTES} THEN",
        f"length(p_idempotency_key) NOT BETWEEN 1 AND {MAX_IDEMPOTENCY_KEY_LEN} THEN",
    ]:
        assert stated in body, stated


def test_the_named_queries_state_the_python_limits(q: Queries) -> None:
    for bulk in (q.job_run_insert_one, q.job_run_insert_bulk):
        assert re.findall(r"octet_length\(r\.input::text\) <= (\d+)", bulk) == [
            str(MAX_INPUT_BYTES)]
    applied = " ".join(q.job_run_apply_definitions.split())
    assert (f"greatest({PRIORITY_RANGE[0]}, least({PRIORITY_RANGE[1]}, d.priority_default))"
            in applied)
    assert f"least({MAX_ATTEMPTS_RANGE[1]}, d.max_attempts)" in applied
