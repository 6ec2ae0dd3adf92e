-- Named queries over the user's encrypted columns. Besides {schema}, these are templates:
-- {{table}}, {{pk}} and {{column}} become quoted identifiers and {{pk_type}} the primary key's
-- type as PostgreSQL names it (notifyq.crypto.columns.ColumnQueries fills them in).

-- name: encrypted_column_describe
-- The types of the named columns of a table (no rows: the table does not exist).
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_attribute a
WHERE a.attrelid = to_regclass(%(table)s) AND a.attname = ANY(%(names)s::text[])
  AND a.attnum > 0 AND NOT a.attisdropped

-- name: encrypted_column_page_first
-- Keyset pages by primary key (never OFFSET): each page costs the same however deep it is.
SELECT {{pk}} AS pk, {{column}} AS ciphertext FROM {{table}}
WHERE {{column}} IS NOT NULL AND {schema}.key_version_of({{column}}) <> %(version)s
ORDER BY {{pk}}
LIMIT %(limit)s

-- name: encrypted_column_page_after
SELECT {{pk}} AS pk, {{column}} AS ciphertext FROM {{table}}
WHERE {{pk}} > %(after)s::{{pk_type}}
  AND {{column}} IS NOT NULL AND {schema}.key_version_of({{column}}) <> %(version)s
ORDER BY {{pk}}
LIMIT %(limit)s

-- name: encrypted_column_swap_many
-- Compare-and-swap: a row changed since it was read keeps its new value (it no longer equals
-- the old ciphertext); the verification pass looks at it again.
UPDATE {{table}} AS t SET {{column}} = v.new
FROM unnest(%(pks)s::{{pk_type}}[], %(olds)s::bytea[], %(news)s::bytea[]) AS v(pk, old, new)
WHERE t.{{pk}} = v.pk AND t.{{column}} = v.old

-- name: encrypted_column_version_counts
SELECT {schema}.key_version_of({{column}}) AS version, count(*) AS n FROM {{table}}
WHERE {{column}} IS NOT NULL
GROUP BY 1
ORDER BY 1

-- name: encrypted_column_record
-- The registry of encrypted columns (0009): every column a process registered, recorded by its
-- key check. A column recorded before keeps its first registration.
INSERT INTO {schema}.encrypted_column (table_name, column_name, pk, builtin, registered_at)
SELECT t, c, p, b, coalesce(%(now)s::timestamptz, now())
FROM unnest(%(tables)s::text[], %(columns)s::text[], %(pks)s::text[], %(builtins)s::boolean[])
     AS r(t, c, p, b)
ON CONFLICT (table_name, column_name) DO NOTHING

-- name: encrypted_column_list
-- Every recorded column: the user's first, then notifyq's own, each in name order.
SELECT table_name, column_name, pk, builtin FROM {schema}.encrypted_column
ORDER BY builtin, table_name, column_name
