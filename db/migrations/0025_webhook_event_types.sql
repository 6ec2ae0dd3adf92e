-- The event-type catalog (issue 34 item 5): the event types an application sends, each with a
-- description for the people who subscribe to it and an optional JSON Schema its payloads must
-- match. Once the catalog holds a type, sends of an unknown type and endpoints subscribing to
-- one are refused (unless webhooks.allow_unknown_event_types); payloads are checked against
-- their type's schema where they enter (Python, the HTTP API). Plain SQL sends
-- (notifyq.send_webhook) are not checked: JSON Schema has no implementation in PostgreSQL.

CREATE TABLE webhook_event_type (
    name        text PRIMARY KEY,
    description text NOT NULL DEFAULT '',
    schema      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
