-- Named queries of webhook messages, their deliveries (one per endpoint) and attempts.

-- name: webhook_message_send
-- In the caller's transaction when given its connection (see notifyq.send_webhook).
SELECT message_id, created, deliveries
FROM {schema}._send_webhook(%(event_type)s, %(payload)s::jsonb, %(endpoint_id)s::uuid,
                            %(idempotency_key)s)

-- name: webhook_message_get
SELECT * FROM {schema}.webhook_message WHERE id = %(id)s

-- name: webhook_delivery_list
SELECT d.*, e.url FROM {schema}.webhook_delivery d
JOIN {schema}.webhook_endpoint e ON e.id = d.endpoint_id
WHERE d.message_id = %(message_id)s
ORDER BY d.endpoint_id

-- name: webhook_delivery_load_many
-- Everything the attempts of a batch need, in one round trip: per (message, endpoint) pair, by
-- its position `ord` in the arrays: message, endpoint, delivery and the ciphertexts of the
-- secrets valid now (newest first). A pair with no delivery has no row.
SELECT k.ord, m.id AS message_id, m.event_type, m.body, e.id AS endpoint_id, e.url, e.headers,
       e.disabled_at, e.disabled_reason, d.status, d.attempts,
       coalesce(s.ids, '{{}}') AS secret_ids, coalesce(s.ciphertexts, '{{}}') AS ciphertexts
FROM unnest(%(message_ids)s::text[], %(endpoint_ids)s::uuid[])
     WITH ORDINALITY AS k(message_id, endpoint_id, ord)
JOIN {schema}.webhook_delivery d ON d.message_id = k.message_id AND d.endpoint_id = k.endpoint_id
JOIN {schema}.webhook_message m ON m.id = d.message_id
JOIN {schema}.webhook_endpoint e ON e.id = d.endpoint_id
LEFT JOIN LATERAL (
    SELECT array_agg(ws.id ORDER BY ws.created_at DESC) AS ids,
           array_agg(ws.ciphertext ORDER BY ws.created_at DESC) AS ciphertexts
    FROM {schema}.webhook_secret ws
    WHERE ws.endpoint_id = e.id
      AND (ws.expires_at IS NULL OR ws.expires_at > coalesce(%(now)s::timestamptz, now()))
) s ON true

-- name: webhook_delivery_skip
-- A scheduled delivery to a disabled endpoint ends here.
UPDATE {schema}.webhook_delivery
SET status = 'canceled', last_error = %(reason)s, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE message_id = %(message_id)s AND endpoint_id = %(endpoint_id)s AND status = 'pending'

-- name: webhook_delivery_cancel_pending
-- Stops an endpoint's pending deliveries (410 Gone, or disabled after failing too long): their
-- rows are canceled and so are their runs that are still waiting for a worker.
WITH d AS (
    UPDATE {schema}.webhook_delivery
    SET status = 'canceled', last_error = %(reason)s,
        updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE endpoint_id = %(endpoint_id)s AND status = 'pending'
    RETURNING run_id
)
UPDATE {schema}.job_run r
SET status = 'canceled', finished_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM d
WHERE r.id = d.run_id AND r.status = 'pending'
RETURNING r.id

-- name: webhook_delivery_resend
-- A manual attempt per delivery of the message (or of one endpoint): a run of its own that
-- schedules no retries.
SELECT d.endpoint_id,
       ({schema}._enqueue('webhook.deliver',
                          jsonb_build_object('message_id', d.message_id,
                                             'endpoint_id', d.endpoint_id,
                                             'trigger', 'manual'),
                          p_pool => 'webhooks', p_max_attempts => 3,
                          p_trigger_source => 'manual', p_trigger_ref => d.message_id,
                          -- built in: accepted before any worker has registered it
                          p_allow_unknown_type => true)).id
           AS run_id
FROM {schema}.webhook_delivery d
WHERE d.message_id = %(message_id)s
  AND (%(endpoint_id)s::uuid IS NULL OR d.endpoint_id = %(endpoint_id)s::uuid)
ORDER BY d.endpoint_id

-- name: webhook_delivery_recover
-- "Recover since T": the endpoint's failed deliveries whose last attempt is at or after T start a
-- new scheduled series (attempts from 0) with a new run each.
WITH picked AS (
    SELECT message_id, endpoint_id FROM {schema}.webhook_delivery
    WHERE endpoint_id = %(endpoint_id)s AND status = 'failed'
      AND coalesce(last_attempt_at, created_at) >= %(since)s::timestamptz
    ORDER BY message_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.webhook_delivery d
SET status = 'pending', attempts = 0, updated_at = coalesce(%(now)s::timestamptz, now()),
    run_id = ({schema}._enqueue('webhook.deliver',
                                jsonb_build_object('message_id', d.message_id,
                                                   'endpoint_id', d.endpoint_id),
                                p_pool => 'webhooks', p_max_attempts => 100,
                                p_trigger_source => 'manual',
                                p_trigger_ref => d.message_id,
                                p_allow_unknown_type => true)).id
FROM picked p
WHERE d.message_id = p.message_id AND d.endpoint_id = p.endpoint_id
RETURNING d.message_id, d.run_id

-- name: webhook_attempt_record_many
-- One statement per batch of attempts (concurrent deliveries' records are written together:
-- 8,000 single-attempt statements cost the server 252 us each): the attempt rows; each
-- delivery's latest state (`delivery_statuses` NULL keeps it: a failed manual resend changes
-- nothing; the last of a batch's attempts of one delivery wins); and each endpoint's failure
-- streak, written only when it changes (a hot endpoint's successes do not contend on its row):
-- the batch's last attempt of an endpoint decides, and a success earlier in the batch restarts
-- the streak. Endpoint rows are locked in id order (two workers' batches cannot deadlock on
-- them). Returns, per position `ord`, when the endpoint's streak started (NULL after success).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
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
    SELECT endpoint_id, (array_agg(succeeded ORDER BY ord DESC))[1] AS last_ok,
           bool_or(succeeded) AS any_ok
    FROM v GROUP BY endpoint_id
), changing AS (
    SELECT e.id, CASE WHEN p.last_ok THEN NULL WHEN p.any_ok THEN n.now
                      ELSE coalesce(e.failing_since, n.now) END AS failing_since
    FROM {schema}.webhook_endpoint e JOIN per_endpoint p ON p.endpoint_id = e.id, n
    WHERE (CASE WHEN p.last_ok THEN NULL WHEN p.any_ok THEN n.now
                ELSE coalesce(e.failing_since, n.now) END) IS DISTINCT FROM e.failing_since
    ORDER BY e.id
    FOR UPDATE OF e
), streak AS (
    UPDATE {schema}.webhook_endpoint e
    SET failing_since = c.failing_since
    FROM changing c
    WHERE e.id = c.id
    RETURNING e.id, e.failing_since
)
SELECT v.ord,
       CASE WHEN v.succeeded THEN NULL
            WHEN s.id IS NOT NULL THEN s.failing_since
            ELSE e.failing_since END AS failing_since
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
