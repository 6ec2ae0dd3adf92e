-- Webhook delivery isolation and unsendable settings (issue 12, items 4 and 5).
--
-- 1. A per-endpoint share of the delivery slots, with the queue's own concurrency keys: the
--    `webhook.deliver` job definition carries the key template `webhook:{endpoint_id}` and the
--    limit (`webhooks.endpoint_concurrency`), and `_send_webhook` now applies them as `_enqueue`
--    does for every other type (resends and recoveries go through `_enqueue`). The keyed claim
--    (`_claim_keyed`) enforces the limit in SQL for every worker. Runs enqueued before this
--    migration have no key and are claimed as before.
-- 2. A circuit breaker per endpoint: `consecutive_failures` counts failed attempts since the
--    last success; at `webhooks.breaker_failures` the circuit opens until `circuit_open_until`
--    and the endpoint's pending deliveries are parked (their runs' run_at moved to then) instead
--    of holding slots. After it, one delivery takes the probe (it moves circuit_open_until to the
--    end of one attempt so the others wait); its success closes the circuit, its failure opens
--    it again. A send to an endpoint whose circuit is open is parked from the start.
-- 3. `invalid`: the error kind of an attempt that could not be sent at all (a URL or header the
--    transport cannot put on the wire); it ends the delivery at once.

ALTER TABLE webhook_endpoint
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0
        CHECK (consecutive_failures >= 0),
    ADD COLUMN circuit_open_until timestamptz;

-- The new check admits a superset of the old one, so every existing row satisfies it: NOT VALID
-- skips a scan of the whole attempt table under an exclusive lock; new rows are checked.
ALTER TABLE webhook_attempt DROP CONSTRAINT webhook_attempt_error_kind_check;
ALTER TABLE webhook_attempt ADD CONSTRAINT webhook_attempt_error_kind_check
    CHECK (error_kind IN ('timeout', 'connect', 'dns', 'tls', 'blocked', 'invalid')) NOT VALID;

-- 0006's set-based send, with the definition's concurrency key and limit on each run, and the
-- run of an endpoint whose circuit is open parked until it may be tried.
CREATE OR REPLACE FUNCTION _send_webhook(p_event_type text, p_payload jsonb,
                                         p_endpoint_id uuid DEFAULT NULL,
                                         p_idempotency_key text DEFAULT NULL)
RETURNS TABLE (message_id text, created boolean, deliveries integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
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
                             scope_entity_type, concurrency_key, concurrency_limit)
        SELECT uuid7(), 'webhook.deliver', coalesce(def.version, 1), t.input, 'webhooks',
               coalesce(def.priority_default, 0), t.run_at, 100, def.timeout_s, ARRAY[]::text[],
               'event', msg_id, def.scope_entity_type,
               _expand_template(def.concurrency_key_template, t.input),
               CASE WHEN def.concurrency_key_template IS NOT NULL
                    THEN coalesce(def.concurrency_limit, 1) END
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
$$;
