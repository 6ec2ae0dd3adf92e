-- notifyq core schema: job definitions, runs, memoized steps, leadership, periodic ticks.
-- Applied by `notifyq migrate` with search_path set to the target schema, so nothing here
-- names the schema; functions capture it with `SET search_path FROM CURRENT`.

-- Run ids are UUIDv7: 48 bits of Unix milliseconds, then random bits. Time-ordered ids make the
-- primary key append-only (no random page splits at insert) and let listings page newest-first on
-- the primary key alone, so job_run needs no created_at index. Python generates the same layout.
CREATE FUNCTION uuid7() RETURNS uuid
LANGUAGE sql VOLATILE
AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                      FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

CREATE TABLE job (
    type                    text PRIMARY KEY,
    version                 integer NOT NULL DEFAULT 1,
    pool                    text NOT NULL DEFAULT 'default',
    priority_default        integer NOT NULL DEFAULT 0,
    max_attempts            integer NOT NULL DEFAULT 25 CHECK (max_attempts >= 1),
    retry_policy            jsonb NOT NULL DEFAULT '{}',
    timeout_s               double precision CHECK (timeout_s > 0),
    concurrency_key_template text,
    concurrency_collision   text CHECK (concurrency_collision IN ('queue', 'reject', 'replace')),
    concurrency_limit       integer CHECK (concurrency_limit >= 1),
    dedupe_key_template     text,
    dedupe_window_s         double precision CHECK (dedupe_window_s > 0),
    replay_from             text NOT NULL DEFAULT 'last_step'
                            CHECK (replay_from IN ('scratch', 'last_step', 'last_checkpoint')),
    scope_entity_type       text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE job_run (
    id                  uuid PRIMARY KEY DEFAULT uuid7(),
    job_type            text NOT NULL CHECK (job_type ~ '^[a-z0-9_][a-z0-9_.:-]{0,127}$'),
    job_version         integer NOT NULL DEFAULT 1,
    status              text NOT NULL DEFAULT 'pending' CHECK (status IN
                        ('pending', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'canceled')),
    input               jsonb NOT NULL CHECK (jsonb_typeof(input) IN ('object', 'array')),
    output              jsonb,
    error               jsonb,
    pool                text NOT NULL DEFAULT 'default' CHECK (pool ~ '^[a-z0-9_][a-z0-9_.:-]{0,63}$'),
    priority            integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN -1000 AND 1000),
    run_at              timestamptz NOT NULL DEFAULT now(),
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts        integer NOT NULL DEFAULT 25 CHECK (max_attempts BETWEEN 1 AND 1000),
    timeout_s           double precision CHECK (timeout_s > 0),
    -- Lease. `fence` grows by one at every claim; every write-back about a claimed run names
    -- the fence it was claimed with, so a worker whose lease was taken over matches no row.
    fence               bigint NOT NULL DEFAULT 0,
    claimed_at          timestamptz,
    leased_by           text,
    lease_expires_at    timestamptz,
    cancel_requested_at timestamptz,
    -- Durable runs.
    parent_run_id       uuid REFERENCES job_run (id) ON DELETE SET NULL,
    root_run_id         uuid,
    parent_close_policy text CHECK (parent_close_policy IN ('terminate', 'cancel', 'abandon')),
    scope_entity_type   text,
    scope_entity_id     text,
    tenant_id           text,
    tags                text[] NOT NULL DEFAULT ARRAY[]::text[],
    concurrency_key     text,
    dedupe_key          text,
    trigger_source      text NOT NULL DEFAULT 'manual'
                        CHECK (trigger_source IN ('manual', 'schedule', 'event', 'parent')),
    trigger_ref         text,
    started_at          timestamptz,
    finished_at         timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- Every run is updated 2-3 times in its life (claim, heartbeat, finish): leave room on each page
-- for HOT updates and vacuum the table far more eagerly than the 20 % default.
ALTER TABLE job_run SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- The claim query walks this index in (priority, run_at) order for one pool; only runnable rows
-- are in it, so it stays small however many finished rows the table holds.
CREATE INDEX job_run_claim_idx ON job_run (pool, priority, run_at) WHERE status = 'pending';
-- The producer's "when is the next scheduled run?" question, answered from the first entry.
CREATE INDEX job_run_scheduled_idx ON job_run (pool, run_at) WHERE status = 'pending';
-- The reaper looks only at running rows (a few per worker slot).
CREATE INDEX job_run_running_idx ON job_run (lease_expires_at) WHERE status = 'running';
-- The purger deletes finished rows oldest first.
CREATE INDEX job_run_finished_idx ON job_run (finished_at)
    WHERE status IN ('completed', 'failed', 'timed_out', 'canceled');
CREATE INDEX job_run_dedupe_idx ON job_run (job_type, dedupe_key, created_at)
    WHERE dedupe_key IS NOT NULL;
CREATE INDEX job_run_parent_idx ON job_run (parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE job_step (
    run_id      uuid NOT NULL REFERENCES job_run (id) ON DELETE CASCADE,
    step_id     text NOT NULL,
    seq         integer NOT NULL,
    status      text NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    output      jsonb,
    error       jsonb,
    attempts    integer NOT NULL DEFAULT 0,
    started_at  timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (run_id, step_id)
);

-- One row per singleton role ("maintenance"); whoever holds an unexpired row leads.
CREATE TABLE leader (
    name       text PRIMARY KEY,
    leader_id  text NOT NULL,
    elected_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- One row per (periodic schedule, tick): the primary key makes "exactly one run per tick" hold
-- however many workers race to enqueue it.
CREATE TABLE periodic_tick (
    name    text NOT NULL,
    tick_at timestamptz NOT NULL,
    run_id  uuid NOT NULL,
    PRIMARY KEY (name, tick_at)
);

-- Enqueue: the one implementation behind Python, HTTP and SQL callers.
-- Validates like the Python edge does, applies the stored job definition's defaults, honours
-- dedupe keys race-free (transaction-scoped advisory lock on the key), and wakes workers with
-- one NOTIFY per pool per transaction (PostgreSQL folds identical notifications in a transaction).
CREATE FUNCTION _enqueue(
    p_job_type     text,
    p_input        jsonb,
    p_run_at       timestamptz DEFAULT NULL,
    p_priority     integer DEFAULT NULL,
    p_pool         text DEFAULT NULL,
    p_max_attempts integer DEFAULT NULL,
    p_dedupe_key   text DEFAULT NULL,
    p_tags         text[] DEFAULT NULL,
    p_id           uuid DEFAULT NULL,
    p_notify       boolean DEFAULT true,
    p_dedupe_window_s double precision DEFAULT NULL,
    p_trigger_source text DEFAULT 'manual',
    p_trigger_ref  text DEFAULT NULL
) RETURNS job_run
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    def      job;
    existing job_run;
    created  job_run;
    size     integer;
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

    SELECT * INTO def FROM job WHERE type = p_job_type;

    IF p_dedupe_key IS NOT NULL THEN
        -- Two-key form: text cannot hold chr(0) as a separator, and (type, key) stays unambiguous.
        PERFORM pg_advisory_xact_lock(hashtext(p_job_type), hashtext(p_dedupe_key));
        SELECT * INTO existing FROM job_run
        WHERE job_type = p_job_type AND dedupe_key = p_dedupe_key
          AND created_at >= now() - make_interval(secs =>
                coalesce(p_dedupe_window_s, def.dedupe_window_s, 1e9))
        ORDER BY created_at DESC
        LIMIT 1;
        IF FOUND THEN
            RETURN existing;
        END IF;
    END IF;

    INSERT INTO job_run (id, job_type, job_version, input, pool, priority, run_at, max_attempts,
                         timeout_s, dedupe_key, tags, trigger_source, trigger_ref)
    VALUES (coalesce(p_id, uuid7()), p_job_type, coalesce(def.version, 1), p_input,
            coalesce(p_pool, def.pool, 'default'), coalesce(p_priority, def.priority_default, 0),
            coalesce(p_run_at, now()), coalesce(p_max_attempts, def.max_attempts, 25),
            def.timeout_s, p_dedupe_key, coalesce(p_tags, ARRAY[]::text[]),
            coalesce(p_trigger_source, 'manual'), p_trigger_ref)
    RETURNING * INTO created;

    IF p_notify THEN
        PERFORM pg_notify(current_schema(), 'j:' || created.pool);
    END IF;
    RETURN created;
END
$$;

-- The public SQL entry point for any language: returns the run id (an existing one when the
-- dedupe key matched). Wakes workers when the caller's transaction commits.
CREATE FUNCTION enqueue(
    job_type     text,
    input        jsonb,
    run_at       timestamptz DEFAULT NULL,
    priority     integer DEFAULT NULL,
    pool         text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    dedupe_key   text DEFAULT NULL,
    tags         text[] DEFAULT NULL
) RETURNS uuid
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT (_enqueue(job_type, input, run_at, priority, pool, max_attempts, dedupe_key, tags)).id
$$;
