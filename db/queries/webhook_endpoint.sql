-- Named queries of webhook endpoints (notifyq.webhooks); their secrets are in webhook_secret.sql.

-- name: webhook_endpoint_insert
INSERT INTO {schema}.webhook_endpoint (url, description, event_types, headers, disabled_at,
                                       disabled_reason, created_at, updated_at)
VALUES (%(url)s, %(description)s, %(event_types)s::text[], %(headers)s::jsonb,
        CASE WHEN %(enabled)s THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
        CASE WHEN %(enabled)s THEN NULL ELSE 'created disabled' END,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
RETURNING *

-- name: webhook_endpoint_get
SELECT e.*, (SELECT count(*) FROM {schema}.webhook_secret s
             WHERE s.endpoint_id = e.id
               AND (s.expires_at IS NULL OR s.expires_at > coalesce(%(now)s::timestamptz, now()))
            ) AS valid_secrets
FROM {schema}.webhook_endpoint e
WHERE e.id = %(id)s

-- name: webhook_endpoint_list
-- Oldest first (ids are UUIDv7); keyset paging with `after`.
SELECT e.*, (SELECT count(*) FROM {schema}.webhook_secret s
             WHERE s.endpoint_id = e.id
               AND (s.expires_at IS NULL OR s.expires_at > coalesce(%(now)s::timestamptz, now()))
            ) AS valid_secrets
FROM {schema}.webhook_endpoint e
WHERE (%(after)s::uuid IS NULL OR e.id > %(after)s::uuid)
  AND (%(enabled)s::boolean IS NULL OR (e.disabled_at IS NULL) = %(enabled)s::boolean)
ORDER BY e.id
LIMIT %(limit)s

-- name: webhook_endpoint_update
-- NULL leaves a field as it is; event_types is replaced only when set_event_types (NULL there
-- means "every event type").
UPDATE {schema}.webhook_endpoint
SET url = coalesce(%(url)s, url),
    description = coalesce(%(description)s, description),
    event_types = CASE WHEN %(set_event_types)s THEN %(event_types)s::text[] ELSE event_types END,
    headers = coalesce(%(headers)s::jsonb, headers),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *

-- name: webhook_endpoint_disable
-- Keeps the first reason and time when it is disabled already.
UPDATE {schema}.webhook_endpoint
SET disabled_reason = CASE WHEN disabled_at IS NULL THEN %(reason)s ELSE disabled_reason END,
    disabled_at = coalesce(disabled_at, coalesce(%(now)s::timestamptz, now())),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *

-- name: webhook_endpoint_enable
-- A fresh start: the failure streak is forgotten too.
UPDATE {schema}.webhook_endpoint
SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *

-- name: webhook_endpoint_delete
DELETE FROM {schema}.webhook_endpoint WHERE id = %(id)s RETURNING id
