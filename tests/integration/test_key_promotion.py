"""Issue 35: the active key version as a cluster setting, promoted by a command; rotation an
admin tool can drive. Real PostgreSQL; the CLI and ``serve`` as real processes, workers in
process (the deploy-rollout with worker processes is tests/chaos/test_key_rollout.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifyq import ConfigError
from notifyq._crypto.ciphertext import version_of
from tests import vault
from tests.integration.inproc import running, status_becomes
from tests.integration.serving import ADMIN, Served
from tests.support import ROOT, Workers, eventually, scalar, wait_until

pytestmark = pytest.mark.anyio

Sql = psycopg.Connection[Any]
VAULT_APP = "tests.apps.vault:app"
DOCS = ROOT / "docs" / "keys.md"

STATUS_FIELDS = {"schema_version", "active_version", "promotion", "versions", "processes",
                 "columns", "rotation", "progress", "rows_left", "processes_left", "done"}
PROMOTION_FIELDS = {"version", "promoted_at", "promoted_by", "forced"}
VERSION_FIELDS = {"version", "active", "configured", "decrypt_only", "retired",
                  "first_seen_at", "promoted_at", "held_by", "encrypted_by"}
PROCESS_FIELDS = {"id", "role", "host", "pid", "versions", "encrypts_with", "holds_active",
                  "checked_at", "expires_at"}
COLUMN_FIELDS = {"column", "rows", "by_version", "remaining"}
ROTATION_FIELDS = {"run_id", "status", "target_version", "created_at", "started_at",
                   "finished_at", "paused", "paused_at", "rate_limit_per_s", "batch_size",
                   "columns", "undecryptable", "rate_per_s"}
CHECKPOINT_FIELDS = {"column", "pass", "reencrypted", "conflicts", "batches", "finished"}
PROGRESS_FIELDS = {"done", "total", "percent", "rate_per_s", "eta_s"}
"""``keys status --json`` schema version 1, as docs/keys.md documents it: a field may be
added (here and there), never renamed or dropped."""


def _cli(dsn: str, *args: str, keys: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")}
    env.update({"NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_ENV": "test", "PYTHONPATH": str(ROOT),
                **keys})
    return subprocess.run([sys.executable, "-m", "notifyq", *args, "--app", VAULT_APP],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)


def check_schema(status: dict[str, Any]) -> None:
    """Every object of a status answer has exactly the fields of schema version 1."""
    assert set(status) == STATUS_FIELDS
    assert status["schema_version"] == 1
    assert status["promotion"] is None or set(status["promotion"]) == PROMOTION_FIELDS
    for entry, fields in ((status["versions"], VERSION_FIELDS),
                          (status["processes"], PROCESS_FIELDS),
                          (status["columns"], COLUMN_FIELDS)):
        assert all(set(e) == fields for e in entry), entry
    rotation = status["rotation"]
    if rotation is not None:
        assert set(rotation) == ROTATION_FIELDS
        assert all(set(c) == CHECKPOINT_FIELDS for c in rotation["columns"])
    assert set(status["progress"]) == PROGRESS_FIELDS


def test_docs_keys_md_documents_every_field_of_the_status_schema() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)`", text, re.M))
    every = (STATUS_FIELDS | PROMOTION_FIELDS | VERSION_FIELDS | PROCESS_FIELDS | COLUMN_FIELDS
             | ROTATION_FIELDS | CHECKPOINT_FIELDS | PROGRESS_FIELDS)
    assert every - documented == set()


async def test_keys_status_json_keeps_its_schema_and_exits_3_until_rows_and_processes_are_on_the_active_version(  # noqa: E501
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 30, 5)
    both = vault.keys_env(1, 2, active=None)
    app = vault.vault_app(dsn, 1, 2, active=1)
    async with app:
        async with (await app.pool()).connection() as conn:
            await app.keys.sync(conn)  # the cluster's first active version: 1
        first = _cli(dsn, "keys", "status", "--json", keys=both)
        assert first.returncode == 0, first.stderr  # all on 1, the active version
        status = json.loads(first.stdout)
        check_schema(status)
        assert (status["active_version"], status["done"], status["rows_left"]) == (1, True, 0)
        assert [(p["pid"], p["role"], p["versions"], p["encrypts_with"])
                for p in status["processes"]] == [(os.getpid(), "app", [1, 2], 1)]
        assert [(v["version"], v["held_by"], v["encrypted_by"]) for v in status["versions"]] == [
            (1, 1, 1), (2, 1, 0)]

        promoted = _cli(dsn, "keys", "promote", "2", "--json", keys=both)
        assert promoted.returncode == 0, promoted.stderr
        assert json.loads(promoted.stdout) | {"promoted_at": None} == {
            "version": 2, "previous": 1, "changed": True, "promoted_at": None, "forced": False,
            "lacking": []}
        behind = _cli(dsn, "keys", "status", "--json", keys=both)
        assert behind.returncode == 3, behind.stderr
        status = json.loads(behind.stdout)
        check_schema(status)
        assert (status["done"], status["rows_left"]) == (False, 35)
        assert status["promotion"]["promoted_by"].startswith("notifyq keys promote on ")
        text = _cli(dsn, "keys", "status", keys=both)
        assert text.returncode == 3
        assert "not done: 35 rows" in text.stdout

        async with running(app):
            async with (await app.pool()).connection() as conn:
                run, _ = await app.keys.rotate(conn)
            await status_becomes(app, run.id, "completed", within=30)
        done = _cli(dsn, "keys", "status", "--json", keys=both)
        assert done.returncode == 0, done.stdout
        status = json.loads(done.stdout)
        check_schema(status)
        assert (status["done"], status["rows_left"], status["processes_left"]) == (True, 0, [])


async def test_promote_is_refused_naming_the_process_without_the_key_and_force_leaves_it_unable_to_encrypt(  # noqa: E501
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 3, 0)
    old = vault.vault_app(dsn, 1, active=1)  # deployed before version 2 existed
    column = old.encrypted_column(vault.TABLE_A, column="secret")
    both = vault.keys_env(1, 2, active=None)
    async with old:
        written_under_1 = old.keyring.encrypt(b"before", column.context(7))  # checks first
        refused = _cli(dsn, "keys", "promote", "2", keys=both)
        assert refused.returncode == 1
        holder = old._runtime.key_holder.id
        assert refused.stderr.splitlines() == [
            f"notifyq: error: key version 2 cannot be promoted: 1 live process(es) do not hold "
            f"it: app {holder} (holds 1). Add version 2 to their NOTIFYQ_KEYS (or "
            "NOTIFYQ_KEY_FILE) and restart them (a stopped one drops out three key-check "
            "intervals after its last check); --force promotes anyway, and those processes then "
            "refuse to encrypt and cannot read anything written under version 2"]
        assert scalar(sql, "SELECT version FROM notifyq.key_active") == 1

        forced = _cli(dsn, "keys", "promote", "2", "--force", keys=both)
        assert forced.returncode == 0, forced.stderr
        assert forced.stderr.splitlines()[-1] == (
            "warning: promoted although 1 live process(es) lack version 2: they refuse to "
            "encrypt until they get it")
        assert scalar(sql, "SELECT forced FROM notifyq.key_active") is True
        async with (await old.pool()).connection() as conn:
            await old.keys.sync(conn)  # its next key check
        with pytest.raises(ConfigError, match="key version 2 is active but this process does "
                                              "not hold it"):
            old.keyring.encrypt(b"after", column.context(8))
        assert old.keyring.decrypt(written_under_1, column.context(7)) == b"before"
        row = sql.execute("SELECT encrypts_with FROM notifyq.key_holder WHERE id = %s",
                          (holder,)).fetchone()
        assert row == (None,)
    unknown = _cli(dsn, "keys", "promote", "3", keys=both)
    assert unknown.returncode == 1
    assert "key version 3 is not known: no process has held it yet" in unknown.stderr


def test_setting_the_active_version_everywhere_promotes_it_once_the_last_process_holds_it(
        dsn: str, sql: Sql, logs: Path) -> None:
    """NOTIFYQ_ACTIVE_KEY_VERSION=2 on processes restarted one by one: version 2 becomes the
    cluster's when the last process without it is gone, not when the first one asks."""
    old = {**vault.keys_env(1, active=1), "NOTIFYQ_KEY_CHECK_INTERVAL_S": "0.5"}
    new = {**vault.keys_env(1, 2, active=2), "NOTIFYQ_KEY_CHECK_INTERVAL_S": "0.5"}
    with Workers(dsn, logs, app=VAULT_APP, concurrency=2) as workers:
        first, second = workers.start(extra_env=old), workers.start(extra_env=old)
        workers.wait_registered()
        wait_until(lambda: _active_is(sql, 1), timeout=30)
        workers.stop_one(first)
        first = workers.start(extra_env=new)

        def asked_and_refused() -> None:
            assert "processes that do not hold it yet: worker " in workers.logs(), workers.logs()
            assert f":{second.pid}:" in workers.logs()
        wait_until(asked_and_refused, timeout=30)
        assert scalar(sql, "SELECT version FROM notifyq.key_active") == 1
        workers.stop_one(second)
        workers.start(extra_env=new)
        wait_until(lambda: _active_is(sql, 2), timeout=30)
        by = scalar(sql, "SELECT promoted_by FROM notifyq.key_active")
        assert by.startswith("NOTIFYQ_ACTIVE_KEY_VERSION of worker ")
        assert workers.stop_all() == [0, 0]


async def test_an_older_active_version_in_a_processs_environment_never_moves_the_cluster_back(
        dsn: str, sql: Sql) -> None:
    newer = vault.vault_app(dsn, 1, 2, active=2)
    stale = vault.vault_app(dsn, 1, 2, active=1)  # an old deployment setting, never active
    column = stale.encrypted_column(vault.TABLE_A, column="secret")
    async with newer, stale:
        async with (await newer.pool()).connection() as conn:
            await newer.keys.sync(conn)  # the cluster's first active version: 2
        blob = stale.keyring.encrypt(b"x", column.context(1))  # its check runs first
    assert version_of(blob) == 2
    assert scalar(sql, "SELECT version FROM notifyq.key_active") == 2
    assert scalar(sql, "SELECT promoted_at FROM notifyq.key_version WHERE version = 1") is None


def _active_is(sql: Sql, version: int) -> None:
    assert scalar(sql, "SELECT version FROM notifyq.key_active") == version


async def test_a_rate_limited_rotation_keeps_to_its_rate_and_reports_progress_with_an_eta(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 1500, 0)
    app = vault.vault_app(dsn, 1, 2, active=2)
    seen: list[dict[str, Any]] = []
    async with app, running(app):
        async with (await app.pool()).connection() as conn:
            run, _ = await app.keys.rotate(conn, rate_per_s=500)

        async def reported_with_an_eta() -> None:
            async with (await app.pool()).connection() as conn:
                status = await app.keys.status(conn)
            seen.append(status)
            assert status["progress"]["eta_s"] is not None, status["progress"]
            assert status["rotation"]["rate_limit_per_s"] == 500
        await eventually(reported_with_an_eta, timeout=20, interval=0.2)
        row = await status_becomes(app, run.id, "completed", within=30)
    busy_s = scalar(sql, "SELECT extract(epoch FROM max(updated_at) - %s)::float8 FROM "
                         "notifyq.key_rotation_progress", (row["started_at"],))
    assert busy_s >= 2.5, busy_s  # 1,500 rows at 500/s: three batches a second apart
    assert row["output"]["columns"][0]["reencrypted"] == 1500
    assert seen[-1]["progress"]["rate_per_s"] <= 500 * 1.1, seen[-1]["progress"]
    assert vault.versions(sql)[vault.TABLE_A] == {2: 1500}


async def test_a_paused_rotation_steps_aside_and_resumes_from_its_last_batch(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 2000, 0)
    app = vault.vault_app(dsn, 1, 2, active=2)
    async with app, running(app):
        async with (await app.pool()).connection() as conn:
            run, _ = await app.keys.rotate(conn, rate_per_s=400, batch_size=100)

        async def some_done() -> None:
            assert _reencrypted(sql) >= 300
        await eventually(some_done, timeout=20)
        async with (await app.pool()).connection() as conn:
            paused = await app.keys.pause(conn)
        assert paused["run_id"] == str(run.id)
        await status_becomes(app, run.id, "pending", within=10)  # snoozed, slot free
        at_pause = _reencrypted(sql)
        assert at_pause < 2000
        async with (await app.pool()).connection() as conn:
            status = await app.keys.status(conn)
            assert status["rotation"]["paused"]
            assert status["progress"]["eta_s"] is None
            resumed = await app.keys.resume(conn, rate_per_s=0)  # and lift the limit
        assert resumed == {"run_id": str(run.id), "resumed": True}
        row = await status_becomes(app, run.id, "completed", within=30)
    assert _reencrypted(sql) == 2000  # nothing done twice: it went on from its checkpoint
    assert row["attempts"] == 1  # the snooze used no attempt
    rotation = sql.execute("SELECT paused_at, paused_s > 0, rate_per_s FROM "
                           "notifyq.key_rotation").fetchone()
    assert rotation == (None, True, None)
    assert vault.versions(sql)[vault.TABLE_A] == {2: 2000}


def _reencrypted(sql: Sql) -> int:
    return int(scalar(sql, "SELECT coalesce(sum(reencrypted), 0) FROM "
                           "notifyq.key_rotation_progress"))


async def test_the_http_api_promotes_rotates_throttled_pauses_and_resumes(
        dsn: str, sql: Sql, logs: Path) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 1200, 0)
    lacking = vault.vault_app(dsn, 1, active=1)  # records vault_a, holds only version 1
    async with lacking:
        async with (await lacking.pool()).connection() as conn:
            await lacking.keys.sync(conn)
        with Served(dsn, logs / "serve.log", env=vault.keys_env(1, 2, active=1)) as served, \
                served.client(ADMIN) as http:
            answer = http.get("/v1/keys")
            assert answer.status_code == 200, answer.text
            check_schema(answer.json())
            refused = http.post("/v1/admin/keys/promote", json={"version": 2})
            assert refused.status_code == 409, refused.text
            assert [p["id"] for p in refused.json()["processes"]] == [
                lacking._runtime.key_holder.id]
            await lacking.close()  # the lacking process stops (and leaves the key holders)
            promoted = http.post("/v1/admin/keys/promote", json={"version": 2})
            assert promoted.status_code == 200, promoted.text
            assert promoted.json()["changed"]
            assert http.post("/v1/admin/keys/promote", json={"version": 2}).json()[
                "changed"] is False

            started = http.post("/v1/admin/rotate-key", json={"rate_per_s": 300})
            assert started.status_code == 202, started.text

            def running_with_an_eta() -> None:
                status = http.get("/v1/keys").json()
                assert status["progress"]["eta_s"] is not None, status
            wait_until(running_with_an_eta, timeout=30)
            assert http.post("/v1/admin/keys/rotation/pause").status_code == 200
            wait_until(lambda: _is(http.get("/v1/keys").json()["rotation"]["paused"]))
            resumed = http.post("/v1/admin/keys/rotation/resume", json={"rate_per_s": 0})
            assert resumed.json() == {"run_id": started.json()["run_id"], "resumed": True}
            wait_until(lambda: _is(http.get("/v1/keys").json()["done"]), timeout=30)
            wait_until(lambda: _is(http.get("/v1/keys").json()["rotation"]["status"]
                                   == "completed"), timeout=30)
            nothing = http.post("/v1/admin/keys/rotation/pause")
            assert nothing.status_code == 409
            assert "nothing to pause" in nothing.json()["detail"]
            openapi = http.get("/v1/openapi.json").json()
            assert {"/v1/admin/keys/promote", "/v1/admin/keys/rotation/pause",
                    "/v1/admin/keys/rotation/resume"} <= set(openapi["paths"])
    assert version_of(sql.execute("SELECT secret FROM vault_a WHERE id = 1").fetchone()[0]) == 2  # type: ignore[index]


def _is(value: Any) -> None:
    assert value

