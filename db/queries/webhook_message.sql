-- Named queries of webhook messages; their deliveries and attempts have files of their own.

-- name: webhook_message_send
-- In the caller's transaction when given its connection (see notifyq.send_webhook).
SELECT message_id, created, deliveries
FROM {schema}._send_webhook(%(event_type)s, %(payload)s::jsonb, %(endpoint_id)s::uuid,
                            %(idempotency_key)s)

-- name: webhook_message_send_many
-- Many messages in one statement (see notifyq._webhooks.service.Webhooks.send_many), in the
-- caller's transaction when given its connection; one row per message, in the order given.
SELECT ord, message_id, created, deliveries
FROM {schema}._send_webhooks(%(event_types)s::text[], %(payloads)s::text[],
                             %(endpoint_ids)s::uuid[], %(idempotency_keys)s::text[])

-- name: webhook_message_lock_keys
-- send_many by COPY (notifyq/_webhooks/fanout.py), first statement when the batch has
-- idempotency keys: the locks _send_webhooks takes, in the same order (so both paths and `send`
-- serialize on a key). A statement of its own: the next one must see what a sender holding a
-- lock committed before releasing it.
SELECT pg_advisory_xact_lock(hashtext('notifyq.webhook'), hashtext(x.key))
FROM (SELECT DISTINCT key FROM unnest(%(keys)s::text[]) AS key
      WHERE key IS NOT NULL ORDER BY key) x

-- name: webhook_message_by_keys
-- send_many by COPY, after webhook_message_lock_keys: the messages sent before under the batch's
-- idempotency keys, each with its deliveries counted (what _send_webhooks answers for them).
SELECT m.idempotency_key AS key, m.id,
       (SELECT count(*)::integer FROM {schema}.webhook_delivery d
        WHERE d.message_id = m.id) AS deliveries
FROM {schema}.webhook_message m
WHERE m.idempotency_key = ANY (%(keys)s::text[])

-- name: webhook_message_copy
-- send_many by COPY: the new messages, bodies as jsonb prints them (the column order is
-- notifyq/_webhooks/fanout.py's).
COPY {schema}.webhook_message (id, event_type, body, endpoint_id, idempotency_key) FROM STDIN

-- name: webhook_message_get
SELECT * FROM {schema}.webhook_message WHERE id = %(id)s

-- name: webhook_message_in_tenants
-- The message if it belongs to one of `tenant_ids` (NULL: any message). A message belongs to a
-- tenant when it was sent to one endpoint (`endpoint_id`) of that tenant; a message sent by event
-- type may reach the endpoints of several tenants and belongs to none.
SELECT m.id FROM {schema}.webhook_message m
WHERE m.id = %(id)s
  AND (%(tenant_ids)s::text[] IS NULL
       OR EXISTS (SELECT 1 FROM {schema}.webhook_endpoint e
                  WHERE e.id = m.endpoint_id AND e.tenant_id = ANY (%(tenant_ids)s::text[])))

-- name: webhook_message_list
-- Newest first (ids are msg_ + a UUIDv7 in hex: time-ordered), keyset-paged with `before`.
-- With `tenant_ids`, only messages sent to one endpoint of those tenants (see
-- webhook_message_in_tenants); with `event_type`, of that type; with `to_endpoint`, those
-- with a delivery to it. `retrying`: deliveries still pending after a failed attempt.
SELECT m.id, m.event_type, m.endpoint_id AS sent_to, m.idempotency_key, m.created_at,
       octet_length(m.body) AS size, c.deliveries, c.failed, c.retrying
FROM {schema}.webhook_message m
CROSS JOIN LATERAL (
    SELECT count(*) AS deliveries, count(*) FILTER (WHERE d.status = 'failed') AS failed,
           count(*) FILTER (WHERE d.status = 'pending' AND d.attempts > 0) AS retrying
    FROM {schema}.webhook_delivery d WHERE d.message_id = m.id
) c
WHERE (%(before)s::text IS NULL OR m.id < %(before)s::text)
  AND (%(event_type)s::text IS NULL OR m.event_type = %(event_type)s::text)
  AND (%(to_endpoint)s::uuid IS NULL
       OR EXISTS (SELECT 1 FROM {schema}.webhook_delivery d
                  WHERE d.message_id = m.id AND d.endpoint_id = %(to_endpoint)s::uuid))
  AND (%(tenant_ids)s::text[] IS NULL
       OR EXISTS (SELECT 1 FROM {schema}.webhook_endpoint e
                  WHERE e.id = m.endpoint_id AND e.tenant_id = ANY (%(tenant_ids)s::text[])))
ORDER BY m.id DESC
LIMIT %(limit)s

-- name: webhook_message_retain_until
-- A payload retention of its own for messages just sent (`send(..., payload_retention_s=)`):
-- their payload is dropped `retention_s` after they were created instead of after
-- webhooks.payload_retention_s.
UPDATE {schema}.webhook_message
SET payload_retain_until = created_at + make_interval(secs => %(retention_s)s::float8)
WHERE id = ANY (%(ids)s::text[]) AND payload_dropped_at IS NULL

-- name: webhook_message_drop_payloads
-- Payload retention (0031): up to `limit` messages past their retention (their own
-- `payload_retain_until`, else `retention_s` after they were created) lose their payload: the
-- body becomes '' and `payload_dropped_at` says when; the message, its deliveries and attempts
-- stay. Each rule walks its partial index of the messages still carrying a payload. A message
-- with a delivery still pending keeps its payload until that delivery ends.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
due AS (
    (SELECT m.id FROM {schema}.webhook_message m, n
     WHERE m.payload_dropped_at IS NULL AND m.payload_retain_until IS NULL
       AND m.created_at <= n.now - make_interval(secs => %(retention_s)s::float8)
     ORDER BY m.created_at LIMIT %(limit)s)
    UNION ALL
    (SELECT m.id FROM {schema}.webhook_message m, n
     WHERE m.payload_dropped_at IS NULL AND m.payload_retain_until IS NOT NULL
       AND m.payload_retain_until <= n.now
     ORDER BY m.payload_retain_until LIMIT %(limit)s)
)
UPDATE {schema}.webhook_message m
SET body = '', payload_dropped_at = n.now
FROM due, n
WHERE m.id = due.id
  AND NOT EXISTS (SELECT 1 FROM {schema}.webhook_delivery d
                  WHERE d.message_id = m.id AND d.status = 'pending')
-- name: webhook_message_list_for_tenant
-- The customer portal's messages: those with a delivery to an endpoint of `tenant_id` (sent to
-- it, or by event type), newest first, keyset-paged with `before`; counts are of that
-- tenant's deliveries only. Walks webhook_endpoint_tenant_idx (0016), then
-- webhook_delivery_endpoint_message_idx (0008) backwards per endpoint, `limit` each at most.
SELECT m.id, m.event_type, m.created_at, octet_length(m.body) AS size,
       c.deliveries, c.failed, c.retrying
FROM (
    SELECT DISTINCT x.message_id
    FROM {schema}.webhook_endpoint e
    CROSS JOIN LATERAL (
        SELECT d.message_id FROM {schema}.webhook_delivery d
        WHERE d.endpoint_id = e.id
          AND (%(before)s::text IS NULL OR d.message_id < %(before)s::text)
        ORDER BY d.message_id DESC
        LIMIT %(limit)s
    ) x
    WHERE e.tenant_id = %(tenant_id)s
    ORDER BY x.message_id DESC
    LIMIT %(limit)s
) ids
JOIN {schema}.webhook_message m ON m.id = ids.message_id
CROSS JOIN LATERAL (
    SELECT count(*) AS deliveries, count(*) FILTER (WHERE d.status = 'failed') AS failed,
           count(*) FILTER (WHERE d.status = 'pending' AND d.attempts > 0) AS retrying
    FROM {schema}.webhook_delivery d
    JOIN {schema}.webhook_endpoint e ON e.id = d.endpoint_id
    WHERE d.message_id = m.id AND e.tenant_id = %(tenant_id)s
) c
ORDER BY m.id DESC

-- name: webhook_message_delivered_to_tenant
-- The ids of `tenant_id`'s endpoints the message has a delivery to (none: the portal answers
-- 404, as for an unknown id).
SELECT d.endpoint_id
FROM {schema}.webhook_delivery d
JOIN {schema}.webhook_endpoint e ON e.id = d.endpoint_id
WHERE d.message_id = %(id)s AND e.tenant_id = %(tenant_id)s
