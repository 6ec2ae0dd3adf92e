-- Named queries of operator events (db/migrations/0030_operator_events.sql): what the purger
-- and the announcer (notifyq/_maintenance/announcer.py) record, and what the API lists.

-- name: operator_event_record
-- One event, once per `dedupe_key` (NULL: no deduplication). Returns its id, or nothing when
-- the key was recorded before.
INSERT INTO {schema}.operator_event (kind, endpoint_id, detail, dedupe_key, created_at)
VALUES (%(kind)s, %(endpoint_id)s::uuid, %(detail)s::jsonb, %(dedupe_key)s,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id

-- name: operator_event_record_failing
-- Endpoints failing (no success) for at least `after_s` and not disabled: one
-- `endpoint.failing` event per endpoint and failure streak (the streak's start is in the key,
-- so any number of concurrent passes record it once, and the next streak again).
INSERT INTO {schema}.operator_event (kind, endpoint_id, tenant_id, detail, dedupe_key, created_at)
SELECT 'endpoint.failing', e.id, e.tenant_id,
       jsonb_build_object('failing_since', e.failing_since,
                          'failing_for_s', round(extract(epoch FROM n.now - e.failing_since)),
                          'consecutive_failures', e.consecutive_failures),
       'endpoint.failing:' || e.id || ':' || (extract(epoch FROM e.failing_since) * 1000000)::bigint,
       n.now
FROM {schema}.webhook_endpoint e, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) n
WHERE e.failing_since IS NOT NULL AND e.disabled_at IS NULL
  AND e.failing_since <= n.now - make_interval(secs => %(after_s)s::float8)
ORDER BY e.failing_since
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id

-- name: operator_event_claim
-- The oldest events not emitted yet, marked emitted: a concurrent claimer skips them (the
-- caller logs, counts and sends them in the same transaction).
UPDATE {schema}.operator_event o
SET emitted_at = coalesce(%(now)s::timestamptz, now())
FROM (SELECT id FROM {schema}.operator_event WHERE emitted_at IS NULL
      ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
WHERE o.id = c.id
RETURNING o.id, o.kind, o.endpoint_id, o.tenant_id, o.detail, o.created_at

-- name: operator_event_sent
-- The webhook message each event was sent as (to the operator's endpoint).
UPDATE {schema}.operator_event o SET message_id = s.message_id
FROM unnest(%(ids)s::bigint[], %(message_ids)s::text[]) AS s(id, message_id)
WHERE o.id = s.id

-- name: operator_event_list
-- Newest first; `before` is the last id of the previous page; `tenant_ids`: only events about
-- those tenants' endpoints (a purge pass is about no endpoint: not shown).
SELECT id, kind, endpoint_id, tenant_id, detail, created_at, emitted_at, message_id
FROM {schema}.operator_event
WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(endpoint_id)s::uuid IS NULL OR endpoint_id = %(endpoint_id)s::uuid)
  AND (%(tenant_ids)s::text[] IS NULL OR tenant_id = ANY (%(tenant_ids)s::text[]))
ORDER BY id DESC
LIMIT %(limit)s

-- name: operator_event_prune
-- Emitted events older than the retention, in one bounded batch.
DELETE FROM {schema}.operator_event
WHERE id IN (SELECT id FROM {schema}.operator_event
             WHERE emitted_at IS NOT NULL
               AND created_at < coalesce(%(now)s::timestamptz, now())
                                - make_interval(secs => %(retention_s)s::float8)
             ORDER BY created_at LIMIT %(limit)s)
