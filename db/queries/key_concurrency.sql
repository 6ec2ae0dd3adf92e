-- Named queries of key_concurrency (migration 0021): a concurrency key's current limit, which
-- the keyed claim reads instead of the one its runs were enqueued with.

-- name: key_concurrency_resize
-- Adaptive shares (webhooks: one key per endpoint): per key, `overloaded` attempts halve its
-- limit once each (down to 1); none, it grows by `grow` steps (up to `share_max`). A key without a row
-- starts from `share_start`. Read and written in one statement; two workers resizing one key at
-- once may each apply their change to the same old value (a share is a heuristic, not a count).
-- A pinned key (0029: an ordered webhook endpoint's 1) is left as it is. Returns each key's limit
-- after, for the keys it wrote.
WITH r AS (
    SELECT u.key, CASE WHEN u.overloaded > 0
                       THEN greatest(1, c.share >> least(u.overloaded, 30))
                       ELSE least(%(share_max)s::integer, c.share + greatest(u.grow, 1))
                  END AS share
    FROM unnest(%(keys)s::text[], %(overloaded)s::integer[], %(grow)s::integer[])
         AS u(key, overloaded, grow)
    LEFT JOIN {schema}.key_concurrency k ON k.key = u.key
    CROSS JOIN LATERAL (SELECT coalesce(k.concurrency_limit, %(share_start)s::integer) AS share) c
    ORDER BY u.key
)
INSERT INTO {schema}.key_concurrency AS kc (key, concurrency_limit, updated_at)
SELECT r.key, r.share, coalesce(%(now)s::timestamptz, now()) FROM r
ON CONFLICT (key) DO UPDATE
SET concurrency_limit = excluded.concurrency_limit, updated_at = excluded.updated_at
WHERE kc.concurrency_limit <> excluded.concurrency_limit AND NOT kc.pinned
RETURNING key, concurrency_limit

-- name: key_concurrency_pin
-- A key's limit set and pinned (0029): key_concurrency_resize leaves it alone from now on.
-- Returns the key and its limit.
INSERT INTO {schema}.key_concurrency AS kc (key, concurrency_limit, pinned, updated_at)
VALUES (%(key)s, %(limit)s, true, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (key) DO UPDATE
SET concurrency_limit = excluded.concurrency_limit, pinned = true,
    updated_at = excluded.updated_at
RETURNING key, concurrency_limit

-- name: key_concurrency_unpin
-- A pinned key let go: its row goes, so its limit is again the one its runs were enqueued with
-- and an adaptive share starts afresh. An unpinned row is left as it is.
DELETE FROM {schema}.key_concurrency WHERE key = %(key)s AND pinned
RETURNING key
