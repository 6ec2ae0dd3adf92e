-- Named queries about signals. A signal is delivered once: straight into the wait step of the
-- run waiting on its token the longest (notifyq.signal), or queued until a run's
-- ctx.wait_for_signal takes it (job_signal_consume) or the purger expires it.

-- name: job_signal_send
-- signal() for the runs of `tenant_ids` (NULL: every run, queued when none waits; with tenants,
-- delivered to a run of theirs that waits now or dropped: see _signal, migration 0016).
SELECT {schema}._signal(%(token)s, %(payload)s::jsonb, %(tenant_ids)s::text[]) AS woken

-- name: job_signal_consume
-- A running run takes the oldest queued signal for its token and records it as its completed
-- wait step, in one statement under its fence: a run that lost its lease takes nothing, and a
-- signal taken is never lost between the DELETE and the step (one transaction). SKIP LOCKED: two
-- runs waiting on one token take two different signals.
WITH run AS (
    SELECT id FROM {schema}.job_run
    -- `(SELECT 'running')`: by primary key, never every running run (job_run_finish_and_claim).
    WHERE id = %(run_id)s AND fence = %(fence)s AND status = (SELECT 'running')
),
taken AS (
    DELETE FROM {schema}.job_signal s
    WHERE s.id = (SELECT q.id FROM {schema}.job_signal q
                  WHERE q.token = %(token)s
                  ORDER BY q.id
                  LIMIT 1
                  FOR UPDATE SKIP LOCKED)
      AND EXISTS (SELECT FROM run)
    RETURNING s.payload
),
step AS (
    INSERT INTO {schema}.job_step (run_id, step_id, seq, kind, status, output, attempts, attempt,
                                   started_at, finished_at)
    SELECT run.id, %(step_id)s, %(seq)s, 'signal', 'completed',
           jsonb_build_object('payload', taken.payload), 1, %(attempt)s,
           coalesce(%(started_at)s::timestamptz, now()), now()
    FROM run, taken
    ON CONFLICT (run_id, step_id) DO UPDATE
    SET status = excluded.status, output = excluded.output, finished_at = excluded.finished_at,
        seq = excluded.seq, attempt = excluded.attempt
    RETURNING run_id
)
SELECT taken.payload FROM taken, step

-- name: job_signal_purge_expired
-- Queued signals nobody waited for within the retention (purger.signal_retention_s), oldest
-- first, in one bounded batch.
WITH doomed AS (
    SELECT id FROM {schema}.job_signal
    WHERE created_at < coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => %(retention_s)s)
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.job_signal s USING doomed WHERE s.id = doomed.id
