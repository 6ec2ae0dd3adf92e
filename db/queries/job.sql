-- Named queries about job definitions (one row per handler type).

-- name: job_upsert
-- Written by each worker at start for every handler it serves, so enqueuers in other processes
-- (or plain SQL) apply the same defaults.
INSERT INTO {schema}.job (type, version, pool, priority_default, max_attempts, retry_policy,
                          timeout_s)
VALUES (%(type)s, %(version)s, %(pool)s, %(priority)s, %(max_attempts)s, %(retry_policy)s,
        %(timeout_s)s)
ON CONFLICT (type) DO UPDATE
SET version = excluded.version, pool = excluded.pool, priority_default = excluded.priority_default,
    max_attempts = excluded.max_attempts, retry_policy = excluded.retry_policy,
    timeout_s = excluded.timeout_s, updated_at = now()
WHERE (job.version, job.pool, job.priority_default, job.max_attempts, job.retry_policy,
       job.timeout_s) IS DISTINCT FROM
      (excluded.version, excluded.pool, excluded.priority_default, excluded.max_attempts,
       excluded.retry_policy, excluded.timeout_s)

-- name: job_list
SELECT * FROM {schema}.job ORDER BY type
