"""Ordered endpoints and give-up over the admin API (in process, over ASGI, with its OpenAPI
document; tenant-limited tokens on a real ``notifyq serve``) and the ``notifyq webhooks``
commands (real processes). What ordering does to
deliveries: tests/webhooks/test_ordered.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from notifyq import App
from tests import vault
from tests.integration.serving import Served
from tests.receiver import Receiver
from tests.security.test_tenants import TENANT_A, TENANT_B, TOKENS, URL
from tests.webhooks.test_api_cli import _cli, api  # noqa: F401 - the api fixture

pytestmark = pytest.mark.anyio


async def test_an_endpoint_is_created_ordered_and_patched_back_over_the_api(
        api: tuple[App, httpx.AsyncClient], receiver: Receiver) -> None:  # noqa: F811
    app, client = api
    created = await client.post("/v1/webhooks/endpoints", json={
        "url": receiver.url(), "ordered": True})
    assert created.status_code == 201, created.text
    endpoint = created.json()
    assert endpoint["ordered"] is True
    assert (await app.webhooks.get_endpoint(endpoint["id"])).ordered
    got = await client.get(f"/v1/webhooks/endpoints/{endpoint['id']}")
    assert got.json()["ordered"] is True
    patched = await client.patch(f"/v1/webhooks/endpoints/{endpoint['id']}",
                                 json={"ordered": False})
    assert (patched.status_code, patched.json()["ordered"]) == (200, False)
    described = await client.patch(f"/v1/webhooks/endpoints/{endpoint['id']}",
                                   json={"description": "left as it was"})
    assert described.json()["ordered"] is False
    bad = await client.patch(f"/v1/webhooks/endpoints/{endpoint['id']}",
                             json={"ordered": "sometimes"})
    assert bad.status_code == 422
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert "ordered" in bad.text

    schema = (await client.get("/v1/openapi.json")).json()
    models = schema["components"]["schemas"]
    for model in ("EndpointIn", "EndpointPatch", "EndpointOut"):
        assert "ordered" in models[model]["properties"], model
    assert "post" in schema["paths"]["/v1/webhooks/messages/{id}/give-up"]


async def test_a_pending_delivery_is_given_up_over_the_api_once(
        api: tuple[App, httpx.AsyncClient], receiver: Receiver) -> None:  # noqa: F811
    app, client = api
    endpoint = await app.webhooks.create_endpoint(receiver.url(), ordered=True)
    sent = await app.webhooks.send("order.paid", {"id": 1})
    path = f"/v1/webhooks/messages/{sent.id}/give-up"
    given = await client.post(path, json={"endpoint_id": str(endpoint.id), "reason": "poison"})
    assert given.status_code == 200, given.text
    assert given.json()["message_id"] == sent.id
    delivery = (await app.webhooks.message(sent.id))["deliveries"][0]
    assert (delivery["status"], delivery["last_error"]) == ("failed", "poison")
    assert str(delivery["run_id"]) == given.json()["run_id"]
    again = await client.post(path, json={"endpoint_id": str(endpoint.id)})
    assert again.status_code == 409
    assert again.headers["content-type"].startswith("application/problem+json")
    assert "only a pending one can be given up" in again.json()["detail"]
    unknown = await client.post(path, json={"endpoint_id": "01a22cc2-1f7d-734a-8591-82be1a967c79"})
    assert unknown.status_code == 404
    missing = await client.post(path, json={})
    assert missing.status_code == 422


def test_the_commands_add_update_list_and_give_up_an_ordered_endpoint(
        dsn: str, receiver: Receiver) -> None:
    added = _cli(dsn, "endpoints", "add", receiver.url(), "--ordered", "--json")
    assert added.returncode == 0, added.stderr
    endpoint: dict[str, Any] = json.loads(added.stdout)
    assert endpoint["ordered"] is True
    listed = _cli(dsn, "endpoints", "list")
    assert f"{endpoint['id']}  enabled, ordered  *  {receiver.url()}" in listed.stdout
    off = _cli(dsn, "endpoints", "update", endpoint["id"], "--no-ordered")
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == (f"updated endpoint {endpoint['id']} ({receiver.url()}), "
                                  "not ordered")
    on = _cli(dsn, "endpoints", "update", endpoint["id"], "--ordered", "--json")
    assert json.loads(on.stdout)["ordered"] is True
    message_id = _cli(dsn, "send", "order.paid", "--payload", "{}").stdout.strip()
    given = _cli(dsn, "give-up", message_id, "--endpoint", endpoint["id"], "--reason", "stuck")
    assert given.returncode == 0, given.stderr
    assert given.stdout.startswith(f"gave up the delivery of message {message_id} to endpoint "
                                   f"{endpoint['id']}: it failed (stuck) and its run ")
    again = _cli(dsn, "give-up", message_id, "--endpoint", endpoint["id"])
    assert again.returncode == 1
    assert "is failed: only a pending one can be given up" in again.stderr


def test_a_tenant_token_gives_up_only_its_tenants_deliveries(
        tenant_served: Served) -> None:
    with tenant_served.client(TENANT_A) as a, tenant_served.client(TENANT_B) as b:
        mine = a.post("/v1/webhooks/endpoints", json={"url": URL, "ordered": True}).json()
        theirs = b.post("/v1/webhooks/endpoints", json={"url": URL, "ordered": True}).json()
        assert (mine["ordered"], mine["tenant_id"]) == (True, "a")
        sent_a = a.post("/v1/webhooks/messages", json={
            "event_type": "order.paid", "payload": {}, "endpoint_id": mine["id"]}).json()["id"]
        sent_b = b.post("/v1/webhooks/messages", json={
            "event_type": "order.paid", "payload": {}, "endpoint_id": theirs["id"]}).json()["id"]
        for message, endpoint in ((sent_b, theirs), (sent_a, theirs), (sent_b, mine)):
            refused = a.post(f"/v1/webhooks/messages/{message}/give-up",
                             json={"endpoint_id": endpoint["id"]})
            assert refused.status_code == 404, (message, endpoint["id"], refused.text)
        given = a.post(f"/v1/webhooks/messages/{sent_a}/give-up",
                       json={"endpoint_id": mine["id"]})
        assert given.status_code == 200, given.text
        assert b.post(f"/v1/webhooks/messages/{sent_b}/give-up",
                      json={"endpoint_id": theirs["id"]}).status_code == 200


@pytest.fixture
def tenant_served(dsn: str, logs: Path) -> Iterator[Served]:
    """``notifyq serve`` without a worker, with tenant-limited tokens (tests/security)."""
    env = {"NOTIFYQ_API__TOKENS": json.dumps(TOKENS), **vault.keys_env(1, active=1)}
    with Served(dsn, logs / "serve.log", env=env, args=["--no-worker"]) as server:
        yield server
