-- Named queries about signals.

-- name: job_signal_send
SELECT {schema}.signal(%(token)s, %(payload)s::jsonb) AS woken

-- name: job_signal_get
SELECT payload FROM {schema}.job_signal WHERE token = %(token)s
