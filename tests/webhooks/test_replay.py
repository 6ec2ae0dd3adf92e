"""Issue 34 item 1: replay what an endpoint missed. Messages sent while it was disabled (no
delivery), canceled when it was disabled, or sent before it subscribed reach it once, with a
dry-run count, a bound per call and `more`; nothing else is sent (other types, other endpoints'
messages, messages before `since`), and two replays at once never send a message twice. Real
worker, real receiver on 127.0.0.1, counts in SQL; over real HTTP and from the CLI."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from notifyq import App
from notifyq._errors import InvalidEndpoint
from tests import vault
from tests.integration.inproc import running
from tests.integration.serving import ADMIN, Served
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.test_api_cli import _cli

pytestmark = pytest.mark.anyio


def _ids(receiver: Receiver, path: str) -> list[str]:
    return sorted(r.headers["webhook-id"] for r in receiver.at(path))


def _deliveries(sql: psycopg.Connection[Any], endpoint_id: Any) -> dict[str, str]:
    rows = sql.execute("SELECT message_id, status FROM notifyq.webhook_delivery "
                       "WHERE endpoint_id = %s", [endpoint_id]).fetchall()
    return dict(rows)


async def test_an_endpoint_gets_what_it_missed_once_and_nothing_else(
        wapp: App, receiver: Receiver, sql: psycopg.Connection[Any]) -> None:
    hooks = wapp.webhooks
    paused = await hooks.create_endpoint(receiver.url("/paused"), event_types=["order.paid"])
    other = await hooks.create_endpoint(receiver.url("/other"), event_types=["order.paid"])
    early = (await hooks.send("order.paid", {"n": 0})).id  # before `since`
    [(since,)] = sql.execute("SELECT now()").fetchall()
    canceled = (await hooks.send("order.paid", {"n": 1})).id
    await hooks.disable_endpoint(paused.id, "maintenance")  # cancels `canceled`'s delivery
    missed = [(await hooks.send("order.paid", {"n": n})).id for n in (2, 3)]
    await hooks.send("order.refunded", {"n": 4})  # a type it does not receive
    await hooks.send("order.paid", {"n": 5}, endpoint_id=other.id)  # another's message
    assert _deliveries(sql, paused.id) == {early: "canceled", canceled: "canceled"}

    with pytest.raises(InvalidEndpoint, match=r"is disabled: enable it before replaying"):
        await hooks.replay_missing(paused.id, since)
    await hooks.enable_endpoint(paused.id)
    later = await hooks.create_endpoint(receiver.url("/later"), event_types=["order.paid"])

    dry = await hooks.replay_missing(paused.id, since, dry_run=True)
    assert (dry.count, dry.more, dry.items) == (3, False, [])
    bounded = await hooks.replay_missing(paused.id, since, dry_run=True, limit=2)
    assert (bounded.count, bounded.more) == (2, True)
    assert _deliveries(sql, paused.id) == {early: "canceled", canceled: "canceled"}

    first = await hooks.replay_missing(paused.id, since, limit=2)
    assert (first.count, first.more) == (2, True)
    assert [r["message_id"] for r in first.items] == sorted([canceled, missed[0]])
    rest = await hooks.replay_missing(paused.id, since, limit=2)
    assert (rest.count, rest.more) == (1, False)
    again = await hooks.replay_missing(paused.id, since)
    assert (again.count, again.more) == (0, False)
    subscribed_later = await hooks.replay_missing(later.id, since)
    assert subscribed_later.count == 3  # the broadcast order.paid since: 1, 2, 3 (not 5)

    async with running(wapp, pools=["webhooks"]):
        for path, n in (("/paused", 3), ("/later", 3), ("/other", 5)):
            await eventually(_received(receiver, path, n), timeout=20)
    assert _ids(receiver, "/paused") == sorted([canceled, *missed])
    assert _deliveries(sql, paused.id) == {early: "canceled", canceled: "succeeded",
                                           missed[0]: "succeeded", missed[1]: "succeeded"}
    [(runs,)] = sql.execute("SELECT count(*) FROM notifyq.job_run WHERE job_type = "
                            "'webhook.deliver' AND input ->> 'endpoint_id' = %s",
                            [str(paused.id)]).fetchall()
    assert runs == 1 + 1 + 3  # early and canceled at send (canceled), then the three replayed


def _received(receiver: Receiver, path: str, n: int) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        assert len(receiver.at(path)) == n
    return check


async def test_two_replays_at_once_send_each_message_once(
        wapp: App, receiver: Receiver, sql: psycopg.Connection[Any]) -> None:
    hooks = wapp.webhooks
    [(since,)] = sql.execute("SELECT now()").fetchall()
    await hooks.send_many([("order.paid", {"n": n}) for n in range(300)])
    late = await hooks.create_endpoint(receiver.url(), event_types=["order.paid"])
    counts: list[int] = []

    async def replay() -> None:
        counts.append((await hooks.replay_missing(late.id, since, limit=200)).count)
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(replay)
    assert sum(counts) == 200 + 100
    assert sorted(counts)[0] == 0
    [(deliveries, runs)] = sql.execute(
        "SELECT (SELECT count(*) FROM notifyq.webhook_delivery WHERE endpoint_id = %(e)s), "
        "(SELECT count(*) FROM notifyq.job_run WHERE input ->> 'endpoint_id' = %(e)s::text)",
        {"e": late.id}).fetchall()
    assert (deliveries, runs) == (300, 300)


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    tokens = [{"name": "acme", "token": "acme-admin-token-0123456789abc", "scopes": ["admin"],
               "tenants": ["acme"]}]
    env = {"NOTIFYQ_API__TOKENS": json.dumps(tokens), **vault.keys_env(1, active=1),
           "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8"}
    with Served(dsn, logs / "serve.log", env=env, args=["--no-worker"]) as server:
        yield server


def test_replay_over_http_and_from_the_cli(served: Served, dsn: str, receiver: Receiver,
                                           sql: psycopg.Connection[Any]) -> None:
    with served.client(ADMIN) as admin:
        endpoint = admin.post("/v1/webhooks/endpoints", json={
            "url": receiver.url(), "event_types": ["order.paid"], "enabled": False}).json()
        [(since,)] = sql.execute("SELECT now()").fetchall()
        for n in range(3):
            assert admin.post("/v1/webhooks/messages", json={
                "event_type": "order.paid", "payload": {"n": n}}).status_code == 201
        path = f"/v1/webhooks/endpoints/{endpoint['id']}/replay-missing"
        refused = admin.post(path, json={"since": since.isoformat()})
        assert refused.status_code == 422
        assert "is disabled" in refused.json()["detail"]
        assert admin.patch(f"/v1/webhooks/endpoints/{endpoint['id']}",
                           json={"enabled": True}).status_code == 200
        dry = admin.post(path, json={"since": since.isoformat(), "dry_run": True})
        assert dry.status_code == 200
        assert dry.json() == {"count": 3, "more": False, "items": []}
        assert admin.post(path, json={"since": since.isoformat(), "limit": 0}).status_code == 422
    with served.client("acme-admin-token-0123456789abc") as tenant:
        assert tenant.post(path, json={"since": since.isoformat()}).status_code == 404

    cli_dry = _cli(dsn, "replay-missing", endpoint["id"], "--since", since.isoformat(),
                   "--dry-run", "--limit", "2")
    assert cli_dry.returncode == 0, cli_dry.stderr
    assert cli_dry.stdout.strip() == (f"endpoint {endpoint['id']} missed at least 2 messages "
                                      f"since {since.isoformat()} (dry run: nothing sent)")
    cli = _cli(dsn, "replay-missing", endpoint["id"], "--since", since.isoformat())
    assert cli.stdout.strip() == (f"replayed 3 messages since {since.isoformat()} to endpoint "
                                  f"{endpoint['id']}: each has a new delivery")
    with served.client(ADMIN) as admin:
        assert admin.post(path, json={"since": since.isoformat()}).json()["count"] == 0
    assert set(_deliveries(sql, endpoint["id"]).values()) == {"pending"}
