-- `_send_webhook` enqueued one run per endpoint through the plpgsql `_enqueue` (~190 us of
-- server time each: argument checks, a job-definition lookup, dedupe and concurrency branches
-- that a webhook run never takes) and inserted each delivery alone. Now the runs and the
-- deliveries are two set-based INSERTs and the workers are woken by one NOTIFY: a send fanned
-- out to 20 endpoints went from 4.2-6.7 ms to 1.5-1.6 ms (autocommit, commit included; to one
-- endpoint it stays 0.9 ms, most of it the commit's WAL flush). The event-type check moves from
-- a bounded repetition ({0,127}: one NFA state per repetition, compiled on every call) to a
-- character class and a length test.
-- Same signature, same results, same run rows (pool `webhooks`, 100 attempts, trigger `event`
-- with the message id, the rest from the `webhook.deliver` job definition).
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
        SELECT e.id FROM webhook_endpoint e
        WHERE e.disabled_at IS NULL
          AND CASE WHEN p_endpoint_id IS NOT NULL THEN e.id = p_endpoint_id
                   ELSE e.event_types IS NULL OR p_event_type = ANY (e.event_types) END
        ORDER BY e.id
    ), runs AS (
        INSERT INTO job_run (id, job_type, job_version, input, pool, priority, run_at,
                             max_attempts, timeout_s, tags, trigger_source, trigger_ref,
                             scope_entity_type)
        SELECT uuid7(), 'webhook.deliver', coalesce(def.version, 1),
               jsonb_build_object('message_id', msg_id, 'endpoint_id', t.id), 'webhooks',
               coalesce(def.priority_default, 0), now(), 100, def.timeout_s, ARRAY[]::text[],
               'event', msg_id, def.scope_entity_type
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
