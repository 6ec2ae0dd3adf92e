"""FIFO at equal priority: runs execute in the order they were enqueued, within one
``enqueue_many`` batch and across batches, as observed by a real worker process at concurrency
1 that records each execution."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from notifyq import App
from tests.apps.semantics import ORDER_DDL
from tests.support import Workers, wait_until

pytestmark = pytest.mark.anyio

APP = "tests.apps.semantics:app"


def _batch(prefix: str, n: int) -> list[dict[str, object]]:
    # Every 7th run has a dedupe key: enqueued by its own statement after the others, and
    # still run in its place.
    return [{"job_type": "order.record", "input": {"label": f"{prefix}{i:03d}"},
             **({"dedupe_key": f"{prefix}{i}"} if i % 7 == 3 else {})}
            for i in range(n)]


@pytest.mark.timeout(90)
async def test_runs_of_equal_priority_execute_in_enqueue_order_within_and_across_batches(
        app: App, dsn: str, logs: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as sql:
        sql.execute(ORDER_DDL)
    expected: list[str] = []
    # Two batches in their own transactions, then two batches and three single enqueues in one
    # caller transaction: the last five share the transaction's now() as their run_at, so only
    # the id can order them.
    for prefix in ("a", "b"):
        batch = _batch(prefix, 60)
        await app.enqueue_many(batch)
        expected += [str(item["input"]["label"]) for item in batch]  # type: ignore[index]
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        for prefix in ("c", "d"):
            batch = _batch(prefix, 60)
            await app.enqueue_many(batch, conn=conn)
            expected += [str(item["input"]["label"]) for item in batch]  # type: ignore[index]
        for i in range(3):
            await app.enqueue("order.record", {"label": f"e{i:03d}"}, conn=conn)
            expected.append(f"e{i:03d}")

    with Workers(dsn, logs, app=APP, concurrency=1) as workers, \
            psycopg.connect(dsn, autocommit=True) as sql:
        workers.start()

        def all_ran() -> list[str]:
            labels = [r[0] for r in sql.execute(
                "SELECT label FROM execution_order ORDER BY seq").fetchall()]
            assert len(labels) == len(expected), (len(labels), workers.logs())
            return labels
        order = wait_until(all_ran, timeout=60)
        assert workers.stop_all() == [0]
    assert order == expected
