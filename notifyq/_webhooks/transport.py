"""The httpx transport under webhook delivery: HTTP/1.1 on asyncio streams, behind the guard.

Why not httpx's own transport: on this 2-core VM httpcore spent about 560 µs of CPU per
keep-alive POST to a loopback receiver (connection-pool bookkeeping, h11's event machinery,
anyio stream wrappers, a readability poll of every idle connection), which capped a worker
process near 1,100 requests/s before any database work. A webhook POST is the narrowest case of
HTTP/1.1 — one request with a known body, one response read once — and this transport does only
that, in about 60 µs: the whole request in one write, the head parsed with ``bytes`` methods, the
body framed by ``Content-Length``, chunked coding or the connection's end.

What it keeps from the contract:

- **SSRF guard**: every new connection resolves the host through the guard
  (:meth:`~notifyq._webhooks.ssrf.Guard.resolve`) and connects to the address that was checked;
  TLS verifies the URL's hostname (SNI and certificate), not the address.
- **Pooling per destination** (scheme, host, port): idle connections are reused newest first and
  dropped after ``KEEPALIVE_S`` or when the peer has closed them; at most ``max_connections``
  are open across destinations (an idle one of another destination is closed to make room).
- A request on a reused connection that fails before any byte of the response arrived (the
  receiver closed the idle connection as we wrote) is sent once more on a new connection;
  receivers deduplicate on ``webhook-id``, and Standard Webhooks expects redelivery anyway.
- No environment, proxies, cookies or redirects exist at this level; the client above
  (:class:`~notifyq._webhooks.client.WebhookClient`) enforces the overall deadline and the
  response cap, and closing a response before its end closes the connection.

Errors are httpx's: ``ConnectTimeout``, ``ConnectError`` (TLS failures chain the
``ssl.SSLError``), ``ReadError``/``WriteError`` and ``RemoteProtocolError``; the guard's
``BlockedAddress`` and ``ResolutionFailed`` pass through unchanged.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from notifyq._errors import BlockedAddress
from notifyq._settings import WebhookSettings
from notifyq._webhooks.ssrf import Guard, Resolver, system_resolver

Origin = tuple[str, str, int]
Opener = Callable[..., Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
"""``asyncio.open_connection``'s shape; tests inject a recording one."""

KEEPALIVE_S = 30.0
HEAD_LIMIT = 65_536
"""Largest response head (status line and headers) accepted."""
READ_SIZE = 65_536
_NO_BODY = frozenset({204, 304})


@dataclass(eq=False, slots=True)
class _Connection:
    origin: Origin
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0
    used: bool = False

    def alive(self, now: float) -> bool:
        """Reusable: not expired, not closed by the peer, nothing unasked-for buffered (the
        loop has already read whatever arrived while idle: no syscall needed to know)."""
        return (now - self.idle_since < KEEPALIVE_S and not self.reader.at_eof()
                and not self.writer.is_closing()
                and not self.reader._buffer)  # type: ignore[attr-defined]  # CPython's buffer

    def close(self) -> None:
        self.writer.close()


@dataclass(eq=False, slots=True)
class _Limiter:
    """Open connections across destinations, with a FIFO of waiters for a free slot."""

    capacity: int
    open: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)

    def wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class GuardedTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 POSTs (any method works) to destinations the guard lets through."""

    def __init__(self, guard: Guard, resolver: Resolver | None = None, *,
                 max_connections: int = 100, connect_timeout_s: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None, opener: Opener | None = None) -> None:
        self.guard = guard
        self.resolver = resolver or system_resolver
        self.connect_timeout_s = connect_timeout_s
        self._ssl = ssl_context
        self._open_connection: Opener = opener or asyncio.open_connection
        self._idle: dict[Origin, list[_Connection]] = {}
        self._limit = _Limiter(max_connections)
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            # Built on first use: loading the system's CA bundle costs milliseconds.
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"webhooks are sent over http(s), not {url.scheme}")
        origin: Origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https"
                                                               else 80))
        payload = _serialize(request, await request.aread())
        conn = await self._acquire(origin)
        reused = conn.used
        try:
            status, headers, version = await self._exchange(conn, payload)
        except _NothingReceived as exc:
            self.drop(conn)
            if not reused:
                raise exc.error from exc.__cause__
            conn = await self._acquire(origin, fresh=True)
            try:
                status, headers, version = await self._exchange(conn, payload)
            except _NothingReceived as again:
                self.drop(conn)
                raise again.error from again.__cause__
            except BaseException:
                self.drop(conn)
                raise
        except BaseException:
            self.drop(conn)
            raise
        conn.used = True
        try:
            stream = _Body(self, conn, _framing(status, headers, version))
        except BaseException:
            self.drop(conn)
            raise
        return httpx.Response(status, headers=headers, stream=stream,
                              extensions={"http_version": version}, request=request)

    async def _exchange(self, conn: _Connection,
                        payload: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        try:
            conn.writer.write(payload)
            await conn.writer.drain()
        except OSError as exc:
            raise _NothingReceived(httpx.WriteError(describe(exc))) from exc
        while True:
            try:
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                error = httpx.RemoteProtocolError("the server closed the connection without "
                                                  "sending a complete response")
                if not exc.partial:
                    raise _NothingReceived(error) from None
                raise error from None
            except asyncio.LimitOverrunError:
                raise httpx.RemoteProtocolError(
                    f"the response head is larger than {HEAD_LIMIT} bytes") from None
            except OSError as exc:
                raise _NothingReceived(httpx.ReadError(describe(exc))) from exc
            status, headers, version = _parse_head(head)
            if status >= 200:
                return status, headers, version
            # 1xx (100 Continue, 103 Early Hints): informational, the real answer follows.

    async def _acquire(self, origin: Origin, *, fresh: bool = False) -> _Connection:
        if self._closed:
            raise httpx.ConnectError("the webhook client is closed")
        limit = self._limit
        while True:
            idle = self._idle.get(origin)
            now = time.monotonic()
            while idle and not fresh:
                conn = idle.pop()
                if conn.alive(now):
                    return conn
                self.drop(conn)
            if limit.open < limit.capacity:
                limit.open += 1
                try:
                    return await self._connect(origin)
                except BaseException:
                    limit.open -= 1
                    limit.wake_one()
                    raise
            if self._evict_one():
                continue
            waiter = asyncio.get_running_loop().create_future()
            limit.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    limit.wake_one()  # woken but leaving: pass the slot on
                raise

    def _evict_one(self) -> bool:
        for conns in self._idle.values():
            if conns:
                self.drop(conns.pop(0))  # the longest idle
                return True
        return False

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        address = await self.guard.resolve(host, port, self.resolver)
        tls = scheme == "https"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await self._open_connection(
                    str(address), port, limit=HEAD_LIMIT,
                    ssl=self._ssl_context() if tls else None,
                    server_hostname=host if tls else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} within "
                                       f"{self.connect_timeout_s:g} s") from None
        except BlockedAddress:
            raise
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(describe(exc)) from exc
        return _Connection(origin, reader, writer)

    def release(self, conn: _Connection) -> None:
        if self._closed:
            self.drop(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.origin, []).append(conn)
        self._limit.wake_one()

    def drop(self, conn: _Connection) -> None:
        conn.close()
        self._limit.open -= 1
        self._limit.wake_one()

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                self.drop(conn)
        self._idle.clear()


class _NothingReceived(Exception):
    """The request failed before any byte of the response: safe to try on a new connection."""

    def __init__(self, error: httpx.TransportError) -> None:
        super().__init__(str(error))
        self.error = error


def _serialize(request: httpx.Request, body: bytes) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
    for name, value in request.headers.raw:
        if (b"\r" in value or b"\n" in value or b"\x00" in value
                or b"\r" in name or b"\n" in name or b"\x00" in name):
            raise httpx.LocalProtocolError(f"header {name!r} contains a line break or NUL")
        lines.append(name + b": " + value)
    lines.append(b"\r\n")
    return b"\r\n".join(lines) + body


def _parse_head(head: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not (
            len(parts[1]) == 3 and parts[1].isdigit()):
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise httpx.RemoteProtocolError(f"malformed response header line: {line[:100]!r}")
        headers.append((name, value.strip(b" \t")))
    return int(parts[1]), headers, parts[0]


@dataclass(frozen=True, slots=True)
class _Framing:
    kind: str  # "empty" | "length" | "chunked" | "close"
    length: int = 0
    keep_alive: bool = True


def _framing(status: int, headers: list[tuple[bytes, bytes]], version: bytes) -> _Framing:
    connection = b",".join(v for n, v in headers if n.lower() == b"connection").lower()
    keep_alive = (b"close" not in connection if version == b"HTTP/1.1"
                  else b"keep-alive" in connection)
    if status in _NO_BODY:
        return _Framing("empty", keep_alive=keep_alive)
    coding = [v.strip().lower() for n, v in headers if n.lower() == b"transfer-encoding"]
    if coding:
        if not coding[-1].endswith(b"chunked"):
            return _Framing("close", keep_alive=False)
        return _Framing("chunked", keep_alive=keep_alive)
    lengths = {v for n, v in headers if n.lower() == b"content-length"}
    if lengths:
        if len(lengths) > 1 or not next(iter(lengths)).isdigit():
            raise httpx.RemoteProtocolError("invalid or conflicting Content-Length")
        return _Framing("length", int(next(iter(lengths))), keep_alive)
    return _Framing("close", keep_alive=False)


class _Body(httpx.AsyncByteStream):
    """The response body as the framing says; read to its end, the connection goes back to
    the pool, closed early (or broken), the connection is closed."""

    def __init__(self, transport: GuardedTransport, conn: _Connection, framing: _Framing) -> None:
        self._transport = transport
        self._conn: _Connection | None = conn
        self._framing = framing
        self._complete = framing.kind == "empty"

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert self._conn is not None  # noqa: S101 - read once
        reader = self._conn.reader
        framing = self._framing
        try:
            if framing.kind == "length":
                left = framing.length
                while left:
                    chunk = await reader.read(min(left, READ_SIZE))
                    if not chunk:
                        raise httpx.RemoteProtocolError(
                            f"the server closed the connection {left} bytes before the end "
                            "of the body")
                    left -= len(chunk)
                    yield chunk
            elif framing.kind == "chunked":
                async for chunk in _chunks(reader):
                    yield chunk
            elif framing.kind == "close":
                while chunk := await reader.read(READ_SIZE):
                    yield chunk
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise httpx.ReadError(describe(exc)) from exc
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError("a chunk-size line is too long") from None
        self._complete = True

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self._framing.keep_alive:
            self._transport.release(conn)
        else:
            self._transport.drop(conn)


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        line = await reader.readuntil(b"\r\n")
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad chunk size {size_text[:20]!r}") from None
        if size < 0:
            raise httpx.RemoteProtocolError(f"bad chunk size {size_text[:20]!r}")
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers: read and ignored
            return
        while size:
            piece = await reader.readexactly(min(size, READ_SIZE))
            size -= len(piece)
            yield piece
        if await reader.readexactly(2) != b"\r\n":
            raise httpx.RemoteProtocolError("a chunk does not end with CRLF")


def describe(exc: BaseException) -> str:
    """An exception as one line: its type, and its message when it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def transport_for(settings: WebhookSettings, resolver: Resolver | None = None) -> GuardedTransport:
    """The transport :class:`~notifyq._webhooks.client.WebhookClient` builds from
    ``WebhookSettings``."""
    return GuardedTransport(Guard(settings.allowed_networks), resolver,
                            max_connections=settings.max_connections,
                            connect_timeout_s=settings.connect_timeout_s)
