-- Durable runs: memoized steps, child runs with parent-close policies, concurrency keys,
-- durable sleeps and signals.

ALTER TABLE job_run
    ADD COLUMN concurrency_limit integer CHECK (concurrency_limit >= 1),
    ADD COLUMN wait_kind text CHECK (wait_kind IN ('sleep', 'children', 'signal')),
    ADD COLUMN wait_token text,
    -- The children a waiting parent waits for, and the children that have finished. Both live
    -- on the parent's row: a child finishing and its parent starting to wait both update that
    -- one row, so the row lock orders them and the last one to commit sees the other's write
    -- (no lost wake-up, whichever commits first).
    ADD COLUMN waiting_on uuid[],
    ADD COLUMN children_done uuid[] NOT NULL DEFAULT ARRAY[]::uuid[],
    ADD COLUMN has_children boolean NOT NULL DEFAULT false;

ALTER TABLE job ADD COLUMN scope_id_template text;

ALTER TABLE job_step
    ADD COLUMN kind text NOT NULL DEFAULT 'step'
        CHECK (kind IN ('step', 'checkpoint', 'child', 'sleep', 'signal')),
    ADD COLUMN attempt integer NOT NULL DEFAULT 1;

-- Runs with a concurrency key are claimed by their own query (at most `limit` running per key),
-- so the main claim index leaves them out and the keyed claim has an index of its own.
DROP INDEX job_run_claim_idx;
CREATE INDEX job_run_claim_idx ON job_run (pool, priority, run_at)
    WHERE status = 'pending' AND concurrency_key IS NULL;
CREATE INDEX job_run_claim_keyed_idx ON job_run (pool, concurrency_key, priority, run_at)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;
CREATE INDEX job_run_key_active_idx ON job_run (concurrency_key, status)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'running', 'waiting');
CREATE INDEX job_run_waiting_idx ON job_run (run_at) WHERE status = 'waiting';
CREATE INDEX job_run_wait_token_idx ON job_run (wait_token)
    WHERE status = 'waiting' AND wait_token IS NOT NULL;
CREATE INDEX job_run_scope_idx ON job_run (scope_entity_type, scope_entity_id, id)
    WHERE scope_entity_id IS NOT NULL;
CREATE INDEX job_run_root_idx ON job_run (root_run_id) WHERE root_run_id IS NOT NULL;

-- Signals sent to tokens (a signal may arrive before the run waits for it).
CREATE TABLE job_signal (
    token      text PRIMARY KEY CHECK (length(token) BETWEEN 1 AND 512),
    payload    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Expands "order:{order_id}" with the input's top-level fields (for enqueuers in any language).
CREATE FUNCTION _expand_template(template text, input jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    field  text;
    result text := template;
BEGIN
    IF template IS NULL OR jsonb_typeof(input) <> 'object' THEN
        RETURN NULL;
    END IF;
    FOR field IN SELECT (regexp_matches(template, '\{([A-Za-z0-9_]+)\}', 'g'))[1] LOOP
        result := replace(result, '{' || field || '}', coalesce(input ->> field, ''));
    END LOOP;
    RETURN result;
END
$$;

DROP FUNCTION enqueue(text, jsonb, timestamptz, integer, text, integer, text, text[]);
DROP FUNCTION _enqueue(text, jsonb, timestamptz, integer, text, integer, text, text[], uuid,
                       boolean, double precision, text, text);

-- Enqueue: the one implementation behind Python, HTTP and SQL callers. Validates, applies the
-- stored job definition's defaults (pool, priority, attempts, timeout, key templates), honours
-- dedupe keys and concurrency keys race-free (transaction-scoped advisory locks on the keys),
-- and wakes workers with one NOTIFY per pool per transaction.
CREATE FUNCTION _enqueue(
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
    p_parent_close_policy   text DEFAULT NULL
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
    ckey      text;
    climit    integer;
    collision text;
    victim    record;
BEGIN
    IF p_job_type IS NULL OR p_job_type !~ '^[a-z0-9_][a-z0-9_.:-]{0,127}$' THEN
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

    SELECT * INTO def FROM job WHERE type = p_job_type;

    dedupe := p_dedupe_key;
    IF dedupe IS NULL AND def.dedupe_key_template IS NOT NULL THEN
        dedupe := _expand_template(def.dedupe_key_template, p_input);
    END IF;
    IF dedupe IS NOT NULL THEN
        -- Two-key form: text cannot hold chr(0) as a separator, and (type, key) stays unambiguous.
        PERFORM pg_advisory_xact_lock(hashtext(p_job_type), hashtext(dedupe));
        SELECT * INTO existing FROM job_run
        WHERE job_type = p_job_type AND dedupe_key = dedupe
          AND created_at >= now() - make_interval(secs =>
                coalesce(p_dedupe_window_s, def.dedupe_window_s, 1e9))
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
                         tenant_id, parent_run_id, root_run_id, parent_close_policy)
    VALUES (coalesce(p_id, uuid7()), p_job_type, coalesce(def.version, 1), p_input,
            coalesce(p_pool, def.pool, 'default'), coalesce(p_priority, def.priority_default, 0),
            coalesce(p_run_at, now()), coalesce(p_max_attempts, def.max_attempts, 25),
            def.timeout_s, dedupe, coalesce(p_tags, ARRAY[]::text[]),
            coalesce(p_trigger_source, 'manual'), p_trigger_ref, ckey, climit,
            coalesce(p_scope_entity_type, def.scope_entity_type),
            coalesce(p_scope_entity_id, CASE WHEN def.scope_id_template IS NOT NULL
                THEN _expand_template(def.scope_id_template, p_input) END),
            p_tenant_id,
            p_parent_run_id, p_root_run_id, p_parent_close_policy)
    RETURNING * INTO created;

    IF p_notify THEN
        PERFORM pg_notify(current_schema(), 'j:' || created.pool);
    END IF;
    RETURN created;
END
$$;

CREATE FUNCTION enqueue(
    job_type          text,
    input             jsonb,
    run_at            timestamptz DEFAULT NULL,
    priority          integer DEFAULT NULL,
    pool              text DEFAULT NULL,
    max_attempts      integer DEFAULT NULL,
    dedupe_key        text DEFAULT NULL,
    tags              text[] DEFAULT NULL,
    concurrency_key   text DEFAULT NULL,
    scope_entity_id   text DEFAULT NULL,
    tenant_id         text DEFAULT NULL
) RETURNS uuid
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT (_enqueue(job_type, input, run_at, priority, pool, max_attempts, dedupe_key, tags,
                     p_concurrency_key => concurrency_key, p_scope_entity_id => scope_entity_id,
                     p_tenant_id => tenant_id)).id
$$;

-- Claims runs with a concurrency key: per key, at most `concurrency_limit` running at once.
-- Each key is examined under a transaction-scoped advisory lock (try-lock: a key another
-- claimer or enqueuer holds is skipped, never waited for), and its running count is read by a
-- statement that starts after the lock is held, so it sees every committed claim of that key.
CREATE FUNCTION _claim_keyed(p_pool text, p_limit integer, p_worker_id text,
                             p_lease_s double precision, p_now timestamptz)
RETURNS SETOF job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    now_      timestamptz := coalesce(p_now, now());
    k         record;
    running   integer;
    free      integer;
    claimed   integer;
    remaining integer := p_limit;
BEGIN
    FOR k IN
        SELECT concurrency_key AS key, max(concurrency_limit) AS lim
        FROM job_run
        WHERE status = 'pending' AND pool = p_pool AND run_at <= now_
          AND concurrency_key IS NOT NULL
        GROUP BY concurrency_key
        ORDER BY min(priority), min(run_at)
        LIMIT 1000
    LOOP
        EXIT WHEN remaining <= 0;
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('notifyq.concurrency'),
                                                    hashtext(k.key));
        SELECT count(*) INTO running FROM job_run
        WHERE concurrency_key = k.key AND status = 'running';
        free := least(coalesce(k.lim, 1) - running, remaining);
        CONTINUE WHEN free <= 0;
        RETURN QUERY
            WITH picked AS (
                SELECT id FROM job_run
                WHERE status = 'pending' AND pool = p_pool AND concurrency_key = k.key
                  AND run_at <= now_
                ORDER BY priority, run_at
                LIMIT free
                FOR UPDATE SKIP LOCKED
            )
            UPDATE job_run r
            SET status = 'running', attempts = r.attempts + 1, fence = r.fence + 1,
                claimed_at = now_, started_at = coalesce(r.started_at, now_),
                leased_by = p_worker_id,
                lease_expires_at = now_ + make_interval(secs => p_lease_s), updated_at = now_
            FROM picked
            WHERE r.id = picked.id
            RETURNING r.*;
        GET DIAGNOSTICS claimed = ROW_COUNT;
        remaining := remaining - claimed;
    END LOOP;
END
$$;

-- When a run that is a child or a parent finishes: the child is recorded on its parent's row
-- (waking a parent whose awaited children are now all done), and a parent applies its
-- children's parent-close policies: `terminate` cancels at once (running ones are interrupted:
-- their fence no longer matches), `cancel` cancels pending/waiting ones and asks running ones to
-- stop, `abandon` does nothing. The UPDATEs below fire this trigger again, which cascades the
-- policies down the tree.
-- A row trigger whose WHEN clause the executor checks in C: claims, heartbeats and plain runs
-- never call the function. (A statement trigger with transition tables, the first version,
-- copied every updated row of every claim and cost 13 % of the claim+complete ceiling.)
CREATE FUNCTION _after_run_finished() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    woken record;
    hit   record;
BEGIN
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

CREATE TRIGGER job_run_finished
    AFTER UPDATE OF status ON job_run
    FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'timed_out', 'canceled')
          AND OLD.status NOT IN ('completed', 'failed', 'timed_out', 'canceled')
          AND (NEW.parent_run_id IS NOT NULL OR NEW.has_children))
    EXECUTE FUNCTION _after_run_finished();

-- Deliver a signal: stored (it may arrive before the run waits), and any run waiting for the
-- token is put back in line. Returns how many runs were woken. The first payload for a token
-- wins; sending it again wakes again but does not change it.
CREATE FUNCTION signal(token text, payload jsonb DEFAULT '{}') RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    woken integer := 0;
    r     record;
BEGIN
    IF signal.token IS NULL OR length(signal.token) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'notifyq: signal token must be 1 to 512 characters'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO job_signal (token, payload) VALUES (signal.token, coalesce(signal.payload, '{}'))
    ON CONFLICT ON CONSTRAINT job_signal_pkey DO NOTHING;
    FOR r IN
        UPDATE job_run SET status = 'pending', run_at = now(), updated_at = now()
        WHERE status = 'waiting' AND wait_kind = 'signal' AND wait_token = signal.token
        RETURNING pool
    LOOP
        woken := woken + 1;
        PERFORM pg_notify(current_schema(), 'j:' || r.pool);
    END LOOP;
    RETURN woken;
END
$$;
