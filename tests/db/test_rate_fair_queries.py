"""Rate limits and fair claiming (migration 0015) at the SQL level, with the database's time
moved by the statements' ``now``: the keyed claim starts at most a key's limit per sliding
window, skips a full key without holding up anything else, and the fair claim takes every
tenant's head however long another tenant's backlog is."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from notifyq._db.queries import Queries
from notifyq._enqueue.ids import new_run_ids
from notifyq._enqueue.request import EnqueueRequest
from tests.db.conftest import T0
from tests.db.helpers import DEFINITION, Conn, claim, enqueue, insert_one


def register(db: Conn, q: Queries, job_type: str, **definition: Any) -> None:
    db.execute(q.job_upsert, {**DEFINITION, "type": job_type, **definition})


def claim_keyed(db: Conn, q: Queries, now: Any, limit: int = 100) -> list[dict[str, Any]]:
    return db.execute(q.job_run_claim_keyed, {"now": now, "pool": "default", "limit": limit,
                                              "worker_id": "w", "lease_s": 30.0}).fetchall()


def claim_fair(db: Conn, q: Queries, limit: int) -> list[dict[str, Any]]:
    return db.execute(q.job_run_claim_fair, {"now": T0, "pool": "default", "limit": limit,
                                             "worker_id": "w", "lease_s": 30.0}).fetchall()


def insert_ones(db: Conn, q: Queries, job_type: str, n: int, input: Any = None) -> None:
    """Plain enqueues (job_run_insert_one, as App.enqueue without keys)."""
    for _ in range(n):
        insert_one(db, q, EnqueueRequest(job_type=job_type, input=input or {}))


def insert_bulk(db: Conn, q: Queries, job_type: str, n: int, input: Any = None) -> None:
    """App.enqueue_many's statement."""
    records = [{"id": str(i), "job_type": job_type, "input": input or {}}
               for i in new_run_ids(n)]
    db.execute(q.job_run_insert_bulk, {"notify": False, "channel": "notifyq",
                                       "rows": json.dumps(records), "types": [job_type],
                                       "accept_types": None}).fetchall()


def test_a_rate_limited_type_starts_at_most_its_limit_per_sliding_window(
        db: Conn, q: Queries) -> None:
    register(db, q, "t.rated", rate_limit=3, rate_period_s=10.0)
    for _ in range(8):
        enqueue(db, q, "t.rated")
    keys = db.execute("SELECT DISTINCT rate_key FROM notifyq.job_run").fetchall()
    assert keys == [{"rate_key": "type:t.rated"}]

    assert len(claim_keyed(db, q, T0)) == 3
    assert claim_keyed(db, q, T0 + timedelta(seconds=5)) == []  # window full
    # The plain claim never takes them, whatever the window says.
    assert claim(db, q, T0 + timedelta(seconds=30), limit=10) == []
    # Sliding in steps of a twentieth of the period (0.5 s): the three starts of T0 count until
    # their step has left the last 10 s, at +10.5 s; not a fixed 10 s bucket.
    assert claim_keyed(db, q, T0 + timedelta(seconds=10, microseconds=1)) == []
    assert len(claim_keyed(db, q, T0 + timedelta(seconds=10.5))) == 3
    assert claim_keyed(db, q, T0 + timedelta(seconds=20)) == []
    assert len(claim_keyed(db, q, T0 + timedelta(seconds=21))) == 2  # what is left
    # The state: counts per step still inside the window, nothing older.
    window = db.execute("SELECT rate_limit, period_s, counts FROM notifyq.rate_window").fetchone()
    assert window == {"rate_limit": 3, "period_s": 10.0, "counts": [2]}


def test_the_window_counts_each_start_so_a_partial_claim_leaves_the_rest_for_later(
        db: Conn, q: Queries) -> None:
    register(db, q, "t.rated", rate_limit=4, rate_period_s=10.0)
    for _ in range(6):
        enqueue(db, q, "t.rated")
    assert len(claim_keyed(db, q, T0, limit=1)) == 1
    assert len(claim_keyed(db, q, T0 + timedelta(seconds=4))) == 3  # 4 in the window now
    assert claim_keyed(db, q, T0 + timedelta(seconds=9)) == []
    # Once T0's step has left (+10.5 s) only the first start is gone: one more, not four.
    assert len(claim_keyed(db, q, T0 + timedelta(seconds=10.5))) == 1


def test_template_keys_limit_each_key_on_its_own(db: Conn, q: Queries) -> None:
    register(db, q, "t.per_account", rate_limit=2, rate_period_s=60.0,
             rate_key_template="acct:{account}")
    for account in ("a", "a", "a", "b", "b", "b"):
        enqueue(db, q, "t.per_account", {"account": account})
    claimed = claim_keyed(db, q, T0)
    assert sorted(r["rate_key"] for r in claimed) == ["acct:a", "acct:a", "acct:b", "acct:b"]


def test_a_full_key_does_not_hold_up_plain_runs_or_other_keys(db: Conn, q: Queries) -> None:
    register(db, q, "t.rated", rate_limit=1, rate_period_s=60.0)
    register(db, q, "t.other", rate_limit=5, rate_period_s=60.0)
    register(db, q, "t.plain")
    for _ in range(50):
        enqueue(db, q, "t.rated", priority=-10)  # best priority, oldest: first in every order
    enqueue(db, q, "t.other")
    enqueue(db, q, "t.plain")
    keyed = claim_keyed(db, q, T0)
    assert sorted(r["job_type"] for r in keyed) == ["t.other", "t.rated"]
    assert [r["job_type"] for r in claim(db, q, T0, limit=10)] == ["t.plain"]


def test_the_plain_insert_gives_rate_keys_too_and_other_types_none(db: Conn, q: Queries) -> None:
    register(db, q, "t.rated", rate_limit=2, rate_period_s=1.0,
             rate_key_template="acct:{account}")
    register(db, q, "t.plain")
    insert_ones(db, q, "t.rated", 1, input={"account": 7})
    insert_bulk(db, q, "t.rated", 1, input={"account": 7})
    insert_ones(db, q, "t.plain", 1)
    rows = db.execute("SELECT job_type, rate_key FROM notifyq.job_run ORDER BY job_type")
    assert rows.fetchall() == [{"job_type": "t.plain", "rate_key": None},
                               {"job_type": "t.rated", "rate_key": "acct:7"},
                               {"job_type": "t.rated", "rate_key": "acct:7"}]


def test_the_idle_producer_wakes_when_a_full_window_has_room_again(db: Conn, q: Queries) -> None:
    register(db, q, "t.rated", rate_limit=2, rate_period_s=10.0)
    for _ in range(3):
        enqueue(db, q, "t.rated")
    assert len(claim_keyed(db, q, T0)) == 2
    delay = db.execute(q.job_run_next_run_at, {"pool": "default",
                                               "now": T0 + timedelta(seconds=4)}).fetchone()
    assert delay is not None
    assert abs(delay["delay_s"] - 6.5) < 1e-6  # T0's step leaves the window at +10.5 s


def test_runs_of_a_type_whose_limit_was_removed_are_claimed_freely(db: Conn, q: Queries) -> None:
    register(db, q, "t.rated", rate_limit=1, rate_period_s=60.0)
    for _ in range(4):
        enqueue(db, q, "t.rated")
    assert len(claim_keyed(db, q, T0)) == 1
    register(db, q, "t.rated")  # redeployed without a limit
    assert len(claim_keyed(db, q, T0)) == 3


def _backlog_and_two_small_tenants(db: Conn, q: Queries) -> None:
    register(db, q, "t.a")
    db.execute("SELECT notifyq.enqueue('t.a', '{}', tenant_id => 'big') "
               "FROM generate_series(1, 500)")
    db.execute("SELECT notifyq.enqueue('t.a', '{}', tenant_id => 'small')")
    db.execute("SELECT notifyq.enqueue('t.a', '{}')")  # no tenant: a group of its own


def _tenants(db: Conn, rows: list[dict[str, Any]]) -> list[str | None]:
    return [db.execute("SELECT tenant_id FROM notifyq.job_run WHERE id = %s",
                       (r["id"],)).fetchone()["tenant_id"] for r in rows]  # type: ignore[index]


def test_the_plain_claim_serves_a_long_backlog_first(db: Conn, q: Queries) -> None:
    _backlog_and_two_small_tenants(db, q)
    assert _tenants(db, claim(db, q, T0, limit=10)) == ["big"] * 10


def test_fair_claims_share_the_batch_between_tenants(db: Conn, q: Queries) -> None:
    _backlog_and_two_small_tenants(db, q)
    # Two tenants, a batch of 10: five each (small has one), and the rest in the plain order,
    # where the run without a tenant waits its turn behind big's older runs.
    tenants = _tenants(db, claim_fair(db, q, limit=10))
    assert sorted(tenants, key=str) == ["big"] * 9 + ["small"]
    # With only 'big' left, it gets whole batches.
    assert _tenants(db, claim_fair(db, q, limit=10)) == ["big"] * 10


def test_the_window_listing_and_pruning(db: Conn, q: Queries) -> None:
    register(db, q, "t.rated", rate_limit=2, rate_period_s=10.0)
    for _ in range(3):
        enqueue(db, q, "t.rated")
    assert len(claim_keyed(db, q, T0)) == 2
    [listed] = db.execute(q.rate_window_list, {"now": T0 + timedelta(seconds=1),
                                               "limit": 10}).fetchall()
    assert listed == {"key": "type:t.rated", "pool": "default", "rate_limit": 2,
                      "period_s": 10.0, "in_window": 2, "runnable": 1,
                      "next_start_at": T0 + timedelta(seconds=10.5)}
    [later] = db.execute(q.rate_window_list, {"now": T0 + timedelta(seconds=10.5),
                                              "limit": 10}).fetchall()
    assert (later["in_window"], later["next_start_at"]) == (0, None)
    # Pruned only once every start has left the window.
    assert db.execute(q.rate_window_prune, {"now": T0 + timedelta(seconds=9)}).rowcount == 0
    assert db.execute(q.rate_window_prune, {"now": T0 + timedelta(seconds=11)}).rowcount == 1
