-- Pause and resume a pool or a job type (issue 16). A paused pool's or type's pending runs stay
-- pending and no worker claims them; runs already running finish. The state is a row here, read
-- by the claim statement itself, so every worker obeys from its next claim (at most one poll
-- interval later), and a resume wakes the pools with a NOTIFY.
--
-- The table stays tiny (one row per paused pool or type) and the claim reads it by its primary
-- key: a pool pause is one lookup per claim (a one-time filter), a type pause one lookup per
-- candidate row, and only while some type is paused at all.
CREATE TABLE pause (
    kind text NOT NULL CHECK (kind IN ('pool', 'type')),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    reason text CHECK (length(reason) <= 500),
    paused_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, name)
);

-- The keyed claim (0007's) with the same two checks as job_run_claim: nothing from a paused pool,
-- no key whose runs are all of paused types, no run of a paused type.
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
END
$$;
