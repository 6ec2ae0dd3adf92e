"""Migrations: applying, re-applying, the ledger, and the schema checks workers run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq import SchemaError
from notifyq._db import migrate as migrations
from notifyq._db.queries import Queries

pytestmark = pytest.mark.anyio

AConn = psycopg.AsyncConnection[dict[str, Any]]


async def _connect(dsn: str) -> AConn:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row)


@pytest.fixture
async def empty(empty_dsn: str) -> AsyncIterator[AConn]:
    async with await _connect(empty_dsn) as conn:
        yield conn


@pytest.fixture
async def migrated(dsn: str) -> AsyncIterator[AConn]:
    async with await _connect(dsn) as conn:
        yield conn


async def _tables(conn: AConn, schema: str = "notifyq") -> set[str]:
    cur = await conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    return {r["tablename"] for r in await cur.fetchall()}


async def test_state_reports_every_migration_pending_on_an_empty_database(empty: AConn) -> None:
    state = await migrations.state(empty, "notifyq")
    assert state.applied == []
    assert [m.version for m in state.pending] == [m.version for m in migrations.available()]
    assert state.pending[0].name == "core"
    assert not state.current


async def test_migrate_applies_everything_then_is_a_no_op(empty: AConn) -> None:
    applied = await migrations.migrate(empty, "notifyq")
    shipped = migrations.available()
    assert [m.version for m in applied] == [m.version for m in shipped]
    # Numbered in order, each once; branches built in parallel may leave gaps between them.
    versions = [m.version for m in shipped]
    assert versions == sorted(set(versions))
    assert versions[0] == 1
    assert {"job", "job_run", "job_step", "job_signal", "leader", "periodic_tick",
            "schema_migration"} <= await _tables(empty)
    assert await migrations.migrate(empty, "notifyq") == []
    cur = await empty.execute("SELECT version, name, checksum FROM notifyq.schema_migration")
    rows = await cur.fetchall()
    assert rows == [{"version": m.version, "name": m.name, "checksum": m.checksum}
                    for m in shipped]
    assert (await migrations.state(empty, "notifyq")).current
    await migrations.require_current(empty, "notifyq")


async def test_migrate_into_another_schema_keeps_functions_there(empty: AConn) -> None:
    await migrations.migrate(empty, "tenant_b")
    assert "job_run" in await _tables(empty, "tenant_b")
    assert await _tables(empty, "notifyq") == set()
    cur = await empty.execute("SELECT tenant_b.enqueue('t.a', '{}') AS id")
    assert (await cur.fetchone()) is not None
    cur = await empty.execute("SELECT count(*) AS n FROM tenant_b.job_run")
    assert await cur.fetchone() == {"n": 1}


async def test_require_current_on_an_empty_database_says_to_run_migrate(empty: AConn) -> None:
    with pytest.raises(SchemaError, match=r"not migrated \(missing 0001_core, .*\): run "
                                          r"`notifyq migrate`"):
        await migrations.require_current(empty, "notifyq")


async def test_a_ledger_row_from_a_newer_notifyq_is_refused(migrated: AConn) -> None:
    await migrated.execute("INSERT INTO notifyq.schema_migration (version, name, checksum) "
                           "VALUES (9999, 'future', 'x')")
    state = await migrations.state(migrated, "notifyq")
    assert state.unknown == [9999]
    with pytest.raises(SchemaError, match="newer notifyq"):
        await migrations.require_current(migrated, "notifyq")
    with pytest.raises(SchemaError, match="newer"):
        await migrations.migrate(migrated, "notifyq")


async def test_migration_queries_lock_record_and_list(migrated: AConn, q: Queries) -> None:
    advisory = ("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = "
                "pg_backend_pid()")
    async with migrated.transaction():
        await migrated.execute(q.migration_lock, {"schema_name": "notifyq"})
        cur = await migrated.execute(advisory)
        assert await cur.fetchone() == {"n": 1}
        await migrated.execute(q.migration_schema_create)
        await migrated.execute(q.migration_ledger_create)
        cur = await migrated.execute(q.migration_ledger_exists, {"schema_name": "notifyq"})
        assert await cur.fetchone() == {"exists": True}
        await migrated.execute(q.migration_search_path_set, {"schema_name": "notifyq"})
        cur = await migrated.execute("SHOW search_path")
        assert await cur.fetchone() == {"search_path": "notifyq, public"}
        await migrated.execute(q.migration_record, {"version": 9999, "name": "x",
                                                    "checksum": "c"})
    cur = await migrated.execute(q.migration_applied_list)
    shipped = [m.version for m in migrations.available()]
    assert [r["version"] for r in await cur.fetchall()] == [*shipped, 9999]
    cur = await migrated.execute(advisory)  # released with the transaction
    assert await cur.fetchone() == {"n": 0}


async def test_migration_ledger_exists_is_false_before_migrating(empty: AConn,
                                                                 q: Queries) -> None:
    cur = await empty.execute(q.migration_ledger_exists, {"schema_name": "notifyq"})
    assert await cur.fetchone() == {"exists": False}
