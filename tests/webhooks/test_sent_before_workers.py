"""Messages sent into a database no worker ever started on (migration 0038): their delivery runs
are keyed by their endpoint without the ``webhook.deliver`` definition, so once worker
processes start, an ordered endpoint still gets them in send order one at a time, an endpoint's
share still bounds what is in flight, and its rate limit still holds. Counted in SQL (the runs'
claim and finish times) and at real receivers on 127.0.0.1."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from notifyq import App, WebhookMessage
from tests.integration.inproc import fetch
from tests.receiver import Receiver, Reply
from tests.support import Workers, eventually
from tests.webhooks.test_ordered import _send
from tests.webhooks.test_rate_limits import _most_within
from tests.webhooks.test_sending import _worker_env

pytestmark = pytest.mark.anyio

SHARE = 2
RATE = 10
SKEW = timedelta(milliseconds=250)
"""How far a run's claim and finish times (their statements' transaction starts) may be off
what happened (tests/webhooks/test_ordered.py, _overlapping_runs)."""


async def _most_in_flight(app: App, endpoint_id: Any) -> int:
    """The most runs of the endpoint that were in flight at once: at each run's claim, the
    runs claimed by then that were still running ``SKEW`` later."""
    rows = await fetch(app, """
        SELECT coalesce(max(n), 0)::int AS n FROM (
            SELECT count(*) AS n FROM notifyq.job_run a JOIN notifyq.job_run b
              ON b.concurrency_key = a.concurrency_key AND b.claimed_at <= a.claimed_at
             AND b.finished_at > a.claimed_at + %s
            WHERE a.concurrency_key = %s GROUP BY a.id) x""", SKEW, f"webhook:{endpoint_id}")
    return int(rows[0]["n"])


async def _most_claimed_within_a_second(app: App, endpoint_id: Any) -> int:
    rows = await fetch(app, """
        SELECT coalesce(max(n), 0)::int AS n FROM (
            SELECT count(*) AS n FROM notifyq.job_run a JOIN notifyq.job_run b
              ON b.concurrency_key = a.concurrency_key AND b.claimed_at >= a.claimed_at
             AND b.claimed_at < a.claimed_at + interval '1 second'
            WHERE a.concurrency_key = %s GROUP BY a.id) x""", f"webhook:{endpoint_id}")
    return int(rows[0]["n"])


async def test_messages_sent_before_any_worker_keep_order_share_and_rate_once_workers_start(
        wapp: App, receiver: Receiver, dsn: str, logs: Path) -> None:
    times: list[float] = []
    with Receiver() as slow, Receiver() as rated:
        ordered = await wapp.webhooks.create_endpoint(receiver.url(), event_types=["order.shipped"],
                                                      ordered=True)
        limited = await wapp.webhooks.create_endpoint(slow.url(), event_types=["slow"])
        throttled = await wapp.webhooks.create_endpoint(rated.url(), event_types=["rated"],
                                                        rate_limit=RATE)
        receiver.script("/hook", *[Reply(200)] * 7, Reply(500), Reply(500))
        slow.script("/hook", *[Reply(200, delay_s=0.4) for _ in range(12)])
        rated.script("/hook", *[Reply(on_request=lambda: times.append(time.monotonic()))
                                for _ in range(40)])
        await _send(wapp, 60)
        await wapp.webhooks.send_many([WebhookMessage("slow", {"n": n}) for n in range(12)])
        await wapp.webhooks.send_many([WebhookMessage("rated", {"n": n}) for n in range(40)])

        # No worker ever ran: no definition, and yet every run is keyed by its endpoint.
        assert await fetch(wapp, "SELECT count(*)::int AS n FROM notifyq.job") == [{"n": 0}]
        assert await fetch(wapp, """
            SELECT r.concurrency_key = 'webhook:' || d.endpoint_id AS keyed,
                   r.concurrency_limit, r.defaulted, count(*)::int AS n
            FROM notifyq.job_run r JOIN notifyq.webhook_delivery d ON d.run_id = r.id
            GROUP BY 1, 2, 3""") == [{"keyed": True, "concurrency_limit": 1, "defaulted": 8,
                                      "n": 112}]

        env = {**_worker_env(), "NOTIFYQ_WEBHOOKS__ENDPOINT_CONCURRENCY": str(SHARE),
               "NOTIFYQ_WEBHOOKS__ENDPOINT_CONCURRENCY_MAX": str(SHARE),
               "NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S": "[0, 0.3, 0.3, 0.3]",
               "NOTIFYQ_WEBHOOKS__BREAKER_FAILURES": "0"}
        with Workers(dsn, logs, app="tests.apps.webhooks:app", concurrency=8,
                     extra_env=env) as workers:
            for _ in range(3):
                workers.start()

            async def all_delivered() -> None:
                rows = await fetch(wapp, "SELECT count(*)::int AS n FROM "
                                         "notifyq.webhook_delivery WHERE status = 'succeeded'")
                assert rows == [{"n": 112}]

            await eventually(all_delivered, timeout=90)
            workers.stop_all()

        # Ordered: send order, one at a time, message 7 held the others through its two 500s.
        numbers = [json.loads(r.body)["n"] for r in receiver.at("/hook")]
        assert numbers == [*range(7), 7, 7, 7, *range(8, 60)]
        assert receiver.most_busy == 1
        assert await _most_in_flight(wapp, ordered.id) <= 1
        # The share the first worker's definition gave them (not the 1 they were sent with).
        limits = await fetch(wapp, "SELECT DISTINCT concurrency_limit, defaulted FROM "
                                   "notifyq.job_run WHERE concurrency_key = %s",
                             f"webhook:{limited.id}")
        assert limits == [{"concurrency_limit": SHARE, "defaulted": None}]
        assert slow.most_busy <= SHARE
        assert await _most_in_flight(wapp, limited.id) <= SHARE
        # Rated: at most RATE a second, at the receiver (one more for a request's travel
        # across a window's edge, as in test_rate_limits.py) and by claim time.
        start = min(times)
        shown = " ".join(f"{t - start:.2f}" for t in sorted(times))
        assert len(times) == 40
        assert _most_within(times, 1.0) <= RATE + 3, shown
        assert _most_within(times, 2.0) <= 2 * (RATE + 1), shown
        assert await _most_claimed_within_a_second(wapp, throttled.id) <= RATE + 1
