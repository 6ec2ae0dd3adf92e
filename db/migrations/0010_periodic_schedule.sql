-- Periodic schedules as rows (issue 16): cron schedules in a time zone beside every=, pause and
-- resume, catch-up. Workers upsert their schedules at start; the row is where every node agrees
-- on what a schedule has done (last_tick_at only moves forward, under the row's lock) and
-- whether it may tick (paused_at). periodic_tick stays the per-tick ledger.
CREATE TABLE periodic_schedule (
    name text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 512),
    job_type text NOT NULL,
    every_ms bigint CHECK (every_ms >= 100),
    cron text,
    tz text,
    catch_up boolean NOT NULL DEFAULT false,
    paused_at timestamptz,
    -- Ticks before this are never enqueued, so a resumed schedule does not catch up the ticks it
    -- was paused for.
    resumed_at timestamptz,
    last_tick_at timestamptz,
    last_run_id uuid,
    registered_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT periodic_schedule_one_cadence CHECK ((every_ms IS NULL) <> (cron IS NULL)),
    CONSTRAINT periodic_schedule_cron_has_tz CHECK ((cron IS NULL) = (tz IS NULL))
);
