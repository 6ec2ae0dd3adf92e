"""Issue 12, item 5: endpoint settings the transport cannot send are refused when written, and an
endpoint stored before that check (or any other delivery-time error no retry can fix) ends its
delivery at once, recorded as an attempt, inside the webhook schedule. Real PostgreSQL, the
admin API over ASGI, a real worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from notifyq import App
from notifyq._api.app import ServiceState, create_api
from notifyq._errors import InvalidEndpoint
from tests.integration.inproc import fetch, running, scalar
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.conftest import webhook_settings

pytestmark = pytest.mark.anyio
ADMIN = "admin-token-for-settings-tests-0123"
# What the issue found accepted with 201 and then crashing the delivery, and its neighbours.
BAD_HEADERS = [{"X-Team": "a\u2603"}, {"X-Team": "caf\u00e9"}, {"X-Team": "a\x01b"},
               {"X-Team": "a\x7fb"}]
BAD_URLS = ["http://[v1.fe]/", "http://[::1%25eth0]/"]


@pytest.fixture
async def api(dsn: str) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    base = webhook_settings(dsn)
    app = App(settings=base.model_copy(update={
        "api": base.api.model_copy(update={"admin_token": SecretStr(ADMIN)})}))
    async with app:
        transport = httpx.ASGITransport(app=create_api(app, ServiceState()))
        async with httpx.AsyncClient(transport=transport, base_url="http://api",
                                     headers={"authorization": f"Bearer {ADMIN}"}) as client:
            yield app, client


@pytest.mark.parametrize("headers", BAD_HEADERS)
async def test_a_header_value_the_transport_cannot_send_is_refused_on_create_and_update(
        api: tuple[App, httpx.AsyncClient], headers: dict[str, str]) -> None:
    app, client = api
    created = await client.post("/v1/webhooks/endpoints",
                                json={"url": "https://example.com/h", "headers": headers})
    assert created.status_code == 422, created.text
    assert created.json()["field"] == "headers"
    assert "X-Team" in created.json()["detail"]
    ok = await client.post("/v1/webhooks/endpoints", json={"url": "https://example.com/h"})
    patched = await client.patch(f"/v1/webhooks/endpoints/{ok.json()['id']}",
                                 json={"headers": headers})
    assert patched.status_code == 422, patched.text
    with pytest.raises(InvalidEndpoint, match="headers"):
        await app.webhooks.create_endpoint("https://example.com/h", headers=headers)
    # What the transport does send is still accepted: the check is not a blanket refusal.
    fine = await client.post("/v1/webhooks/endpoints", json={
        "url": "https://[2606:4700::1111]:8443/h?a=b%20c#x",
        "headers": {"Authorization": "Bearer a.b-c_d~e+f/g=", "X-Tab": "a\tb", "X-Empty": ""}})
    assert fine.status_code == 201, fine.text


@pytest.mark.parametrize("url", BAD_URLS)
async def test_a_url_the_transport_cannot_send_to_is_refused_on_create_and_update(
        api: tuple[App, httpx.AsyncClient], url: str) -> None:
    app, client = api
    created = await client.post("/v1/webhooks/endpoints", json={"url": url})
    assert created.status_code == 422, created.text
    assert created.json()["field"] == "url"
    ok = await client.post("/v1/webhooks/endpoints", json={"url": "https://example.com/h"})
    patched = await client.patch(f"/v1/webhooks/endpoints/{ok.json()['id']}",
                                 json={"url": url})
    assert patched.status_code == 422, patched.text
    with pytest.raises(InvalidEndpoint, match="url"):
        await app.webhooks.create_endpoint(url)




STORED = {
    "header": ("UPDATE notifyq.webhook_endpoint SET headers = %s::jsonb, header_values = NULL "
               "WHERE id = %s", '{"X-Team": "a\u2603"}'),
    "url": ("UPDATE notifyq.webhook_endpoint SET url = %s WHERE id = %s", "http://[v1.fe]/"),
}


@pytest.mark.parametrize("what", sorted(STORED))
async def test_a_stored_endpoint_that_cannot_be_sent_fails_its_delivery_at_once_as_an_attempt(
        dsn: str, receiver: Receiver, what: str) -> None:
    # An endpoint written before the write-time check (headers still in clear, as before 0014,
    # or a URL the old check let through) reaches the worker as it is stored.
    app = App(settings=webhook_settings(dsn))
    async with app:
        ep = await app.webhooks.create_endpoint(receiver.url())
        query, value = STORED[what]
        await fetch(app, query + " RETURNING id", value, ep.id)
        sent = await app.webhooks.send("order.paid", {"n": 1}, endpoint_id=ep.id)
        run_id = await scalar(app, "SELECT run_id FROM notifyq.webhook_delivery "
                                   "WHERE message_id = %s", sent.id)
        async with running(app, pools=["webhooks"]):
            async def failed() -> dict[str, Any]:
                [run] = await fetch(app, "SELECT * FROM notifyq.job_run WHERE id = %s", run_id)
                assert run["status"] == "failed", run
                return run
            run = await eventually(failed, timeout=15)
        [attempt] = await app.webhooks.attempts(sent.id)
        delivery = (await app.webhooks.message(sent.id))["deliveries"][0]
        endpoint = await app.webhooks.get_endpoint(ep.id)
    assert run["attempts"] == 1  # no generic retries
    assert run["error"]["retryable"] is False
    assert attempt["error_kind"] == "invalid"
    assert attempt["status_code"] is None
    assert attempt["next_attempt_at"] is None
    assert delivery["status"] == "failed"
    assert delivery["attempts"] == 1
    assert endpoint.failing_since is not None
    assert receiver.requests == []
