-- Webhook delivery at the speed of the queue beneath it (issue 30).
--
-- 1. The keyed claim finds its keys by a skip scan, not by grouping the whole backlog.
--    `_claim_keyed` listed the keys with pending runs by `GROUP BY concurrency_key` over every
--    due pending keyed run of the pool: a webhook backlog of 3,000 messages to one endpoint was
--    read in full by every claim, which then took at most the endpoint's 5 free slots. Now one
--    index probe per key (job_run_claim_keyed_idx, as the rate-limited half already does) and
--    one more for the key's head run: the claim's cost follows the number of keys, not the
--    length of their backlogs. And one statement for every key, not three or four per key
--    (bench/statement_cost.py, server instructions per call, 5 runs claimed of one key with
--    3,000 pending: 15.9M -> ; 100 runs of 20 keys with 1,000 each: 131.9M -> ;
--    db/README.md). A key whose head
--    run (best priority, then oldest run_at) is not due yet is passed over until it is: a
--    later, lower-priority run of the same key waits for it.
-- 2. A key's limit can change while its runs wait: `key_concurrency` holds a key's current
--    limit, which overrides the one its runs were enqueued with. Webhooks keep each endpoint's
--    adaptive share there (grown while the endpoint answers fast, halved when it is slow, times
--    out, throttles or fails: notifyq/_webhooks/deliver.py); any feature may.
-- 3. `_send_webhook` (one message) fills in its runs' concurrency key itself, instead of a
--    plpgsql `_expand_template` call per run (single send, server time: the fan-out statement
--    265 -> 'us).
-- 4. `_send_webhooks`: many messages in one statement (`app.webhooks.send_many`, the batch
--    route): messages, their runs and deliveries inserted set-based, one NOTIFY. Idempotency
--    keys behave as in `_send_webhook` (a key seen before returns that message; a key repeated
--    inside the batch makes one message), locked in key order so concurrent batches cannot
--    deadlock.

CREATE TABLE key_concurrency (
    key text PRIMARY KEY,
    concurrency_limit integer NOT NULL CHECK (concurrency_limit >= 1),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- What a concurrency key has free now: 0 when another claim is deciding it (a try-lock, never a
-- wait), else its limit minus its running runs, counted after the lock. plpgsql so that the count
-- reads a snapshot taken after the lock, not the calling statement's (a claim that committed
-- meanwhile counts), and so that it is never inlined.
CREATE FUNCTION _concurrency_room(p_key text, p_limit integer) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('notifyq.concurrency'), hashtext(p_key)) THEN
        RETURN 0;
    END IF;
    RETURN greatest(0, p_limit - (SELECT count(*)::integer FROM job_run
                                  WHERE concurrency_key = p_key AND status = 'running'));
END
$$;

-- enable_sort = off: the skip scans and the head lookups must walk job_run_claim_keyed_idx (and
-- job_run_claim_rated_idx) in its order. A plan made while job_run was empty (a worker's first
-- claims; the completer keeps generic plans) read them from job_run_scheduled_idx instead,
-- every pending run of the pool filtered and sorted per key: 100 ms a claim with 6,000 pending
-- deliveries to 20 endpoints, against 1-2 ms. Without a sort to fall back on, only the index
-- that gives the order is left (tests/db/test_keyed_claim_queries.py reads the plans). jit = off:
-- the cost of the sort that cannot be avoided (across keys) then counts as disabled, far above
-- jit_above_cost, and compiling the statement took 0.4-0.8 s a claim.
CREATE OR REPLACE FUNCTION _claim_keyed(p_pool text, p_limit integer, p_worker_id text,
                                        p_lease_s double precision, p_now timestamptz)
RETURNS SETOF job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    now_      timestamptz := coalesce(p_now, now());
    k         record;
    running   integer;
    free      integer;
    claimed   integer;
    remaining integer := p_limit;
    types_paused boolean;
    used      integer;
    step      bigint;
BEGIN
    IF EXISTS (SELECT FROM pause WHERE kind = 'pool' AND name = p_pool) THEN
        RETURN;
    END IF;
    types_paused := EXISTS (SELECT FROM pause WHERE kind = 'type');
    -- Concurrency keys, in one statement however many keys there are (three or four
    -- statements per key before): the keys with due runs by a skip scan of
    -- job_run_claim_keyed_idx, each with its head run and its limit (key_concurrency's, else the
    -- head's), due heads first; then, key after key until the claim is full, what the key has
    -- free (_concurrency_room: a try-lock, skipped when another claim holds it, and a count of
    -- its running runs taken after the lock) and that many of its runs. The nested loop stops
    -- at the outer LIMIT, so no key beyond it is locked or counted and no row beyond it locked
    -- (an ORDER BY there would lock every key's share first).
    IF remaining > 0 THEN
        RETURN QUERY
            WITH RECURSIVE keys(key) AS (
                (SELECT concurrency_key FROM job_run
                 WHERE status = 'pending' AND pool = p_pool AND concurrency_key IS NOT NULL
                 ORDER BY concurrency_key LIMIT 1)
                UNION ALL
                SELECT (SELECT concurrency_key FROM job_run
                        WHERE status = 'pending' AND pool = p_pool
                          AND concurrency_key IS NOT NULL AND concurrency_key > keys.key
                        ORDER BY concurrency_key LIMIT 1)
                FROM keys WHERE keys.key IS NOT NULL
            ), heads AS (
                SELECT keys.key, head.priority, head.run_at,
                       coalesce(kc.concurrency_limit, head.concurrency_limit, 1) AS lim
                FROM (SELECT key FROM keys WHERE key IS NOT NULL LIMIT 1000) keys
                CROSS JOIN LATERAL (
                    SELECT j.priority, j.run_at, j.concurrency_limit FROM job_run j
                    WHERE j.status = 'pending' AND j.pool = p_pool
                      AND j.concurrency_key = keys.key
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT 1
                ) head
                LEFT JOIN key_concurrency kc ON kc.key = keys.key
                WHERE head.run_at <= now_
                ORDER BY head.priority, head.run_at
            )
            SELECT * FROM _claim_ids(ARRAY(
                SELECT c.id
                FROM heads h
                CROSS JOIN LATERAL (SELECT _concurrency_room(h.key, h.lim) AS free) r
                CROSS JOIN LATERAL (
                    SELECT id FROM job_run j
                    WHERE status = 'pending' AND pool = p_pool AND concurrency_key = h.key
                      AND run_at <= now_
                      AND (NOT types_paused
                           OR NOT EXISTS (SELECT FROM pause p
                                          WHERE p.kind = 'type' AND p.name = j.job_type))
                    ORDER BY priority, run_at, id
                    LIMIT r.free
                    FOR UPDATE SKIP LOCKED) c
                LIMIT remaining), p_worker_id, p_lease_s, now_);
        GET DIAGNOSTICS claimed = ROW_COUNT;
        remaining := remaining - claimed;
    END IF;

    -- Rate-limited keys (as in 0018): the distinct keys by a skip scan of
    -- job_run_claim_rated_idx, each with its head run's definition.
    FOR k IN
        WITH RECURSIVE keys(key) AS (
            (SELECT rate_key FROM job_run
             WHERE status = 'pending' AND pool = p_pool AND rate_key IS NOT NULL
             ORDER BY rate_key LIMIT 1)
            UNION ALL
            SELECT (SELECT rate_key FROM job_run
                    WHERE status = 'pending' AND pool = p_pool AND rate_key > keys.key
                    ORDER BY rate_key LIMIT 1)
            FROM keys WHERE keys.key IS NOT NULL
        )
        SELECT keys.key, head.priority, head.run_at, d.rate_limit AS lim,
               d.rate_period_s AS period_s
        FROM (SELECT key FROM keys WHERE key IS NOT NULL LIMIT 1000) keys
        CROSS JOIN LATERAL (
            SELECT j.job_type, j.priority, j.run_at FROM job_run j
            WHERE j.status = 'pending' AND j.pool = p_pool AND j.rate_key = keys.key
              AND j.run_at <= now_
              AND (NOT types_paused
                   OR NOT EXISTS (SELECT FROM pause p
                                  WHERE p.kind = 'type' AND p.name = j.job_type))
            ORDER BY j.priority, j.run_at, j.id
            LIMIT 1
        ) head
        LEFT JOIN job d ON d.type = head.job_type
        ORDER BY head.priority, head.run_at
    LOOP
        EXIT WHEN remaining <= 0;
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('notifyq.rate'), hashtext(k.key));
        IF k.lim IS NULL THEN
            free := remaining;
        ELSE
            SELECT coalesce(_rate_used(w.buckets, w.counts, k.period_s, now_), 0) INTO used
            FROM rate_window w WHERE w.key = k.key;
            free := least(k.lim - coalesce(used, 0), remaining);
        END IF;
        CONTINUE WHEN free <= 0;
        RETURN QUERY
            SELECT * FROM _claim_ids(ARRAY(
                SELECT id FROM job_run j
                WHERE status = 'pending' AND pool = p_pool AND rate_key = k.key
                  AND run_at <= now_
                  AND (NOT types_paused
                       OR NOT EXISTS (SELECT FROM pause p
                                      WHERE p.kind = 'type' AND p.name = j.job_type))
                ORDER BY priority, run_at, id
                LIMIT free
                FOR UPDATE SKIP LOCKED), p_worker_id, p_lease_s, now_);
        GET DIAGNOSTICS claimed = ROW_COUNT;
        remaining := remaining - claimed;
        IF claimed > 0 AND k.lim IS NOT NULL THEN
            step := _rate_step(now_, k.period_s);
            INSERT INTO rate_window AS w (key, pool, rate_limit, period_s, buckets, counts,
                                          updated_at)
            VALUES (k.key, p_pool, k.lim, k.period_s, ARRAY[step], ARRAY[claimed], now_)
            ON CONFLICT (key) DO UPDATE
            SET pool = excluded.pool, rate_limit = excluded.rate_limit,
                period_s = excluded.period_s, updated_at = excluded.updated_at,
                (buckets, counts) = (
                    SELECT coalesce(array_agg(b ORDER BY b), '{}'),
                           coalesce(array_agg(c ORDER BY b), '{}')
                    FROM (SELECT b, sum(c)::integer AS c
                          FROM (SELECT * FROM unnest(w.buckets, w.counts) AS x(b, c)
                                WHERE b >= _rate_step(now_ - make_interval(secs => k.period_s),
                                                      k.period_s)
                                UNION ALL SELECT step, claimed) y
                          GROUP BY b) z);
        END IF;
    END LOOP;
END
$$;

-- The rows of a batch: messages, runs and deliveries, and per message (in the order given) its
-- id, whether it is new, and how many deliveries it has. A SQL function called by
-- _send_webhooks after its checks: the same statement run by plpgsql took 1.2-2.1 s for 1,000
-- messages to 2 endpoints, against 0.15-0.24 s here (plpgsql's plan for its parameters).
CREATE FUNCTION _send_webhooks_rows(p_event_types text[], p_payloads text[],
                                    p_endpoint_ids uuid[], p_idempotency_keys text[])
RETURNS TABLE (ord integer, message_id text, created boolean, deliveries integer)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH m AS (
        SELECT u.event_type, u.payload::jsonb AS payload, u.endpoint_id, u.key,
               u.n::integer AS n
        FROM unnest(p_event_types, p_payloads, p_endpoint_ids, p_idempotency_keys)
             WITH ORDINALITY AS u(event_type, payload, endpoint_id, key, n)
    ), known AS (      -- a key sent before: that message, nothing new
        SELECT m.n, w.id FROM m JOIN webhook_message w ON w.idempotency_key = m.key
    ), fresh AS (      -- new messages: a key repeated in the batch makes one, the first
        SELECT m.*, 'msg_' || replace(uuid7()::text, '-', '') AS id
        FROM m
        WHERE NOT EXISTS (SELECT FROM known k WHERE k.n = m.n)
          AND (m.key IS NULL OR m.n = (SELECT min(d.n) FROM m d WHERE d.key = m.key))
        ORDER BY m.n
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
    ), counted AS (
        SELECT d.message_id, count(*)::integer AS deliveries FROM delivered d
        GROUP BY d.message_id
    ), firsts AS (     -- the message a key repeated later in the batch stands for
        SELECT f.key, f.id FROM fresh f WHERE f.key IS NOT NULL
    )
    SELECT m.n, a.id, f.id IS NOT NULL,
           coalesce(c.deliveries, CASE WHEN k.id IS NOT NULL THEN
               (SELECT count(*)::integer FROM webhook_delivery d WHERE d.message_id = k.id) END,
               0)
    FROM m
    LEFT JOIN known k ON k.n = m.n
    LEFT JOIN fresh f ON f.n = m.n
    LEFT JOIN firsts r ON r.key = m.key
    CROSS JOIN LATERAL (SELECT coalesce(k.id, f.id, r.id) AS id) a
    LEFT JOIN counted c ON c.message_id = a.id
    ORDER BY m.n;
$$;

CREATE FUNCTION _send_webhooks(p_event_types text[], p_payloads text[],
                               p_endpoint_ids uuid[], p_idempotency_keys text[])
RETURNS TABLE (ord integer, message_id text, created boolean, deliveries integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    bad record;
BEGIN
    -- The checks of _send_webhook, each message's at once; the first failure names its place.
    SELECT u.n, u.event_type, u.payload::jsonb AS payload, u.endpoint_id, u.key INTO bad
    FROM unnest(p_event_types, p_payloads, p_endpoint_ids, p_idempotency_keys)
         WITH ORDINALITY AS u(event_type, payload, endpoint_id, key, n)
    WHERE u.event_type IS NULL OR u.event_type !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'
       OR length(u.event_type) > 128
       OR u.payload IS NULL OR jsonb_typeof(u.payload::jsonb) NOT IN ('object', 'array')
       OR octet_length(u.payload::jsonb::text) > 262144
       OR (u.key IS NOT NULL AND length(u.key) NOT BETWEEN 1 AND 256)
       OR (u.endpoint_id IS NOT NULL
           AND NOT EXISTS (SELECT FROM webhook_endpoint e WHERE e.id = u.endpoint_id))
    ORDER BY u.n LIMIT 1;
    IF FOUND THEN
        IF bad.event_type IS NULL OR bad.event_type !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'
           OR length(bad.event_type) > 128 THEN
            RAISE EXCEPTION 'notifyq: message %: invalid event type %: it must match ^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$',
                bad.n, coalesce(quote_literal(bad.event_type), 'NULL') USING ERRCODE = '22023';
        ELSIF bad.payload IS NULL OR jsonb_typeof(bad.payload) NOT IN ('object', 'array') THEN
            RAISE EXCEPTION 'notifyq: message %: webhook payload must be a JSON object or array',
                bad.n USING ERRCODE = '22023';
        ELSIF octet_length(bad.payload::text) > 262144 THEN
            RAISE EXCEPTION 'notifyq: message %: webhook payload is % bytes; the limit is 262144 bytes',
                bad.n, octet_length(bad.payload::text) USING ERRCODE = '54000';
        ELSIF bad.key IS NOT NULL AND length(bad.key) NOT BETWEEN 1 AND 256 THEN
            RAISE EXCEPTION 'notifyq: message %: idempotency_key must be 1 to 256 characters',
                bad.n USING ERRCODE = '22023';
        ELSE
            RAISE EXCEPTION 'notifyq: message %: no webhook endpoint %', bad.n, bad.endpoint_id
                USING ERRCODE = '22023';
        END IF;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('notifyq.webhook'), hashtext(x.key))
    FROM (SELECT DISTINCT key FROM unnest(p_idempotency_keys) AS key
          WHERE key IS NOT NULL ORDER BY key) x;
    RETURN QUERY SELECT * FROM _send_webhooks_rows(p_event_types, p_payloads, p_endpoint_ids,
                                                  p_idempotency_keys);
    IF cardinality(p_event_types) > 0 THEN
        PERFORM pg_notify(current_schema(), 'j:webhooks');
    END IF;
END
$$;

-- 0017's _send_webhook, the runs' concurrency key filled in without _expand_template.
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
               -- notifyq's own template, without a plpgsql call per run (~20 us each)
               CASE WHEN def.concurrency_key_template = 'webhook:{endpoint_id}'
                    THEN 'webhook:' || t.id
                    ELSE _expand_template(def.concurrency_key_template, t.input) END,
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
