-- send_many's statement, cheaper (issue 30: send_many >= 20,000 messages/s).
--
-- 1. uuid7() in PL/pgSQL. As a SQL function with a FROM clause it could not be inlined, so each
--    call ran the SQL-function executor: 7-9 us per id, two ids per message of a batch (the
--    message's and its run's) and one per enqueued run. PL/pgSQL evaluates the same expressions
--    as simple expressions: 3.3 us. One clock read per id, as before, so the ids one backend
--    makes one after another still increase.
-- 2. _send_webhooks_rows joined its own intermediate results to each other (messages to the
--    inserted deliveries by id, to the keys already known, to the first message of a key
--    repeated in the batch). Its inputs are function parameters, so the planner guesses ~10
--    rows for each and chooses nested loops: 500,000 comparisons per batch of 1,000 for the
--    delivery counts alone, as many again for idempotency keys. Now each message is one row
--    from start to end (window functions find a repeated key's first message), and the
--    delivery counts are one jsonb object (message id -> deliveries) looked up per message.

CREATE OR REPLACE FUNCTION uuid7() RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    us bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
BEGIN
    RETURN encode(
        overlay(uuid_send(gen_random_uuid())
                PLACING substring(int8send(us / 1000) FROM 3)
                     || substring(int4send(28672 + ((us % 1000) * 4096 / 1000)::integer) FROM 3)
                FROM 1 FOR 8),
        'hex')::uuid;
END
$$;

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
                             scope_entity_type, concurrency_key, concurrency_limit)
        SELECT uuid7(), 'webhook.deliver', coalesce(d.version, 1), t.input, 'webhooks',
               coalesce(d.priority_default, 0), t.run_at, 100, d.timeout_s, ARRAY[]::text[],
               'event', t.message_id, d.scope_entity_type,
               -- notifyq's own template, without a plpgsql call per run (~20 us each)
               CASE WHEN d.concurrency_key_template = 'webhook:{endpoint_id}'
                    THEN 'webhook:' || t.endpoint_id
                    ELSE _expand_template(d.concurrency_key_template, t.input) END,
               CASE WHEN d.concurrency_key_template IS NOT NULL
                    THEN coalesce(d.concurrency_limit, 1) END
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
