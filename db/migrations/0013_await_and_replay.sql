-- Awaiting a run's result (app.wait, Run.result, GET /v1/jobs/{id}?wait=) and replaying a
-- durable run from a step.
--
-- A waiter marks the run `awaited` (job_run_await) after it LISTENs; the run's change to a final
-- status then sends 'd:<run id>' on the schema's channel, whichever statement makes it (the
-- completer's batch, the reaper, a cancel, a durable wait's deadline). Runs nobody awaits send
-- nothing: the WHEN clause is checked in the executor without calling the function, so the
-- drain path pays one boolean test a finished row (measured with `notifyq bench`: within noise,
-- docs/enqueueing.md). A NOTIFY for every finished run would take the global notify lock in
-- every completer commit and wake every listener in the cluster for nothing.
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
