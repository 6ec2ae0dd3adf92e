-- Ordered webhook endpoints (issue 34 item 2): an endpoint created or updated with
-- `ordered = true` gets its messages one at a time, in the order they were sent, each only after
-- the one before it succeeded or was given up.
--
-- Nothing in the claim changes. The endpoint's concurrency key (`webhook:<id>`) gets a row in
-- key_concurrency with its limit pinned to 1, which the adaptive share (key_concurrency_resize)
-- leaves alone; and a delivery of it that is to be tried again keeps its place at the head of
-- the key (its run is given the best priority before it snoozes:
-- webhook_delivery_keep_place), so the keyed claim (_claim_keyed, 0021), which takes a key's
-- head run (best priority, then oldest run_at) and passes over a key whose head is not due,
-- holds the later deliveries back until the head is over, without moving their run_at: when
-- the head succeeds the next one is due at once, with no backoff charged to it.

ALTER TABLE webhook_endpoint ADD COLUMN ordered boolean NOT NULL DEFAULT false;

-- A limit an operator or a feature set on purpose: adaptive resizing never changes it.
ALTER TABLE key_concurrency ADD COLUMN pinned boolean NOT NULL DEFAULT false;

-- An ordered endpoint's messages go in send order, and the claim orders a key's runs by
-- (priority, run_at, id): the runs of one send_many share their run_at (the transaction's
-- now()), so their ids must follow the batch's order. They did not: the runs' INSERT read
-- `targets` through a join with `job`, whose plan may return the rows in any order, and 200
-- messages of batches of 25 arrived with 9 before 8. 0024's _send_webhooks_rows with one line
-- added (marked 0029): the runs are inserted in (message, endpoint) order, and their uuid7()
-- ids, evaluated after the sort, grow in that order.
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
        ORDER BY t.n, t.endpoint_id   -- 0029: run ids in the batch's order (uuid7() after the sort)
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
