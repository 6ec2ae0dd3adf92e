"""Issue 12, item 9: the admin API's tokens and what it gives away. Tokens from the environment
are as long as those of the config file, no two tokens share a value, a stranger's request is
refused before its body is read, the settings' repr hides the DSN password, and the read-only
``GET /v1/keys`` writes nothing. Real ``notifyq serve`` processes over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from notifyq._settings import load_settings
from tests import vault
from tests.integration.serving import ADMIN, READER, Served
from tests.support import wait_until

Sql = psycopg.Connection[Any]


def _refused_to_start(dsn: str, logs: Path, env: dict[str, str]) -> str:
    with Served(dsn, logs / "serve.log", tokens=False, env=env, wait=False) as server:
        code = server.proc.wait(timeout=30)
        assert code != 0, server.log()
        return server.log()


@pytest.mark.parametrize("name", ["ADMIN", "READ"])
def test_serve_refuses_an_admin_or_read_token_from_the_environment_shorter_than_16_characters(
        dsn: str, logs: Path, name: str) -> None:
    env = {"NOTIFYQ_ADMIN_TOKEN": ADMIN, "NOTIFYQ_READ_TOKEN": READER,
           f"NOTIFYQ_{name}_TOKEN": "short-token"}
    log = _refused_to_start(dsn, logs, env)
    assert f"api.{name.lower()}_token" in log
    assert "at least 16 characters" in log
    assert "short-token" not in log


def test_serve_refuses_an_admin_token_equal_to_the_read_token(dsn: str, logs: Path) -> None:
    log = _refused_to_start(dsn, logs, {"NOTIFYQ_ADMIN_TOKEN": ADMIN,
                                        "NOTIFYQ_READ_TOKEN": ADMIN})
    assert "read_token has the same value as admin_token" in log
    assert ADMIN not in log


def test_serve_refuses_two_named_tokens_with_one_value(dsn: str, logs: Path) -> None:
    tokens = [{"name": "ci", "token": READER + "x"}, {"name": "ops", "token": READER + "x",
                                                     "scopes": ["admin"]}]
    log = _refused_to_start(dsn, logs, {"NOTIFYQ_ADMIN_TOKEN": ADMIN,
                                        "NOTIFYQ_API__TOKENS": json.dumps(tokens)})
    assert "tokens['ops'] has the same value as tokens['ci']" in log


def test_a_request_without_a_valid_token_is_401_before_its_body_is_read(
        dsn: str, logs: Path) -> None:
    with Served(dsn, logs / "serve.log", args=["--no-worker"]) as server:
        for headers in ({}, {"Authorization": "Bearer not-a-token-of-this-server"}):
            with httpx.Client(base_url=server.url, headers=headers) as http:
                bad_json = http.post("/v1/jobs", content=b'{"job_type": ')
                assert bad_json.status_code == 401, bad_json.text
                assert bad_json.headers["www-authenticate"] == 'Bearer realm="notifyq"'
                # Its body was never read: the server closes, and says so, so this client
                # does not send the next request into a closing connection.
                assert bad_json.headers["connection"] == "close"
                assert http.post("/v1/jobs", content=b"{}").status_code == 401
                too_big = http.post("/v1/jobs", content=b"x" * 2_000_000)
                assert too_big.status_code == 401, too_big.text
        status, _, body = server.curl_post("/v1/jobs", b'{"job_type": ')
        assert status == 400, body  # with the token: the usual problem about the body
        with server.client(None) as anonymous:  # no data there: no token needed
            assert anonymous.get("/v1/openapi.json").status_code == 200
            assert anonymous.get("/healthz").status_code == 200


def test_the_settings_repr_hides_the_database_passwords() -> None:
    settings = load_settings(
        database_url="postgresql://app:hunter2-secret@db.internal:5432/app",
        listen_database_url="host=db.internal user=app password=hunter3-secret")
    for text in (repr(settings), str(settings)):
        assert "hunter2-secret" not in text
        assert "hunter3-secret" not in text
        assert "postgresql://app:***@db.internal:5432/app" in text
    assert settings.database_url == "postgresql://app:hunter2-secret@db.internal:5432/app"


def _key_rows(sql: Sql) -> tuple[int, int]:
    versions = sql.execute("SELECT count(*) FROM notifyq.key_version").fetchone()
    columns = sql.execute("SELECT count(*) FROM notifyq.encrypted_column").fetchone()
    assert versions is not None
    assert columns is not None
    return versions[0], columns[0]


def test_key_status_with_the_read_token_writes_nothing(dsn: str, logs: Path, sql: Sql) -> None:
    """The server records its own keys once at start (it is a key holder, issue 35); a
    status request, with a read token, writes nothing beyond that."""
    with Served(dsn, logs / "serve.log", env=vault.keys_env(1, active=1),
                args=["--no-worker"]) as server, server.client(READER) as http:
        wait_until(lambda: _key_rows(sql) == (1, 2))  # its first key check (+ webhook columns)
        holders = sql.execute("SELECT id FROM notifyq.key_holder").fetchall()
        status = http.get("/v1/keys")
        assert status.status_code == 200, status.text
        assert [(v["version"], v["configured"], v["active"])
                for v in status.json()["versions"]] == [(1, True, True)]
        assert _key_rows(sql) == (1, 2)
        assert sql.execute("SELECT id FROM notifyq.key_holder").fetchall() == holders
