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

-- name: periodic_tick_latest
-- Each schedule's latest tick (the table keeps a day of them) with the status of its run. The
-- names are found by skipping through the primary key (a loose index scan): a schedule every
-- 100 ms keeps 864,000 ticks a day, which a DISTINCT ON would read one by one.
WITH RECURSIVE names AS (
    (SELECT name FROM {schema}.periodic_tick ORDER BY name LIMIT 1)
    UNION ALL
    SELECT (SELECT t.name FROM {schema}.periodic_tick t WHERE t.name > names.name
            ORDER BY t.name LIMIT 1)
    FROM names WHERE names.name IS NOT NULL
)
SELECT names.name, last.tick_at, last.run_id, r.status
FROM names
CROSS JOIN LATERAL (
    SELECT tick_at, run_id FROM {schema}.periodic_tick t
    WHERE t.name = names.name ORDER BY t.tick_at DESC LIMIT 1
) last
LEFT JOIN {schema}.job_run r ON r.id = last.run_id
ORDER BY names.name
