-- Security hardening (issue 12).

-- Every encrypted column any process has registered (notifyq's own and the user's), written by
-- the key check each process runs before its first encrypt or decrypt. Key rotation, `keys
-- status` and `keys retire` count these, whoever asks: a column registered only by the
-- application (`--app`) still keeps its key versions from being retired by a bare `serve`.
CREATE TABLE encrypted_column (
    table_name    text NOT NULL CHECK (length(table_name) BETWEEN 3 AND 127),
    column_name   text NOT NULL CHECK (length(column_name) BETWEEN 1 AND 63),
    pk            text NOT NULL CHECK (length(pk) BETWEEN 1 AND 63),
    builtin       boolean NOT NULL DEFAULT false,
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, column_name)
);

-- Receiver credentials in endpoint headers: the values are one keyring ciphertext (a JSON
-- object; associated data (schema.webhook_endpoint, header_values, id)), re-encrypted by key
-- rotation like the signing secrets. `headers` keeps the names with masked values only.
-- Rows written before this migration keep their clear values until a worker with the keyring
-- seals them (at its start).
ALTER TABLE webhook_endpoint ADD COLUMN header_values bytea;
