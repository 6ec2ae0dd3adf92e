"""Connections: one autocommit pool per process, plus single connections for the listener."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from notifyq.errors import ConfigError

Row = dict[str, Any]
AsyncConn = psycopg.AsyncConnection[Row]


def require_dsn(dsn: str | None) -> str:
    if not dsn:
        raise ConfigError(
            "no database configured: set NOTIFYQ_DATABASE_URL (e.g. "
            "postgresql://user@127.0.0.1:5432/app) or pass App(dsn=...)"
        )
    return dsn


async def open_pool(
    dsn: str, *, max_size: int, name: str = "notifyq"
) -> AsyncConnectionPool[AsyncConn]:
    """Open the process's pool. Connections are autocommit: each statement is a short
    transaction unless a caller opens one explicitly with ``conn.transaction()``."""
    pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
        dsn,
        min_size=min(2, max_size),
        max_size=max_size,
        kwargs={"autocommit": True, "row_factory": dict_row, "application_name": name},
        connection_class=psycopg.AsyncConnection[Row],
        name=name,
        open=False,
        timeout=30.0,
        reconnect_timeout=3600.0,
    )
    await pool.open(wait=True, timeout=30.0)
    return pool


async def connect(dsn: str, *, application_name: str = "notifyq") -> AsyncConn:
    """A standalone autocommit connection (the listener, migrations)."""
    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row, application_name=application_name)
