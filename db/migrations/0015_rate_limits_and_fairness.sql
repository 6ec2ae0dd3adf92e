-- Rate limits and tenant-fair claiming (issue 16).
--
-- Rate limits: at most `rate_limit` runs of a key start per `rate_period_s` seconds, across all
-- workers. A job definition with a limit gives each new run a `rate_key` (its type, or its key
-- template filled from the input); such runs leave the plain claim index for their own, and
-- the keyed claim (_claim_keyed, which the worker already runs for concurrency keys) claims
-- them per key while the key's window has room. A claim counts as a start, a retry too.
--
-- The window slides in 20 steps: `rate_window` counts a key's starts per twentieth of its
-- period (`buckets`, `counts`), and a claim counts every step that overlaps the last period, so
-- no period-long interval ever sees more than the limit (a start may wait up to a twentieth of
-- the period longer than an exact log would allow). The state is at most 21 pairs of numbers
-- whatever the limit: a log of start times measured 568 us of server CPU per run at 900 runs
-- a second (its array, rewritten and TOASTed at every claim); the steps measured the same
-- (the keyed claim's round trip and statements dominate: CHANGELOG), and cost O(1). Workers
-- serialise on a key with a transaction-scoped advisory lock and skip a key another worker
-- holds, so a busy key never stalls the rest of the claim.
ALTER TABLE job ADD COLUMN rate_limit integer CHECK (rate_limit BETWEEN 1 AND 10000),
                ADD COLUMN rate_period_s double precision
                    CHECK (rate_period_s > 0 AND rate_period_s <= 86400),
                ADD COLUMN rate_key_template text CHECK (length(rate_key_template) <= 512),
                ADD CONSTRAINT job_rate_limit_complete
                    CHECK ((rate_limit IS NULL) = (rate_period_s IS NULL));

ALTER TABLE job_run ADD COLUMN rate_key text CHECK (length(rate_key) <= 2048);

-- The step a start at `t` falls in, for a period of `period_s`: a twentieth of the period.
CREATE FUNCTION _rate_step(t timestamptz, period_s double precision) RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$ SELECT floor(extract(epoch FROM t) / (period_s / 20))::bigint $$;

-- The starts a window holds at `now`: those of the steps that overlap (now - period, now]
-- (_rate_step's expression written out, and no SET clause: so the planner can inline it).
CREATE FUNCTION _rate_used(buckets bigint[], counts integer[], period_s double precision,
                           now timestamptz) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(sum(c), 0)::integer FROM unnest(buckets, counts) AS x(b, c)
    WHERE b >= floor(extract(epoch FROM now - make_interval(secs => period_s))
                     / (period_s / 20))::bigint
$$;

-- When a full window has room again: once its oldest counted step leaves the period.
CREATE FUNCTION _rate_next_start(buckets bigint[], period_s double precision, now timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
AS $$
    SELECT to_timestamp((min(b) + 1) * (period_s / 20) + period_s) FROM unnest(buckets) AS b
    WHERE b >= floor(extract(epoch FROM now - make_interval(secs => period_s))
                     / (period_s / 20))::bigint
$$;

CREATE TABLE rate_window (
    key        text PRIMARY KEY,
    pool       text NOT NULL,
    rate_limit integer NOT NULL,
    period_s   double precision NOT NULL,
    buckets    bigint[] NOT NULL DEFAULT '{}',
    counts     integer[] NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The plain claim no longer sees rate-limited runs: a backlog of them cannot sit in front of
-- the runs it may take. (Like 0007's index change, this takes a lock for the build: on a large
-- table, run the migration when the queue is quiet; see docs/operations.md.)
DROP INDEX job_run_claim_idx;
CREATE INDEX job_run_claim_idx ON job_run (pool, priority, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NULL AND rate_key IS NULL;
CREATE INDEX job_run_claim_rated_idx ON job_run (pool, rate_key, priority, run_at, id)
    WHERE status = 'pending' AND rate_key IS NOT NULL;

-- Fair claiming (worker.fair_pools): the plain runs of a pool by tenant, so the claim finds
-- each tenant's next run with one index probe (a skip scan over the tenants) however long
-- another tenant's backlog is. Only runs with a tenant are in it: the index costs the others
-- nothing (with every plain run in it, bulk enqueue measured 8 % slower).
CREATE INDEX job_run_claim_fair_idx ON job_run (pool, tenant_id, priority, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NULL AND rate_key IS NULL
      AND tenant_id IS NOT NULL;

-- _enqueue (0007's, unchanged) becomes _enqueue_row; _enqueue now also gives a run of a
-- rate-limited type its rate key. Only such runs pay the second write. Rate limits and
-- concurrency keys do not combine (the Python registration refuses both): a run with a
-- concurrency key gets no rate key.
ALTER FUNCTION _enqueue(text, jsonb, timestamptz, integer, text, integer, text, text[], uuid,
                        boolean, double precision, text, text, text, integer, text, text, text,
                        text, uuid, uuid, text, boolean, text[])
    RENAME TO _enqueue_row;

CREATE FUNCTION _rate_key(p_job_type text, p_template text, p_input jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    SELECT CASE WHEN p_template IS NULL THEN 'type:' || p_job_type
                ELSE _expand_template(p_template, p_input) END
$$;

CREATE FUNCTION _enqueue(
    p_job_type              text,
    p_input                 jsonb,
    p_run_at                timestamptz DEFAULT NULL,
    p_priority              integer DEFAULT NULL,
    p_pool                  text DEFAULT NULL,
    p_max_attempts          integer DEFAULT NULL,
    p_dedupe_key            text DEFAULT NULL,
    p_tags                  text[] DEFAULT NULL,
    p_id                    uuid DEFAULT NULL,
    p_notify                boolean DEFAULT true,
    p_dedupe_window_s       double precision DEFAULT NULL,
    p_trigger_source        text DEFAULT 'manual',
    p_trigger_ref           text DEFAULT NULL,
    p_concurrency_key       text DEFAULT NULL,
    p_concurrency_limit     integer DEFAULT NULL,
    p_concurrency_collision text DEFAULT NULL,
    p_scope_entity_type     text DEFAULT NULL,
    p_scope_entity_id       text DEFAULT NULL,
    p_tenant_id             text DEFAULT NULL,
    p_parent_run_id         uuid DEFAULT NULL,
    p_root_run_id           uuid DEFAULT NULL,
    p_parent_close_policy   text DEFAULT NULL,
    p_allow_unknown_type    boolean DEFAULT false,
    p_dedupe_states         text[] DEFAULT NULL
) RETURNS job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    run job_run;
    def job;
BEGIN
    run := _enqueue_row(p_job_type, p_input, p_run_at, p_priority, p_pool, p_max_attempts,
                        p_dedupe_key, p_tags, p_id, p_notify, p_dedupe_window_s,
                        p_trigger_source, p_trigger_ref, p_concurrency_key, p_concurrency_limit,
                        p_concurrency_collision, p_scope_entity_type, p_scope_entity_id,
                        p_tenant_id, p_parent_run_id, p_root_run_id, p_parent_close_policy,
                        p_allow_unknown_type, p_dedupe_states);
    IF run.rate_key IS NULL AND run.concurrency_key IS NULL AND run.status = 'pending' THEN
        SELECT * INTO def FROM job WHERE type = run.job_type;
        IF def.rate_limit IS NOT NULL THEN
            UPDATE job_run
            SET rate_key = _rate_key(run.job_type, def.rate_key_template, run.input)
            WHERE id = run.id
            RETURNING * INTO run;
        END IF;
    END IF;
    RETURN run;
END
$$;

-- The keyed claim: 0013's concurrency keys, then rate-limited keys with what is left of the
-- batch. Keys are visited best head run first (priority, then run_at) among the first 1,000
-- keys with runnable runs; a key held by another worker's claim or with a full window is
-- skipped, not waited for.
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
            WITH picked AS (
                SELECT id FROM job_run j
                WHERE status = 'pending' AND pool = p_pool AND concurrency_key = k.key
                  AND run_at <= now_
                  AND (NOT types_paused
                       OR NOT EXISTS (SELECT FROM pause p
                                      WHERE p.kind = 'type' AND p.name = j.job_type))
                ORDER BY priority, run_at, id
                LIMIT free
                FOR UPDATE SKIP LOCKED
            )
            UPDATE job_run r
            SET status = 'running', attempts = r.attempts + 1, fence = r.fence + 1,
                claimed_at = now_, started_at = coalesce(r.started_at, now_),
                leased_by = p_worker_id,
                lease_expires_at = now_ + make_interval(secs => p_lease_s), updated_at = now_
            FROM picked
            WHERE r.id = picked.id
            RETURNING r.*;
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
            WITH picked AS (
                SELECT id FROM job_run j
                WHERE status = 'pending' AND pool = p_pool AND rate_key = k.key
                  AND run_at <= now_
                  AND (NOT types_paused
                       OR NOT EXISTS (SELECT FROM pause p
                                      WHERE p.kind = 'type' AND p.name = j.job_type))
                ORDER BY priority, run_at, id
                LIMIT free
                FOR UPDATE SKIP LOCKED
            )
            UPDATE job_run r
            SET status = 'running', attempts = r.attempts + 1, fence = r.fence + 1,
                claimed_at = now_, started_at = coalesce(r.started_at, now_),
                leased_by = p_worker_id,
                lease_expires_at = now_ + make_interval(secs => p_lease_s), updated_at = now_
            FROM picked
            WHERE r.id = picked.id
            RETURNING r.*;
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

-- The fair claim (worker.fair_pools): a fair pool's worker calls it (job_run_claim_fair) before
-- job_run_finish_and_claim, which then claims nothing more. The pool's tenants come from a skip
-- scan of job_run_claim_fair_idx (one index probe per tenant, however long a tenant's backlog);
-- each tenant's head run is found the same way, and the `p_limit` tenants with the best heads
-- (priority, then oldest) get an even share of the batch (rounded down, at least one); what the
-- shares leave of the batch is claimed in the plain order, runs without a tenant included. With
-- more tenants than the batch, the tenants whose heads waited longest go first, and the others'
-- turn comes as their heads age. Its own statement, so the hot statement's plain claim stays as
-- it was (see job_run_claim_fair).
CREATE FUNCTION _claim_fair(p_pool text, p_limit integer, p_worker_id text,
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
    RETURN QUERY
        UPDATE job_run r
        SET status = 'running', attempts = r.attempts + 1, fence = r.fence + 1,
            claimed_at = now_, started_at = coalesce(r.started_at, now_),
            leased_by = p_worker_id,
            lease_expires_at = now_ + make_interval(secs => p_lease_s), updated_at = now_
        WHERE r.id = ANY (ids)
        RETURNING r.*;
END
$$;
