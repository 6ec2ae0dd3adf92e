"""The key check: a process's keyring compared with the database before it encrypts or decrypts.

Every process that holds a keyring (a worker, ``serve --no-worker``, the CLI, a web app calling
``app.keyring`` or ``app.webhooks``) runs it before its first encrypt or decrypt, and again once
``key_check_interval_s`` has passed since the last one succeeded. One check:

1. reads ``key_version`` and refuses (``ConfigError``) a configured key whose check value
   differs from the recorded one, and an active version that is retired; loads the retired
   versions into the keyring (they no longer decrypt);
2. only then records the check value of each configured version the table does not hold yet,
   and verifies again in the same transaction (a process that started meanwhile may have
   recorded another key under the same new version: the refusal rolls ours back). A refused
   check writes nothing: recording first let ``1:<wrong>,2:<new>`` store 2's check value before
   1 was refused, and the right deployment with another key 2 was refused after it. Nothing
   is written when all versions are known, so a read-only route stays read-only;
3. records in ``encrypted_column`` the columns this process registered that it has not recorded
   yet, so ``keys status``, ``rotate`` and ``retire`` count them in every process.

A failed check leaves the next encrypt or decrypt due for another check: a process whose key is
wrong keeps refusing, with the same error, until it is restarted with the right key. A
retirement reaches every running process within ``key_check_interval_s``.

The check is the same SQL whether the caller is async (:meth:`KeyCheck.run`, what notifyq's own
components await before they touch the keyring) or sync (:meth:`KeyCheck.run_sync`, which the
keyring's guard runs on a connection of the synchronous pool when user code calls
``app.keyring.encrypt`` with the check due).
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from notifyq._crypto.keyring import Keyring
from notifyq._db.queries import Queries
from notifyq._errors import ConfigError
from notifyq._keys.columns import EncryptedColumns

Statement = tuple[str, dict[str, Any]]


class KeyCheck:
    """Verifies one keyring against ``key_version`` and records the registered columns.

    Example::

        check = KeyCheck(queries, keyring, columns, interval_s=10, monotonic=time.monotonic)
        if check.due():
            await check.run(conn)
    """

    def __init__(self, queries: Queries, keyring: Keyring, columns: EncryptedColumns, *,
                 interval_s: float, monotonic: Callable[[], float]) -> None:
        self._q = queries
        self.keyring = keyring
        self._columns = columns
        self._interval_s = interval_s
        self._monotonic = monotonic
        self._checked_at: float | None = None
        self._recorded: set[str] = set()
        self.lock = threading.Lock()
        """Held by the sync guard so that threads do not run the same check at once."""

    def due(self) -> bool:
        """Never checked, the last check failed, or ``interval_s`` passed since it succeeded."""
        checked = self._checked_at
        return checked is None or self._monotonic() - checked >= self._interval_s

    async def run(self, conn: psycopg.AsyncConnection[Any]) -> Keyring:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._q.key_version_list)
            rows = await cur.fetchall()
            self._verify(rows)  # a wrong known key is refused before anything is recorded
            insert = self._missing_versions(rows)
            if insert is not None:
                async with conn.transaction():
                    await cur.execute(*insert)
                    await cur.execute(self._q.key_version_list)
                    self._verify(await cur.fetchall())  # another process's, recorded meanwhile
            pending, record = self._unrecorded()
            if record is not None:
                await cur.execute(*record)
        return self._succeeded(pending)

    def run_sync(self, conn: psycopg.Connection[Any]) -> Keyring:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(self._q.key_version_list)
            rows = cur.fetchall()
            self._verify(rows)
            insert = self._missing_versions(rows)
            if insert is not None:
                with conn.transaction():
                    cur.execute(*insert)
                    cur.execute(self._q.key_version_list)
                    self._verify(cur.fetchall())
            pending, record = self._unrecorded()
            if record is not None:
                cur.execute(*record)
        return self._succeeded(pending)

    # -- the pure parts ------------------------------------------------------------------------

    def _missing_versions(self, rows: Sequence[Mapping[str, Any]]) -> Statement | None:
        known = {r["version"] for r in rows}
        mine = {v: c for v, c in self.keyring.check_values().items() if v not in known}
        if not mine:
            return None
        return self._q.key_version_register, {"now": None, "versions": list(mine),
                                               "check_values": list(mine.values())}

    def verify(self, rows: Sequence[Mapping[str, Any]]) -> Keyring:
        """Step 2 of a check against ``key_version`` rows the caller read, writing nothing
        and leaving the next encrypt or decrypt due for a full check (what read-only callers
        such as ``keys status`` use)."""
        self._verify(rows)
        return self.keyring

    def _verify(self, rows: Sequence[Mapping[str, Any]]) -> None:
        checks = self.keyring.check_values()
        for row in rows:
            mine = checks.get(row["version"])
            if mine is not None and not hmac.compare_digest(mine, bytes(row["check_value"])):
                raise ConfigError(f"key version {row['version']} does not match the key that "
                                  "encrypted existing data: restore the original key for this "
                                  "version, or give the new key a new version number")
        self.keyring.set_retired(r["version"] for r in rows if r["retired_at"] is not None)
        if self.keyring.active_version in self.keyring.retired:
            raise ConfigError(f"NOTIFYQ_ACTIVE_KEY_VERSION={self.keyring.active_version} is "
                              "retired: activate a newer version")

    def _unrecorded(self) -> tuple[set[str], Statement | None]:
        fresh = [c for c in self._columns.entries() if c[0].name not in self._recorded]
        if not fresh:
            return set(), None
        return {c.name for c, _ in fresh}, (self._q.encrypted_column_record, {
            "now": None, "tables": [c.table for c, _ in fresh],
            "columns": [c.column for c, _ in fresh], "pks": [c.pk for c, _ in fresh],
            "builtins": [builtin for _, builtin in fresh]})

    def _succeeded(self, recorded: set[str]) -> Keyring:
        self._recorded |= recorded
        self._checked_at = self._monotonic()
        return self.keyring
