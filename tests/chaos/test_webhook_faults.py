"""Webhook delivery under faults (issue 30): the sender's backend killed in the middle of a
fan-out, a worker SIGKILLed and every notifyq connection terminated in the middle of a drain.
Counted at a real receiver on 127.0.0.1 by (path, webhook-id), and in SQL."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import App, WebhookMessage
from notifyq._errors import DatabaseUnavailable
from tests.integration.inproc import fetch
from tests.receiver import Receiver
from tests.support import eventually, spawn_worker, stop
from tests.webhooks.conftest import webhook_settings
from tests.webhooks.test_sending import _worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
APP = "tests.apps.webhooks:app"


def _arrivals(receiver: Receiver) -> tuple[set[tuple[str, str]], int]:
    """The distinct (path, webhook-id) pairs the receiver got, and how many requests repeated
    one of them."""
    pairs = [(r.path, r.headers["webhook-id"]) for r in receiver.requests]
    return set(pairs), len(pairs) - len(set(pairs))


async def test_a_fan_out_whose_backend_is_killed_writes_nothing_and_its_retry_delivers_once(
        dsn: str, receiver: Receiver) -> None:
    app = App(settings=webhook_settings(dsn))
    async with app:
        paths = [f"/e{n}" for n in range(5)]
        for path in paths:
            await app.webhooks.create_endpoint(receiver.url(path))
        batch = [WebhookMessage("a.b", {"n": n, "pad": "x" * 500}, idempotency_key=f"k{n}")
                 for n in range(20_000)]
        killed = threading.Event()

        def kill_the_sender() -> None:
            with psycopg.connect(dsn, autocommit=True) as admin:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not killed.is_set():
                    row = admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND state = 'active' AND pid <> pg_backend_pid() "
                        # The batch goes by COPY (the statement below 300 messages).
                        "AND (query LIKE 'COPY %%' OR query LIKE '%%_send_webhooks%%')"
                        ).fetchone()
                    if row is not None:
                        time.sleep(0.05)  # well inside its statement
                        admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                        killed.set()
                        return
                    time.sleep(0.005)

        thread = threading.Thread(target=kill_the_sender)
        thread.start()
        with pytest.raises((psycopg.OperationalError, DatabaseUnavailable)):
            await app.webhooks.send_many(batch)
        thread.join()
        assert killed.is_set()
        left = await fetch(app, "SELECT (SELECT count(*) FROM notifyq.webhook_message) AS m, "
                                "(SELECT count(*) FROM notifyq.webhook_delivery) AS d, "
                                "(SELECT count(*) FROM notifyq.job_run) AS r")
        assert left == [{"m": 0, "d": 0, "r": 0}]  # all or nothing: nothing

        # The sender retries the same batch (same keys): this time it goes through, once.
        small = batch[:300]
        sent = await app.webhooks.send_many(small)
        again = await app.webhooks.send_many(small)
        assert [s.id for s in again] == [s.id for s in sent]
        assert not any(s.created for s in again)
    worker = spawn_worker(dsn, APP, concurrency=20, extra_env=_worker_env())
    try:
        async def all_arrived() -> None:
            assert len(receiver.requests) >= 1500
        await eventually(all_arrived, timeout=60)
        await anyio.sleep(0.5)  # room for a second copy, should one be sent
    finally:
        stop(worker)
    unique, repeated = _arrivals(receiver)
    assert unique == {(p, s.id) for p in paths for s in sent}
    assert repeated == 0


async def test_a_drain_survives_a_sigkilled_worker_and_terminated_connections(
        dsn: str, receiver: Receiver) -> None:
    app = App(settings=webhook_settings(dsn))
    concurrency = 10
    async with app:
        paths = [f"/e{n}" for n in range(20)]
        for path in paths:
            await app.webhooks.create_endpoint(receiver.url(path))
        sent = await app.webhooks.send_many([("a.b", {"n": n}) for n in range(150)])
    expected = {(p, s.id) for p in paths for s in sent}  # 3,000 deliveries
    workers: list[subprocess.Popen[bytes]] = []
    try:
        workers = [spawn_worker(dsn, APP, concurrency=concurrency, extra_env=_worker_env())
                   for _ in range(2)]
        await eventually(_received_at_least(receiver, 300), timeout=60)
        os.kill(workers[0].pid, signal.SIGKILL)  # in the middle of its deliveries
        await eventually(_received_at_least(receiver, 1200), timeout=60)
        with psycopg.connect(dsn, autocommit=True) as admin:  # the survivor's connections
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                          "AND application_name LIKE 'notifyq%%'")
        workers.append(spawn_worker(dsn, APP, concurrency=concurrency,
                                    extra_env=_worker_env()))

        async def all_succeeded() -> None:
            rows = await _rows(dsn, "SELECT status, count(*) FROM notifyq.webhook_delivery "
                                    "GROUP BY status")
            assert dict(rows) == {"succeeded": 3000}, rows
        await eventually(all_succeeded, timeout=120)
    finally:
        for worker in workers:
            stop(worker)
    unique, repeated = _arrivals(receiver)
    assert unique == expected  # nothing lost
    # Sent twice only where a worker died (or lost its connection) between a POST and its
    # record: at most what two workers had in flight, and each time the same webhook-id.
    assert repeated <= 2 * concurrency
    recorded = await _rows(dsn, "SELECT count(*), count(DISTINCT (message_id, endpoint_id)) "
                                "FROM notifyq.webhook_attempt WHERE status_code = 200")
    assert recorded == [(3000, 3000)]  # one recorded success per delivery


def _received_at_least(receiver: Receiver, n: int) -> Any:
    async def check() -> None:
        assert len(receiver.requests) >= n
    return check


async def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await (await conn.execute(query)).fetchall()
