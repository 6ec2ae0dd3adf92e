-- Named queries of webhook deliveries: one per (message, endpoint), its latest state and run.

-- fragment: webhook_delivery_next
-- For a pending delivery `d` to endpoint `e`: when its next attempt is due (its run's run_at,
-- NULL once the run has started) and, while the endpoint's circuit is open, until when the
-- delivery is held (parked, see webhook_delivery_park).
SELECT r.run_at AS next_attempt_at,
       CASE WHEN e.disabled_at IS NULL
                 AND e.circuit_open_until > coalesce(%(now)s::timestamptz, now())
            THEN e.circuit_open_until END AS held_until
FROM {schema}.job_run r
WHERE d.status = 'pending' AND r.id = d.run_id AND r.status = 'pending'

-- name: webhook_delivery_copy
-- send_many by COPY (notifyq/_webhooks/fanout.py), last of its three COPYs: one row per delivery,
-- after its message and its run.
COPY {schema}.webhook_delivery (message_id, endpoint_id, run_id) FROM STDIN

-- name: webhook_delivery_copy_runs
-- send_many by COPY: the deliveries' runs, with every column _send_webhooks_rows sets (the
-- column order is notifyq/_webhooks/fanout.py's); the others take their defaults as there.
-- Keyed by endpoint even without a definition, `defaulted` 8 then (as migration 0038).
COPY {schema}.job_run (id, job_type, job_version, input, pool, priority, run_at, max_attempts,
                       timeout_s, tags, trigger_source, trigger_ref, scope_entity_type,
                       concurrency_key, concurrency_limit, defaulted) FROM STDIN

-- name: webhook_delivery_list
-- A message's deliveries. A pending one has its next attempt (its run's run_at) and, while its
-- endpoint's circuit is open, `held_until` (the fragment webhook_delivery_next).
SELECT d.*, e.url, x.next_attempt_at, x.held_until FROM {schema}.webhook_delivery d
JOIN {schema}.webhook_endpoint e ON e.id = d.endpoint_id
LEFT JOIN LATERAL ({webhook_delivery_next}) x ON true
WHERE d.message_id = %(message_id)s
ORDER BY d.endpoint_id

-- name: webhook_delivery_session_plans
-- The deliverer's own connections (notifyq/_webhooks/deliver.py: its batched load and records)
-- plan their prepared statements once, as the completer's do (worker_session_generic_plans
-- says why and what a kept plan risks). Under PostgreSQL's "auto" the records were planned
-- anew at nearly every execution (4,043 plans in 5,798 calls, ~250 us each, pg_stat_statements
-- with track_planning): the custom plan, which knows the arrays' lengths, always looks cheaper
-- than the generic one, which guesses ten rows. Every statement of this session looks rows up
-- by key, a few at a time, so besides sequential scans it rules out hash and merge joins: a
-- plan kept from an empty table then never reads a whole index to join a batch to it
-- (tests/db/test_webhook_session_plans.py plans each on empty tables, on 5 endpoints and on
-- 200). callgrind, the record of 5 successes (bench/statement_cost.py record_5's statement):
-- 2,565,917 server instructions a call planned by "auto", 1,497,649 on this session.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('enable_seqscan', 'off', false),
       set_config('enable_hashjoin', 'off', false),
       set_config('enable_mergejoin', 'off', false),
       set_config('jit', 'off', false)

-- name: webhook_delivery_load_many
-- Everything the attempts of a batch need, in one round trip: per (message, endpoint) pair, by
-- its position `ord` in the arrays: message, endpoint, delivery and the ciphertexts of the
-- secrets valid now (newest first). A pair with no delivery has no row. `run_id` is the
-- delivery's scheduled run: a scheduled attempt by any other run is refused (issue 31).
SELECT k.ord, m.id AS message_id, m.event_type, m.body, m.payload_dropped_at,
       e.id AS endpoint_id, e.url, e.headers,
       e.header_values,
       e.disabled_at, e.disabled_reason, e.consecutive_failures, e.circuit_open_until,
       e.ordered, d.status, d.attempts, d.run_id,
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

-- name: webhook_delivery_park
-- While an endpoint's circuit is open (0015) its pending deliveries wait for it to close instead
-- of each taking a worker slot to find it open: their runs' run_at moves to `until`. A run
-- already due later keeps its time.
UPDATE {schema}.job_run r
SET run_at = %(until)s::timestamptz, updated_at = coalesce(%(now)s::timestamptz, now())
FROM {schema}.webhook_delivery d
WHERE d.endpoint_id = %(endpoint_id)s AND d.status = 'pending'
  AND r.id = d.run_id AND r.status = 'pending' AND r.run_at < %(until)s::timestamptz
RETURNING r.id

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
                          -- its endpoint's key, definition or not (0038)
                          p_concurrency_key => 'webhook:' || d.endpoint_id,
                          -- built in: accepted before any worker has registered it
                          p_allow_unknown_type => true)).id
           AS run_id
FROM {schema}.webhook_delivery d
WHERE d.message_id = %(message_id)s
  AND (%(endpoint_id)s::uuid IS NULL OR d.endpoint_id = %(endpoint_id)s::uuid)
ORDER BY d.endpoint_id

-- name: webhook_delivery_recover
-- "Recover since T": the endpoint's failed deliveries whose last attempt is at or after T start a
-- new scheduled series (attempts from 0) with a new run each. A message whose payload was
-- dropped by retention (0031) has nothing left to send: its delivery stays failed.
WITH picked AS (
    SELECT message_id, endpoint_id FROM {schema}.webhook_delivery d
    WHERE endpoint_id = %(endpoint_id)s AND status = 'failed'
      AND coalesce(last_attempt_at, created_at) >= %(since)s::timestamptz
      AND NOT EXISTS (SELECT 1 FROM {schema}.webhook_message m
                      WHERE m.id = d.message_id AND m.payload_dropped_at IS NOT NULL)
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
                                p_concurrency_key => 'webhook:' || d.endpoint_id,
                                p_allow_unknown_type => true)).id
FROM picked p
WHERE d.message_id = p.message_id AND d.endpoint_id = p.endpoint_id
RETURNING d.message_id, d.run_id

-- name: webhook_delivery_list_by_endpoint
-- One endpoint's deliveries, newest message first, keyset-paged with `before` (a message id);
-- walks webhook_delivery_endpoint_message_idx (0008) instead of every delivery of the endpoint.
SELECT d.message_id AS id, m.event_type, m.created_at, octet_length(m.body) AS size,
       d.status, d.attempts, d.last_status_code, d.last_error, d.last_attempt_at,
       x.next_attempt_at, x.held_until
FROM {schema}.webhook_delivery d
JOIN {schema}.webhook_message m ON m.id = d.message_id
JOIN {schema}.webhook_endpoint e ON e.id = d.endpoint_id
LEFT JOIN LATERAL ({webhook_delivery_next}) x ON true
WHERE d.endpoint_id = %(endpoint_id)s
  AND (%(before)s::text IS NULL OR d.message_id < %(before)s::text)
ORDER BY d.message_id DESC
LIMIT %(limit)s

-- fragment: webhook_delivery_missing
-- "Replay missing since T" (issue 34 item 1): the messages sent at or after T that the endpoint
-- should have received (sent to it, or by event type with the endpoint subscribed to the type
-- now) and never got: no delivery (it was disabled when they were sent, or subscribed later) or
-- a canceled one (disabled while they waited). Message ids grow with time (msg_ + a UUIDv7), so
-- `from_id`, the id prefix of T, bounds the walk of webhook_message's primary key. A message
-- whose payload was dropped by retention (0031) cannot be replayed.
missing AS (
    SELECT m.id AS message_id
    FROM {schema}.webhook_message m
    JOIN {schema}.webhook_endpoint e ON e.id = %(endpoint_id)s
    LEFT JOIN {schema}.webhook_delivery d ON d.message_id = m.id AND d.endpoint_id = e.id
    WHERE m.id >= %(from_id)s AND m.created_at >= %(since)s::timestamptz
      AND m.payload_dropped_at IS NULL
      AND (m.endpoint_id = e.id
           OR (m.endpoint_id IS NULL
               AND (e.event_types IS NULL OR m.event_type = ANY (e.event_types))))
      AND (d.message_id IS NULL OR d.status = 'canceled')
    ORDER BY m.id
    LIMIT %(limit)s
)

-- name: webhook_delivery_missing_count
WITH {webhook_delivery_missing}
SELECT count(*)::integer AS missing FROM missing

-- name: webhook_delivery_replay_missing
-- Each missing message gets a delivery (a canceled one starts again) and a scheduled run. The
-- caller holds the endpoint's replay lock (webhook_delivery_replay_lock) first, in its own
-- statement, so two replays of one endpoint never enqueue the same message twice.
WITH {webhook_delivery_missing},
runs AS (
    SELECT x.message_id,
           ({schema}._enqueue('webhook.deliver',
                              jsonb_build_object('message_id', x.message_id,
                                                 'endpoint_id', %(endpoint_id)s::uuid),
                              p_pool => 'webhooks', p_max_attempts => 100,
                              p_trigger_source => 'manual', p_trigger_ref => x.message_id,
                              p_concurrency_key => 'webhook:' || %(endpoint_id)s::uuid,
                              p_allow_unknown_type => true)).id AS run_id
    FROM missing x
)
INSERT INTO {schema}.webhook_delivery AS d (message_id, endpoint_id, run_id, created_at,
                                            updated_at)
SELECT r.message_id, %(endpoint_id)s, r.run_id, coalesce(%(now)s::timestamptz, now()),
       coalesce(%(now)s::timestamptz, now())
FROM runs r
ON CONFLICT (message_id, endpoint_id) DO UPDATE
SET status = 'pending', attempts = 0, run_id = excluded.run_id, last_status_code = NULL,
    last_error = NULL, updated_at = excluded.updated_at
WHERE d.status = 'canceled'
RETURNING d.message_id, d.run_id

-- name: webhook_delivery_replay_lock
SELECT pg_advisory_xact_lock(hashtext('notifyq.replay'), hashtext(%(endpoint_id)s::text))

-- name: webhook_delivery_keep_place
-- An ordered endpoint's delivery that is to be tried again (a retry, or held by the circuit)
-- keeps its place at the head of the endpoint's line: before its run snoozes it is flagged
-- `key_head` (0039), which the keyed claim sorts first among the key's runs; the claim takes a
-- key's head run and passes over a key whose head is not due, so the endpoint's later
-- deliveries wait until this one is over. Its priority is left as it is. Written while the run
-- is running (its worker's own run: the snooze that follows is the fenced write-back); an
-- endpoint that is not ordered (any more) is left alone.
UPDATE {schema}.job_run r
SET key_head = true, updated_at = coalesce(%(now)s::timestamptz, now())
FROM {schema}.webhook_endpoint e
WHERE r.id = %(run_id)s AND r.status = 'running' AND e.id = %(endpoint_id)s AND e.ordered
RETURNING r.id

-- name: webhook_delivery_release_places
-- An endpoint that is no longer ordered: the waiting runs that kept their place at its head
-- (webhook_delivery_keep_place) lose the flag, so they no longer hold the others back. Reads
-- the head end of the key in job_run_claim_keyed_idx.
UPDATE {schema}.job_run r
SET key_head = false, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE r.status = 'pending' AND r.pool = 'webhooks' AND r.concurrency_key = %(key)s
  AND r.key_head
RETURNING r.id

-- name: webhook_delivery_give_up
-- An operator gives up a pending delivery that is waiting for its next attempt (not one being
-- attempted right now): the delivery fails with `reason` (`recover` can start it again), its run
-- is canceled, and the pool's workers are woken: an ordered endpoint's next message goes at
-- once. The run is locked first, so a claim taking it meanwhile makes this match nothing.
WITH target AS (
    SELECT d.message_id, d.endpoint_id, r.id AS run_id
    FROM {schema}.webhook_delivery d
    JOIN {schema}.job_run r ON r.id = d.run_id
    WHERE d.message_id = %(message_id)s AND d.endpoint_id = %(endpoint_id)s
      AND d.status = 'pending' AND r.status = 'pending'
    FOR UPDATE OF d, r
), delivery AS (
    UPDATE {schema}.webhook_delivery d
    SET status = 'failed', last_error = %(reason)s,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM target t
    WHERE d.message_id = t.message_id AND d.endpoint_id = t.endpoint_id
), run AS (
    UPDATE {schema}.job_run r
    SET status = 'canceled', finished_at = coalesce(%(now)s::timestamptz, now()),
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM target t
    WHERE r.id = t.run_id
    RETURNING r.id, r.pool
)
SELECT run.id AS run_id, pg_notify(%(channel)s, 'j:' || run.pool) AS woke FROM run
