-- notifyq keys: master-key versions (check values only, never key material), key rotations,
-- their per-column checkpoints and the rows they could not decrypt.

-- The key version of a notifyq ciphertext, read from its header: byte 0 is the format (1), bytes
-- 1..4 the version (big-endian). 0 for anything that is not a well-formed notifyq ciphertext, so
-- a corrupted row is never mistaken for one on the active version. IMMUTABLE: usable in an
-- expression index or a generated column on your own tables, e.g.
--   CREATE INDEX ON public.users (notifyq.key_version_of(api_token));
CREATE FUNCTION key_version_of(ciphertext bytea) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT CASE WHEN length(ciphertext) >= 33 AND get_byte(ciphertext, 0) = 1
                     AND get_byte(ciphertext, 1) < 128
                THEN (get_byte(ciphertext, 1)::bigint << 24 | get_byte(ciphertext, 2) << 16
                      | get_byte(ciphertext, 3) << 8 | get_byte(ciphertext, 4))::integer
                ELSE 0 END
$$;

-- One row per key version ever configured: an HMAC-SHA256 of a constant under the key (the key
-- check value). A process whose key for a version differs refuses to start.
CREATE TABLE key_version (
    version       integer PRIMARY KEY CHECK (version > 0),
    check_value   bytea NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    retired_at    timestamptz
);

-- One row per secret.reencrypt run (the rotation's target lives here, so "is a rotation
-- pending or running" reads a tiny table, never job_run by type).
CREATE TABLE key_rotation (
    run_id         uuid PRIMARY KEY REFERENCES job_run (id) ON DELETE CASCADE,
    target_version integer NOT NULL CHECK (target_version > 0),
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX key_rotation_created_idx ON key_rotation (created_at);

-- The checkpoint of one rotation over one encrypted column, committed in the same transaction
-- as the batch it describes. `pass` 1 re-encrypts; later passes verify (and catch stale
-- writers); a pass that changes nothing finishes the column.
CREATE TABLE key_rotation_progress (
    run_id       uuid NOT NULL REFERENCES key_rotation (run_id) ON DELETE CASCADE,
    column_name  text NOT NULL,
    pass         integer NOT NULL DEFAULT 1,
    last_pk      text,
    pass_changes bigint NOT NULL DEFAULT 0,
    reencrypted  bigint NOT NULL DEFAULT 0,
    conflicts    bigint NOT NULL DEFAULT 0,
    batches      bigint NOT NULL DEFAULT 0,
    finished_at  timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, column_name)
);

-- Rows a rotation could not decrypt: skipped, listed in the run's output and `keys status`.
CREATE TABLE key_rotation_failure (
    run_id      uuid NOT NULL REFERENCES key_rotation (run_id) ON DELETE CASCADE,
    column_name text NOT NULL,
    row_pk      text NOT NULL,
    reason      text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, column_name, row_pk)
);
