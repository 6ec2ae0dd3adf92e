"""Shared pieces of the key-rotation tests: keys, two encrypted tables (bigint and uuid primary
keys), filling them under a key version and reading them back."""

from __future__ import annotations

import base64
import os
import uuid
from typing import Any

import psycopg

from notifyq import App, Keyring
from notifyq._crypto.ciphertext import Context
from tests.conftest import fast_settings

KEY1 = os.urandom(32)
KEY2 = os.urandom(32)
KEY3 = os.urandom(32)


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def keys_env(*versions: int, active: int | None) -> dict[str, str]:
    """NOTIFYQ_KEYS / NOTIFYQ_ACTIVE_KEY_VERSION for the given versions of KEY1..KEY3 (no
    NOTIFYQ_ACTIVE_KEY_VERSION for ``active=None``: the process follows the cluster's)."""
    material = {1: KEY1, 2: KEY2, 3: KEY3}
    env = {"NOTIFYQ_KEYS": ",".join(f"{v}:{b64(material[v])}" for v in versions)}
    if active is not None:
        env["NOTIFYQ_ACTIVE_KEY_VERSION"] = str(active)
    return env


def keyring(*versions: int, active: int) -> Keyring:
    material = {1: KEY1, 2: KEY2, 3: KEY3}
    return Keyring({v: material[v] for v in versions}, active=active)


TABLE_A = "public.vault_a"
TABLE_B = "public.vault_b"

DDL = """
CREATE TABLE IF NOT EXISTS vault_a (id bigint PRIMARY KEY, secret bytea);
CREATE TABLE IF NOT EXISTS vault_b (id uuid PRIMARY KEY, token bytea NOT NULL);
CREATE INDEX IF NOT EXISTS vault_a_key_version ON vault_a (notifyq.key_version_of(secret));
"""


def vault_app(dsn: str, *versions: int, active: int | None, **overrides: Any) -> App:
    """An App with keys ``versions`` (KEY1..KEY3), ``active``, and both tables registered."""
    env = keys_env(*versions, active=active)
    app = App(settings=fast_settings(dsn, keys=env["NOTIFYQ_KEYS"], active_key_version=active,
                                     **overrides))
    register_tables(app)
    return app


def register_tables(app: App) -> None:
    app.encrypted_column(TABLE_A, pk="id", column="secret")
    app.encrypted_column(TABLE_B, pk="id", column="token")


def plaintext_a(i: int) -> bytes:
    return f"secret-a-{i}".encode()


def plaintext_b(i: int) -> bytes:
    return f"token-b-{i}".encode()


def fill(conn: psycopg.Connection[Any], ring: Keyring, n_a: int, n_b: int) -> list[uuid.UUID]:
    """Rows 1..n_a in vault_a and n_b uuid rows in vault_b, encrypted under ring's active key.
    Returns vault_b's ids in order (row i has plaintext_b(i))."""
    conn.execute(DDL)
    ids = [uuid.UUID(int=i + 1) for i in range(n_b)]
    with conn.cursor() as cur:
        with cur.copy("COPY vault_a (id, secret) FROM STDIN") as copy:
            for i in range(1, n_a + 1):
                copy.write_row((i, ring.encrypt(plaintext_a(i), Context(TABLE_A, "secret",
                                                                         str(i)))))
        with cur.copy("COPY vault_b (id, token) FROM STDIN") as copy:
            for i, row_id in enumerate(ids):
                copy.write_row((row_id, ring.encrypt(plaintext_b(i),
                                                     Context(TABLE_B, "token", str(row_id)))))
    return ids


def decrypt_all(conn: psycopg.Connection[Any], ring: Keyring) -> dict[str, dict[str, bytes]]:
    """Every row of both tables decrypted with ``ring``: {table: {pk: plaintext}}."""
    out: dict[str, dict[str, bytes]] = {TABLE_A: {}, TABLE_B: {}}
    for table, column in ((TABLE_A, "secret"), (TABLE_B, "token")):
        rows = conn.execute(f"SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL")
        for pk, blob in rows.fetchall():
            out[table][str(pk)] = ring.decrypt(bytes(blob), Context(table, column, str(pk)))
    return out


def versions(conn: psycopg.Connection[Any]) -> dict[str, dict[int, int]]:
    """Rows per key version of both tables, read in SQL."""
    out = {}
    for table, column in ((TABLE_A, "secret"), (TABLE_B, "token")):
        rows = conn.execute(f"SELECT notifyq.key_version_of({column}), count(*) FROM {table} "
                            f"WHERE {column} IS NOT NULL GROUP BY 1")
        out[table] = dict(rows.fetchall())
    return out
