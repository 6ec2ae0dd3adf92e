-- Named queries of the customer portal's sign-in links (notifyq/_webhooks/portal.py).

-- name: portal_link_insert
INSERT INTO {schema}.portal_link (code_hash, tenant_id, read_only, created_at, expires_at)
VALUES (%(code_hash)s, %(tenant_id)s, %(read_only)s, coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s))
RETURNING tenant_id, read_only, created_at, expires_at

-- name: portal_link_redeem
-- Spends the link: only an unused, unexpired one matches, and only once (the row lock makes a
-- second concurrent exchange wait, then find used_at set).
UPDATE {schema}.portal_link
SET used_at = coalesce(%(now)s::timestamptz, now())
WHERE code_hash = %(code_hash)s
  AND used_at IS NULL
  AND expires_at > coalesce(%(now)s::timestamptz, now())
RETURNING tenant_id, read_only

-- name: portal_link_purge
-- Links and sessions expired for a day (a day kept: "used" or "expired" stays checkable for a
-- while); run when a link is minted and by the purger's tick, so the tables stay as small as
-- their live rows.
WITH links AS (
    DELETE FROM {schema}.portal_link
    WHERE expires_at < coalesce(%(now)s::timestamptz, now()) - interval '1 day'
    RETURNING 1
), sessions AS (
    DELETE FROM {schema}.portal_session
    WHERE expires_at < coalesce(%(now)s::timestamptz, now()) - interval '1 day'
    RETURNING 1
)
SELECT (SELECT count(*) FROM links) AS links, (SELECT count(*) FROM sessions) AS sessions
