-- Tenant-scoped API tokens (issue 12, item 8). A token configured with `tenants: [...]` sees and
-- changes only the runs, signals, webhook endpoints and messages of those tenants; every query
-- behind the admin API takes a `tenant_ids text[]` (NULL: every tenant) and filters in SQL.

-- The tenant an endpoint belongs to (NULL: none; only tokens for every tenant see it). Set at
-- creation and never changed. A message belongs to the tenant of the endpoint it was sent to.
ALTER TABLE webhook_endpoint ADD COLUMN tenant_id text
    CHECK (length(tenant_id) BETWEEN 1 AND 512);
CREATE INDEX webhook_endpoint_tenant_idx ON webhook_endpoint (tenant_id, id)
    WHERE tenant_id IS NOT NULL;
-- A tenant's runs, newest first (GET /v1/jobs with a tenant-scoped token).
CREATE INDEX job_run_tenant_idx ON job_run (tenant_id, id) WHERE tenant_id IS NOT NULL;

-- signal() with the waiting run looked for among the runs of `p_tenant_ids` only (NULL: every
-- run). A signal for tenants is delivered to a run that waits now or not at all (returns 0 and
-- queues nothing): a queued signal has no tenant, and the run of another tenant that waits on
-- the same token next would take it.
CREATE FUNCTION _signal(p_token text, p_payload jsonb, p_tenant_ids text[]) RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    waiter record;
BEGIN
    IF p_token IS NULL OR length(p_token) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'notifyq: signal token must be 1 to 512 characters'
            USING ERRCODE = '22023';
    END IF;
    SELECT r.id, r.pool INTO waiter FROM job_run r
    WHERE r.status = 'waiting' AND r.wait_kind = 'signal' AND r.wait_token = p_token
      AND (p_tenant_ids IS NULL OR r.tenant_id = ANY (p_tenant_ids))
    ORDER BY r.updated_at, r.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        -- The wait step ctx.wait_for_signal recorded before parking the run; its replay finds
        -- it completed and returns the payload.
        UPDATE job_step
        SET status = 'completed', output = jsonb_build_object('payload',
                                                              coalesce(p_payload, '{}')),
            finished_at = now()
        WHERE run_id = waiter.id AND step_id = 'signal:' || p_token
          AND status = 'running';
        IF NOT FOUND THEN
            -- No wait step to write into (a run parked by an older notifyq): queue the signal
            -- for its replay to take.
            INSERT INTO job_signal (token, payload) VALUES (p_token, coalesce(p_payload, '{}'));
        END IF;
        UPDATE job_run SET status = 'pending', run_at = now(), updated_at = now()
        WHERE id = waiter.id;
        PERFORM pg_notify(current_schema(), 'j:' || waiter.pool);
        RETURN 1;
    END IF;
    IF p_tenant_ids IS NULL THEN
        INSERT INTO job_signal (token, payload) VALUES (p_token, coalesce(p_payload, '{}'));
    END IF;
    RETURN 0;
END
$$;

-- The public signal() keeps its signature and behaviour: every run, queued when none waits.
CREATE OR REPLACE FUNCTION signal(token text, payload jsonb DEFAULT '{}') RETURNS integer
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT _signal(signal.token, signal.payload, NULL)
$$;
