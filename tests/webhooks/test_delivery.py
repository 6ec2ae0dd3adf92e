"""One attempt at a time (``app._deliverer.deliver``) against a real receiver on 127.0.0.1:
signatures, status classes, timeouts, body cap, redirects, cookies, proxies, the SSRF default,
secret rotation, auto-disable and logs."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import App
from notifyq._clock import ManualClock
from notifyq._errors import InvalidEndpoint, Permanent, Snooze
from tests.integration.inproc import fetch, scalar
from tests.receiver import Listener, Receiver, Reply
from tests.webhooks.conftest import verify, webhook_settings

pytestmark = pytest.mark.anyio


async def _one(app: App, receiver: Receiver, path: str = "/hook", **endpoint: Any,
               ) -> tuple[Any, str]:
    ep = await app.webhooks.create_endpoint(receiver.url(path), **endpoint)
    sent = await app.webhooks.send("order.paid", {"order": 7, "note": "ünïcode"},
                                   endpoint_id=ep.id)
    return ep, sent.id


async def _attempts(app: App, message_id: str) -> list[dict[str, Any]]:
    return await app.webhooks.attempts(message_id)


async def _delivery(app: App, message_id: str) -> dict[str, Any]:
    rows = await fetch(app, "SELECT * FROM notifyq.webhook_delivery WHERE message_id = %s",
                       message_id)
    return rows[0]


async def test_a_delivery_is_signed_per_standard_webhooks_over_the_exact_bytes_sent(
        wapp: App, receiver: Receiver) -> None:
    ep, msg = await _one(wapp, receiver, headers={"X-Team": "billing"})
    result = await wapp._deliverer.deliver(msg, ep.id)
    assert result["status_code"] == 200
    [request] = receiver.requests
    assert verify(ep.secret, request) == {"order": 7, "note": "ünïcode"}
    body = await scalar(wapp, "SELECT body FROM notifyq.webhook_message WHERE id = %s", msg)
    assert request.body == body.encode()
    h = request.headers
    assert h["webhook-id"] == msg
    assert abs(int(h["webhook-timestamp"]) - time.time()) < 30
    assert h["content-type"] == "application/json"
    assert h["accept-encoding"] == "identity"
    assert h["x-team"] == "billing"
    [attempt] = await _attempts(wapp, msg)
    assert (attempt["status_code"], attempt["trigger"], attempt["attempt"]) == (200, "scheduled", 1)
    assert attempt["duration_ms"] > 0
    assert (await _delivery(wapp, msg))["status"] == "succeeded"


async def test_a_tampered_body_or_a_wrong_secret_does_not_verify(
        wapp: App, receiver: Receiver) -> None:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    from notifyq._webhooks.signing import generate_secret

    ep, msg = await _one(wapp, receiver)
    await wapp._deliverer.deliver(msg, ep.id)
    [request] = receiver.requests
    with pytest.raises(WebhookVerificationError):
        Webhook(ep.secret).verify(request.body + b" ", request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(request.body, request.headers)


async def test_each_retry_has_the_same_webhook_id_and_a_fresh_signed_timestamp(
        wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(500), Reply(503))
    ep, msg = await _one(wapp, receiver)
    for _ in range(2):
        with pytest.raises(Snooze):
            await wapp._deliverer.deliver(msg, ep.id)
        await anyio.sleep(1.05)  # pacing: webhook-timestamp has a resolution of one second
    await wapp._deliverer.deliver(msg, ep.id)
    assert [r.headers["webhook-id"] for r in receiver.requests] == [msg] * 3
    assert len({r.headers["webhook-timestamp"] for r in receiver.requests}) == 3
    for request in receiver.requests:
        verify(ep.secret, request)
    attempts = await _attempts(wapp, msg)
    assert [(a["attempt"], a["status_code"]) for a in attempts] == [(1, 500), (2, 503), (3, 200)]
    assert (await _delivery(wapp, msg))["status"] == "succeeded"


@pytest.mark.parametrize("status", [301, 400, 404, 500, 503])
async def test_non_2xx_answers_are_failures_retried_on_the_schedule(
        wapp: App, receiver: Receiver, status: int) -> None:
    receiver.script("/hook", Reply(status, headers={"location": receiver.url("/elsewhere")}))
    ep, msg = await _one(wapp, receiver)
    with pytest.raises(Snooze) as snoozed:
        await wapp._deliverer.deliver(msg, ep.id)
    assert 0.08 <= snoozed.value.seconds <= 0.12  # the test schedule's second delay, ±20 %
    [attempt] = await _attempts(wapp, msg)
    assert attempt["status_code"] == status
    assert attempt["next_attempt_at"] is not None
    assert receiver.at("/elsewhere") == []  # a redirect is never followed


async def test_the_schedule_running_out_fails_the_delivery(wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(500), Reply(500), Reply(500))
    ep, msg = await _one(wapp, receiver)
    for _ in range(2):
        with pytest.raises(Snooze):
            await wapp._deliverer.deliver(msg, ep.id)
    with pytest.raises(Permanent, match="HTTP 500"):
        await wapp._deliverer.deliver(msg, ep.id)
    assert (await _delivery(wapp, msg))["status"] == "failed"


async def test_410_disables_the_endpoint_and_stops_its_pending_deliveries(
        wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(410))
    ep, msg = await _one(wapp, receiver)
    other = (await wapp.webhooks.send("order.paid", {"n": 2}, endpoint_id=ep.id)).id
    other_run = (await _delivery(wapp, other))["run_id"]
    with pytest.raises(Permanent, match="410"):
        await wapp._deliverer.deliver(msg, ep.id)
    endpoint = await wapp.webhooks.get_endpoint(ep.id)
    assert not endpoint.enabled
    assert endpoint.disabled_reason == "the endpoint answered 410 Gone"
    assert (await _delivery(wapp, other))["status"] == "canceled"
    assert await scalar(wapp, "SELECT status FROM notifyq.job_run WHERE id = %s",
                        other_run) == "canceled"
    assert (await wapp._deliverer.deliver(other, ep.id))["skipped"].startswith("endpoint disab")
    assert len(receiver.requests) == 1
    after = await wapp.webhooks.send("order.paid", {"n": 3})
    assert after.deliveries == 0  # disabled endpoints are not fanned out to


@pytest.mark.parametrize(("retry_after", "low", "high"), [
    ("30", 30, 30), ("0", 0.08, 0.12), (None, 0.08, 0.12)])
async def test_retry_after_sets_the_next_attempt(
        wapp: App, receiver: Receiver, retry_after: str | None, low: float,
        high: float) -> None:
    headers = {"retry-after": retry_after} if retry_after else {}
    receiver.script("/hook", Reply(503, headers=headers))
    ep, msg = await _one(wapp, receiver)
    with pytest.raises(Snooze) as snoozed:
        await wapp._deliverer.deliver(msg, ep.id)
    assert low <= snoozed.value.seconds <= high


async def test_429_waits_at_least_a_minute(wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(429, headers={"retry-after": "1"}))
    ep, msg = await _one(wapp, receiver)
    with pytest.raises(Snooze) as snoozed:
        await wapp._deliverer.deliver(msg, ep.id)
    assert snoozed.value.seconds >= 60


@pytest.mark.parametrize("reply", [Reply(delay_s=5), Reply(body=b"x" * 50, drip_s=0.1)],
                         ids=["slow", "drip"])
async def test_a_slow_or_dripping_server_is_cut_off_at_the_deadline(
        dsn: str, receiver: Receiver, reply: Reply) -> None:
    app = App(settings=webhook_settings(dsn, timeout_s=1.0, connect_timeout_s=0.5))
    async with app:
        receiver.script("/hook", reply)
        ep, msg = await _one(app, receiver)
        started = time.monotonic()
        with pytest.raises(Snooze) as snoozed:
            await app._deliverer.deliver(msg, ep.id)
        assert time.monotonic() - started < 2.5
        assert snoozed.value.seconds >= 60  # timeouts wait at least a minute
        [attempt] = await _attempts(app, msg)
        assert attempt["error_kind"] == "timeout"
        assert attempt["status_code"] is None
        assert 900 <= attempt["duration_ms"] < 2000


async def test_the_response_body_is_read_up_to_the_cap_and_stored_truncated(
        wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(500, body=b"e" * 5_000_000))
    ep, msg = await _one(wapp, receiver)
    with pytest.raises(Snooze):
        await wapp._deliverer.deliver(msg, ep.id)
    [attempt] = await _attempts(wapp, msg)
    assert len(attempt["response_body"]) == 20_000
    assert attempt["response_truncated"] is True


async def test_a_gzip_body_is_stored_raw_not_decompressed(wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(200, body=b"hello " * 1000, gzip=True))
    ep, msg = await _one(wapp, receiver)
    await wapp._deliverer.deliver(msg, ep.id)
    [attempt] = await _attempts(wapp, msg)
    assert "hello" not in attempt["response_body"]
    assert len(attempt["response_body"]) < 200


async def test_a_cookie_set_by_the_receiver_is_never_sent_back(
        wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(200, headers={"set-cookie": "session=abc; Path=/"}))
    ep, msg = await _one(wapp, receiver)
    await wapp._deliverer.deliver(msg, ep.id)
    second = (await wapp.webhooks.send("order.paid", {"n": 2}, endpoint_id=ep.id)).id
    await wapp._deliverer.deliver(second, ep.id)
    assert [r.headers.get("cookie") for r in receiver.requests] == [None, None]


async def test_connections_are_pooled_per_destination(wapp: App, receiver: Receiver) -> None:
    ep = await wapp.webhooks.create_endpoint(receiver.url())
    for n in range(5):
        msg = (await wapp.webhooks.send("order.paid", {"n": n}, endpoint_id=ep.id)).id
        await wapp._deliverer.deliver(msg, ep.id)
    assert len(receiver.requests) == 5
    assert receiver.connections == 1


async def test_a_reset_connection_is_recorded_as_a_connect_error(
        wapp: App, receiver: Receiver) -> None:
    receiver.script("/hook", Reply(reset=True))
    ep, msg = await _one(wapp, receiver)
    with pytest.raises(Snooze):
        await wapp._deliverer.deliver(msg, ep.id)
    [attempt] = await _attempts(wapp, msg)
    assert attempt["error_kind"] == "connect"


async def test_a_closed_port_is_a_connect_error(wapp: App) -> None:
    with Listener() as closed:
        port = closed.port
    ep = await wapp.webhooks.create_endpoint(f"http://127.0.0.1:{port}/")
    msg = (await wapp.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
    with pytest.raises(Snooze):
        await wapp._deliverer.deliver(msg, ep.id)
    assert (await _attempts(wapp, msg))[0]["error_kind"] == "connect"


async def test_proxy_environment_variables_are_ignored(
        wapp: App, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    with Listener() as proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                     "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        ep, msg = await _one(wapp, receiver)
        await wapp._deliverer.deliver(msg, ep.id)
        assert len(receiver.requests) == 1
        assert proxy.accepted == 0


async def test_the_default_guard_blocks_loopback_receivers(dsn: str, receiver: Receiver) -> None:
    open_app = App(settings=webhook_settings(dsn))
    closed_app = App(settings=webhook_settings(dsn, allowed_networks=[]))
    async with open_app, closed_app:
        with pytest.raises(InvalidEndpoint, match=r"127\.0\.0\.1 is loopback"):
            await closed_app.webhooks.create_endpoint(receiver.url())
        ep, msg = await _one(open_app, receiver)  # written while allowed
        with pytest.raises(Snooze):
            await closed_app._deliverer.deliver(msg, ep.id)
        [attempt] = await _attempts(closed_app, msg)
        assert attempt["error_kind"] == "blocked"
        assert "loopback" in attempt["error"]
        assert receiver.requests == []


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "[::ffff:7f00:1]",
                                  "localhost."])
async def test_url_forms_that_reach_loopback_are_blocked_by_default(
        dsn: str, sql: psycopg.Connection[Any], receiver: Receiver, host: str) -> None:
    app = App(settings=webhook_settings(dsn, allowed_networks=[]))

    async def fail_dns(name: str, port: int) -> list[str]:
        raise AssertionError("no DNS lookup is needed for these forms")

    app._deliverer.resolver = fail_dns
    async with app:
        url = f"http://{host}:{receiver.port}/hook"
        with pytest.raises(InvalidEndpoint, match="public addresses"):
            await app.webhooks.create_endpoint(url)
        allowed = App(settings=webhook_settings(dsn))
        async with allowed:
            ep = await allowed.webhooks.create_endpoint(receiver.url())
        sql.execute("UPDATE notifyq.webhook_endpoint SET url = %s", (url,))  # as if written
        msg = (await app.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
        with pytest.raises(Snooze):
            await app._deliverer.deliver(msg, ep.id)
        assert (await _attempts(app, msg))[0]["error_kind"] == "blocked"
        assert receiver.requests == []


async def test_a_hostname_is_resolved_once_and_the_checked_address_is_used(
        dsn: str, receiver: Receiver) -> None:
    app = App(settings=webhook_settings(dsn))
    asked: list[str] = []

    async def resolver(name: str, port: int) -> list[str]:
        asked.append(name)
        return ["127.0.0.1"]

    app._deliverer.resolver = resolver
    async with app:
        ep = await app.webhooks.create_endpoint(f"http://hooks.test:{receiver.port}/hook")
        msg = (await app.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
        await app._deliverer.deliver(msg, ep.id)
        assert asked == ["hooks.test"]
        assert receiver.requests[0].headers["host"] == f"hooks.test:{receiver.port}"
        verify(ep.secret, receiver.requests[0])


async def test_a_rotated_secret_signs_alongside_the_old_one_during_the_grace_period(
        wapp: App, receiver: Receiver, sql: psycopg.Connection[Any]) -> None:
    ep, msg = await _one(wapp, receiver)
    rotated = await wapp.webhooks.rotate_secret(ep.id, grace_s=3600)
    assert rotated.secret is not None
    assert rotated.secret != ep.secret
    assert rotated.valid_secrets == 2
    await wapp._deliverer.deliver(msg, ep.id)
    [request] = receiver.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    verify(ep.secret, request)
    verify(rotated.secret, request)

    sql.execute("UPDATE notifyq.webhook_secret SET expires_at = now() - interval '1 second' "
                "WHERE expires_at IS NOT NULL")  # the grace period is over
    second = (await wapp.webhooks.send("order.paid", {"n": 2}, endpoint_id=ep.id)).id
    await wapp._deliverer.deliver(second, ep.id)
    request = receiver.requests[1]
    assert len(request.headers["webhook-signature"].split(" ")) == 1
    verify(rotated.secret, request)
    from standardwebhooks.webhooks import WebhookVerificationError
    with pytest.raises(WebhookVerificationError):
        verify(ep.secret, request)


async def test_secrets_are_stored_encrypted_and_shown_only_at_creation(
        wapp: App, sql: psycopg.Connection[Any], receiver: Receiver) -> None:
    from notifyq._webhooks.signing import generate_secret

    given = generate_secret(48)
    ep = await wapp.webhooks.create_endpoint(receiver.url(), secret=given)
    assert ep.secret == given
    blob = sql.execute("SELECT ciphertext FROM notifyq.webhook_secret").fetchone()
    assert blob is not None
    assert given.encode() not in bytes(blob[0])
    assert given[6:].encode() not in bytes(blob[0])
    again = await wapp.webhooks.get_endpoint(ep.id)
    assert again.secret is None
    assert "secret" not in again.to_json()
    assert given not in repr(again)
    listed = await wapp.webhooks.list_endpoints()
    assert [e.secret for e in listed] == [None]


async def test_an_endpoint_failing_for_the_configured_period_is_disabled_and_a_success_resets(
        dsn: str, receiver: Receiver) -> None:
    clock = ManualClock(datetime.now(UTC))
    app = App(settings=webhook_settings(dsn, retry_schedule_s=[0] * 20,
                                        disable_after_s=3600.0), clock=clock)
    async with app:
        ep = await app.webhooks.create_endpoint(receiver.url())

        async def attempt(status: int) -> None:
            receiver.script("/hook", Reply(status))
            msg = (await app.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
            if status < 300:
                await app._deliverer.deliver(msg, ep.id)
            else:
                with pytest.raises(Snooze):
                    await app._deliverer.deliver(msg, ep.id)

        await attempt(500)
        started = (await app.webhooks.get_endpoint(ep.id)).failing_since
        assert started == clock.now()
        clock.advance(timedelta(minutes=59))
        await attempt(500)
        assert (await app.webhooks.get_endpoint(ep.id)).failing_since == started
        await attempt(200)  # one success resets the streak
        assert (await app.webhooks.get_endpoint(ep.id)).failing_since is None

        clock.advance(timedelta(minutes=1))
        await attempt(500)
        clock.advance(timedelta(minutes=59))
        await attempt(500)
        assert (await app.webhooks.get_endpoint(ep.id)).enabled
        clock.advance(timedelta(minutes=1))
        receiver.script("/hook", Reply(500))
        msg = (await app.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
        with pytest.raises(Permanent, match="endpoint disabled"):
            await app._deliverer.deliver(msg, ep.id)
        endpoint = await app.webhooks.get_endpoint(ep.id)
        assert not endpoint.enabled
        assert (endpoint.disabled_reason or "").startswith("failing continuously since")
        enabled = await app.webhooks.enable_endpoint(ep.id)
        assert enabled.enabled
        assert enabled.failing_since is None


async def test_no_secret_or_signature_appears_in_any_log_line(
        wapp: App, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    receiver.script("/hook", Reply(500), Reply(410))
    ep, msg = await _one(wapp, receiver)
    with pytest.raises(Snooze):
        await wapp._deliverer.deliver(msg, ep.id)
    rotated = await wapp.webhooks.rotate_secret(ep.id)
    with pytest.raises(Permanent):
        await wapp._deliverer.deliver(msg, ep.id)
    signatures = [s for r in receiver.requests for s in r.headers["webhook-signature"].split()]
    text = "\n".join(r.getMessage() + repr(r.args) + repr(r.__dict__) for r in caplog.records)
    assert caplog.records  # something was logged
    assert "whsec_" not in text
    for secret in (ep.secret, rotated.secret):
        assert secret is not None
        assert secret[6:] not in text
    for signature in signatures:
        assert signature[3:] not in text
