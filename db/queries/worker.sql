-- Named queries for the worker registry: one row per live worker process, renewed by its
-- heartbeat (see 0009_worker_registry).

-- name: worker_register
-- At start (and again if the reaper removed the row while the worker was cut off).
-- `retry_slots` ({pool: runs}, or null): how many of its runs of a pool the worker lets be
-- retries at once; the keyed claim reads it (migration 0027).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
INSERT INTO {schema}.worker AS w (id, host, pid, version, pools, concurrency, running,
                                  started_at, heartbeat_at, expires_at, retry_slots)
SELECT %(id)s, %(host)s, %(pid)s, %(version)s, %(pools)s, %(concurrency)s, %(running)s,
       n.now, n.now, n.now + make_interval(secs => %(ttl_s)s), %(retry_slots)s::jsonb
FROM n
ON CONFLICT (id) DO UPDATE
SET running = excluded.running, heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at

-- name: worker_heartbeat
-- Returns a row while the worker is registered; none tells it to register again.
UPDATE {schema}.worker
SET running = %(running)s, heartbeat_at = coalesce(%(now)s::timestamptz, now()),
    expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s)
WHERE id = %(id)s
RETURNING id

-- name: worker_leave
DELETE FROM {schema}.worker WHERE id = %(id)s

-- name: worker_list
-- The workers alive on the database clock, oldest first. `running` is counted now from the runs
-- each holds (status running, leased by it: claimed-ahead ones too, as the runs list shows them),
-- not the registry's column, which is as old as the last heartbeat: the dashboard showed 0 while
-- 21 ran, and 21 after the pool had emptied. One pass over the running runs' partial index.
SELECT w.id, w.host, w.pid, w.version, w.pools, w.concurrency,
       coalesce(held.running, 0) AS running, w.started_at, w.heartbeat_at, w.expires_at
FROM {schema}.worker w
LEFT JOIN (SELECT leased_by, count(*) AS running FROM {schema}.job_run
           WHERE status = 'running' GROUP BY leased_by) held ON held.leased_by = w.id
WHERE w.expires_at > coalesce(%(now)s::timestamptz, now())
ORDER BY w.started_at, w.id

-- name: worker_reap_expired
-- Leader-only (the reaper): rows of workers that stopped heartbeating without leaving.
DELETE FROM {schema}.worker
WHERE expires_at <= coalesce(%(now)s::timestamptz, now())
RETURNING id

-- name: worker_session_generic_plans
-- The completer's own connection (notifyq/_dispatch/completer.py) plans its prepared statements
-- once. Under PostgreSQL's "auto" choice a session plans a prepared statement anew for its first
-- executions and whenever the plan is invalidated (a TRUNCATE, an ANALYZE of the queue table) and
-- the generic plan's estimate loses: 700 us of backend CPU for a claim planned anew, 267 us on the
-- cached generic plan (one run, hot connection). `notifyq bench --only drain --only latency` on
-- the 2-core VM: the database forced generic alone (PGOPTIONS), concurrency 10 7,498-7,608 ->
-- 9,192-9,195 runs/s; this connection (generic plans, a busy backend), before and after
-- alternated twice: 7,564-7,931 -> 9,368-9,502 runs/s, PostgreSQL CPU per run 72-73 -> 52-54 us,
-- idle wake p50 1.6-1.8 -> 1.2 ms, p99 2.3-2.4 -> 1.6-1.8 ms.
--
-- A plan kept that long is made with whatever statistics job_run had when the worker started:
-- none (a new or truncated table, a guessed 10 pages) or a large analyzed backlog. No join or
-- scan chosen for one of those is right for the other (the claim's rows by id: a sequential
-- scan looked cheapest on an empty table, then read the whole table in every claim as it grew;
-- a join of the picked ids, right on an empty table, became a hash join over the whole table
-- on an analyzed backlog). Every statement of this session reaches job_run by an index, so the
-- session rules sequential scans out (`enable_seqscan` only adds a cost: a table with no
-- usable index is still read), and its plans hold at any size
-- (tests/db/test_job_run_queries.py plans them both ways).
--
-- And no JIT: a generic plan's estimated cost grows with the backlog analyzed when it was made,
-- and JIT compiles a kept plan again at every execution. On 201,000 pending runs the claim's
-- plan cost 173,717, over jit_above_cost (100,000): 46 functions compiled per claim, 172 ms a
-- claim of one run against 0.3 ms without (2026-12-07, bench/RESULTS.md). This session's
-- statements each touch a few dozen rows; none gains from JIT.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('enable_seqscan', 'off', false),
       set_config('jit', 'off', false)
