-- The active key version becomes a cluster setting (issue 35). Until now each process encrypted
-- under its own NOTIFYQ_ACTIVE_KEY_VERSION, so during a rolling deploy the processes already
-- restarted wrote version 2 while those not yet restarted could not read it. Now every process
-- loads all its configured versions as decrypt-capable and encrypts under the version promoted
-- here; a promotion is refused while a live process does not hold that version.
--
-- Online: three new tables and nullable columns, no rewrite; processes of the previous version
-- ignore them (and are not counted as key holders: finish the upgrade before promoting).

-- When a version last became the cluster's active one. NULL: never. A process whose
-- NOTIFYQ_ACTIVE_KEY_VERSION names a version promotes it by itself only if it was never active
-- (so an old deployment setting cannot undo a later promotion).
ALTER TABLE key_version ADD COLUMN promoted_at timestamptz;

-- One row: the version every process encrypts under. Written by `notifyq keys promote` (or
-- POST /v1/admin/keys/promote, the dashboard), or by the first process that finds no row
-- (from its NOTIFYQ_ACTIVE_KEY_VERSION). `forced`: promoted although a live process lacked it.
CREATE TABLE key_active (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version     integer NOT NULL REFERENCES key_version (version),
    promoted_at timestamptz NOT NULL,
    promoted_by text NOT NULL CHECK (length(promoted_by) BETWEEN 1 AND 300),
    forced      boolean NOT NULL DEFAULT false
);

-- Every live process that holds a keyring (workers, serve, an App that encrypts): the versions
-- it holds, by key check value (never the key), and the version it encrypts under now (NULL:
-- none, it lacks the active version). Renewed by each key check (every key_check_interval_s in
-- workers and serve; at its next encrypt or decrypt in other processes), alive for three
-- intervals after it, deleted on a clean stop; the reaper removes the rows of processes that
-- died. Promotion and retirement read it; nothing on the hot path does.
CREATE TABLE key_holder (
    id            text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
    role          text NOT NULL CHECK (role IN ('worker', 'serve', 'app')),
    host          text NOT NULL,
    pid           integer NOT NULL,
    versions      integer[] NOT NULL,
    check_values  bytea[] NOT NULL
                  CHECK (cardinality(check_values) = cardinality(versions)),
    encrypts_with integer,
    interval_s    double precision NOT NULL CHECK (interval_s > 0),
    started_at    timestamptz NOT NULL,
    checked_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);

-- A rotation an operator can throttle and pause while it runs: read by the secret.reencrypt
-- run before every batch. `paused_s` adds up the time spent paused (the rate leaves it out).
ALTER TABLE key_rotation
    ADD COLUMN rate_per_s double precision CHECK (rate_per_s > 0),
    ADD COLUMN paused_at  timestamptz,
    ADD COLUMN paused_s   double precision NOT NULL DEFAULT 0;
