"""Enqueue end to end: transactions, sync and bulk enqueue, SQL enqueue, refusals at the edge."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import psycopg
import pytest

from notifyq import (
    App,
    EnqueueRequest,
    InvalidEnqueue,
    JobContext,
    PayloadTooLarge,
    RetryPolicy,
    RunStatus,
    Scope,
)
from tests.conftest import fast_settings
from tests.integration.inproc import fetch, run_row, running, scalar, status_becomes
from tests.support import eventually

pytestmark = pytest.mark.anyio

NO_POLL = {"poll_interval_s": 30.0}  # a run picked up within seconds was woken by NOTIFY


@pytest.fixture
async def slow_poll_app(dsn: str) -> AsyncIterator[App]:
    application = App(settings=fast_settings(dsn, worker=NO_POLL))
    async with application:
        yield application


def _record_inputs(app: App, job_type: str = "t.echo") -> list[Any]:
    seen: list[Any] = []

    @app.handler(job_type)
    async def echo(ctx: JobContext) -> Any:
        seen.append(ctx.input)
        return ctx.input

    return seen


async def _count(app: App, where: str = "true") -> int:
    return int(await scalar(app, f"SELECT count(*) FROM notifyq.job_run WHERE {where}"))


# -- transactional enqueue ------------------------------------------------------------------------

async def test_enqueue_with_conn_rolls_back_with_the_transaction(app: App, dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        run = await app.enqueue("t.echo", {"n": 1}, conn=conn)
        assert run.status is RunStatus.PENDING
        assert await _count(app) == 0  # not visible outside the transaction
        raise psycopg.Rollback  # the business transaction fails: leaves quietly
    assert await _count(app) == 0
    assert await scalar(app, "SELECT count(*) FROM pg_stat_activity WHERE state LIKE "
                             "'idle in transaction%%' AND datname = current_database()") == 0


async def test_enqueue_with_conn_is_invisible_until_commit(app: App, dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            run = await app.enqueue("t.echo", {"n": 1}, conn=conn)
            assert await _count(app) == 0
        assert await _count(app) == 1
    assert (await app.get_run(run.id)).input == {"n": 1}


async def test_enqueue_with_conn_runs_after_commit_woken_by_notify(slow_poll_app: App,
                                                                   dsn: str) -> None:
    app = slow_poll_app
    seen = _record_inputs(app)
    async with running(app):
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            await conn.execute("CREATE TABLE users (id int)")
            await conn.execute("INSERT INTO users VALUES (1)")
            run = await app.enqueue("t.echo", {"user": 1}, conn=conn)
        await status_becomes(app, run.id, "completed", within=5)
    assert seen == [{"user": 1}]


async def test_enqueue_sync_without_conn_commits_and_runs(slow_poll_app: App) -> None:
    app = slow_poll_app
    seen = _record_inputs(app)
    async with running(app):
        run = await anyio.to_thread.run_sync(lambda: app.enqueue_sync("t.echo", {"s": 1}))
        assert run.status is RunStatus.PENDING
        await status_becomes(app, run.id, "completed", within=5)
    assert seen == [{"s": 1}]


async def test_enqueue_sync_with_conn_follows_the_callers_transaction(app: App,
                                                                      dsn: str) -> None:
    def work() -> Any:
        with psycopg.connect(dsn) as conn:
            with conn.transaction():
                app.enqueue_sync("t.echo", {"kept": False}, conn=conn)
                raise psycopg.Rollback
            with conn.transaction():
                return app.enqueue_sync("t.echo", {"kept": True}, conn=conn)

    run = await anyio.to_thread.run_sync(work)
    rows = await fetch(app, "SELECT id, input FROM notifyq.job_run")
    assert rows == [{"id": run.id, "input": {"kept": True}}]


# -- bulk -----------------------------------------------------------------------------------------

class _CountingCursor(psycopg.AsyncCursor[Any]):
    statements: list[str] = []  # noqa: RUF012 - shared log for one test

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self)
        type(self).statements.append(text)
        return await super().execute(query, params, **kwargs)


async def test_a_lone_enqueue_many_sends_its_wake_up_in_its_own_transaction(
        app: App, dsn: str) -> None:
    """No other enqueue in flight: the batch's NOTIFY rides in its statement (one per pool,
    delivered with the commit), not in a second transaction on another connection."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        await app.enqueue("t.echo", {"first": True})
        await app.enqueue_many([{"job_type": "t.echo", "input": {"i": i}, "pool": pool}
                                for i, pool in enumerate(["a", "b", "a"])])
        got = [n.payload async for n in listener.notifies(timeout=2, stop_after=3)]
    assert sorted(got) == ["j:a", "j:b", "j:default"]
    waker = app._enqueuer._waker
    assert waker is not None
    assert waker.notifies_sent == 0


async def test_enqueue_many_inserts_in_one_statement_and_returns_runs_in_order(
        app: App, dsn: str) -> None:
    _CountingCursor.statements = []
    items = [{"job_type": "t.echo", "input": {"i": i}, "priority": i % 3} for i in range(50)]
    async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, cursor_factory=_CountingCursor) as conn:
        runs = await app.enqueue_many(items, conn=conn)
    inserts = [s for s in _CountingCursor.statements if "INSERT" in s]
    assert len(inserts) == 1
    assert [r.input for r in runs] == [{"i": i} for i in range(50)]
    assert [r.priority for r in runs] == [i % 3 for i in range(50)]
    assert await _count(app) == 50


async def test_enqueue_many_handles_dedupe_keys_mixed_in(app: App) -> None:
    existing = await app.enqueue("t.echo", {"old": True}, dedupe_key="k-existing")
    runs = await app.enqueue_many([
        {"job_type": "t.echo", "input": {"n": 0}},
        EnqueueRequest(job_type="t.echo", input={"n": 1}, dedupe_key="k1"),
        {"job_type": "t.echo", "input": {"n": 2}},
        {"job_type": "t.echo", "input": {"n": 3}, "dedupe_key": "k1"},
        {"job_type": "t.echo", "input": {"n": 4}, "dedupe_key": "k-existing"},
        {"job_type": "t.other", "input": {"n": 5}, "dedupe_key": "k1"},
    ])
    assert [r.input for r in runs] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 1}, {"old": True},
                                       {"n": 5}]
    assert runs[3].id == runs[1].id
    assert runs[4].id == existing.id
    assert len({r.id for r in runs}) == 5
    assert await _count(app) == 5


async def test_enqueue_many_runs_everything_and_an_empty_list_is_a_no_op(app: App) -> None:
    seen = _record_inputs(app)
    assert await app.enqueue_many([]) == []
    runs = await app.enqueue_many([{"job_type": "t.echo", "input": [i]} for i in range(20)])
    async with running(app, concurrency=4):
        async def done() -> None:
            assert await _count(app, "status = 'completed'") == 20
        await eventually(done)
    assert sorted(s[0] for s in seen) == list(range(20))
    assert (await app.get_run(runs[5].id)).output == [5]


async def test_enqueue_many_returns_the_runs_as_stored(app: App) -> None:
    # The bulk statement sends no row back: the runs are built from what it applied. They must
    # equal what the database holds (updated_at aside, which runs without keys never carried).
    @app.handler("t.handler", retry=RetryPolicy(attempts=3), pool="mail", priority=-7)
    async def handler(ctx: JobContext) -> None: ...

    @app.handler("t.scoped", scope=Scope("order", id_from="{order}"))
    async def scoped(ctx: JobContext) -> None: ...

    await fetch(app, "INSERT INTO notifyq.job (type, version, pool, priority_default, "
                     "max_attempts, timeout_s) VALUES ('t.stored', 4, 'slow', 3, 7, 12.5) "
                     "RETURNING type")
    later = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=ZoneInfo("Asia/Kolkata"))
    runs = await app.enqueue_many([
        {"job_type": "t.stored", "input": {"i": 0}},
        {"job_type": "t.stored", "input": {"i": 1}, "pool": "fast", "max_attempts": 2},
        {"job_type": "t.handler", "input": {"i": 2}},
        {"job_type": "t.handler", "input": [3], "priority": 9, "tags": ("a", "b")},
        {"job_type": "t.unknown", "input": {"i": 4}, "run_at": later, "tenant_id": "acme"},
        {"job_type": "t.scoped", "input": {"order": "o-5"}},
        {"job_type": "t.handler", "input": {"i": 6}, "dedupe_key": "d"},
        {"job_type": "t.unknown", "input": {"é": "ü"}, "scope_entity_type": "user",
         "scope_entity_id": "u-7"},
    ], allow_unknown_type=True)  # t.unknown: no definition, while t.stored has one
    stored = [await app.get_run(r.id) for r in runs]
    assert runs == [s if s.dedupe_key else dataclasses.replace(s, updated_at=None)
                    for s in stored]
    assert [r.input for r in runs] == [{"i": 0}, {"i": 1}, {"i": 2}, [3], {"i": 4},
                                       {"order": "o-5"}, {"i": 6}, {"é": "ü"}]
    assert (runs[0].pool, runs[0].priority, runs[0].max_attempts, runs[0].timeout_s) == (
        "slow", 3, 7, 12.5)
    assert (runs[2].pool, runs[2].priority, runs[2].max_attempts) == ("mail", -7, 3)
    assert runs[4].run_at == later
    assert runs[4].run_at.tzinfo == runs[0].run_at.tzinfo  # as the database sends it
    assert runs[3].tags == ["a", "b"]
    assert runs[0].tags is not runs[1].tags


async def test_enqueue_many_refuses_an_input_the_database_measures_as_too_large(
        app: App) -> None:
    with pytest.raises(PayloadTooLarge, match="the limit is 65536 bytes") as info:
        await app.enqueue_many([{"job_type": "t.echo", "input": {"n": 1}},
                                {"job_type": "t.echo", "input": {"n": [1e300] * 250}},
                                {"job_type": "t.echo", "input": {"n": [1e300] * 300}}])
    assert 65_536 < info.value.size < 80_000  # the first one left out, in the order given
    assert await _count(app) == 0


async def test_enqueue_many_with_one_bad_item_writes_nothing(app: App) -> None:
    with pytest.raises(InvalidEnqueue, match="invalid job type"):
        await app.enqueue_many([{"job_type": "t.ok"}, {"job_type": "Not OK"}])
    with pytest.raises(InvalidEnqueue, match="item 0"):
        await app.enqueue_many([{"job_type": "t.ok", "inptu": {}}])
    assert await _count(app) == 0


# -- SQL enqueue ----------------------------------------------------------------------------------

async def test_sql_enqueue_wakes_a_running_worker_without_waiting_for_the_poll(
        slow_poll_app: App, dsn: str) -> None:
    app = slow_poll_app
    seen = _record_inputs(app)
    async with running(app):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT notifyq.enqueue('t.echo', '{\"from\": \"sql\"}')")
            row = await cur.fetchone()
        assert row is not None
        await status_becomes(app, row[0], "completed", within=5)
    assert seen == [{"from": "sql"}]


# -- refusals -------------------------------------------------------------------------------------

async def test_python_enqueue_refuses_bad_input_and_writes_nothing(app: App) -> None:
    with pytest.raises(PayloadTooLarge, match="65537 bytes serialized; the limit is 65536"):
        await app.enqueue("t.echo", {"x": "a" * (65_537 - 9)})
    with pytest.raises(InvalidEnqueue, match="must be a JSON object or array, got str"):
        await app.enqueue("t.echo", "not an object")
    with pytest.raises(InvalidEnqueue, match="not JSON-serializable"):
        await app.enqueue("t.echo", {"x": {1, 2}})
    with pytest.raises(InvalidEnqueue, match=r"invalid job type 'Email\.Send'"):
        await app.enqueue("Email.Send", {})
    with pytest.raises(InvalidEnqueue, match="priority 5000 is out of range"):
        await app.enqueue("t.echo", {}, priority=5000)
    with pytest.raises(InvalidEnqueue):
        await anyio.to_thread.run_sync(lambda: app.enqueue_sync("t.echo", [], max_attempts=0))
    assert await _count(app) == 0


async def test_input_the_database_measures_as_too_large_is_payload_too_large(app: App) -> None:
    # 1e300 is 6 characters in Python's JSON but 301 digits in jsonb's text form, so only the
    # SQL function sees this input is 75 KB: its refusal must still be PayloadTooLarge.
    with pytest.raises(PayloadTooLarge, match="the limit is 65536 bytes") as info:
        await app.enqueue("t.echo", {"n": [1e300] * 250})
    assert info.value.size > 65_536
    with pytest.raises(PayloadTooLarge):
        await anyio.to_thread.run_sync(
            lambda: app.enqueue_sync("t.echo", {"n": [1e300] * 250}))
    assert await _count(app) == 0


async def _enqueue_concurrently(app: App, inputs: list[Any]) -> list[Any]:
    """``app.enqueue`` of each input at once, in tasks: each result is a run or the error."""
    results: list[Any] = [None] * len(inputs)

    async def one(i: int) -> None:
        try:
            results[i] = await app.enqueue("t.echo", inputs[i])
        except Exception as exc:  # the test looks at it
            results[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(len(inputs)):
            tg.start_soon(one, i)
    return results


async def test_concurrent_enqueues_are_written_together_and_wake_the_workers(
        app: App, dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        runs = await _enqueue_concurrently(app, [{"i": i} for i in range(10)])
        got = [n.payload async for n in listener.notifies(timeout=2, stop_after=1)]
    assert set(got) == {"j:default"}
    assert app._enqueuer._group.batches < 10
    for i, run in enumerate(runs):
        row = await run_row(app, run.id)
        assert (run.input, run.status, row["input"]) == ({"i": i}, RunStatus.PENDING, {"i": i})
        assert (run.pool, run.priority, run.max_attempts, run.created_at, run.run_at) == (
            row["pool"], row["priority"], row["max_attempts"], row["created_at"], row["run_at"])
    assert await _count(app) == 10


async def test_a_bad_enqueue_among_concurrent_ones_fails_alone(app: App) -> None:
    inputs: list[Any] = [{"i": i} for i in range(6)]
    inputs[3] = {"n": [1e300] * 250}  # too large only as jsonb prints it: the group's
    results = await _enqueue_concurrently(app, inputs)  # statement refuses it, not Python
    assert isinstance(results[3], PayloadTooLarge)
    assert sorted(r.input["i"] for i, r in enumerate(results) if i != 3) == [0, 1, 2, 4, 5]
    assert await _count(app) == 5


async def _backend_of_last_insert(app: App) -> set[int]:
    rows = await fetch(app, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                            " AND pid <> pg_backend_pid()"
                            " AND query LIKE '%%INSERT INTO \"notifyq\".job_run %%'")
    return {r["pid"] for r in rows}


async def test_a_lone_enqueuer_writes_every_run_on_the_same_warm_connection(app: App) -> None:
    for i in range(6):
        await app.enqueue("t.echo", {"i": i})
        await app.enqueue_many([{"job_type": "t.echo", "input": {"i": i, "bulk": True}}])
    assert await _count(app) == 12
    # Each backend's last statement: one wrote, where the pool's turns would have left two.
    assert len(await _backend_of_last_insert(app)) == 1


async def test_concurrent_batches_share_the_warm_connection_with_the_pool(app: App,
                                                                          dsn: str) -> None:
    async def batch(k: int) -> None:
        await app.enqueue_many([{"job_type": "t.echo", "input": {"k": k, "i": i}}
                                for i in range(50)])

    async with anyio.create_task_group() as tg:
        for k in range(4):
            tg.start_soon(batch, k)
    assert await _count(app) == 200
    # Which backend each of those used is a race (a pooled one's last statement may be a later
    # wake-up); with the warm connection held, a batch must go to the pool, at once. Watched
    # from a connection of the test's own, so no pooled one's last statement is overwritten.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
        async def last_inserts() -> dict[int, Any]:
            cur = await watch.execute(
                "SELECT pid, query_start FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND query LIKE '%INSERT INTO \"notifyq\".job_run %'")
            return dict(await cur.fetchall())

        async with app._runtime.warm_connection() as held:
            before = await last_inserts()
            with anyio.fail_after(10):
                await batch(4)
            after = await last_inserts()
        assert after.get(held.info.backend_pid) == before.get(held.info.backend_pid)
        assert any(at != before.get(pid) for pid, at in after.items())
    assert await _count(app) == 250


async def test_an_enqueue_cancelled_mid_statement_leaves_the_next_one_working(
        app: App, dsn: str) -> None:
    await app.enqueue("t.echo", {"i": 0})  # opens the warm connection
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute("LOCK TABLE notifyq.job_run IN ACCESS EXCLUSIVE MODE")
        with anyio.move_on_after(0.5) as scope:
            await app.enqueue("t.echo", {"i": 1})  # waits on the lock until cancelled
        assert scope.cancelled_caught
        await locker.rollback()
    await app.enqueue("t.echo", {"i": 2})

    # The cancelled one's outcome is unknown to its caller, as for any cancelled write: its
    # backend waited on the lock, not on the socket, so it may still commit. Never twice.
    async def settled() -> list[int]:
        assert not await _backend_of_last_insert(app) - await _warm_backend(app)
        return sorted(r["input"]["i"] for r in await fetch(
            app, "SELECT input FROM notifyq.job_run"))
    assert (await eventually(settled)) in ([0, 2], [0, 1, 2])


async def _warm_backend(app: App) -> set[int]:
    rows = await fetch(app, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                            " AND state = 'idle' AND query LIKE '%%INSERT INTO%%'")
    return {r["pid"] for r in rows}


async def test_closing_the_app_closes_its_warm_connection(dsn: str) -> None:
    application = App(settings=fast_settings(dsn))
    async with application:
        await application.enqueue("t.echo", {"i": 0}, allow_unknown_type=True)
        [pid] = await _backend_of_last_insert(application)

    async def closed() -> None:  # the backend exits a moment after the client hangs up
        assert await scalar(application, "SELECT count(*) FROM pg_stat_activity"
                                         " WHERE pid = %s", pid) == 0
    await eventually(closed)


async def test_enqueue_returns_the_stored_run(app: App) -> None:
    run = await app.enqueue("t.echo", {"a": 1}, priority=-2, pool="p1", max_attempts=4,
                            tags=["x", "y"])
    row = await run_row(app, run.id)
    assert (row["priority"], row["pool"], row["max_attempts"], row["tags"]) == (
        -2, "p1", 4, ["x", "y"])
    assert run.created_at == row["created_at"]
    assert (await app.list_runs(tag="y"))[0].id == run.id


async def test_enqueue_request_says_whether_the_run_was_created_or_deduplicated(
        app: App) -> None:
    first, created = await app.enqueue_request(EnqueueRequest(
        job_type="t.echo", input={"a": 1}, dedupe_key="k"))
    again, created_again = await app.enqueue_request(EnqueueRequest(
        job_type="t.echo", input={"a": 2}, dedupe_key="k"))
    assert (created, created_again) == (True, False)
    assert again.id == first.id
    assert await _count(app) == 1
