-- Named queries about job definitions (one row per handler type).

-- name: job_upsert
-- Written by each worker at start for every handler it serves, so enqueuers in other processes
-- (or plain SQL) apply the same defaults.
INSERT INTO {schema}.job AS job (type, version, pool, priority_default, max_attempts,
    retry_policy, timeout_s, concurrency_key_template, concurrency_collision, concurrency_limit,
    dedupe_key_template, dedupe_window_s, replay_from, scope_entity_type, scope_id_template,
    dedupe_states, rate_limit, rate_period_s, rate_key_template)
VALUES (%(type)s, %(version)s, %(pool)s, %(priority)s, %(max_attempts)s, %(retry_policy)s,
        %(timeout_s)s, %(concurrency_key_template)s, %(concurrency_collision)s,
        %(concurrency_limit)s, %(dedupe_key_template)s, %(dedupe_window_s)s, %(replay_from)s,
        %(scope_entity_type)s, %(scope_id_template)s, %(dedupe_states)s, %(rate_limit)s,
        %(rate_period_s)s, %(rate_key_template)s)
ON CONFLICT (type) DO UPDATE
SET version = excluded.version, pool = excluded.pool, priority_default = excluded.priority_default,
    max_attempts = excluded.max_attempts, retry_policy = excluded.retry_policy,
    timeout_s = excluded.timeout_s, concurrency_key_template = excluded.concurrency_key_template,
    concurrency_collision = excluded.concurrency_collision,
    concurrency_limit = excluded.concurrency_limit,
    dedupe_key_template = excluded.dedupe_key_template,
    dedupe_window_s = excluded.dedupe_window_s, replay_from = excluded.replay_from,
    scope_entity_type = excluded.scope_entity_type,
    scope_id_template = excluded.scope_id_template, dedupe_states = excluded.dedupe_states,
    rate_limit = excluded.rate_limit, rate_period_s = excluded.rate_period_s,
    rate_key_template = excluded.rate_key_template, updated_at = now()
WHERE (job.version, job.pool, job.priority_default, job.max_attempts, job.retry_policy,
       job.timeout_s, job.concurrency_key_template, job.concurrency_collision,
       job.concurrency_limit, job.dedupe_key_template, job.dedupe_window_s, job.replay_from,
       job.scope_entity_type, job.scope_id_template, job.dedupe_states, job.rate_limit,
       job.rate_period_s, job.rate_key_template) IS DISTINCT FROM
      (excluded.version, excluded.pool, excluded.priority_default, excluded.max_attempts,
       excluded.retry_policy, excluded.timeout_s, excluded.concurrency_key_template,
       excluded.concurrency_collision, excluded.concurrency_limit, excluded.dedupe_key_template,
       excluded.dedupe_window_s, excluded.replay_from, excluded.scope_entity_type,
       excluded.scope_id_template, excluded.dedupe_states, excluded.rate_limit,
       excluded.rate_period_s, excluded.rate_key_template)

-- name: job_list
SELECT * FROM {schema}.job ORDER BY type

-- name: job_pool_list
-- The pools known without a live run in them: those of registered job types and those live
-- workers claim from (the overview lists them idle, so one can be paused before a backlog).
SELECT pool FROM {schema}.job
UNION
SELECT unnest(pools) FROM {schema}.worker
WHERE expires_at > coalesce(%(now)s::timestamptz, now())
ORDER BY pool
