"""A test app for process and fault-injection tests (``tests.apps.faults:app``).

Besides the ledger handlers it has:

* ``faults.record``: the ledger insert through a small per-process connection pool (fast enough
  for thousands of runs). A run re-executed after its worker died *between* the ledger insert
  and the write-back commit (at-least-once execution) finds its ledger row taken; it records
  the replay in ``ledger_replay`` and succeeds, so the run can still complete. The ledger then
  still holds exactly one row per run; replays are reported by the tests.
* ``faults.slow``: sleeps ``input.seconds``, then records the same way.
* ``faults.poison``: kills its worker process (``os._exit(1)``).
* ``faults.hang`` / ``faults.hang_sync``: never return (timeout 0.5 s, 2 attempts).
* ``faults.rated``: records like ``faults.record``, at most 5 starts per 0.5 s cluster-wide;
  ``faults.rated_by_account``: the same limit per ``input.account``.

``FAULTS_DDL`` creates the ledger, the replay table and ``completion_log``, filled by a trigger
on every transition of a run to ``completed``: at-most-once completion is
``count(*) = count(DISTINCT run_id)`` there, checked in SQL rather than trusted from notifyq.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from notifyq import App, JobContext, RateLimit, RetryPolicy
from tests.apps import ledger
from tests.apps.ledger import LEDGER_DDL

app = App()
app.handler("ledger.write")(ledger.write)
app.handler("ledger.slow")(ledger.slow)

FAULTS_DDL = LEDGER_DDL + """;
CREATE TABLE IF NOT EXISTS ledger_replay (
    run_id uuid NOT NULL,
    attempt integer NOT NULL,
    worker_pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS completion_log (
    run_id uuid NOT NULL,
    fence bigint NOT NULL,
    attempts integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION public.log_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.completion_log (run_id, fence, attempts)
    VALUES (NEW.id, NEW.fence, NEW.attempts);
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS job_run_completion ON notifyq.job_run;
CREATE TRIGGER job_run_completion AFTER UPDATE OF status ON notifyq.job_run FOR EACH ROW
    WHEN (NEW.status = 'completed' AND OLD.status IS DISTINCT FROM 'completed')
    EXECUTE FUNCTION public.log_completion();
"""

_pool: AsyncConnectionPool[Any] | None = None
_pool_lock: anyio.Lock | None = None


async def _ledger_pool() -> AsyncConnectionPool[Any]:
    global _pool, _pool_lock  # noqa: PLW0603 - one pool per worker process
    if _pool_lock is None:
        _pool_lock = anyio.Lock()
    async with _pool_lock:
        if _pool is None:
            # FAULTS_LEDGER_DSN: the ledger straight to PostgreSQL when notifyq goes through a
            # pool under test (tests/chaos/test_pgbouncer_restart.py).
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                os.environ.get("FAULTS_LEDGER_DSN") or os.environ["NOTIFYQ_DATABASE_URL"],
                min_size=1,
                max_size=int(os.environ.get("FAULTS_LEDGER_POOL", "3")),
                kwargs={"autocommit": True, "application_name": "notifyq-test-ledger"},
                open=False, timeout=30.0)
            await pool.open()
            _pool = pool
    return _pool


# A connection killed under the handler fails the attempt; it is retried soon.
_QUICK_RETRY = RetryPolicy(attempts=25, backoff="fixed", base_s=0.2)


@app.handler("faults.record", retry=_QUICK_RETRY)
async def record(ctx: JobContext) -> dict[str, int]:
    pool = await _ledger_pool()
    async with pool.connection() as conn:
        try:
            await conn.execute("INSERT INTO ledger (run_id, worker_pid) VALUES (%s, %s)",
                               (ctx.run.id, os.getpid()))
        except psycopg.errors.UniqueViolation:
            await conn.execute(
                "INSERT INTO ledger_replay (run_id, attempt, worker_pid) VALUES (%s, %s, %s)",
                (ctx.run.id, ctx.run.attempt, os.getpid()))
    return {"pid": os.getpid()}


@app.handler("faults.slow", retry=_QUICK_RETRY)
async def slow(ctx: JobContext) -> dict[str, int]:
    """Sleeps ``input.seconds`` (default 3), then records like ``faults.record``."""
    await anyio.sleep(float(ctx.input.get("seconds", 3)))
    return await record(ctx)


@app.handler("faults.poison")
async def poison(ctx: JobContext) -> None:
    os._exit(1)


_HANG = RetryPolicy(attempts=2, backoff="fixed", base_s=0.1)


@app.handler("faults.hang", timeout_s=0.5, retry=_HANG)
async def hang(ctx: JobContext) -> None:
    await anyio.sleep_forever()


@app.handler("faults.hang_sync", timeout_s=0.5, retry=_HANG)
def hang_sync(ctx: JobContext) -> None:
    threading.Event().wait()


@app.handler("faults.rated", retry=_QUICK_RETRY, rate_limit=RateLimit(limit=5, period_s=0.5))
async def rated(ctx: JobContext) -> dict[str, int]:
    return await record(ctx)


@app.handler("faults.rated_by_account", retry=_QUICK_RETRY,
             rate_limit=RateLimit(limit=5, period_s=0.5, key="account:{account}"))
async def rated_by_account(ctx: JobContext) -> dict[str, int]:
    return await record(ctx)
