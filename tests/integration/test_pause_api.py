"""Pause and resume over real HTTP against a real ``notifyq serve`` (whose own worker must obey
the pause), with ``/metrics`` and ``/v1/stats`` showing it; the CLI's listing of pauses."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.serving import READER, Served
from tests.integration.test_cli import fails, ok
from tests.support import scalar, wait_until

Conn = psycopg.Connection[Any]


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log") as server:
        yield server


def _paused_gauges(served: Served) -> dict[tuple[str, str], float]:
    with served.client(None) as http:
        text = http.get("/metrics").text
    return {(s.labels["kind"], s.labels["name"]): s.value
            for family in text_string_to_metric_families(text) if family.name == "notifyq_paused"
            for s in family.samples}


def _status(sql: Conn, run_id: str) -> tuple[str, int]:
    row = sql.execute("SELECT status, attempts FROM notifyq.job_run WHERE id = %s",
                      (run_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_pausing_a_pool_over_http_holds_its_runs_until_resumed(served: Served,
                                                                sql: Conn) -> None:
    with served.client() as http:
        paused = http.post("/v1/pools/default/pause", json={"reason": "deploy"})
        assert paused.status_code == 200, paused.text
        assert {k: paused.json()[k] for k in ("kind", "name", "reason", "created")} == {
            "kind": "pool", "name": "default", "reason": "deploy", "created": True}
        assert http.post("/v1/pools/default/pause").json()["created"] is False
        run_id = http.post("/v1/jobs", json={"job_type": "svc.echo"}).json()["id"]

        deadline = time.monotonic() + 1.2  # six polls of the server's worker
        while time.monotonic() < deadline:
            assert _status(sql, run_id) == ("pending", 0)
            time.sleep(0.05)
        pools = http.get("/v1/stats/pools").json()["items"]
        assert [(p["pool"], p["paused"], p["runnable"]) for p in pools] == [
            ("default", True, 1)]
        assert [p["name"] for p in http.get("/v1/stats").json()["paused"]] == ["default"]
        assert _paused_gauges(served) == {("pool", "default"): 1.0}

        assert http.post("/v1/pools/default/resume").json() == {
            "kind": "pool", "name": "default", "resumed": True}
        wait_until(lambda: _equal(_status(sql, run_id), ("completed", 1)), timeout=15)
        assert http.post("/v1/pools/default/resume").json()["resumed"] is False
        assert _paused_gauges(served) == {}


def test_a_type_pause_is_listed_and_only_an_admin_may_change_it(served: Served,
                                                               sql: Conn) -> None:
    with served.client() as http:
        assert http.post("/v1/types/svc.echo/pause").json()["created"] is True
        assert http.post("/v1/types/Bad Type!/pause").status_code == 422
        assert http.post("/v1/pools/default/pause", json={"reason": ""}).status_code == 422
        assert http.post("/v1/pools/default/pause",
                         json={"reason": "x", "extra": 1}).status_code == 422
    with served.client(READER) as http:
        listed = http.get("/v1/pauses").json()["items"]
        assert [(p["kind"], p["name"], p["reason"]) for p in listed] == [
            ("type", "svc.echo", None)]
        assert http.post("/v1/types/svc.echo/resume").status_code == 403
        assert http.post("/v1/pools/default/pause").status_code == 403
    assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 1
    assert _paused_gauges(served) == {("type", "svc.echo"): 1.0}


def test_the_cli_pauses_lists_and_resumes(dsn: str, sql: Conn) -> None:
    assert ok(dsn, "paused").strip() == "nothing paused"
    assert "paused type mail.send" in ok(dsn, "pause", "type", "mail.send", "--reason", "smtp")
    assert "was paused already" in ok(dsn, "pause", "type", "mail.send")
    ok(dsn, "pause", "pool", "reports")
    listed = json.loads(ok(dsn, "paused", "--json"))
    assert [(p["kind"], p["name"], p["reason"]) for p in listed] == [
        ("pool", "reports", None), ("type", "mail.send", "smtp")]
    assert "reports" in ok(dsn, "paused")
    assert "pool name" in fails(dsn, "pause", "pool", "Bad Pool")
    assert json.loads(ok(dsn, "resume", "pool", "reports", "--json"))["resumed"] is True
    assert "was not paused" in ok(dsn, "resume", "pool", "reports")
    assert scalar(sql, "SELECT array_agg(name) FROM notifyq.pause") == ["mail.send"]


def _equal(actual: object, expected: object) -> None:
    assert actual == expected, actual


def test_rate_limited_keys_are_listed_over_http_and_by_the_cli(served: Served, sql: Conn,
                                                                dsn: str) -> None:
    # A pool no worker serves: this test claims as a worker with the handler would.
    sql.execute("INSERT INTO notifyq.job (type, pool, rate_limit, rate_period_s) "
                "VALUES ('svc.rated', 'rated', 2, 60)")
    sql.execute("SELECT notifyq.enqueue('svc.rated', '{}') FROM generate_series(1, 3)")
    # Two start; the third waits a minute.
    claimed = sql.execute("SELECT count(*) FROM notifyq._claim_keyed('rated', 10, 'w', 30, "
                          "NULL)").fetchone()
    assert claimed == (2,)
    with served.client(READER) as http:
        listed = http.get("/v1/rate-limits")
    assert listed.status_code == 200, listed.text
    [window] = listed.json()["items"]
    assert {k: window[k] for k in ("key", "pool", "limit", "period_s", "in_window",
                                   "runnable")} == {
        "key": "type:svc.rated", "pool": "rated", "limit": 2, "period_s": 60.0,
        "in_window": 2, "runnable": 1}
    assert window["next_start_at"] is not None
    with served.client(None) as anonymous:
        assert anonymous.get("/v1/rate-limits").status_code == 401
    [row] = json.loads(ok(dsn, "rate-limits", "--json"))
    moment = datetime.fromisoformat
    assert moment(row.pop("next_start_at")) == moment(window.pop("next_start_at"))
    assert row == window
    assert "type:svc.rated" in ok(dsn, "rate-limits")
