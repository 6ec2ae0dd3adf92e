-- Named queries of the admin HTTP API (`notifyq serve`): a job's children, shown with it (its steps
-- come from job_step_list).

-- name: job_run_list_children
-- A run's children (spawned with ctx.spawn_child), oldest first. UUIDv7 ids order by
-- millisecond only (random bits within one), so created_at decides first.
SELECT * FROM {schema}.job_run
WHERE parent_run_id = %(parent_run_id)s
ORDER BY created_at, id
LIMIT %(limit)s
