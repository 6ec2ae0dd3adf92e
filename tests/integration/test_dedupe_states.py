"""Dedupe states (issue 11, item 11): a dedupe key matches live runs and completed ones within the
window, not failed or canceled ones, unless the policy's ``states`` says otherwise; the states are
stored on the job definition and honoured by Python and SQL enqueuers alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifyq import App, DedupePolicy, JobContext, Permanent
from tests.integration.inproc import running, status_becomes
from tests.support import Workers, wait_until

pytestmark = pytest.mark.anyio

APP = "tests.apps.semantics:app"


def _status(sql: psycopg.Connection[Any], run_id: Any, status: str, workers: Workers) -> None:
    def check() -> None:
        row = sql.execute("SELECT status FROM notifyq.job_run WHERE id = %s",
                          (run_id,)).fetchone()
        assert row == (status,), (row, workers.logs())
    wait_until(check, timeout=30)


@pytest.mark.timeout(90)
async def test_a_failed_run_does_not_block_enqueueing_its_dedupe_key_again(
        app: App, dsn: str, logs: Path) -> None:
    @app.handler("invoice.charge", dedupe=DedupePolicy(key="invoice:{invoice}", window_s=3600))
    async def charge(ctx: JobContext) -> None: ...  # run by the worker process below

    with Workers(dsn, logs, app=APP) as workers, psycopg.connect(dsn, autocommit=True) as sql:
        workers.start()
        declined = await app.enqueue("invoice.charge", {"invoice": 7, "fail": True})
        _status(sql, declined.id, "failed", workers)
        retried = await app.enqueue("invoice.charge", {"invoice": 7})
        assert retried.id != declined.id  # a failed run does not match
        _status(sql, retried.id, "completed", workers)
        again = await app.enqueue("invoice.charge", {"invoice": 7})
        assert again.id == retried.id  # a completed one within the window does
        # Plain SQL applies the stored policy (template and states) the same way.
        row = sql.execute("SELECT notifyq.enqueue('invoice.charge', '{\"invoice\": 7}')"
                          ).fetchone()
        assert row == (retried.id,)
        row = sql.execute("SELECT notifyq.enqueue('invoice.charge', "
                          "'{\"invoice\": 8, \"fail\": true}')").fetchone()
        assert row is not None
        _status(sql, row[0], "failed", workers)
        fresh = sql.execute("SELECT notifyq.enqueue('invoice.charge', '{\"invoice\": 8}')"
                            ).fetchone()
        assert fresh is not None
        assert fresh[0] != row[0]
        assert workers.stop_all() == [0]


async def test_a_policy_listing_failed_keeps_matching_failed_runs(app: App) -> None:
    @app.handler("import.file", dedupe=DedupePolicy(
        key="import:{file}", states=("pending", "running", "completed", "failed")))
    async def import_file(ctx: JobContext) -> None:
        raise Permanent(ValueError("corrupt file"))

    async with running(app):
        first = await app.enqueue("import.file", {"file": "a.csv"})
        await status_becomes(app, first.id, "failed")
        again = await app.enqueue("import.file", {"file": "a.csv"})
    assert again.id == first.id
    assert again.status == "failed"


def test_dedupe_policy_states_must_be_run_statuses() -> None:
    with pytest.raises(ValueError, match="dedupe states must be a non-empty list"):
        DedupePolicy(key="k", states=("pending", "lost"))
    with pytest.raises(ValueError, match="dedupe states"):
        DedupePolicy(key="k", states=())
    assert DedupePolicy(key="k", states=["failed"]).states == ("failed",)
    assert DedupePolicy(key="k").states == ("pending", "running", "waiting", "completed")
