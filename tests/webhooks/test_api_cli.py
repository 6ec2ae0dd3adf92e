"""The admin API's /v1/webhooks routes (in process, over ASGI) and the ``notifyq webhooks``
commands (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from notifyq import App
from notifyq._api.app import ServiceState, create_api
from tests import vault
from tests.integration.inproc import running
from tests.receiver import Receiver
from tests.support import ROOT, eventually
from tests.webhooks.conftest import deliverer, verify, webhook_settings

pytestmark = pytest.mark.anyio
ADMIN = "admin-token-for-webhook-tests-0123"
READER = "read-token-for-webhook-tests-01234"


@pytest.fixture
async def api(dsn: str) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    settings = webhook_settings(dsn).model_copy(update={"api": webhook_settings(
        dsn).api.model_copy(update={"admin_token": _secret(ADMIN), "read_token": _secret(READER)})})
    app = App(settings=settings)
    async with app:
        state = ServiceState()
        deliverer(app).observer = state.metrics.webhook_attempt  # as `notifyq serve` does
        transport = httpx.ASGITransport(app=create_api(app, state))
        async with httpx.AsyncClient(transport=transport, base_url="http://api",
                                     headers={"authorization": f"Bearer {ADMIN}"}) as client:
            yield app, client


def _secret(value: str) -> Any:
    from pydantic import SecretStr
    return SecretStr(value)


async def test_endpoints_messages_attempts_and_resend_work_over_the_admin_api(
        api: tuple[App, httpx.AsyncClient], receiver: Receiver) -> None:
    app, client = api
    created = await client.post("/v1/webhooks/endpoints", json={
        "url": receiver.url(), "event_types": ["order.paid"], "headers": {"X-Team": "b"}})
    assert created.status_code == 201, created.text
    endpoint = created.json()
    secret = endpoint["secret"]
    assert secret.startswith("whsec_")
    got = await client.get(f"/v1/webhooks/endpoints/{endpoint['id']}")
    assert got.status_code == 200
    assert "secret" not in got.json() or got.json()["secret"] is None
    listed = await client.get("/v1/webhooks/endpoints",
                              headers={"authorization": f"Bearer {READER}"})
    assert [e["id"] for e in listed.json()["items"]] == [endpoint["id"]]
    assert secret not in listed.text

    sent = await client.post("/v1/webhooks/messages", json={
        "event_type": "order.paid", "payload": {"id": 5}, "idempotency_key": "o5"})
    assert sent.status_code == 201, sent.text
    again = await client.post("/v1/webhooks/messages", json={
        "event_type": "order.paid", "payload": {"id": 5}, "idempotency_key": "o5"})
    assert (again.status_code, again.json()["id"]) == (200, sent.json()["id"])
    message_id = sent.json()["id"]
    async with running(app):
        await eventually(lambda: _received(receiver, 1))
        resent = await client.post(f"/v1/webhooks/messages/{message_id}/resend")
        assert resent.status_code == 202, resent.text
        await eventually(lambda: _received(receiver, 2))

        async def two_attempts() -> Any:
            attempts = await client.get(f"/v1/webhooks/messages/{message_id}/attempts")
            items = attempts.json()["items"]
            assert [a["trigger"] for a in items] == ["scheduled", "manual"], items
            return items
        await eventually(two_attempts)
    for request in receiver.requests:
        verify(secret, request)
    metrics = await client.get("/metrics")
    assert 'notifyq_webhook_attempts_total{outcome="2xx"} 2.0' in metrics.text
    message = await client.get(f"/v1/webhooks/messages/{message_id}")
    assert message.json()["deliveries"][0]["status"] == "succeeded"

    rotated = await client.post(f"/v1/webhooks/endpoints/{endpoint['id']}/rotate-secret",
                                json={"grace_s": 60})
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["secret"] not in (None, secret)
    assert rotated.json()["valid_secrets"] == 2
    patched = await client.patch(f"/v1/webhooks/endpoints/{endpoint['id']}",
                                 json={"enabled": False, "description": "paused"})
    assert (patched.json()["enabled"], patched.json()["description"]) == (False, "paused")
    recovered = await client.post(f"/v1/webhooks/endpoints/{endpoint['id']}/recover",
                                  json={"since": "2020-01-01T00:00:00Z"})
    assert recovered.json() == {"recovered": 0, "items": []}
    deleted = await client.delete(f"/v1/webhooks/endpoints/{endpoint['id']}")
    assert deleted.status_code == 204
    gone = await client.get(f"/v1/webhooks/endpoints/{endpoint['id']}")
    assert gone.status_code == 404
    assert gone.headers["content-type"].startswith("application/problem+json")


async def _received(receiver: Receiver, n: int) -> None:
    assert len(receiver.requests) == n


async def test_bad_webhook_requests_get_problem_json_naming_the_field(
        api: tuple[App, httpx.AsyncClient]) -> None:
    _, client = api
    cases = [
        ({"url": "ftp://example.com/"}, "url"),
        ({"url": "http://10.0.0.1/"}, "url"),
        ({"url": "https://example.com/", "headers": {"Webhook-Id": "x"}}, "headers"),
        ({"url": "https://example.com/", "secret": "nope"}, "secret"),
    ]
    for body, field in cases:
        answer = await client.post("/v1/webhooks/endpoints", json=body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == field
    bad_send = await client.post("/v1/webhooks/messages",
                                 json={"event_type": "bad type", "payload": {}})
    assert bad_send.status_code == 422
    nul = await client.post("/v1/webhooks/messages",
                            json={"event_type": "a.b", "payload": {"x": "\u0000"}})
    assert nul.status_code == 422
    read_only = await client.post("/v1/webhooks/messages", json={"event_type": "a.b",
                                                                 "payload": {}},
                                  headers={"authorization": f"Bearer {READER}"})
    assert read_only.status_code == 403
    missing = await client.get("/v1/webhooks/messages/msg_nothing")
    assert missing.status_code == 404


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")},
           "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_KEYS": f"1:{vault.b64(vault.KEY1)}",
           "NOTIFYQ_ACTIVE_KEY_VERSION": "1", "NOTIFYQ_LOG_LEVEL": "WARNING",
           "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}
    return subprocess.run([sys.executable, "-m", "notifyq", "webhooks", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_the_webhooks_commands_add_list_send_show_attempts_rotate_and_disable(
        dsn: str, receiver: Receiver) -> None:
    added = _cli(dsn, "endpoints", "add", receiver.url(), "--event-type", "order.paid",
                 "--header", "X-Team: billing", "--json")
    assert added.returncode == 0, added.stderr
    endpoint = json.loads(added.stdout)
    assert endpoint["secret"].startswith("whsec_")
    listed = _cli(dsn, "endpoints", "list")
    assert endpoint["id"] in listed.stdout
    assert "whsec_" not in listed.stdout
    sent = _cli(dsn, "send", "order.paid", "--payload", '{"id": 9}')
    assert sent.returncode == 0, sent.stderr
    message_id = sent.stdout.strip()
    assert message_id.startswith("msg_")
    none = _cli(dsn, "attempts", message_id)
    assert none.stdout.strip() == (f"no attempts\n\nendpoint {endpoint['id']}: pending, no "
                                   "scheduled attempt yet (at most 8)")
    rotated = _cli(dsn, "endpoints", "rotate-secret", endpoint["id"], "--grace-s", "60")
    assert rotated.returncode == 0, rotated.stderr
    assert "whsec_" in rotated.stdout
    disabled = _cli(dsn, "endpoints", "disable", endpoint["id"], "--reason", "maintenance")
    assert disabled.stdout.startswith(f"disabled endpoint {endpoint['id']} ")
    assert ": maintenance; its pending deliveries are canceled" in disabled.stdout
    refused = _cli(dsn, "endpoints", "add", "http://169.254.169.254/")
    assert refused.returncode == 1
    assert refused.stderr.startswith("notifyq: error: url: 169.254.169.254 is link-local")
    missing = _cli(dsn, "endpoints", "disable", "01a22cc2-1f7d-734a-8591-82be1a967c79")
    assert missing.returncode == 1
    assert "no webhook endpoint" in missing.stderr


def test_endpoints_add_with_a_tenant(dsn: str, sql: Any, receiver: Receiver) -> None:
    added = _cli(dsn, "endpoints", "add", receiver.url(), "--tenant", "acme", "--json")
    assert added.returncode == 0, added.stderr
    endpoint = json.loads(added.stdout)
    assert endpoint["tenant_id"] == "acme"
    [(tenant,)] = sql.execute("SELECT tenant_id FROM notifyq.webhook_endpoint WHERE id = %s",
                              [endpoint["id"]]).fetchall()
    assert tenant == "acme"
