"""WarmConnection: one connection kept for a serial user, the pool serving when it cannot."""

from __future__ import annotations

import psycopg
import pytest

from notifyq._db.pool import AsyncConn, WarmConnection, open_pool
from notifyq._db.queries import queries_for
from tests.conftest import dsn_for
from tests.support import eventually

pytestmark = pytest.mark.anyio


async def _one(conn: AsyncConn, query: str) -> object:
    row = await (await conn.execute(query)).fetchone()
    assert row is not None
    return next(iter(row.values()))


async def test_it_is_opened_once_configured_once_and_reused(dsn: str) -> None:
    q = queries_for("notifyq")
    configured: list[int] = []

    async def configure(conn: AsyncConn) -> None:
        configured.append(conn.info.backend_pid)
        await conn.execute(q.worker_session_generic_plans)

    pool = await open_pool(dsn, max_size=2)
    warm = WarmConnection(dsn, application_name="nq-test-warm", configure=configure)
    try:
        pids = set()
        for _ in range(3):
            async with warm.connection(pool) as conn:
                pids.add(conn.info.backend_pid)
                assert await _one(conn, "SHOW plan_cache_mode") == "force_generic_plan"
        assert len(pids) == 1
        assert configured == list(pids)
        async with warm.connection(pool) as held, warm.connection(pool) as other:
            # Busy: the second user gets a pooled connection, without the session setting.
            assert other.info.backend_pid != held.info.backend_pid
            assert await _one(other, "SHOW plan_cache_mode") == "auto"
        await warm.close()

        async def gone() -> None:  # the backend exits a moment after the client hangs up
            async with pool.connection() as conn:
                assert await _one(conn, "SELECT count(*) FROM pg_stat_activity WHERE "
                                        "application_name = 'nq-test-warm'") == 0
        await eventually(gone)
    finally:
        await pool.close()


async def test_one_left_mid_transaction_is_dropped_and_replaced(dsn: str) -> None:
    pool = await open_pool(dsn, max_size=2)
    warm = WarmConnection(dsn)
    try:
        async with warm.connection(pool) as conn:
            first = conn.info.backend_pid
            await conn.execute("BEGIN")  # left open: not idle when handed back
        async with warm.connection(pool) as conn:
            assert conn.info.backend_pid != first
            assert await _one(conn, "SELECT 1") == 1
    finally:
        await warm.close()
        await pool.close()


async def test_one_that_cannot_open_leaves_the_pool_serving(dsn: str) -> None:
    pool = await open_pool(dsn, max_size=2)
    warm = WarmConnection(dsn_for("nq_no_such_database"))
    try:
        for _ in range(2):  # both served by the pool
            async with warm.connection(pool) as conn:
                assert await _one(conn, "SELECT current_database()") == (
                    psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    finally:
        await warm.close()
        await pool.close()
