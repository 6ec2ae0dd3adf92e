-- notifyq webhooks: endpoints, their signing secrets (keyring ciphertexts: a registered encrypted
-- column, re-encrypted by secret.reencrypt), messages, one delivery per (message, endpoint) and
-- every attempt. `notifyq.send_webhook(...)` sends from inside the caller's own transaction.

CREATE TABLE webhook_endpoint (
    id              uuid PRIMARY KEY DEFAULT uuid7(),
    url             text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    description     text NOT NULL DEFAULT '',
    -- NULL: every event type; otherwise the types this endpoint is sent on fan-out.
    event_types     text[],
    headers         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    disabled_at     timestamptz,
    disabled_reason text,
    -- The first failure of the current streak; a success clears it. Past the configured period
    -- (default 5 days) the endpoint is disabled.
    failing_since   timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Signing secrets (`whsec_...`), encrypted with the keyring; associated data is
-- (schema.webhook_secret, ciphertext, id). `expires_at` NULL is the current secret; a rotation
-- sets it on the old one to the end of the grace period, during which both sign.
CREATE TABLE webhook_secret (
    id          uuid PRIMARY KEY,
    endpoint_id uuid NOT NULL REFERENCES webhook_endpoint (id) ON DELETE CASCADE,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz
);
CREATE INDEX webhook_secret_endpoint_idx ON webhook_secret (endpoint_id, created_at);

-- A message: its body is exactly the bytes sent and signed (payload::text, UTF-8).
CREATE TABLE webhook_message (
    id              text PRIMARY KEY,
    event_type      text NOT NULL,
    body            text NOT NULL,
    endpoint_id     uuid,
    idempotency_key text UNIQUE,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per (message, endpoint): what the latest attempt said. `attempts` counts the scheduled
-- attempts of the current series (a recovery starts a new one); manual resends do not count.
CREATE TABLE webhook_delivery (
    message_id       text NOT NULL REFERENCES webhook_message (id) ON DELETE CASCADE,
    endpoint_id      uuid NOT NULL REFERENCES webhook_endpoint (id) ON DELETE CASCADE,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'succeeded', 'failed', 'canceled')),
    attempts         integer NOT NULL DEFAULT 0,
    run_id           uuid,
    last_status_code integer,
    last_error       text,
    last_attempt_at  timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, endpoint_id)
);
CREATE INDEX webhook_delivery_endpoint_idx ON webhook_delivery (endpoint_id, status);

-- Every attempt, scheduled or manual: status code or error kind, duration, the response body
-- (capped, raw bytes decoded as UTF-8 with replacement).
CREATE TABLE webhook_attempt (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id         text NOT NULL,
    endpoint_id        uuid NOT NULL,
    run_id             uuid,
    trigger            text NOT NULL CHECK (trigger IN ('scheduled', 'manual')),
    attempt            integer NOT NULL,
    webhook_timestamp  bigint NOT NULL,
    url                text NOT NULL,
    status_code        integer,
    error_kind         text CHECK (error_kind IN ('timeout', 'connect', 'dns', 'tls', 'blocked')),
    error              text,
    duration_ms        double precision NOT NULL,
    response_body      text,
    response_truncated boolean NOT NULL DEFAULT false,
    next_attempt_at    timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (message_id, endpoint_id) REFERENCES webhook_delivery ON DELETE CASCADE
);
CREATE INDEX webhook_attempt_message_idx ON webhook_attempt (message_id, id);

-- Send one message: to `endpoint_id` when given (its event-type filter does not apply), else to
-- every enabled endpoint subscribed to `event_type`. One `webhook.deliver` run per endpoint, in
-- the caller's transaction (workers are woken at commit). With `idempotency_key`, a second send
-- returns the first message (created = false) and enqueues nothing.
CREATE FUNCTION _send_webhook(p_event_type text, p_payload jsonb, p_endpoint_id uuid DEFAULT NULL,
                              p_idempotency_key text DEFAULT NULL)
RETURNS TABLE (message_id text, created boolean, deliveries integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    msg_id text;
    body_  text;
    n      integer := 0;
    ep     record;
    run    job_run;
BEGIN
    IF p_event_type IS NULL OR p_event_type !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$' THEN
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
    FOR ep IN
        SELECT e.id FROM webhook_endpoint e
        WHERE e.disabled_at IS NULL
          AND CASE WHEN p_endpoint_id IS NOT NULL THEN e.id = p_endpoint_id
                   ELSE e.event_types IS NULL OR p_event_type = ANY (e.event_types) END
        ORDER BY e.id
    LOOP
        run := _enqueue('webhook.deliver',
                        jsonb_build_object('message_id', msg_id, 'endpoint_id', ep.id),
                        p_pool => 'webhooks', p_max_attempts => 100,
                        p_trigger_source => 'event', p_trigger_ref => msg_id);
        INSERT INTO webhook_delivery (message_id, endpoint_id, run_id)
        VALUES (msg_id, ep.id, run.id);
        n := n + 1;
    END LOOP;
    RETURN QUERY SELECT msg_id, true, n;
END
$$;

-- The SQL entry point: `SELECT notifyq.send_webhook('invoice.paid', '{"id": 1}')` returns the
-- message id (the `webhook-id` header of every attempt).
CREATE FUNCTION send_webhook(event_type text, payload jsonb, endpoint_id uuid DEFAULT NULL,
                             idempotency_key text DEFAULT NULL)
RETURNS text
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT message_id FROM _send_webhook(event_type, payload, endpoint_id, idempotency_key)
$$;
