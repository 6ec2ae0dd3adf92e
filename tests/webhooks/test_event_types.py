"""Issue 34 item 5: the event-type catalog. Types with a description and an optional JSON
Schema; once the catalog holds a type, sends of unknown types and endpoints subscribing to them
are refused (unless ``webhooks.allow_unknown_event_types``), payloads are checked against their
type's schema, and nothing of a refused batch is written. From Python, over real HTTP (a
``notifyq serve`` process, tenant tokens included) and from the CLI (real processes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifyq import App
from notifyq._errors import InvalidEndpoint, InvalidEnqueue, WebhookNotFound
from notifyq._webhooks.catalog import CATALOG_TTL_S
from notifyq._webhooks.service import WebhookMessage
from tests import vault
from tests.integration.serving import ADMIN, READER, Served
from tests.receiver import Receiver
from tests.webhooks.conftest import webhook_settings
from tests.webhooks.test_api_cli import _cli

pytestmark = pytest.mark.anyio
ORDER = {"type": "object", "required": ["id"], "additionalProperties": False,
         "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}


def _count(sql: psycopg.Connection[Any], table: str) -> int:
    row = sql.execute(f"SELECT count(*) FROM notifyq.{table}").fetchone()
    assert row is not None
    return int(row[0])


async def test_an_empty_catalog_refuses_nothing_and_a_defined_type_is_enforced(
        wapp: App, receiver: Receiver, sql: psycopg.Connection[Any]) -> None:
    anything = await wapp.webhooks.send("anything.goes", {"x": 1})
    assert anything.created
    defined = await wapp.webhooks.define_event_type("order.paid", description="An order was paid",
                                                    schema=ORDER)
    assert (defined.name, defined.description, defined.schema) == (
        "order.paid", "An order was paid", ORDER)
    await wapp.webhooks.define_event_type("order.shipped")  # no schema: any JSON
    assert [t.name for t in await wapp.webhooks.event_types()] == ["order.paid", "order.shipped"]

    endpoint = await wapp.webhooks.create_endpoint(receiver.url(), event_types=["order.paid"])
    sent = await wapp.webhooks.send("order.paid", {"id": 7, "note": "ok"})
    assert sent.deliveries == 1
    assert (await wapp.webhooks.send("order.shipped", ["free", "form"])).created
    messages = _count(sql, "webhook_message")

    with pytest.raises(InvalidEnqueue, match=r"^event_type 'order.lost' is not in the "
                                             r"event-type catalog \(define it"):
        await wapp.webhooks.send("order.lost", {"id": 1})
    with pytest.raises(InvalidEnqueue, match=r"^payload does not match the schema of "
                                             r"'order.paid': at id: 'seven' is not of type "
                                             r"'integer'"):
        await wapp.webhooks.send("order.paid", {"id": "seven"})
    with pytest.raises(InvalidEnqueue, match=r"at \(top\): 'id' is a required property"):
        await wapp.webhooks.send("order.paid", {"note": "no id"})
    with pytest.raises(InvalidEnqueue, match=r"^message 3: payload does not match"):
        await wapp.webhooks.send_many([("order.paid", {"id": 1}), ("order.shipped", {}),
                                       WebhookMessage("order.paid", {"id": 2, "extra": 1})])
    with pytest.raises(InvalidEnqueue, match=r"^message 2: event_type 'nope' is not"):
        await wapp.webhooks.send_many([("order.paid", {"id": 1}), ("nope", {})])
    assert _count(sql, "webhook_message") == messages  # nothing of a refused batch
    assert _count(sql, "webhook_delivery") == 1

    with pytest.raises(InvalidEndpoint, match=r"^event_types: 'order.lost' not in the "
                                              r"event-type catalog"):
        await wapp.webhooks.create_endpoint(receiver.url(), event_types=["order.paid",
                                                                         "order.lost"])
    with pytest.raises(InvalidEndpoint, match=r"'order\.lost' not in the event-type catalog"):
        await wapp.webhooks.update_endpoint(endpoint.id, event_types=["order.lost"])
    every = await wapp.webhooks.create_endpoint(receiver.url())  # every type: always allowed
    assert every.event_types is None

    await wapp.webhooks.delete_event_type("order.shipped")
    with pytest.raises(InvalidEnqueue, match=r"'order\.shipped' is not in the event-type"):
        await wapp.webhooks.send("order.shipped", {})
    with pytest.raises(WebhookNotFound, match=r"no event type 'order\.shipped' in the catalog"):
        await wapp.webhooks.delete_event_type("order.shipped")


async def test_bad_definitions_are_refused_with_what_is_wrong(wapp: App) -> None:
    with pytest.raises(InvalidEndpoint, match=r"^schema: not a valid JSON Schema at type: "):
        await wapp.webhooks.define_event_type("a.b", schema={"type": "integr"})
    with pytest.raises(InvalidEndpoint, match=r"^schema: the schema of 'a.b' must be a JSON "
                                              r"object"):
        await wapp.webhooks.define_event_type("a.b", schema=[1])  # type: ignore[arg-type]
    with pytest.raises(InvalidEndpoint, match=r"^event_types: 'a b' must match"):
        await wapp.webhooks.define_event_type("a b")
    with pytest.raises(InvalidEndpoint, match=r"^description: at most"):
        await wapp.webhooks.define_event_type("a.b", description="x" * 5000)
    # What schemathesis sent: a key with an unpaired surrogate, which jsonb cannot hold (a 500).
    with pytest.raises(InvalidEndpoint, match=r"^schema: cannot be stored, it holds an unpaired"):
        await wapp.webhooks.define_event_type("a.b", schema={"\ud95a]": {}})
    assert await wapp.webhooks.event_types() == []


async def test_allowing_unknown_types_still_checks_the_schemas_of_known_ones(
        dsn: str, receiver: Receiver) -> None:
    async with App(settings=webhook_settings(dsn, allow_unknown_event_types=True)) as app:
        await app.webhooks.define_event_type("order.paid", schema=ORDER)
        assert (await app.webhooks.send("not.cataloged", {"x": 1})).created
        await app.webhooks.create_endpoint(receiver.url(), event_types=["not.cataloged"])
        with pytest.raises(InvalidEnqueue, match=r"does not match the schema of 'order\.paid'"):
            await app.webhooks.send("order.paid", {"id": None})


async def test_another_process_s_definition_is_seen_within_the_ttl(dsn: str) -> None:
    now = [1000.0]
    async with App(settings=webhook_settings(dsn)) as sender, \
            App(settings=webhook_settings(dsn)) as admin:
        sender.webhooks._catalog._clock = lambda: now[0]  # the one thing mocked: the clock
        assert (await sender.webhooks.send("x.y", {})).created  # the catalog is read: empty
        await admin.webhooks.define_event_type("order.paid")
        now[0] += CATALOG_TTL_S / 2
        assert (await sender.webhooks.send("x.y", {})).created  # its copy is still fresh
        now[0] += CATALOG_TTL_S / 2
        with pytest.raises(InvalidEnqueue, match=r"'x\.y' is not in the event-type catalog"):
            await sender.webhooks.send("x.y", {})


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    tokens = [{"name": "acme", "token": "acme-admin-token-0123456789abc", "scopes": ["admin"],
               "tenants": ["acme"]}]
    env = {"NOTIFYQ_API__TOKENS": json.dumps(tokens), **vault.keys_env(1, active=1)}
    with Served(dsn, logs / "serve.log", env=env, args=["--no-worker"]) as server:
        yield server


def test_the_catalog_over_http(served: Served) -> None:
    with served.client(ADMIN) as admin:
        put = admin.put("/v1/webhooks/event-types/order.paid",
                        json={"description": "An order was paid", "schema": ORDER})
        assert put.status_code == 200, put.text
        assert put.json()["schema"] == ORDER
        bad = admin.put("/v1/webhooks/event-types/order.paid",
                        json={"schema": {"type": "integr"}})
        assert bad.status_code == 422
        assert bad.json()["field"] == "schema"
        assert bad.json()["detail"].startswith("schema: not a valid JSON Schema at type")
        refused = admin.post("/v1/webhooks/messages", json={"event_type": "order.paid",
                                                            "payload": {"id": "x"}})
        assert refused.status_code == 422
        assert "does not match the schema of 'order.paid'" in refused.json()["detail"]
        unknown = admin.post("/v1/webhooks/messages/batch", json={"messages": [
            {"event_type": "order.paid", "payload": {"id": 1}},
            {"event_type": "who.knows", "payload": {}}]})
        assert unknown.status_code == 422
        assert unknown.json()["detail"].startswith("message 2: event_type 'who.knows' is not")
        assert admin.post("/v1/webhooks/messages", json={
            "event_type": "order.paid", "payload": {"id": 1}}).status_code == 201
    with served.client(READER) as reader:
        listed = reader.get("/v1/webhooks/event-types")
        assert listed.status_code == 200
        assert [(t["name"], t["description"]) for t in listed.json()["items"]] == [
            ("order.paid", "An order was paid")]
        assert reader.put("/v1/webhooks/event-types/a.b", json={}).status_code == 403
    with served.client("acme-admin-token-0123456789abc") as tenant:
        assert tenant.get("/v1/webhooks/event-types").json()["items"][0]["name"] == "order.paid"
        for answer in (tenant.put("/v1/webhooks/event-types/a.b", json={}),
                       tenant.delete("/v1/webhooks/event-types/order.paid")):
            assert answer.status_code == 403
            assert "limited to tenants" in answer.json()["detail"]
    with served.client(ADMIN) as admin:
        assert admin.delete("/v1/webhooks/event-types/order.paid").status_code == 204
        assert admin.delete("/v1/webhooks/event-types/order.paid").status_code == 404
        assert admin.get("/v1/webhooks/event-types").json() == {"items": []}


def test_the_catalog_from_the_cli(dsn: str, tmp_path: Path) -> None:
    schema = tmp_path / "order.json"
    schema.write_text(json.dumps(ORDER))
    defined = _cli(dsn, "event-types", "define", "order.paid", "--description", "Paid",
                   "--schema", str(schema))
    assert defined.returncode == 0, defined.stderr
    assert defined.stdout.strip() == "defined event type order.paid (with a schema)"
    listed = _cli(dsn, "event-types", "list", "--json")
    assert [(t["name"], t["schema"]) for t in json.loads(listed.stdout)] == [("order.paid", ORDER)]
    refused = _cli(dsn, "send", "order.paid", "--payload", '{"id": "x"}')
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "notifyq: error: payload does not match the schema of 'order.paid': at id: 'x' is not "
        "of type 'integer'"]
    not_json = _cli(dsn, "event-types", "define", "a.b", "--schema", "{nope")
    assert not_json.returncode == 1
    assert not_json.stderr.startswith("notifyq: error: --schema is not JSON")
    deleted = _cli(dsn, "event-types", "delete", "order.paid")
    assert deleted.stdout.strip() == "deleted event type order.paid from the catalog"
    assert _cli(dsn, "event-types", "list").stdout.strip().startswith("no event types")
