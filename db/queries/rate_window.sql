-- Named queries for rate-limit windows (migration 0015). The keyed claim (_claim_keyed) reads
-- and writes them; these only list and prune.

-- name: rate_window_list
-- Each key that has started runs: its limit, the starts still in its window, its runnable
-- backlog, and when the next run may start (NULL: now, the window has room).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
w AS (
    SELECT w.key, w.pool, w.rate_limit, w.period_s, w.buckets, n.now,
           {schema}._rate_used(w.buckets, w.counts, w.period_s, n.now) AS in_window
    FROM {schema}.rate_window w, n
)
SELECT w.key, w.pool, w.rate_limit, w.period_s, w.in_window,
       (SELECT count(*) FROM {schema}.job_run j
        WHERE j.status = 'pending' AND j.pool = w.pool AND j.rate_key = w.key
          AND j.run_at <= w.now) AS runnable,
       CASE WHEN w.in_window >= w.rate_limit
            THEN {schema}._rate_next_start(w.buckets, w.period_s, w.now) END AS next_start_at
FROM w
ORDER BY w.key
LIMIT %(limit)s

-- name: rate_window_prune
-- Windows whose every start has left (nothing to remember): the keyed claim makes a key's row
-- again at its next start.
DELETE FROM {schema}.rate_window w
WHERE w.updated_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => w.period_s)
