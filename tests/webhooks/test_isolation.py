"""Issue 12, item 4: one slow endpoint does not delay the others. Real workers, a real black
hole on 127.0.0.1 (accepts, reads, never answers) and a real healthy receiver."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx
import pytest

from notifyq import App, WebhookMessage
from notifyq._api.app import ServiceState, create_api
from notifyq._clock import ManualClock
from notifyq._errors import Snooze
from tests.integration.inproc import fetch, running
from tests.receiver import BlackHole, Receiver, Reply
from tests.support import eventually
from tests.webhooks.conftest import deliverer, webhook_settings
from tests.webhooks.test_api_cli import ADMIN, _cli, _secret

pytestmark = pytest.mark.anyio
TIMEOUT_S = 2.0


async def _send(app: App, endpoint_id: Any, n: int) -> list[str]:
    return [(await app.webhooks.send("order.paid", {"n": i}, endpoint_id=endpoint_id)).id
            for i in range(n)]


async def test_a_black_hole_endpoint_does_not_delay_a_healthy_one_by_a_delivery(
        dsn: str, receiver: Receiver) -> None:
    # The numbers: 12 messages to a black hole, 4 slots, 2 s per attempt. Before, the
    # healthy endpoint's message waited behind them: 5.6 s.
    app = App(settings=webhook_settings(dsn, timeout_s=TIMEOUT_S, endpoint_concurrency=2,
                                        breaker_failures=100))
    with BlackHole() as hole:
        async with app:
            slow = await app.webhooks.create_endpoint(hole.url())
            healthy = await app.webhooks.create_endpoint(receiver.url("/healthy"))
            async with running(app, concurrency=4, pools=["webhooks"]):
                await _send(app, slow.id, 12)
                await eventually(_holds(hole, 2), timeout=10)
                started = time.monotonic()
                await app.webhooks.send("order.paid", {"n": "healthy"}, endpoint_id=healthy.id)
                await eventually(_arrived(receiver, "/healthy"), timeout=15)
                waited = time.monotonic() - started
    assert waited < TIMEOUT_S, f"the healthy endpoint waited {waited:.2f} s"
    assert hole.max_open == 2  # the black hole's share: never more slots than its limit


async def test_a_failing_endpoint_opens_its_circuit_and_its_deliveries_are_parked(
        dsn: str) -> None:
    app = App(settings=webhook_settings(dsn, timeout_s=1.0, endpoint_concurrency=2,
                                        breaker_failures=2, breaker_cooldown_s=300.0))
    with BlackHole() as hole:
        async with app:
            slow = await app.webhooks.create_endpoint(hole.url())
            async with running(app, concurrency=4, pools=["webhooks"]):
                await _send(app, slow.id, 8)
                async def opened() -> dict[str, Any]:
                    circuit: dict[str, Any] = (
                        await app.webhooks.get_endpoint(slow.id)).to_json()["circuit"]
                    assert circuit["state"] == "open", circuit
                    return circuit
                await eventually(opened, timeout=15)

                async def parked() -> None:
                    rows = await fetch(app, "SELECT status, run_at FROM notifyq.job_run "
                                            "WHERE job_type = 'webhook.deliver'")
                    assert [r["status"] for r in rows].count("running") == 0, rows
                    pending = [r for r in rows if r["status"] == "pending"]
                    assert len(pending) == 8  # nothing given up, nothing holding a slot
                    # None due soon: parked for the 300 s cooldown, or (a failure whose
                    # snooze was written after the parking) at its own retry, at least
                    # throttled_min_s (60 s) after a timeout; it is held again if still open.
                    soonest = min(r["run_at"] for r in pending)
                    assert soonest > datetime.now(UTC) + timedelta(seconds=40), soonest
                    assert sum(r["run_at"] > datetime.now(UTC) + timedelta(seconds=250)
                               for r in pending) >= 8 - 2, rows
                await eventually(parked, timeout=10)
                accepted = hole.accepted
                await anyio.sleep(1.5)  # a window in which a closed circuit would send more
                assert hole.accepted == accepted
                final = (await app.webhooks.get_endpoint(slow.id)).to_json()["circuit"]
    # The two failures that opened it, and at most one more that was claimed in the moment
    # between the first one's record and the second's; then nothing.
    assert 2 <= accepted <= 3
    assert final["state"] == "open"
    assert final["consecutive_failures"] == accepted
    assert await _attempt_count(dsn) == accepted


async def test_after_the_cooldown_one_probe_decides_whether_the_circuit_closes(
        dsn: str, receiver: Receiver) -> None:
    clock = ManualClock(datetime.now(UTC))
    app = App(settings=webhook_settings(dsn, breaker_failures=2, breaker_cooldown_s=60.0),
              clock=clock)
    async with app:
        receiver.script("/flaky", Reply(500), Reply(500), Reply(500))
        ep = await app.webhooks.create_endpoint(receiver.url("/flaky"))
        first, second, third, fourth = await _send(app, ep.id, 4)
        d = deliverer(app)
        for message in (first, second):
            with pytest.raises(Snooze):
                await d.deliver(message, ep.id)
        assert (await app.webhooks.get_endpoint(ep.id)).to_json()["circuit"]["state"] == "open"
        with pytest.raises(Snooze) as held:  # open: no request, no attempt, wait for the end
            await d.deliver(third, ep.id)
        assert 59 <= held.value.seconds <= 60
        assert len(receiver.at("/flaky")) == 2
        # Half-open: the next delivery is the probe; it fails: open again.
        clock.advance(timedelta(seconds=61))
        with pytest.raises(Snooze):
            await d.deliver(third, ep.id)
        assert len(receiver.at("/flaky")) == 3
        state = (await app.webhooks.get_endpoint(ep.id)).to_json()["circuit"]
        assert (state["state"], state["consecutive_failures"]) == ("open", 3)
        # The next probe succeeds (the script is used up: 200): closed.
        clock.advance(timedelta(seconds=61))
        result = await d.deliver(fourth, ep.id)
        assert result["status_code"] == 200
        state = (await app.webhooks.get_endpoint(ep.id)).to_json()["circuit"]
        assert state == {"state": "closed", "consecutive_failures": 0, "open_until": None}


async def test_a_half_open_circuit_lets_one_probe_through_and_holds_the_others(
        dsn: str, receiver: Receiver) -> None:
    clock = ManualClock(datetime.now(UTC))
    app = App(settings=webhook_settings(dsn, breaker_failures=1, breaker_cooldown_s=60.0),
              clock=clock)
    async with app:
        receiver.script("/flaky", Reply(500))
        ep = await app.webhooks.create_endpoint(receiver.url("/flaky"))
        first, second, third = await _send(app, ep.id, 3)
        d = deliverer(app)
        with pytest.raises(Snooze):
            await d.deliver(first, ep.id)
        clock.advance(timedelta(seconds=61))
        receiver.script("/flaky", Reply(200, delay_s=1.0))
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.deliver, second, ep.id)  # the probe, answered after 1 s
            await eventually(_arrived(receiver, "/flaky", 2), timeout=5)
            with pytest.raises(Snooze):  # meanwhile: held, no second request
                await d.deliver(third, ep.id)
        assert len(receiver.at("/flaky")) == 2


async def _attempt_count(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM notifyq.webhook_attempt").fetchone()
    assert row is not None
    return int(row[0])


def _holds(hole: BlackHole, n: int) -> Any:
    async def check() -> None:
        assert hole.open >= n, (hole.open, hole.accepted)
    return check


def _arrived(receiver: Receiver, path: str, n: int = 1) -> Any:
    async def check() -> None:
        assert len(receiver.at(path)) >= n
    return check



async def test_the_circuit_is_shown_by_the_api_and_the_cli_and_enable_closes_it(
        dsn: str, receiver: Receiver) -> None:
    base = webhook_settings(dsn, breaker_failures=2, breaker_cooldown_s=600.0)
    app = App(settings=base.model_copy(update={
        "api": base.api.model_copy(update={"admin_token": _secret(ADMIN)})}))
    async with app:
        receiver.script("/down", Reply(503), Reply(503))
        ep = await app.webhooks.create_endpoint(receiver.url("/down"))
        for message in await _send(app, ep.id, 2):
            with pytest.raises(Snooze):
                await deliverer(app).deliver(message, ep.id)
        transport = httpx.ASGITransport(app=create_api(app, ServiceState()))
        async with httpx.AsyncClient(transport=transport, base_url="http://api", headers={
                "authorization": f"Bearer {ADMIN}"}) as client:
            got = (await client.get(f"/v1/webhooks/endpoints/{ep.id}")).json()
    assert got["circuit"]["state"] == "open"
    assert got["circuit"]["consecutive_failures"] == 2
    listed = await anyio.to_thread.run_sync(_cli, dsn, "endpoints", "list")
    assert "circuit open after 2 failures until" in listed.stdout, listed
    enabled = await anyio.to_thread.run_sync(_cli, dsn, "endpoints", "enable", str(ep.id),
                                             "--json")
    assert enabled.returncode == 0, enabled.stderr
    assert json.loads(enabled.stdout)["circuit"] == {
        "state": "closed", "consecutive_failures": 0, "open_until": None}


async def test_a_busy_healthy_endpoint_is_not_held_to_its_limit_per_poll(
        dsn: str, receiver: Receiver) -> None:
    # A key at its limit leaves its other runs runnable but unclaimed; when one finishes the
    # producer must claim again, not wait for its next poll (here 30 s).
    base = webhook_settings(dsn, endpoint_concurrency=2)
    app = App(settings=base.model_copy(update={
        "worker": base.worker.model_copy(update={"poll_interval_s": 30.0})}))
    async with app:
        ep = await app.webhooks.create_endpoint(receiver.url("/busy"))
        async with running(app, concurrency=4, pools=["webhooks"]):
            async with (await app.pool()).connection() as conn, conn.transaction():
                for n in range(10):  # one transaction: one NOTIFY, one wake-up
                    await app.webhooks.send("order.paid", {"n": n}, endpoint_id=ep.id,
                                            conn=conn)
            await eventually(_arrived(receiver, "/busy", 10), timeout=10)


async def test_a_fast_endpoints_share_grows_and_a_throttling_ones_halves(
        dsn: str, receiver: Receiver) -> None:
    app = App(settings=webhook_settings(dsn, endpoint_concurrency=3))
    receiver.script("/throttle", *[Reply(429)] * 10)
    async with app:
        fast = await app.webhooks.create_endpoint(receiver.url("/fast"))
        slow = await app.webhooks.create_endpoint(receiver.url("/throttle"))
        async with running(app, concurrency=20, pools=["webhooks"]):
            await app.webhooks.send_many([WebhookMessage("a.b", {"n": n}, endpoint_id=fast.id)
                                          for n in range(300)]
                                         + [WebhookMessage("a.b", {}, endpoint_id=slow.id)] * 4)
            await eventually(_arrived_n(receiver, "/fast", 300), timeout=30)
            await eventually(_arrived_n(receiver, "/throttle", 2), timeout=10)

            async def shares() -> dict[str, int]:
                rows = await fetch(app, "SELECT key, concurrency_limit FROM "
                                        "notifyq.key_concurrency")
                found = {r["key"]: r["concurrency_limit"] for r in rows}
                assert found.get(f"webhook:{slow.id}") == 1, found  # 3 -> 1 after two 429s
                return found
            found = await eventually(shares, timeout=10)
    assert found[f"webhook:{fast.id}"] > 3  # grown past its start by fast answers


def _arrived_n(receiver: Receiver, path: str, n: int) -> Any:
    async def check() -> None:
        assert len(receiver.at(path)) >= n
    return check
