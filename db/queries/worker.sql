-- Named queries for the worker registry: one row per live worker process, renewed by its
-- heartbeat (see 0009_worker_registry).

-- name: worker_register
-- At start (and again if the reaper removed the row while the worker was cut off).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
INSERT INTO {schema}.worker AS w (id, host, pid, version, pools, concurrency, running,
                                  started_at, heartbeat_at, expires_at)
SELECT %(id)s, %(host)s, %(pid)s, %(version)s, %(pools)s, %(concurrency)s, %(running)s,
       n.now, n.now, n.now + make_interval(secs => %(ttl_s)s)
FROM n
ON CONFLICT (id) DO UPDATE
SET running = excluded.running, heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at

-- name: worker_heartbeat
-- Returns a row while the worker is registered; none tells it to register again.
UPDATE {schema}.worker
SET running = %(running)s, heartbeat_at = coalesce(%(now)s::timestamptz, now()),
    expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s)
WHERE id = %(id)s
RETURNING id

-- name: worker_leave
DELETE FROM {schema}.worker WHERE id = %(id)s

-- name: worker_list
-- The workers alive on the database clock, oldest first.
SELECT id, host, pid, version, pools, concurrency, running, started_at, heartbeat_at,
       expires_at
FROM {schema}.worker
WHERE expires_at > coalesce(%(now)s::timestamptz, now())
ORDER BY started_at, id

-- name: worker_reap_expired
-- Leader-only (the reaper): rows of workers that stopped heartbeating without leaving.
DELETE FROM {schema}.worker
WHERE expires_at <= coalesce(%(now)s::timestamptz, now())
RETURNING id
