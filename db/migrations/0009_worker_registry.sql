-- The worker registry: each worker process records itself while it runs, so operators (the
-- dashboard, GET /v1/workers, `notifyq workers`) see who is alive, which pools it serves, how
-- busy it is and when it last checked in. A row is written at start, renewed with every
-- heartbeat (expires_at: one lease ahead), deleted on a clean stop; the reaper removes the rows
-- of workers that died without saying so. Nothing on the hot path reads this table.
CREATE TABLE worker (
    id           text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
    host         text NOT NULL,
    pid          integer NOT NULL,
    version      text NOT NULL,
    pools        text[] NOT NULL,
    concurrency  integer NOT NULL CHECK (concurrency > 0),
    running      integer NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
