"""The keyed claim (``_claim_keyed``, migration 0021): keys found by a skip scan, each key's
limit from ``key_concurrency`` when it has one, a key whose head run is not due passed over, and
never more running per key than its limit, even with two claims at once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.helpers import claim, count

Conn = psycopg.Connection[dict[str, Any]]


def _backlog(db: Conn, keys: dict[str, int], *, limit: int = 5, pool: str = "webhooks",
             run_at: Any = T0) -> None:
    for key, n in keys.items():
        db.execute("INSERT INTO notifyq.job_run (job_type, input, pool, run_at, "
                   "concurrency_key, concurrency_limit) "
                   "SELECT 'webhook.deliver', jsonb_build_object('i', g), %s, %s, %s, %s "
                   "FROM generate_series(1, %s) g", (pool, run_at, key, limit, n))


def _running(db: Conn) -> dict[str, int]:
    rows = db.execute("SELECT concurrency_key, count(*) AS n FROM notifyq.job_run "
                      "WHERE status = 'running' GROUP BY 1").fetchall()
    return {r["concurrency_key"]: r["n"] for r in rows}


def test_each_key_gets_its_limit_however_long_its_backlog(db: Conn, q: Queries) -> None:
    _backlog(db, {"webhook:a": 3000, "webhook:b": 2, "webhook:c": 40})
    got = claim(db, q, T0, pool="webhooks", limit=100, keyed=True)
    assert len(got) == 5 + 2 + 5
    assert _running(db) == {"webhook:a": 5, "webhook:b": 2, "webhook:c": 5}
    assert claim(db, q, T0, pool="webhooks", limit=100, keyed=True) == []  # all full


def test_a_keys_current_limit_overrides_the_one_its_runs_were_enqueued_with(
        db: Conn, q: Queries) -> None:
    _backlog(db, {"webhook:a": 50, "webhook:b": 50})
    db.execute("INSERT INTO notifyq.key_concurrency (key, concurrency_limit) "
               "VALUES ('webhook:a', 12), ('webhook:b', 1)")
    claim(db, q, T0, pool="webhooks", limit=100, keyed=True)
    assert _running(db) == {"webhook:a": 12, "webhook:b": 1}
    db.execute("UPDATE notifyq.key_concurrency SET concurrency_limit = 15 "
               "WHERE key = 'webhook:a'")
    assert len(claim(db, q, T0, pool="webhooks", limit=100, keyed=True)) == 3


def test_the_claim_limit_is_shared_across_keys_in_the_order_of_their_heads(
        db: Conn, q: Queries) -> None:
    _backlog(db, {"webhook:late": 10}, run_at=T0 - timedelta(seconds=1))
    _backlog(db, {"webhook:early": 10}, run_at=T0 - timedelta(seconds=9))
    got = claim(db, q, T0, pool="webhooks", limit=7, keyed=True)
    assert len(got) == 7
    assert _running(db) == {"webhook:early": 5, "webhook:late": 2}


def test_a_key_whose_head_is_not_due_holds_up_no_other_key(db: Conn, q: Queries) -> None:
    _backlog(db, {"webhook:parked": 500}, run_at=T0 + timedelta(minutes=5))
    _backlog(db, {"webhook:due": 3})
    assert len(claim(db, q, T0, pool="webhooks", limit=100, keyed=True)) == 3
    assert _running(db) == {"webhook:due": 3}
    assert count(db, "status = 'pending' AND concurrency_key = 'webhook:parked'") == 500


def test_two_claims_at_once_never_run_more_than_a_keys_limit(db: Conn, db2: Conn,
                                                             q: Queries) -> None:
    _backlog(db, {"webhook:a": 100}, limit=4)
    with db2.transaction():  # the second claim is still uncommitted, its lock held
        first = claim(db2, q, T0, pool="webhooks", limit=100, keyed=True)
        meanwhile = claim(db, q, T0, pool="webhooks", limit=100, keyed=True)
    after = claim(db, q, T0, pool="webhooks", limit=100, keyed=True)
    assert (len(first), len(meanwhile), len(after)) == (4, 0, 0)
    assert _running(db) == {"webhook:a": 4}


def test_the_keyed_claim_walks_the_keyed_index_with_plans_made_on_an_empty_table(
        db: Conn, q: Queries) -> None:
    """The completer keeps generic plans. In a benchmark the function's statements once read
    every pending run of the pool per key (job_run_scheduled_idx, filtered and sorted): 100 ms
    a claim at 6,000 pending deliveries to 20 endpoints; `enable_sort = off` on the function
    leaves only the keyed index. That plan did not come back here (it depends on the
    statistics of the moment), so this reads the plans for their shape: the keyed index, no
    other index or scan of job_run, and no JIT, which the disabled sort's cost would trigger
    (0.4-0.8 s a claim; this part fails without `jit = off`)."""
    db.execute(q.worker_session_generic_plans)
    for _ in range(3):  # planned now, on an empty table
        claim(db, q, T0, pool="webhooks", limit=5, keyed=True)
    _backlog(db, {f"webhook:{n}": 300 for n in range(20)})
    db.execute("ANALYZE notifyq.job_run")  # as autovacuum would meanwhile: planned anew
    db.execute("LOAD 'auto_explain'")
    for setting, value in (("log_min_duration", "0"), ("log_nested_statements", "on"),
                           ("log_level", "notice")):
        db.execute(f"SET auto_explain.{setting} = {value}")
    db.execute("SET client_min_messages = notice")
    plans: list[str] = []
    db.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    got = claim(db, q, T0, pool="webhooks", limit=5, keyed=True)
    db.execute("RESET client_min_messages")
    assert len(got) == 5
    keyed = [p for p in plans if "WITH RECURSIVE keys(key)" in p and "concurrency_key" in p]
    assert keyed, plans
    for plan in keyed:
        assert "job_run_claim_keyed_idx" in plan
        assert "job_run_scheduled_idx" not in plan
        assert "Seq Scan on job_run" not in plan
        assert "JIT:" not in plan


def _retries(db: Conn, key: str, n: int, *, run_at: Any = T0 - timedelta(minutes=1)) -> None:
    """``n`` due retries of ``key``: runs attempted before (started_at set), pending again."""
    _backlog(db, {key: n}, run_at=run_at)
    db.execute("UPDATE notifyq.job_run SET started_at = run_at - interval '1 minute' "
               "WHERE concurrency_key = %s", (key,))


def _register(db: Conn, worker_id: str, retry_slots: dict[str, int] | None) -> None:
    db.execute("INSERT INTO notifyq.worker (id, host, pid, version, pools, concurrency, "
               "started_at, heartbeat_at, expires_at, retry_slots) "
               "VALUES (%s, 'h', 1, 'x', '{webhooks}', 10, %s, %s, %s + interval '1 hour', %s)",
               (worker_id, T0, T0, T0, Jsonb(retry_slots)))


def test_first_attempts_are_claimed_before_older_due_retries(db: Conn, q: Queries) -> None:
    # The failing endpoint's retries are due since a minute; the healthy one's run is new.
    db.execute("INSERT INTO notifyq.key_concurrency VALUES ('webhook:failing', 100, now())")
    _retries(db, "webhook:failing", 50)
    _backlog(db, {"webhook:healthy": 3})
    got = claim(db, q, T0, pool="webhooks", limit=6, keyed=True)
    assert len(got) == 6
    assert _running(db) == {"webhook:healthy": 3, "webhook:failing": 3}


def test_retries_hold_at_most_the_workers_retry_slots(db: Conn, q: Queries) -> None:
    db.execute("INSERT INTO notifyq.key_concurrency VALUES ('webhook:failing', 100, now())")
    _retries(db, "webhook:failing", 50)
    _register(db, "w1", {"webhooks": 4})
    assert len(claim(db, q, T0, pool="webhooks", limit=10, keyed=True)) == 4
    # It holds 4 retries: no room for more, while first attempts still get every slot asked.
    assert claim(db, q, T0, pool="webhooks", limit=10, keyed=True) == []
    _backlog(db, {"webhook:healthy": 8})
    assert len(claim(db, q, T0, pool="webhooks", limit=10, keyed=True)) == 5  # its share
    assert _running(db) == {"webhook:failing": 4, "webhook:healthy": 5}
    # Another worker has its own room; a worker with no cap registered takes what is left.
    _register(db, "w2", {"webhooks": 2})
    assert len(claim(db, q, T0, pool="webhooks", limit=10, keyed=True, worker_id="w2")) == 2
    assert len(claim(db, q, T0, pool="webhooks", limit=10, keyed=True, worker_id="w3")) == 10


def test_a_retry_room_counts_only_the_workers_retries_of_that_pool(db: Conn,
                                                                   q: Queries) -> None:
    _retries(db, "webhook:a", 20)
    db.execute("INSERT INTO notifyq.key_concurrency VALUES ('webhook:a', 100, now())")
    _register(db, "w1", {"webhooks": 3, "other": 1})
    assert len(claim(db, q, T0, pool="webhooks", limit=10, keyed=True)) == 3
    # A retry written back frees its place in the room.
    run = db.execute("SELECT id, fence FROM notifyq.job_run WHERE status = 'running' "
                     "LIMIT 1").fetchone()
    assert run is not None
    db.execute("UPDATE notifyq.job_run SET status = 'completed' WHERE id = %s", (run["id"],))
    assert len(claim(db, q, T0, pool="webhooks", limit=10, keyed=True)) == 1


def _endpoint(db: Conn, q: Queries, rate_limit: int | None) -> Any:
    row = db.execute(q.webhook_endpoint_insert, {
        "url": "https://hooks.example/r", "description": "", "event_types": None,
        "headers": Jsonb({}), "enabled": True, "now": T0, "tenant_id": None,
        "rate_limit": rate_limit}).fetchone()
    assert row is not None
    return row["id"]


def test_an_endpoints_rate_limit_caps_the_starts_of_its_key_per_second(db: Conn,
                                                                        q: Queries) -> None:
    endpoint = _endpoint(db, q, 3)
    key = f"webhook:{endpoint}"
    db.execute("INSERT INTO notifyq.key_concurrency VALUES (%s, 100, now())", (key,))
    _backlog(db, {key: 50, "webhook:free": 10}, limit=100)
    # 3 a second is 1 per third of a second (bursts of a tenth of the rate, at least one).
    got = claim(db, q, T0, pool="webhooks", limit=100, keyed=True)
    assert _running(db) == {key: 1, "webhook:free": 10}  # its rate; the other has none
    assert len(got) == 11
    assert claim(db, q, T0 + timedelta(seconds=0.3), pool="webhooks", limit=100,
                 keyed=True) == []  # the window is full, across workers: one window per key
    started = [len(claim(db, q, T0 + timedelta(seconds=0.35 * n), pool="webhooks",
                         limit=100, keyed=True, worker_id=f"w{n % 2}")) for n in range(1, 9)]
    assert sum(started) == 3 * 3 - 1  # in the next 2.8 s: one each third of a second
    # Full, the pool's next start is when the window has room again: the producer wakes then.
    delay = db.execute(q.job_run_next_run_at, {"pool": "webhooks",
                                               "now": T0 + timedelta(seconds=2.81)}).fetchone()
    assert delay is not None
    assert 0 < delay["delay_s"] <= 0.34


def test_the_endpoints_rate_follows_its_row(db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q, 5)
    key = f"webhook:{endpoint}"
    rates = "SELECT rate_limit, period_s FROM notifyq.key_rate WHERE key = %s"
    assert db.execute(rates, (key,)).fetchall() == [{"rate_limit": 1, "period_s": 0.2}]
    db.execute("UPDATE notifyq.webhook_endpoint SET rate_limit = 25 WHERE id = %s", (endpoint,))
    assert db.execute(rates, (key,)).fetchall() == [{"rate_limit": 3, "period_s": 0.12}]
    db.execute("UPDATE notifyq.webhook_endpoint SET rate_limit = NULL WHERE id = %s",
               (endpoint,))
    assert db.execute(rates, (key,)).fetchall() == [{"rate_limit": None, "period_s": 0.12}]
    assert _endpoint(db, q, None) is not None  # unlimited: no row
    assert db.execute("SELECT count(*) AS n FROM notifyq.key_rate").fetchone() == {"n": 1}
    db.execute("DELETE FROM notifyq.webhook_endpoint WHERE id = %s", (endpoint,))
    assert db.execute(rates, (key,)).fetchall() == []


def test_a_held_endpoint_starts_nothing_until_its_hold_ends(db: Conn, q: Queries) -> None:
    endpoint = _endpoint(db, q, None)
    key = f"webhook:{endpoint}"
    _backlog(db, {key: 4, "webhook:other": 2})
    held = db.execute(q.webhook_endpoint_hold, {"endpoint_id": endpoint,
                                                "until": T0 + timedelta(seconds=2),
                                                "now": T0}).fetchone()
    assert held == {"held_until": T0 + timedelta(seconds=2)}
    shorter = db.execute(q.webhook_endpoint_hold, {"endpoint_id": endpoint,
                                                   "until": T0 + timedelta(seconds=1),
                                                   "now": T0}).fetchone()
    assert shorter == held  # a later, shorter hold does not end one
    assert len(claim(db, q, T0 + timedelta(seconds=1.9), pool="webhooks", limit=100,
                     keyed=True)) == 2
    assert _running(db) == {"webhook:other": 2}
    assert len(claim(db, q, T0 + timedelta(seconds=2), pool="webhooks", limit=100,
                     keyed=True)) == 4
