"""Issue 12, item 8: API tokens bound to tenants. A token configured with ``tenants`` sees and
changes only the runs, signals, webhook endpoints and messages of its tenants (another tenant's
object is a 404, as if it did not exist), enqueues and creates only for them, and is refused the
operations about the whole cluster; the tokens without ``tenants`` keep seeing everything. Real
``notifyq serve`` processes over real HTTP, real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import SecretStr

from notifyq import App
from notifyq._api.routes import build_router
from notifyq._http.auth import Authenticator, TokenCheck, token_tenants
from tests import vault
from tests.conftest import fast_settings
from tests.integration.serving import ADMIN, READER, Served
from tests.ui.dashboard import Dashboard

Sql = psycopg.Connection[Any]
TENANT_A = "tenant-a-admin-token-0123456789"
TENANT_A_READ = "tenant-a-read-token-0123456789"
TENANT_B = "tenant-b-admin-token-0123456789"
TOKENS = [
    {"name": "tenant-a", "token": TENANT_A, "scopes": ["admin"], "tenants": ["a"]},
    {"name": "tenant-a-read", "token": TENANT_A_READ, "scopes": ["read"], "tenants": ["a"]},
    {"name": "tenant-b", "token": TENANT_B, "scopes": ["admin"], "tenants": ["b"]},
]
URL = "https://example.com/hook"  # never called: the server runs no worker


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    env = {"NOTIFYQ_API__TOKENS": json.dumps(TOKENS), **vault.keys_env(1, active=1)}
    with Served(dsn, logs / "serve.log", env=env, args=["--no-worker"]) as server:
        yield server


def _enqueue(http: httpx.Client, tenant: str | None, **fields: Any) -> str:
    answer = http.post("/v1/jobs", params={"allow_unknown_type": "true"},
                       json={"job_type": "svc.echo", **fields,
                             **({"tenant_id": tenant} if tenant else {})})
    assert answer.status_code in (200, 201), answer.text
    return str(answer.json()["id"])


def _status(sql: Sql, run_id: str) -> str:
    row = sql.execute("SELECT status FROM notifyq.job_run WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _runs(served: Served, sql: Sql) -> dict[str | None, str]:
    """One pending run each of tenants a and b and of no tenant, enqueued by the admin token."""
    with served.client(ADMIN) as admin:
        return {t: _enqueue(admin, t) for t in ("a", "b", None)}


def test_a_tenant_token_lists_and_gets_only_the_runs_of_its_tenant(served: Served,
                                                                    sql: Sql) -> None:
    runs = _runs(served, sql)
    for token in (TENANT_A, TENANT_A_READ):
        with served.client(token) as http:
            listed = http.get("/v1/jobs")
            assert listed.status_code == 200, listed.text
            assert [r["id"] for r in listed.json()["items"]] == [runs["a"]]
            # another tenant's filter widens nothing
            assert http.get("/v1/jobs", params={"tenant": "b"}).json()["items"] == []
            assert http.get(f"/v1/jobs/{runs['a']}").status_code == 200
            for other in (runs["b"], runs[None]):
                answer = http.get(f"/v1/jobs/{other}")
                assert answer.status_code == 404, answer.text
                assert answer.json()["detail"] == f"no run {other}"  # as for an unknown id
                assert http.get(f"/v1/jobs/{other}", params={"wait": "1s"}).status_code == 404
    with served.client(ADMIN) as admin, served.client(READER) as reader:
        for http in (admin, reader):  # tokens without tenants: every run, as before
            assert {r["id"] for r in http.get("/v1/jobs").json()["items"]} == set(runs.values())


def test_a_tenant_token_cannot_cancel_retry_replay_or_bulk_change_another_tenants_runs(
        served: Served, sql: Sql) -> None:
    runs = _runs(served, sql)
    with served.client(TENANT_A) as http:
        for action in ("cancel", "retry"):
            answer = http.post(f"/v1/jobs/{runs['b']}/{action}")
            assert answer.status_code == 404, answer.text
        replay = http.post(f"/v1/jobs/{runs['b']}/replay", json={"from_step": "x"})
        assert replay.status_code == 404, replay.text
        by_ids = http.post("/v1/jobs/bulk", json={"action": "cancel",
                                                  "ids": [runs["b"], runs[None]]})
        assert by_ids.json()["changed"] == 0, by_ids.text
        assert _status(sql, runs["b"]) == _status(sql, runs[None]) == "pending"
        counted = http.post("/v1/jobs/bulk", json={"action": "cancel", "filter": {},
                                                   "dry_run": True})
        assert counted.json()["matched"] == 1, counted.text
        by_filter = http.post("/v1/jobs/bulk", json={"action": "cancel", "filter": {}})
        assert by_filter.json()["changed"] == 1, by_filter.text
        assert http.post(f"/v1/jobs/{runs['a']}/retry").status_code == 200
        assert http.post(f"/v1/jobs/{runs['a']}/cancel").status_code == 200
    assert (_status(sql, runs["a"]), _status(sql, runs["b"]), _status(sql, runs[None])) == (
        "canceled", "pending", "pending")
    with served.client(TENANT_A_READ) as reader:
        assert reader.post(f"/v1/jobs/{runs['a']}/retry").status_code == 403


def test_a_tenant_token_enqueues_only_for_its_tenant(served: Served, sql: Sql) -> None:
    with served.client(TENANT_A) as http:
        own = _enqueue(http, None)  # its only tenant, when none is given
        assert _enqueue(http, "a") != own
        other = http.post("/v1/jobs", json={"job_type": "svc.echo", "tenant_id": "b"})
        assert other.status_code == 403, other.text
        batch = http.post("/v1/jobs/batch", params={"allow_unknown_type": "true"}, json={
            "jobs": [{"job_type": "svc.echo"}, {"job_type": "svc.echo", "tenant_id": "b"}]})
        assert batch.status_code == 403, batch.text
    tenants = sql.execute("SELECT DISTINCT tenant_id FROM notifyq.job_run").fetchall()
    assert tenants == [("a",)]
    # Dedupe keys are per tenant: the same natural key in two tenants is two runs, and neither
    # tenant learns anything of the other's.
    with served.client(TENANT_B) as b:
        taken = _enqueue(b, None, dedupe_key="order-7", input={"card": "4111"})
    with served.client(TENANT_A) as http:
        mine = http.post("/v1/jobs", json={"job_type": "svc.echo", "dedupe_key": "order-7"})
        assert mine.status_code == 201, mine.text
        assert taken not in mine.text
        assert "4111" not in mine.text
        again = http.post("/v1/jobs", json={"job_type": "svc.echo", "dedupe_key": "order-7"})
        assert (again.status_code, again.json()["id"]) == (200, mine.json()["id"])
        batch = http.post("/v1/jobs/batch", json={"jobs": [
            {"job_type": "svc.echo", "dedupe_key": "order-7"},
            {"job_type": "svc.echo", "dedupe_key": "order-8"}]})
        assert batch.status_code == 201, batch.text
        assert batch.json()["items"][0]["id"] == mine.json()["id"]
    keys = sql.execute("SELECT tenant_id, count(*) FROM notifyq.job_run WHERE dedupe_key IS "
                       "NOT NULL GROUP BY 1 ORDER BY 1").fetchall()
    assert keys == [("a", 2), ("b", 1)]


def _waiting(sql: Sql, run_id: str, token: str) -> None:
    """Park a run as ctx.wait_for_signal(token) does: waiting, with its running wait step."""
    sql.execute("UPDATE notifyq.job_run SET status = 'waiting', wait_kind = 'signal', "
                "wait_token = %s, run_at = '2999-12-31' WHERE id = %s", (token, run_id))
    sql.execute("INSERT INTO notifyq.job_step (run_id, step_id, seq, kind, status, attempts, "
                "attempt, started_at) VALUES (%s, %s, 1, 'signal', 'running', 1, 1, now())",
                (run_id, f"signal:{token}"))


def test_a_tenant_token_signals_only_the_runs_of_its_tenant(served: Served, sql: Sql) -> None:
    runs = _runs(served, sql)
    _waiting(sql, runs["b"], "approve")
    with served.client(TENANT_A) as http:
        refused = http.post("/v1/signals/approve", json={"ok": True})
        assert refused.status_code == 404, refused.text
        assert _status(sql, runs["b"]) == "waiting"
        assert sql.execute("SELECT count(*) FROM notifyq.job_signal").fetchone() == (0,)
        _waiting(sql, runs["a"], "approve")
        woken = http.post("/v1/signals/approve", json={"ok": True})
        assert (woken.status_code, woken.json()["woken"]) == (202, 1), woken.text
    assert (_status(sql, runs["a"]), _status(sql, runs["b"])) == ("pending", "waiting")
    with served.client(ADMIN) as admin:  # a token of every tenant: any run, as before
        assert admin.post("/v1/signals/approve", json={}).json()["woken"] == 1
    assert _status(sql, runs["b"]) == "pending"


def test_a_tenant_token_sees_and_changes_only_the_webhook_endpoints_and_messages_of_its_tenant(
        served: Served, sql: Sql) -> None:
    with served.client(TENANT_A) as a, served.client(TENANT_B) as b:
        mine = a.post("/v1/webhooks/endpoints", json={"url": URL})
        assert mine.status_code == 201, mine.text
        assert mine.json()["tenant_id"] == "a"
        theirs = b.post("/v1/webhooks/endpoints", json={"url": URL}).json()["id"]
        assert a.post("/v1/webhooks/endpoints",
                      json={"url": URL, "tenant_id": "b"}).status_code == 403
        endpoint = mine.json()["id"]
        assert [e["id"] for e in a.get("/v1/webhooks/endpoints").json()["items"]] == [endpoint]
        assert [h["endpoint_id"] for h in a.get("/v1/webhooks/health").json()["items"]] == [
            endpoint]
        requests = [("GET", f"/v1/webhooks/endpoints/{theirs}", None),
                    ("PATCH", f"/v1/webhooks/endpoints/{theirs}", {"enabled": False}),
                    ("POST", f"/v1/webhooks/endpoints/{theirs}/rotate-secret", None),
                    ("POST", f"/v1/webhooks/endpoints/{theirs}/recover",
                     {"since": "2026-01-01T00:00:00Z"}),
                    ("DELETE", f"/v1/webhooks/endpoints/{theirs}", None),
                    ("GET", "/v1/webhooks/messages?endpoint_id=" + theirs, None),
                    ("POST", "/v1/webhooks/messages",
                     {"event_type": "order.paid", "payload": {}, "endpoint_id": theirs})]
        for method, path, body in requests:
            answer = a.request(method, path, json=body)
            assert answer.status_code == 404, (method, path, answer.text)
        by_type = a.post("/v1/webhooks/messages", json={"event_type": "order.paid",
                                                        "payload": {}})
        assert by_type.status_code == 422, by_type.text  # would reach b's endpoint too
        sent = a.post("/v1/webhooks/messages", json={"event_type": "order.paid",
                                                     "payload": {"n": 1},
                                                     "endpoint_id": endpoint})
        assert sent.status_code == 201, sent.text
        message = sent.json()["id"]
        secret_b = b.post("/v1/webhooks/messages", json={
            "event_type": "order.paid", "payload": {"n": 2}, "endpoint_id": theirs}).json()["id"]
        assert [m["id"] for m in a.get("/v1/webhooks/messages").json()["items"]] == [message]
        for path in (f"/v1/webhooks/messages/{secret_b}",
                     f"/v1/webhooks/messages/{secret_b}/attempts"):
            assert a.get(path).status_code == 404, path
        assert a.post(f"/v1/webhooks/messages/{secret_b}/resend").status_code == 404
        assert a.get(f"/v1/webhooks/messages/{message}").status_code == 200
    row = sql.execute("SELECT disabled_at, tenant_id FROM notifyq.webhook_endpoint WHERE id = %s",
                      (theirs,)).fetchone()
    assert row == (None, "b")  # still there, still enabled
    with served.client(ADMIN) as admin:
        assert len(admin.get("/v1/webhooks/endpoints").json()["items"]) == 2
        assert len(admin.get("/v1/webhooks/messages").json()["items"]) == 2


def test_operations_about_the_whole_cluster_need_a_token_of_every_tenant(
        served: Served) -> None:
    paths = [("GET", "/v1/stats"), ("GET", "/v1/stats/pools"), ("GET", "/v1/workers"),
             ("GET", "/v1/pauses"), ("POST", "/v1/pools/default/pause"),
             ("POST", "/v1/types/svc.echo/resume"), ("GET", "/v1/schedules"),
             ("GET", "/v1/keys"), ("POST", "/v1/admin/rotate-key")]
    with served.client(TENANT_A) as http:
        for method, path in paths:
            answer = http.request(method, path)
            assert answer.status_code == 403, (path, answer.text)
            assert "limited to tenants" in answer.json()["detail"]
    with served.client(ADMIN) as admin:
        for method, path in paths[:4]:
            assert admin.request(method, path).status_code == 200, path


def test_the_dashboard_refuses_a_tenant_token_and_says_why(served: Served) -> None:
    with Dashboard(served) as dashboard:
        answer = dashboard.sign_in(TENANT_A)
        assert answer.status_code == 403
        assert "limited to tenants" in answer.text
        assert dashboard.get("/ui/runs").status_code != 200
    with Dashboard(served) as dashboard:
        assert dashboard.sign_in(ADMIN).status_code == 303


def _calls(dependant: Dependant) -> list[Any]:
    return [c for d in dependant.dependencies for c in (d.call, *_calls(d))]


def test_every_v1_route_filters_by_the_tokens_tenants_or_refuses_tenant_tokens(
        dsn: str) -> None:
    """A route added later cannot forget the tenants: it takes token_tenants (and passes them
    to its queries) or is about every tenant (require(..., every_tenant=True))."""
    settings = fast_settings(dsn, keys=SecretStr(vault.keys_env(1, active=1)["NOTIFYQ_KEYS"]),
                             active_key_version=1)
    app = App(settings=settings.model_copy(update={"webhooks": settings.webhooks.model_copy(
        update={"enabled": True})}))
    routes = build_router(app, Authenticator(app.settings.api), None).routes
    assert any(isinstance(r, APIRoute) and r.path.startswith("/v1/webhooks/") for r in routes)
    for route in routes:
        assert isinstance(route, APIRoute)
        calls = _calls(route.dependant)
        [check] = [c for c in calls if isinstance(c, TokenCheck)]
        assert check.every_tenant != (token_tenants in calls), (route.path, route.methods)


def test_a_batch_of_messages_is_sent_all_or_nothing_and_a_tenant_only_to_its_endpoints(
        served: Served, sql: Sql) -> None:
    with served.client(ADMIN) as admin, served.client(TENANT_A) as a, \
            served.client(TENANT_B) as b:
        mine = a.post("/v1/webhooks/endpoints", json={"url": URL}).json()["id"]
        theirs = b.post("/v1/webhooks/endpoints", json={"url": URL}).json()["id"]
        batch = [{"event_type": "order.paid", "payload": {"n": n}, "endpoint_id": mine}
                 for n in range(3)]
        sent = a.post("/v1/webhooks/messages/batch", json={"messages": batch})
        assert sent.status_code == 201, sent.text
        assert [(i["created"], i["deliveries"]) for i in sent.json()["items"]] == [(True, 1)] * 3
        for refused, status in (
                ([*batch, {"event_type": "order.paid", "payload": {}, "endpoint_id": theirs}],
                 404),
                ([*batch, {"event_type": "order.paid", "payload": {}}], 422)):
            answer = a.post("/v1/webhooks/messages/batch", json={"messages": refused})
            assert answer.status_code == status, answer.text
        bad = admin.post("/v1/webhooks/messages/batch", json={"messages": [
            *batch, {"event_type": "bad type!", "payload": {}}]})
        assert bad.status_code == 422, bad.text
        assert "message 4: invalid event type" in bad.text
        too_many = admin.post("/v1/webhooks/messages/batch", json={"messages": batch * 334})
        assert too_many.status_code == 422, too_many.text
        by_type = admin.post("/v1/webhooks/messages/batch", json={"messages": [
            {"event_type": "order.paid", "payload": {"n": 9}}]})
        assert [(i["created"], i["deliveries"]) for i in by_type.json()["items"]] == [(True, 2)]
    counts = sql.execute("SELECT count(*) FROM notifyq.webhook_message").fetchone()
    assert counts == (4,)  # three of a's and the admin's by event type; nothing refused was


def test_a_tenant_token_lists_only_the_operator_events_about_its_tenants_endpoints(
        served: Served, sql: Sql) -> None:
    with served.client(ADMIN) as admin:
        ids = {t: admin.post("/v1/webhooks/endpoints", json={"url": URL, "tenant_id": t}
                             ).json()["id"] for t in ("a", "b")}
    sql.execute("UPDATE notifyq.webhook_endpoint SET disabled_at = now(), "
                "disabled_reason = 'moving hosts'")  # the trigger records one event each
    sql.execute("INSERT INTO notifyq.operator_event (kind) VALUES ('retention.purged')")
    with served.client(TENANT_A_READ) as http:
        mine = http.get("/v1/webhooks/operator-events").json()["items"]
        assert [(e["kind"], e["endpoint_id"], e["tenant_id"]) for e in mine] == [
            ("endpoint.disabled", ids["a"], "a")]
        assert http.get("/v1/webhooks/operator-events",
                        params={"endpoint_id": ids["b"]}).json()["items"] == []
    with served.client(ADMIN) as admin:
        every = admin.get("/v1/webhooks/operator-events", params={"limit": 2}).json()
    assert [e["kind"] for e in every["items"]] == ["retention.purged", "endpoint.disabled"]
    assert every["next_cursor"] == every["items"][-1]["id"]
