-- Named queries of webhook endpoints (notifyq.webhooks); their secrets are in webhook_secret.sql.

-- name: webhook_endpoint_fan_out
-- send_many by COPY (notifyq/_webhooks/fanout.py): what _send_webhooks_rows joins, read once for
-- the batch: the statement's now(), the webhook.deliver definition (all NULL without one), and
-- one row per endpoint a message of the batch may go to (enabled and subscribed to one of
-- `event_types` or to every type) or names (`endpoint_ids`, enabled or not: a missing one is
-- refused), by id; e.id NULL when there is none. `run_at`: as the function computes it.
SELECT now() AS now, d.type IS NOT NULL AS defined, d.version, d.priority_default, d.timeout_s,
       d.scope_entity_type, d.concurrency_key_template, d.concurrency_limit,
       e.id, e.event_types, e.disabled_at IS NULL AS enabled,
       greatest(now(), e.circuit_open_until) AS run_at
FROM (SELECT) one
LEFT JOIN {schema}.job d ON d.type = 'webhook.deliver'
LEFT JOIN {schema}.webhook_endpoint e
       ON (e.disabled_at IS NULL
           AND (e.event_types IS NULL OR e.event_types && %(event_types)s::text[]))
       OR e.id = ANY (%(endpoint_ids)s::uuid[])
ORDER BY e.id

-- name: webhook_endpoint_insert
INSERT INTO {schema}.webhook_endpoint (url, description, event_types, headers, disabled_at,
                                       disabled_reason, created_at, updated_at, tenant_id,
                                       rate_limit)
VALUES (%(url)s, %(description)s, %(event_types)s::text[], %(headers)s::jsonb,
        CASE WHEN %(enabled)s THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
        CASE WHEN %(enabled)s THEN NULL ELSE 'created disabled' END,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        %(tenant_id)s, %(rate_limit)s::integer)
RETURNING *

-- name: webhook_endpoint_seal_headers
-- The header values as one keyring ciphertext, the names with masked values in `headers` (0009).
UPDATE {schema}.webhook_endpoint
SET headers = %(headers)s::jsonb, header_values = %(header_values)s
WHERE id = %(id)s
RETURNING *

-- name: webhook_endpoint_list_unsealed
-- Endpoints written before 0014 whose header values are still in clear.
SELECT id, headers FROM {schema}.webhook_endpoint
WHERE header_values IS NULL AND headers <> '{{}}'::jsonb
ORDER BY id
LIMIT %(limit)s

-- name: webhook_endpoint_header_values
SELECT header_values, headers FROM {schema}.webhook_endpoint WHERE id = %(id)s

-- name: webhook_endpoint_in_tenants
-- The endpoint if it belongs to one of `tenant_ids` (NULL: any endpoint): what the admin API asks
-- before it acts on an endpoint for a tenant-scoped token (an endpoint's tenant never changes).
SELECT id FROM {schema}.webhook_endpoint
WHERE id = %(id)s
  AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))

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
  AND (%(tenant_ids)s::text[] IS NULL OR e.tenant_id = ANY (%(tenant_ids)s::text[]))
ORDER BY e.id
LIMIT %(limit)s

-- name: webhook_endpoint_update
-- NULL leaves a field as it is; event_types is replaced only when set_event_types (NULL there
-- means "every event type"), rate_limit only when set_rate_limit (NULL there: unlimited).
UPDATE {schema}.webhook_endpoint
SET url = coalesce(%(url)s, url),
    description = coalesce(%(description)s, description),
    event_types = CASE WHEN %(set_event_types)s THEN %(event_types)s::text[] ELSE event_types END,
    headers = coalesce(%(headers)s::jsonb, headers),
    rate_limit = CASE WHEN %(set_rate_limit)s THEN %(rate_limit)s::integer ELSE rate_limit END,
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
-- A fresh start: the failure streak is forgotten too and the circuit closed.
UPDATE {schema}.webhook_endpoint
SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL,
    consecutive_failures = 0, circuit_open_until = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *

-- name: webhook_endpoint_circuit_hold
-- A scheduled delivery to an endpoint whose circuit was open when it was loaded (0015). Past the
-- cooldown (half-open) the first delivery to ask takes the probe: the circuit stays open for
-- `probe_s` more (one attempt's time) so that the others wait for the probe's outcome. Returns
-- until when the circuit is open (NULL: it closed meanwhile) and whether this delivery is the
-- probe; a time already past without the probe means another delivery took it.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
probe AS (
    UPDATE {schema}.webhook_endpoint e
    SET circuit_open_until = n.now + make_interval(secs => %(probe_s)s::float8)
    FROM n
    WHERE e.id = %(endpoint_id)s AND e.circuit_open_until <= n.now
    RETURNING e.circuit_open_until
)
SELECT coalesce((SELECT circuit_open_until FROM probe), e.circuit_open_until) AS open_until,
       EXISTS (SELECT FROM probe) AS probe
FROM {schema}.webhook_endpoint e
WHERE e.id = %(endpoint_id)s

-- name: webhook_endpoint_delete
DELETE FROM {schema}.webhook_endpoint WHERE id = %(id)s RETURNING id

-- name: webhook_endpoint_health
-- Per endpoint (all when `ids` is NULL, those of `tenant_ids` unless NULL, at most `limit`): attempts and 2xx answers in the last
-- `window_s`,
-- the last attempt and the last failed one. Reads webhook_attempt_endpoint_idx (0008).
SELECT e.id AS endpoint_id, s.attempts, s.succeeded,
       l.created_at AS last_attempt_at, l.status_code AS last_status_code,
       f.created_at AS last_failure_at, f.status_code AS last_failure_status_code,
       f.error_kind AS last_failure_kind, f.error AS last_failure_error
FROM {schema}.webhook_endpoint e
CROSS JOIN LATERAL (
    SELECT count(*) AS attempts,
           count(*) FILTER (WHERE a.status_code BETWEEN 200 AND 299) AS succeeded
    FROM {schema}.webhook_attempt a
    WHERE a.endpoint_id = e.id
      AND a.created_at >= coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_s)s)
) s
LEFT JOIN LATERAL (
    SELECT created_at, status_code FROM {schema}.webhook_attempt a
    WHERE a.endpoint_id = e.id ORDER BY a.created_at DESC LIMIT 1
) l ON true
LEFT JOIN LATERAL (
    SELECT created_at, status_code, error_kind, error FROM {schema}.webhook_attempt a
    WHERE a.endpoint_id = e.id AND (a.status_code IS NULL OR a.status_code NOT BETWEEN 200 AND 299)
    ORDER BY a.created_at DESC LIMIT 1
) f ON true
WHERE (%(ids)s::uuid[] IS NULL OR e.id = ANY (%(ids)s::uuid[]))
  AND (%(tenant_ids)s::text[] IS NULL OR e.tenant_id = ANY (%(tenant_ids)s::text[]))
ORDER BY e.id
LIMIT %(limit)s

-- name: webhook_endpoint_set_ordered
-- Ordered or not (0029): one delivery at a time, in send order. The caller pins or unpins the
-- endpoint's concurrency key in the same transaction (key_concurrency_pin / _unpin).
UPDATE {schema}.webhook_endpoint
SET ordered = %(ordered)s, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *

-- name: webhook_endpoint_hold
-- The receiver answered 429 with Retry-After: the keyed claim passes the endpoint's key over
-- until `until` (migration 0028), new deliveries included; a later hold never shortens one.
-- Returns the hold in force.
INSERT INTO {schema}.key_rate AS k (key, held_until, updated_at)
VALUES ('webhook:' || %(endpoint_id)s::uuid, %(until)s::timestamptz,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (key) DO UPDATE
SET held_until = greatest(k.held_until, excluded.held_until), updated_at = excluded.updated_at
RETURNING held_until
