"""The dashboard's budgeted counts (RunControl.count_states, count_matching, count_within)
against real PostgreSQL: exact where the plan is cheap, the planner's estimate (marked) where
it is not, and an id's end looked up once for all of them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import pytest

from notifyq import App
from notifyq._control import RUN_STATES, Count, RunFilter

pytestmark = pytest.mark.anyio

Conn = psycopg.Connection[Any]


def _seed(sql: Conn) -> list[str]:
    """12 pending runs of pool ``idle`` and 3 failed, analyzed; their ids."""
    rows = sql.execute("SELECT notifyq.enqueue('seed.one', '{}', pool => 'idle', "
                       "allow_unknown_type => true) FROM generate_series(1, 15)").fetchall()
    ids = [str(r[0]) for r in rows]
    sql.execute("UPDATE notifyq.job_run SET status = 'failed', attempts = 1, "
                "finished_at = now() WHERE id = ANY (%s::uuid[])", (ids[:3],))
    sql.execute("ANALYZE notifyq.job_run")
    return ids


async def test_budgeted_counts_are_exact_where_their_plan_is_cheap(app: App, sql: Conn) -> None:
    _seed(sql)
    where = RunFilter(pool="idle")
    async with (await app.pool()).connection() as conn:
        states = await app._control.count_states(conn, where, budget_s=1.0)
        matching = await app._control.count_matching(conn, where, budget_s=0.5)
        retry = await app._control.count_within(conn, where, "retry", budget_s=0.5)
        exact = await app._control.count_states(conn, where)
    assert states == {state: Count(n) for state, n in exact.items()}
    assert (states["pending"], states["failed"]) == (Count(12), Count(3))
    assert (matching, retry) == (Count(15), Count(3))


async def test_a_count_planned_too_costly_is_the_planners_estimate_marked_so(
        app: App, sql: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    _seed(sql)
    monkeypatch.setattr("notifyq._control.COUNT_COST_MAX", 0.0)  # every plan is "too costly"
    where = RunFilter(pool="idle")
    async with (await app.pool()).connection() as conn:
        states = await app._control.count_states(conn, where, budget_s=1.0)
        matching = await app._control.count_matching(conn, where, budget_s=0.5)
    assert set(states) == set(RUN_STATES)
    assert all(c is not None and c.estimated and not c.capped for c in states.values())
    assert matching is not None
    assert matching.estimated
    assert 5 <= matching.n <= 45  # the planner's guess at 15, from the statistics


async def test_an_id_end_is_looked_up_once_and_counted_among_those_runs(
        app: App, sql: Conn) -> None:
    ids = _seed(sql)
    ending = ids[4][-8:]
    where = RunFilter(pool="idle", id_suffix=ending)
    async with (await app.pool()).connection() as conn:
        looked_up = await app._control.with_ids_ending(conn, where)
        assert looked_up == replace(where, id_suffix=None, ids=(looked_up.ids or ())[:1])
        assert [str(i) for i in looked_up.ids or ()] == [ids[4]]
        counted = await app._control.count_states(conn, looked_up, budget_s=1.0)
        assert counted == await app._control.count_states(conn, where, budget_s=1.0)
        assert await app._control.with_ids_ending(conn, RunFilter(pool="idle")) == RunFilter(
            pool="idle")
    assert counted["pending"] == Count(1)
    assert sum(c.n for c in counted.values() if c is not None) == 1
