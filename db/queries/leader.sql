-- Named queries for leader election: one row per role, held while unexpired.

-- name: leader_attempt_elect
-- Takes the role when it is free or expired, or extends it when we already hold it.
-- Returns a row only when we lead after this statement.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
INSERT INTO {schema}.leader AS l (name, leader_id, elected_at, expires_at)
SELECT %(name)s, %(leader_id)s, n.now, n.now + make_interval(secs => %(ttl_s)s) FROM n
ON CONFLICT (name) DO UPDATE
SET leader_id = excluded.leader_id, expires_at = excluded.expires_at,
    elected_at = CASE WHEN l.leader_id = excluded.leader_id THEN l.elected_at
                      ELSE excluded.elected_at END
WHERE l.leader_id = excluded.leader_id OR l.expires_at < excluded.elected_at
RETURNING l.leader_id

-- name: leader_resign
DELETE FROM {schema}.leader WHERE name = %(name)s AND leader_id = %(leader_id)s

-- name: leader_list
-- Who holds each role now (`alive`: the lease has not expired on the database clock).
SELECT name, leader_id, elected_at, expires_at,
       expires_at > coalesce(%(now)s::timestamptz, now()) AS alive
FROM {schema}.leader
ORDER BY name
