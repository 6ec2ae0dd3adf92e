"""Connections: one autocommit pool per process, plus single connections for the listener."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import anyio
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from notifyq._errors import ConfigError, DatabaseUnavailable

Row = dict[str, Any]
AsyncConn = psycopg.AsyncConnection[Row]

CONNECT_TIMEOUT_S = 5
"""libpq's connect_timeout for the first connection of a process (unless the DSN sets one): a
server that never answers is reported after this, not after the pool's 30 s."""


def statement_options(prepare: bool) -> dict[str, Any]:
    """psycopg's connection options for ``prepare``: False (``database_transaction_pooling``)
    turns its prepared statements off. psycopg prepares a statement on its 5th run on a
    connection and then sends only its name: through PgBouncer 1.18 in transaction mode the
    name reaches another server session, which has no such statement."""
    return {} if prepare else {"prepare_threshold": None}


async def open_pool(
    dsn: str, *, max_size: int, name: str = "notifyq", prepare: bool = True
) -> AsyncConnectionPool[AsyncConn]:
    """Open the process's pool. Connections are autocommit: each statement is a short
    transaction unless a caller opens one explicitly with ``conn.transaction()``. ``prepare``:
    see :func:`statement_options`.

    One direct connection comes first: a wrong DSN, a missing database or a server that is
    down fails at once with the server's reason (:class:`DatabaseUnavailable`), where the
    pool would retry for 30 s, log a warning per attempt and end with "pool initialization
    incomplete". Once open, the pool reconnects as long as it takes (``reconnect_timeout``)."""
    await (await connect_checked(dsn, application_name=name)).close()
    pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
        dsn,
        min_size=min(2, max_size),
        max_size=max_size,
        kwargs={"autocommit": True, "row_factory": dict_row, "application_name": name,
                **statement_options(prepare)},
        connection_class=psycopg.AsyncConnection[Row],
        name=name,
        open=False,
        timeout=30.0,
        reconnect_timeout=3600.0,
    )
    await pool.open(wait=True, timeout=30.0)
    return pool


async def connect(dsn: str, *, application_name: str = "notifyq",
                  prepare: bool = True) -> AsyncConn:
    """A standalone autocommit connection (the listener, migrations, warm connections)."""
    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row, application_name=application_name,
        **statement_options(prepare))


async def connect_checked(dsn: str, *, application_name: str = "notifyq") -> AsyncConn:
    """:func:`connect` for a process's first connection: bounded by :data:`CONNECT_TIMEOUT_S`,
    and a failure is a :class:`DatabaseUnavailable` (or a :class:`ConfigError` for a DSN
    that does not parse) whose one line says why."""
    with explained_connect_errors(dsn):
        return await psycopg.AsyncConnection.connect(
            with_connect_timeout(dsn), autocommit=True, row_factory=dict_row,
            application_name=application_name)


def check_connection_sync(dsn: str) -> None:
    """The same first connection for the synchronous pool (``App.enqueue_sync``)."""
    with explained_connect_errors(dsn):
        psycopg.connect(with_connect_timeout(dsn)).close()


WARM_RETRY_S = 5.0
"""After a :class:`WarmConnection` failed to open, how long the pool serves before it tries
again (a server at max_connections would otherwise be asked at every statement)."""


class StopGrace:
    """Lets the statements of a worker's periodic tasks finish when the worker stops.

    Cancelled mid-flight, a statement makes psycopg cancel it on the server, log "query
    cancellation interrupted" and the pool discard the connection: a warning at nearly every
    stop of an idle worker, whose producer asks for the next run's delay after each claim that
    came back short. Work inside :meth:`finishing` is shielded from the stop's cancellation (the
    stop takes effect at the task's next wait outside it) until :meth:`stop`, then for at most
    ``grace_s``: a server that no longer answers must not hold the process."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.grace_s = grace_s
        self._deadline = float("inf")
        self._scopes: set[anyio.CancelScope] = set()

    @contextmanager
    def finishing(self) -> Iterator[None]:
        scope = anyio.CancelScope(shield=True, deadline=self._deadline)
        self._scopes.add(scope)
        try:
            with scope:
                yield
        finally:
            self._scopes.discard(scope)

    def stop(self) -> None:
        self._deadline = min(self._deadline, anyio.current_time() + self.grace_s)
        for scope in self._scopes:
            scope.deadline = min(scope.deadline, self._deadline)


class WarmConnection:
    """A connection kept for one serial user (the enqueuer's writes, a worker's completer),
    so its statements run on a backend that stays busy, not on the pool's idle ones in turn.

    Why: the pool hands out its idle connections in turn, so a lone caller's statements
    alternate between backends that each slept since their last turn. One INSERT and its
    commit from one enqueuer in a loop on the 2-core VM, rotating over 1, 2 and 3 connections
    (3 rounds of 2,000): 412-437 / 484-551 / 518-568 us a call, Python CPU 116-130 / 162-180 /
    170-188 us; a SELECT alone did not care (87-112 us all three).

    Opened on first use (``configure`` then runs on it), beside the pool; dropped after a use
    that leaves it anything but idle (cancelled or failed mid-statement) and when it cannot be
    opened. While it is in use or cannot be opened, the pool serves (whose connections wait
    and retry while the server is away)."""

    def __init__(self, dsn: str, *, application_name: str = "notifyq",
                 configure: Callable[[AsyncConn], Awaitable[None]] | None = None,
                 prepare: bool = True) -> None:
        self._dsn = with_connect_timeout(dsn)
        self._application_name = application_name
        self._prepare = prepare
        self._configure = configure
        self._conn: AsyncConn | None = None
        self._busy = False
        self._retry_at = 0.0

    @asynccontextmanager
    async def connection(self, pool: AsyncConnectionPool[AsyncConn]) -> AsyncIterator[AsyncConn]:
        conn = await self._take()
        if conn is None:
            async with pool.connection() as pooled:
                yield pooled
            return
        try:
            yield conn
        finally:
            self._busy = False
            if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
                self._conn = None
                await conn.close()

    @property
    def busy(self) -> bool:
        """In use by a caller (who then holds it until its ``connection()`` block ends)."""
        return self._busy

    async def _take(self) -> AsyncConn | None:
        """The connection, now busy; None when it already is or cannot be opened."""
        if self._busy:
            return None
        self._busy = True
        conn = None
        try:
            conn = await self._open()
        finally:
            self._busy = conn is not None
        return conn

    async def _open(self) -> AsyncConn | None:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._conn = None
        if time.monotonic() < self._retry_at:
            return None  # the last attempt failed: the pool serves a while before the next
        try:
            conn = await connect(self._dsn, application_name=self._application_name,
                                 prepare=self._prepare)
        except psycopg.OperationalError:
            self._retry_at = time.monotonic() + WARM_RETRY_S
            return None
        try:
            if self._configure is not None:
                await self._configure(conn)
        except psycopg.Error:
            self._retry_at = time.monotonic() + WARM_RETRY_S
            await conn.close()
            return None
        self._conn = conn
        return conn

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()


def with_connect_timeout(dsn: str) -> str:
    """The DSN with our connect_timeout unless it sets its own."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return dsn  # connect() reports the malformed DSN
    if "connect_timeout" in params:
        return dsn
    return psycopg.conninfo.make_conninfo(dsn, connect_timeout=CONNECT_TIMEOUT_S)


def _connect_timeout(dsn: str) -> object:
    """The DSN's own connect_timeout, else ours (None for a DSN that does not parse)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return None
    return params.get("connect_timeout", CONNECT_TIMEOUT_S)


@contextmanager
def explained_connect_errors(dsn: str) -> Iterator[None]:
    try:
        yield
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(describe_connect_error(str(exc), dsn)) from None
    except psycopg.ProgrammingError as exc:  # libpq could not parse the DSN
        raise ConfigError(f"database_url (NOTIFYQ_DATABASE_URL) is not a valid connection "
                          f"string or URL: {_first_line(_redact(str(exc), dsn))}") from None


# libpq's report of one attempt: 'connection to server at "h" (addr), port 5432 failed: FATAL:
# database "x" does not exist', optionally followed by a tab-indented hint line.
_ATTEMPT = re.compile(
    r'connection to server (?:at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>\d+)'
    r'|on socket "(?P<socket>[^"]*)") failed: (?:FATAL:\s+)?(?P<cause>[^\n]*)'
    r'(?:\n\t(?P<hint>[^\n]*))?')


def describe_connect_error(message: str, dsn: str) -> str:
    """One line from libpq's (possibly multi-host, multi-line) report, the password removed:
    ``cannot connect to the database at 127.0.0.1:5432: database "x" does not exist``."""
    text = _redact(message, dsn)
    attempts: list[str] = []
    hints: list[str] = []
    for match in _ATTEMPT.finditer(text):
        where = match["socket"] or f"{match['host']}:{match['port']}"
        attempt = f"{where}: {match['cause'].strip()}"
        if attempt not in attempts:
            attempts.append(attempt)
            hints.append(match["hint"] or "")
    if not attempts:
        waited = (f" (no answer within connect_timeout={_connect_timeout(dsn)}s)"
                  if "timeout expired" in text else "")
        return f"cannot connect to the database{_target(dsn)}: {_first_line(text)}{waited}"
    if len(attempts) > 1:
        return "cannot connect to the database: " + "; ".join(attempts)
    hint = f" ({hints[0][:1].lower()}{hints[0][1:]})" if hints[0] else ""
    return f"cannot connect to the database at {attempts[0]}{hint}"


def _target(dsn: str) -> str:
    """`` at host:port`` as the DSN names them (libpq's defaults when it does not)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return ""
    host = str(params.get("host") or params.get("hostaddr") or "the default socket")
    return f" at {host}:{params.get('port') or 5432}"


# Where a password sits in a URL (user:PASSWORD@) or a key/value string (password=PASSWORD).
_PASSWORDS = (re.compile(r"://[^:/@\s]*:([^@\s]*)@"),
              re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)"))


def _redact(text: str, dsn: str) -> str:
    """``text`` without the DSN's password (raw, quoted or percent-decoded), as a whole word
    so a short password does not garble the rest."""
    secrets = {match[1].strip("'") for pattern in _PASSWORDS for match in pattern.finditer(dsn)}
    with suppress(psycopg.ProgrammingError):
        secrets.add(psycopg.conninfo.conninfo_to_dict(dsn).get("password") or "")
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = re.sub(rf"(?<![\w%]){re.escape(secret)}(?![\w%])", "***", text)
    return text


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else "unknown error"
