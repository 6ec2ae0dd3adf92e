-- Named queries of the customer portal's sessions (notifyq/_webhooks/portal.py).

-- name: portal_session_insert
INSERT INTO {schema}.portal_session (cookie_hash, tenant_id, read_only, token_name, created_at,
                                     expires_at)
VALUES (%(cookie_hash)s, %(tenant_id)s, %(read_only)s, %(token_name)s,
        coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(session_s)s))
RETURNING tenant_id, read_only, token_name, expires_at

-- name: portal_session_get
SELECT tenant_id, read_only, token_name, expires_at
FROM {schema}.portal_session
WHERE cookie_hash = %(cookie_hash)s
  AND expires_at > coalesce(%(now)s::timestamptz, now())

-- name: portal_session_delete
DELETE FROM {schema}.portal_session WHERE cookie_hash = %(cookie_hash)s RETURNING tenant_id
