-- Named queries for periodic schedules.

-- name: periodic_schedule_register
-- A worker's schedule, upserted at start: its definition follows the code; its state (paused,
-- last tick) stays as the cluster left it.
INSERT INTO {schema}.periodic_schedule AS s (name, job_type, every_ms, cron, tz, catch_up,
                                              input)
VALUES (%(name)s, %(job_type)s, %(every_ms)s, %(cron)s, %(tz)s, %(catch_up)s, %(input)s::jsonb)
ON CONFLICT (name) DO UPDATE
SET job_type = excluded.job_type, every_ms = excluded.every_ms, cron = excluded.cron,
    tz = excluded.tz, catch_up = excluded.catch_up, input = excluded.input, seen_at = now()

-- name: periodic_schedule_state
-- What the scheduler needs to pick a pass's ticks: paused or not, and where catch-up starts.
SELECT name, paused_at, resumed_at, last_tick_at
FROM {schema}.periodic_schedule
WHERE name = ANY(%(names)s::text[])

-- name: periodic_tick_enqueue
-- Claims one tick of a schedule and enqueues its run in the same statement. The schedule row's
-- lock serializes the nodes: the first moves last_tick_at to the tick, a second one waiting on
-- the lock then sees last_tick_at >= tick and matches nothing (and the tick's primary key would
-- refuse it anyway). A paused schedule, or a tick from before the last resume, matches nothing,
-- so a pause that has returned stops every node's next enqueue.
WITH claimed AS (
    UPDATE {schema}.periodic_schedule
    SET last_tick_at = %(tick_at)s, last_run_id = %(run_id)s
    WHERE name = %(name)s AND paused_at IS NULL
      AND (last_tick_at IS NULL OR last_tick_at < %(tick_at)s)
      AND (resumed_at IS NULL OR resumed_at <= %(tick_at)s)
    RETURNING name
), tick AS (
    INSERT INTO {schema}.periodic_tick (name, tick_at, run_id)
    SELECT name, %(tick_at)s, %(run_id)s FROM claimed
    ON CONFLICT DO NOTHING
    RETURNING run_id
)
SELECT r.id, r.pool FROM tick, LATERAL {schema}._enqueue(
    %(job_type)s, %(input)s::jsonb, %(tick_at)s, NULL, NULL, NULL, NULL, NULL, tick.run_id, true,
    NULL, 'schedule', %(name)s) AS r

-- name: periodic_tick_prune
DELETE FROM {schema}.periodic_tick
WHERE tick_at < coalesce(%(now)s::timestamptz, now()) - interval '1 day'

-- name: periodic_schedule_list
-- Every schedule any worker registered, with its last tick's run status (NULL once purged).
SELECT s.name, s.job_type, s.every_ms, s.cron, s.tz, s.catch_up, s.paused_at, s.resumed_at,
       s.last_tick_at, s.last_run_id, r.status AS last_status, s.registered_at, s.seen_at
FROM {schema}.periodic_schedule s
LEFT JOIN {schema}.job_run r ON r.id = s.last_run_id
ORDER BY s.name

-- name: periodic_schedule_pause
-- Pausing twice keeps the first paused_at. Zero rows: no such schedule.
UPDATE {schema}.periodic_schedule
SET paused_at = coalesce(paused_at, coalesce(%(now)s::timestamptz, now()))
WHERE name = %(name)s
RETURNING name, paused_at

-- name: periodic_schedule_resume
-- Ticks that fell due while paused are skipped, with or without catch-up: resumed_at bars them.
-- Resuming a running schedule changes nothing. Zero rows: no such schedule.
UPDATE {schema}.periodic_schedule
SET paused_at = NULL,
    resumed_at = CASE WHEN paused_at IS NULL THEN resumed_at
                      ELSE coalesce(%(now)s::timestamptz, now()) END
WHERE name = %(name)s
RETURNING name, resumed_at

-- name: periodic_schedule_trigger
-- "Trigger now": one run of the schedule's job type with its stored input, now, outside the
-- cadence (no tick is claimed: the next tick still comes when it is due). Zero rows: no such
-- schedule; `input` NULL: registered before 0026, so nothing is enqueued.
WITH s AS (
    SELECT name, job_type, input FROM {schema}.periodic_schedule WHERE name = %(name)s
), enqueued AS (   -- called only for a schedule with an input (a WHERE, not a join condition)
    SELECT (x.run).id AS run_id
    FROM (SELECT {schema}._enqueue(s.job_type, s.input, NULL, NULL, NULL, NULL, NULL, NULL,
                                   %(run_id)s, true, NULL, 'schedule', s.name) AS run
          FROM s WHERE s.input IS NOT NULL) x
)
SELECT s.name, s.input IS NOT NULL AS known, e.run_id
FROM s LEFT JOIN enqueued e ON true
