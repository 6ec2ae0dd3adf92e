-- Semantics a first hour with notifyq runs into (issue 11): unknown job types are refused once a
-- worker has registered handlers; runs enqueued before their type's definition existed take its
-- defaults when it appears; FIFO at equal priority; signals are consumed by the wait that
-- receives them, queue up in order and expire; dedupe matches the states the policy names.

-- -- Unknown job types ---------------------------------------------------------------------------

-- Every enqueue path calls this for a type that has no row in `job` (unless the caller accepts
-- unknown types): true while `job` is empty (no worker has started yet, every type is accepted
-- as before), otherwise it raises SQLSTATE NQ422, which notifyq's Python maps to
-- UnknownJobType (translate_db_error) and HTTP to 422. Called only for such a row, so its cost
-- (a look at `job`, the list of known types) is off the hot path: an enqueue of a registered
-- type never calls it.
CREATE FUNCTION _accept_unknown_job_type(p_job_type text) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    known text;
BEGIN
    IF NOT EXISTS (SELECT FROM job) THEN
        RETURN true;
    END IF;
    SELECT string_agg(type, ', ' ORDER BY type) INTO known
    FROM (SELECT type FROM job ORDER BY type LIMIT 20) t;
    RAISE EXCEPTION 'notifyq: unknown job type %: no worker has registered a handler for it '
        '(registered: %); check the job type, or enqueue with allow_unknown_type to accept it '
        'before its worker starts', quote_literal(p_job_type), known
        USING ERRCODE = 'NQ422';
END
$$;

-- Which of pool (1), priority (2) and max_attempts (4) a run took from the table defaults because
-- no definition of its type existed at enqueue (NULL: a definition applied, nothing to do). When
-- a worker later upserts the definition, job_run_apply_definitions gives such runs its values
-- (and its timeout_s and version, which only a definition sets), so a run enqueued before the
-- first worker started retries as its handler says, not 25 times. The claim never reads it.
ALTER TABLE job_run ADD COLUMN defaulted smallint;
-- Only unfinished runs enqueued before their definition: normally empty, so a worker's start
-- (and the purger's tick) finds nothing to do without reading job_run.
CREATE INDEX job_run_defaulted_idx ON job_run (job_type)
    WHERE defaulted IS NOT NULL AND status IN ('pending', 'running', 'waiting');

-- -- Dedupe states -------------------------------------------------------------------------------

-- The statuses a dedupe key matches (DedupePolicy(states=...)); NULL: the default, live runs
-- (pending, running, waiting) whatever their age and completed runs within the window. A failed
-- or canceled run no longer blocks enqueueing the same key again.
ALTER TABLE job ADD COLUMN dedupe_states text[]
    CHECK (dedupe_states <@ ARRAY['pending', 'running', 'waiting', 'completed', 'failed',
                                  'timed_out', 'canceled']
           AND cardinality(dedupe_states) > 0);

-- -- FIFO at equal priority ------------------------------------------------------------------------

-- Runs of one batch share their run_at (the statement's now()), and the claim ordered by
-- (priority, run_at) alone: ties came back in whatever order the index scan met them (a batch
-- ran newest first). The id breaks ties: ids made by one process increase in enqueue order
-- (notifyq.enqueue.new_run_ids counts within a millisecond), and uuid7() below puts the
-- sub-millisecond time in rand_a. The wider key costs the claim nothing measurable: the scan
-- still stops after `limit` entries of the same index.
DROP INDEX job_run_claim_idx;
CREATE INDEX job_run_claim_idx ON job_run (pool, priority, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NULL;
DROP INDEX job_run_claim_keyed_idx;
CREATE INDEX job_run_claim_keyed_idx ON job_run (pool, concurrency_key, priority, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;

-- UUIDv7 with RFC 9562's method 3: the 12 bits of rand_a hold the fraction of the millisecond
-- (~0.25 us steps), so ids made one after another by one backend (e.g. `SELECT
-- notifyq.enqueue(...) FROM generate_series(1, 100)`) increase; rand_b stays random.
CREATE OR REPLACE FUNCTION uuid7() RETURNS uuid
LANGUAGE sql VOLATILE
AS $$
    SELECT encode(
        overlay(uuid_send(gen_random_uuid())
                PLACING substring(int8send(us / 1000) FROM 3)
                     || substring(int4send(28672 + ((us % 1000) * 4096 / 1000)::integer) FROM 3)
                FROM 1 FOR 8),
        'hex')::uuid
    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) t
$$;

CREATE OR REPLACE FUNCTION _claim_keyed(p_pool text, p_limit integer, p_worker_id text,
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
                ORDER BY priority, run_at, id
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

-- -- Enqueue ---------------------------------------------------------------------------------------

-- Same as 0002's, plus: the unknown-type refusal (p_allow_unknown_type opts out), `defaulted`,
-- and dedupe on the policy's states. New parameters go last, so positional callers
-- (periodic_tick_enqueue) keep working. Its SQL callers do not record dependencies, so the
-- function can be dropped and created again.
DROP FUNCTION enqueue(text, jsonb, timestamptz, integer, text, integer, text, text[], text, text,
                      text);
DROP FUNCTION _enqueue(text, jsonb, timestamptz, integer, text, integer, text, text[], uuid,
                       boolean, double precision, text, text, text, integer, text, text, text,
                       text, uuid, uuid, text);

-- The unknown-type check costs nothing for a registered type (the definition is read anyway);
-- the hot path is the plain INSERT (job_run_insert_many), whose comment has the measurement.
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

-- `allow_unknown_type => true` enqueues a type no worker has registered yet (a producer that
-- is deployed before its workers); without it such an enqueue raises SQLSTATE NQ422 once any
-- worker has registered handlers.
CREATE FUNCTION enqueue(
    job_type           text,
    input              jsonb,
    run_at             timestamptz DEFAULT NULL,
    priority           integer DEFAULT NULL,
    pool               text DEFAULT NULL,
    max_attempts       integer DEFAULT NULL,
    dedupe_key         text DEFAULT NULL,
    tags               text[] DEFAULT NULL,
    concurrency_key    text DEFAULT NULL,
    scope_entity_id    text DEFAULT NULL,
    tenant_id          text DEFAULT NULL,
    allow_unknown_type boolean DEFAULT false
) RETURNS uuid
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT (_enqueue(job_type, input, run_at, priority, pool, max_attempts, dedupe_key, tags,
                     p_concurrency_key => concurrency_key, p_scope_entity_id => scope_entity_id,
                     p_tenant_id => tenant_id,
                     p_allow_unknown_type => allow_unknown_type)).id
$$;

-- -- Signals ---------------------------------------------------------------------------------------

-- A signal was one row per token, first payload kept forever: a run waiting on a token used
-- long ago received the old payload at once. Now each signal is delivered once: to the run
-- waiting on its token the longest (written into that run's wait step, the run put back in
-- line), or, when none waits, queued for the next wait on the token, oldest first, until the
-- purger expires it (purger.signal_retention_s, 7 days). Rows already stored are kept and
-- queued in token order; they expire with the rest.
ALTER TABLE job_signal DROP CONSTRAINT job_signal_pkey;
ALTER TABLE job_signal ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
CREATE INDEX job_signal_token_idx ON job_signal (token, id);
CREATE INDEX job_signal_created_idx ON job_signal (created_at);

-- Returns 1 when a waiting run received the signal, 0 when it was queued. A run that is busy
-- (its row locked by a cancel or the resumer) is skipped rather than waited for; the signal is
-- queued, and the resumer wakes any run still waiting on a token that has queued signals.
CREATE OR REPLACE FUNCTION signal(token text, payload jsonb DEFAULT '{}') RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    waiter record;
BEGIN
    IF signal.token IS NULL OR length(signal.token) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'notifyq: signal token must be 1 to 512 characters'
            USING ERRCODE = '22023';
    END IF;
    SELECT r.id, r.pool INTO waiter FROM job_run r
    WHERE r.status = 'waiting' AND r.wait_kind = 'signal' AND r.wait_token = signal.token
    ORDER BY r.updated_at, r.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        -- The wait step ctx.wait_for_signal recorded before parking the run; its replay finds
        -- it completed and returns the payload.
        UPDATE job_step
        SET status = 'completed', output = jsonb_build_object('payload',
                                                              coalesce(signal.payload, '{}')),
            finished_at = now()
        WHERE run_id = waiter.id AND step_id = 'signal:' || signal.token
          AND status = 'running';
        IF NOT FOUND THEN
            -- No wait step to write into (a run parked by an older notifyq): queue the signal
            -- for its replay to take.
            INSERT INTO job_signal (token, payload)
            VALUES (signal.token, coalesce(signal.payload, '{}'));
        END IF;
        UPDATE job_run SET status = 'pending', run_at = now(), updated_at = now()
        WHERE id = waiter.id;
        PERFORM pg_notify(current_schema(), 'j:' || waiter.pool);
        RETURN 1;
    END IF;
    INSERT INTO job_signal (token, payload) VALUES (signal.token, coalesce(signal.payload, '{}'));
    RETURN 0;
END
$$;
