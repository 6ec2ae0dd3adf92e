-- Webhook runs keyed by their endpoint whether or not a worker ever ran (issue 35, item A).
--
-- A delivery run took its concurrency key and limit from the `webhook.deliver` definition,
-- which a worker writes when it starts; a message sent into a database no worker had yet
-- started on made runs without a key, which the keyed claim never sees: no per-endpoint
-- share, no order for an ordered endpoint, no rate limit. Seeding the definition here is not
-- an option: a definition in `job` is what tells enqueue that workers exist and unknown types
-- are to be refused (0007).
--
-- The key of a delivery is notifyq's own (`webhook:<endpoint id>`, ENDPOINT_KEY in
-- notifyq/_webhooks/service.py, not something a definition can change), so the send
-- functions now write it themselves, definition or not. What only the definition knows, the
-- share a key starts with (`webhooks.endpoint_concurrency`) and the timeout, is taken from it
-- when it is there; when it is not, the run gets a share of 1 (the strictest) and `defaulted`
-- bit 8, "concurrency limit", so job_run_apply_definitions gives it the definition's limit, its
-- timeout and version when the first worker registers (before that worker's first claim).
-- The runs of resend, recover and replay_missing (_enqueue) name their key in the query.

CREATE OR REPLACE FUNCTION _send_webhook(p_event_type text, p_payload jsonb,
                                         p_endpoint_id uuid DEFAULT NULL,
                                         p_idempotency_key text DEFAULT NULL)
RETURNS TABLE (message_id text, created boolean, deliveries integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $_$
DECLARE
    msg_id text;
    body_  text;
    n      integer;
    def    job;
BEGIN
    IF p_event_type IS NULL OR p_event_type !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'
       OR length(p_event_type) > 128 THEN
        RAISE EXCEPTION 'notifyq: invalid event type %: it must match ^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$',
            coalesce(quote_literal(p_event_type), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL OR jsonb_typeof(p_payload) NOT IN ('object', 'array') THEN
        RAISE EXCEPTION 'notifyq: webhook payload must be a JSON object or array'
            USING ERRCODE = '22023';
    END IF;
    body_ := p_payload::text;
    IF octet_length(body_) > 262144 THEN
        RAISE EXCEPTION 'notifyq: webhook payload is % bytes; the limit is 262144 bytes',
            octet_length(body_) USING ERRCODE = '54000';
    END IF;
    IF p_idempotency_key IS NOT NULL THEN
        IF length(p_idempotency_key) NOT BETWEEN 1 AND 256 THEN
            RAISE EXCEPTION 'notifyq: idempotency_key must be 1 to 256 characters'
                USING ERRCODE = '22023';
        END IF;
        PERFORM pg_advisory_xact_lock(hashtext('notifyq.webhook'), hashtext(p_idempotency_key));
        SELECT m.id INTO msg_id FROM webhook_message m WHERE m.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN QUERY SELECT msg_id, false,
                (SELECT count(*)::integer FROM webhook_delivery d WHERE d.message_id = msg_id);
            RETURN;
        END IF;
    END IF;
    IF p_endpoint_id IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM webhook_endpoint e WHERE e.id = p_endpoint_id) THEN
        RAISE EXCEPTION 'notifyq: no webhook endpoint %', p_endpoint_id USING ERRCODE = '22023';
    END IF;
    msg_id := 'msg_' || replace(uuid7()::text, '-', '');
    INSERT INTO webhook_message (id, event_type, body, endpoint_id, idempotency_key)
    VALUES (msg_id, p_event_type, body_, p_endpoint_id, p_idempotency_key);
    SELECT * INTO def FROM job WHERE type = 'webhook.deliver';
    WITH targets AS (
        SELECT e.id, jsonb_build_object('message_id', msg_id, 'endpoint_id', e.id) AS input,
               greatest(now(), e.circuit_open_until) AS run_at
        FROM webhook_endpoint e
        WHERE e.disabled_at IS NULL
          AND CASE WHEN p_endpoint_id IS NOT NULL THEN e.id = p_endpoint_id
                   ELSE e.event_types IS NULL OR p_event_type = ANY (e.event_types) END
        ORDER BY e.id
    ), runs AS (
        INSERT INTO job_run (id, job_type, job_version, input, pool, priority, run_at,
                             max_attempts, timeout_s, tags, trigger_source, trigger_ref,
                             scope_entity_type, concurrency_key, concurrency_limit, defaulted)
        SELECT uuid7(), 'webhook.deliver', coalesce(def.version, 1), t.input, 'webhooks',
               coalesce(def.priority_default, 0), t.run_at, 100, def.timeout_s, ARRAY[]::text[],
               'event', msg_id, def.scope_entity_type,
               'webhook:' || t.id, coalesce(def.concurrency_limit, 1),  -- 0038
               CASE WHEN def.type IS NULL THEN 8::smallint END
        FROM targets t
        RETURNING id, (input ->> 'endpoint_id')::uuid AS endpoint_id
    )
    INSERT INTO webhook_delivery (message_id, endpoint_id, run_id)
    SELECT msg_id, r.endpoint_id, r.id FROM runs r;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify(current_schema(), 'j:webhooks');
    END IF;
    RETURN QUERY SELECT msg_id, true, n;
END
$_$;

CREATE OR REPLACE FUNCTION _send_webhooks_rows(p_event_types text[], p_payloads text[],
                                               p_endpoint_ids uuid[], p_idempotency_keys text[])
RETURNS TABLE (ord integer, message_id text, created boolean, deliveries integer)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH m AS (
        SELECT u.event_type, u.payload::jsonb AS payload, u.endpoint_id, u.key,
               u.n::integer AS n, (min(u.n) OVER (PARTITION BY u.key))::integer AS key_first
        FROM unnest(p_event_types, p_payloads, p_endpoint_ids, p_idempotency_keys)
             WITH ORDINALITY AS u(event_type, payload, endpoint_id, key, n)
    ), b AS (          -- per message: the one a key sent before names, or a new id (a key
                       -- repeated in the batch makes one message, the first)
        SELECT m.*, w.id AS known_id,
               CASE WHEN w.id IS NULL AND (m.key IS NULL OR m.n = m.key_first)
                    THEN 'msg_' || replace(uuid7()::text, '-', '') END AS new_id
        FROM m LEFT JOIN webhook_message w ON w.idempotency_key = m.key
        ORDER BY m.n   -- ids in the batch's order (volatile uuid7() is evaluated after the sort)
    ), answer AS (     -- ... and the id it answers with
        SELECT b.*, coalesce(b.known_id, b.new_id,
                             max(b.new_id) OVER (PARTITION BY b.key)) AS id
        FROM b
    ), fresh AS (
        SELECT a.* FROM answer a WHERE a.new_id IS NOT NULL
    ), messages AS (
        INSERT INTO webhook_message (id, event_type, body, endpoint_id, idempotency_key)
        SELECT f.id, f.event_type, f.payload::text, f.endpoint_id, f.key FROM fresh f
        ORDER BY f.n
    ), targets AS (
        SELECT f.id AS message_id, f.n, e.id AS endpoint_id,
               jsonb_build_object('message_id', f.id, 'endpoint_id', e.id) AS input,
               greatest(now(), e.circuit_open_until) AS run_at
        FROM fresh f
        JOIN webhook_endpoint e
          ON e.disabled_at IS NULL
         AND CASE WHEN f.endpoint_id IS NOT NULL THEN e.id = f.endpoint_id
                  ELSE e.event_types IS NULL OR f.event_type = ANY (e.event_types) END
        ORDER BY f.n, e.id
    ), runs AS (
        INSERT INTO job_run (id, job_type, job_version, input, pool, priority, run_at,
                             max_attempts, timeout_s, tags, trigger_source, trigger_ref,
                             scope_entity_type, concurrency_key, concurrency_limit, defaulted)
        SELECT uuid7(), 'webhook.deliver', coalesce(d.version, 1), t.input, 'webhooks',
               coalesce(d.priority_default, 0), t.run_at, 100, d.timeout_s, ARRAY[]::text[],
               'event', t.message_id, d.scope_entity_type,
               'webhook:' || t.endpoint_id, coalesce(d.concurrency_limit, 1),  -- 0038
               CASE WHEN d.type IS NULL THEN 8::smallint END
        FROM targets t LEFT JOIN job d ON d.type = 'webhook.deliver'
        RETURNING id, input ->> 'message_id' AS message_id,
                  (input ->> 'endpoint_id')::uuid AS endpoint_id
    ), delivered AS (
        INSERT INTO webhook_delivery (message_id, endpoint_id, run_id)
        SELECT r.message_id, r.endpoint_id, r.id FROM runs r
        RETURNING webhook_delivery.message_id
    ), counted AS (    -- one row: message id -> its new deliveries
        SELECT jsonb_object_agg(c.message_id, c.deliveries) AS by_id
        FROM (SELECT d.message_id, count(*)::integer AS deliveries FROM delivered d
              GROUP BY d.message_id) c
    )
    SELECT a.n, a.id, a.new_id IS NOT NULL,
           coalesce((c.by_id ->> a.id)::integer, CASE WHEN a.known_id IS NOT NULL THEN
               (SELECT count(*)::integer FROM webhook_delivery d WHERE d.message_id = a.known_id)
               END, 0)
    FROM answer a CROSS JOIN counted c
    ORDER BY a.n;
$$;

