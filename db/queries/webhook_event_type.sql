-- Named queries of the event-type catalog (notifyq/_webhooks/catalog.py).

-- name: webhook_event_type_upsert
INSERT INTO {schema}.webhook_event_type AS t (name, description, schema, created_at, updated_at)
VALUES (%(name)s, %(description)s, %(schema)s::jsonb, coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE
SET description = excluded.description, schema = excluded.schema,
    updated_at = excluded.updated_at
RETURNING name, description, schema, created_at, updated_at

-- name: webhook_event_type_list
SELECT name, description, schema, created_at, updated_at
FROM {schema}.webhook_event_type
ORDER BY name

-- name: webhook_event_type_delete
DELETE FROM {schema}.webhook_event_type WHERE name = %(name)s RETURNING name
