"""job_run's one trigger, ``job_run_finished`` (migration 0020), fires on ``UPDATE OF
finished_at``: a run that reaches a final status tells its parent, its children and any caller
awaiting it. That holds only if every statement that can move a run to a final status also sets
``finished_at``, so this reads every UPDATE of job_run that notifyq sends (the named queries)
or runs (every function of the migrated schema) and checks it; then it watches the trigger fire,
and not fire, on a real database."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from notifyq._db.queries import Queries
from notifyq._run import RUN_STATUSES
from tests.db.helpers import Conn

FINAL = {"completed", "failed", "timed_out", "canceled"}
_UPDATE = re.compile(r"\bUPDATE\s+(?:\"?notifyq\"?\.)?job_run\b\s*(?:AS\s+)?(\w+)?\s+SET\s",
                     re.IGNORECASE)
_END_OF_SET = re.compile(r"\b(FROM|WHERE|RETURNING)\b", re.IGNORECASE)


def _set_list(text: str, start: int) -> str:
    """The SET list that begins at ``start``: up to the first FROM, WHERE or RETURNING (or the
    closing parenthesis) outside parentheses and quotes."""
    depth, quoted, i = 0, False, start
    while i < len(text):
        char = text[i]
        if char == "'":
            quoted = not quoted
        elif not quoted:
            if char == "(":
                depth += 1
            elif char == ")":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and _END_OF_SET.match(text, i) and text[i - 1].isspace():
                break
        i += 1
    return text[start:i]


def _assignments(set_list: str) -> dict[str, str]:
    """``column = expression`` pairs of a SET list, split at commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth, quoted = 0, False
    for char in set_list:
        if char == "'":
            quoted = not quoted
        elif not quoted and char in "()":
            depth += 1 if char == "(" else -1
        if char == "," and depth == 0 and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    pairs = (part.split("=", 1) for part in parts if "=" in part)
    return {column.strip().lower(): expression.strip() for column, expression in pairs}


def _without_comments(text: str) -> str:
    """``text`` without its ``--`` comments (outside quotes): a quote in a comment would
    otherwise open a literal."""
    out, quoted, i = [], False, 0
    while i < len(text):
        if text[i] == "'":
            quoted = not quoted
        elif not quoted and text.startswith("--", i):
            i = text.find("\n", i)
            if i < 0:
                break
        out.append(text[i])
        i += 1
    return "".join(out)


def _updates(source: str, text: str) -> list[tuple[str, str | None, dict[str, str]]]:
    text = _without_comments(text)
    return [(source, m.group(1) if m.group(1) and m.group(1).upper() != "SET" else None,
             _assignments(_set_list(text, m.end())))
            for m in _UPDATE.finditer(text)]


def _can_finish(alias: str | None, expression: str) -> bool:
    """Whether a status expression may produce a final status: it names one, or takes a status
    from anywhere but the row itself (a parameter, the outcomes, another row)."""
    if FINAL & set(re.findall(r"'(\w+)'", expression)):
        return True
    own = {"status", f"{alias}.status"} if alias else {"status"}
    outside = [ref for ref in re.findall(r"[\w%().]*status\w*", expression)
               if ref.lower() not in own]
    return bool(outside)


def _every_update(db: Conn) -> list[tuple[str, str | None, dict[str, str]]]:
    q = Queries("notifyq")
    found = [u for name in q.names() for u in _updates(name, getattr(q, name))]
    for row in db.execute("""
            SELECT p.proname AS name, pg_get_functiondef(p.oid) AS body FROM pg_proc p
            WHERE p.pronamespace = 'notifyq'::regnamespace AND p.prokind = 'f'""").fetchall():
        found += _updates(f"function {row['name']}", row["body"])
    return found


def test_every_update_that_can_finish_a_run_sets_finished_at(db: Conn) -> None:
    updates = _every_update(db)
    setting_status = [u for u in updates if "status" in u[2]]
    assert len(setting_status) >= 15  # the scan sees the statements (claims, write-backs, ...)
    missing = [f"{source}: status = {sets['status'][:80]}"
               for source, alias, sets in setting_status
               if "finished_at" not in sets and _can_finish(alias, sets["status"])]
    assert missing == []


def test_the_scan_knows_a_finishing_update_from_a_claim() -> None:
    [(_, alias, sets)] = _updates("claim", "UPDATE job_run r SET status = 'running', "
                                           "attempts = r.attempts + 1 FROM n WHERE r.id = 1")
    assert (alias, _can_finish(alias, sets["status"])) == ("r", False)
    [(_, alias, sets)] = _updates("write", "UPDATE job_run r SET status = CASE WHEN x "
                                           "THEN 'canceled' ELSE v.status END FROM v")
    assert _can_finish(alias, sets["status"])
    [(_, alias, sets)] = _updates("wake", "UPDATE job_run p SET status = CASE WHEN "
                                          "p.status = 'waiting' THEN 'pending' ELSE p.status "
                                          "END, run_at = now() WHERE p.id = 1")
    assert not _can_finish(alias, sets["status"])
    assert set(RUN_STATUSES) - FINAL == {"pending", "running", "waiting"}


Listener = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def listener(dsn: str) -> Iterator[Listener]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('LISTEN "notifyq"')
        yield conn


def _notified(listener: Listener) -> list[str]:
    """What the schema's channel received (NOTIFYs are delivered at commit: these statements
    autocommit, so all are in by now)."""
    return [n.payload for n in listener.notifies(timeout=0.5, stop_after=10)]


def _running(db: Conn, **columns: object) -> str:
    sets = ", ".join(f"{name} = %({name})s" for name in columns)
    row = db.execute("""
        INSERT INTO notifyq.job_run (job_type, input, status, fence, attempts)
        VALUES ('t.a', '{}', 'running', 7, 1) RETURNING id""").fetchone()
    assert row is not None
    if columns:
        db.execute(f"UPDATE notifyq.job_run SET {sets} WHERE id = %(id)s",
                   {**columns, "id": row["id"]})
    return str(row["id"])


def test_an_awaited_run_that_finishes_sends_its_notification(db: Conn,
                                                             listener: Listener) -> None:
    run = _running(db, awaited=True)
    db.execute("UPDATE notifyq.job_run SET status = 'completed', finished_at = now() "
               "WHERE id = %s", (run,))
    assert _notified(listener) == [f"d:{run}"]


@pytest.mark.parametrize("statement", [
    # A claim (status, never finished_at) and a retry (back to pending): nothing final.
    "UPDATE notifyq.job_run SET status = 'running', attempts = attempts + 1 WHERE id = %s",
    "UPDATE notifyq.job_run SET status = 'pending', finished_at = NULL WHERE id = %s",
])
def test_an_awaited_run_that_does_not_finish_sends_nothing(db: Conn, listener: Listener,
                                                           statement: str) -> None:
    run = _running(db, awaited=True)
    db.execute(statement, (run,))
    assert _notified(listener) == []


def test_a_run_nobody_awaits_finishes_without_a_notification(db: Conn,
                                                             listener: Listener) -> None:
    run = _running(db)
    db.execute("UPDATE notifyq.job_run SET status = 'failed', finished_at = now() "
               "WHERE id = %s", (run,))
    assert _notified(listener) == []
