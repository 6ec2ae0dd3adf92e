"""Unknown job types (issue 11, item 5): once a worker has registered its handlers, an enqueue of
a type no worker has registered is refused on every surface — Python, HTTP, SQL, the CLI — with
an explicit opt-out; and runs enqueued before their worker started take its definition's
defaults when it does (checked with a real worker process)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from notifyq import App, UnknownJobType
from tests.conftest import fast_settings
from tests.integration.inproc import fetch, scalar
from tests.integration.serving import Served
from tests.integration.test_cli import fails, ok
from tests.support import Workers, wait_until

pytestmark = pytest.mark.anyio

APP = "tests.apps.semantics:app"
REGISTERED = "INSERT INTO notifyq.job (type) VALUES ('mail.send')"
"""What a worker's start leaves behind for a handler of mail.send (its definition)."""


async def _runs(app: App) -> int:
    return int(await scalar(app, "SELECT count(*) FROM notifyq.job_run"))


async def test_python_enqueues_of_an_unknown_type_are_refused_once_a_worker_registered_types(
        app: App, dsn: str) -> None:
    await app.enqueue("mail.sned", {})  # no worker has ever started: accepted as before
    await fetch(app, REGISTERED + " RETURNING type")
    with pytest.raises(UnknownJobType, match=r"unknown job type 'mail\.sned'.*registered: "
                                             r"mail\.send"):
        await app.enqueue("mail.sned", {})
    with pytest.raises(UnknownJobType):
        await app.enqueue("mail.sned", {}, dedupe_key="k")  # the SQL function's path
    with pytest.raises(UnknownJobType):
        await app.enqueue_many([{"job_type": "mail.send"}, {"job_type": "mail.sned"}])
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(UnknownJobType):
            await app.enqueue("mail.sned", {}, conn=conn)
    with pytest.raises(UnknownJobType):
        app.enqueue_sync("mail.sned", {})
    assert await _runs(app) == 1  # nothing was written
    await app.enqueue("mail.send", {})
    await app.enqueue_many([{"job_type": "mail.send"}] * 2)
    app.enqueue_sync("mail.send", {})
    assert await _runs(app) == 5


async def test_the_opt_out_per_call_by_setting_or_by_a_handler_of_this_app(
        app: App, dsn: str) -> None:
    await fetch(app, REGISTERED + " RETURNING type")
    await app.enqueue("later.type", {}, allow_unknown_type=True)
    await app.enqueue_many([{"job_type": "later.type"}], allow_unknown_type=True)
    app.enqueue_sync("later.type", {}, allow_unknown_type=True)
    async with App(settings=fast_settings(dsn, enqueue={"allow_unknown_types": True})) as lax:
        await lax.enqueue("later.type", {})
        with pytest.raises(UnknownJobType):
            await lax.enqueue("later.type", {}, allow_unknown_type=False)

    @app.handler("mine.type")  # its worker will register it: a known type here
    async def mine(ctx: object) -> None: ...
    await app.enqueue("mine.type", {})
    await app.enqueue_many([{"job_type": "mine.type"}, {"job_type": "mail.send"}])
    with pytest.raises(UnknownJobType):  # only the types this app handles
        await app.enqueue_many([{"job_type": "mine.type"}, {"job_type": "other.type"}])
    assert await _runs(app) == 7


def test_http_enqueues_of_an_unknown_type_are_422_problems(dsn: str, logs: Path) -> None:
    with Served(dsn, logs / "serve.log", args=["--no-worker"]) as served, \
            served.client() as http, psycopg.connect(dsn, autocommit=True) as sql:
        sql.execute(REGISTERED)
        one = http.post("/v1/jobs", json={"job_type": "mail.sned"})
        assert one.status_code == 422, one.text
        assert one.headers["content-type"] == "application/problem+json"
        problem = one.json()
        assert problem["field"] == "job_type"
        assert "unknown job type 'mail.sned'" in problem["detail"]
        batch = http.post("/v1/jobs/batch", json={"jobs": [{"job_type": "mail.send"},
                                                           {"job_type": "mail.sned"}]})
        assert batch.status_code == 422, batch.text
        assert batch.json()["field"] == "job_type"
        assert sql.execute("SELECT count(*) FROM notifyq.job_run").fetchone() == (0,)
        allowed = http.post("/v1/jobs?allow_unknown_type=true", json={"job_type": "mail.sned"})
        assert allowed.status_code == 201, allowed.text
        allowed = http.post("/v1/jobs/batch?allow_unknown_type=true",
                            json={"jobs": [{"job_type": "mail.sned"}]})
        assert allowed.status_code == 201, allowed.text
        assert sql.execute("SELECT count(*) FROM notifyq.job_run").fetchone() == (2,)


def test_the_cli_refuses_an_unknown_type_in_one_line_and_sql_raises_its_own_sqlstate(
        dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as sql:
        sql.execute(REGISTERED)
        line = fails(dsn, "enqueue", "no.such.type")
        assert line.startswith("notifyq: error: unknown job type 'no.such.type': no worker has "
                               "registered a handler for it (registered: mail.send)")
        assert sql.execute("SELECT count(*) FROM notifyq.job_run").fetchone() == (0,)
        ok(dsn, "enqueue", "no.such.type", "--allow-unknown-type")
        ok(dsn, "enqueue", "mail.send")
        with pytest.raises(psycopg.Error) as caught:
            sql.execute("SELECT notifyq.enqueue('no.such.type', '{}')")
        assert caught.value.sqlstate == "NQ422"
        sql.execute("SELECT notifyq.enqueue('no.such.type', '{}', allow_unknown_type => true)")
        assert sql.execute("SELECT count(*) FROM notifyq.job_run").fetchone() == (3,)


@pytest.mark.timeout(90)
def test_runs_enqueued_before_the_first_worker_take_its_handlers_defaults(
        dsn: str, logs: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as sql:
        flaky = ok(dsn, "enqueue", "flaky.always").strip()  # before any worker: accepted
        (report,) = sql.execute("SELECT notifyq.enqueue('report.build', '{}', "
                                "run_at => now() + interval '1 hour')").fetchone() or ()
        assert sql.execute("SELECT max_attempts, timeout_s FROM notifyq.job_run WHERE id = %s",
                           (flaky,)).fetchone() == (25, None)
        with Workers(dsn, logs, app=APP, concurrency=2) as workers:
            workers.start()

            def dead_lettered() -> tuple[object, ...]:
                row = sql.execute("SELECT status, attempts, max_attempts, timeout_s FROM "
                                  "notifyq.job_run WHERE id = %s", (flaky,)).fetchone()
                assert row is not None
                assert row[0] == "failed", (row, workers.logs())
                return tuple(row)
            # RetryPolicy(attempts=2): dead-lettered after 2 attempts, not retried 25 times.
            assert wait_until(dead_lettered, timeout=30) == ("failed", 2, 2, 20.0)
            assert sql.execute("SELECT max_attempts, timeout_s, defaulted FROM notifyq.job_run "
                               "WHERE id = %s", (report,)).fetchone() == (3, 45.0, None)
            assert workers.stop_all() == [0]
