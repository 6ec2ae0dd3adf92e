-- Fences a lost claim can never reproduce, so a claim may commit asynchronously (issue 13,
-- item 2), and one place for what a claim writes.
--
-- Until now a claim set fence = previous + 1. A claim committed with synchronous_commit = off
-- can vanish in a server crash (its WAL not yet flushed): the run is pending again with the old
-- fence, the next claim after the restart hands out the same previous + 1, and the worker that
-- held the lost claim (still running its handler) would write back under the new holder's fence.
-- A fresh random fence (52 random bits; a collision needs the new claim to draw the lost one's
-- value) makes that write match nothing, as for any lease taken over. Fences are compared for
-- equality only; nothing orders them.
--
-- `_claim_ids` owns the claim's SET list for the plpgsql claims (`_claim_keyed`'s two halves and
-- `_claim_fair`); the hot statement (job_run_finish_and_claim) writes the same columns inline,
-- as one statement, and calls `_new_fence()`.

CREATE FUNCTION _new_fence() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT 1 + floor(random() * 4503599627370496)::bigint $$;

CREATE FUNCTION _claim_ids(p_ids uuid[], p_worker_id text, p_lease_s double precision,
                           p_now timestamptz)
RETURNS SETOF job_run
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    UPDATE job_run r
    SET status = 'running', attempts = r.attempts + 1, fence = _new_fence(),
        claimed_at = p_now, started_at = coalesce(r.started_at, p_now),
        leased_by = p_worker_id,
        lease_expires_at = p_now + make_interval(secs => p_lease_s), updated_at = p_now
    WHERE r.id = ANY (p_ids)
    RETURNING r.*
$$;

-- 0015's keyed claim; each half claims through _claim_ids.
CREATE OR REPLACE FUNCTION _claim_keyed(p_pool text, p_limit integer, p_worker_id text,
                                        p_lease_s double precision, p_now timestamptz)
RETURNS SETOF job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
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
    FOR k IN
        SELECT concurrency_key AS key, max(concurrency_limit) AS lim
        FROM job_run j
        WHERE status = 'pending' AND pool = p_pool AND run_at <= now_
          AND concurrency_key IS NOT NULL
          AND (NOT types_paused
               OR NOT EXISTS (SELECT FROM pause p WHERE p.kind = 'type' AND p.name = j.job_type))
        GROUP BY concurrency_key
        ORDER BY min(priority), min(run_at)
        LIMIT 1000
    LOOP
        EXIT WHEN remaining <= 0;
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('notifyq.concurrency'),
                                                    hashtext(k.key));
        SELECT count(*) INTO running FROM job_run
        WHERE concurrency_key = k.key AND status = 'running';
        free := least(coalesce(k.lim, 1) - running, remaining);
        CONTINUE WHEN free <= 0;
        RETURN QUERY
            SELECT * FROM _claim_ids(ARRAY(
                SELECT id FROM job_run j
                WHERE status = 'pending' AND pool = p_pool AND concurrency_key = k.key
                  AND run_at <= now_
                  AND (NOT types_paused
                       OR NOT EXISTS (SELECT FROM pause p
                                      WHERE p.kind = 'type' AND p.name = j.job_type))
                ORDER BY priority, run_at, id
                LIMIT free
                FOR UPDATE SKIP LOCKED), p_worker_id, p_lease_s, now_);
        GET DIAGNOSTICS claimed = ROW_COUNT;
        remaining := remaining - claimed;
    END LOOP;

    -- Rate-limited keys: the distinct keys by a skip scan of job_run_claim_rated_idx (one
    -- index probe per key, however long a key's backlog), each with its head run's definition.
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
            -- The type's limit was removed: its queued runs go at the pace of free slots.
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
            -- Add the starts to the current step; forget the steps the window has left.
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

-- 0015's fair claim, claiming through _claim_ids.
CREATE OR REPLACE FUNCTION _claim_fair(p_pool text, p_limit integer, p_worker_id text,
                            p_lease_s double precision, p_now timestamptz)
RETURNS SETOF job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    now_         timestamptz := coalesce(p_now, now());
    types_paused boolean;
    tenants      text[];
    share        integer;
    ids          uuid[];
    more         uuid[];
BEGIN
    IF p_limit <= 0 OR EXISTS (SELECT FROM pause WHERE kind = 'pool' AND name = p_pool) THEN
        RETURN;
    END IF;
    types_paused := EXISTS (SELECT FROM pause WHERE kind = 'type');
    WITH RECURSIVE t(tenant) AS (
        (SELECT tenant_id FROM job_run
         WHERE status = 'pending' AND pool = p_pool
           AND concurrency_key IS NULL AND rate_key IS NULL AND tenant_id IS NOT NULL
         ORDER BY tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT tenant_id FROM job_run
                WHERE status = 'pending' AND pool = p_pool
                  AND concurrency_key IS NULL AND rate_key IS NULL
                  AND tenant_id IS NOT NULL AND tenant_id > t.tenant
                ORDER BY tenant_id LIMIT 1)
        FROM t WHERE t.tenant IS NOT NULL
    )
    SELECT array_agg(heads.tenant ORDER BY heads.priority, heads.run_at, heads.id) INTO tenants
    FROM (
        SELECT t.tenant, h.priority, h.run_at, h.id
        FROM (SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT 1000) t
        CROSS JOIN LATERAL (
            SELECT j.priority, j.run_at, j.id FROM job_run j
            WHERE j.status = 'pending' AND j.pool = p_pool AND j.run_at <= now_
              AND j.concurrency_key IS NULL AND j.rate_key IS NULL
              AND j.tenant_id = t.tenant
              AND (NOT types_paused
                   OR NOT EXISTS (SELECT FROM pause p
                                  WHERE p.kind = 'type' AND p.name = j.job_type))
            ORDER BY j.priority, j.run_at, j.id
            LIMIT 1
        ) h
        ORDER BY h.priority, h.run_at, h.id
        LIMIT p_limit
    ) heads;
    IF tenants IS NULL THEN
        RETURN;
    END IF;
    share := greatest(1, p_limit / cardinality(tenants));
    SELECT coalesce(array_agg(f.id), '{}') INTO ids
    FROM unnest(tenants) AS u(tenant)
    CROSS JOIN LATERAL (
        SELECT j.id FROM job_run j
        WHERE j.status = 'pending' AND j.pool = p_pool AND j.run_at <= now_
          AND j.concurrency_key IS NULL AND j.rate_key IS NULL
          AND j.tenant_id = u.tenant
          AND (NOT types_paused
               OR NOT EXISTS (SELECT FROM pause p WHERE p.kind = 'type' AND p.name = j.job_type))
        ORDER BY j.priority, j.run_at, j.id
        LIMIT share
        FOR UPDATE SKIP LOCKED
    ) f;
    IF cardinality(ids) < p_limit THEN
        SELECT coalesce(array_agg(m.id), '{}') INTO more
        FROM (
            SELECT j.id FROM job_run j
            WHERE j.status = 'pending' AND j.pool = p_pool AND j.run_at <= now_
              AND j.concurrency_key IS NULL AND j.rate_key IS NULL
              AND NOT j.id = ANY (ids)
              AND (NOT types_paused
                   OR NOT EXISTS (SELECT FROM pause p
                                  WHERE p.kind = 'type' AND p.name = j.job_type))
            ORDER BY j.priority, j.run_at, j.id
            LIMIT p_limit - cardinality(ids)
            FOR UPDATE SKIP LOCKED
        ) m;
        ids := ids || more;
    END IF;
    RETURN QUERY SELECT * FROM _claim_ids(ids, p_worker_id, p_lease_s, now_);
END
$$;
