"""Ordered endpoints end to end: real worker processes, a loopback receiver that counts the
requests it is answering at once, and the order, attempts and run times read back in SQL.

Here the workers start first; messages sent before any worker ever ran are ordered too
(tests/webhooks/test_sent_before_workers.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from notifyq import App
from notifyq._errors import InvalidTransition
from tests import vault
from tests.integration.inproc import fetch
from tests.receiver import Receiver, Reply
from tests.support import eventually, scalar, spawn_worker, stop, wait_until

pytestmark = pytest.mark.anyio

WORKER_ENV = {"NOTIFYQ_KEYS": f"1:{vault.b64(vault.KEY1)}", "NOTIFYQ_ACTIVE_KEY_VERSION": "1",
              "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
              "NOTIFYQ_WEBHOOKS__BREAKER_FAILURES": "0", "NOTIFYQ_POOL_MAX_SIZE": "4"}


@contextmanager
def _workers(dsn: str, n: int, schedule: str = "[0, 0.3, 0.3, 0.3, 0.3]",
             ) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` worker processes, once every one of them is claiming."""
    procs = [spawn_worker(dsn, "tests.apps.webhooks:app", concurrency=8, extra_env={
        **WORKER_ENV, "NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S": schedule}) for _ in range(n)]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: _registered(conn, n), timeout=60)
        yield procs
    finally:
        for proc in procs:
            stop(proc)


def _registered(conn: psycopg.Connection[Any], workers: int) -> None:
    assert scalar(conn, "SELECT count(*) FROM notifyq.worker") == workers
    assert scalar(conn, "SELECT count(*) FROM notifyq.job WHERE type = 'webhook.deliver'") == 1


SKEW = timedelta(milliseconds=250)


def _numbers(receiver: Receiver, path: str = "/hook") -> list[int]:
    return [json.loads(r.body)["n"] for r in receiver.at(path)]


async def _send(app: App, count: int) -> list[str]:
    """``count`` messages of type order.shipped numbered from 0, in send order: batches of
    send_many (25 each) and single sends, half and half."""
    ids: list[str] = []
    n = 0
    while n < count:
        if n % 100 < 50:
            batch = await app.webhooks.send_many(
                [("order.shipped", {"n": i}) for i in range(n, min(n + 25, count))])
            ids += [s.id for s in batch]
            n += len(batch)
        else:
            ids.append((await app.webhooks.send("order.shipped", {"n": n})).id)
            n += 1
    return ids


async def _attempts_by_number(app: App) -> dict[int, list[Any]]:
    rows = await fetch(app, "SELECT (m.body::jsonb ->> 'n')::int AS n, a.status_code "
                            "FROM notifyq.webhook_attempt a "
                            "JOIN notifyq.webhook_message m ON m.id = a.message_id ORDER BY a.id")
    out: dict[int, list[Any]] = {}
    for row in rows:
        out.setdefault(row["n"], []).append(row["status_code"])
    return out


async def _overlapping_runs(app: App) -> int:
    """Pairs of the endpoint's delivery runs whose claims overlapped in time (SQL's count).

    ``claimed_at`` and ``finished_at`` are their statements' transaction start times: a claim
    that began while the run before it was being written back, and counted the key's running
    runs after that write-back committed, shows an overlap of a few milliseconds that did not
    happen (under a loaded CI, up to tens). An overlap longer than ``SKEW`` is real: it would be
    two deliveries in flight, each a round trip to the receiver and a write-back."""
    rows = await fetch(app, """
        SELECT count(*)::int AS n FROM notifyq.job_run a JOIN notifyq.job_run b
          ON a.concurrency_key = b.concurrency_key AND a.id < b.id
         AND tstzrange(a.claimed_at, a.finished_at) && tstzrange(b.claimed_at, b.finished_at)
        WHERE a.job_type = 'webhook.deliver' AND a.status = 'completed'
          AND b.status = 'completed'
          AND least(a.finished_at, b.finished_at) - greatest(a.claimed_at, b.claimed_at)
              > %s""", SKEW)
    return int(rows[0]["n"])


async def _delivered(app: App, count: int) -> None:
    rows = await fetch(app, "SELECT count(*)::int AS n FROM notifyq.webhook_delivery "
                            "WHERE status IN ('succeeded', 'failed')")
    assert rows[0]["n"] == count


async def test_two_hundred_messages_arrive_in_send_order_one_at_a_time_across_workers(
        wapp: App, receiver: Receiver, dsn: str) -> None:
    endpoint = await wapp.webhooks.create_endpoint(receiver.url(), ordered=True)
    assert endpoint.ordered
    receiver.script("/hook", *[Reply(200, delay_s=0.004) for _ in range(200)])
    with _workers(dsn, 3):
        await _send(wapp, 200)
        await eventually(lambda: _delivered(wapp, 200), timeout=120)
    assert _numbers(receiver) == list(range(200))
    assert receiver.most_busy == 1
    assert await _overlapping_runs(wapp) == 0
    tries = {n: len(codes) for n, codes in (await _attempts_by_number(wapp)).items()}
    assert tries == dict.fromkeys(range(200), 1)
    share = await fetch(wapp, "SELECT concurrency_limit, pinned FROM notifyq.key_concurrency "
                              "WHERE key = %s", f"webhook:{endpoint.id}")
    assert share == [{"concurrency_limit": 1, "pinned": True}]  # 200 fast successes: still 1


async def test_a_failing_message_holds_back_the_later_ones_which_then_go_at_once(
        wapp: App, receiver: Receiver, dsn: str) -> None:
    await wapp.webhooks.create_endpoint(receiver.url(), ordered=True)
    k = 7
    receiver.script("/hook", *[Reply(200)] * k, *[Reply(500)] * 3)
    with _workers(dsn, 2):
        ids = await _send(wapp, 30)
        await eventually(lambda: _delivered(wapp, 30), timeout=60)
    # k was tried four times (three 500s, then a 200), and nothing after it came in between
    assert _numbers(receiver) == [*range(k), k, k, k, k, *range(k + 1, 30)]
    attempts = await _attempts_by_number(wapp)
    assert attempts[k] == [500, 500, 500, 200]
    assert all(attempts[n] == [200] for n in range(30) if n != k)
    # waiting behind k cost the later messages no attempt and no backoff: each run kept the
    # time it was given when its message was sent (the send's now(), the message's created_at)
    moved = await fetch(wapp, "SELECT m.id FROM notifyq.webhook_message m "
                              "JOIN notifyq.webhook_delivery d ON d.message_id = m.id "
                              "JOIN notifyq.job_run r ON r.id = d.run_id "
                              "WHERE r.run_at <> m.created_at")
    assert [r["id"] for r in moved] == [ids[k]]
    assert receiver.most_busy == 1


async def test_giving_up_a_stuck_head_lets_the_rest_go_in_order(
        wapp: App, receiver: Receiver, dsn: str) -> None:
    ordered = await wapp.webhooks.create_endpoint(receiver.url(), event_types=["order.shipped"],
                                                  ordered=True)
    await wapp.webhooks.create_endpoint(receiver.url("/other"), event_types=["probe"])
    k = 3
    receiver.script("/hook", *[Reply(200)] * k, Reply(500))
    with _workers(dsn, 2, schedule="[0, 3600]"):
        ids = await _send(wapp, 10)
        await eventually(lambda: _head_waits(wapp, ids[k]), timeout=60)
        # the workers are claiming (another endpoint's message goes), the ordered one waits
        await wapp.webhooks.send("probe", {"n": -1})
        await eventually(lambda: _count(receiver, "/other", 1), timeout=30)
        assert _numbers(receiver) == [*range(k), k]
        with pytest.raises(InvalidTransition, match="succeeded"):
            await wapp.webhooks.give_up(ids[0], ordered.id)
        await wapp.webhooks.give_up(ids[k], ordered.id, reason="poison message")
        await eventually(lambda: _count(receiver, "/hook", 10), timeout=30)
    assert _numbers(receiver) == list(range(10))
    delivery = (await wapp.webhooks.message(ids[k]))["deliveries"][0]
    assert (delivery["status"], delivery["last_error"]) == ("failed", "poison message")


async def _head_waits(app: App, message_id: str) -> None:
    rows = await fetch(app, "SELECT r.status, r.priority, r.key_head, r.run_at > now() AS later "
                            "FROM notifyq.webhook_delivery d JOIN notifyq.job_run r "
                            "ON r.id = d.run_id WHERE d.message_id = %s", message_id)
    assert rows == [{"status": "pending", "priority": 0, "key_head": True, "later": True}]


async def _count(receiver: Receiver, path: str, n: int) -> None:
    assert len(receiver.at(path)) == n


async def test_turning_ordered_on_and_off_pins_and_frees_the_endpoints_share(
        wapp: App, receiver: Receiver) -> None:
    endpoint = await wapp.webhooks.create_endpoint(receiver.url())
    key = f"webhook:{endpoint.id}"
    query = "SELECT concurrency_limit, pinned FROM notifyq.key_concurrency WHERE key = %s"
    assert await fetch(wapp, query, key) == []
    on = await wapp.webhooks.update_endpoint(endpoint.id, ordered=True)
    assert (on.ordered, on.to_json()["ordered"]) == (True, True)
    assert await fetch(wapp, query, key) == [{"concurrency_limit": 1, "pinned": True}]
    assert (await wapp.webhooks.get_endpoint(endpoint.id)).ordered
    kept = await wapp.webhooks.update_endpoint(endpoint.id, description="still ordered")
    assert kept.ordered
    off = await wapp.webhooks.update_endpoint(endpoint.id, ordered=False)
    assert not off.ordered
    assert await fetch(wapp, query, key) == []
