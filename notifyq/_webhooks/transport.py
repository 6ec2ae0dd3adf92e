"""The httpx transport under webhook delivery: HTTP/1.1 on asyncio streams, behind the guard.

Why not httpx's own transport: on this 2-core VM httpcore spent about 560 µs of CPU per
keep-alive POST to a loopback receiver (connection-pool bookkeeping, h11's event machinery,
anyio stream wrappers, a readability poll of every idle connection), which capped a worker
process near 1,100 requests/s before any database work. A webhook POST is the narrowest case of
HTTP/1.1 — one request with a known body, one response read once — and this transport does only
that, in about 60 µs: the whole request in one write into a plain :class:`asyncio.Protocol`, the
response framed from its buffer by :mod:`notifyq._webhooks.http11` (RFC 9112, as strict as h11).
The stock transport stays one setting away (``webhooks.transport: httpx``,
:mod:`notifyq._webhooks.stock`), behind the same guard.

What it keeps from the contract:

- **SSRF guard**: every new connection resolves the host through the guard
  (:meth:`~notifyq._webhooks.ssrf.Guard.addresses`) and connects to a checked address, tried in
  order until one connects; TLS verifies the URL's hostname (SNI and certificate), not the
  address.
- **Pooling per destination** (scheme, host, port): idle connections are reused newest first and
  dropped after ``KEEPALIVE_S``, when the peer has closed them or sent bytes nobody asked for
  (a response to no request must never answer the next one); at most ``max_connections``
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
from notifyq._webhooks.http11 import BodyReader, Framing, Head, framing, read_head
from notifyq._webhooks.ssrf import Guard, IPAddress, Resolver, system_resolver

Origin = tuple[str, str, int]
Opener = Callable[..., Awaitable["Stream"]]
"""``(host, port, *, tls, server_hostname) -> stream``; tests inject a recording one."""

KEEPALIVE_S = 30.0
HEAD_LIMIT = 65_536
"""Largest response head (status line and headers), chunk-size line or trailer accepted."""
READ_HIGH = 262_144
"""Unread bytes at which the socket stops being read until the body is consumed."""


class Stream(asyncio.Protocol):
    """One connection's bytes: what arrived waits in ``buffer`` (ours, so the pool can see
    whether an idle connection received anything), ``receive()`` waits for more."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 - a stream socket
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > READ_HIGH and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def send(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            raise self.error or ConnectionResetError("the connection is closed")
        self.transport.write(data)
        if self._writable is not None:
            await self._writable
            if self.error is not None:
                raise self.error

    async def receive(self) -> bool:
        """Wait until more bytes are in ``buffer``: False when the peer closed instead; the
        OSError that broke the connection, if one did."""
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        before = len(self.buffer)
        while len(self.buffer) == before:
            if self.closed:
                if self.error is not None:
                    raise self.error
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return True

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_stream(host: str, port: int, *, tls: ssl.SSLContext | None,
                      server_hostname: str | None) -> Stream:
    _, stream = await asyncio.get_running_loop().create_connection(
        Stream, host, port, ssl=tls, server_hostname=server_hostname)
    return stream


@dataclass(eq=False, slots=True)
class _Connection:
    origin: Origin
    stream: Stream
    idle_since: float = 0.0
    used: bool = False

    def alive(self, now: float) -> bool:
        """Reusable: not expired, not closed by the peer, nothing unasked-for received (the
        loop has already read whatever arrived while idle: no syscall needed to know)."""
        stream = self.stream
        return (now - self.idle_since < KEEPALIVE_S and not stream.closed
                and not stream.buffer and stream.transport is not None
                and not stream.transport.is_closing())

    def close(self) -> None:
        self.stream.close()


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
        self._open: Opener = opener or open_stream
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
            head = await self._exchange(conn, payload)
        except _NothingReceived as exc:
            self.drop(conn)
            if not reused:
                raise exc.error from exc.__cause__
            conn = await self._acquire(origin, fresh=True)
            try:
                head = await self._exchange(conn, payload)
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
        stream = _Body(self, conn, framing(head, request.method.encode()))
        return httpx.Response(head.status, headers=head.headers, stream=stream,
                              extensions={"http_version": head.version}, request=request)

    async def _exchange(self, conn: _Connection, payload: bytes) -> Head:
        stream = conn.stream
        try:
            await stream.send(payload)
        except OSError as exc:
            raise _NothingReceived(httpx.WriteError(describe(exc))) from exc
        answered = False
        while True:
            head = read_head(stream.buffer, HEAD_LIMIT)
            if head is None:
                try:
                    more = await stream.receive()
                except OSError as exc:
                    if answered or stream.buffer:
                        raise httpx.ReadError(describe(exc)) from exc
                    raise _NothingReceived(httpx.ReadError(describe(exc))) from exc
                if not more:
                    error = httpx.RemoteProtocolError("the server closed the connection without "
                                                      "sending a complete response")
                    if answered or stream.buffer:
                        raise error
                    raise _NothingReceived(error)
                continue
            if head.status >= 200:
                return head
            # 1xx (100 Continue, 103 Early Hints): informational, the real answer follows.
            answered = True

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
        """A connection to the first checked address that takes one, in the resolver's order
        (an unreachable IPv6 answer falls over to IPv4). A TLS failure is not a reason to try
        another address: the certificate is the host's, whichever address serves it."""
        scheme, host, port = origin
        addresses = await self.guard.addresses(host, port, self.resolver)
        failure: httpx.TransportError | None = None
        for address in addresses:
            try:
                return _Connection(origin, await self._connect_to(address, scheme, host, port))
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if _tls_failure(exc):
                    raise
                failure = exc
        assert failure is not None  # noqa: S101 - addresses() never returns none
        raise failure

    async def _connect_to(self, address: IPAddress, scheme: str, host: str,
                          port: int) -> Stream:
        tls = scheme == "https"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await self._open(str(address), port,
                                        tls=self._ssl_context() if tls else None,
                                        server_hostname=host if tls else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} ({address}) within "
                                       f"{self.connect_timeout_s:g} s") from None
        except BlockedAddress:
            raise
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(describe(exc)) from exc

    def release(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        if self._closed or not conn.alive(conn.idle_since):
            self.drop(conn)  # e.g. bytes after the response: an answer to no request
            return
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


def _tls_failure(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, ssl.SSLError)


def _serialize(request: httpx.Request, body: bytes) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
    for name, value in request.headers.raw:
        if (b"\r" in value or b"\n" in value or b"\x00" in value
                or b"\r" in name or b"\n" in name or b"\x00" in name):
            raise httpx.LocalProtocolError(f"header {name!r} contains a line break or NUL")
        lines.append(name + b": " + value)
    lines.append(b"\r\n")
    return b"\r\n".join(lines) + body


class _Body(httpx.AsyncByteStream):
    """The response body as the framing says; read to its end, the connection goes back to
    the pool, closed early (or broken), the connection is closed."""

    def __init__(self, transport: GuardedTransport, conn: _Connection, framing: Framing) -> None:
        self._transport = transport
        self._conn: _Connection | None = conn
        self._reader = BodyReader(framing, HEAD_LIMIT)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert self._conn is not None  # noqa: S101 - read once
        stream = self._conn.stream
        reader = self._reader
        while not reader.done:
            piece = reader.next(stream.buffer)
            if piece:
                yield piece
            elif piece is None:
                try:
                    more = await stream.receive()
                except OSError as exc:
                    raise httpx.ReadError(describe(exc)) from exc
                if not more:
                    reader.eof()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._reader.done and self._reader.framing.keep_alive:
            self._transport.release(conn)
        else:
            self._transport.drop(conn)


def describe(exc: BaseException) -> str:
    """An exception as one line: its type, and its message when it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
