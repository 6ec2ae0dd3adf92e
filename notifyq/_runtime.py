"""The parts of a process that every component shares: settings, clock, named queries, the
connection pools and the keyring.

Components and features take the :class:`Runtime` (or the pieces of it they use), never the
``App``: the App is the user's facade that composes a Runtime with the features it asks for, so
imports run one way (features -> runtime -> db, clock, settings).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from notifyq._clock import Clock
from notifyq._crypto.keyring import Keyring, configured_keys
from notifyq._db.dsn import resolve_dsn
from notifyq._db.pool import (
    AsyncConn,
    WarmConnection,
    check_connection_sync,
    open_pool,
    statement_options,
)
from notifyq._db.queries import Queries, queries_for
from notifyq._errors import ConfigError
from notifyq._keys.check import KeyCheck, KeyHolder
from notifyq._keys.columns import EncryptedColumns
from notifyq._settings import Settings

log = logging.getLogger("notifyq")

AnyConn = psycopg.AsyncConnection[Any]
SyncPool = ConnectionPool[psycopg.Connection[dict[str, Any]]]


class Runtime:
    """Settings, clock, queries, the keyring, and the pools (opened on first use, closed by
    :meth:`close`).

    Example::

        runtime = Runtime(settings, SystemClock())
        async with runtime.connection() as conn:
            await conn.execute(runtime.queries.job_run_get, {"id": run_id})
    """

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self.queries: Queries = queries_for(settings.schema_name)
        self._pool: AsyncConnectionPool[AsyncConn] | None = None
        self._warm: WarmConnection | None = None
        self._sync_pool: SyncPool | None = None
        self._open_lock = anyio.Lock()
        self._keyring: Keyring | None = None
        self._key_check: KeyCheck | None = None
        self.key_holder = KeyHolder.of_this_process()
        """How this process is recorded among the key holders (``worker`` and ``serve`` set
        its role; the CLI clears it)."""
        self.columns = EncryptedColumns()
        """Every encrypted column this process registered (the user's and notifyq's own)."""
        for column in settings.encrypted_columns:
            self.columns.register(column.table, pk=column.pk, column=column.column)

    @property
    def has_keyring(self) -> bool:
        """Whether master keys are configured (``NOTIFYQ_KEYS`` or ``NOTIFYQ_KEY_FILE``)."""
        return self.settings.keys is not None or self.settings.key_file is not None

    @property
    def keyring(self) -> Keyring:
        """The configured master keys, built on first use; ConfigError when none are."""
        if self._keyring is None:
            keys = self.settings.keys
            try:
                found = configured_keys(keys.get_secret_value() if keys else None,
                                        self.settings.key_file, self.settings.active_key_version)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if found is None:
                raise ConfigError("no keyring is configured: set NOTIFYQ_KEYS (or "
                                  "NOTIFYQ_KEY_FILE)")
            keyring = Keyring(found[0], active=found[1])
            self._key_check = KeyCheck(self.queries, keyring, self.columns,
                                       interval_s=self.settings.key_check_interval_s,
                                       monotonic=self.clock.monotonic, holder=self.key_holder,
                                       wanted=found[1])
            keyring.guard_with(self._check_keys_sync)
            self._keyring = keyring
        return self._keyring

    async def checked_keyring(self, conn: AnyConn | None = None, *,
                              force: bool = False) -> Keyring:
        """The keyring, checked against the database first when the check is due (see
        :mod:`notifyq._keys.check`); ``force`` checks now. ConfigError when the key check
        refuses, or when no keyring is configured. What notifyq's own components await before
        they encrypt or decrypt, so that the keyring's guard never has to block."""
        keyring = self.keyring
        check = self._key_check
        assert check is not None  # noqa: S101 - built with the keyring
        if force or check.due():
            async with self.connection(conn) as c:
                await check.run(c)
        return keyring

    def verified_keyring(self, key_versions: Sequence[Mapping[str, Any]]) -> Keyring:
        """The keyring compared with ``key_versions`` (rows of ``key_version_list``) without
        writing anything: for read-only callers (``GET /v1/keys``, ``keys status``), which must
        not record versions or columns. ConfigError as :meth:`checked_keyring`."""
        self.keyring  # noqa: B018 - builds the keyring and its check on first use
        assert self._key_check is not None  # noqa: S101 - built with the keyring
        return self._key_check.verify(key_versions)

    def expire_key_check(self) -> None:
        """A promotion or retirement was announced: check before the next encrypt or
        decrypt."""
        if self._key_check is not None:
            self._key_check.expire()

    def _check_keys_sync(self) -> None:
        """The keyring's guard: the key check on the synchronous pool, when it is due (user
        code calling ``app.keyring`` directly; one short query per interval)."""
        check = self._key_check
        if check is None or not check.due():
            return
        with check.lock:
            if check.due():
                with self.sync_pool().connection() as conn:
                    check.run_sync(conn)

    @property
    def prepares(self) -> bool:
        """Whether connections to ``database_url`` may prepare statements and keep session
        settings: not through a transaction pool (``database_transaction_pooling``)."""
        return not self.settings.database_transaction_pooling

    def dsn(self) -> str:
        """``database_url``, else the embedded PostgreSQL's that a ``notifyq serve`` of this
        user runs (``resolve_dsn``), filled into the settings so every component uses it."""
        if not self.settings.database_url:
            self.settings = self.settings.model_copy(
                update={"database_url": resolve_dsn(self.settings)})
        return resolve_dsn(self.settings)

    def listen_url(self) -> str | None:
        """``settings.listen_url`` with ``database_url`` resolved first (:meth:`dsn`)."""
        self.dsn()
        return self.settings.listen_url

    @property
    def opened(self) -> AsyncConnectionPool[AsyncConn] | None:
        """The pool if it is open (None before the first :meth:`pool`)."""
        return self._pool

    async def pool(self) -> AsyncConnectionPool[AsyncConn]:
        """The process's pool, opened on first use (a bad DSN fails at once, with its cause)."""
        if self._pool is None:
            async with self._open_lock:
                if self._pool is None:
                    dsn = self.dsn()
                    self._pool = await open_pool(dsn, max_size=self.settings.pool_max_size,
                                                 prepare=self.prepares)
        return self._pool

    @asynccontextmanager
    async def connection(self, conn: AnyConn | None = None) -> AsyncIterator[AnyConn]:
        """``conn`` itself when given (the caller's transaction), else a pooled connection."""
        if conn is not None:
            yield conn
            return
        async with (await self.pool()).connection() as own:
            yield own

    @asynccontextmanager
    async def warm_connection(self) -> AsyncIterator[AnyConn]:
        """A connection for the enqueuer's short writes (autocommit, or a transaction they
        end): this process's :class:`~notifyq._db.pool.WarmConnection` when it is free, else
        a pooled one. ``App.enqueue`` from one caller, pooled -> warm, on the 2-core VM:
        1,588-1,596 -> 2,093-2,211/s."""
        pool = await self.pool()
        if self._warm is None:
            self._warm = WarmConnection(self.dsn(),
                                        prepare=self.prepares)
        async with self._warm.connection(pool) as conn:
            yield conn

    def sync_pool(self) -> SyncPool:
        """A pool for synchronous callers (``App.enqueue_sync``), opened on first use."""
        if self._sync_pool is None:
            dsn = self.dsn()
            check_connection_sync(dsn)  # a bad DSN fails now with its cause, not in 30 s
            self._sync_pool = ConnectionPool(
                dsn, min_size=1, max_size=self.settings.pool_max_size,
                kwargs={"autocommit": True, "row_factory": dict_row,
                        "application_name": "notifyq", **statement_options(self.prepares)},
                connection_class=psycopg.Connection[dict[str, Any]], open=True)
        return self._sync_pool

    async def close(self) -> None:
        await self._leave_key_holders()
        if self._warm is not None:
            await self._warm.close()
            self._warm = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._sync_pool is not None:
            self._sync_pool.close()
            self._sync_pool = None

    async def _leave_key_holders(self) -> None:
        """A clean stop takes this process off the key holders at once (a killed one expires
        three key-check intervals after its last check)."""
        check = self._key_check
        if check is None or not check.recorded_holder:
            return
        params = {"id": self.key_holder.id}
        try:
            if self._pool is not None:
                async with self._pool.connection() as conn:
                    await conn.execute(self.queries.key_holder_leave, params)
            elif self._sync_pool is not None:
                sync_pool = self._sync_pool

                def leave() -> None:
                    with sync_pool.connection() as conn:
                        conn.execute(self.queries.key_holder_leave, params)
                await anyio.to_thread.run_sync(leave)
        except psycopg.Error as exc:
            log.debug("could not leave the key holders (%s); the row expires", type(exc).__name__)
        check.recorded_holder = False
