"""Migrations: append-only SQL files in ``db/migrations/NNNN_name.sql``.

``migrate`` applies the missing ones in order, each file and its ledger row in one
transaction, with ``search_path`` set to the target schema. Running it again is a no-op.

Concurrent starts apply each file once: every transaction takes a transaction-scoped advisory
lock first and re-reads the ledger under it. A session lock held across the files (until
2026-12) broke through PgBouncer in transaction mode: the lock and its unlock ran on whichever
server sessions the pool gave, so two migrators could both hold it (the second statement landed
on the first's session) and an unlock could miss, leaving the lock on a pooled session.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import psycopg
from psycopg.rows import dict_row

from notifyq._db.files import sql_root
from notifyq._db.queries import queries_for
from notifyq._errors import SchemaError

AnyConn = psycopg.AsyncConnection[Any]

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MigrationState:
    applied: list[int]
    pending: list[Migration]
    unknown: list[int]
    """Versions recorded in the database that this notifyq does not ship (a newer notifyq
    migrated it)."""

    @property
    def current(self) -> bool:
        return not self.pending and not self.unknown


@cache
def available() -> tuple[Migration, ...]:
    found = []
    for entry in (sql_root() / "migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    return tuple(found)


async def state(conn: AnyConn, schema: str) -> MigrationState:
    q = queries_for(schema)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(q.migration_ledger_exists, {"schema_name": schema})
        row = await cur.fetchone()
        applied: list[int] = []
        if row and row["exists"]:
            await cur.execute(q.migration_applied_list)
            applied = [r["version"] for r in await cur.fetchall()]
    shipped = {m.version for m in available()}
    return MigrationState(
        applied=applied,
        pending=[m for m in available() if m.version not in applied],
        unknown=[v for v in applied if v not in shipped],
    )


async def migrate(conn: AnyConn, schema: str) -> list[Migration]:
    """Apply every pending migration; return those applied by this call."""
    q = queries_for(schema)
    await conn.set_autocommit(True)
    lock = {"schema_name": schema}
    async with conn.transaction():
        await conn.execute(q.migration_lock, lock)
        await conn.execute(q.migration_schema_create)
        await conn.execute(q.migration_ledger_create)
    current = await state(conn, schema)
    if current.unknown:
        raise SchemaError(_newer_message(schema, current.unknown))
    applied = []
    for migration in current.pending:
        async with conn.transaction():
            await conn.execute(q.migration_lock, lock)
            if migration.version in (await state(conn, schema)).applied:
                continue  # another migrator's, committed while this one waited for the lock
            await conn.execute(q.migration_search_path_set, lock)
            await conn.execute(migration.sql, prepare=False)
            await conn.execute(q.migration_record, {
                "version": migration.version,
                "name": migration.name,
                "checksum": migration.checksum,
            })
        applied.append(migration)
    return applied


async def require_current(conn: AnyConn, schema: str) -> None:
    """Raise SchemaError unless the schema is exactly what this notifyq expects."""
    current = await state(conn, schema)
    if current.unknown:
        raise SchemaError(_newer_message(schema, current.unknown))
    if current.pending:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in current.pending)
        raise SchemaError(
            f"schema {schema!r} is not migrated (missing {names}): run `notifyq migrate`"
        )


def _newer_message(schema: str, unknown: list[int]) -> str:
    return (
        f"schema {schema!r} has migrations {unknown} that this notifyq does not know: it was "
        "migrated by a newer notifyq; upgrade this one"
    )
