"""The HTTP engine under webhook delivery: aiohttp's client, behind httpx's interface.

A delivery builds an ``httpx.Request`` and reads an ``httpx.Response``; the bytes go through
aiohttp (its connection pool and the llhttp parser), adapted by httpx-aiohttp's
``AiohttpTransport``. We write no HTTP here, only what a webhook sender needs on top of a
general-purpose client:

- **The SSRF guard is aiohttp's resolver** (:class:`GuardedResolver`): every hostname resolves
  through :meth:`~notifyq._webhooks.ssrf.Guard.addresses` (every answer and the port must
  pass), and the connection goes to those checked addresses, tried one after the other in the
  resolver's order (no racing: an unreachable IPv6 answer falls over to IPv4). A host written
  as an IP address, which aiohttp connects to without a resolver, is judged by the transport
  before the request. TLS verifies the URL's hostname (SNI and certificate), not the address.
- **No environment, cookies, redirects or decompression**: no proxy can route around the
  guard, a 3xx is an answer (a failure, for the schedule), bodies are read as sent.
- **A connection that received bytes while idle is closed, never reused** (:class:`_Connector`):
  aiohttp would read them as the answer to the next request on it (a receiver could answer a
  webhook it never got).
- **At most** ``MAX_INFORMATIONAL`` **1xx answers before the final one** (:class:`_Response`):
  a receiver streaming ``100 Continue`` would otherwise keep the client parsing until the
  attempt's deadline (~0.6 of a core per such delivery, measured on the old transport).
- **At most** ``max_connections`` **open across destinations**: an idle connection of another
  destination is closed to make room (aiohttp's own limit counts only the busy ones).
- **A POST lost on a reused connection is sent once more** on another connection when nothing
  of an answer came back (the receiver closed the idle connection as we wrote): receivers
  deduplicate on ``webhook-id``, and Standard Webhooks expects redelivery anyway.

Why aiohttp: a POST to a loopback receiver costs ~100-180 us of client CPU through aiohttp,
~150-250 us through it behind httpx's interface, against ~560-1,350 us through httpx's own
transport (httpcore and h11; bench/webhook_transports.py, docs/webhooks.md).

Errors are httpx's (``ConnectError``, ``ConnectTimeout``, ``ReadError``, ``RemoteProtocolError``,
``TimeoutException``), each chaining aiohttp's; the guard's ``BlockedAddress`` and
``ResolutionFailed`` pass through unchanged.
"""

from __future__ import annotations

import contextvars
import socket
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult
from httpx_aiohttp import AiohttpTransport

from notifyq._errors import BlockedAddress
from notifyq._webhooks.ssrf import Guard, Resolver, literal_address, system_resolver

KEEPALIVE_S = 15.0
"""How long an idle connection is kept for its destination."""
MAX_INFORMATIONAL = 10
"""1xx answers accepted before the final one; more is a protocol error."""
_LOST = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
"""What a request on a connection the receiver had just closed fails with."""
_reused: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "notifyq_webhook_reused", default=None)
"""Marked by the pool when a request takes an idle connection (see GuardedTransport)."""


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver: the guard's checked addresses, in the resolver's order."""

    def __init__(self, guard: Guard, resolver: Resolver) -> None:
        self.guard = guard
        self.resolver = resolver

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        addresses = await self.guard.addresses(host, port, self.resolver)
        return [{"hostname": host, "host": str(address), "port": port,
                 "family": socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV}
                for address in addresses]

    async def close(self) -> None:
        return None


class _Connector(aiohttp.TCPConnector):
    """aiohttp's pool, but an idle connection that received anything is not reused, and at
    most ``limit`` connections are open across destinations, idle ones included."""

    async def _get(self, *args: Any, **kwargs: Any) -> Any:
        while True:
            conn = await super()._get(*args, **kwargs)
            if conn is None:
                return None
            # `should_close` is true once bytes arrived that no request asked for (parsed
            # into a queued message, or kept as an unparsed tail).
            if conn.protocol is not None and not conn.protocol.should_close:
                box = _reused.get()
                if box is not None:
                    box.append(True)
                return conn
            conn.close()

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        self._make_room()
        return await super()._create_connection(*args, **kwargs)

    def _make_room(self) -> None:
        """Before a new connection: close the longest idle ones (of any destination) while
        ``limit`` are open. aiohttp counts only busy connections against its limit, so idle
        ones would pile up across many endpoints (one file descriptor each)."""
        idle = self._conns
        while self.limit and len(self._acquired) + sum(map(len, idle.values())) >= self.limit:
            oldest = min((key for key, conns in idle.items() if conns),
                         key=lambda key: idle[key][0][1], default=None)
            if oldest is None:
                return
            protocol, _ = idle[oldest].popleft()
            if not idle[oldest]:
                del idle[oldest]
            protocol.close()


class InformationalFlood(aiohttp.ClientResponseError):
    """More than ``MAX_INFORMATIONAL`` 1xx answers before the final one."""


class _Response(aiohttp.ClientResponse):
    """A response whose final answer must come within ``MAX_INFORMATIONAL`` 1xx answers."""

    async def start(self, connection: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        protocol: Any = connection.protocol
        read = protocol.read
        seen = 0

        async def capped() -> Any:
            nonlocal seen
            message, payload = await read()
            if 100 <= message.code < 200 and message.code != 101:
                seen += 1
                if seen > MAX_INFORMATIONAL:
                    protocol.force_close()
                    raise InformationalFlood(self.request_info, (), status=message.code,
                                             message=f"more than {MAX_INFORMATIONAL} "
                                                     "informational (1xx) answers")
            return message, payload

        protocol.read = capped  # this response's reads only: put back below
        try:
            return await super().start(connection)
        finally:
            del protocol.read


class GuardedTransport(AiohttpTransport):
    """httpx's transport interface over one aiohttp session, behind ``guard``."""

    def __init__(self, guard: Guard, resolver: Resolver | None = None, *,
                 max_connections: int = 100, connect_timeout_s: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None,
                 keepalive_s: float = KEEPALIVE_S,
                 socket_factory: Callable[[Any], socket.socket] | None = None) -> None:
        self.guard = guard
        self.resolver = resolver or system_resolver
        self.connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._tls = ssl_context
        self._literals: dict[tuple[str, int], str | None] = {}
        self._socket_factory = socket_factory
        """Makes each connection's socket (tests: record the address, refuse all but
        loopback)."""
        # The session is made on first use, inside the running event loop (aiohttp's rule).
        session: Callable[[], aiohttp.ClientSession] = self._session
        super().__init__(client=session)

    def _session(self) -> aiohttp.ClientSession:
        connector = _Connector(
            resolver=GuardedResolver(self.guard, self.resolver), use_dns_cache=False,
            limit=self._max_connections, limit_per_host=0, keepalive_timeout=self._keepalive_s,
            happy_eyeballs_delay=None, ssl=self._ssl_context(),
            socket_factory=self._socket_factory)
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
            auto_decompress=False, response_class=_Response,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s))

    def _ssl_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()  # honours SSL_CERT_FILE / SSL_CERT_DIR
        return self._tls

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"webhooks are sent over http(s), not {url.scheme}")
        self._check_literal(url.host, url.port or (443 if url.scheme == "https" else 80))
        request.extensions = {**request.extensions,
                              "timeout": {"connect": self.connect_timeout_s}}
        box: list[bool] = []
        token = _reused.set(box)
        try:
            return await self._send(request)
        except httpx.TransportError as exc:
            if not (box and isinstance(exc.__cause__, _LOST)):
                raise
        finally:
            _reused.reset(token)
        # The receiver closed the idle connection as we wrote: once more, on another one.
        return await self._send(request)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.TransportError as exc:
            if isinstance(exc.__cause__, aiohttp.ClientError):
                raise as_httpx(exc.__cause__) from exc.__cause__
            raise
        except aiohttp.ClientError as exc:  # what httpx-aiohttp passes through as it is
            raise as_httpx(exc) from exc
        except ValueError as exc:  # aiohttp's check of header values, before sending
            raise httpx.LocalProtocolError(describe(exc)) from exc

    def _check_literal(self, host: str, port: int) -> None:
        """A host written as an IP address is connected to without a resolver: judged here
        (with the port), once per host and port."""
        key = (host, port)
        if key not in self._literals:
            refused = None
            if literal_address(host) is not None:
                try:
                    self.guard.literal(host, port)
                except BlockedAddress as exc:
                    refused = str(exc)
            self._literals[key] = refused
        refused = self._literals[key]
        if refused is not None:
            raise BlockedAddress(refused)


def as_httpx(exc: aiohttp.ClientError) -> httpx.TransportError:
    """aiohttp's error as the httpx error that says the same (httpx-aiohttp's own mapping
    reports a receiver that hung up as a connect timeout, and leaves protocol errors out)."""
    text = describe(exc)
    match exc:
        case aiohttp.ClientSSLError() | aiohttp.ClientConnectorDNSError():
            return httpx.ConnectError(text)
        case aiohttp.ConnectionTimeoutError():
            return httpx.ConnectTimeout(text)
        case aiohttp.SocketTimeoutError():
            return httpx.ReadTimeout(text)
        case aiohttp.ServerTimeoutError():
            return httpx.TimeoutException(text)
        case aiohttp.ClientConnectorError():
            return httpx.ConnectError(text)
        case aiohttp.ServerDisconnectedError():
            return httpx.RemoteProtocolError(
                "the server closed the connection without sending a complete response")
        case aiohttp.ClientResponseError() | aiohttp.ClientPayloadError():
            return httpx.RemoteProtocolError(text)
        case aiohttp.InvalidURL():
            return httpx.LocalProtocolError(text)
        case aiohttp.ClientOSError():
            return httpx.ReadError(text)
    return httpx.TransportError(text)


def describe(exc: BaseException) -> str:
    """An exception as one line: its type, and its message when it has one (never the URL,
    which may carry a token)."""
    if isinstance(exc, aiohttp.InvalidURL):
        return "InvalidURL"
    text = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
    text = " ".join(str(text).split())  # llhttp's messages span lines (a caret under the byte)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
