"""Issue 34, item 3: a retry storm toward a failing endpoint does not delay fresh messages to a
healthy one. Real worker processes, a real receiver on 127.0.0.1 (one path answering 500, one
200), counted at the receiver and in SQL."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from notifyq import App, WebhookMessage
from tests.receiver import Receiver, Reply
from tests.support import Workers, eventually
from tests.webhooks.conftest import webhook_settings
from tests.webhooks.test_sending import _worker_env

pytestmark = pytest.mark.anyio
STORM = 1000
FRESH = 100


def _storm_env() -> dict[str, str]:
    # Retries half a second apart for long enough to outlast the test; no circuit breaker,
    # which would park the failing endpoint's deliveries and end the storm.
    return {**_worker_env(), "NOTIFYQ_WEBHOOKS__BREAKER_FAILURES": "0",
            "NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S": json.dumps([0] + [0.5] * 60),
            "NOTIFYQ_WEBHOOKS__JITTER": "0"}


def _pending_to(dsn: str, endpoint_id: object) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM notifyq.webhook_delivery "
                           "WHERE endpoint_id = %s AND status = 'pending'",
                           (endpoint_id,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_fresh_messages_to_a_healthy_endpoint_go_out_during_a_retry_storm(
        dsn: str, receiver: Receiver, logs: Path) -> None:
    # The failing endpoint answers 500 after 50 ms (each attempt holds a slot that long), and
    # its share is 50, as a busy endpoint's grows before it starts failing: more than all the
    # workers' slots, so only the lanes keep slots for the healthy endpoint.
    receiver.script("/failing", *[Reply(500, delay_s=0.05)] * 60 * STORM)
    app = App(settings=webhook_settings(dsn))
    async with app:
        failing = await app.webhooks.create_endpoint(receiver.url("/failing"))
        healthy = await app.webhooks.create_endpoint(receiver.url("/healthy"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO notifyq.key_concurrency (key, concurrency_limit) "
                         "VALUES (%s, 50)", (f"webhook:{failing.id}",))
        with Workers(dsn, logs, app="tests.apps.webhooks:app", concurrency=10,
                     extra_env=_storm_env()) as workers:
            workers.start()
            workers.start()
            workers.wait_registered()
            await app.webhooks.send_many([WebhookMessage("order.paid", {"n": n},
                                                         endpoint_id=failing.id)
                                          for n in range(STORM)])

            async def storming() -> None:  # every delivery failed once: all are retries now
                assert len(receiver.at("/failing")) >= STORM + 200

            await eventually(storming, timeout=60)
            before = len(receiver.at("/failing"))
            await app.webhooks.send_many([WebhookMessage("order.paid", {"n": n},
                                                         endpoint_id=healthy.id)
                                          for n in range(FRESH)])

            async def delivered() -> None:
                got = {r.headers["webhook-id"] for r in receiver.at("/healthy")}
                assert len(got) == FRESH, f"{len(got)} of {FRESH} fresh messages delivered"

            await eventually(delivered, timeout=30)
            # The storm was still on: every failing delivery is still pending, in SQL.
            assert _pending_to(dsn, failing.id) == STORM
            progress = len(receiver.at("/failing")) - before
            # Counted, not timed: the fresh messages went out before the storm had retried half
            # its deliveries once more. Without the lanes they waited behind every due retry
            # (994 retries here with migration 0021's claim; ~50 with the lanes).
            assert progress < STORM // 2, f"{progress} retries went out before the fresh ones"

            async def moving() -> None:  # and its retries were not starved
                assert len(receiver.at("/failing")) - before >= 100

            await eventually(moving, timeout=30)
            workers.stop_all()
        assert _pending_to(dsn, healthy.id) == 0
