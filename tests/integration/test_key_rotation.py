"""Key rotation end to end on real PostgreSQL: the secret.reencrypt job run by an in-process
worker (or called directly with a test hook between its read and its swap), rotate, status and
retire."""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest

from notifyq import (
    App,
    ConfigError,
    InvalidTransition,
    Keyring,
    PromotionRefused,
    RetiredKeyVersion,
    RotationInProgress,
)
from notifyq._crypto.ciphertext import Context
from notifyq._errors import StaleWriters
from notifyq._keys.reencrypt import Batch, BatchHook, ReencryptOptions, Reencryptor
from tests import vault
from tests.conftest import fast_settings
from tests.integration.inproc import running, status_becomes
from tests.support import eventually, scalar

pytestmark = pytest.mark.anyio

Sql = psycopg.Connection[Any]


def _reencryptor(app: App, on_batch: BatchHook | None = None) -> Reencryptor:
    """The App's ``secret.reencrypt`` handler, built apart so a test can hook its batches."""
    return Reencryptor(app._runtime, app.keys, on_batch=on_batch)


def _ctx(pk: Any) -> Context:
    return Context(vault.TABLE_A, "secret", str(pk))


async def _enqueue_rotation(app: App, **options: Any) -> tuple[UUID, ReencryptOptions]:
    async with (await app.pool()).connection() as conn:
        run, _ = await app.keys.rotate(conn)
    target = app.keyring.active_version
    assert target is not None
    return run.id, ReencryptOptions(target_version=target, **options)


def _max_xmin(sql: Sql) -> int:
    row = sql.execute("SELECT max(xmin::text::bigint) FROM vault_a").fetchone()
    assert row is not None
    return int(row[0])


async def test_rotating_ten_thousand_rows_across_two_tables_leaves_every_row_readable_by_the_new_key_alone(  # noqa: E501
        dsn: str, sql: Sql) -> None:
    ids = vault.fill(sql, vault.keyring(1, active=1), 6000, 4000)
    app = vault.vault_app(dsn, 1, 2, active=2)
    async with app, running(app):
        async with (await app.pool()).connection() as conn:
            run, created = await app.keys.rotate(conn)
        assert created
        row = await status_becomes(app, run.id, "completed", within=60)
        columns = {c["column"]: c for c in row["output"]["columns"]}
        assert columns["public.vault_a.secret"]["reencrypted"] == 6000
        assert columns["public.vault_b.token"]["reencrypted"] == 4000
        assert row["output"]["undecryptable"] == []

        assert vault.versions(sql) == {vault.TABLE_A: {2: 6000}, vault.TABLE_B: {2: 4000}}
        plain = vault.decrypt_all(sql, vault.keyring(2, active=2))
        assert plain[vault.TABLE_A] == {str(i): vault.plaintext_a(i) for i in range(1, 6001)}
        assert plain[vault.TABLE_B] == {str(u): vault.plaintext_b(i) for i, u in enumerate(ids)}

        before = _max_xmin(sql)
        async with (await app.pool()).connection() as conn:
            again, created = await app.keys.rotate(conn)
        assert created
        assert again.id != run.id
        row = await status_becomes(app, again.id, "completed", within=30)
        # vault_a, vault_b, then notifyq's own endpoint headers and secrets (empty here)
        assert [c["reencrypted"] for c in row["output"]["columns"]] == [0, 0, 0, 0]
        assert _max_xmin(sql) == before  # nothing was written


async def test_rotate_returns_the_pending_run_and_a_promotion_waits_until_it_is_over(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 10, 10)
    to_2 = vault.vault_app(dsn, 1, 2, active=2)
    admin = vault.vault_app(dsn, 1, 2, 3, active=None)  # follows the cluster's version
    async with to_2, admin:
        async with (await to_2.pool()).connection() as conn:
            first, created = await to_2.keys.rotate(conn)
            second, created_again = await to_2.keys.rotate(conn)
        assert (created, created_again) == (True, False)
        assert second.id == first.id
        async with (await admin.pool()).connection() as conn:
            await admin.keys.sync(conn)
            with pytest.raises(RotationInProgress, match=f"rotation to key version 2 is still "
                                                         f"pending \\(run {first.id}\\)"):
                await admin.keys.promote(conn, 3, by="test")
            await admin.cancel(first.id)
            with pytest.raises(PromotionRefused, match="1 live process\\(es\\) do not hold it: "
                                                       f"app {to_2._runtime.key_holder.id} "
                                                       "\\(holds 1, 2\\)") as refused:
                await admin.keys.promote(conn, 3, by="test")
            assert [p["id"] for p in refused.value.processes] == [to_2._runtime.key_holder.id]
    async with admin, (await admin.pool()).connection() as conn:  # to_2 has left
        promoted = await admin.keys.promote(conn, 3, by="test")
        third, created = await admin.keys.rotate(conn)
    assert (promoted["previous"], promoted["changed"]) == (2, True)
    assert created
    assert third.id != first.id
    assert third.input == {"target_version": 3}


async def test_a_write_between_the_read_and_the_swap_keeps_the_writers_value(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 300, 0)
    app = vault.vault_app(dsn, 1, 2, active=2)
    new = vault.keyring(1, 2, active=2)
    written: list[int] = []

    async def writer(batch: Batch) -> None:
        if batch.column.table == vault.TABLE_A and not written:
            pk = batch.pks[0]
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("UPDATE vault_a SET secret = %s WHERE id = %s",
                                   (new.encrypt(b"from the writer", _ctx(pk)), pk))
            written.append(pk)

    async with app:
        run_id, options = await _enqueue_rotation(app, batch_size=100)
        out = await _reencryptor(app, on_batch=writer).rotate(run_id, options)
    column = out["columns"][0]
    assert (column["reencrypted"], column["conflicts"], column["pass"]) == (299, 1, 2)
    plain = vault.decrypt_all(sql, vault.keyring(2, active=2))[vault.TABLE_A]
    assert plain[str(written[0])] == b"from the writer"
    assert vault.versions(sql)[vault.TABLE_A] == {2: 300}


async def test_a_concurrent_writer_updating_random_rows_during_rotation_loses_nothing(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 3000, 0)
    app = vault.vault_app(dsn, 1, 2, active=2)
    writer_ring = vault.keyring(1, 2, active=2)
    expected: dict[int, bytes] = {}
    stop = threading.Event()

    def write() -> None:
        rng = random.Random(7)
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                pk = rng.randint(1, 3000)
                value = f"write-{len(expected)}".encode()
                conn.execute("UPDATE vault_a SET secret = %s WHERE id = %s",
                             (writer_ring.encrypt(value, _ctx(pk)), pk))
                expected[pk] = value

    thread = threading.Thread(target=write, name="writer")
    async with app, running(app):
        thread.start()
        try:
            async with (await app.pool()).connection() as conn:
                run, _ = await app.keys.rotate(conn, batch_size=50, pause_s=0.01)
            row = await status_becomes(app, run.id, "completed", within=60)
        finally:
            stop.set()
            thread.join(30)
    assert len(expected) > 50, "the writer barely ran during the rotation"
    plain = vault.decrypt_all(sql, vault.keyring(2, active=2))[vault.TABLE_A]
    assert plain == {str(i): expected.get(i, vault.plaintext_a(i)) for i in range(1, 3001)}
    assert row["output"]["columns"][0]["finished"]


async def test_a_stale_writer_still_on_the_old_key_is_caught_by_the_verification_pass(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 500, 0)
    app = vault.vault_app(dsn, 1, 2, active=2)
    stale = vault.keyring(1, active=1)
    stale_rows = range(1, 11)

    async def stale_writer(batch: Batch) -> None:
        # Behind the cursor, after pass 1 already re-encrypted those rows.
        if batch.pass_number == 1 and batch.pks and batch.pks[0] == 201:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                for pk in stale_rows:
                    await conn.execute("UPDATE vault_a SET secret = %s WHERE id = %s",
                                       (stale.encrypt(b"stale %d" % pk, _ctx(pk)), pk))

    async with app:
        run_id, options = await _enqueue_rotation(app, batch_size=100)
        out = await _reencryptor(app, on_batch=stale_writer).rotate(run_id, options)
    column = out["columns"][0]
    assert column["reencrypted"] == 510
    assert column["pass"] == 3  # 1: all rows, 2: the stale ones, 3: nothing left
    assert vault.versions(sql)[vault.TABLE_A] == {2: 500}
    plain = vault.decrypt_all(sql, vault.keyring(2, active=2))[vault.TABLE_A]
    assert [plain[str(pk)] for pk in stale_rows] == [b"stale %d" % pk for pk in stale_rows]


async def test_a_writer_that_never_stops_using_the_old_key_fails_the_run_with_a_reason(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 50, 0)
    app = vault.vault_app(dsn, 1, 2, active=2)
    stale = vault.keyring(1, active=1)

    async def stubborn(batch: Batch) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("UPDATE vault_a SET secret = %s WHERE id = 50",
                               (stale.encrypt(b"again", _ctx(50)),))

    async with app:
        run_id, options = await _enqueue_rotation(app, batch_size=10, max_passes=3)
        with pytest.raises(StaleWriters, match="after 3 passes; some writer still uses"):
            await _reencryptor(app, on_batch=stubborn).rotate(run_id, options)


async def test_corrupted_rows_are_reported_and_skipped_and_the_rest_is_rotated(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 300, 20)
    blob7 = scalar(sql, "SELECT secret FROM vault_a WHERE id = 7")
    sql.execute("UPDATE vault_a SET secret = set_byte(secret, 40, get_byte(secret, 40) # 1) "
                "WHERE id = 5")
    sql.execute("UPDATE vault_a SET secret = %s WHERE id = 6", (blob7,))
    sql.execute("UPDATE vault_a SET secret = '\\x0102'::bytea WHERE id = 8")
    unknown = Keyring({9: vault.KEY3}, active=9)
    sql.execute("UPDATE vault_a SET secret = %s WHERE id = 9",
                (unknown.encrypt(b"v9", _ctx(9)),))
    app = vault.vault_app(dsn, 1, 2, active=2)
    async with app, running(app):
        async with (await app.pool()).connection() as conn:
            run, _ = await app.keys.rotate(conn, batch_size=100)
        row = await status_becomes(app, run.id, "completed", within=30)
        async with (await app.pool()).connection() as conn:
            status = await app.keys.status(conn)
    reported = {(f["column_name"], f["row_pk"]): f["reason"]
                for f in row["output"]["undecryptable"]}
    assert set(reported) == {("public.vault_a.secret", pk) for pk in ("5", "6", "8", "9")}
    assert reported[("public.vault_a.secret", "5")].startswith("DecryptionFailed: cannot "
                                                                "decrypt public.vault_a.secret "
                                                                "row 5: authentication failed")
    assert "too short" in reported[("public.vault_a.secret", "8")]
    assert reported[("public.vault_a.secret", "9")].startswith("UnknownKeyVersion")
    assert vault.versions(sql)[vault.TABLE_A] == {0: 1, 1: 2, 2: 296, 9: 1}
    assert vault.versions(sql)[vault.TABLE_B] == {2: 20}
    assert status["rotation"]["undecryptable"] == 4
    assert [c["remaining"] for c in status["columns"]] == [4, 0, 0, 0]  # + webhook columns


async def test_retire_is_refused_while_rows_use_the_version_and_afterwards_it_no_longer_decrypts(
        dsn: str, sql: Sql) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 100, 10)
    old_blob = vault.keyring(1, active=1).encrypt(b"old", _ctx(1))
    app = vault.vault_app(dsn, 1, 2, active=2)
    async with app:
        async with (await app.pool()).connection() as conn:
            with pytest.raises(InvalidTransition, match=r"key version 1 is still used by 110 "
                                                        r"rows \(public.vault_a.secret: 100, "
                                                        r"public.vault_b.token: 10\)"):
                await app.keys.retire(conn, 1)
            with pytest.raises(InvalidTransition, match="key version 2 is the active version"):
                await app.keys.retire(conn, 2)
            with pytest.raises(InvalidTransition, match="key version 9 was never configured"):
                await app.keys.retire(conn, 9)
        run_id, options = await _enqueue_rotation(app)
        await _reencryptor(app).rotate(run_id, options)
        async with (await app.pool()).connection() as conn:
            retired = await app.keys.retire(conn, 1)
            status = await app.keys.status(conn)
        assert retired["version"] == 1
        assert [(v["version"], v["retired"], v["active"]) for v in status["versions"]] == [
            (1, True, False), (2, False, True)]
        with pytest.raises(RetiredKeyVersion):
            app.keyring.decrypt(old_blob, _ctx(1))
    elsewhere = vault.vault_app(dsn, 1, 2, active=2)  # another process, still configured with 1
    async with elsewhere:
        async with (await elsewhere.pool()).connection() as conn:
            ring = await elsewhere.keys.sync(conn)
        with pytest.raises(RetiredKeyVersion, match="key version 1 is retired"):
            ring.decrypt(old_blob, _ctx(1))


async def test_a_different_key_under_a_known_version_stops_the_start_naming_the_version(
        dsn: str) -> None:
    first = vault.vault_app(dsn, 1, 2, active=2)
    async with first, (await first.pool()).connection() as conn:
        await first.keys.sync(conn)
    swapped = App(settings=fast_settings(
        dsn, keys=f"1:{vault.b64(vault.KEY1)},2:{vault.b64(vault.KEY3)}", active_key_version=2))
    async with swapped:
        with pytest.raises(ConfigError, match="key version 2 does not match the key that "
                                              "encrypted existing data") as raised:
            await swapped.run_worker(burst=True)
    for key in (vault.KEY2, vault.KEY3):
        assert vault.b64(key) not in str(raised.value)
        assert key.hex() not in str(raised.value)


async def test_a_batch_meeting_a_row_locked_by_live_traffic_backs_off_and_is_retried(
        dsn: str, sql: Sql, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="notifyq.reencrypt")
    vault.fill(sql, vault.keyring(1, active=1), 200, 0)
    app = vault.vault_app(dsn, 1, 2, active=2)
    async with app:
        run_id, options = await _enqueue_rotation(app, batch_size=100)
        with psycopg.connect(dsn) as holder:  # live traffic holding row 150 in a transaction
            holder.execute("SELECT 1 FROM vault_a WHERE id = 150 FOR UPDATE")
            result: dict[str, Any] = {}

            async def rotate() -> None:
                result.update(await _reencryptor(app).rotate(run_id, options))

            async with anyio.create_task_group() as tg:
                tg.start_soon(rotate)

                async def backed_off() -> None:
                    assert "locked by live traffic; retrying" in caplog.text
                await eventually(backed_off, timeout=20)
                assert result == {}
                holder.rollback()
    assert result["columns"][0]["reencrypted"] == 200
    assert vault.versions(sql)[vault.TABLE_A] == {2: 200}


async def test_no_log_line_error_output_or_repr_of_a_whole_rotation_contains_key_material(
        dsn: str, sql: Sql, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    vault.fill(sql, vault.keyring(1, active=1), 400, 100)
    sql.execute("UPDATE vault_a SET secret = set_byte(secret, 40, get_byte(secret, 40) # 1) "
                "WHERE id = 3")
    app = vault.vault_app(dsn, 1, 2, active=2)
    async with app, running(app):
        async with (await app.pool()).connection() as conn:
            run, _ = await app.keys.rotate(conn, batch_size=50)
        row = await status_becomes(app, run.id, "completed", within=30)
        async with (await app.pool()).connection() as conn:
            status = await app.keys.status(conn)
    texts = [caplog.text, json.dumps(row["output"]), json.dumps(status), repr(app.keyring),
             repr(app.settings), str(app.settings)]
    assert "row 3" in texts[1]  # the corrupted row is there, with its reason
    for key in (vault.KEY1, vault.KEY2):
        forms = [vault.b64(key), key.hex(), base64.urlsafe_b64encode(key).decode()]
        forms += [f[:16] for f in forms]
        for form in forms:
            assert not any(form in t for t in texts), "key material leaked"
    for marker in ("secret-a-", "token-b-"):
        assert not any(marker in t for t in texts), "plaintext leaked"
