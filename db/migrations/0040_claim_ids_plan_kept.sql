-- `_claim_ids` keeps its plan (issue 30, item 1: the database's work per delivery).
--
-- Every plpgsql claim (`_claim_keyed`'s two halves, its rate-limited loop, `_claim_fair`) claims
-- through `_claim_ids` (0018). As a SQL function with a SET clause it is never inlined, and
-- PostgreSQL 15 parses, analyzes and plans a SQL function's statement again at every call: in
-- the keyed claim of one webhook endpoint (bench/statement_cost.py keyed_1x3000, callgrind),
-- `fmgr_sql`'s parse and plan of this one UPDATE were some 600k of the call's 3.5M server
-- instructions. As plpgsql its statement is planned once per session and kept (generically on
-- the completer's session, `worker_session_generic_plans`; by PostgreSQL's own choice
-- elsewhere). The UPDATE, its SET list and its index condition on `id` are unchanged.

CREATE OR REPLACE FUNCTION _claim_ids(p_ids uuid[], p_worker_id text, p_lease_s double precision,
                                      p_now timestamptz)
RETURNS SETOF job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
        UPDATE job_run r
        SET status = 'running', attempts = r.attempts + 1, fence = _new_fence(),
            claimed_at = p_now, started_at = coalesce(r.started_at, p_now),
            leased_by = p_worker_id,
            lease_expires_at = p_now + make_interval(secs => p_lease_s), updated_at = p_now
        WHERE r.id = ANY (p_ids)
        RETURNING r.*;
END
$$;
