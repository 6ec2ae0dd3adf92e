-- Named queries of webhook messages; their deliveries and attempts have files of their own.

-- name: webhook_message_send
-- In the caller's transaction when given its connection (see notifyq.send_webhook).
SELECT message_id, created, deliveries
FROM {schema}._send_webhook(%(event_type)s, %(payload)s::jsonb, %(endpoint_id)s::uuid,
                            %(idempotency_key)s)

-- name: webhook_message_get
SELECT * FROM {schema}.webhook_message WHERE id = %(id)s
