"""httpx's stock transport under webhook delivery (``webhooks.transport: httpx``), behind the
same SSRF guard as notifyq's own (:mod:`notifyq._webhooks.transport`).

httpx's ``AsyncHTTPTransport`` (httpcore's pool and h11's parser) is unchanged but for where its
TCP connections come from: an httpcore network backend, :class:`GuardedBackend`, that resolves
the host through the guard and connects to a checked address, tried in order. The URL and so
the ``Host`` header, SNI and certificate check stay the hostname's, because httpcore starts
TLS on the stream we return with the origin's host. No environment is read (no proxy can route
around the guard), no retries, no redirects (nothing above the transport follows them).

It exists so the custom transport stays a measured choice: switched off with one setting, and
``tests/webhooks/test_transport.py`` runs against both.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable

import httpcore
import httpx

from notifyq._webhooks.ssrf import Guard, Resolver, system_resolver

KEEPALIVE_S = 30.0
SocketOption = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None,
                                                                                  int]


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, connecting only to addresses the guard let through."""

    def __init__(self, guard: Guard, resolver: Resolver, connect_timeout_s: float,
                 inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self.guard = guard
        self.resolver = resolver
        self.connect_timeout_s = connect_timeout_s
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int,
                          timeout: float | None = None,  # noqa: ASYNC109 - httpcore's API
                          local_address: str | None = None,
                          socket_options: Iterable[SocketOption] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        failure: Exception | None = None
        for address in await self.guard.addresses(host, port, self.resolver):
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout=self.connect_timeout_s,
                    local_address=local_address, socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # noqa: S101 - addresses() never returns none
        raise failure

    async def connect_unix_socket(self, path: str,
                                  timeout: float | None = None,  # noqa: ASYNC109
                                  socket_options: Iterable[SocketOption] | None = None,
                                  ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks are not sent over Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class StockTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose connections go through :class:`GuardedBackend`."""

    def __init__(self, guard: Guard, resolver: Resolver | None = None, *,
                 max_connections: int = 100, connect_timeout_s: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None,
                 backend: httpcore.AsyncNetworkBackend | None = None) -> None:
        """``backend`` connects to the checked addresses (httpcore's anyio one by default;
        tests inject a recording one)."""
        context = ssl_context or ssl.create_default_context()
        super().__init__(verify=context, trust_env=False, retries=0)
        # httpx has no parameter for httpcore's network backend: the pool it built is replaced
        # by the same pool with ours. Fail here, not open, if a new httpx stops using _pool.
        if not isinstance(getattr(self, "_pool", None), httpcore.AsyncConnectionPool):
            raise TypeError("this httpx does not keep an httpcore pool in _pool: "
                               "use webhooks.transport=notifyq")
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context, max_connections=max_connections,
            max_keepalive_connections=max_connections, keepalive_expiry=KEEPALIVE_S,
            http1=True, http2=False, retries=0,
            network_backend=GuardedBackend(guard, resolver or system_resolver,
                                           connect_timeout_s, backend))
