"""Issue 12, item 3: receiver credentials in endpoint headers are encrypted with the keyring,
re-encrypted by key rotation, shown masked to every token, and sent in full only to the
receiver. Real PostgreSQL, the admin API over ASGI, a receiver on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb
from pydantic import SecretStr

from notifyq import App
from notifyq._api.app import ServiceState, create_api
from notifyq._keys.reencrypt import ReencryptOptions, Reencryptor
from notifyq._webhooks.headers import MASK
from tests import vault
from tests.integration.inproc import running
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.conftest import webhook_settings

pytestmark = pytest.mark.anyio
Sql = psycopg.Connection[Any]
ADMIN = "admin-token-for-security-tests-0123"
READER = "read-token-for-security-tests-01234"
BEARER = "Bearer rcv-credential-5f1e9a0c"


def _app(dsn: str, *versions: int, active: int = 1) -> App:
    base = webhook_settings(dsn)
    return App(settings=base.model_copy(update={
        "keys": SecretStr(vault.keys_env(*versions, active=active)["NOTIFYQ_KEYS"]),
        "active_key_version": active,
        "api": base.api.model_copy(update={"admin_token": SecretStr(ADMIN),
                                            "read_token": SecretStr(READER)})}))


@pytest.fixture
async def api(dsn: str) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    app = _app(dsn, 1)
    async with app:
        transport = httpx.ASGITransport(app=create_api(app, ServiceState()))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield app, client


def _auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_header_values_are_stored_encrypted_and_returned_masked_to_every_token(
        api: tuple[App, httpx.AsyncClient], sql: Sql) -> None:
    app, client = api
    created = await client.post("/v1/webhooks/endpoints", headers=_auth(ADMIN), json={
        "url": "https://example.com/h", "headers": {"Authorization": BEARER, "X-Team": "b"}})
    assert created.status_code == 201, created.text
    endpoint_id = created.json()["id"]
    assert created.json()["headers"] == {"Authorization": MASK, "X-Team": MASK}
    for token in (READER, ADMIN):
        one = await client.get(f"/v1/webhooks/endpoints/{endpoint_id}", headers=_auth(token))
        listed = await client.get("/v1/webhooks/endpoints", headers=_auth(token))
        assert one.json()["headers"] == {"Authorization": MASK, "X-Team": MASK}
        assert BEARER not in one.text + listed.text
    row = sql.execute("SELECT headers::text, header_values FROM notifyq.webhook_endpoint"
                      ).fetchone()
    assert row is not None
    assert BEARER not in row[0]
    assert BEARER.encode() not in bytes(row[1])
    assert sql.execute("SELECT notifyq.key_version_of(header_values) FROM "
                       "notifyq.webhook_endpoint").fetchone() == (1,)
    assert repr(await app.webhooks.get_endpoint(endpoint_id)).count(BEARER) == 0


async def test_the_receiver_gets_the_full_value_and_a_masked_value_in_an_update_keeps_it(
        api: tuple[App, httpx.AsyncClient], receiver: Receiver) -> None:
    app, client = api
    created = await client.post("/v1/webhooks/endpoints", headers=_auth(ADMIN), json={
        "url": receiver.url(), "headers": {"Authorization": BEARER}})
    endpoint_id = created.json()["id"]
    patched = await client.patch(f"/v1/webhooks/endpoints/{endpoint_id}", headers=_auth(ADMIN),
                                 json={"headers": {"Authorization": MASK, "X-Extra": "1"}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["headers"] == {"Authorization": MASK, "X-Extra": MASK}
    bad = await client.patch(f"/v1/webhooks/endpoints/{endpoint_id}", headers=_auth(ADMIN),
                             json={"headers": {"X-New": MASK}})
    assert bad.status_code == 422
    assert "X-New is given masked" in bad.text
    await app.webhooks.send("a.b", {"n": 1}, endpoint_id=endpoint_id)
    async with running(app):
        async def delivered() -> None:
            assert len(receiver.requests) == 1
        await eventually(delivered)
    headers = receiver.requests[0].headers
    assert (headers["authorization"], headers["x-extra"]) == (BEARER, "1")


async def test_key_rotation_re_encrypts_header_values_and_delivery_still_sends_them(
        dsn: str, sql: Sql, receiver: Receiver) -> None:
    first = _app(dsn, 1)
    async with first:
        endpoint = await first.webhooks.create_endpoint(
            receiver.url(), headers={"Authorization": BEARER})
    second = _app(dsn, 1, 2, active=2)
    async with second:
        async with (await second.pool()).connection() as conn:
            run, _ = await second.keys.rotate(conn)
        out = await Reencryptor(second._runtime, second.keys).rotate(
            run.id, ReencryptOptions(target_version=2))
        columns = {c["column"]: c["reencrypted"] for c in out["columns"]}
        assert columns["notifyq.webhook_endpoint.header_values"] == 1
        assert sql.execute("SELECT notifyq.key_version_of(header_values) FROM "
                           "notifyq.webhook_endpoint").fetchone() == (2,)
        async with (await second.pool()).connection() as conn:
            await second.keys.retire(conn, 1)
        await second.webhooks.send("a.b", {"n": 2}, endpoint_id=endpoint.id)
        async with running(second):
            async def delivered() -> None:
                assert len(receiver.requests) == 1
            await eventually(delivered)
    assert receiver.requests[0].headers["authorization"] == BEARER


async def test_a_worker_seals_header_values_written_in_clear_before_the_migration(
        dsn: str, sql: Sql) -> None:
    sql.execute("INSERT INTO notifyq.webhook_endpoint (url, headers) VALUES (%s, %s)",
                ("https://example.com/h", Jsonb({"Authorization": BEARER})))
    app = _app(dsn, 1)
    async with app, running(app):
        async def sealed() -> None:
            row = sql.execute("SELECT headers, notifyq.key_version_of(header_values) "
                              "FROM notifyq.webhook_endpoint").fetchone()
            assert row == ({"Authorization": MASK}, 1)
        await eventually(sealed)
