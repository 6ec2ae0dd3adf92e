"""job_run_list_children: a run's children (the admin API and `runs show` list them)."""

from __future__ import annotations

from typing import Any

import psycopg

from notifyq._db.queries import Queries

Conn = psycopg.Connection[dict[str, Any]]


def _enqueue(db: Conn, job_type: str = "t.parent") -> Any:
    row = db.execute("SELECT notifyq.enqueue(%s, '{}'::jsonb) AS id", (job_type,)).fetchone()
    assert row is not None
    return row["id"]


def test_children_of_a_run_are_listed_oldest_first_and_only_theirs(db: Conn, q: Queries) -> None:
    parent, other = _enqueue(db), _enqueue(db)
    children = [_enqueue(db, "t.child") for _ in range(3)]
    db.execute("UPDATE notifyq.job_run SET parent_run_id = %s, root_run_id = %s "
               "WHERE id = ANY(%s)", (parent, parent, children))
    rows = db.execute(q.job_run_list_children, {"tenant_ids": None,
                                                "parent_run_id": parent, "limit": 10}).fetchall()
    assert [r["id"] for r in rows] == children
    assert db.execute(q.job_run_list_children, {"tenant_ids": None,
                                                "parent_run_id": other, "limit": 10}
                      ).fetchall() == []
