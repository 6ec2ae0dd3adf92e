"""Bulk enqueue by COPY (notifyq/_enqueue/copy.py): a batch of at least ``COPY_MIN_RUNS`` plain
runs is streamed into job_run instead of inserted from a jsonb array. It must write exactly what
the INSERT writes, refuse what the INSERT refuses, write nothing when it refuses, and wake the
workers like every other enqueue."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import psycopg
import pytest

from notifyq import App, InvalidEnqueue, JobContext, PayloadTooLarge, RetryPolicy, UnknownJobType
from notifyq._enqueue.copy import CHUNK_RUNS, COPY_MIN_RUNS
from tests.integration.inproc import fetch, running, scalar
from tests.support import eventually

pytestmark = pytest.mark.anyio

LATER = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=ZoneInfo("Asia/Kolkata"))
ODD_TEXT = 'tab\there, new\nline, cr\r, back\\slash, \\N, \\., "quoted", {braces}, NULL, é, 🦆'
COMPARED = ("job_type", "job_version", "status", "input", "pool", "priority", "max_attempts",
            "timeout_s", "tags", "scope_entity_type", "scope_entity_id", "tenant_id",
            "defaulted", "trace_context", "rate_key", "attempts", "trigger_source")


class _Statements(psycopg.AsyncCursor[Any]):
    """Records what a connection sends: executed statements and COPYs."""

    sent: list[str] = []  # noqa: RUF012 - reset by each test

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        type(self).sent.append(query if isinstance(query, str) else query.as_string(self))
        return await super().execute(query, params, **kwargs)

    def copy(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        type(self).sent.append(statement if isinstance(statement, str)
                               else statement.as_string(self))
        return super().copy(statement, *args, **kwargs)


def _varied(n: int) -> list[dict[str, Any]]:
    """Plain runs of every shape a batch can hold: a type with a stored definition, one with a
    handler in this app, one no worker has registered; given pools, priorities, run_at, tags,
    tenants and scopes, and text that COPY must escape."""
    items: list[dict[str, Any]] = []
    for i in range(n):
        item: dict[str, Any] = {"job_type": ("t.stored", "t.handler", "t.unknown")[i % 3],
                                "input": {"i": i, "text": ODD_TEXT} if i % 5 == 0 else [i]}
        if i % 4 == 1:
            item.update(pool="fast", priority=i % 7 - 3, max_attempts=2)
        if i % 6 == 2:
            item.update(run_at=LATER, tags=["a", ODD_TEXT, "b,c"] if i % 12 == 2 else [])
        if i % 10 == 3:
            item.update(tenant_id=f"acme\t{i}", scope_entity_type="order",
                        scope_entity_id=ODD_TEXT)
        items.append(item)
    return items


def _define(app: App) -> None:
    @app.handler("t.handler", retry=RetryPolicy(attempts=3), pool="mail", priority=-7)
    async def handler(ctx: JobContext) -> None: ...


async def _store_definition(app: App) -> None:
    await fetch(app, "INSERT INTO notifyq.job (type, version, pool, priority_default, "
                     "max_attempts, timeout_s, scope_entity_type) VALUES "
                     "('t.stored', 4, 'slow', 3, 7, 12.5, 'invoice') RETURNING type")


async def _rows(app: App, ids: list[Any]) -> list[dict[str, Any]]:
    rows = await fetch(app, "SELECT * FROM notifyq.job_run WHERE id = ANY (%s)", ids)
    by_id = {r["id"]: r for r in rows}
    return [by_id[i] for i in ids]


async def test_a_large_batch_is_copied_and_writes_what_the_insert_writes(
        app: App, dsn: str) -> None:
    _define(app)
    await _store_definition(app)
    items = _varied(3 * COPY_MIN_RUNS)
    _Statements.sent = []
    async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, cursor_factory=_Statements) as conn:
        copied = await app.enqueue_many(items, conn=conn, allow_unknown_type=True)
        assert any(s.startswith("COPY") for s in _Statements.sent)
        assert not any("INSERT" in s for s in _Statements.sent)
        _Statements.sent = []
        inserted: list[Any] = []
        for start in range(0, len(items), COPY_MIN_RUNS - 1):  # too few to copy
            inserted += await app.enqueue_many(items[start:start + COPY_MIN_RUNS - 1],
                                               conn=conn, allow_unknown_type=True)
        assert not any(s.startswith("COPY") for s in _Statements.sent)

    by_copy, by_insert = await _rows(app, [r.id for r in copied]), await _rows(
        app, [r.id for r in inserted])
    for item, c, i in zip(items, by_copy, by_insert, strict=True):
        assert {k: c[k] for k in COMPARED} == {k: i[k] for k in COMPARED}, item
        assert c["run_at"] == (LATER if "run_at" in item else c["created_at"])
    # The values, not only their agreement:
    assert by_copy[0]["input"] == {"i": 0, "text": ODD_TEXT}
    assert (by_copy[0]["pool"], by_copy[0]["priority"], by_copy[0]["max_attempts"],
            by_copy[0]["timeout_s"], by_copy[0]["job_version"],
            by_copy[0]["scope_entity_type"]) == ("slow", 3, 7, 12.5, 4, "invoice")
    assert (by_copy[1]["pool"], by_copy[1]["priority"]) == ("fast", -2)
    assert (by_copy[4]["pool"], by_copy[4]["priority"], by_copy[4]["max_attempts"]) == (
        "mail", -7, 3)
    assert (by_copy[0]["defaulted"], by_copy[1]["defaulted"], by_copy[2]["defaulted"]) == (
        None, 0, 7)  # a stored definition; an unstored handler's, given; nothing given
    assert by_copy[2]["tags"] == ["a", ODD_TEXT, "b,c"]
    assert (by_copy[3]["tenant_id"], by_copy[3]["scope_entity_id"],
            by_copy[3]["scope_entity_type"]) == ("acme\t3", ODD_TEXT, "order")
    # What enqueue_many returned is what the database holds (updated_at aside, as for the INSERT).
    stored = [await app.get_run(r.id) for r in copied]
    assert copied == [dataclasses.replace(s, updated_at=None) for s in stored]


async def test_a_copied_batch_keeps_the_order_given_and_is_one_transaction(app: App) -> None:
    await fetch(app, "INSERT INTO notifyq.job (type, version) VALUES ('t.echo', 0) "
                     "RETURNING type")
    n = COPY_MIN_RUNS + 2 * CHUNK_RUNS + 7  # a short last chunk
    runs = await app.enqueue_many([{"job_type": "t.echo", "input": {"i": i}} for i in range(n)])
    rows = await fetch(app, "SELECT input, run_at, created_at, updated_at, job_version "
                            "FROM notifyq.job_run ORDER BY id")
    assert [r["input"]["i"] for r in rows] == list(range(n))
    assert [r.input["i"] for r in runs] == list(range(n))
    assert sorted(r.id for r in runs) == [r.id for r in runs]
    # One transaction's now(): the definitions' read, the rows and their defaults.
    assert {(r["run_at"], r["created_at"], r["updated_at"]) for r in rows} == {
        (runs[0].created_at,) * 3}
    assert {r["job_version"] for r in rows} == {0}  # as stored, not coalesced away


async def test_a_callers_pipeline_gets_the_insert(app: App, dsn: str) -> None:
    _Statements.sent = []
    async with await psycopg.AsyncConnection.connect(
            dsn, cursor_factory=_Statements) as conn, conn.pipeline():
        runs = await app.enqueue_many([{"job_type": "t.echo", "input": {"i": i}}
                                       for i in range(COPY_MIN_RUNS)], conn=conn,
                                      allow_unknown_type=True)
    assert not any(s.startswith("COPY") for s in _Statements.sent)
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == len(runs)


async def test_a_bad_request_late_in_a_copied_batch_writes_nothing(app: App, dsn: str) -> None:
    items: list[dict[str, Any]] = [{"job_type": "t.echo", "input": {"i": i}}
                                   for i in range(2 * COPY_MIN_RUNS)]
    late = len(items) - 50  # after two chunks went to the server
    items[late]["priority"] = "high"
    with pytest.raises(InvalidEnqueue, match="priority must be an integer"):
        await app.enqueue_many(items, allow_unknown_type=True)
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == 0
    # The connection the COPY was aborted on serves the next batch.
    del items[late]["priority"]
    assert len(await app.enqueue_many(items, allow_unknown_type=True)) == len(items)
    # In a caller's transaction: the batch is rolled back, the transaction goes on.
    items[late]["input"] = {"big": "x" * 70_000}
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await app.enqueue("t.echo", {"kept": True}, conn=conn, allow_unknown_type=True)
        with pytest.raises(PayloadTooLarge):
            await app.enqueue_many(items, conn=conn, allow_unknown_type=True)
        await app.enqueue("t.echo", {"kept": True}, conn=conn, allow_unknown_type=True)
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == len(items) + 2


async def test_a_large_batch_of_bad_job_types_is_refused_as_invalid_not_unknown(
        app: App) -> None:
    await fetch(app, "INSERT INTO notifyq.job (type) VALUES ('mail.send') RETURNING type")
    for bad in (None, ["a"], "Not OK"):
        with pytest.raises(InvalidEnqueue, match="invalid job type"):
            await app.enqueue_many([{"job_type": "mail.send"}] * COPY_MIN_RUNS
                                   + [{"job_type": bad}])
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == 0


async def test_a_copied_batch_refuses_an_input_jsonb_prints_too_large(app: App) -> None:
    items: list[dict[str, Any]] = [{"job_type": "t.echo", "input": {"i": i}}
                                   for i in range(COPY_MIN_RUNS)]
    items[-20]["input"] = {"n": [1e300] * 250}  # 1.5 KB as Python prints it, 75 KB as jsonb
    with pytest.raises(PayloadTooLarge, match="the limit is 65536 bytes") as info:
        await app.enqueue_many(items, allow_unknown_type=True)
    assert 65_536 < info.value.size < 80_000
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == 0
    items[-20]["input"] = {"n": [1e300] * 200}  # 60 KB: fits
    runs = await app.enqueue_many(items, allow_unknown_type=True)
    assert await scalar(app, "SELECT octet_length(input::text) FROM notifyq.job_run "
                             "WHERE id = %s", runs[-20].id) <= 65_536


async def test_a_copied_batch_of_a_type_no_worker_registered_is_refused(app: App) -> None:
    await fetch(app, "INSERT INTO notifyq.job (type) VALUES ('mail.send') RETURNING type")
    items = [{"job_type": "mail.send"}] * COPY_MIN_RUNS + [{"job_type": "mail.sned"}]
    with pytest.raises(UnknownJobType, match=r"unknown job type 'mail\.sned'"):
        await app.enqueue_many(items)
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == 0
    await app.enqueue_many(items, allow_unknown_type=True)
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run WHERE defaulted = 7") == 1


async def test_a_type_with_templates_in_its_definition_is_inserted_instead(app: App) -> None:
    # Definitions of another process's handlers: a scope id and a rate key from the input.
    await fetch(app, "INSERT INTO notifyq.job (type, scope_entity_type, scope_id_template) "
                     "VALUES ('t.scoped', 'order', '{order}') RETURNING type")
    await fetch(app, "INSERT INTO notifyq.job (type, rate_limit, rate_period_s, "
                     "rate_key_template) VALUES ('t.rated', 10, 1, '{account}') RETURNING type")
    runs = await app.enqueue_many(
        [{"job_type": "t.scoped", "input": {"order": f"o{i}"}} for i in range(COPY_MIN_RUNS)]
        + [{"job_type": "t.rated", "input": {"account": "a"}}])
    rows = await _rows(app, [r.id for r in runs])
    assert [r["scope_entity_id"] for r in rows[:-1]] == [f"o{i}" for i in range(COPY_MIN_RUNS)]
    assert rows[-1]["rate_key"] is not None


async def test_a_copied_batch_wakes_its_pools_when_its_transaction_commits(
        app: App, dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN notifyq")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with conn.transaction():
                await app.enqueue_many([{"job_type": "t.echo", "pool": ("a", "b")[i % 2]}
                                        for i in range(COPY_MIN_RUNS)], conn=conn,
                                       allow_unknown_type=True)
                early = [n.payload async for n in listener.notifies(timeout=0.3)]
            got = [n.payload async for n in listener.notifies(timeout=5, stop_after=2)]
        assert early == []
        assert sorted(got) == ["j:a", "j:b"]
        # Outside a transaction of the caller's: after the COPY's own commit.
        await app.enqueue_many([{"job_type": "t.echo", "pool": "c"}] * COPY_MIN_RUNS,
                               allow_unknown_type=True)
        got = [n.payload async for n in listener.notifies(timeout=5, stop_after=1)]
        assert got == ["j:c"]
        # A batch refused midway wakes nobody: its wake-up is in its transaction.
        bad: list[dict[str, Any]] = [{"job_type": "t.echo", "pool": "d"}] * COPY_MIN_RUNS
        with pytest.raises(InvalidEnqueue):
            await app.enqueue_many([*bad, {"job_type": "t.echo", "priority": "x"}],
                                   allow_unknown_type=True)
        assert [n.payload async for n in listener.notifies(timeout=0.5)] == []


async def test_a_worker_runs_every_copied_run_once(app: App) -> None:
    seen: list[int] = []

    @app.handler("t.count")
    async def count(ctx: JobContext) -> None:
        seen.append(ctx.input["i"])

    await app.enqueue_many([{"job_type": "t.count", "input": {"i": i}} for i in range(700)])
    async with running(app, concurrency=10):
        async def drained() -> None:
            assert await scalar(app, "SELECT count(*) FROM notifyq.job_run "
                                     "WHERE status = 'completed' AND attempts = 1") == 700
        await eventually(drained, timeout=30)
    assert sorted(seen) == list(range(700))


async def test_a_copy_cancelled_midway_writes_nothing_and_the_next_batch_goes_through(
        app: App) -> None:
    items = [{"job_type": "t.echo", "input": {"i": i}} for i in range(50_000)]  # about 1 s
    with anyio.move_on_after(0.3) as scope:
        await app.enqueue_many(items, allow_unknown_type=True)
    assert scope.cancelled_caught
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == 0
    runs = await app.enqueue_many(items[:COPY_MIN_RUNS], allow_unknown_type=True)
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == len(runs)
