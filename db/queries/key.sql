-- Named queries for master-key versions and key rotations (secret.reencrypt).

-- name: key_version_register
-- Records the check value of every configured version not seen before; existing rows are kept
-- (the caller compares them: a different value means a different key under the same version).
INSERT INTO {schema}.key_version (version, check_value, first_seen_at)
SELECT v, c, coalesce(%(now)s::timestamptz, now())
FROM unnest(%(versions)s::integer[], %(check_values)s::bytea[]) AS k(v, c)
ON CONFLICT (version) DO NOTHING

-- name: key_version_list
-- Every recorded version; `active`: the cluster's active version (key_active, 0023).
SELECT v.version, v.check_value, v.first_seen_at, v.retired_at, v.promoted_at,
       (a.version IS NOT NULL) AS active
FROM {schema}.key_version v LEFT JOIN {schema}.key_active a ON a.version = v.version
ORDER BY v.version

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
-- The latest rotation, its throttle and pauses, and the database's clock (`now`: its rate while
-- it runs is measured up to now).
SELECT k.run_id, k.target_version, k.created_at, k.rate_per_s, k.paused_at, k.paused_s,
       r.status, r.attempts, r.started_at, r.finished_at, r.input,
       coalesce(%(now)s::timestamptz, now()) AS now
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
-- checkpoint with the rows it could not decrypt; `paused` when an operator paused it. No row when
-- the run is gone.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT r.status, r.pool, r.attempts, r.max_attempts, r.error ->> 'message' AS error,
       (SELECT k.paused_at IS NOT NULL FROM {schema}.key_rotation k WHERE k.run_id = r.id)
           AS paused,
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

-- name: key_active_get
-- The cluster's active key version and who promoted it; no row before the first process set it.
SELECT version, promoted_at, promoted_by, forced FROM {schema}.key_active

-- name: key_active_promote
-- Makes %(version)s the version every process encrypts under; run after key_rotation_lock, in
-- the same transaction. Writes nothing, and says why, when the version is unknown (no process
-- recorded it) or retired, when a rotation to another version is unfinished, when a live
-- process (key_holder, not expired) does not hold it by its check value (unless %(force)s), or
-- with %(first_time)s (a process's NOTIFYQ_ACTIVE_KEY_VERSION) when it was ever active before.
-- A promotion is announced on the channel as `k:<version>` (workers re-check their keys at once).
-- One row: the outcome, the version active before, the processes that lack it, the rotation in
-- the way, and promoted_at when it was written.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
target AS (
    SELECT version, check_value, retired_at, promoted_at FROM {schema}.key_version
    WHERE version = %(version)s
),
was AS (SELECT version FROM {schema}.key_active),
rotating AS (
    SELECT k.run_id, k.target_version, r.status
    FROM {schema}.key_rotation k JOIN {schema}.job_run r ON r.id = k.run_id
    WHERE r.status IN ('pending', 'running', 'waiting') AND k.target_version <> %(version)s
    ORDER BY k.created_at DESC
    LIMIT 1
),
lacking AS (
    SELECT h.id, h.role, h.host, h.pid, h.versions
    FROM {schema}.key_holder h, n
    WHERE h.expires_at > n.now
      AND NOT EXISTS (SELECT FROM target t, unnest(h.versions, h.check_values) AS x(v, c)
                      WHERE x.v = t.version AND x.c = t.check_value)
),
verdict AS (
    SELECT CASE
        WHEN NOT EXISTS (SELECT FROM target) THEN 'unknown'
        WHEN (SELECT retired_at FROM target) IS NOT NULL THEN 'retired'
        WHEN EXISTS (SELECT FROM was WHERE version = %(version)s) THEN 'unchanged'
        WHEN %(first_time)s AND (SELECT promoted_at FROM target) IS NOT NULL THEN 'not_first'
        WHEN EXISTS (SELECT FROM rotating) THEN 'rotating'
        WHEN EXISTS (SELECT FROM lacking) AND NOT %(force)s THEN 'lacking'
        ELSE 'promoted' END AS outcome
),
written AS (
    INSERT INTO {schema}.key_active AS a (singleton, version, promoted_at, promoted_by, forced)
    SELECT true, %(version)s, n.now, %(by)s, EXISTS (SELECT FROM lacking)
    FROM n, verdict
    WHERE verdict.outcome = 'promoted'
    ON CONFLICT (singleton) DO UPDATE
    SET version = excluded.version, promoted_at = excluded.promoted_at,
        promoted_by = excluded.promoted_by, forced = excluded.forced
    RETURNING a.version, a.promoted_at
),
marked AS (
    UPDATE {schema}.key_version v SET promoted_at = w.promoted_at
    FROM written w WHERE v.version = w.version
    RETURNING v.version
),
announced AS (
    SELECT pg_notify(%(channel)s, 'k:' || w.version) FROM written w
)
SELECT verdict.outcome, (SELECT version FROM was) AS previous,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                    'id', l.id, 'role', l.role, 'host', l.host, 'pid', l.pid,
                    'versions', to_jsonb(l.versions)) ORDER BY l.role, l.host, l.pid, l.id),
                '[]'::jsonb) FROM lacking l) AS lacking,
       (SELECT to_jsonb(r) FROM rotating r) AS rotation,
       (SELECT promoted_at FROM written) AS promoted_at,
       (SELECT count(*) FROM marked) + (SELECT count(*) FROM announced) AS writes
FROM verdict

-- name: key_announce
-- Tells every worker to check its keys now (`k:<version>`: a version retired).
SELECT pg_notify(%(channel)s, 'k:' || %(version)s::text)

-- name: key_holder_record
-- A process's key check: the versions it holds (with their check values) and the one it
-- encrypts under, alive for %(ttl_s)s seconds. The first record keeps its started_at.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
INSERT INTO {schema}.key_holder AS h (id, role, host, pid, versions, check_values,
                                      encrypts_with, interval_s, started_at, checked_at,
                                      expires_at)
SELECT %(id)s, %(role)s, %(host)s, %(pid)s, %(versions)s::integer[], %(check_values)s::bytea[],
       %(encrypts_with)s, %(interval_s)s, n.now, n.now,
       n.now + make_interval(secs => %(ttl_s)s)
FROM n
ON CONFLICT (id) DO UPDATE
SET role = excluded.role, versions = excluded.versions, check_values = excluded.check_values,
    encrypts_with = excluded.encrypts_with, interval_s = excluded.interval_s,
    checked_at = excluded.checked_at, expires_at = excluded.expires_at

-- name: key_holder_leave
DELETE FROM {schema}.key_holder WHERE id = %(id)s

-- name: key_holder_list
-- The live key holders on the database clock, by role then host and pid.
SELECT id, role, host, pid, versions, encrypts_with, interval_s, started_at, checked_at,
       expires_at
FROM {schema}.key_holder
WHERE expires_at > coalesce(%(now)s::timestamptz, now())
ORDER BY role, host, pid, id

-- name: key_holder_reap_expired
-- Leader-only (the reaper): rows of processes that stopped checking their keys without leaving.
DELETE FROM {schema}.key_holder
WHERE expires_at <= coalesce(%(now)s::timestamptz, now())
RETURNING id

-- name: key_holder_stale_writers
-- Live processes that may still encrypt under another version than %(version)s: their last
-- check said so, and their next one (due interval_s after it, at their next encrypt) may not
-- have happened yet. The rotation waits for them before it scans.
SELECT id, role, host, pid, encrypts_with
FROM {schema}.key_holder
WHERE expires_at > coalesce(%(now)s::timestamptz, now())
  AND encrypts_with IS DISTINCT FROM %(version)s AND encrypts_with IS NOT NULL
  AND checked_at + make_interval(secs => interval_s) > coalesce(%(now)s::timestamptz, now())
ORDER BY role, host, pid, id

-- name: key_rotation_control
-- Read before every batch of a rotation: its throttle and whether an operator paused it.
SELECT rate_per_s, paused_at IS NOT NULL AS paused
FROM {schema}.key_rotation WHERE run_id = %(run_id)s

-- name: key_rotation_throttle
-- Sets (or, with NULL, lifts) a rotation's rate limit in rows per second.
UPDATE {schema}.key_rotation SET rate_per_s = %(rate_per_s)s
WHERE run_id = %(run_id)s
RETURNING run_id, rate_per_s

-- name: key_rotation_pause
-- Pauses the unfinished rotation, if any (a paused one stays paused since its first pause). Its
-- run sees it before its next batch and steps aside (snoozed) until it is resumed.
UPDATE {schema}.key_rotation k
SET paused_at = coalesce(k.paused_at, coalesce(%(now)s::timestamptz, now()))
FROM {schema}.job_run r
WHERE r.id = k.run_id AND r.status IN ('pending', 'running', 'waiting')
RETURNING k.run_id, k.target_version, k.paused_at, r.status

-- name: key_rotation_resume
-- Resumes a paused rotation: the time it spent paused is added to paused_s, and its run, if
-- snoozed, is due again now (the caller wakes its pool). No row: nothing was paused.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
resumed AS (
    UPDATE {schema}.key_rotation k
    SET paused_at = NULL,
        paused_s = k.paused_s + greatest(extract(epoch FROM n.now - k.paused_at)::float8, 0)
    FROM n
    WHERE k.paused_at IS NOT NULL
      AND EXISTS (SELECT FROM {schema}.job_run r
                  WHERE r.id = k.run_id AND r.status IN ('pending', 'running', 'waiting'))
    RETURNING k.run_id, k.target_version
),
due AS (
    UPDATE {schema}.job_run r SET run_at = n.now, updated_at = n.now
    FROM resumed, n
    WHERE r.id = resumed.run_id AND r.status = 'pending' AND r.run_at > n.now
    RETURNING r.id
)
SELECT resumed.run_id, resumed.target_version, r.pool, r.status,
       EXISTS (SELECT FROM due) AS woken
FROM resumed JOIN {schema}.job_run r ON r.id = resumed.run_id
