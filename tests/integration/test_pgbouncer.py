"""notifyq through a real PgBouncer in transaction pooling mode (issue 31, item 7), as
docs/deploying.md sets it up: ``database_url`` through the pool with
``database_transaction_pooling`` on, ``listen_database_url`` straight to PostgreSQL. Every
enqueue path, a worker, durable runs (steps, a durable sleep, a child, a signal), webhook
deliveries and concurrent migrations, with every outcome counted in SQL.

What broke before: psycopg prepares a statement on its 5th run on a connection and then sends
only its name, which PgBouncer 1.18 hands to whichever server session is free ("prepared
statement _pg3_0 does not exist"); and two ``migrate`` through the pool shared one session's
advisory lock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import App, JobContext
from notifyq._db import migrate as migrations
from tests.conftest import fast_settings
from tests.integration.inproc import running
from tests.integration.pgbouncer import PgBouncer
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.conftest import LOOPBACK, verify

pytestmark = pytest.mark.anyio

Sql = psycopg.Connection[Any]


@pytest.fixture(scope="module")
def bouncer(template_db: str) -> Iterator[PgBouncer]:
    from tests.conftest import dsn_for

    with PgBouncer(dsn_for("postgres")) as pool:
        yield pool


def _pooled_app(dsn: str, bouncer: PgBouncer, **overrides: Any) -> App:
    """An App as docs/deploying.md sets one up behind PgBouncer in transaction mode."""
    from tests import vault

    settings = fast_settings(
        bouncer.dsn(dsn), listen_database_url=dsn, database_transaction_pooling=True,
        keys=f"1:{vault.b64(vault.KEY1)}", active_key_version=1,
        webhooks={"allowed_networks": LOOPBACK, "retry_schedule_s": [0, 0.1, 0.1],
                  "timeout_s": 2.0, "connect_timeout_s": 1.0, "breaker_failures": 0},
        **overrides)
    app = App(settings=settings)

    @app.handler("pb.echo")
    async def echo(ctx: JobContext) -> Any:
        return ctx.input

    @app.handler("pb.durable")
    async def durable(ctx: JobContext) -> dict[str, Any]:
        steps = [await ctx.step(f"step-{i}", partial(_double, i)) for i in range(3)]
        await ctx.sleep(timedelta(milliseconds=200))
        child = await ctx.spawn_child("pb.echo", {"child_of": str(ctx.run.id)})
        echoed = await ctx.wait_for(child)
        signal = await ctx.wait_for_signal(f"go-{ctx.input['n']}")
        return {"steps": steps, "child": echoed, "signal": signal}

    return app


async def _double(i: int) -> int:
    return 2 * i


def _database(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


async def test_runs_enqueued_every_way_complete_through_pgbouncer_in_transaction_mode(
        dsn: str, sql: Sql, bouncer: PgBouncer) -> None:
    app = _pooled_app(dsn, bouncer)
    async with app, running(app, concurrency=10):
        singles = [await app.enqueue("pb.echo", {"i": i}) for i in range(60)]
        together = await _concurrently(app, 40)  # the group commit's bulk insert
        keyed = [await app.enqueue("pb.echo", {"k": i}, dedupe_key=f"k-{i}")
                 for i in range(20)]
        again = await app.enqueue("pb.echo", {"k": 0}, dedupe_key="k-0")
        bulk = await app.enqueue_many([{"job_type": "pb.echo", "input": {"b": i}}
                                       for i in range(50)])
        copied = await app.enqueue_many([{"job_type": "pb.echo", "input": {"c": i}}
                                         for i in range(400)])  # COPY from 300 on
        synced = await anyio.to_thread.run_sync(
            lambda: [app.enqueue_sync("pb.echo", {"s": i}) for i in range(20)])
        with psycopg.connect(bouncer.dsn(dsn), autocommit=True,
                             prepare_threshold=None) as conn:
            conn.execute("SELECT notifyq.enqueue('pb.echo', jsonb_build_object('q', i)) "
                         "FROM generate_series(1, 30) i")
        assert again.id == keyed[0].id
        with anyio.fail_after(30):
            outputs = [await run.result() for run in singles[:5] + copied[-5:]]
        assert outputs[0] == {"i": 0}
        assert outputs[-1] == {"c": 399}
        total = 60 + 40 + 20 + 50 + 400 + 20 + 30
        await eventually(lambda: _all_completed(sql, total), timeout=60)
    counts = sql.execute("SELECT count(*), count(*) FILTER (WHERE attempts = 1), "
                         "count(DISTINCT id) FROM notifyq.job_run").fetchone()
    assert counts == (total, total, total)  # every run once, at its first attempt
    assert len({r.id for r in (*together, *bulk, *synced)}) == 110
    assert bouncer.logins(_database(dsn)) >= 3  # the pool, the warm and completer connections
    assert "prepared statement" not in bouncer.log()


async def _concurrently(app: App, n: int) -> list[Any]:
    runs: list[Any] = []

    async def one(i: int) -> None:
        runs.append(await app.enqueue("pb.echo", {"t": i}))
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return runs


async def _all_completed(sql: Sql, total: int) -> None:
    rows = sql.execute("SELECT status, count(*) FROM notifyq.job_run GROUP BY 1").fetchall()
    assert dict(rows) == {"completed": total}


async def test_durable_runs_step_sleep_spawn_and_wait_for_signals_through_pgbouncer(
        dsn: str, sql: Sql, bouncer: PgBouncer) -> None:
    app = _pooled_app(dsn, bouncer)
    async with app, running(app, concurrency=10):
        runs = [await app.enqueue("pb.durable", {"n": n}) for n in range(10)]

        async def all_waiting_for_signals() -> None:
            row = sql.execute("SELECT count(*) FROM notifyq.job_run WHERE job_type = "
                              "'pb.durable' AND wait_kind = 'signal'").fetchone()
            assert row == (10,)
        await eventually(all_waiting_for_signals, timeout=30)
        for n in range(10):
            assert await app.signal(f"go-{n}", {"n": n}) == 1
        with anyio.fail_after(30):
            outputs = [await run.result() for run in runs]
    for n, output in enumerate(outputs):
        assert output == {"steps": [0, 2, 4], "child": {"child_of": str(runs[n].id)},
                          "signal": {"n": n}}
    steps = sql.execute("SELECT count(*), count(DISTINCT (run_id, step_id)) FROM "
                        "notifyq.job_step WHERE step_id LIKE 'step-%'").fetchone()
    assert steps == (30, 30)  # each step ran once: replays reused them
    assert sql.execute("SELECT status, count(*) FROM notifyq.job_run GROUP BY 1").fetchall() \
        == [("completed", 20)]


async def test_webhooks_are_sent_resent_and_recorded_through_pgbouncer(
        dsn: str, sql: Sql, bouncer: PgBouncer, receiver: Receiver) -> None:
    app = _pooled_app(dsn, bouncer)
    async with app:
        endpoint = await app.webhooks.create_endpoint(receiver.url("/hook"))
        sent = [await app.webhooks.send("order.paid", {"n": n}) for n in range(30)]
        async with running(app, concurrency=10):
            await eventually(lambda: _received(receiver, 30), timeout=30)
            await app.webhooks.resend(sent[0].id)
            await eventually(lambda: _received(receiver, 31), timeout=30)
            await eventually(lambda: _deliveries_done(sql), timeout=30)
    assert sorted(json.loads(r.body)["n"] for r in receiver.requests) == [0, *range(30)]
    for request in receiver.requests:
        verify(endpoint.secret, request)
    attempts = sql.execute("SELECT trigger, count(*) FROM notifyq.webhook_attempt "
                           "GROUP BY 1 ORDER BY 1").fetchall()
    assert attempts == [("manual", 1), ("scheduled", 30)]
    assert "prepared statement" not in bouncer.log()


async def _received(receiver: Receiver, n: int) -> None:
    assert len(receiver.requests) == n


async def _deliveries_done(sql: Sql) -> None:
    rows = sql.execute("SELECT status, count(*) FROM notifyq.webhook_delivery "
                       "GROUP BY 1").fetchall()
    assert rows == [("succeeded", 30)]


async def test_concurrent_migrations_through_pgbouncer_apply_each_file_once(
        empty_dsn: str) -> None:
    """Through a pool of one server session, two migrators' statements share it: a session
    advisory lock is granted to both (the same session holds it), and they applied the same
    files twice."""
    from tests.conftest import dsn_for

    with PgBouncer(dsn_for("postgres"), pool_size=1) as narrow:
        async def one() -> list[int]:
            async with await psycopg.AsyncConnection.connect(
                    narrow.dsn(empty_dsn), autocommit=True, prepare_threshold=None) as conn:
                return [m.version for m in await migrations.migrate(conn, "notifyq")]
        results: list[list[int]] = []

        async def run_one() -> None:
            results.append(await one())
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_one)
            tg.start_soon(run_one)
    shipped = [m.version for m in migrations.available()]
    assert sorted(results[0] + results[1]) == shipped  # each file by one of the two
    with psycopg.connect(empty_dsn, autocommit=True) as direct:
        ledger = direct.execute("SELECT version FROM notifyq.schema_migration "
                                "ORDER BY version").fetchall()
        locks = direct.execute("SELECT count(*) FROM pg_locks WHERE locktype = "
                               "'advisory'").fetchone()
    assert [v for (v,) in ledger] == shipped
    assert locks == (0,)


def test_transaction_pooling_without_a_direct_listener_must_poll() -> None:
    from pydantic import ValidationError

    from notifyq._settings import Settings, WorkerSettings

    with pytest.raises(ValidationError, match="set listen_database_url"):
        Settings(database_url="postgresql://x@127.0.0.1:6432/app",
                 database_transaction_pooling=True)
    polling = Settings(database_url="postgresql://x@127.0.0.1:6432/app",
                       database_transaction_pooling=True,
                       worker=WorkerSettings(listen=False))
    assert polling.listen_url is None  # nor do waiters LISTEN through the pool
    direct = Settings(database_url="postgresql://x@127.0.0.1:6432/app",
                      listen_database_url="postgresql://x@127.0.0.1:5432/app",
                      database_transaction_pooling=True)
    assert direct.listen_url == "postgresql://x@127.0.0.1:5432/app"
