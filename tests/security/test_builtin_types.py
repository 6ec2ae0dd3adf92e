"""Issue 31, item 2: notifyq's own job types (``webhook.deliver``, ``secret.reencrypt``) are
enqueued only by their features. ``POST /v1/jobs`` with a tenant's token took a
``webhook.deliver`` of another tenant's message and endpoint (the worker resent it and showed
the tenant the result) and a ``secret.reencrypt`` (a cluster-wide re-encryption the rotate-key
route refuses that token). Every enqueue path for callers refuses them with the same message
(HTTP, the CLI, SQL ``notifyq.enqueue``, the Python API), the features' own paths keep working,
and the handlers refuse a run that got in some other way. Real ``notifyq serve``, real CLI, real
PostgreSQL, a real receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from notifyq import App
from notifyq._errors import InvalidEnqueue
from notifyq._limits import BUILTIN_JOB_TYPES
from tests import vault
from tests.integration.inproc import fetch, running, status_becomes
from tests.integration.serving import ADMIN, Served
from tests.integration.test_cli import notifyq
from tests.receiver import Receiver
from tests.support import eventually
from tests.webhooks.conftest import webhook_settings

Sql = psycopg.Connection[Any]
ACME = "acme-admin-token-0123456789abcdef"
GLOBEX = "globex-admin-token-0123456789abcd"
TOKENS = [{"name": "acme", "token": ACME, "scopes": ["admin"], "tenants": ["acme"]},
          {"name": "globex", "token": GLOBEX, "scopes": ["admin"], "tenants": ["globex"]}]
URL = "https://example.com/hook"  # never called: the server runs no worker
REFUSED = "is built in and enqueued by notifyq itself"


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    env = {"NOTIFYQ_API__TOKENS": json.dumps(TOKENS), **vault.keys_env(1, active=1)}
    with Served(dsn, logs / "serve.log", env=env, args=["--no-worker"]) as server:
        yield server


def _globex_message(served: Served) -> tuple[str, str]:
    """A message sent to an endpoint of globex's: (message id, endpoint id)."""
    with served.client(GLOBEX) as globex:
        endpoint = globex.post("/v1/webhooks/endpoints", json={"url": URL})
        assert endpoint.status_code == 201, endpoint.text
        sent = globex.post("/v1/webhooks/messages", json={
            "event_type": "order.paid", "payload": {"card": "4111"},
            "endpoint_id": endpoint.json()["id"]})
        assert sent.status_code == 201, sent.text
        return str(sent.json()["id"]), str(endpoint.json()["id"])


def _types(sql: Sql) -> dict[str, int]:
    rows = sql.execute("SELECT job_type, count(*) FROM notifyq.job_run GROUP BY 1").fetchall()
    return dict(rows)


def _refused(answer: httpx.Response, job_type: str) -> None:
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert problem["field"] == "job_type", problem
    assert problem["detail"] == (f"job type {job_type!r} {REFUSED}, with the checks its own "
                                 f"API makes: {BUILTIN_JOB_TYPES[job_type]}")


def test_the_http_api_refuses_built_in_job_types_to_every_token(served: Served,
                                                               sql: Sql) -> None:
    message, endpoint = _globex_message(served)
    forged = {"message_id": message, "endpoint_id": endpoint}
    inputs = {"webhook.deliver": forged, "secret.reencrypt": {"target_version": 1}}
    attempts = 0
    for token in (ACME, ADMIN):
        with served.client(token) as http:
            for job_type, body in inputs.items():
                _refused(http.post("/v1/jobs", json={"job_type": job_type, "input": body}),
                         job_type)
                _refused(http.post("/v1/jobs", params={"allow_unknown_type": "true"},
                                   json={"job_type": job_type, "input": body}), job_type)
                _refused(http.post("/v1/jobs/batch", json={"jobs": [
                    {"job_type": "svc.echo"}, {"job_type": job_type, "input": body}]}),
                    job_type)
                attempts += 3
    assert attempts == 12
    # only globex's own delivery (its send) and nothing of the batches' plain runs
    assert _types(sql) == {"webhook.deliver": 1}
    assert sql.execute("SELECT count(*) FROM notifyq.key_rotation").fetchone() == (0,)
    with served.client(ADMIN) as admin:  # the features' own routes still enqueue them
        rotation = admin.post("/v1/admin/rotate-key")
        assert rotation.status_code == 202, rotation.text
        assert rotation.json()["run"]["job_type"] == "secret.reencrypt"
        resent = admin.post(f"/v1/webhooks/messages/{message}/resend")
        assert resent.status_code in (200, 202), resent.text
    assert _types(sql) == {"webhook.deliver": 2, "secret.reencrypt": 1}


def test_sql_enqueue_refuses_built_in_job_types(sql: Sql) -> None:
    for job_type, hint in BUILTIN_JOB_TYPES.items():
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
            sql.execute("SELECT notifyq.enqueue(%s, '{}', allow_unknown_type => true)",
                        (job_type,))
        assert raised.value.diag.message_primary == (
            f"notifyq: job type {job_type!r} {REFUSED}, with the checks its own API makes: "
            f"{hint}")
    run = sql.execute("SELECT notifyq.enqueue('svc.echo', '{}', allow_unknown_type => true)")
    assert run.fetchone() is not None  # any other type, as before
    assert _types(sql) == {"svc.echo": 1}


def test_the_cli_refuses_built_in_job_types(dsn: str, sql: Sql) -> None:
    for job_type in BUILTIN_JOB_TYPES:
        result = notifyq(dsn, "enqueue", job_type, "--input", '{"target_version": 1}',
                         "--allow-unknown-type")
        assert result.returncode == 1, result.stdout
        assert result.stderr.strip() == (
            f"notifyq: error: job type {job_type!r} {REFUSED}, with the checks its own API "
            f"makes: {BUILTIN_JOB_TYPES[job_type]}")
    assert _types(sql) == {}


@pytest.mark.anyio
async def test_the_python_api_refuses_built_in_job_types(dsn: str, sql: Sql) -> None:
    app = App(settings=webhook_settings(dsn))
    async with app:
        for job_type in BUILTIN_JOB_TYPES:
            with pytest.raises(InvalidEnqueue, match=REFUSED):
                await app.enqueue(job_type, {})
            with pytest.raises(InvalidEnqueue, match=REFUSED):
                await app.enqueue_many([{"job_type": "svc.echo"}, {"job_type": job_type}],
                                       allow_unknown_type=True)
            with pytest.raises(InvalidEnqueue, match=REFUSED):
                app.enqueue_sync(job_type, {})
    assert _types(sql) == {}


async def _smuggle(app: App, job_type: str, input: dict[str, Any]) -> Any:
    """A run of a built-in type that got in around the edges (the internal ``_enqueue``)."""
    rows = await fetch(app, "SELECT (notifyq._enqueue(%s, %s::jsonb, p_pool => %s, "
                            "p_allow_unknown_type => true)).id AS id", job_type,
                       json.dumps(input), POOLS[job_type])
    return rows[0]["id"]


POOLS = {"webhook.deliver": "webhooks", "secret.reencrypt": "default"}


@pytest.mark.anyio
async def test_the_handlers_refuse_built_in_runs_that_notifyq_did_not_enqueue(
        dsn: str, receiver: Receiver) -> None:
    app = App(settings=webhook_settings(dsn))
    async with app:
        endpoint = await app.webhooks.create_endpoint(receiver.url("/globex"),
                                                      tenant_id="globex")
        sent = await app.webhooks.send("order.paid", {"n": 1}, endpoint_id=endpoint.id)
        forged = {"message_id": sent.id, "endpoint_id": str(endpoint.id)}
        scheduled = await _smuggle(app, "webhook.deliver", forged)
        manual = await _smuggle(app, "webhook.deliver", {**forged, "trigger": "manual"})
        rotation = await _smuggle(app, "secret.reencrypt", {"target_version": 1})
        async with running(app):
            await eventually(lambda: _received(receiver, 1), timeout=10)
            failed = {run: await status_becomes(app, run, "failed")
                      for run in (scheduled, manual, rotation)}
            legit = await fetch(app, "SELECT run_id FROM notifyq.webhook_delivery")
            await status_becomes(app, legit[0]["run_id"], "completed")
        resent = await app.webhooks.resend(sent.id)  # notifyq's own manual attempt
        async with running(app):
            await status_becomes(app, resent[0]["run_id"], "completed")
        attempts = await fetch(app, "SELECT run_id, trigger FROM notifyq.webhook_attempt "
                                    "ORDER BY id")
        rotations = await fetch(app, "SELECT count(*) AS n FROM notifyq.key_rotation")
    assert [r.path for r in receiver.requests] == ["/globex", "/globex"]
    assert [(a["run_id"], a["trigger"]) for a in attempts] == [
        (legit[0]["run_id"], "scheduled"), (resent[0]["run_id"], "manual")]
    for run, trigger in ((scheduled, "scheduled"), (manual, "manual")):
        assert failed[run]["attempts"] == 1  # permanent: no retry
        assert failed[run]["error"]["message"].startswith(
            f"run {run} is not notifyq's {trigger} delivery of message {sent.id}")
    assert failed[rotation]["error"]["message"] == (
        f"run {rotation} was not started by a key rotation to version 1: "
        "secret.reencrypt runs are enqueued by app.keys.rotate, POST /v1/admin/rotate-key or "
        "`notifyq keys rotate` only; refused")
    assert rotations == [{"n": 0}]


async def _received(receiver: Receiver, n: int) -> None:
    assert len(receiver.requests) == n


def test_the_built_in_names_are_the_features_own() -> None:
    from notifyq._keys.admin import REENCRYPT
    from notifyq._webhooks.service import DELIVER

    assert set(BUILTIN_JOB_TYPES) == {DELIVER, REENCRYPT}
