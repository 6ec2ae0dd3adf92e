-- Named queries of webhook attempts: one row per attempt at a delivery, with its outcome.

-- name: webhook_attempt_record_many
-- One statement per batch of attempts (concurrent deliveries' records are written together:
-- 8,000 single-attempt statements cost the server 252 us each): the attempt rows; each
-- delivery's latest state (`delivery_statuses` NULL keeps it: a failed manual resend changes
-- nothing; the last of a batch's attempts of one delivery wins); and each endpoint's failure
-- streak, written only when it changes (a hot endpoint's successes do not contend on its row):
-- the batch's last attempt of an endpoint decides, and a success earlier in the batch restarts
-- the streak. Endpoint rows are locked in id order (two workers' batches cannot deadlock on
-- them). The same write keeps the circuit breaker (0015): `consecutive_failures` counts the
-- failed attempts since the last success, and reaching `breaker_failures` (0: never) opens the
-- circuit for `breaker_cooldown_s` from now (again after a failed probe); a success closes it.
-- Returns, per position `ord`, when the endpoint's streak started (NULL after success) and
-- until when its circuit is open (NULL: closed).
--
-- It commits without waiting for the WAL flush (synchronous_commit off for this transaction
-- only), as a claim does. What it records is made durable by the run's write-back, which a
-- worker sends after it and commits synchronously: WAL is flushed in order, so that flush
-- carries this commit too. A PostgreSQL crash before it loses the record and leaves the run
-- to be claimed again, which sends the same webhook-id again, as a worker crash between the
-- POST and this record does. It saves a delivery batch the wait for one fsync.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                  set_config('synchronous_commit', 'off', true) AS commit_mode),
v AS (
    SELECT * FROM unnest(%(message_ids)s::text[], %(endpoint_ids)s::uuid[], %(run_ids)s::uuid[],
                         %(triggers)s::text[], %(attempts)s::integer[],
                         %(webhook_timestamps)s::bigint[], %(urls)s::text[],
                         %(status_codes)s::integer[], %(error_kinds)s::text[],
                         %(errors)s::text[], %(durations_ms)s::float8[],
                         %(response_bodies)s::text[], %(response_truncated)s::boolean[],
                         %(next_attempt_ats)s::timestamptz[], %(delivery_statuses)s::text[],
                         %(counted)s::integer[], %(succeeded)s::boolean[])
         WITH ORDINALITY AS v(message_id, endpoint_id, run_id, trigger, attempt, webhook_timestamp,
                              url, status_code, error_kind, error, duration_ms, response_body,
                              response_truncated, next_attempt_at, delivery_status, counted,
                              succeeded, ord)
), attempt AS (
    INSERT INTO {schema}.webhook_attempt (
        message_id, endpoint_id, run_id, trigger, attempt, webhook_timestamp, url, status_code,
        error_kind, error, duration_ms, response_body, response_truncated, next_attempt_at,
        created_at)
    SELECT message_id, endpoint_id, run_id, trigger, attempt, webhook_timestamp, url,
           status_code, error_kind, error, duration_ms, response_body, response_truncated,
           next_attempt_at, n.now
    FROM v, n ORDER BY v.ord
), per_delivery AS (
    SELECT message_id, endpoint_id, sum(counted)::integer AS counted,
           (array_agg(delivery_status ORDER BY ord DESC)
                FILTER (WHERE delivery_status IS NOT NULL))[1] AS status,
           (array_agg(status_code ORDER BY ord DESC))[1] AS status_code,
           (array_agg(error ORDER BY ord DESC))[1] AS error
    FROM v GROUP BY message_id, endpoint_id
), delivery AS (
    UPDATE {schema}.webhook_delivery d
    SET status = coalesce(p.status, d.status),
        attempts = d.attempts + p.counted,
        last_status_code = p.status_code,
        last_error = p.error,
        last_attempt_at = n.now,
        updated_at = n.now
    FROM per_delivery p, n
    WHERE d.message_id = p.message_id AND d.endpoint_id = p.endpoint_id
), per_endpoint AS (
    SELECT v.endpoint_id, (array_agg(v.succeeded ORDER BY v.ord DESC))[1] AS last_ok,
           bool_or(v.succeeded) AS any_ok,
           -- the failures after the batch's last success (all of them when there is none)
           (count(*) FILTER (WHERE NOT v.succeeded
                             AND v.ord > coalesce(k.ok_ord, 0)))::integer AS failures
    FROM v LEFT JOIN (SELECT endpoint_id, max(ord) AS ok_ord FROM v WHERE succeeded
                      GROUP BY endpoint_id) k ON k.endpoint_id = v.endpoint_id
    WHERE v.succeeded IS NOT NULL  -- NULL: neither (a 429 with Retry-After holds the endpoint)
    GROUP BY v.endpoint_id
), changing AS (
    SELECT e.id, f.failing_since, f.failures, o.open_until
    FROM {schema}.webhook_endpoint e JOIN per_endpoint p ON p.endpoint_id = e.id, n,
    LATERAL (SELECT CASE WHEN p.last_ok THEN NULL WHEN p.any_ok THEN n.now
                         ELSE coalesce(e.failing_since, n.now) END AS failing_since,
                    CASE WHEN p.any_ok THEN p.failures
                         ELSE e.consecutive_failures + p.failures END AS failures) f,
    LATERAL (SELECT CASE WHEN p.failures > 0 AND %(breaker_failures)s::integer > 0
                              AND f.failures >= %(breaker_failures)s::integer
                         THEN n.now + make_interval(secs => %(breaker_cooldown_s)s::float8)
                         WHEN p.any_ok THEN NULL
                         ELSE e.circuit_open_until END AS open_until) o
    WHERE (f.failing_since, f.failures, o.open_until)
          IS DISTINCT FROM (e.failing_since, e.consecutive_failures, e.circuit_open_until)
    ORDER BY e.id
    FOR UPDATE OF e
), streak AS (
    UPDATE {schema}.webhook_endpoint e
    SET failing_since = c.failing_since, consecutive_failures = c.failures,
        circuit_open_until = c.open_until
    FROM changing c
    WHERE e.id = c.id
    RETURNING e.id, e.failing_since, e.circuit_open_until
)
SELECT v.ord,
       CASE WHEN v.succeeded THEN NULL
            WHEN s.id IS NOT NULL THEN s.failing_since
            ELSE e.failing_since END AS failing_since,
       CASE WHEN s.id IS NOT NULL THEN s.circuit_open_until
            ELSE e.circuit_open_until END AS circuit_open_until
FROM v
LEFT JOIN streak s ON s.id = v.endpoint_id
LEFT JOIN {schema}.webhook_endpoint e ON e.id = v.endpoint_id

-- name: webhook_attempt_list
-- Every attempt of a message, oldest first. `attempt` numbers a delivery's attempts per trigger:
-- a scheduled one as stored (1, 2, ... within the current series; a recovery starts a new one),
-- a manual resend 1, 2, ... in the order they were made (what a manual row stores is the count
-- of scheduled attempts before it, which would repeat a scheduled attempt's number).
SELECT id, message_id, endpoint_id, run_id, trigger,
       CASE WHEN trigger = 'manual'
            THEN (row_number() OVER (PARTITION BY endpoint_id, trigger ORDER BY id))::integer
            ELSE attempt END AS attempt,
       webhook_timestamp, url, status_code, error_kind, error, duration_ms, response_body,
       response_truncated, next_attempt_at, created_at
FROM {schema}.webhook_attempt
WHERE message_id = %(message_id)s
ORDER BY id
LIMIT %(limit)s

-- name: webhook_attempt_count_by_run
-- How many attempts each of these webhook.deliver runs made (their messages' ids narrow the
-- search to the message index). A run's own `attempts` cannot say: a scheduled retry is a
-- snooze, which gives the attempt back.
SELECT run_id, count(*)::integer AS n
FROM {schema}.webhook_attempt
WHERE message_id = ANY (%(message_ids)s::text[]) AND run_id = ANY (%(run_ids)s::uuid[])
GROUP BY run_id

-- name: webhook_attempt_record_succeeded
-- The record of a batch of successful attempts, the common case, lighter than
-- webhook_attempt_record_many (no aggregation per delivery or endpoint, no answer to read
-- back): the attempt rows; each delivery succeeded (a scheduled attempt counted); and the
-- endpoints that were failing get their streak and circuit cleared, the others are not
-- touched (their rows locked in id order, as the full record locks them). Commits without
-- waiting for the WAL flush, as webhook_attempt_record_many does (its comment says why).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now,
                  set_config('synchronous_commit', 'off', true) AS commit_mode),
v AS (
    SELECT * FROM unnest(%(message_ids)s::text[], %(endpoint_ids)s::uuid[], %(run_ids)s::uuid[],
                         %(triggers)s::text[], %(attempts)s::integer[],
                         %(webhook_timestamps)s::bigint[], %(urls)s::text[],
                         %(status_codes)s::integer[], %(durations_ms)s::float8[],
                         %(response_bodies)s::text[], %(response_truncated)s::boolean[],
                         %(counted)s::integer[])
         AS v(message_id, endpoint_id, run_id, trigger, attempt, webhook_timestamp, url,
              status_code, duration_ms, response_body, response_truncated, counted)
), attempt AS (
    INSERT INTO {schema}.webhook_attempt (
        message_id, endpoint_id, run_id, trigger, attempt, webhook_timestamp, url, status_code,
        duration_ms, response_body, response_truncated, created_at)
    SELECT v.message_id, v.endpoint_id, v.run_id, v.trigger, v.attempt, v.webhook_timestamp,
           v.url, v.status_code, v.duration_ms, v.response_body, v.response_truncated, n.now
    FROM v, n
), delivery AS (
    UPDATE {schema}.webhook_delivery d
    SET status = 'succeeded', attempts = d.attempts + v.counted,
        last_status_code = v.status_code, last_error = NULL, last_attempt_at = n.now,
        updated_at = n.now
    FROM v, n
    WHERE d.message_id = v.message_id AND d.endpoint_id = v.endpoint_id
)
UPDATE {schema}.webhook_endpoint e
SET failing_since = NULL, consecutive_failures = 0, circuit_open_until = NULL
WHERE e.id = ANY (%(endpoint_ids)s::uuid[])
  AND (e.failing_since IS NOT NULL OR e.consecutive_failures > 0
       OR e.circuit_open_until IS NOT NULL)

-- name: webhook_attempt_partitions_make
-- Daily partitions of webhook_attempt (0031) from now's day (UTC) to `days` days after it:
-- the leader's retention pass keeps them made ahead. Returns how many were made.
SELECT {schema}._webhook_attempt_partitions_make(coalesce(%(now)s::timestamptz, now()),
                                                 %(days)s::integer) AS made

-- name: webhook_attempt_partitions_drop
-- Attempt retention without DELETE: drops (at most `limit`) the partitions whose every attempt
-- is older than `retention_s`, oldest first; one row per partition dropped, its rows estimated.
SELECT name, upper_bound, estimated_rows
FROM {schema}._webhook_attempt_partitions_drop(
    coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_s)s::float8),
    %(limit)s::integer)

-- name: webhook_attempt_purge_default
-- The attempts that landed in the default partition (no daily partition was made for their
-- day: the maintenance stopped, or a clock far ahead), past retention, deleted in a batch. It is
-- empty while the leader makes partitions ahead.
DELETE FROM {schema}.webhook_attempt_default
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}.webhook_attempt_default
    WHERE created_at < coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => %(retention_s)s::float8)
    LIMIT %(limit)s))
