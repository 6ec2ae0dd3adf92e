-- Named queries for paused pools and job types (migration 0013). The claim reads the table in
-- job_run_claim and _claim_keyed; these only change and list it.

-- name: pause_set
-- Pauses a pool or a type. Pausing again keeps the first paused_at; a new reason replaces the
-- old one. `created` is false when it was paused already.
INSERT INTO {schema}.pause (kind, name, reason, paused_at)
VALUES (%(kind)s, %(name)s, %(reason)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (kind, name) DO UPDATE
SET reason = coalesce(excluded.reason, {schema}.pause.reason)
RETURNING kind, name, reason, paused_at, (xmax = 0) AS created

-- name: pause_clear
-- Resumes a pool or a type; no row back when it was not paused. `pools` are the pools to wake:
-- the pool itself, or for a type every pool a registered type runs in (its runs may sit in any
-- of them; one not listed is claimed at its workers' next poll).
WITH gone AS (
    DELETE FROM {schema}.pause WHERE kind = %(kind)s AND name = %(name)s
    RETURNING kind, name, reason, paused_at
)
SELECT gone.kind, gone.name, gone.reason, gone.paused_at,
       CASE WHEN gone.kind = 'pool' THEN ARRAY[gone.name]
            ELSE ARRAY(SELECT DISTINCT pool FROM {schema}.job ORDER BY pool) END AS pools
FROM gone

-- name: pause_list
SELECT kind, name, reason, paused_at FROM {schema}.pause ORDER BY kind, name
