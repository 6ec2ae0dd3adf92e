-- Named queries for master-key versions and key rotations (secret.reencrypt).

-- name: key_version_register
-- Records the check value of every configured version not seen before; existing rows are kept
-- (the caller compares them: a different value means a different key under the same version).
INSERT INTO {schema}.key_version (version, check_value, first_seen_at)
SELECT v, c, coalesce(%(now)s::timestamptz, now())
FROM unnest(%(versions)s::integer[], %(check_values)s::bytea[]) AS k(v, c)
ON CONFLICT (version) DO NOTHING

-- name: key_version_list
SELECT version, check_value, first_seen_at, retired_at FROM {schema}.key_version ORDER BY version

-- name: key_version_retire
UPDATE {schema}.key_version
SET retired_at = coalesce(retired_at, coalesce(%(now)s::timestamptz, now()))
WHERE version = %(version)s
RETURNING version, retired_at

-- name: key_rotation_lock
-- Serializes "is a rotation running? else start one" and retirement (transaction-scoped).
SELECT pg_advisory_xact_lock(hashtext('notifyq.key_rotation'))

-- name: key_rotation_register
INSERT INTO {schema}.key_rotation (run_id, target_version, created_at)
VALUES (%(run_id)s, %(target_version)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (run_id) DO NOTHING

-- name: key_rotation_get
-- The rotation a secret.reencrypt run belongs to: KeyAdmin.rotate registers it in the transaction
-- that enqueues the run, so a run without one was not started by a rotation (issue 31).
SELECT run_id, target_version FROM {schema}.key_rotation WHERE run_id = %(run_id)s

-- name: key_rotation_find_active
-- The rotation still pending, running or waiting, if any.
SELECT k.run_id, k.target_version, r.status
FROM {schema}.key_rotation k JOIN {schema}.job_run r ON r.id = k.run_id
WHERE r.status IN ('pending', 'running', 'waiting')
ORDER BY k.created_at DESC
LIMIT 1

-- name: key_rotation_latest
SELECT k.run_id, k.target_version, k.created_at, r.status, r.attempts, r.started_at,
       r.finished_at
FROM {schema}.key_rotation k JOIN {schema}.job_run r ON r.id = k.run_id
ORDER BY k.created_at DESC
LIMIT 1

-- name: key_rotation_progress_start
-- The column's checkpoint, created at pass 1 the first time this run reaches the column.
WITH ins AS (
    INSERT INTO {schema}.key_rotation_progress (run_id, column_name)
    VALUES (%(run_id)s, %(column_name)s)
    ON CONFLICT (run_id, column_name) DO NOTHING
    RETURNING *
)
SELECT * FROM ins
UNION ALL
SELECT * FROM {schema}.key_rotation_progress
WHERE run_id = %(run_id)s AND column_name = %(column_name)s

-- name: key_rotation_progress_list
SELECT * FROM {schema}.key_rotation_progress WHERE run_id = %(run_id)s ORDER BY column_name

-- name: key_rotation_watch
-- One poll of `notifyq keys rotate --wait`: the run's state; how long it has been due without a
-- worker claiming it (`unclaimed_s`: pending past its run_at) or held by a worker that stopped
-- renewing its lease (`lease_lapsed_s`: running past lease_expires_at); and per column the
-- checkpoint with the rows it could not decrypt. No row when the run is gone.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT r.status, r.pool, r.attempts, r.max_attempts, r.error ->> 'message' AS error,
       CASE WHEN r.status = 'pending'
            THEN extract(epoch FROM n.now - r.run_at)::float8 END AS unclaimed_s,
       CASE WHEN r.status = 'running'
            THEN extract(epoch FROM n.now - r.lease_expires_at)::float8 END AS lease_lapsed_s,
       coalesce(c.columns, '[]'::jsonb) AS columns
FROM {schema}.job_run r
CROSS JOIN n
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'column', p.column_name, 'pass', p.pass, 'reencrypted', p.reencrypted,
               'conflicts', p.conflicts, 'finished', p.finished_at IS NOT NULL,
               'undecryptable', (SELECT count(*) FROM {schema}.key_rotation_failure f
                                 WHERE f.run_id = p.run_id AND f.column_name = p.column_name))
           ORDER BY p.column_name) AS columns
    FROM {schema}.key_rotation_progress p
    WHERE p.run_id = r.id
) c ON true
WHERE r.id = %(run_id)s

-- name: key_rotation_progress_checkpoint
-- Committed in the batch's own transaction: the batch and its checkpoint land together.
UPDATE {schema}.key_rotation_progress
SET last_pk = %(last_pk)s, pass_changes = pass_changes + %(attempted)s,
    reencrypted = reencrypted + %(reencrypted)s, conflicts = conflicts + %(conflicts)s,
    batches = batches + 1, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE run_id = %(run_id)s AND column_name = %(column_name)s
RETURNING *

-- name: key_rotation_progress_next_pass
UPDATE {schema}.key_rotation_progress
SET pass = pass + 1, last_pk = NULL, pass_changes = 0,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE run_id = %(run_id)s AND column_name = %(column_name)s
RETURNING *

-- name: key_rotation_progress_finish
UPDATE {schema}.key_rotation_progress
SET finished_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE run_id = %(run_id)s AND column_name = %(column_name)s
RETURNING *

-- name: key_rotation_failure_record
INSERT INTO {schema}.key_rotation_failure (run_id, column_name, row_pk, reason)
SELECT %(run_id)s, %(column_name)s, pk, reason
FROM unnest(%(row_pks)s::text[], %(reasons)s::text[]) AS f(pk, reason)
ON CONFLICT (run_id, column_name, row_pk) DO NOTHING

-- name: key_rotation_failure_list
SELECT column_name, row_pk, reason FROM {schema}.key_rotation_failure
WHERE run_id = %(run_id)s
ORDER BY column_name, recorded_at, row_pk
LIMIT %(limit)s

-- name: key_rotation_failure_count
SELECT count(*) AS n FROM {schema}.key_rotation_failure WHERE run_id = %(run_id)s

-- name: key_rotation_lock_timeout
-- Re-encryption must never make live traffic wait: a batch that meets a locked row gives up
-- after this (55P03) and is retried later.
SELECT set_config('lock_timeout', %(lock_timeout)s, true)
