-- Dedupe keys are per tenant. A run with a dedupe key was a duplicate of any live (or, within
-- the window, finished) run of its type with the same key, whichever tenant it belonged to: two
-- tenants using the same natural key ("order-7") got each other's run back, and the API could
-- only answer a tenant-limited token with a bare 409. The lookup now matches runs of the same
-- tenant only (no tenant matches no tenant). The advisory lock stays per (type, key): the same
-- key in two tenants serializes their enqueues for an instant, which is harmless.
--
-- 0007's _enqueue (renamed _enqueue_row by 0015), with the tenant in the dedupe lookup.
CREATE OR REPLACE FUNCTION _enqueue_row(
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
    def       job;
    existing  job_run;
    created   job_run;
    size      integer;
    dedupe    text;
    states    text[];
    ckey      text;
    climit    integer;
    collision text;
    victim    record;
BEGIN
    IF p_job_type IS NULL OR p_job_type !~ '^[a-z0-9_][a-z0-9_.:-]*$'
       OR length(p_job_type) > 128 THEN
        RAISE EXCEPTION 'notifyq: invalid job type %: it must match ^[a-z0-9_][a-z0-9_.:-]{0,127}$',
            quote_nullable(left(p_job_type, 200)) USING ERRCODE = '22023';
    END IF;
    IF p_input IS NULL OR jsonb_typeof(p_input) NOT IN ('object', 'array') THEN
        RAISE EXCEPTION 'notifyq: input must be a JSON object or array, got %',
            coalesce(jsonb_typeof(p_input), 'null') USING ERRCODE = '22023';
    END IF;
    size := octet_length(p_input::text);
    IF size > 65536 THEN
        RAISE EXCEPTION 'notifyq: input is % bytes; the limit is 65536 bytes', size
            USING ERRCODE = '54000';
    END IF;
    IF p_priority IS NOT NULL AND p_priority NOT BETWEEN -1000 AND 1000 THEN
        RAISE EXCEPTION 'notifyq: priority % is out of range [-1000, 1000]', p_priority
            USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NOT NULL AND p_max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'notifyq: max_attempts % is out of range [1, 1000]', p_max_attempts
            USING ERRCODE = '22023';
    END IF;
    IF p_run_at < '2000-01-01+00'::timestamptz OR p_run_at >= '3000-01-01+00'::timestamptz THEN
        RAISE EXCEPTION 'notifyq: run_at % is out of range [2000-01-01, 3000-01-01)', p_run_at
            USING ERRCODE = '22023';
    END IF;
    IF p_concurrency_limit IS NOT NULL AND p_concurrency_limit < 1 THEN
        RAISE EXCEPTION 'notifyq: concurrency limit % must be at least 1', p_concurrency_limit
            USING ERRCODE = '22023';
    END IF;
    IF p_concurrency_collision IS NOT NULL
       AND p_concurrency_collision NOT IN ('queue', 'reject', 'replace') THEN
        RAISE EXCEPTION 'notifyq: concurrency collision % must be queue, reject or replace',
            quote_literal(p_concurrency_collision) USING ERRCODE = '22023';
    END IF;
    IF p_dedupe_states IS NOT NULL AND (cardinality(p_dedupe_states) = 0
       OR NOT p_dedupe_states <@ ARRAY['pending', 'running', 'waiting', 'completed', 'failed',
                                       'timed_out', 'canceled']) THEN
        RAISE EXCEPTION 'notifyq: dedupe states % must be run statuses (pending, running, '
            'waiting, completed, failed, timed_out, canceled)', p_dedupe_states
            USING ERRCODE = '22023';
    END IF;

    SELECT * INTO def FROM job WHERE type = p_job_type;
    IF NOT FOUND AND NOT coalesce(p_allow_unknown_type, false) THEN
        PERFORM _accept_unknown_job_type(p_job_type);
    END IF;

    dedupe := p_dedupe_key;
    IF dedupe IS NULL AND def.dedupe_key_template IS NOT NULL THEN
        dedupe := _expand_template(def.dedupe_key_template, p_input);
    END IF;
    IF dedupe IS NOT NULL THEN
        states := coalesce(p_dedupe_states, def.dedupe_states,
                           ARRAY['pending', 'running', 'waiting', 'completed']);
        -- Two-key form: text cannot hold chr(0) as a separator, and (type, key) stays unambiguous.
        PERFORM pg_advisory_xact_lock(hashtext(p_job_type), hashtext(dedupe));
        -- A live run is the duplicate whatever its age; a finished one only within the window.
        SELECT * INTO existing FROM job_run
        WHERE job_type = p_job_type AND dedupe_key = dedupe
          AND tenant_id IS NOT DISTINCT FROM p_tenant_id
          AND status = ANY (states)
          AND (status IN ('pending', 'running', 'waiting')
               OR created_at >= now() - make_interval(secs =>
                    coalesce(p_dedupe_window_s, def.dedupe_window_s, 1e9)))
        ORDER BY created_at DESC
        LIMIT 1;
        IF FOUND THEN
            RETURN existing;
        END IF;
    END IF;

    ckey := p_concurrency_key;
    IF ckey IS NULL AND def.concurrency_key_template IS NOT NULL THEN
        ckey := _expand_template(def.concurrency_key_template, p_input);
    END IF;
    IF ckey IS NOT NULL THEN
        climit := coalesce(p_concurrency_limit, def.concurrency_limit, 1);
        collision := coalesce(p_concurrency_collision, def.concurrency_collision, 'queue');
        -- The same lock the keyed claim takes: nobody claims this key while we decide.
        PERFORM pg_advisory_xact_lock(hashtext('notifyq.concurrency'), hashtext(ckey));
        IF collision = 'reject' AND (SELECT count(*) FROM job_run
                WHERE concurrency_key = ckey AND status IN ('pending', 'running', 'waiting'))
                >= climit THEN
            RAISE EXCEPTION 'notifyq: concurrency key % is busy: its limit of % active run(s) is reached',
                quote_literal(ckey), climit USING ERRCODE = 'NQ409';
        ELSIF collision = 'replace' THEN
            FOR victim IN
                UPDATE job_run
                SET status = CASE WHEN status = 'running' THEN status ELSE 'canceled' END,
                    finished_at = CASE WHEN status = 'running' THEN finished_at ELSE now() END,
                    cancel_requested_at = coalesce(cancel_requested_at, now()),
                    updated_at = now()
                WHERE concurrency_key = ckey AND status IN ('pending', 'running', 'waiting')
                RETURNING id, status
            LOOP
                IF victim.status = 'running' THEN
                    PERFORM pg_notify(current_schema(), 'c:' || victim.id);
                END IF;
            END LOOP;
        END IF;
    END IF;

    INSERT INTO job_run (id, job_type, job_version, input, pool, priority, run_at, max_attempts,
                         timeout_s, dedupe_key, tags, trigger_source, trigger_ref,
                         concurrency_key, concurrency_limit, scope_entity_type, scope_entity_id,
                         tenant_id, parent_run_id, root_run_id, parent_close_policy, defaulted)
    VALUES (coalesce(p_id, uuid7()), p_job_type, coalesce(def.version, 1), p_input,
            coalesce(p_pool, def.pool, 'default'), coalesce(p_priority, def.priority_default, 0),
            coalesce(p_run_at, now()), coalesce(p_max_attempts, def.max_attempts, 25),
            def.timeout_s, dedupe, coalesce(p_tags, ARRAY[]::text[]),
            coalesce(p_trigger_source, 'manual'), p_trigger_ref, ckey, climit,
            coalesce(p_scope_entity_type, def.scope_entity_type),
            coalesce(p_scope_entity_id, CASE WHEN def.scope_id_template IS NOT NULL
                THEN _expand_template(def.scope_id_template, p_input) END),
            p_tenant_id,
            p_parent_run_id, p_root_run_id, p_parent_close_policy,
            CASE WHEN def.type IS NULL
                 THEN ((p_pool IS NULL)::integer + 2 * (p_priority IS NULL)::integer
                       + 4 * (p_max_attempts IS NULL)::integer)::smallint END)
    RETURNING * INTO created;

    IF p_notify THEN
        PERFORM pg_notify(current_schema(), 'j:' || created.pool);
    END IF;
    RETURN created;
END
$$;
