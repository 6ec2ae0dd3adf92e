-- Named queries about runs. `{schema}` is filled with the quoted schema identifier once, when the
-- registry loads; every timestamp is `coalesce(%(now)s, now())` so tests can move time.

-- name: job_run_enqueue
SELECT * FROM {schema}._enqueue(
    p_job_type => %(job_type)s, p_input => %(input)s::jsonb, p_run_at => %(run_at)s,
    p_priority => %(priority)s, p_pool => %(pool)s, p_max_attempts => %(max_attempts)s,
    p_dedupe_key => %(dedupe_key)s, p_tags => %(tags)s, p_id => %(id)s, p_notify => %(notify)s,
    p_dedupe_window_s => %(dedupe_window_s)s, p_trigger_source => %(trigger_source)s,
    p_trigger_ref => %(trigger_ref)s, p_concurrency_key => %(concurrency_key)s,
    p_concurrency_limit => %(concurrency_limit)s,
    p_concurrency_collision => %(concurrency_collision)s,
    p_scope_entity_type => %(scope_entity_type)s, p_scope_entity_id => %(scope_entity_id)s,
    p_tenant_id => %(tenant_id)s, p_allow_unknown_type => %(allow_unknown_type)s,
    p_dedupe_states => %(dedupe_states)s)

-- name: job_run_insert_one
-- App.enqueue of a run without dedupe or concurrency keys: one row as scalar parameters, and its
-- wake-up NOTIFY in the same statement, so outside a caller's transaction an enqueue is one round
-- trip and one commit (the NOTIFY is delivered when that commit is). The stored job definition
-- fills in the defaults exactly as _enqueue and job_run_insert_bulk do (keep the three alike).
-- Only what the caller does not know comes back: the definition's values and the statement's
-- now() (the run's created_at, and its run_at unless one was given).
-- Why not job_run_insert_many (the same INSERT from a one-element jsonb array, every column
-- back), which single enqueue used until 2026-12-01: per call, server CPU 300 -> 233 us and
-- Python 273 -> 213 us (backend /proc CPU and process_time, 15 interleaved rounds of 300 on the
-- 2-core VM at load 3-4; a bare 3-column INSERT into job_run measured 133 / 158 us beside it):
-- no jsonb array to build, print and parse, 5 columns back instead of 18 (psycopg sets up a
-- loader per column at every call).
-- Unknown job types (migration 0007): refused (NQ422) unless `accept` (the caller's opt-out, or
-- a type its App has a handler for) or no worker has registered any type yet; see
-- job_run_insert_bulk.
INSERT INTO {schema}.job_run (id, job_type, job_version, input, pool, priority, run_at,
                              max_attempts, timeout_s, tags, scope_entity_type, scope_entity_id,
                              tenant_id, defaulted, trace_context, rate_key)
SELECT r.id, r.job_type, coalesce(d.version, 1), r.input, coalesce(r.pool, d.pool, 'default'),
       coalesce(r.priority, d.priority_default, 0), coalesce(r.run_at, now()),
       coalesce(r.max_attempts, d.max_attempts, 25), d.timeout_s, coalesce(r.tags, ARRAY[]::text[]),
       coalesce(r.scope_entity_type, d.scope_entity_type),
       coalesce(r.scope_entity_id, CASE WHEN d.scope_id_template IS NOT NULL
                                        THEN {schema}._expand_template(d.scope_id_template, r.input)
                                   END),
       r.tenant_id,
       CASE WHEN d.type IS NOT NULL THEN NULL
            WHEN %(accept)s OR {schema}._accept_unknown_job_type(r.job_type)
            THEN ((r.pool IS NULL)::integer + 2 * (r.priority IS NULL)::integer
                  + 4 * (r.max_attempts IS NULL)::integer)::smallint END,
       r.trace_context,
       -- A rate-limited type (migration 0015): the run's key, its type or its filled template.
       CASE WHEN d.rate_limit IS NOT NULL
            THEN {schema}._rate_key(r.job_type, d.rate_key_template, r.input) END
FROM (VALUES (%(id)s::uuid, %(job_type)s::text, %(input)s::jsonb, %(pool)s::text,
              %(priority)s::integer, %(run_at)s::timestamptz, %(max_attempts)s::integer,
              %(tags)s::text[], %(scope_entity_type)s::text, %(scope_entity_id)s::text,
              %(tenant_id)s::text, %(trace_context)s::jsonb))
     AS r(id, job_type, input, pool, priority, run_at, max_attempts, tags, scope_entity_type,
          scope_entity_id, tenant_id, trace_context)
LEFT JOIN {schema}.job d ON d.type = r.job_type
-- The size the SQL function checks, as jsonb prints it (1e300 is 5 bytes in Python's JSON and
-- 301 here): an oversized row is left out, and the caller reports it.
WHERE octet_length(r.input::text) <= 65536
RETURNING pool, priority, max_attempts, timeout_s, created_at,
          CASE WHEN %(notify)s THEN (SELECT 1 FROM pg_notify(%(channel)s, 'j:' || pool)) END
              AS notified

-- name: job_run_insert_bulk
-- App.enqueue_many: job_run_insert_one's INSERT for a jsonb array of compact records (keep the
-- two alike), returning no row per run. It returns one row per job type of the batch (`types`):
-- how many rows went in, the statement's now() and the stored definition it applied, from which
-- Python builds the runs
-- with the same coalesce as here (notifyq/bulk.py), so the runs come back in the order given
-- and nothing per row crosses the wire twice. Server CPU per row, batches of 1,000, on top of
-- migration 0005 (backend /proc CPU time, 2-core VM at load 1-2, medians of 9 interleaved runs;
-- the absolute numbers drift with the load, the order did not):
--   job_run_insert_many as it was (every key sent, null or not; 18 columns back)  19-27 us
--   compact records (a key left out parses as NULL; each key costs its parse)    -2 to -5 us
--   CASE around _expand_template (otherwise a plpgsql call for every row)          -2 us
--   no row per run back (a count, now() and the definitions instead)             -1 to -2 us
-- With the old name CHECKs (before 0005) every row cost another 8-13 us. The table's own floor
-- (COPY of bare rows straight into job_run) is ~11 us; of that, the parent_run_id foreign key's
-- trigger costs ~1.7 us a row even though parent_run_id is NULL (EXPLAIN ANALYZE).
-- Rejected: unnest() of typed arrays (server about the same, but psycopg dumps lists element
-- by element in Python), and COPY into a temporary staging table first (~1-2 us more).
-- Re-measured 2026-12-01 (issue 13 item 5; batches of 1,000 `{"i": n}` rows of one type, 8
-- interleaved rounds of 5 batches, load 2.3; server CPU per row): this statement 21 us;
-- unnest(uuid[], text[], text[]) 21 us; COPY (text, one write) into a temp staging table, then
-- INSERT ... SELECT with this join 19 us; COPY straight into job_run with the definition's
-- values filled in by the client 16 us. The last is what enqueue_many sends since 2026-12-03
-- for a batch of 300 runs or more (job_run_copy_defaults, job_run_copy; keep them alike with
-- this statement): the definitions are read first, the size limit is Python's (it measures as
-- jsonb prints), and types with scope or rate-key templates still come here.
WITH inserted AS (
    INSERT INTO {schema}.job_run (id, job_type, job_version, input, pool, priority, run_at,
                                  max_attempts, timeout_s, tags, scope_entity_type,
                                  scope_entity_id, tenant_id, defaulted, trace_context,
                                  rate_key)
    SELECT r.id, r.job_type, coalesce(d.version, 1), r.input, coalesce(r.pool, d.pool, 'default'),
           coalesce(r.priority, d.priority_default, 0), coalesce(r.run_at, now()),
           coalesce(r.max_attempts, d.max_attempts, 25), d.timeout_s,
           coalesce(r.tags, ARRAY[]::text[]), coalesce(r.scope_entity_type, d.scope_entity_type),
           coalesce(r.scope_entity_id, CASE WHEN d.scope_id_template IS NOT NULL
                                            THEN {schema}._expand_template(d.scope_id_template,
                                                                           r.input)
                                       END),
           r.tenant_id,
           -- Unknown types refused, `defaulted` recorded: see job_run_insert_one.
           CASE WHEN d.type IS NOT NULL THEN NULL
                WHEN r.job_type = ANY (%(accept_types)s::text[])
                     OR {schema}._accept_unknown_job_type(r.job_type)
                THEN ((r.pool IS NULL)::integer + 2 * (r.priority IS NULL)::integer
                      + 4 * (r.max_attempts IS NULL)::integer)::smallint END,
           r.trace_context,
           -- Rate-limited types: see job_run_insert_one.
           CASE WHEN d.rate_limit IS NOT NULL
                THEN {schema}._rate_key(r.job_type, d.rate_key_template, r.input) END
    FROM (SELECT r.*, bool_and(octet_length(r.input::text) <= 65536) OVER () AS all_fit
          FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(id uuid, job_type text, input jsonb,
               pool text, priority integer, run_at timestamptz, max_attempts integer,
               tags text[], scope_entity_type text, scope_entity_id text, tenant_id text,
               trace_context jsonb)) AS r
    LEFT JOIN {schema}.job d ON d.type = r.job_type
    -- Oversized as jsonb prints it (see job_run_insert_one): then no row goes in, and the caller
    -- reports it. All or nothing, so a batch needs no transaction around this one statement.
    WHERE r.all_fit
    RETURNING pool
)
-- One snapshot for the whole statement: these are the definitions the INSERT joined.
-- `notify`: one wake-up per pool the batch went to, delivered when the transaction commits (a
-- batch without keyed runs needs no other statement for it).
SELECT (SELECT count(*) FROM inserted) AS inserted, now() AS now, t.type, d.pool,
       d.priority_default, d.max_attempts, d.timeout_s,
       (SELECT count(pg_notify(%(channel)s, 'j:' || p.pool))
        FROM (SELECT DISTINCT pool FROM inserted) AS p WHERE %(notify)s) AS notified
FROM unnest(%(types)s::text[]) AS t(type)
LEFT JOIN {schema}.job d ON d.type = t.type

-- name: job_run_copy_defaults
-- App.enqueue_many by COPY (notifyq/_enqueue/copy.py), first statement: what job_run_insert_bulk's
-- INSERT would join for each job type of the batch (`types`), so the client fills the same values
-- into the rows it copies, and the statement's now() (the runs' run_at unless given, and their
-- created_at). An unknown type is refused here as there (NQ422) unless accepted. `templated`: the
-- type fills a scope id or a rate key from a template, which only the INSERT does; the client
-- then sends job_run_insert_bulk instead. `accepted` is read for its refusal only (true: no
-- worker has registered any type). (The inputs' jsonb size is checked in Python, exactly:
-- notifyq/_enqueue/validate.py.)
SELECT now() AS now, t.type, d.version, d.pool, d.priority_default, d.max_attempts, d.timeout_s,
       d.scope_entity_type, d.type IS NOT NULL AS known,
       (d.scope_id_template IS NOT NULL OR d.rate_limit IS NOT NULL) AS templated,
       CASE WHEN d.type IS NULL AND NOT (t.type = ANY (coalesce(%(accept_types)s::text[], '{{}}')))
            THEN {schema}._accept_unknown_job_type(t.type) END AS accepted
FROM unnest(%(types)s::text[]) AS t(type)
LEFT JOIN {schema}.job d ON d.type = t.type

-- name: job_run_copy
-- App.enqueue_many by COPY, second statement: the plain rows, with the values
-- job_run_copy_defaults gave filled in (the column order is notifyq/_enqueue/copy.py's). One
-- statement, all or nothing; the rows' wake-up follows it. Why COPY: see copy.py.
COPY {schema}.job_run (id, input, job_type, job_version, pool, priority, max_attempts, timeout_s,
                       scope_entity_type, defaulted, run_at, created_at, tags, scope_entity_id,
                       tenant_id, trace_context) FROM STDIN

-- name: job_run_trace_context_set
-- The enqueue's trace context on a run written by _enqueue (dedupe or concurrency keys, the sync
-- path), which takes no trace context: sent only when a tracer is installed, in the enqueue's
-- transaction. A run that already has one (a dedupe hit on an older run) keeps it.
UPDATE {schema}.job_run SET trace_context = %(trace_context)s::jsonb
WHERE id = %(id)s AND trace_context IS NULL

-- name: job_run_input_size
SELECT octet_length(%(input)s::jsonb::text) AS size

-- name: job_run_notify
SELECT pg_notify(%(channel)s, payload) FROM unnest(%(payloads)s::text[]) AS payload

-- fragment: job_run_claim_plain
-- The plain claim, shared by the three claiming statements below (job_run_claim,
-- job_run_claim_keyed_then_plain, job_run_finish_and_claim): up to `claim_limit.runs` runnable
-- runs of one pool, best priority then oldest run_at first, then in enqueue order (the id: a
-- batch shares its run_at; migration 0007). SKIP LOCKED lets any number of workers claim
-- concurrently without waiting on each other; each claim draws a fresh random fence
-- (`_new_fence`, migration 0018) so write-backs from any earlier claim of the same run match
-- nothing. `claimed_at` is the database's now: the worker times retries from it, not from its
-- own clock. The SET list is `_claim_ids`'s (the plpgsql claims'), written inline to stay one
-- statement. Runs with a concurrency or rate key are left to the keyed claim.
--
-- The claimed rows are found by their ids (`= ANY (ARRAY(...))`, an index probe each), not by
-- joining `picked` back to job_run: the completer plans its statements once and generically
-- (worker_session_generic_plans), without the LIMIT's value, and the planner then guesses a
-- tenth of the due backlog for `picked`. On a large backlog that autovacuum had analyzed, the
-- join became a hash join over a sequential scan of the whole table in every claim: 100,000
-- pending runs drained at 306 runs/s, 3,251 with the ids (2-core VM, concurrency 10;
-- tests/db/test_job_run_queries.py checks the plan). An UPDATE returns its rows in the order its
-- scan meets them, so each statement sorts `claimed` back into claim order: the worker starts
-- them in the order they come back.
picked AS (
    SELECT id FROM {schema}.job_run j, n
    WHERE status = 'pending' AND pool = %(pool)s AND run_at <= n.now
      AND concurrency_key IS NULL AND rate_key IS NULL
      AND NOT EXISTS (SELECT FROM {schema}.pause WHERE kind = 'pool' AND name = %(pool)s)
      AND (NOT EXISTS (SELECT FROM {schema}.pause WHERE kind = 'type')
           OR NOT EXISTS (SELECT FROM {schema}.pause p
                          WHERE p.kind = 'type' AND p.name = j.job_type))
    ORDER BY priority, run_at, id
    LIMIT (SELECT runs FROM claim_limit)
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE {schema}.job_run r
    SET status = 'running', attempts = r.attempts + 1, fence = {schema}._new_fence(),
        claimed_at = n.now, started_at = coalesce(r.started_at, n.now),
        leased_by = %(worker_id)s, lease_expires_at = n.now + make_interval(secs => %(lease_s)s),
        updated_at = n.now
    FROM n
    WHERE r.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING r.id, r.job_type, r.job_version, r.input, r.pool, r.priority, r.run_at, r.attempts,
              r.max_attempts, r.timeout_s, r.fence, r.tags, r.parent_run_id, r.root_run_id,
              r.dedupe_key, r.created_at, r.cancel_requested_at, r.claimed_at, r.trace_context
)

-- name: job_run_claim
-- An idle worker's claim (no write-backs queued) in a pool without keyed runs: the plain claim
-- alone. Its own statement because a combined one costs even when a half is empty: an UPDATE
-- node opens and locks every index of job_run at executor start, rows or not (one claim after
-- 20-50 ms idle, p50 1.54 -> 1.01 ms against job_run_finish_and_claim with no write-backs),
-- and the keyed claim's function scan of job_run's whole row type, never called for a pool
-- without keyed runs, cost 171k of this statement's 848k server instructions (callgrind,
-- migration 0020's schema) when it was a one-time filter in here.
--
-- It commits with synchronous_commit off: no WAL flush to wait for, so the wake-up does not pay
-- the disk's fsync (p50 0.3 ms, p99 several ms here). A server crash can lose such a claim; the
-- run is then pending again under its old fence, and the random fence (`_new_fence`, migration
-- 0018) keeps the lost claim's holder from ever matching the next one
-- (tests/chaos/test_pg_restart.py). A write-back always commits synchronously, and its flush
-- carries any earlier asynchronous claim with it.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                  set_config('synchronous_commit', 'off', true) AS commit_mode),
claim_limit AS (SELECT %(limit)s::integer AS runs),
{job_run_claim_plain}
SELECT true AS claimed, id, pool, 'running' AS status, job_type, job_version, input, priority,
       run_at, attempts, max_attempts, timeout_s, fence, tags, parent_run_id, root_run_id,
       dedupe_key, created_at, cancel_requested_at, claimed_at, trace_context
FROM claimed
ORDER BY priority, run_at, id

-- name: job_run_claim_keyed_then_plain
-- An idle worker's claim in a keyed pool (one with a concurrency-limited or rate-limited
-- handler, such as `webhooks`: a delivery's key is its endpoint): first the keyed claim of
-- job_run_claim_keyed, then the plain claim for what is left of the limit, in one statement and
-- one round trip (as two statements a keyed pool's wake-up p50 was 1.75-2.02 ms, in one
-- 1.50-1.84). The plain half reads the snapshot taken before _claim_keyed ran, which is safe
-- because the halves never take the same row (the plain claim leaves out every run with a
-- concurrency or rate key). Commits asynchronously, as job_run_claim does; set_config runs in
-- `keyed` too, since with no plain run to claim `n` may never be read.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                  set_config('synchronous_commit', 'off', true) AS commit_mode),
keyed AS (
    SELECT c.*
    FROM {schema}._claim_keyed(%(pool)s, %(limit)s, %(worker_id)s, %(lease_s)s, %(now)s) AS c,
         LATERAL (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode
),
claim_limit AS (SELECT %(limit)s - count(*)::integer AS runs FROM keyed),
{job_run_claim_plain}
SELECT true AS claimed, id, pool, 'running' AS status, job_type, job_version, input, priority,
       run_at, attempts, max_attempts, timeout_s, fence, tags, parent_run_id, root_run_id,
       dedupe_key, created_at, cancel_requested_at, claimed_at, trace_context
FROM keyed
UNION ALL
(SELECT true, id, pool, 'running', job_type, job_version, input, priority, run_at, attempts,
        max_attempts, timeout_s, fence, tags, parent_run_id, root_run_id, dedupe_key, created_at,
        cancel_requested_at, claimed_at, trace_context
 FROM claimed
 ORDER BY priority, run_at, id)

-- name: job_run_claim_keyed
-- Runs with a concurrency key, at most their limit running per key, and rate-limited runs while
-- their key's window has room (see _claim_keyed). A claim alone, so it commits asynchronously,
-- as job_run_claim does (its comment says why that is
-- safe); set_config runs with the first claimed row, and a statement that claims nothing has
-- nothing to flush.
SELECT c.*
FROM {schema}._claim_keyed(%(pool)s, %(limit)s, %(worker_id)s, %(lease_s)s, %(now)s) AS c,
     LATERAL (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode

-- name: job_run_claim_fair
-- A fair pool's claim (worker.fair_pools): an even share of the batch per tenant, then the rest
-- in the plain order (see _claim_fair). Its own statement, before job_run_finish_and_claim
-- (which then claims nothing more): that statement's plain claim stays as it was, since a
-- branch for fair mode inside it (a function scan behind a parameter, and a sort of the claimed
-- rows) cost the plain drain 25-35 % (2,540-2,800 -> 1,630-1,740 runs/s, 10,000 no-op runs,
-- concurrency 10, load 1). Commits asynchronously, as job_run_claim_keyed does.
SELECT c.*
FROM {schema}._claim_fair(%(pool)s, %(limit)s, %(worker_id)s, %(lease_s)s, %(now)s) AS c,
     LATERAL (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode

-- name: job_run_next_run_at
-- When the pool has nothing runnable now: seconds until the earliest scheduled run_at, so the
-- producer can wake exactly then instead of at the next poll. Computed by the database, whose
-- clock also decides runnability, so host clock skew cannot make a worker wake early or late.
-- A rate-limited key whose window is full counts too: it has room again when its oldest start
-- leaves the window (migration 0015).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT extract(epoch FROM least(
           (SELECT min(run_at) FROM {schema}.job_run, n
            WHERE status = 'pending' AND pool = %(pool)s AND run_at > n.now),
           (SELECT min({schema}._rate_next_start(w.buckets, w.period_s, n.now))
            FROM {schema}.rate_window w, n
            WHERE w.pool = %(pool)s
              AND {schema}._rate_used(w.buckets, w.counts, w.period_s, n.now) >= w.rate_limit)
       ) - n.now)::float8 AS delay_s
FROM n

-- fragment: job_run_finish_fenced
-- The write-back, shared by job_run_finish_and_claim and job_run_finish_one: the outcomes `v`
-- of the runs in `writable` (the ids each statement may write, its own way), each fenced (id +
-- fence + still running), so a write from a worker whose lease was taken over matches nothing
-- and comes back missing. `refund` gives back the attempt taken at claim (snooze, release at
-- shutdown). A run whose cancel was requested never goes back to pending (a retry, snooze or
-- release would drop the cancel): it is canceled instead.
--
-- The written-back rows are found by id, as the claimed ones are, and each way around the ids
-- went wrong once. Joined to `v` alone, a plan made on a small table read the primary key from
-- its start in a merge (or hash) join with the outcomes: ids grow with time, so every write-back
-- read the index of every older run (wake-up p99 under 2,000 runs/s: 0.2-2.2 s). Hence
-- `r.id = ANY (...)`, an index condition. Written `status = 'running'`, the condition let the
-- planner walk the partial index of running runs (job_run_running_idx) instead, and a plan made
-- while few runs were running kept doing so: every write-back read every running run of every
-- worker (one worker's 20 write-backs + 20 claims: 4 ms a statement with no other runs running,
-- 27 ms with 2,000, 112 ms with 10,000). `status = (SELECT 'running')`, a value the planner
-- does not know, cannot select that index.
v AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[], %(statuses)s::text[],
                         %(outputs)s::text[], %(errors)s::text[], %(run_ats)s::timestamptz[],
                         %(refunds)s::integer[], %(wait_kinds)s::text[],
                         %(wait_tokens)s::text[], %(waiting_ons)s::text[])
        AS v(id, fence, status, output, error, run_at, refund, wait_kind, wait_token, waiting_on)
),
finished AS (
    UPDATE {schema}.job_run r
    SET status = CASE WHEN v.status IN ('pending', 'waiting') AND r.cancel_requested_at IS NOT NULL
                      THEN 'canceled'
                      -- Children that finished while the parent was deciding to wait are
                      -- already on its row (the row lock orders the two writes): no wait then.
                      WHEN v.status = 'waiting' AND v.wait_kind = 'children'
                           AND v.waiting_on::uuid[] <@ r.children_done
                      THEN 'pending'
                      ELSE v.status END,
        wait_kind = v.wait_kind,
        wait_token = v.wait_token,
        waiting_on = v.waiting_on::uuid[],
        output = coalesce(v.output::jsonb, r.output),
        error = coalesce(v.error::jsonb, r.error),
        run_at = CASE WHEN v.status = 'waiting' AND v.wait_kind = 'children'
                           AND v.waiting_on::uuid[] <@ r.children_done
                      THEN n.now  -- not the wait's "forever": runnable again right away
                      ELSE coalesce(v.run_at, r.run_at) END,
        attempts = r.attempts - v.refund,
        finished_at = CASE WHEN v.status IN ('completed', 'failed', 'timed_out', 'canceled')
                             OR (v.status IN ('pending', 'waiting')
                                 AND r.cancel_requested_at IS NOT NULL)
                           THEN n.now END,
        leased_by = NULL, lease_expires_at = NULL, updated_at = n.now
    FROM v, n
    WHERE r.id = ANY (ARRAY(SELECT id FROM writable)) AND r.id = v.id AND r.fence = v.fence
      AND r.status = (SELECT 'running')
    RETURNING r.id, r.pool, r.status
)

-- name: job_run_finish_and_claim
-- A worker's one statement per cycle: writes back the runs it finished and claims the next ones,
-- so a busy worker pays one round trip per batch instead of two. Either half may be empty (no
-- ids; limit 0). Rows come back tagged: `claimed` false for the write-backs that matched, true
-- for the runs claimed.
--
-- Write-back: job_run_finish_fenced, of the rows no other transaction holds locked (`writable`,
-- SKIP LOCKED). A lock on one run (an application's `SELECT ... FOR UPDATE` of it, or
-- `app.cancel(run, conn=txn)` in a long transaction) must delay that run only: waiting for it,
-- this statement held its whole batch and the claim riding with it, and the worker completed 0
-- runs/s for as long as the lock was held (issue 31; tests/chaos/test_row_lock.py). A skipped
-- run comes back missing like a fenced-out one; the completer tells the two apart
-- (job_run_leased_many) and writes a skipped one alone, waiting for its lock
-- (job_run_finish_one). FOR NO KEY UPDATE, the UPDATE's own lock: a foreign key's check (a
-- step or a child inserted for the run) neither waits for it nor makes it skip. What it costs:
-- see db/README.md ("Server instructions per statement").
--
-- Claim: the plain claim (`job_run_claim_plain`, above) of up to `limit` runs. Both halves read
-- the snapshot taken before the statement, so a run this statement sends back to pending is not
-- claimed again by it (the next cycle can).
--
-- A claim with no write-backs (an idle worker woken by a NOTIFY) is job_run_claim (or
-- job_run_claim_keyed_then_plain); this one always has write-backs and commits synchronously.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
writable AS (
    SELECT id FROM {schema}.job_run WHERE id = ANY (%(ids)s::uuid[])
    FOR NO KEY UPDATE SKIP LOCKED
),
{job_run_finish_fenced},
claim_limit AS (SELECT %(limit)s::integer AS runs),
{job_run_claim_plain}
SELECT false AS claimed, id, pool, status, NULL::text AS job_type, NULL::integer AS job_version,
       NULL::jsonb AS input, NULL::integer AS priority, NULL::timestamptz AS run_at,
       NULL::integer AS attempts, NULL::integer AS max_attempts, NULL::float8 AS timeout_s,
       NULL::bigint AS fence, NULL::text[] AS tags, NULL::uuid AS parent_run_id,
       NULL::uuid AS root_run_id, NULL::text AS dedupe_key, NULL::timestamptz AS created_at,
       NULL::timestamptz AS cancel_requested_at, NULL::timestamptz AS claimed_at,
       NULL::jsonb AS trace_context
FROM finished
UNION ALL
-- In claim order: an UPDATE returns its rows in the order its scan met them (the primary
-- key's or the heap's), and the worker starts them in the order they come back.
(SELECT true, id, pool, 'running', job_type, job_version, input, priority, run_at, attempts,
        max_attempts, timeout_s, fence, tags, parent_run_id, root_run_id, dedupe_key, created_at,
        cancel_requested_at, claimed_at, trace_context
 FROM claimed
 ORDER BY priority, run_at, id)

-- name: job_run_finish_one
-- A write-back job_run_finish_and_claim skipped because another transaction held the run's row
-- locked: this run alone, on a connection of its own, waiting for the lock (job_run_finish_fenced
-- without SKIP LOCKED). Waiting in the row's lock queue is what keeps the reaper off the run
-- once the lock goes: its SKIP LOCKED passes over a row someone waits for, and the run's lease
-- may have run out behind the lock. No row back: the run was taken over (LeaseLost).
-- The lock is taken first and the time read after it (`n` reads `writable`, and
-- clock_timestamp(), not the transaction's start): an UPDATE computes its new values before it
-- waits for the row, so a wait of 30 s would have dated the write 30 s back.
WITH writable AS (
    SELECT id FROM {schema}.job_run WHERE id = ANY (%(ids)s::uuid[]) FOR NO KEY UPDATE
),
n AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
      FROM (SELECT count(*) FROM writable) AS locked),
{job_run_finish_fenced}
SELECT id, pool, status FROM finished

-- name: job_run_leased_many
-- Which of these runs (ids with their fences) are still running under that fence. Asked about
-- the runs a write-back or a heartbeat came back without: one still held was skipped because
-- another transaction held its row locked (it is retried alone, waiting for the lock); one no
-- longer held was taken over (LeaseLost). Reads, locks nothing.
SELECT r.id FROM {schema}.job_run r
JOIN unnest(%(ids)s::uuid[], %(fences)s::bigint[]) AS v(id, fence)
  ON r.id = v.id AND r.fence = v.fence
WHERE r.id = ANY (%(ids)s::uuid[]) AND r.status = (SELECT 'running')

-- name: job_run_heartbeat_many
-- Extends the leases of the runs a worker is executing; `cancel_requested` carries cooperative
-- cancels whose NOTIFY was missed. Rows another transaction holds locked are skipped (SKIP
-- LOCKED), not waited for: waiting, the heartbeat held the locks it had taken on the worker's
-- other runs, whose write-backs then waited behind it (issue 31). A run missing from the result
-- was either skipped (job_run_leased_many tells: its lease is then extended alone, waiting for
-- the lock, by job_run_heartbeat_one) or taken over (its handler is cancelled).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
writable AS (
    SELECT id FROM {schema}.job_run WHERE id = ANY (%(ids)s::uuid[])
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.job_run r
SET lease_expires_at = n.now + make_interval(secs => %(lease_s)s), updated_at = n.now
FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[]) AS v(id, fence), n
-- By id, and `(SELECT 'running')`: as in job_run_finish_fenced.
WHERE r.id = ANY (ARRAY(SELECT id FROM writable)) AND r.id = v.id AND r.fence = v.fence
  AND r.status = (SELECT 'running')
RETURNING r.id, r.cancel_requested_at IS NOT NULL AS cancel_requested

-- name: job_run_heartbeat_one
-- A lease job_run_heartbeat_many skipped because another transaction held the row locked: this
-- run alone, waiting for the lock, so that the lease is extended the moment the lock goes,
-- before the reaper (whose SKIP LOCKED passes over a row someone waits for) can take a lease
-- that ran out behind the lock. No row back: the run was taken over. The lock is taken first
-- and the time read after it, as in job_run_finish_one: computed before the wait, the new lease
-- ran out as it was written (found by tests/integration/test_row_locks.py).
WITH locked AS (SELECT id FROM {schema}.job_run WHERE id = %(id)s FOR NO KEY UPDATE),
n AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now FROM locked)
UPDATE {schema}.job_run r
SET lease_expires_at = n.now + make_interval(secs => %(lease_s)s), updated_at = n.now
FROM n
WHERE r.id = %(id)s AND r.fence = %(fence)s AND r.status = (SELECT 'running')
RETURNING r.id, r.cancel_requested_at IS NOT NULL AS cancel_requested

-- name: job_run_reap_expired
-- Rescues runs whose worker stopped heartbeating. Expiry is checked again in the UPDATE itself,
-- so a heartbeat that commits first wins. Out of attempts (a poison job that kills its worker
-- every time) means dead-letter, never an endless loop.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
expired AS (
    SELECT id FROM {schema}.job_run, n
    WHERE status = 'running' AND lease_expires_at < n.now
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.job_run r
SET status = CASE WHEN r.cancel_requested_at IS NOT NULL THEN 'canceled'
                  WHEN r.attempts >= r.max_attempts THEN 'failed'
                  ELSE 'pending' END,
    run_at = n.now,
    error = jsonb_build_object(
        'message', 'lease expired: worker ' || coalesce(r.leased_by, '?') || ' stopped heartbeating',
        'type', 'LeaseExpired', 'retryable', r.attempts < r.max_attempts, 'attempt', r.attempts),
    finished_at = CASE WHEN r.cancel_requested_at IS NOT NULL OR r.attempts >= r.max_attempts
                       THEN n.now END,
    leased_by = NULL, lease_expires_at = NULL, updated_at = n.now
FROM expired, n
WHERE r.id = expired.id AND r.status = 'running' AND r.lease_expires_at < n.now
RETURNING r.id, r.pool, r.status

-- name: job_run_purge_finished
-- Deletes finished runs past their retention, oldest first, in one bounded batch.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
doomed AS (
    SELECT id FROM {schema}.job_run, n
    WHERE status IN ('completed', 'failed', 'timed_out', 'canceled')
      AND finished_at < n.now - make_interval(secs => CASE status
            WHEN 'completed' THEN %(completed_retention_s)s
            WHEN 'canceled' THEN %(canceled_retention_s)s
            ELSE %(failed_retention_s)s END)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.job_run r USING doomed WHERE r.id = doomed.id

-- name: job_run_apply_definitions
-- Runs enqueued while their type had no definition took the table defaults (`defaulted` says
-- which: pool 1, priority 2, max_attempts 4, concurrency limit 8: a webhook delivery's share of
-- 1, migration 0038). Once a definition exists they get its values, and its timeout_s and
-- version, which only a definition sets. Run by a worker after it upserts its
-- definitions, and by the purger for enqueues that committed just after. Reads only the partial
-- index job_run_defaulted_idx (empty unless runs were enqueued before their first worker), so the
-- claim pays nothing. Wakes the pools the runs are now in.
WITH applied AS (
    UPDATE {schema}.job_run r
    SET pool = CASE WHEN r.defaulted & 1 <> 0 THEN d.pool ELSE r.pool END,
        priority = CASE WHEN r.defaulted & 2 <> 0
                        THEN greatest(-1000, least(1000, d.priority_default)) ELSE r.priority END,
        max_attempts = CASE WHEN r.defaulted & 4 <> 0 THEN least(1000, d.max_attempts)
                            ELSE r.max_attempts END,
        concurrency_limit = CASE WHEN r.defaulted & 8 <> 0
                                 THEN coalesce(d.concurrency_limit, r.concurrency_limit)
                                 ELSE r.concurrency_limit END,
        timeout_s = coalesce(r.timeout_s, d.timeout_s), job_version = d.version,
        defaulted = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
    FROM {schema}.job d
    WHERE d.type = r.job_type AND r.defaulted IS NOT NULL
      AND r.status IN ('pending', 'running', 'waiting')
    RETURNING r.pool
)
SELECT pool, count(*) AS runs, pg_notify(%(channel)s, 'j:' || pool) AS notified
FROM applied GROUP BY pool ORDER BY pool

-- name: job_run_get
SELECT * FROM {schema}.job_run WHERE id = %(id)s

-- name: job_run_get_in_tenants
-- job_run_get for the admin API: a run of another tenant than `tenant_ids` (NULL: any) is no row,
-- as if it did not exist (a tenant-scoped token learns nothing about other tenants' runs).
SELECT * FROM {schema}.job_run
WHERE id = %(id)s AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))

-- fragment: job_run_filter
-- The runs job_run_list, job_run_list_ids, job_run_count and job_run_count_plan are about (each
-- column when its parameter is given). A time range (or an id prefix) is an id range
-- (UUIDv7: the first 48 bits are the milliseconds): `min_id` <= id < `before_id` walks only that
-- part of the primary key. `ids`: only those runs. An id's end (`id_suffix`) is looked up first,
-- in an index-only scan of that range (ARRAY(...), an InitPlan run once), and the runs ending so
-- are then read by id: checked on each row as a filter it fetched every row of the range from the
-- heap, 743 ms for a day of 10 million runs. Its whole bytes are compared as bytes (uuid_send, the
-- time of a bare scan); the text of the id is made only for the rows they match, for an odd digit:
-- right(id::text, 8) on each row took 0.7 us a row (bench/RESULTS.md, 2026-12-07).
(%(status)s::text IS NULL OR status = %(status)s)
  AND (%(job_type)s::text IS NULL OR job_type = %(job_type)s)
  AND (%(pool)s::text IS NULL OR pool = %(pool)s)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(scope_entity_type)s::text IS NULL OR scope_entity_type = %(scope_entity_type)s)
  AND (%(scope_entity_id)s::text IS NULL OR scope_entity_id = %(scope_entity_id)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))
  AND (%(trigger_source)s::text IS NULL OR trigger_source = %(trigger_source)s)
  AND (%(parent_run_id)s::uuid IS NULL OR parent_run_id = %(parent_run_id)s)
  AND (%(status_in)s::text[] IS NULL OR status = ANY (%(status_in)s::text[]))
  AND (%(leased_by)s::text IS NULL OR leased_by = %(leased_by)s)
  AND (%(due)s::text IS NULL OR (run_at <= coalesce(%(now)s::timestamptz, now())) = (%(due)s = 'now'))
  AND (%(finished_within_s)s::int IS NULL OR finished_at >= coalesce(%(now)s::timestamptz, now())
       - make_interval(secs => %(finished_within_s)s::int))
  AND (%(before_id)s::uuid IS NULL OR id < %(before_id)s::uuid)
  AND (%(min_id)s::uuid IS NULL OR id >= %(min_id)s::uuid)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY (%(ids)s::uuid[]))
  AND (%(id_suffix)s::text IS NULL OR id = ANY (ARRAY(
        SELECT ended.id FROM {schema}.job_run ended
        WHERE (%(before_id)s::uuid IS NULL OR ended.id < %(before_id)s::uuid)
          AND (%(min_id)s::uuid IS NULL OR ended.id >= %(min_id)s::uuid)
          AND CASE WHEN substring(uuid_send(ended.id) FROM 17 - length(%(id_suffix)s::text) / 2)
                        = decode(right(%(id_suffix)s::text, length(%(id_suffix)s::text) / 2 * 2), 'hex')
              THEN right(ended.id::text, length(%(id_suffix)s::text)) = %(id_suffix)s::text END)))
  AND (%(retried)s::boolean IS NULL OR (attempts > 0) = %(retried)s)

-- name: job_run_list
-- Newest first, keyset-paged on the time-ordered id: pass the last row's id to get the next page.
SELECT * FROM {schema}.job_run
WHERE {job_run_filter}
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_run_cancel
-- Pending and waiting runs are canceled at once; a running one gets a cancel request that its
-- worker acts on (told by NOTIFY, or by its next heartbeat when the NOTIFY is missed).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE {schema}.job_run r
SET status = CASE WHEN r.status = 'running' THEN r.status ELSE 'canceled' END,
    finished_at = CASE WHEN r.status = 'running' THEN r.finished_at ELSE n.now END,
    cancel_requested_at = coalesce(r.cancel_requested_at, n.now),
    updated_at = n.now
FROM n
WHERE r.id = %(id)s AND r.status IN ('pending', 'waiting', 'running')
  AND (%(tenant_ids)s::text[] IS NULL OR r.tenant_id = ANY (%(tenant_ids)s::text[]))
RETURNING r.*

-- name: job_run_retry
-- Puts a dead run back in line now, with room for at least one more attempt.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE {schema}.job_run r
SET status = 'pending', run_at = n.now, finished_at = NULL, cancel_requested_at = NULL,
    max_attempts = greatest(r.max_attempts, r.attempts + 1), updated_at = n.now
FROM n
WHERE r.id = %(id)s AND r.status IN ('failed', 'canceled', 'timed_out')
  AND (%(tenant_ids)s::text[] IS NULL OR r.tenant_id = ANY (%(tenant_ids)s::text[]))
RETURNING r.*

-- name: job_run_count_by_status
SELECT job_type, pool, status, count(*) AS count FROM {schema}.job_run
GROUP BY job_type, pool, status ORDER BY job_type, pool, status

-- name: job_run_oldest_runnable
-- Per pool: how long the oldest runnable run has waited (queue latency), from the claim index.
SELECT pool, count(*) AS runnable,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(run_at))::float8 AS oldest_age_s
FROM {schema}.job_run
WHERE status = 'pending' AND run_at <= coalesce(%(now)s::timestamptz, now())
GROUP BY pool ORDER BY pool

-- name: job_run_resume_due
-- Waiting runs whose wait is over go back in line: a durable sleep or a wait deadline that has
-- passed, or a signal that arrived while the run was still deciding to wait for it.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
due AS (
    SELECT w.id FROM {schema}.job_run w, n
    WHERE w.status = 'waiting'
      AND (w.run_at <= n.now
           OR (w.wait_kind = 'signal'
               AND EXISTS (SELECT 1 FROM {schema}.job_signal s WHERE s.token = w.wait_token)))
    ORDER BY w.run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.job_run r
SET status = 'pending', run_at = least(r.run_at, n.now), updated_at = n.now
FROM due, n
WHERE r.id = due.id AND r.status = 'waiting'
RETURNING r.id, r.pool

-- name: job_run_spawn_child
-- A parent starts a child, fenced on the parent's claim: marks the parent as having children,
-- inserts the child through _enqueue (same defaults and wake-up as any enqueue) and memoizes the
-- spawn as a step of the parent, all in one statement. No row back: the parent lost its lease.
-- The child belongs to the parent's tenant (a tenant-scoped token sees the whole tree).
WITH parent AS (
    UPDATE {schema}.job_run
    SET has_children = true
    -- `(SELECT 'running')`: by primary key, never every running run (job_run_finish_and_claim).
    WHERE id = %(run_id)s AND fence = %(fence)s AND status = (SELECT 'running')
    RETURNING id, coalesce(root_run_id, id) AS root_id, tenant_id
),
child AS (
    SELECT c.* FROM parent, LATERAL {schema}._enqueue(
        p_job_type => %(job_type)s, p_input => %(input)s::jsonb, p_run_at => %(run_at)s,
        p_priority => %(priority)s, p_tags => %(tags)s, p_id => %(child_id)s,
        p_trigger_source => 'parent', p_trigger_ref => parent.id::text,
        p_parent_run_id => parent.id, p_root_run_id => parent.root_id,
        p_parent_close_policy => %(close_policy)s, p_tenant_id => parent.tenant_id) AS c
),
step AS (
    INSERT INTO {schema}.job_step (run_id, step_id, seq, kind, status, output, attempts, attempt,
                                   started_at, finished_at)
    SELECT parent.id, %(step_id)s, %(seq)s, 'child', 'completed',
           jsonb_build_object('run_id', child.id), 1, %(attempt)s, now(), now()
    FROM parent, child
    ON CONFLICT (run_id, step_id) DO UPDATE
    SET output = excluded.output, seq = excluded.seq, attempt = excluded.attempt
    RETURNING run_id
)
SELECT child.id, child.pool FROM child, step

-- name: job_run_status_many
SELECT id, job_type, status, output, error FROM {schema}.job_run WHERE id = ANY(%(ids)s::uuid[])

-- name: job_run_list_children
-- A run's children (spawned with ctx.spawn_child), oldest first. UUIDv7 ids order by
-- millisecond only (random bits within one), so created_at decides first.
SELECT * FROM {schema}.job_run
WHERE parent_run_id = %(parent_run_id)s
  AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))
ORDER BY created_at, id
LIMIT %(limit)s
-- fragment: job_run_in_statuses
-- Runs in `statuses`, each status an arm of its own: with the statuses known, the arms of the
-- others fold away and those of live statuses read their partial indexes (a BitmapOr): counting
-- the live runs of one type among 10 million took 1.5 s as `status = ANY (...)` (a sequential
-- scan).
((status = 'pending' AND 'pending' = ANY (%(statuses)s::text[]))
 OR (status = 'waiting' AND 'waiting' = ANY (%(statuses)s::text[]))
 OR (status = 'running' AND 'running' = ANY (%(statuses)s::text[]))
 OR (status = 'failed' AND 'failed' = ANY (%(statuses)s::text[]))
 OR (status = 'canceled' AND 'canceled' = ANY (%(statuses)s::text[]))
 OR (status = 'timed_out' AND 'timed_out' = ANY (%(statuses)s::text[]))
 OR (status = 'completed' AND 'completed' = ANY (%(statuses)s::text[])))

-- name: job_run_list_ids
-- The ids job_run_list would list among the runs in `statuses`: what a bulk action by filter
-- works through, a keyset page at a time.
SELECT id FROM {schema}.job_run
WHERE {job_run_in_statuses} AND {job_run_filter}
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_run_count
-- How many runs in `statuses` match job_run_list's filter, counted up to `cap`: the number a bulk
-- action asks to confirm ("10,000 or more" past the cap), and the dashboard's counts.
SELECT count(*) AS n FROM (
    SELECT 1 FROM {schema}.job_run WHERE {job_run_in_statuses} AND {job_run_filter}
    LIMIT %(cap)s
) matching

-- name: job_run_count_plan
-- job_run_count's plan (EXPLAIN, not run): its cost says how much of the table the count would
-- read, and the row estimate under its LIMIT is the planner's guess at the number, which the
-- dashboard shows (marked as an estimate) instead of a count that would read too long: a rare
-- finished state under a filter spread over 10 million runs reads all of them (1-10 s).
EXPLAIN (FORMAT JSON) SELECT count(*) AS n FROM (
    SELECT 1 FROM {schema}.job_run WHERE {job_run_in_statuses} AND {job_run_filter}
    LIMIT %(cap)s
) matching

-- name: job_run_cancel_many
-- job_run_cancel for many ids at once (a bulk action): runs no longer cancelable are left out.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE {schema}.job_run r
SET status = CASE WHEN r.status = 'running' THEN r.status ELSE 'canceled' END,
    finished_at = CASE WHEN r.status = 'running' THEN r.finished_at ELSE n.now END,
    cancel_requested_at = coalesce(r.cancel_requested_at, n.now),
    updated_at = n.now
FROM n
WHERE r.id = ANY (%(ids)s::uuid[]) AND r.status IN ('pending', 'waiting', 'running')
  AND (%(tenant_ids)s::text[] IS NULL OR r.tenant_id = ANY (%(tenant_ids)s::text[]))
RETURNING r.id, r.pool, r.status

-- name: job_run_retry_many
-- job_run_retry for many ids at once (a bulk action): runs no longer retryable are left out.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE {schema}.job_run r
SET status = 'pending', run_at = n.now, finished_at = NULL, cancel_requested_at = NULL,
    max_attempts = greatest(r.max_attempts, r.attempts + 1), updated_at = n.now
FROM n
WHERE r.id = ANY (%(ids)s::uuid[]) AND r.status IN ('failed', 'canceled', 'timed_out')
  AND (%(tenant_ids)s::text[] IS NULL OR r.tenant_id = ANY (%(tenant_ids)s::text[]))
RETURNING r.id, r.pool, r.status

-- name: job_run_delete_many
-- Deletes many finished runs at once (a bulk action): runs not finished by now are left out
-- (cancel them first). Steps go with their run (ON DELETE CASCADE); children keep their rows,
-- their parent_run_id set to NULL.
DELETE FROM {schema}.job_run
WHERE id = ANY (%(ids)s::uuid[]) AND status IN ('completed', 'failed', 'canceled', 'timed_out')
  AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))
RETURNING id, pool, status

-- name: job_run_reschedule_many
-- Moves many pending runs to `run_at` (a bulk action): runs no longer pending are left out.
-- Earlier or later alike; the caller wakes the pools when runs became runnable sooner.
UPDATE {schema}.job_run
SET run_at = %(run_at)s, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = ANY (%(ids)s::uuid[]) AND status = 'pending'
  AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))
RETURNING id, pool, status

-- name: job_run_pool_overview
-- Per pool, what is live now and what failed in the last hour, each part read from its own
-- partial index (claim/scheduled, running, waiting, finished), so the cost follows the live
-- runs, not the finished millions. Oldest runnable age is the queue latency a new run meets.
-- The hour's bound is written out (not a CTE) so the planner estimates it from now(): see
-- job_run_series.
WITH live AS (
    SELECT pool, status, run_at FROM {schema}.job_run WHERE status = 'pending'
    UNION ALL
    SELECT pool, status, run_at FROM {schema}.job_run WHERE status = 'running'
    UNION ALL
    SELECT pool, status, run_at FROM {schema}.job_run WHERE status = 'waiting'
    UNION ALL
    SELECT pool, 'failed', run_at FROM {schema}.job_run
    WHERE status IN ('failed', 'timed_out')
      AND finished_at >= coalesce(%(now)s::timestamptz, now()) - interval '1 hour'
)
SELECT pool,
       count(*) FILTER (WHERE status = 'pending' AND run_at <= n.now) AS runnable,
       count(*) FILTER (WHERE status = 'pending' AND run_at > n.now) AS scheduled,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'waiting') AS waiting,
       count(*) FILTER (WHERE status = 'failed') AS failed_last_hour,
       coalesce(extract(epoch FROM n.now - min(run_at) FILTER (
           WHERE status = 'pending' AND run_at <= n.now))::float8, 0) AS oldest_runnable_age_s
FROM live, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) n
GROUP BY pool, n.now
ORDER BY pool

-- name: job_run_series
-- Per minute of the last `minutes` (oldest first, empty minutes included): runs completed and
-- failed (or timed out) that minute, and the queue latency of those that ran once (from run_at
-- to their start; p50 and p95 in seconds). Read from the finished-runs index by time.
-- The time bound is written out, not read from a CTE: the planner then estimates the rows from
-- now() (60,000 in the last hour of a 10-million-run table) instead of a third of the table,
-- whose cost switched JIT compilation on: 450 ms of compiling for 5 ms of work.
WITH minutes AS (
    SELECT generate_series(
               date_trunc('minute', coalesce(%(now)s::timestamptz, now()))
                   - make_interval(mins => %(minutes)s - 1),
               date_trunc('minute', coalesce(%(now)s::timestamptz, now())),
               interval '1 minute') AS minute
),
finished AS (
    SELECT date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE status = 'completed') AS completed,
           count(*) FILTER (WHERE status IN ('failed', 'timed_out')) AS failed,
           percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (
               ORDER BY greatest(0, extract(epoch FROM started_at - run_at))::float8)
               FILTER (WHERE attempts = 1 AND started_at IS NOT NULL) AS latency
    FROM {schema}.job_run
    WHERE status IN ('completed', 'failed', 'timed_out', 'canceled')
      AND finished_at >= date_trunc('minute', coalesce(%(now)s::timestamptz, now()))
                         - make_interval(mins => %(minutes)s - 1)
    GROUP BY 1
)
SELECT m.minute, coalesce(f.completed, 0) AS completed, coalesce(f.failed, 0) AS failed,
       f.latency[1] AS latency_p50_s, f.latency[2] AS latency_p95_s
FROM minutes m LEFT JOIN finished f ON f.minute = m.minute
ORDER BY m.minute

-- name: job_run_type_overview
-- Per job type, like job_run_pool_overview: the live runs by state (pending ones due now,
-- scheduled for later, or waiting to retry after a failed attempt) and the runs finished in the
-- last hour, each part read from its own partial index.
WITH live AS (
    SELECT job_type, status, run_at, attempts FROM {schema}.job_run WHERE status = 'pending'
    UNION ALL
    SELECT job_type, status, run_at, attempts FROM {schema}.job_run WHERE status = 'running'
    UNION ALL
    SELECT job_type, status, run_at, attempts FROM {schema}.job_run WHERE status = 'waiting'
    UNION ALL
    SELECT job_type, status, run_at, attempts FROM {schema}.job_run
    WHERE status IN ('completed', 'failed', 'timed_out', 'canceled')
      AND finished_at >= coalesce(%(now)s::timestamptz, now()) - interval '1 hour'
)
SELECT job_type,
       count(*) FILTER (WHERE status = 'pending' AND run_at <= n.now) AS pending,
       count(*) FILTER (WHERE status = 'pending' AND run_at > n.now AND attempts = 0)
           AS scheduled,
       count(*) FILTER (WHERE status = 'pending' AND run_at > n.now AND attempts > 0)
           AS retrying,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'waiting') AS waiting,
       count(*) FILTER (WHERE status = 'completed') AS completed_last_hour,
       count(*) FILTER (WHERE status IN ('failed', 'timed_out')) AS failed_last_hour,
       count(*) FILTER (WHERE status = 'canceled') AS canceled_last_hour
FROM live, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) n
GROUP BY job_type, n.now
ORDER BY job_type

-- name: job_run_read_no_jit
-- For the rest of this transaction, no JIT compilation: the dashboard's aggregates over partial
-- indexes are estimated above jit_above_cost (random heap reads of 40,000 pending runs: cost
-- 123,000) and compiled for 165 ms to run for 10 ms (measured on 10 million runs).
SELECT set_config('jit', 'off', true)

-- name: job_run_count_timeout
-- For the rest of this transaction (or savepoint), a statement stops after `ms` (57014): the
-- dashboard's counts share a time budget, and one that would read millions of runs is given up.
SELECT set_config('statement_timeout', %(ms)s, true)

-- name: job_run_await
-- Marks a run awaited (its final status change then NOTIFYs 'd:<id>', migration 0011) and
-- returns it as it is after any write in flight: the row lock orders this against a worker's
-- write-back, so either the write-back sees the mark and notifies, or this sees it finished.
--
-- A run still pending and due gets its pool's wake-up again, sent when this commits (`woke`):
-- the mark's row lock hides the run from a claim (SKIP LOCKED) for as long as this
-- transaction lasts, and a waiter marks the run just after its enqueue, exactly when the
-- enqueue's NOTIFY has a worker claiming. That claim came back without the run and the worker
-- idled until its poll: 5 of 60 runs awaited in their worker's process took the poll interval
-- (4.6-5.6 s, p50 110 ms; issue 31, tests/integration/test_await.py). The wake-up cannot be
-- missed the same way: it is delivered after the lock is gone.
UPDATE {schema}.job_run SET awaited = true WHERE id = %(id)s
RETURNING *,
          CASE WHEN status = 'pending' AND run_at <= now()
               THEN (SELECT 1 FROM pg_notify(%(channel)s, 'j:' || pool)) END AS woke

-- name: job_run_get_for_update
-- A run, locked for the rest of the transaction (a replay checks it, then changes it).
SELECT * FROM {schema}.job_run WHERE id = %(id)s
  AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))
FOR UPDATE

-- name: job_run_replay
-- Puts a finished run back in line now for a replay (its steps were trimmed by
-- job_step_replay_from in the same transaction): no output, error or wait, room for at least one
-- more attempt. A run that is not finished is left alone (no row back).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE {schema}.job_run r
SET status = 'pending', run_at = n.now, output = NULL, error = NULL, finished_at = NULL,
    cancel_requested_at = NULL, wait_kind = NULL, wait_token = NULL, waiting_on = NULL,
    max_attempts = greatest(r.max_attempts, r.attempts + 1), updated_at = n.now
FROM n
WHERE r.id = %(id)s AND r.status IN ('completed', 'failed', 'canceled', 'timed_out')
RETURNING r.*
