-- Retention without bloat (issue 34 item 4).
--
-- 1. Message payloads are dropped after their retention (webhooks.payload_retention_s, or
--    `payload_retain_until` when the sender gave one): `body` becomes '' and
--    `payload_dropped_at` says when; the message, its deliveries and attempts stay. Two partial
--    indexes hold only the messages still carrying a payload, one per rule, so the leader's
--    retention pass reads the due ones alone.
-- 2. webhook_attempt becomes a table partitioned by day (UTC) on `created_at`: old attempts go
--    by dropping a partition (webhooks.attempt_retention_s), never by DELETE. The migration
--    copies nothing: the existing table becomes the first partition, covering everything
--    before the day after its newest row, checked by one scan; its primary key (id) is
--    replaced by (id, created_at) (a partitioned table's unique keys include the partition
--    key), the one index this builds. Rows nobody made a partition for (the leader's
--    maintenance stopped, or a clock far ahead) land in webhook_attempt_default.

ALTER TABLE webhook_message ADD COLUMN payload_retain_until timestamptz,
                            ADD COLUMN payload_dropped_at timestamptz;
CREATE INDEX webhook_message_retention_idx ON webhook_message (created_at)
    WHERE payload_dropped_at IS NULL AND payload_retain_until IS NULL;
CREATE INDEX webhook_message_retain_until_idx ON webhook_message (payload_retain_until)
    WHERE payload_dropped_at IS NULL AND payload_retain_until IS NOT NULL;

-- The existing table, renamed with its indexes, becomes the first partition.
ALTER TABLE webhook_attempt RENAME TO webhook_attempt_legacy;
ALTER INDEX webhook_attempt_message_idx RENAME TO webhook_attempt_legacy_message_idx;
ALTER INDEX webhook_attempt_endpoint_idx RENAME TO webhook_attempt_legacy_endpoint_idx;
ALTER TABLE webhook_attempt_legacy DROP CONSTRAINT webhook_attempt_pkey;
ALTER TABLE webhook_attempt_legacy ALTER COLUMN id DROP IDENTITY;   -- the parent numbers rows
ALTER TABLE webhook_attempt_legacy VALIDATE CONSTRAINT webhook_attempt_error_kind_check;
ALTER TABLE webhook_attempt_legacy
    ADD CONSTRAINT webhook_attempt_legacy_pkey PRIMARY KEY (id, created_at);

CREATE TABLE webhook_attempt (
    id                 bigint GENERATED ALWAYS AS IDENTITY,
    message_id         text NOT NULL,
    endpoint_id        uuid NOT NULL,
    run_id             uuid,
    trigger            text NOT NULL CONSTRAINT webhook_attempt_trigger_check
                       CHECK (trigger IN ('scheduled', 'manual')),
    attempt            integer NOT NULL,
    webhook_timestamp  bigint NOT NULL,
    url                text NOT NULL,
    status_code        integer,
    error_kind         text CONSTRAINT webhook_attempt_error_kind_check
                       CHECK (error_kind IN ('timeout', 'connect', 'dns', 'tls', 'blocked',
                                             'invalid')),
    error              text,
    duration_ms        double precision NOT NULL,
    response_body      text,
    response_truncated boolean NOT NULL DEFAULT false,
    next_attempt_at    timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at),
    CONSTRAINT webhook_attempt_message_id_endpoint_id_fkey FOREIGN KEY (message_id, endpoint_id)
        REFERENCES webhook_delivery ON DELETE CASCADE
) PARTITION BY RANGE (created_at);
-- The legacy table's indexes match these, so they are attached, not built again.
CREATE INDEX webhook_attempt_message_idx ON webhook_attempt (message_id, id);
CREATE INDEX webhook_attempt_endpoint_idx ON webhook_attempt (endpoint_id, created_at);

SELECT setval(pg_get_serial_sequence('webhook_attempt', 'id'),
              coalesce((SELECT max(id) FROM webhook_attempt_legacy), 0) + 1, false);

DO $$
DECLARE
    upper_ timestamptz := date_trunc('day', coalesce(
        greatest((SELECT max(created_at) FROM webhook_attempt_legacy), now()), now()), 'UTC')
        + interval '1 day';
BEGIN
    EXECUTE format('ALTER TABLE webhook_attempt ATTACH PARTITION webhook_attempt_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%L)', upper_);
END
$$;
CREATE TABLE webhook_attempt_default PARTITION OF webhook_attempt DEFAULT;

-- Daily partitions (UTC) from `p_now`'s day to `p_days` days after it, named
-- webhook_attempt_YYYYMMDD; returns how many were made. A day already covered (by the legacy
-- partition, or made before) is skipped, and so is a day some of whose rows wait in the default
-- partition (they stay there, and retention deletes them). Creating a partition briefly locks
-- webhook_attempt and webhook_delivery (its foreign key): with lock_timeout, a busy moment
-- skips the day until the next pass, which the days made ahead leave time for.
CREATE FUNCTION _webhook_attempt_partitions_make(p_now timestamptz, p_days integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET lock_timeout = '2s'
AS $$
DECLARE
    day_  timestamptz := date_trunc('day', p_now, 'UTC');
    made  integer := 0;
    name_ text;
BEGIN
    FOR i IN 0 .. p_days LOOP
        name_ := 'webhook_attempt_' || to_char(day_ AT TIME ZONE 'UTC', 'YYYYMMDD');
        IF to_regclass(name_) IS NULL AND NOT EXISTS (
                SELECT 1 FROM _webhook_attempt_partitions() p
                WHERE coalesce(p.lower_bound, '-infinity') < day_ + interval '1 day'
                  AND p.upper_bound > day_) THEN
            BEGIN
                EXECUTE format('CREATE TABLE %I PARTITION OF webhook_attempt '
                               'FOR VALUES FROM (%L) TO (%L)', name_, day_,
                               day_ + interval '1 day');
                made := made + 1;
            EXCEPTION WHEN check_violation OR lock_not_available THEN
                NULL;  -- rows of that day in the default partition, or busy: see above
            END;
        END IF;
        day_ := day_ + interval '1 day';
    END LOOP;
    RETURN made;
END
$$;

-- The range partitions of webhook_attempt with their bounds (NULL lower: MINVALUE) and their
-- estimated rows (the planner's statistics: no count).
CREATE FUNCTION _webhook_attempt_partitions()
RETURNS TABLE (name text, lower_bound timestamptz, upper_bound timestamptz, estimated_rows bigint)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT c.relname::text,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]
               ::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]
               ::timestamptz,
           greatest(c.reltuples, 0)::bigint
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'webhook_attempt'::regclass
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
$$;

-- Drop up to `p_limit` partitions whose every row is older than `p_before` (their upper bound
-- at or before it), oldest first; returns each one dropped. A partition another transaction
-- is using is left for the next pass (lock_timeout) rather than queueing writers behind it.
CREATE FUNCTION _webhook_attempt_partitions_drop(p_before timestamptz, p_limit integer)
RETURNS TABLE (name text, upper_bound timestamptz, estimated_rows bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET lock_timeout = '2s'
AS $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT * FROM _webhook_attempt_partitions() x
             WHERE x.upper_bound <= p_before ORDER BY x.upper_bound LIMIT p_limit LOOP
        BEGIN
            EXECUTE format('DROP TABLE %I', p.name);
            name := p.name;
            upper_bound := p.upper_bound;
            estimated_rows := p.estimated_rows;
            RETURN NEXT;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
END
$$;

SELECT _webhook_attempt_partitions_make(now(), 7);
