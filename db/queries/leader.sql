-- Named queries for leader election: one row per role, held while unexpired.

-- name: leader_attempt_elect
-- Takes the role when it is free or expired, or extends it when we already hold it. One row
-- back: `won` (we lead after this statement) and `expires_in_s`, the seconds our role has left
-- when we won, else the holder's (as this statement's snapshot saw its row; NULL when it had
-- none), so that a follower tries again the moment the holder's role runs out.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
elected AS (
    INSERT INTO {schema}.leader AS l (name, leader_id, elected_at, expires_at)
    SELECT %(name)s, %(leader_id)s, n.now, n.now + make_interval(secs => %(ttl_s)s) FROM n
    ON CONFLICT (name) DO UPDATE
    SET leader_id = excluded.leader_id, expires_at = excluded.expires_at,
        elected_at = CASE WHEN l.leader_id = excluded.leader_id THEN l.elected_at
                          ELSE excluded.elected_at END
    WHERE l.leader_id = excluded.leader_id OR l.expires_at < excluded.elected_at
    RETURNING l.expires_at
)
SELECT EXISTS (SELECT FROM elected) AS won,
       extract(epoch FROM coalesce((SELECT expires_at FROM elected),
                                   (SELECT expires_at FROM {schema}.leader
                                    WHERE name = %(name)s)) - n.now)::float8 AS expires_in_s
FROM n

-- name: leader_resign
DELETE FROM {schema}.leader WHERE name = %(name)s AND leader_id = %(leader_id)s

-- name: leader_list
-- Who holds each role now (`alive`: the lease has not expired on the database clock).
SELECT name, leader_id, elected_at, expires_at,
       expires_at > coalesce(%(now)s::timestamptz, now()) AS alive
FROM {schema}.leader
ORDER BY name
