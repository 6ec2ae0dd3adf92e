-- Lanes for first attempts and retries (issue 34, item 3).
--
-- A retry storm toward failing endpoints must not delay fresh messages to healthy ones. The
-- keyed claim served the keys with due runs best priority, then oldest head first: a failing
-- endpoint's due retries are older than any fresh message, so they went first and, with a
-- share as large as the claim, took all of it (and, answered slowly, every slot of the worker
-- for as long as they took). Now:
--
-- 1. the keyed claim serves first-attempt keys first (a key whose head run was never started),
--    then the retry keys (head started before: a retry, or a run released or reaped);
-- 2. the retry keys get at most the worker's retry room: `worker.retry_slots` holds, per pool,
--    how many of its runs the worker lets be retries at once (webhooks.retry_share of its
--    concurrency, registered with the worker; at least 1, so retries always move), minus the
--    retries it holds (its running runs of the pool whose started_at is older than their
--    claim). The rest of its slots stay free for first attempts. A worker that registered no
--    room for the pool (an older worker, another pool) gets the order of 1 without the cap.
--
-- bench/lanes.py measures fresh deliveries' latency under a retry storm, before and after.

ALTER TABLE worker ADD COLUMN retry_slots jsonb;

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
            ), heads AS MATERIALIZED (
                SELECT keys.key, head.priority, head.run_at, head.retry,
                       coalesce(kc.concurrency_limit, head.concurrency_limit, 1) AS lim
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
                WHERE head.run_at <= now_
                ORDER BY head.priority, head.run_at
            ), firsts AS (
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
                WHERE NOT h.retry
                LIMIT remaining
            ), retries AS (
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
            SELECT * FROM _claim_ids(ARRAY(SELECT id FROM firsts UNION ALL
                                           SELECT id FROM retries), p_worker_id, p_lease_s, now_);
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

