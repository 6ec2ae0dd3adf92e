"""``notifyq serve`` over real HTTP: a real process on a free port against the test's database.

Every endpoint's happy path and its auth failures, problem+json for every kind of bad request,
Prometheus text that parses and moves, a bounded schemathesis run, and SIGTERM under load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.serving import ADMIN, READER, Served
from tests.support import ROOT, scalar, status_counts, wait_until
from tests.vault import keys_env

Conn = psycopg.Connection[Any]
PROBLEM = "application/problem+json"
UNKNOWN_ID = "01900000-0000-7000-8000-000000000000"


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log") as server:
        yield server


@pytest.fixture
def keyed(dsn: str, logs: Path) -> Iterator[Served]:
    """With a keyring, so webhooks are enabled and every route of the API is served."""
    with Served(dsn, logs / "serve.log", env=keys_env(1, active=1)) as server:
        yield server


def _problem(response: Any, status: int, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["detail"]
    if field is not None:
        assert body.get("field") == field, body
    return body


def _completed(sql: Conn, run_id: str) -> None:
    assert scalar(sql, "SELECT status FROM notifyq.job_run WHERE id = %s", (run_id,)) == (
        "completed")


def test_every_jobs_endpoint_works_over_http(served: Served, sql: Conn) -> None:
    with served.client() as http:
        created = http.post("/v1/jobs", json={"job_type": "svc.echo", "input": {"n": 1},
                                              "tags": ["t1"], "dedupe_key": "once"})
        assert created.status_code == 201, created.text
        run = created.json()
        again = http.post("/v1/jobs", json={"job_type": "svc.echo", "dedupe_key": "once"})
        assert again.status_code == 200
        assert again.json()["id"] == run["id"]

        batch = http.post("/v1/jobs/batch", json={"jobs": [
            {"job_type": "svc.echo", "input": [i], "pool": "default"} for i in range(3)]})
        assert batch.status_code == 201, batch.text
        assert [r["input"] for r in batch.json()["items"]] == [[0], [1], [2]]
        wait_until(lambda: _completed(sql, run["id"]), timeout=15)

        sql.execute("INSERT INTO notifyq.job_step (run_id, step_id, seq, status, output) "
                    "VALUES (%s, 'charge', 1, 'completed', '7')", (run["id"],))
        sql.execute("UPDATE notifyq.job_run SET parent_run_id = %s WHERE id = %s",
                    (run["id"], batch.json()["items"][0]["id"]))
        detail = http.get(f"/v1/jobs/{run['id']}").json()
        assert detail["status"] == "completed"
        assert detail["output"] == {"n": 1}
        assert [(s["step_id"], s["output"]) for s in detail["steps"]] == [("charge", 7)]
        assert [c["id"] for c in detail["children"]] == [batch.json()["items"][0]["id"]]

        page = http.get("/v1/jobs", params={"type": "svc.echo", "limit": 3}).json()
        assert len(page["items"]) == 3
        assert page["next_cursor"] == page["items"][-1]["id"]
        rest = http.get("/v1/jobs", params={"type": "svc.echo", "limit": 3,
                                            "cursor": page["next_cursor"]}).json()
        assert [r["id"] for r in page["items"] + rest["items"]] == sorted(
            [run["id"], *(r["id"] for r in batch.json()["items"])], reverse=True)
        assert rest["next_cursor"] is None
        tagged = http.get("/v1/jobs", params={"tag": "t1", "status": "completed",
                                              "pool": "default"}).json()
        assert [r["id"] for r in tagged["items"]] == [run["id"]]

        later = http.post("/v1/jobs", json={"job_type": "svc.echo",
                                            "run_at": "2999-01-01T00:00:00Z"}).json()
        canceled = http.post(f"/v1/jobs/{later['id']}/cancel")
        assert canceled.status_code == 200
        assert canceled.json()["status"] == "canceled"
        _problem(http.post(f"/v1/jobs/{later['id']}/cancel"), 409, "id")
        retried = http.post(f"/v1/jobs/{later['id']}/retry")
        assert retried.status_code == 200
        assert retried.json()["status"] == "pending"
        wait_until(lambda: _completed(sql, later["id"]), timeout=15)

        signaled = http.post("/v1/signals/order-42", json={"paid": True})
        assert signaled.status_code == 202, signaled.text
        assert signaled.json() == {"token": "order-42", "woken": 0}  # kept for a later wait
        assert scalar(sql, "SELECT payload FROM notifyq.job_signal WHERE token = 'order-42'"
                      ) == {"paid": True}

        keys = http.get("/v1/keys")  # no keyring configured in this test
        assert keys.status_code == 200, keys.text
        assert keys.json()["active_version"] is None
        _problem(http.post("/v1/admin/rotate-key"), 409)
        _problem(http.post("/v1/admin/keys/7/retire"), 409)

        stats = http.get("/v1/stats").json()
        assert {"job_type": "svc.echo", "pool": "default", "status": "completed",
                "count": 5} in stats["counts"]
        assert http.get("/healthz").json()["status"] == "ok"
        ready = http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"database": "ok", "schema": "ok", "listener": "ok"}


def test_a_busy_reject_concurrency_key_is_409_and_runs_filter_by_scope_and_tenant(
        served: Served) -> None:
    with served.client() as http:
        first = http.post("/v1/jobs", json={"job_type": "svc.exclusive", "tenant_id": "acme",
                                            "input": {"acct": "7", "seconds": 30}})
        assert first.status_code == 201, first.text
        busy = http.post("/v1/jobs", json={"job_type": "svc.exclusive",
                                           "input": {"acct": "7"}})
        _problem(busy, 409, "concurrency_key")
        assert "busy" in busy.json()["detail"]
        listed = http.get("/v1/jobs", params={"scope": "account", "scope_id": "7",
                                              "tenant": "acme"})
        assert listed.status_code == 200, listed.text
        assert [r["id"] for r in listed.json()["items"]] == [first.json()["id"]]
        assert http.get("/v1/jobs", params={"tenant": "other"}).json()["items"] == []
        http.post(f"/v1/jobs/{first.json()['id']}/cancel")


def test_a_request_without_a_valid_token_gets_401_and_a_read_token_cannot_write(
        served: Served) -> None:
    with served.client(None) as anonymous, served.client("wrong-token-0123456789") as wrong, \
            served.client(READER) as reader, served.client(ADMIN) as admin:
        for client in (anonymous, wrong):
            body = _problem(client.get("/v1/jobs"), 401)
            assert ADMIN not in json.dumps(body)
            assert READER not in json.dumps(body)
            _problem(client.post("/v1/jobs", json={"job_type": "svc.echo"}), 401)
        assert reader.get("/v1/jobs").status_code == 200
        assert reader.get("/v1/stats").status_code == 200
        _problem(reader.post("/v1/jobs", json={"job_type": "svc.echo"}), 403)
        _problem(reader.post("/v1/jobs/batch", json={"jobs": [{"job_type": "svc.echo"}]}), 403)
        run_id = admin.post("/v1/jobs", json={"job_type": "svc.echo"}).json()["id"]
        assert reader.get(f"/v1/jobs/{run_id}").status_code == 200
        _problem(reader.post(f"/v1/jobs/{run_id}/cancel"), 403)
        _problem(reader.post(f"/v1/jobs/{run_id}/retry"), 403)
        _problem(reader.post("/v1/signals/t", json={}), 403)
        assert anonymous.get("/healthz").status_code == 200  # probes need no token
    assert ADMIN not in served.log()
    assert READER not in served.log()


def test_bad_requests_get_problem_json_naming_the_field(served: Served) -> None:
    with served.client() as http:
        big = b'{"job_type": "svc.echo", "input": {"x": "' + b"a" * 1_100_000 + b'"}}'
        _problem(http.post("/v1/jobs", content=big), 413, "body")
        chunked = http.post("/v1/jobs", content=iter([b"[", b" " * 1_100_000, b"]"]))
        _problem(chunked, 413, "body")
        _problem(http.post("/v1/jobs", content=b'{"job_type": "svc.echo",'), 400, "body")
        _problem(http.post("/v1/jobs", json={"job_type": 5}), 422, "job_type")
        _problem(http.post("/v1/jobs", json={"job_type": "svc.echo", "priority": "high"}),
                 422, "priority")
        _problem(http.post("/v1/jobs", json={"job_type": "svc.echo", "input": "text"}),
                 422, "input")
        _problem(http.post("/v1/jobs", json={"job_type": "Bad Type"}), 422, "job_type")
        _problem(http.post("/v1/jobs", json={"job_type": "svc.echo",
                                             "input": {"x": "y" * 70_000}}), 413, "input")
        _problem(http.post("/v1/jobs", json={"job_type": "svc.echo", "surprise": 1}),
                 422, "surprise")
        _problem(http.post("/v1/jobs", json={"job_type": "svc.echo", "run_at": "tomorrow"}),
                 422, "run_at")
        _problem(http.get(f"/v1/jobs/{UNKNOWN_ID}"), 404, "id")
        _problem(http.post(f"/v1/jobs/{UNKNOWN_ID}/retry"), 404, "id")
        _problem(http.get("/v1/jobs/not-a-uuid"), 422, "id")
        _problem(http.post("/v1/jobs/not-a-uuid/cancel"), 422, "id")
        _problem(http.get("/v1/jobs", params={"status": "sleeping"}), 422, "status")
        _problem(http.get("/v1/jobs", params={"cursor": "nope"}), 422, "cursor")
        _problem(http.get("/v1/nothing-here"), 404)


@pytest.mark.parametrize("content_type", [
    "application/x-www-form-urlencoded", "text/plain;charset=UTF-8", None])
def test_a_json_body_is_read_as_json_whatever_the_content_type_says(
        keyed: Served, sql: Conn, content_type: str | None) -> None:
    """`curl -d` (the README's examples) sends form-encoded; a JSON body is still JSON."""
    status, media, body = keyed.curl_post(
        "/v1/jobs", b'{"job_type": "svc.echo", "input": {"to": "a@b.c"}}',
        content_type=content_type)
    assert (status, media) == (201, "application/json"), body
    run = json.loads(body)
    assert run["input"] == {"to": "a@b.c"}
    wait_until(lambda: _completed(sql, run["id"]), timeout=15)

    status, _, body = keyed.curl_post(
        "/v1/jobs/batch", b'{"jobs": [{"job_type": "svc.echo"}, {"job_type": "svc.echo"}]}',
        content_type=content_type)
    assert status == 201, body
    assert len(json.loads(body)["items"]) == 2
    status, _, body = keyed.curl_post("/v1/signals/order-42", b'{"approved": true}',
                                       content_type=content_type)
    assert (status, json.loads(body)) == (202, {"token": "order-42", "woken": 0})
    assert scalar(sql, "SELECT payload FROM notifyq.job_signal WHERE token = 'order-42'"
                  ) == {"approved": True}
    status, _, body = keyed.curl_post("/v1/webhooks/messages",
                                       b'{"event_type": "invoice.paid", "payload": {"id": 1}}',
                                       content_type=content_type)
    assert (status, json.loads(body)["deliveries"]) == (201, 0)


def test_malformed_json_under_any_content_type_is_a_400_problem(served: Served) -> None:
    for content_type in ("application/x-www-form-urlencoded", "application/json", None):
        status, media, body = served.curl_post("/v1/jobs", b'{"job_type": "svc.echo",',
                                               content_type=content_type)
        assert (status, media) == (400, PROBLEM), body
        problem = json.loads(body)
        assert problem["field"] == "body"
        assert "not valid JSON" in problem["detail"]
    status, media, body = served.curl_post("/v1/jobs", b"job_type=svc.echo")
    assert (status, media) == (400, PROBLEM), body  # a real form body is not JSON either


def test_metrics_parse_as_prometheus_text_and_move_when_runs_finish(
        served: Served, sql: Conn) -> None:
    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with served.client(None) as http:
            text = http.get("/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    before = samples()
    assert ("notifyq_lease_lost_total", ()) in before
    with served.client() as http:
        ok = http.post("/v1/jobs", json={"job_type": "svc.echo"}).json()["id"]
        bad = http.post("/v1/jobs", json={"job_type": "svc.fail"}).json()["id"]
    wait_until(lambda: _completed(sql, ok), timeout=15)

    def moved() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        now = samples()
        assert now.get(("notifyq_runs_completed_total", (("job_type", "svc.echo"),))) == 1
        assert now.get(("notifyq_runs_failed_total", (("job_type", "svc.fail"),))) == 1
        return now

    after = wait_until(moved, timeout=15)
    assert after[("notifyq_runs_enqueued_total", (("job_type", "svc.echo"),))] == 1
    assert after[("notifyq_handler_duration_seconds_count", (("job_type", "svc.echo"),))] == 1
    assert after[("notifyq_wake_latency_seconds_count", ())] >= 1
    assert after[("notifyq_runs", (("job_type", "svc.fail"), ("pool", "default"),
                                   ("status", "failed")))] == 1
    assert after[("notifyq_listener_connected", ())] == 1
    # Logs are JSON lines (stderr is a file here) and a run's lines carry its id and type.
    lines = [json.loads(line) for line in served.log_path.read_text().splitlines()
             if line.startswith("{")]
    about_bad = [line for line in lines if line.get("run_id") == bad]
    assert about_bad
    assert all(line["run_type"] == "svc.fail" for line in about_bad)


def test_the_openapi_document_holds_under_schemathesis(keyed: Served, logs: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{keyed.url}/v1/openapi.json",
         "--checks", "not_a_server_error,response_schema_conformance,"
                     "content_type_conformance,status_code_conformance",
         "--header", f"Authorization: Bearer {ADMIN}", "--max-examples", "8",
         # One worker thread: hypothesis describes its filters by parsing their source with
         # ast, and CPython 3.11's AST recursion counter is not thread-safe (two threads at
         # once raise "SystemError: AST constructor recursion depth mismatch").
         "--phases", "examples,coverage,fuzzing", "--max-time", "25", "--workers", "1",
         "--seed", "1", "--request-timeout", "10"],
        capture_output=True, text=True, cwd=logs, timeout=90, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "5xx" not in keyed.log()


def test_sigterm_under_load_loses_no_job(dsn: str, sql: Conn, logs: Path) -> None:
    total = 60
    with Served(dsn, logs / "first.log") as first:
        with first.client() as http:
            for _ in range(total // 20):
                response = http.post("/v1/jobs/batch", json={"jobs": [
                    {"job_type": "svc.slow", "input": {"seconds": 0.3}}] * 20})
                assert response.status_code == 201
        wait_until(lambda: _assert(status_counts(sql).get("completed", 0) >= 5), timeout=15)
        assert first.terminate() == 0, first.log()
    counts = status_counts(sql)
    assert sum(counts.values()) == total
    assert counts.get("running", 0) == 0, counts  # finished or released, none left leased
    assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE leased_by IS NOT NULL") == 0
    with Served(dsn, logs / "second.log") as second:
        def all_completed() -> None:
            counts = status_counts(sql)
            assert counts == {"completed": total}, (counts, sql.execute(
                "SELECT status, attempts, run_at - now() AS due_in, leased_by FROM "
                "notifyq.job_run WHERE status <> 'completed'").fetchall(), second.log()[-3000:])
        wait_until(all_completed, timeout=30)
        assert second.terminate() == 0, second.log()


def test_serve_refuses_a_public_address_without_a_token(logs: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "notifyq", "serve", "--host", "0.0.0.0", "--no-worker"],  # noqa: S104
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
             "NOTIFYQ_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"},
        capture_output=True, text=True, cwd=logs, timeout=30, check=False)
    assert result.returncode == 1
    assert "refusing to serve the admin API on non-loopback address '0.0.0.0' without a " \
           "token" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _assert(condition: bool) -> None:
    assert condition
