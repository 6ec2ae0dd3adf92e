-- Per-endpoint rate limits, and a 429's Retry-After holding the whole endpoint (issue 34,
-- item 6).
--
-- 1. `webhook_endpoint.rate_limit`: deliveries per second (NULL: unlimited). A trigger keeps it
--    in `key_rate` under the endpoint's concurrency key (`webhook:<id>`, as a tenth of the rate
--    per tenth of a second, see the trigger), so the keyed claim,
--    which knows keys and not endpoints, enforces it: a key's room is its concurrency room and,
--    when it has a rate, what its sliding window (`rate_window`, the machinery of 0015: 20 steps
--    per period) has left. Counted at claim, under the key's advisory lock, so every worker
--    process shares one window; `job_run_next_run_at` already wakes a producer when a full
--    window of its pool has room again.
-- 2. `key_rate.held_until`: a key whose receiver asked to wait (429 with Retry-After) is passed
--    over by the claim until then, new deliveries included (notifyq/_webhooks/deliver.py parks
--    the pending ones too, so the producer wakes when the hold ends).
-- 3. `_claim_keyed` (0027's) calls `_key_room` instead of `_concurrency_room`, skips held keys
--    and counts its starts into the rate windows: the three changes are marked "0028".

ALTER TABLE webhook_endpoint ADD COLUMN rate_limit integer
    CHECK (rate_limit BETWEEN 1 AND 1000000);

CREATE TABLE key_rate (
    key        text PRIMARY KEY,
    rate_limit integer CHECK (rate_limit >= 1),
    period_s   double precision NOT NULL DEFAULT 1 CHECK (period_s > 0),
    held_until timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The endpoint's rate under its key (a row only for a rate or a hold); a hold is kept when
-- the rate changes.
CREATE FUNCTION _webhook_endpoint_rate_sync() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM key_rate WHERE key = 'webhook:' || OLD.id;
        RETURN OLD;
    END IF;
    IF NEW.rate_limit IS NULL THEN  -- unlimited: no row, unless a hold keeps one
        UPDATE key_rate SET rate_limit = NULL, updated_at = now()
        WHERE key = 'webhook:' || NEW.id AND rate_limit IS NOT NULL;
        RETURN NEW;
    END IF;
    -- N a second as L = ceil(N / 10) per L / N seconds: the same rate, in bursts of at most a
    -- tenth of it (N per 1 s let a receiver see N at once, and 2N within one second when two
    -- windows' bursts arrived close: 16 in a second at a rate of 10, three workers).
    INSERT INTO key_rate AS k (key, rate_limit, period_s, updated_at)
    VALUES ('webhook:' || NEW.id, ceil(NEW.rate_limit / 10.0)::integer,
            ceil(NEW.rate_limit / 10.0) / NEW.rate_limit, now())
    ON CONFLICT (key) DO UPDATE SET rate_limit = excluded.rate_limit,
                                    period_s = excluded.period_s, updated_at = now();
    RETURN NEW;
END
$$;

CREATE TRIGGER webhook_endpoint_rate_sync
AFTER INSERT OR DELETE OR UPDATE OF rate_limit ON webhook_endpoint
FOR EACH ROW
EXECUTE FUNCTION _webhook_endpoint_rate_sync();

-- What a key may start now: _concurrency_room's (a try-lock, then its limit minus its running
-- runs) and, with a rate, no more than its window has left.
CREATE FUNCTION _key_room(p_key text, p_limit integer, p_rate integer,
                          p_period_s double precision, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    room integer := _concurrency_room(p_key, p_limit);
BEGIN
    IF room = 0 OR p_rate IS NULL THEN
        RETURN room;
    END IF;
    RETURN greatest(0, least(room, p_rate - coalesce(
        (SELECT _rate_used(w.buckets, w.counts, p_period_s, p_now)
         FROM rate_window w WHERE w.key = p_key), 0)));
END
$$;

-- The runs a keyed claim just started, by rate-limited key, into each key's window (pruned of
-- the steps that left it): as the rate-limited half of _claim_keyed writes rate_key windows.
CREATE FUNCTION _key_rate_count(p_pool text, p_ids uuid[], p_now timestamptz)
RETURNS void
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    INSERT INTO rate_window AS w (key, pool, rate_limit, period_s, buckets, counts, updated_at)
    SELECT c.key, p_pool, kr.rate_limit, kr.period_s, ARRAY[_rate_step(p_now, kr.period_s)],
           ARRAY[c.n], p_now
    FROM (SELECT concurrency_key AS key, count(*)::integer AS n FROM job_run
          WHERE id = ANY (p_ids) AND concurrency_key IS NOT NULL
          GROUP BY concurrency_key) c
    JOIN key_rate kr ON kr.key = c.key AND kr.rate_limit IS NOT NULL
    ORDER BY c.key
    ON CONFLICT (key) DO UPDATE
    SET pool = excluded.pool, rate_limit = excluded.rate_limit, period_s = excluded.period_s,
        updated_at = excluded.updated_at,
        (buckets, counts) = (
            SELECT coalesce(array_agg(b ORDER BY b), '{}'), coalesce(array_agg(c ORDER BY b), '{}')
            FROM (SELECT b, sum(c)::integer AS c
                  FROM (SELECT * FROM unnest(w.buckets, w.counts) AS x(b, c)
                        WHERE b >= _rate_step(p_now - make_interval(secs => w.period_s),
                                              w.period_s)
                        UNION ALL
                        SELECT excluded.buckets[1], excluded.counts[1]) y
                  GROUP BY b) z);
$$;

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
    retry_cap integer;
    ids       uuid[];
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
    --
    -- Two lanes (0027): a key whose head run was attempted before (started_at set: a retry, a
    -- run released or reaped) is a retry key. The first-attempt keys are served first, then
    -- the retry keys with what is left, at most the worker's retry room: the share of its
    -- concurrency it registered for the pool (worker.retry_slots) minus the retries it holds.
    IF remaining > 0 THEN
        SELECT (w.retry_slots ->> p_pool)::integer INTO retry_cap
        FROM worker w WHERE w.id = p_worker_id;
        ids := ARRAY(
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
            ), heads AS MATERIALIZED (
                SELECT keys.key, head.priority, head.run_at, head.retry,
                       coalesce(kc.concurrency_limit, head.concurrency_limit, 1) AS lim,
                       kr.rate_limit, kr.period_s
                FROM (SELECT key FROM keys WHERE key IS NOT NULL LIMIT 1000) keys
                CROSS JOIN LATERAL (
                    SELECT j.priority, j.run_at, j.concurrency_limit,
                           j.started_at IS NOT NULL AS retry
                    FROM job_run j
                    WHERE j.status = 'pending' AND j.pool = p_pool
                      AND j.concurrency_key = keys.key
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT 1
                ) head
                LEFT JOIN key_concurrency kc ON kc.key = keys.key
                LEFT JOIN key_rate kr ON kr.key = keys.key
                WHERE head.run_at <= now_ AND NOT coalesce(kr.held_until > now_, false)
                ORDER BY head.priority, head.run_at
            ), firsts AS (
                SELECT c.id
                FROM heads h
                CROSS JOIN LATERAL (SELECT _key_room(h.key, h.lim, h.rate_limit, h.period_s, now_)
                                    AS free) r
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
                WHERE NOT h.retry
                LIMIT remaining
            ), retries AS (
                SELECT c.id
                FROM heads h
                CROSS JOIN LATERAL (SELECT _key_room(h.key, h.lim, h.rate_limit, h.period_s, now_)
                                    AS free) r
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
                WHERE h.retry
                -- The retries this worker holds are counted only when a retry key is due (a
                -- pass over the running runs' index).
                LIMIT least(remaining - (SELECT count(*) FROM firsts), CASE
                    WHEN retry_cap IS NULL THEN remaining
                    WHEN NOT EXISTS (SELECT FROM heads WHERE heads.retry) THEN 0
                    ELSE greatest(0, retry_cap - (
                        SELECT count(*)::integer FROM job_run j
                        WHERE j.status = 'running' AND j.leased_by = p_worker_id
                          AND j.pool = p_pool AND j.started_at < j.claimed_at)) END)
            )
            SELECT id FROM firsts UNION ALL SELECT id FROM retries);
        RETURN QUERY SELECT * FROM _claim_ids(ids, p_worker_id, p_lease_s, now_);
        GET DIAGNOSTICS claimed = ROW_COUNT;
        remaining := remaining - claimed;
        -- Rate-limited keys (0028): what this claim started joins each one's window, under the
        -- key's lock _key_room took (held to the end of the transaction).
        IF claimed > 0 AND EXISTS (SELECT FROM key_rate WHERE rate_limit IS NOT NULL) THEN
            PERFORM _key_rate_count(p_pool, ids, now_);
        END IF;
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

