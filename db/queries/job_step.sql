-- Named queries about memoized steps.

-- name: job_step_list
SELECT step_id, seq, kind, status, output, error, attempts, attempt, started_at, finished_at
FROM {schema}.job_step
WHERE run_id = %(run_id)s
ORDER BY seq, step_id

-- name: job_step_record
-- Memoizes a step's result under the run's fence: a worker whose lease was taken over writes
-- nothing (no row back). Re-running a step (a retry that does not reuse it) overwrites it.
-- The commit does not wait for the WAL flush (synchronous_commit off for this transaction
-- only): a record lost in a PostgreSQL crash means the step runs again on the retry, which is
-- the at-least-once contract steps already have. It saves the fsync on every step.
WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO {schema}.job_step (run_id, step_id, seq, kind, status, output, error, attempts,
                               attempt, started_at, finished_at)
SELECT r.id, %(step_id)s, %(seq)s, %(kind)s, %(status)s, %(output)s::jsonb, %(error)s::jsonb,
       %(attempts)s, %(attempt)s, %(started_at)s, coalesce(%(now)s::timestamptz, now())
FROM {schema}.job_run r, async_commit
-- `(SELECT 'running')`: by primary key, never every running run (job_run_finish_and_claim).
WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.status = (SELECT 'running')
ON CONFLICT (run_id, step_id) DO UPDATE
SET seq = excluded.seq, kind = excluded.kind, status = excluded.status, output = excluded.output,
    error = excluded.error, attempts = job_step.attempts + excluded.attempts,
    attempt = excluded.attempt, started_at = excluded.started_at,
    finished_at = excluded.finished_at
RETURNING step_id

-- name: job_step_replay_from
-- A replay from the step at `seq` (execution order): that step and every later one are deleted,
-- so they run again; the earlier ones are carried into the coming attempt (`attempt`, the
-- run's attempts + 1), so the replay reuses them whatever the handler's replay_from says, as a
-- resume within one attempt does (notifyq/_durable/session.py, _reusable).
WITH dropped AS (
    DELETE FROM {schema}.job_step WHERE run_id = %(run_id)s AND seq >= %(seq)s RETURNING step_id
), kept AS (
    UPDATE {schema}.job_step SET attempt = %(attempt)s
    WHERE run_id = %(run_id)s AND seq < %(seq)s
    RETURNING step_id
)
SELECT (SELECT count(*) FROM dropped) AS dropped, (SELECT count(*) FROM kept) AS kept
