-- Operator events (issue 34 item 7): what an operator must hear about before a customer does
-- (an endpoint disabled, a circuit opened or closed, an endpoint failing for long, a purge
-- pass). One row per occurrence, written where the occurrence is decided, so it is recorded
-- exactly once however many workers race:
--   * the state flips of an endpoint (disabled, circuit opened, circuit closed) by the trigger
--     below, in the transaction of the UPDATE that flips them (OLD and NEW tell it apart);
--   * "failing for long" by the leader's announcer, under the unique `dedupe_key` (one per
--     endpoint and failure streak: its `failing_since`);
--   * a purge pass that deleted rows by the purger.
-- The announcer (notifyq/_maintenance/announcer.py) then claims the rows not yet `emitted_at`
-- (FOR UPDATE SKIP LOCKED: one claimer each), logs and counts them, and sends each to the
-- operator's endpoint as an ordinary webhook message (signed, retried) in the same transaction.

CREATE TABLE operator_event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('endpoint.disabled', 'endpoint.circuit_opened',
                                              'endpoint.circuit_closed', 'endpoint.failing',
                                              'retention.purged')),
    endpoint_id uuid,
    tenant_id   text,
    detail      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object'),
    dedupe_key  text UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    emitted_at  timestamptz,
    message_id  text
);

-- What the announcer claims: small, emptied every few seconds.
CREATE INDEX operator_event_unemitted_idx ON operator_event (id) WHERE emitted_at IS NULL;
CREATE INDEX operator_event_created_idx ON operator_event (created_at);
-- The announcer's scan for endpoints failing for long reads only the failing ones.
CREATE INDEX webhook_endpoint_failing_idx ON webhook_endpoint (failing_since)
    WHERE failing_since IS NOT NULL AND disabled_at IS NULL;

CREATE FUNCTION _webhook_endpoint_operator_event() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF OLD.disabled_at IS NULL AND NEW.disabled_at IS NOT NULL THEN
        INSERT INTO operator_event (kind, endpoint_id, tenant_id, detail, created_at)
        VALUES ('endpoint.disabled', NEW.id, NEW.tenant_id, jsonb_build_object(
                    'reason', NEW.disabled_reason,
                    'cause', CASE WHEN NEW.disabled_reason = 'the endpoint answered 410 Gone'
                                  THEN 'gone'
                                  WHEN NEW.disabled_reason LIKE 'failing continuously since %'
                                  THEN 'failing' ELSE 'operator' END,
                    'failing_since', OLD.failing_since),
                NEW.disabled_at);
    END IF;
    IF OLD.circuit_open_until IS NULL AND NEW.circuit_open_until IS NOT NULL THEN
        INSERT INTO operator_event (kind, endpoint_id, tenant_id, detail)
        VALUES ('endpoint.circuit_opened', NEW.id, NEW.tenant_id, jsonb_build_object(
                    'open_until', NEW.circuit_open_until,
                    'consecutive_failures', NEW.consecutive_failures,
                    'failing_since', NEW.failing_since));
    ELSIF OLD.circuit_open_until IS NOT NULL AND NEW.circuit_open_until IS NULL THEN
        INSERT INTO operator_event (kind, endpoint_id, tenant_id, detail)
        VALUES ('endpoint.circuit_closed', NEW.id, NEW.tenant_id, jsonb_build_object(
                    'failing_since', OLD.failing_since,
                    'consecutive_failures', OLD.consecutive_failures,
                    'cause', CASE WHEN NEW.disabled_at IS NULL AND OLD.disabled_at IS NOT NULL
                                  THEN 'enabled' ELSE 'success' END));
    END IF;
    RETURN NULL;
END
$$;

-- Fires only on a flip (the WHEN is checked without calling the function): the hot record of
-- attempts, which updates an endpoint's streak on every failure, pays nothing more otherwise.
CREATE TRIGGER webhook_endpoint_operator_event
AFTER UPDATE OF disabled_at, circuit_open_until ON webhook_endpoint
FOR EACH ROW
WHEN ((OLD.disabled_at IS NULL AND NEW.disabled_at IS NOT NULL)
      OR ((OLD.circuit_open_until IS NULL) <> (NEW.circuit_open_until IS NULL)))
EXECUTE FUNCTION _webhook_endpoint_operator_event();
