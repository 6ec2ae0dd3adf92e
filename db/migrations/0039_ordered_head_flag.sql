-- An ordered endpoint's retrying delivery holds its place by a flag, not by its priority
-- (issue 35, item B).
--
-- 0029 gave the head of an ordered endpoint's line (a delivery waiting to be tried again) the
-- best priority, -1000, so the keyed claim, which takes each key's head run and passes over a
-- key whose head is not due, held the endpoint's later deliveries back. It worked, but the
-- priority was not the run's (run lists showed -1000, and the priority had to be put back from
-- the definition when the endpoint stopped being ordered).
--
-- 1. `job_run.key_head`: true for the run that holds its key's line (set by
--    webhook_delivery_keep_place, cleared by webhook_delivery_release_places), false
--    otherwise. NOT NULL with a constant default: no rewrite of job_run, and no null bitmap in
--    the claim index's entries (a false costs their width nothing: it fills alignment padding
--    before `priority`).
-- 2. job_run_claim_keyed_idx orders each key's runs head first: (pool, concurrency_key,
--    key_head DESC, priority, run_at, id), and _claim_keyed (0028's) sorts by it where it took
--    a key's head and its runs (the three lines marked "0039"). The plan is the same index
--    walk; a key's runs are still read in index order, with no sort.
-- 3. Heads kept by 0029 (pending or running webhook runs at priority -1000 on an ordered
--    endpoint) become flagged heads at their type's priority.

ALTER TABLE job_run ADD COLUMN key_head boolean NOT NULL DEFAULT false;

UPDATE job_run r
SET key_head = true,
    priority = coalesce((SELECT priority_default FROM job WHERE type = 'webhook.deliver'), 0),
    updated_at = now()
WHERE r.status IN ('pending', 'running') AND r.pool = 'webhooks'
  AND r.job_type = 'webhook.deliver' AND r.priority = -1000
  AND EXISTS (SELECT FROM webhook_endpoint e
              WHERE r.concurrency_key = 'webhook:' || e.id AND e.ordered);

DROP INDEX job_run_claim_keyed_idx;
CREATE INDEX job_run_claim_keyed_idx ON job_run
    (pool, concurrency_key, key_head DESC, priority, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;

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
                    ORDER BY j.key_head DESC, j.priority, j.run_at, j.id  -- 0039
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
                    ORDER BY key_head DESC, priority, run_at, id  -- 0039
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
                    ORDER BY key_head DESC, priority, run_at, id  -- 0039
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
