-- Every statement that writes job_run paid for the table's CHECK constraints and triggers before
-- it touched a row: PostgreSQL reads each CHECK's stored expression back from its text form,
-- plans it and builds its evaluator once per statement (ExecConstraints), for every CHECK
-- whatever columns the statement sets, and a trigger's WHEN clause likewise whenever a statement
-- sets one of the trigger's columns. Server instructions per statement, counted with callgrind
-- (PostgreSQL 15; bench/README.md, "Server instructions per statement"), before -> after:
--
--   single enqueue (job_run_insert_one)                      848k -> 516k
--   idle claim of one run (job_run_claim)                  1,361k -> 847k
--   write back 20 runs and claim 20 (finish_and_claim)     6,622k -> 5,294k
--   write back 1 and claim 1                               2,242k -> 1,311k
--
-- Of the 13 CHECKs each cost 16k (attempts >= 0) to 62k (the status list) per statement, about
-- 400k in all; the two status triggers about 220k at a claim (14 % of it), where they never fire.
--
-- 1. The CHECKs that validate input go. Those rules are checked where input enters, with
--    messages that name the problem: EnqueueRequest in Python (every enqueue path of the
--    library, the CLI and the HTTP API), _enqueue for SQL callers (notifyq.enqueue, a child's
--    spawn, a periodic run), and the job definition's own CHECKs for what a run takes from it
--    (timeout_s, max_attempts). The table keeps the two that guard its state machine, which
--    only a bug in notifyq could break: the status list and attempts >= 0.
-- 2. The two AFTER triggers (job_run_awaited, job_run_finished) become one, fired by
--    UPDATE OF finished_at instead of status: every statement that moves a run to a final
--    status sets finished_at in the same UPDATE (tests/db/test_run_triggers.py reads every
--    UPDATE of job_run notifyq sends, and every function's, to hold that), and the claims,
--    which set status but never finished_at, no longer evaluate a trigger at all. The WHEN
--    clause tests the cheap columns first, so an ordinary run's finish reads three booleans.
--
-- Online: dropping a constraint and replacing a trigger take job_run's lock for an instant, with
-- no scan and no rewrite; workers of the previous version keep working against the new schema.

ALTER TABLE job_run
    DROP CONSTRAINT job_run_concurrency_limit_check,
    DROP CONSTRAINT job_run_input_check,
    DROP CONSTRAINT job_run_job_type_check,
    DROP CONSTRAINT job_run_max_attempts_check,
    DROP CONSTRAINT job_run_parent_close_policy_check,
    DROP CONSTRAINT job_run_pool_check,
    DROP CONSTRAINT job_run_priority_check,
    DROP CONSTRAINT job_run_rate_key_check,
    DROP CONSTRAINT job_run_timeout_s_check,
    DROP CONSTRAINT job_run_trigger_source_check,
    DROP CONSTRAINT job_run_wait_kind_check;

-- 0015's _enqueue, with the checks of the constraints above that _enqueue_row does not make:
-- the pool's name, the trigger source and the parent-close policy (internal callers pass the
-- last two; a SQL caller of _enqueue could too).
CREATE OR REPLACE FUNCTION _enqueue(
    p_job_type              text,
    p_input                 jsonb,
    p_run_at                timestamptz DEFAULT NULL,
    p_priority              integer DEFAULT NULL,
    p_pool                  text DEFAULT NULL,
    p_max_attempts          integer DEFAULT NULL,
    p_dedupe_key            text DEFAULT NULL,
    p_tags                  text[] DEFAULT NULL,
    p_id                    uuid DEFAULT NULL,
    p_notify                boolean DEFAULT true,
    p_dedupe_window_s       double precision DEFAULT NULL,
    p_trigger_source        text DEFAULT 'manual',
    p_trigger_ref           text DEFAULT NULL,
    p_concurrency_key       text DEFAULT NULL,
    p_concurrency_limit     integer DEFAULT NULL,
    p_concurrency_collision text DEFAULT NULL,
    p_scope_entity_type     text DEFAULT NULL,
    p_scope_entity_id       text DEFAULT NULL,
    p_tenant_id             text DEFAULT NULL,
    p_parent_run_id         uuid DEFAULT NULL,
    p_root_run_id           uuid DEFAULT NULL,
    p_parent_close_policy   text DEFAULT NULL,
    p_allow_unknown_type    boolean DEFAULT false,
    p_dedupe_states         text[] DEFAULT NULL
) RETURNS job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    run job_run;
    def job;
BEGIN
    IF p_pool IS NOT NULL AND (p_pool !~ '^[a-z0-9_][a-z0-9_.:-]*$' OR length(p_pool) > 64) THEN
        RAISE EXCEPTION 'notifyq: invalid pool %: it must match ^[a-z0-9_][a-z0-9_.:-]{0,63}$',
            quote_literal(left(p_pool, 200)) USING ERRCODE = '22023';
    END IF;
    IF p_trigger_source IS NOT NULL
       AND p_trigger_source NOT IN ('manual', 'schedule', 'event', 'parent') THEN
        RAISE EXCEPTION 'notifyq: trigger source % must be manual, schedule, event or parent',
            quote_literal(p_trigger_source) USING ERRCODE = '22023';
    END IF;
    IF p_parent_close_policy IS NOT NULL
       AND p_parent_close_policy NOT IN ('terminate', 'cancel', 'abandon') THEN
        RAISE EXCEPTION 'notifyq: parent close policy % must be terminate, cancel or abandon',
            quote_literal(p_parent_close_policy) USING ERRCODE = '22023';
    END IF;
    run := _enqueue_row(p_job_type, p_input, p_run_at, p_priority, p_pool, p_max_attempts,
                        p_dedupe_key, p_tags, p_id, p_notify, p_dedupe_window_s,
                        p_trigger_source, p_trigger_ref, p_concurrency_key, p_concurrency_limit,
                        p_concurrency_collision, p_scope_entity_type, p_scope_entity_id,
                        p_tenant_id, p_parent_run_id, p_root_run_id, p_parent_close_policy,
                        p_allow_unknown_type, p_dedupe_states);
    IF run.rate_key IS NULL AND run.concurrency_key IS NULL AND run.status = 'pending' THEN
        SELECT * INTO def FROM job WHERE type = run.job_type;
        IF def.rate_limit IS NOT NULL THEN
            UPDATE job_run
            SET rate_key = _rate_key(run.job_type, def.rate_key_template, run.input)
            WHERE id = run.id
            RETURNING * INTO run;
        END IF;
    END IF;
    RETURN run;
END
$$;

-- 0002's _after_run_finished, which now also tells an awaiting caller (0011's _notify_awaited).
CREATE OR REPLACE FUNCTION _after_run_finished() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    woken record;
    hit   record;
BEGIN
    IF NEW.awaited THEN
        PERFORM pg_notify(current_schema(), 'd:' || NEW.id);
    END IF;

    IF NEW.parent_run_id IS NOT NULL THEN
        UPDATE job_run p
        SET children_done = p.children_done || NEW.id,
            status = CASE WHEN p.status = 'waiting' AND p.wait_kind = 'children'
                               AND p.waiting_on <@ (p.children_done || NEW.id)
                          THEN 'pending' ELSE p.status END,
            run_at = CASE WHEN p.status = 'waiting' AND p.wait_kind = 'children'
                               AND p.waiting_on <@ (p.children_done || NEW.id)
                          THEN now() ELSE p.run_at END,
            updated_at = now()
        WHERE p.id = NEW.parent_run_id
        RETURNING p.pool, p.status INTO woken;
        IF FOUND AND woken.status = 'pending' THEN
            PERFORM pg_notify(current_schema(), 'j:' || woken.pool);
        END IF;
    END IF;

    IF NEW.has_children THEN
        FOR hit IN
            UPDATE job_run c
            SET status = CASE WHEN c.parent_close_policy = 'terminate' OR c.status <> 'running'
                              THEN 'canceled' ELSE c.status END,
                finished_at = CASE WHEN c.parent_close_policy = 'terminate'
                                        OR c.status <> 'running'
                                   THEN now() ELSE c.finished_at END,
                cancel_requested_at = coalesce(c.cancel_requested_at, now()),
                error = CASE WHEN c.parent_close_policy = 'terminate' OR c.status <> 'running'
                             THEN jsonb_build_object('message', 'parent run finished (' ||
                                  c.parent_close_policy || ' policy)', 'type', 'ParentClosed',
                                  'retryable', false, 'attempt', c.attempts)
                             ELSE c.error END,
                leased_by = CASE WHEN c.parent_close_policy = 'terminate' THEN NULL
                                 ELSE c.leased_by END,
                lease_expires_at = CASE WHEN c.parent_close_policy = 'terminate' THEN NULL
                                        ELSE c.lease_expires_at END,
                updated_at = now()
            WHERE c.parent_run_id = NEW.id
              AND c.status IN ('pending', 'waiting', 'running')
              AND c.parent_close_policy IN ('terminate', 'cancel')
            RETURNING c.id
        LOOP
            -- Running children are told at once; the others were canceled above.
            PERFORM pg_notify(current_schema(), 'c:' || hit.id);
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER job_run_awaited ON job_run;
DROP FUNCTION _notify_awaited();
DROP TRIGGER job_run_finished ON job_run;
CREATE TRIGGER job_run_finished
    AFTER UPDATE OF finished_at ON job_run
    FOR EACH ROW
    WHEN ((NEW.awaited OR NEW.parent_run_id IS NOT NULL OR NEW.has_children)
          AND NEW.status IN ('completed', 'failed', 'timed_out', 'canceled')
          AND OLD.status NOT IN ('completed', 'failed', 'timed_out', 'canceled'))
    EXECUTE FUNCTION _after_run_finished();
