-- Named queries about runs. `{schema}` is filled with the quoted schema identifier once, when the
-- registry loads; every timestamp is `coalesce(%(now)s, now())` so tests can move time.

-- name: job_run_enqueue
SELECT * FROM {schema}._enqueue(
    %(job_type)s, %(input)s::jsonb, %(run_at)s, %(priority)s, %(pool)s, %(max_attempts)s,
    %(dedupe_key)s, %(tags)s, %(id)s, %(notify)s, NULL, %(trigger_source)s, %(trigger_ref)s)

-- name: job_run_insert_many
-- Bulk enqueue: the whole batch travels as one jsonb array (one json.dumps in Python, one parse
-- here), and the stored job definitions fill in the defaults exactly as _enqueue does.
-- The input is not sent back (the caller has it): returning every column cost 7 of 23 ms per
-- 1,000 rows.
INSERT INTO {schema}.job_run (id, job_type, job_version, input, pool, priority, run_at,
                              max_attempts, timeout_s, tags)
SELECT r.id, r.job_type, coalesce(d.version, 1), r.input, coalesce(r.pool, d.pool, 'default'),
       coalesce(r.priority, d.priority_default, 0), coalesce(r.run_at, now()),
       coalesce(r.max_attempts, d.max_attempts, 25), d.timeout_s, coalesce(r.tags, ARRAY[]::text[])
FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(id uuid, job_type text, input jsonb, pool text,
     priority integer, run_at timestamptz, max_attempts integer, tags text[])
LEFT JOIN {schema}.job d ON d.type = r.job_type
RETURNING id, job_type, job_version, status, pool, priority, run_at, attempts, max_attempts,
          timeout_s, tags, dedupe_key, trigger_source, created_at

-- name: job_run_notify
SELECT pg_notify(%(channel)s, payload) FROM unnest(%(payloads)s::text[]) AS payload

-- name: job_run_claim
-- Claims up to `limit` runnable runs of one pool, best priority then oldest run_at first.
-- SKIP LOCKED lets any number of producers claim concurrently without waiting on each other;
-- the fence grows by one so write-backs from any earlier claim of the same run match nothing.
-- `claimed_at` is the database's now: the worker times retries from it, not from its own clock.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
picked AS (
    SELECT id FROM {schema}.job_run, n
    WHERE status = 'pending' AND pool = %(pool)s AND run_at <= n.now
    ORDER BY priority, run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.job_run r
SET status = 'running', attempts = r.attempts + 1, fence = r.fence + 1,
    claimed_at = n.now, started_at = coalesce(r.started_at, n.now), leased_by = %(worker_id)s,
    lease_expires_at = n.now + make_interval(secs => %(lease_s)s), updated_at = n.now
FROM picked, n
WHERE r.id = picked.id
RETURNING r.id, r.job_type, r.job_version, r.input, r.pool, r.priority, r.run_at, r.attempts,
          r.max_attempts, r.timeout_s, r.fence, r.tags, r.parent_run_id, r.root_run_id,
          r.dedupe_key, r.created_at, r.cancel_requested_at, r.claimed_at

-- name: job_run_next_run_at
-- When the pool has nothing runnable now: seconds until the earliest scheduled run_at, so the
-- producer can wake exactly then instead of at the next poll. Computed by the database, whose
-- clock also decides runnability, so host clock skew cannot make a worker wake early or late.
SELECT extract(epoch FROM min(run_at) - coalesce(%(now)s::timestamptz, now()))::float8 AS delay_s
FROM {schema}.job_run
WHERE status = 'pending' AND pool = %(pool)s AND run_at > coalesce(%(now)s::timestamptz, now())

-- name: job_run_finish_many
-- The completer's one statement per batch. Each row is fenced (id + fence + still running), so a
-- write from a worker whose lease was taken over matches nothing and comes back missing.
-- `refund` gives back the attempt taken at claim (snooze, release at shutdown). A run whose
-- cancel was requested never goes back to pending (a retry, snooze or release would drop the
-- cancel): it is canceled instead.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
v AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[], %(statuses)s::text[],
                         %(outputs)s::text[], %(errors)s::text[], %(run_ats)s::timestamptz[],
                         %(refunds)s::integer[])
        AS v(id, fence, status, output, error, run_at, refund)
)
UPDATE {schema}.job_run r
SET status = CASE WHEN v.status = 'pending' AND r.cancel_requested_at IS NOT NULL
                  THEN 'canceled' ELSE v.status END,
    output = coalesce(v.output::jsonb, r.output),
    error = coalesce(v.error::jsonb, r.error),
    run_at = coalesce(v.run_at, r.run_at),
    attempts = r.attempts - v.refund,
    finished_at = CASE WHEN v.status IN ('completed', 'failed', 'timed_out', 'canceled')
                         OR r.cancel_requested_at IS NOT NULL
                       THEN n.now END,
    leased_by = NULL, lease_expires_at = NULL, updated_at = n.now
FROM v, n
WHERE r.id = v.id AND r.fence = v.fence AND r.status = 'running'
RETURNING r.id, r.pool, r.status

-- name: job_run_heartbeat_many
-- Extends the leases of the runs a worker is executing; a run missing from the result has been
-- taken over (its handler is cancelled), and `cancel_requested` carries cooperative cancels
-- whose NOTIFY was missed.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE {schema}.job_run r
SET lease_expires_at = n.now + make_interval(secs => %(lease_s)s), updated_at = n.now
FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[]) AS v(id, fence), n
WHERE r.id = v.id AND r.fence = v.fence AND r.status = 'running'
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

-- name: job_run_get
SELECT * FROM {schema}.job_run WHERE id = %(id)s

-- name: job_run_list
-- Newest first, keyset-paged on the time-ordered id: pass the last row's id to get the next page.
SELECT * FROM {schema}.job_run
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(job_type)s::text IS NULL OR job_type = %(job_type)s)
  AND (%(pool)s::text IS NULL OR pool = %(pool)s)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(before_id)s::uuid IS NULL OR id < %(before_id)s::uuid)
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
RETURNING r.*

-- name: job_run_retry
-- Puts a dead run back in line now, with room for at least one more attempt.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE {schema}.job_run r
SET status = 'pending', run_at = n.now, finished_at = NULL, cancel_requested_at = NULL,
    max_attempts = greatest(r.max_attempts, r.attempts + 1), updated_at = n.now
FROM n
WHERE r.id = %(id)s AND r.status IN ('failed', 'canceled', 'timed_out')
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

-- name: notifier_listen
LISTEN {schema}

-- name: notifier_ping
SELECT 1 AS ok
