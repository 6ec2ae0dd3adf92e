-- Named queries of webhook endpoints' signing secrets (stored as keyring ciphertexts).

-- name: webhook_secret_insert
INSERT INTO {schema}.webhook_secret (id, endpoint_id, ciphertext, created_at)
VALUES (%(id)s, %(endpoint_id)s, %(ciphertext)s, coalesce(%(now)s::timestamptz, now()))

-- name: webhook_secret_expire
-- A rotation: the secrets valid now stay valid until `expires_at` (the grace period), no longer.
UPDATE {schema}.webhook_secret
SET expires_at = %(expires_at)s::timestamptz
WHERE endpoint_id = %(endpoint_id)s
  AND (expires_at IS NULL OR expires_at > %(expires_at)s::timestamptz)

-- name: webhook_secret_expiry
-- When the secrets replaced by a rotation stop signing (on the database clock unless given).
SELECT coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(grace_s)s) AS expires_at
