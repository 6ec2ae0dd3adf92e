"""Operator events end to end: a real ``notifyq serve`` (worker, leader and API over real
HTTP) or real worker processes, real receivers on 127.0.0.1, the real CLI. Each event is
logged once (logger ``notifyq.operator``), counted in ``/metrics`` and delivered signed to the
operator's endpoint; the failing-for-long event is emitted once by two workers (and by two
announcers racing)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from notifyq import App
from notifyq._maintenance.announcer import Announcer
from notifyq._maintenance.purger import Purger
from tests import vault
from tests.integration.inproc import fetch, scalar
from tests.integration.serving import READER, Served
from tests.receiver import Receiver, Reply
from tests.support import ROOT, Workers, wait_until
from tests.webhooks.conftest import verify, webhook_settings

KEYS = {"NOTIFYQ_KEYS": f"1:{vault.b64(vault.KEY1)}", "NOTIFYQ_ACTIVE_KEY_VERSION": "1",
        "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}
OPS_TYPES = ["notifyq.endpoint.disabled", "notifyq.endpoint.circuit_opened",
             "notifyq.endpoint.circuit_closed", "notifyq.endpoint.failing",
             "notifyq.retention.purged"]


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")},
           "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_LOG_LEVEL": "WARNING", **KEYS}
    result = subprocess.run([sys.executable, "-m", "notifyq", *args], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result


def _operator_endpoint(dsn: str, receiver: Receiver) -> dict[str, Any]:
    types = [arg for t in OPS_TYPES for arg in ("--event-type", t)]
    added: dict[str, Any] = json.loads(_cli(dsn, "webhooks", "endpoints", "add",
                                            receiver.url("/ops"), *types, "--json").stdout)
    return added


def _operator_lines(log: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("logger") == "notifyq.operator"
            and "operator_event" in line]


def test_a_410_and_a_circuit_that_opens_and_closes_reach_the_operator_once_each(
        dsn: str, receiver: Receiver, tmp_path: Path) -> None:
    ops = _operator_endpoint(dsn, receiver)
    gone = _cli(dsn, "webhooks", "endpoints", "add", receiver.url("/gone")).stdout.strip()
    flaky = _cli(dsn, "webhooks", "endpoints", "add", receiver.url("/flaky")).stdout.strip()
    receiver.script("/gone", Reply(status=410))
    receiver.script("/flaky", Reply(status=500), Reply(status=500))  # then 200
    env = {**KEYS, "NOTIFYQ_WEBHOOKS__OPERATOR_ENDPOINT_ID": ops["id"],
           "NOTIFYQ_WEBHOOKS__OPERATOR_EVENTS_INTERVAL_S": "0.2",
           "NOTIFYQ_WEBHOOKS__BREAKER_FAILURES": "2",
           "NOTIFYQ_WEBHOOKS__BREAKER_COOLDOWN_S": "0.5",
           "NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S": "[0, 0.1, 0.1, 0.1, 0.1]"}
    with Served(dsn, tmp_path / "serve.log", env=env) as served, served.client() as api:
        _cli(dsn, "webhooks", "send", "order.paid", "--payload", "{}", "--endpoint", gone)
        _cli(dsn, "webhooks", "send", "order.paid", "--payload", "{}", "--endpoint", flaky)

        def three_at_the_operator() -> list[Any]:
            received = receiver.at("/ops")
            assert len(received) == 3, [r.body for r in received]
            return [verify(ops["secret"], r) for r in received]
        payloads = wait_until(three_at_the_operator, timeout=40)
        kinds = {(p["kind"], p["endpoint_id"]) for p in payloads}
        assert kinds == {("endpoint.disabled", gone), ("endpoint.circuit_opened", flaky),
                         ("endpoint.circuit_closed", flaky)}
        [disabled] = [p for p in payloads if p["kind"] == "endpoint.disabled"]
        assert disabled["type"] == "notifyq.endpoint.disabled"
        assert disabled["detail"]["cause"] == "gone"

        listed = api.get("/v1/webhooks/operator-events").json()["items"]
        assert sorted(e["kind"] for e in listed) == sorted(k for k, _ in kinds)
        assert all(e["message_id"] and e["emitted_at"] for e in listed)
        only = api.get("/v1/webhooks/operator-events",
                       params={"kind": "endpoint.disabled"}).json()["items"]
        assert [e["endpoint_id"] for e in only] == [gone]
        bad = api.get("/v1/webhooks/operator-events", params={"kind": "nope"})
        assert bad.status_code == 422
        assert bad.headers["content-type"].startswith("application/problem+json")
        with served.client(READER) as reader:
            metrics = reader.get("/metrics").text
        for kind in ("endpoint.disabled", "endpoint.circuit_opened", "endpoint.circuit_closed"):
            assert f'notifyq_operator_events_total{{kind="{kind}"}} 1.0' in metrics, metrics
    logged = _operator_lines(served.log())
    assert sorted((line["operator_event"], line["endpoint_id"]) for line in logged) == sorted(
        kinds)
    assert {line["level"] for line in logged if line["operator_event"] == "endpoint.disabled"
            } == {"WARNING"}
    text = _cli(dsn, "webhooks", "events", "--kind", "endpoint.disabled").stdout
    assert re.fullmatch(rf"\d+  \S+ \S+  endpoint\.disabled  endpoint {gone}  "
                        r"cause=gone, failing_since=\S+, "
                        r"reason=the endpoint answered 410 Gone\n", text), text


def test_an_endpoint_failing_for_an_hour_is_announced_once_by_two_workers(
        dsn: str, receiver: Receiver, tmp_path: Path) -> None:
    ops = _operator_endpoint(dsn, receiver)
    failing = _cli(dsn, "webhooks", "endpoints", "add", receiver.url("/down")).stdout.strip()
    # Failing since 10 minutes ago; the workers' clock runs an hour ahead.
    subprocess.run(["psql", dsn, "-qc", "UPDATE notifyq.webhook_endpoint SET failing_since = "
                    f"now() - interval '10 minutes' WHERE id = '{failing}'"], check=True)
    env = {**KEYS, "NOTIFYQ_TEST_CLOCK_SHIFT_S": "3600",
           "NOTIFYQ_WEBHOOKS__FAILING_ALERT_AFTER_S": "3600",
           "NOTIFYQ_WEBHOOKS__OPERATOR_EVENTS_INTERVAL_S": "0.1",
           "NOTIFYQ_WEBHOOKS__OPERATOR_ENDPOINT_ID": ops["id"]}
    with Workers(dsn, tmp_path, app="tests.apps.shifted:app", extra_env=env) as fleet:
        fleet.start()
        fleet.start()
        fleet.wait_registered()

        def announced() -> None:
            received = receiver.at("/ops")
            assert len(received) == 1, received
            body = json.loads(received[0].body)
            assert (body["kind"], body["endpoint_id"]) == ("endpoint.failing", failing)
            assert body["detail"]["failing_for_s"] >= 3000
        wait_until(announced, timeout=30)
        # Many announcer passes later (each leader pass records and claims again): still one.
        events = _events_sql(dsn)
        wait_until(lambda: _passes_after(dsn, events), timeout=30)
        assert fleet.stop_all() == [0, 0]
    assert len(receiver.at("/ops")) == 1
    assert _events_sql(dsn)["rows"] == 1
    logs = "".join((tmp_path / f"worker-{n}.log").read_text() for n in (1, 2))
    assert [line["operator_event"] for line in _operator_lines(logs)] == ["endpoint.failing"]


def _events_sql(dsn: str) -> dict[str, Any]:
    out = subprocess.run(["psql", dsn, "-Atc", "SELECT count(*), "
                          "(SELECT expires_at FROM notifyq.leader LIMIT 1) "
                          "FROM notifyq.operator_event WHERE kind = 'endpoint.failing'"],
                         check=True, capture_output=True, text=True).stdout.strip()
    rows, expires = out.split("|")
    return {"rows": int(rows), "leader_expires": expires}


def _passes_after(dsn: str, before: dict[str, Any]) -> None:
    """The leader has renewed its lease at least twice since ``before`` (ttl 1 s, renewed every
    third of it; the announcer runs every 0.1 s while it leads)."""
    now = _events_sql(dsn)
    assert now["leader_expires"] > before["leader_expires"]
    subprocess.run(["psql", dsn, "-Atc", "SELECT 1"], check=True, capture_output=True)


def _announcer(app: App) -> Announcer:
    """The announcer a worker of ``app`` runs while it leads (built alone: a Worker that
    never runs would leave its streams open)."""
    db = app._runtime.opened
    assert db is not None
    return Announcer(db, app._runtime.queries, app.clock, app.settings.webhooks)


@pytest.mark.anyio
async def test_two_announcers_racing_emit_and_send_each_event_once(
        dsn: str, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    async with App(settings=webhook_settings(dsn)) as setup:
        ops = await setup.webhooks.create_endpoint(receiver.url("/ops"), event_types=OPS_TYPES)
        ep = await setup.webhooks.create_endpoint(receiver.url("/down"))
        await fetch(setup, "UPDATE notifyq.webhook_endpoint SET failing_since = now() - "
                    "interval '2 hours' WHERE id = %s RETURNING id", ep.id)
        await setup.webhooks.disable_endpoint(ops.id, "a drill")  # about the operator's own
        await setup.webhooks.enable_endpoint(ops.id)
    apps = [App(settings=webhook_settings(dsn, failing_alert_after_s=3600,
                                          operator_endpoint_id=ops.id)) for _ in range(2)]
    counted: list[str] = []
    async with apps[0], apps[1]:
        announcers = [_announcer(app) for app in apps]
        for announcer in announcers:
            announcer.observer = counted.append
        results: list[dict[str, Any]] = []

        async def once(announcer: Announcer) -> None:
            results.append(await announcer.run_once())
        with caplog.at_level("INFO", logger="notifyq.operator"):
            for _ in range(3):
                async with anyio.create_task_group() as tg:
                    for announcer in announcers:
                        tg.start_soon(once, announcer)
        messages = await fetch(apps[0], "SELECT event_type FROM notifyq.webhook_message "
                               "WHERE event_type LIKE 'notifyq.%%' ORDER BY event_type")
        failing = await scalar(apps[0], "SELECT count(*) FROM notifyq.operator_event "
                               "WHERE kind = 'endpoint.failing'")
    assert sum(r["failing"] for r in results) == 1 == failing
    assert sorted(counted) == ["endpoint.disabled", "endpoint.failing"]
    assert [m["event_type"] for m in messages] == ["notifyq.endpoint.disabled",
                                                   "notifyq.endpoint.failing"]
    assert sorted(getattr(r, "operator_event", "") for r in caplog.records
                  if r.name == "notifyq.operator") == sorted(counted)
    assert sum(r["sent"] for r in results) == 2


@pytest.mark.anyio
async def test_a_purge_pass_that_deleted_runs_is_an_operator_event(dsn: str) -> None:
    async with App(settings=webhook_settings(dsn, operator_endpoint_id=None)) as app:
        await fetch(app, "INSERT INTO notifyq.job_run (id, job_type, input, status, "
                    "finished_at) VALUES (notifyq.uuid7(), 't.a', '{}', 'completed', "
                    "now() - interval '3 days') RETURNING id")
        db = app._runtime.opened
        assert db is not None
        purger = Purger(db, app._runtime.queries, app.clock, app.settings.purger)
        assert (await purger.run_once())["deleted"] == 1
        assert (await purger.run_once())["deleted"] == 0   # nothing: no event
        assert (await _announcer(app).run_once())["emitted"] == 1
        [event] = await app.webhooks.operator_events()
    assert event["kind"] == "retention.purged"
    assert event["detail"]["runs_deleted"] == 1
    assert event["message_id"] is None
    assert event["emitted_at"] is not None
