-- "Trigger now" for periodic schedules (issue 32 item 12): a schedule's input is stored with its
-- definition (upserted by every worker that declares it, like the cadence), so any process (the
-- dashboard, the API, the CLI) can enqueue a run of it outside its cadence. NULL for a schedule
-- registered before this migration until its worker starts again.

ALTER TABLE periodic_schedule ADD COLUMN input jsonb;
