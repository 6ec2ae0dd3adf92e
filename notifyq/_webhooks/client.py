"""The HTTP side of one delivery attempt.

One :class:`WebhookClient` per process: httpx requests sent straight through
:class:`~notifyq._webhooks.transport.GuardedTransport` (aiohttp under httpx's interface, the SSRF
guard as its resolver), so connections are pooled per destination (origin) and every new
connection is checked. There is no client layer that could follow a redirect (3xx is a failure),
read the environment (no proxy can route around the guard) or keep a cookie, and responses are
asked for uncompressed. The whole attempt, body included, runs under one deadline enforced
here, and at most ``response_max_bytes`` of the body are read.

What cannot be put on the wire at all (a URL httpx cannot parse, a header value that is not
visible ASCII) is :class:`Unsendable`: :func:`request_for` is the one place that decides it, for
the endpoint checks at write time and for every attempt; an attempt that meets it fails with
the error kind ``invalid``, which no retry can fix.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import aiohttp
import anyio
import httpx

from notifyq._errors import BlockedAddress, ResolutionFailed
from notifyq._settings import WebhookSettings
from notifyq._webhooks.ssrf import Guard, Resolver
from notifyq._webhooks.transport import GuardedTransport, as_httpx, describe

ErrorKind = Literal["timeout", "connect", "dns", "tls", "blocked", "invalid"]
USER_AGENT = "notifyq-webhooks/1"
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one POST did: a status code, or an error kind."""

    duration_ms: float
    status_code: int | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    body: bytes = b""
    truncated: bool = False
    retry_after: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class WebhookClient:
    """POSTs signed webhooks. Build one per process (it holds the connection pool) and
    ``aclose`` it at the end."""

    def __init__(self, settings: WebhookSettings, *, resolver: Resolver | None = None) -> None:
        self.settings = settings
        self.transport = transport_for(settings, resolver)

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> AttemptResult:
        started = time.perf_counter()
        try:
            request = request_for(url, headers, body)
            with anyio.fail_after(self.settings.timeout_s):
                return await self._post(request, started)
        except Unsendable as exc:
            return _failed(started, "invalid", str(exc))
        except TimeoutError:
            return _failed(started, "timeout",
                           f"no complete response within {self.settings.timeout_s:g} s")
        except BlockedAddress as exc:
            return _failed(started, "blocked", str(exc))
        except ResolutionFailed as exc:
            return _failed(started, "dns", str(exc))
        except (httpx.TransportError, aiohttp.ClientError) as exc:
            return _failed(started, *classify(exc))

    async def _post(self, request: httpx.Request, started: float) -> AttemptResult:
        # Straight to the transport: httpx.AsyncClient's layers (redirects, cookies, auth,
        # event hooks) would all be switched off here anyway, and they cost about 150 µs of
        # CPU per request (335 -> 220-245 µs per loopback POST, 10-50 in flight, without them).
        response = await self.transport.handle_async_request(request)
        try:
            limit = self.settings.response_max_bytes
            chunks: list[bytes] = []
            size = 0
            truncated = False
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    truncated = True
                    break
            data = b"".join(chunks)
        finally:
            await response.aclose()
        return AttemptResult(duration_ms=_ms(started), status_code=response.status_code,
                             body=data[:limit], truncated=truncated or len(data) > limit,
                             retry_after=response.headers.get("retry-after"))


def transport_for(settings: WebhookSettings,
                  resolver: Resolver | None = None) -> GuardedTransport:
    """The delivery transport, guarded by ``allowed_networks`` and ``allowed_ports``."""
    return GuardedTransport(Guard(settings.allowed_networks, settings.allowed_ports), resolver,
                            max_connections=settings.max_connections,
                            connect_timeout_s=settings.connect_timeout_s)


_parsed = functools.lru_cache(maxsize=1024)(httpx.URL)
"""Endpoint URLs parsed once (httpx's parser took ~40 us of each request)."""


class Unsendable(ValueError):
    """An endpoint's URL or header the transport cannot send; the message starts with the
    setting it is about (``url: ...`` or ``headers: ...``)."""


def request_for(url: str, headers: Mapping[str, str], body: bytes) -> httpx.Request:
    """The request an attempt sends, built as the transport will send it, or
    :class:`Unsendable`. The endpoint checks call it at write time with an empty body."""
    target = url_for(url)
    for name, value in headers.items():
        header_check(name, value)
    try:
        return httpx.Request("POST", target, headers=headers, content=body)
    except (httpx.InvalidURL, UnicodeError, ValueError, TypeError) as exc:
        raise Unsendable(f"headers: cannot be sent ({describe(exc)})") from None


def url_for(url: str) -> httpx.URL:
    """``url`` parsed by the parser the transport reads it with: http(s), a host, and a
    bracketed host only when it is a plain IPv6 address (no zone, no IPvFuture)."""
    try:
        target = _parsed(url)
    except (httpx.InvalidURL, UnicodeError, ValueError, TypeError) as exc:
        raise Unsendable(f"url: not a valid URL ({describe(exc)})") from None
    if target.scheme not in ("http", "https"):
        raise Unsendable(f"url: scheme must be http or https, got {target.scheme or 'none'!r}")
    host = target.host
    if not host:
        raise Unsendable("url: has no host")
    if ":" in host or "%" in host or "[" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Unsendable(f"url: [{host}] is not an IPv6 address (zone ids and other "
                             "literals cannot be sent to)") from None
        if "%" in host:
            raise Unsendable(f"url: [{host}] has a zone id, which cannot be sent to")
    return target


def header_check(name: str, value: str) -> None:
    """A header goes on the wire as ASCII bytes (httpx encodes values as ASCII); a field value
    is visible characters, spaces and tabs (RFC 9110, 5.5): anything else is refused here
    rather than by the receiver or the encoder at delivery."""
    if not isinstance(value, str) or not value.isascii():
        raise Unsendable(f"headers: the value of {name} must be ASCII text (HTTP sends header "
                         "values as bytes; encode other text, e.g. percent-encoding)")
    if _CONTROL.search(value):
        raise Unsendable(f"headers: the value of {name} must not contain control characters "
                         "(tab is the only one allowed)")


def _failed(started: float, kind: ErrorKind, message: str) -> AttemptResult:
    return AttemptResult(duration_ms=_ms(started), error_kind=kind, error=message[:500])


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def classify(exc: httpx.TransportError | aiohttp.ClientError) -> tuple[ErrorKind, str]:
    """A failed request's error kind and message."""
    if isinstance(exc, aiohttp.ClientError):  # raised while reading the body
        exc = as_httpx(exc)
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
        return "invalid", describe(exc)  # refused before sending
    if _is_tls(exc):
        return "tls", describe(exc)
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", describe(exc)
    return "connect", describe(exc)


def _is_tls(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ssl.SSLError, aiohttp.ClientSSLError)) or (
                "CERTIFICATE" in str(seen).upper()):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
