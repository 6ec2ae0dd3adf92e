-- Named queries for rate-limit windows (migration 0015). The keyed claim (_claim_keyed) reads
-- and writes them; these only list and prune.

-- name: rate_window_list
-- Each key that has started runs: its limit, the starts still in its window, its runnable
-- backlog, and when the next run may start (NULL: now, the window has room).
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
w AS (
    SELECT w.key, w.pool, w.rate_limit, w.period_s,
           array(SELECT s FROM unnest(w.starts) AS s
                 WHERE s > n.now - make_interval(secs => w.period_s) ORDER BY s) AS live
    FROM {schema}.rate_window w, n
)
SELECT w.key, w.pool, w.rate_limit, w.period_s, cardinality(w.live) AS in_window,
       (SELECT count(*) FROM {schema}.job_run j, n
        WHERE j.status = 'pending' AND j.pool = w.pool AND j.rate_key = w.key
          AND j.run_at <= n.now) AS runnable,
       CASE WHEN cardinality(w.live) >= w.rate_limit
            THEN w.live[cardinality(w.live) - w.rate_limit + 1]
                 + make_interval(secs => w.period_s) END AS next_start_at
FROM w
ORDER BY w.key
LIMIT %(limit)s

-- name: rate_window_prune
-- Windows whose every start has left (nothing to remember): the keyed claim makes a key's row
-- again at its next start.
DELETE FROM {schema}.rate_window w
WHERE w.updated_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => w.period_s)
