"""``notifyq serve`` over real HTTP when things are not as they should be: no token configured,
an unmigrated (or newer) schema, an error nobody expected; and its Swagger UI with no CDN."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.integration.serving import Served
from tests.support import ROOT
from tests.vault import keys_env

PROBLEM = "application/problem+json"


def _problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    return body


def _records(log: str) -> list[dict[str, Any]]:
    """The JSON log records of a serve log (other stderr lines skipped)."""
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


# -- item 4: a quick start without a token --------------------------------------------------


@pytest.fixture
def data_home(tmp_path: Path) -> Path:
    return tmp_path / "share"


def _announcements(server: Served) -> list[str]:
    return [line for line in server.log_path.read_text().splitlines()
            if "no API token is configured" in line]


def test_serve_on_loopback_without_a_token_generates_one_in_a_private_file_and_reuses_it(
        dsn: str, logs: Path, data_home: Path) -> None:
    env = {"XDG_DATA_HOME": str(data_home)}
    path = data_home / "notifyq" / "admin-token"
    with Served(dsn, logs / "first.log", tokens=False, env=env, args=["--no-worker"]) as first:
        token = path.read_text().strip()
        assert path.stat().st_mode & 0o777 == 0o600
        assert len(token) >= 32
        assert _announcements(first) == [
            f"notifyq: no API token is configured: generated an admin token in {path} (only "
            f"you can read it); use it with `export NOTIFYQ_ADMIN_TOKEN=$(cat {path})`, or set "
            "NOTIFYQ_ADMIN_TOKEN yourself to choose the token"]
        with first.client(token) as http:
            assert http.get("/v1/stats").status_code == 200
            assert http.post("/v1/jobs", json={"job_type": "svc.echo"}).status_code == 201
        with first.client(None) as anonymous:
            detail = _problem(anonymous.get("/v1/stats"), 401)["detail"]
        assert "Authorization: Bearer <token>" in detail
        assert first.terminate() == 0
        assert token not in first.log_path.read_text()
        assert token not in detail

    with Served(dsn, logs / "second.log", tokens=False, env=env, args=["--no-worker"]) as again:
        assert path.read_text().strip() == token
        assert _announcements(again)[0].startswith(
            f"notifyq: no API token is configured: using an admin token in {path} ")
        with again.client(token) as http:
            assert http.get("/v1/stats").status_code == 200
        assert again.terminate() == 0
        assert token not in again.log_path.read_text()


def test_serve_with_a_configured_token_generates_none(dsn: str, logs: Path,
                                                      data_home: Path) -> None:
    with Served(dsn, logs / "serve.log", env={"XDG_DATA_HOME": str(data_home)},
                args=["--no-worker"]) as server:
        assert _announcements(server) == []
        assert not data_home.exists()


def test_an_invalid_token_is_told_how_to_authenticate_and_nothing_else(dsn: str,
                                                                       logs: Path) -> None:
    with Served(dsn, logs / "serve.log", args=["--no-worker"]) as server, \
            server.client("not-the-token-0123456789") as http:
        detail = _problem(http.get("/v1/jobs"), 401)["detail"]
    assert detail.startswith("invalid bearer token: send the header `Authorization: Bearer "
                             "<token>`")


# -- item 8: problem+json for every error ----------------------------------------------------


@pytest.fixture
def unmigrated(empty_dsn: str, logs: Path) -> Iterator[Served]:
    # With a keyring: the webhook routes are served too.
    with Served(empty_dsn, logs / "serve.log", args=["--no-worker"],
                env=keys_env(1, active=1)) as server:
        yield server


def test_an_unmigrated_database_answers_503_problem_json_saying_to_migrate_until_it_is(
        unmigrated: Served, empty_dsn: str) -> None:
    with unmigrated.client() as http:
        for response in (http.get("/v1/jobs"), http.get("/v1/stats"), http.get("/v1/keys"),
                         http.post("/v1/jobs", json={"job_type": "svc.echo"}),
                         http.get("/v1/webhooks/endpoints")):
            detail = _problem(response, 503)["detail"]
            assert "schema 'notifyq' is not migrated" in detail
            assert detail.endswith("run `notifyq migrate`")
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["schema"] == "not migrated: run `notifyq migrate`"

        migrated = subprocess.run(
            [sys.executable, "-m", "notifyq", "migrate"], cwd=ROOT, capture_output=True,
            text=True, timeout=60, check=False,
            env={**os.environ, "NOTIFYQ_DATABASE_URL": empty_dsn, "PYTHONPATH": str(ROOT)})
        assert migrated.returncode == 0, migrated.stderr

        assert http.get("/v1/stats").status_code == 200  # the same server, no restart
        assert http.get("/readyz").status_code == 200
    log = unmigrated.log()
    assert "Traceback" not in log
    assert [r for r in _records(log) if r["level"] == "ERROR"] == []


def test_a_schema_migrated_by_a_newer_notifyq_answers_503_saying_to_upgrade(
        dsn: str, sql: psycopg.Connection[Any], logs: Path) -> None:
    sql.execute("INSERT INTO notifyq.schema_migration (version, name, checksum) "
                "VALUES (9999, 'from_the_future', 'x')")
    with Served(dsn, logs / "serve.log", args=["--no-worker"]) as server, \
            server.client() as http:
        detail = _problem(http.get("/v1/jobs"), 503)["detail"]
        assert "migrated by a newer notifyq; upgrade this one" in detail
        assert http.get("/readyz").json()["checks"]["schema"] == (
            "ahead: migrated by a newer notifyq; upgrade this one")


def test_an_unexpected_error_is_a_500_problem_json_logged_once_without_internals(
        dsn: str, sql: psycopg.Connection[Any], logs: Path) -> None:
    with Served(dsn, logs / "serve.log", args=["--no-worker"]) as server, \
            server.client() as http:
        assert http.get("/v1/jobs").status_code == 200
        # A schema changed behind notifyq's back: every listing now fails inside the server.
        sql.execute("ALTER TABLE notifyq.job_run RENAME COLUMN tags TO tags_elsewhere")

        body = _problem(http.get("/v1/jobs", params={"tag": "secret-tag"}), 500)
        assert http.get("/healthz").status_code == 200  # and the server goes on
        log = server.log()

    error_id = re.fullmatch(r"unexpected server error \(error id ([0-9a-f]{12})\); the server "
                            r"log has the details", body["detail"])
    assert error_id is not None, body
    assert set(body) == {"type", "title", "status", "detail"}
    errors = [r for r in _records(log) if r["level"] == "ERROR"]
    assert len(errors) == 1, log
    assert errors[0]["message"] == (
        f"GET /v1/jobs: unexpected UndefinedColumn (error id {error_id[1]})")
    assert "secret-tag" not in log
    assert "Error in ASGI Framework" not in log


# -- item 12: Swagger UI without a CDN ---------------------------------------------------------


def test_the_docs_page_loads_swagger_ui_only_from_the_server_itself(dsn: str,
                                                                    logs: Path) -> None:
    with Served(dsn, logs / "serve.log", args=["--no-worker"]) as server, \
            server.client(None) as http:
        page = http.get("/v1/docs")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        html = page.text
        urls = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)
        assert "://" not in html.replace("http://www.w3.org", "")  # no absolute URL at all
        expected = {"/v1/docs/assets/swagger-ui-bundle.js": "text/javascript",
                    "/v1/docs/assets/swagger-ui.css": "text/css",
                    "/v1/docs/assets/favicon.png": "image/png",
                    "/v1/openapi.json": "application/json"}
        assert sorted(urls) == sorted(expected)
        for url, content_type in expected.items():
            response = http.get(url)
            assert response.status_code == 200, url
            assert response.headers["content-type"].split(";")[0] == content_type
        assert "SwaggerUIBundle" in http.get("/v1/docs/assets/swagger-ui-bundle.js").text
        _problem(http.get("/v1/docs/assets/nothing.js"), 404)
