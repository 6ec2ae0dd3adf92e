"""Issue 12, items 1 and 2: every process that encrypts or decrypts checks its keyring against
the database first (and again within ``key_check_interval_s``), and retire, status and rotate
count every encrypted column any process recorded, whoever asks. Real PostgreSQL, real CLI and
``serve`` processes."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifyq import App, ConfigError, InvalidTransition, RetiredKeyVersion
from notifyq._crypto.ciphertext import version_of
from notifyq._db.queries import queries_for
from notifyq._keys.check import KeyCheck, KeyHolder, _run_sync
from notifyq._keys.columns import EncryptedColumns
from tests import vault
from tests.conftest import fast_settings
from tests.integration.serving import ADMIN, Served
from tests.integration.test_cli import notifyq
from tests.support import eventually

pytestmark = pytest.mark.anyio

Sql = psycopg.Connection[Any]
WRONG_KEY = base64.b64encode(os.urandom(32)).decode()
MISMATCH = "key version 2 does not match the key that encrypted existing data"


async def _record_versions_1_and_2(dsn: str) -> None:
    """A first process (keys 1 and 2) checks its keyring: the database now knows both."""
    first = vault.vault_app(dsn, 1, 2, active=2)
    async with first, (await first.pool()).connection() as conn:
        await first.keys.sync(conn)


def _wrong_app(dsn: str, **overrides: Any) -> App:
    """A process given a different key under version 2 (and the right one under 1)."""
    return App(settings=fast_settings(
        dsn, keys=f"1:{vault.b64(vault.KEY1)},2:{WRONG_KEY}", active_key_version=2,
        **overrides))


async def test_a_plain_app_with_a_wrong_key_cannot_create_an_endpoint_and_writes_nothing(
        dsn: str, sql: Sql) -> None:
    await _record_versions_1_and_2(dsn)
    app = _wrong_app(dsn)
    async with app:
        with pytest.raises(ConfigError, match=MISMATCH) as raised:
            await app.webhooks.create_endpoint("https://example.com/hook")
        # and it keeps refusing: a failed check leaves the next call due for another
        with pytest.raises(ConfigError, match=MISMATCH):
            await app.webhooks.create_endpoint("https://example.com/hook")
    assert WRONG_KEY not in str(raised.value)
    assert sql.execute("SELECT count(*) FROM notifyq.webhook_endpoint").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM notifyq.webhook_secret").fetchone() == (0,)


async def test_app_keyring_used_directly_by_a_web_app_checks_itself_before_the_first_encrypt(
        dsn: str) -> None:
    await _record_versions_1_and_2(dsn)
    app = _wrong_app(dsn)
    context = app.encrypted_column(vault.TABLE_A, column="secret").context(1)
    async with app:
        with pytest.raises(ConfigError, match=MISMATCH):
            app.keyring.encrypt(b"s3cret", context)
        with pytest.raises(ConfigError, match=MISMATCH):
            app.keyring.decrypt(vault.keyring(2, active=2).encrypt(b"x", context), context)


async def test_the_cli_with_a_wrong_key_refuses_to_add_an_endpoint(dsn: str, sql: Sql) -> None:
    await _record_versions_1_and_2(dsn)
    env_keys = f"1:{vault.b64(vault.KEY1)},2:{WRONG_KEY}"
    os.environ["NOTIFYQ_KEYS"], os.environ["NOTIFYQ_ACTIVE_KEY_VERSION"] = env_keys, "2"
    try:
        result = notifyq(dsn, "webhooks", "endpoints", "add", "https://example.com/hook")
    finally:
        del os.environ["NOTIFYQ_KEYS"], os.environ["NOTIFYQ_ACTIVE_KEY_VERSION"]
    assert result.returncode == 1, result.stdout
    assert MISMATCH in result.stderr
    assert WRONG_KEY not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert sql.execute("SELECT count(*) FROM notifyq.webhook_endpoint").fetchone() == (0,)


async def test_serve_without_a_worker_and_a_wrong_key_refuses_to_store_an_endpoint(
        dsn: str, sql: Sql, tmp_path: Path) -> None:
    await _record_versions_1_and_2(dsn)
    env = {"NOTIFYQ_KEYS": f"1:{vault.b64(vault.KEY1)},2:{WRONG_KEY}",
           "NOTIFYQ_ACTIVE_KEY_VERSION": "2"}
    with Served(dsn, tmp_path / "serve.log", args=["--no-worker"], env=env) as served, \
            served.client(ADMIN) as client:
        response = client.post("/v1/webhooks/endpoints", json={"url": "https://example.com/h"})
    assert response.status_code == 409, response.text
    assert MISMATCH in response.text
    assert WRONG_KEY not in response.text
    assert sql.execute("SELECT count(*) FROM notifyq.webhook_endpoint").fetchone() == (0,)


async def test_a_promotion_and_a_retirement_reach_a_running_process_within_the_interval(
        dsn: str, sql: Sql) -> None:
    """A process that started on version 1 encrypts under 2 within key_check_interval_s (0.5 s
    here) of its promotion elsewhere, and stops reading version 1 as soon after it is retired
    elsewhere (which is refused until that process took version 2)."""
    vault.fill(sql, vault.keyring(1, active=1), 0, 0)
    old = vault.vault_app(dsn, 1, 2, active=1, key_check_interval_s=0.5)
    admin = vault.vault_app(dsn, 1, 2, active=None, key_check_interval_s=0.5)
    column = old.encrypted_column(vault.TABLE_A, column="secret")
    async with old, admin:
        blob = old.keyring.encrypt(b"before", column.context(1))  # checked: 1 is active
        assert version_of(blob) == 1
        async with (await admin.pool()).connection() as conn:
            await admin.keys.promote(conn, 2, by="test")

        async def encrypts_under_2() -> None:
            assert version_of(old.keyring.encrypt(b"after", column.context(2))) == 2
        await eventually(encrypts_under_2, timeout=5)
        async with (await admin.pool()).connection() as conn:
            await admin.keys.retire(conn, 1)

        async def refused() -> None:
            assert _raised(lambda: old.keyring.decrypt(blob, column.context(1))) == (
                f"RetiredKeyVersion: cannot decrypt {column.context(1)}: key version 1 is "
                "retired")
        await eventually(refused, timeout=5)


def _raised(call: Any) -> str | None:
    try:
        call()
    except (ConfigError, RetiredKeyVersion) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def test_retire_counts_a_column_registered_only_by_another_process(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 3, 0)
    application = vault.vault_app(dsn, 1, 2, active=2)  # registers vault_a and vault_b
    async with application, (await application.pool()).connection() as conn:
        await application.keys.sync(conn)  # what any encrypt or decrypt does first
    bare = App(settings=fast_settings(dsn, keys=vault.keys_env(1, 2, active=2)["NOTIFYQ_KEYS"],
                                      active_key_version=2))  # registers nothing
    async with bare, (await bare.pool()).connection() as conn:
        with pytest.raises(InvalidTransition, match=r"key version 1 is still used by 3 rows "
                                                    r"\(public.vault_a.secret: 3\)"):
            await bare.keys.retire(conn, 1)
        status = await bare.keys.status(conn)
        run, _ = await bare.keys.rotate(conn)
    assert [c["column"] for c in status["columns"]] == [
        "public.vault_a.secret", "public.vault_b.token",
        "notifyq.webhook_endpoint.header_values", "notifyq.webhook_secret.ciphertext"]
    assert status["columns"][0]["remaining"] == 3
    assert sql.execute("SELECT retired_at FROM notifyq.key_version WHERE version = 1"
                       ).fetchone() == (None,)
    # the bare process's own rotation re-encrypts the column it never registered
    from notifyq._keys.reencrypt import ReencryptOptions, Reencryptor

    async with bare:
        out = await Reencryptor(bare._runtime, bare.keys).rotate(
            run.id, ReencryptOptions(target_version=2))
    assert out["columns"][0]["column"] == "public.vault_a.secret"
    assert out["columns"][0]["reencrypted"] == 3
    assert vault.versions(sql)[vault.TABLE_A] == {2: 3}


async def test_retire_over_http_against_serve_without_the_app_is_refused_while_rows_use_it(
        dsn: str, sql: Sql, tmp_path: Path) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 2, 0)
    application = vault.vault_app(dsn, 1, 2, active=2)
    async with application:
        application.keyring.decrypt(
            sql.execute("SELECT secret FROM vault_a WHERE id = 1").fetchone()[0],  # type: ignore[index]
            application.encrypted_column(vault.TABLE_A, column="secret").context(1))
    with Served(dsn, tmp_path / "serve.log", args=["--no-worker"],
                env=vault.keys_env(1, 2, active=2)) as served, served.client(ADMIN) as client:
        response = client.post("/v1/admin/keys/1/retire")
    assert response.status_code == 409, response.text
    assert "public.vault_a.secret: 2" in response.text
    assert sql.execute("SELECT retired_at FROM notifyq.key_version WHERE version = 1"
                       ).fetchone() == (None,)


KEY_TABLE = "SELECT version, check_value, first_seen_at, retired_at FROM notifyq.key_version " \
            "ORDER BY version"


async def test_a_start_refused_for_a_wrong_known_key_records_no_new_version(
        dsn: str, sql: Sql, tmp_path: Path) -> None:
    """Issue 31, item 4: with rows under version 1, ``serve`` started with
    ``1:<wrong>,2:<new>`` is refused, and the key table is as it was: recording 2's check
    value first (the old order) refused the right deployment's own key 2 afterwards."""
    vault.fill(sql, vault.keyring(1, active=1), 3, 0)
    first = vault.vault_app(dsn, 1, active=1)
    async with first, (await first.pool()).connection() as conn:
        await first.keys.sync(conn)
    before = sql.execute(KEY_TABLE).fetchall()
    assert [row[0] for row in before] == [1]
    env = {"NOTIFYQ_KEYS": f"1:{WRONG_KEY},2:{vault.b64(vault.KEY3)}",
           "NOTIFYQ_ACTIVE_KEY_VERSION": "2"}
    served = Served(dsn, tmp_path / "serve.log", env=env, wait=False)
    try:
        assert served.proc.wait(30) != 0, served.log()
    finally:
        served.kill()
    assert "key version 1 does not match the key that encrypted existing data" in served.log()
    assert WRONG_KEY not in served.log()
    after = sql.execute(KEY_TABLE).fetchall()
    assert [row[0] for row in after] == [1]  # was [1, 2]: 2's check value of the wrong start
    assert after == before
    # the right deployment, with its own key under version 2, starts
    right = vault.vault_app(dsn, 1, 2, active=2)
    async with right, (await right.pool()).connection() as conn:
        await right.keys.sync(conn)
    assert [row[0] for row in sql.execute(KEY_TABLE).fetchall()] == [1, 2]


async def test_a_version_recorded_meanwhile_with_another_key_refuses_and_rolls_back_ours(
        dsn: str, sql: Sql) -> None:
    """The check reads, verifies, then records what is new and verifies again in the same
    transaction: a version another process recorded meanwhile under another key is refused,
    and the versions this check recorded with it are rolled back."""
    first = vault.vault_app(dsn, 1, active=1)
    async with first, (await first.pool()).connection() as conn:
        await first.keys.sync(conn)
    app = App(settings=fast_settings(
        dsn, keys=f"1:{vault.b64(vault.KEY1)},2:{vault.b64(vault.KEY2)},3:{WRONG_KEY}",
        active_key_version=2))
    # what a concurrent start records between this check's read and its insert
    racer = vault.keyring(1, 3, active=3).check_values()[3]
    async with app, (await app.pool()).connection() as conn:
        app.keyring  # noqa: B018 - builds the keyring and its check
        check = app._runtime._key_check
        assert check is not None
        original = check._missing_versions

        def raced(rows: Any) -> Any:
            sql.execute("INSERT INTO notifyq.key_version (version, check_value) VALUES (3, %s)",
                        (racer,))
            return original(rows)

        check._missing_versions = raced  # type: ignore[method-assign]
        with pytest.raises(ConfigError, match="key version 3 does not match"):
            await app.keys.sync(conn)
    assert [row[0] for row in sql.execute(KEY_TABLE).fetchall()] == [1, 3]


def test_a_process_that_finds_its_first_version_promoted_by_another_meanwhile_encrypts_under_it(
        dsn: str, sql: Sql) -> None:
    """Two processes start together with NOTIFYQ_ACTIVE_KEY_VERSION=1 on a cluster with no
    active version: both read the list (none active), the first promotes 1, and the second's
    promotion finds it done ("unchanged"). The second must follow 1, not the None it read: it
    once refused every encrypt until its next check (the rolling-deploy chaos test lost its
    writer's first messages to it)."""
    columns = EncryptedColumns()
    column = columns.register(vault.TABLE_A, column="secret")

    def check(wanted: int | None) -> KeyCheck:
        return KeyCheck(queries_for("notifyq"), vault.keyring(1, active=1), columns,
                        interval_s=60, monotonic=lambda: 0.0,
                        holder=KeyHolder.of_this_process(), wanted=wanted)

    first, second = check(1), check(1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        check(None).run_sync(conn)  # version 1 recorded by a process that promotes nothing
        plan = second._plan()
        listed = _run_sync(conn, next(plan))  # the second reads the list: nothing active yet
        assert [(row["version"], row["active"]) for row in listed] == [(1, False)]
        first.run_sync(conn)  # the first promotes 1 meanwhile
        assert sql.execute("SELECT version FROM notifyq.key_active").fetchone() == (1,)
        step, finished = plan.send(listed), False
        while not finished:  # the rest of the second's check: its promotion finds 1 active
            try:
                step = plan.send(_run_sync(conn, step))
            except StopIteration:
                finished = True
    assert second.keyring.active_version == 1
    assert version_of(second.keyring.encrypt(b"secret", column.context(7))) == 1
