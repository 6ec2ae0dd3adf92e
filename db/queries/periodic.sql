-- Named queries for periodic schedules.

-- name: periodic_tick_enqueue
-- Claims one tick of a schedule and enqueues its run in the same statement; the tick's primary
-- key makes a second worker's attempt for the same tick insert nothing and enqueue nothing.
WITH tick AS (
    INSERT INTO {schema}.periodic_tick (name, tick_at, run_id)
    VALUES (%(name)s, %(tick_at)s, %(run_id)s)
    ON CONFLICT DO NOTHING
    RETURNING run_id
)
SELECT r.id, r.pool FROM tick, LATERAL {schema}._enqueue(
    %(job_type)s, %(input)s::jsonb, %(tick_at)s, NULL, NULL, NULL, NULL, NULL, tick.run_id, true,
    NULL, 'schedule', %(name)s) AS r

-- name: periodic_tick_prune
DELETE FROM {schema}.periodic_tick
WHERE tick_at < coalesce(%(now)s::timestamptz, now()) - interval '1 day'
