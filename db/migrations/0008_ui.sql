-- The dashboard's lists stay fast on large tables (measured on 10 million runs: docs/dashboard.md).
-- Webhook health reads an endpoint's recent attempts by time; an endpoint's deliveries are listed
-- newest message first. Without these both read every row of the endpoint.
CREATE INDEX webhook_attempt_endpoint_idx ON webhook_attempt (endpoint_id, created_at);
CREATE INDEX webhook_delivery_endpoint_message_idx ON webhook_delivery (endpoint_id, message_id);
