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

-- name: webhook_delivery_load
-- Everything one attempt needs, in one round trip: message, endpoint, delivery and the
-- ciphertexts of the secrets valid now (newest first).
SELECT m.id AS message_id, m.event_type, m.body, e.id AS endpoint_id, e.url, e.headers,
       e.disabled_at, e.disabled_reason, d.status, d.attempts,
       coalesce(s.ids, '{{}}') AS secret_ids, coalesce(s.ciphertexts, '{{}}') AS ciphertexts
FROM {schema}.webhook_delivery d
JOIN {schema}.webhook_message m ON m.id = d.message_id
JOIN {schema}.webhook_endpoint e ON e.id = d.endpoint_id
LEFT JOIN LATERAL (
    SELECT array_agg(ws.id ORDER BY ws.created_at DESC) AS ids,
           array_agg(ws.ciphertext ORDER BY ws.created_at DESC) AS ciphertexts
    FROM {schema}.webhook_secret ws
    WHERE ws.endpoint_id = e.id
      AND (ws.expires_at IS NULL OR ws.expires_at > coalesce(%(now)s::timestamptz, now()))
) s ON true
WHERE d.message_id = %(message_id)s AND d.endpoint_id = %(endpoint_id)s

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
                          p_trigger_source => 'manual', p_trigger_ref => d.message_id)).id
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
                                p_trigger_ref => d.message_id)).id
FROM picked p
WHERE d.message_id = p.message_id AND d.endpoint_id = p.endpoint_id
RETURNING d.message_id, d.run_id

-- name: webhook_attempt_record
-- One statement per attempt: the attempt row, the delivery's latest state (`delivery_status`
-- NULL keeps it: a failed manual resend changes nothing) and the endpoint's failure streak
-- (written only when it changes: a hot endpoint's successes do not contend on its row).
-- Returns when the streak started (NULL after a success).
WITH attempt AS (
    INSERT INTO {schema}.webhook_attempt (
        message_id, endpoint_id, run_id, trigger, attempt, webhook_timestamp, url, status_code,
        error_kind, error, duration_ms, response_body, response_truncated, next_attempt_at,
        created_at)
    VALUES (%(message_id)s, %(endpoint_id)s, %(run_id)s, %(trigger)s, %(attempt)s,
            %(webhook_timestamp)s, %(url)s, %(status_code)s, %(error_kind)s, %(error)s,
            %(duration_ms)s, %(response_body)s, %(response_truncated)s,
            %(next_attempt_at)s::timestamptz, coalesce(%(now)s::timestamptz, now()))
    RETURNING id
), delivery AS (
    UPDATE {schema}.webhook_delivery
    SET status = coalesce(%(delivery_status)s, status),
        attempts = attempts + %(counted)s,
        last_status_code = %(status_code)s,
        last_error = %(error)s,
        last_attempt_at = coalesce(%(now)s::timestamptz, now()),
        updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE message_id = %(message_id)s AND endpoint_id = %(endpoint_id)s
    RETURNING status
), streak AS (
    UPDATE {schema}.webhook_endpoint
    SET failing_since = CASE WHEN %(succeeded)s THEN NULL
                             ELSE coalesce(%(now)s::timestamptz, now()) END
    WHERE id = %(endpoint_id)s
      AND CASE WHEN %(succeeded)s THEN failing_since IS NOT NULL ELSE failing_since IS NULL END
    RETURNING failing_since
)
SELECT (SELECT id FROM attempt) AS attempt_id,
       CASE WHEN %(succeeded)s THEN NULL
            ELSE coalesce((SELECT failing_since FROM streak),
                          (SELECT failing_since FROM {schema}.webhook_endpoint
                           WHERE id = %(endpoint_id)s)) END AS failing_since

-- name: webhook_attempt_list
SELECT * FROM {schema}.webhook_attempt
WHERE message_id = %(message_id)s
ORDER BY id
LIMIT %(limit)s
