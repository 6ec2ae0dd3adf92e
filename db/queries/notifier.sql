-- Named queries of the notifier: its LISTEN (the channel is the schema name) and the ping
-- that tells a live listener connection from a dead one.

-- name: notifier_listen
LISTEN {schema}

-- name: notifier_ping
SELECT 1 AS ok
