-- Awaiting a run's result (app.wait, Run.result, GET /v1/jobs/{id}?wait=) and replaying a
-- durable run from a step.
--
-- A waiter marks the run `awaited` (job_run_await) after it LISTENs; the run's change to a final
-- status then sends 'd:<run id>' on the schema's channel, whichever statement makes it (the
-- completer's batch, the reaper, a cancel, a durable wait's deadline). Runs nobody awaits send
-- nothing: the WHEN clause is checked without calling the function. Measured on a shared
-- 2-core machine (noisy), 20,000 running rows set completed 500 a statement: 9.8k rows/s without
-- the trigger, 10.4k with it and nothing awaited (within noise), 7.6k with every row awaited
-- (one NOTIFY each); `notifyq bench --only drain`: 115 jobs/s before, 114 after (concurrency 10,
-- the machine's load dominates). A NOTIFY for every finished run would take the global notify
-- lock in every completer commit and wake every listener in the cluster for nothing.
ALTER TABLE job_run ADD COLUMN awaited boolean NOT NULL DEFAULT false;

CREATE FUNCTION _notify_awaited() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify(current_schema(), 'd:' || NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER job_run_awaited AFTER UPDATE OF status ON job_run
FOR EACH ROW
WHEN (NEW.awaited
      AND NEW.status IN ('completed', 'failed', 'timed_out', 'canceled')
      AND OLD.status NOT IN ('completed', 'failed', 'timed_out', 'canceled'))
EXECUTE FUNCTION _notify_awaited();
