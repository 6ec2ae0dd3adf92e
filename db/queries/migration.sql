-- Named queries for the migration ledger.

-- name: migration_lock
-- Held until the transaction ends (each migration's own): safe through a transaction pool.
SELECT pg_advisory_xact_lock(hashtextextended('notifyq.migrate:' || %(schema_name)s, 0))

-- name: migration_ledger_create
CREATE TABLE IF NOT EXISTS {schema}.schema_migration (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migration_schema_create
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: migration_ledger_exists
SELECT to_regclass(quote_ident(%(schema_name)s) || '.schema_migration') IS NOT NULL AS exists

-- name: migration_applied_list
SELECT version, name, checksum FROM {schema}.schema_migration ORDER BY version

-- name: migration_record
INSERT INTO {schema}.schema_migration (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s)

-- name: migration_search_path_set
SELECT set_config('search_path', quote_ident(%(schema_name)s) || ', public', true)
